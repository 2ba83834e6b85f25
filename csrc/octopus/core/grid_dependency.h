// Programmatic dependent launch, the device side (sm_90 and later; elsewhere, and in host code,
// both are no-ops). A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization
// may begin once every block of the kernel before it on the stream has called
// allow_dependents() (or ended), and must call wait_for_primary() before it reads anything
// that kernel writes.
#pragma once

#include "octopus/core/plan.h"  // OCTOPUS_HD

namespace octopus {

// Returns once the kernel before this one on the stream has completed and its writes are
// visible (at once where this kernel was launched as usual).
OCTOPUS_HD void wait_for_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel on the stream begin now, if it was launched to wait for this one.
OCTOPUS_HD void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

}  // namespace octopus

// Occupancy profiles of octopus's own CUDA kernels, which every StreamScheduler
// registers as lease kinds ("octopus.affine", ...). Each .cu file adds its kernel's
// profile with a static KernelProfileRegistration; the profile is computed on first use
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor needs a CUDA context).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "octopus/scheduler/config.h"

namespace octopus {

using KernelProfileFactory = std::function<scheduler::KernelProfile()>;

struct KernelProfileRegistration {
  KernelProfileRegistration(std::string kind, KernelProfileFactory factory);
};

// Every registered kind with its profile, computed for the current device.
std::vector<std::pair<std::string, scheduler::KernelProfile>> octopus_kernel_profiles();

}  // namespace octopus

// The host's reader of the kernels' tuning policies (core/tuning.h) and their registry; the
// generic driver's policy is registered here.
#include "octopus/core/tuning.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>

#include "octopus/core/per_device.h"
#include "octopus/core/tuning_registry.cuh"

namespace octopus::cuda {
namespace {

// Compiled like every octopus kernel: its PTX version on a device is theirs.
__global__ void arch_probe_kernel() {}

}  // namespace

int launch_arch() {
  static PerDevice<int> arch;
  return arch.get([](int) {
    cudaFuncAttributes attributes{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, arch_probe_kernel));
    return attributes.ptxVersion * 10;  // 90 -> 900, as __CUDA_ARCH__ counts
  });
}

std::vector<TuningFamily>& tuning_families() {
  static std::vector<TuningFamily> families;
  return families;
}

OCTOPUS_REGISTER_TUNING(DriverTuning, driver);

}  // namespace octopus::cuda

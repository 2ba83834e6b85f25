// The host's reader of the kernels' tuning policies (core/tuning.h) and their registry; the
// generic driver's policy is registered here.
#include "octopus/core/tuning.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>

#include <array>

#include "octopus/core/tuning_registry.cuh"

namespace octopus::cuda {
namespace {

// Compiled like every octopus kernel: its PTX version on a device is theirs.
__global__ void arch_probe_kernel() {}

constexpr int kMaxDevices = 64;

}  // namespace

int launch_arch() {
  static std::array<int, kMaxDevices> arch{};
  const int device = c10::cuda::current_device();
  if (arch[device] == 0) {
    cudaFuncAttributes attributes{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, arch_probe_kernel));
    arch[device] = attributes.ptxVersion * 10;  // 90 -> 900, as __CUDA_ARCH__ counts
  }
  return arch[device];
}

std::vector<TuningFamily>& tuning_families() {
  static std::vector<TuningFamily> families;
  return families;
}

OCTOPUS_REGISTER_TUNING(DriverTuning, driver);

}  // namespace octopus::cuda

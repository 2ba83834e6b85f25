// The host's reader of core/tuning.h, and the means to compare it with the device's.
#include "octopus/core/tuning.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <array>

namespace octopus::cuda {
namespace {

// Compiled like every octopus kernel: its PTX version on a device is theirs.
__global__ void arch_probe_kernel() {}

__global__ void compiled_tuning_kernel(ArchTuning* out) { *out = kTuning; }

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

const ArchTuning& launch_tuning() {
  static std::array<ArchTuning, kMaxDevices> tunings{};
  static std::array<bool, kMaxDevices> known{};
  const int device = c10::cuda::current_device();
  if (!known[device]) {
    tunings[device] = tuning_for(launch_arch());
    known[device] = true;
  }
  return tunings[device];
}

ArchTuning compiled_tuning() {
  ArchTuning* buffer = nullptr;
  C10_CUDA_CHECK(cudaMalloc(&buffer, sizeof(ArchTuning)));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  compiled_tuning_kernel<<<1, 1, 0, stream>>>(buffer);
  ArchTuning out{};
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) status = cudaMemcpyAsync(&out, buffer, sizeof(out), cudaMemcpyDeviceToHost, stream);
  if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
  C10_CUDA_CHECK(cudaFree(buffer));
  C10_CUDA_CHECK(status);
  return out;
}

}  // namespace octopus::cuda

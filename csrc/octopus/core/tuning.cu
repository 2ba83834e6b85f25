// The host's reader of core/tuning.h, and the means to compare it with the device's.
#include "octopus/core/tuning.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <array>
#include <mutex>

namespace octopus::cuda {
namespace {

// Compiled like every octopus kernel: its PTX version on a device is theirs.
__global__ void arch_probe_kernel() {}

__global__ void compiled_tuning_kernel(ArchTuning* out) { *out = kTuning; }

constexpr int kMaxDevices = 64;

// Each device's architecture and tuning, read once, whichever thread launches first.
struct PerDevice {
  std::array<std::once_flag, kMaxDevices> once;
  std::array<int, kMaxDevices> arch{};
  std::array<ArchTuning, kMaxDevices> tuning{};
};

// The current device, its entry filled.
int known_current_device(PerDevice& state) {
  const int device = c10::cuda::current_device();
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "octopus supports CUDA devices 0 to ", kMaxDevices - 1,
              ", got device ", device);
  std::call_once(state.once[device], [&] {
    cudaFuncAttributes attributes{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, arch_probe_kernel));
    state.arch[device] = attributes.ptxVersion * 10;  // 90 -> 900, as __CUDA_ARCH__ counts
    state.tuning[device] = tuning_for(state.arch[device]);
  });
  return device;
}

PerDevice& per_device() {
  static PerDevice state;
  return state;
}

}  // namespace

int launch_arch() {
  PerDevice& state = per_device();
  return state.arch[known_current_device(state)];
}

const ArchTuning& launch_tuning() {
  PerDevice& state = per_device();
  return state.tuning[known_current_device(state)];
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

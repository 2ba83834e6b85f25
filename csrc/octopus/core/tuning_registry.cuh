// Registers a kernel family's tuning policy (core/tuning.h) for octopus.kernel_tuning():
// `OCTOPUS_REGISTER_TUNING(StencilTuning, stencil);` once, in the family's .cu file (it
// compiles the one-thread kernel that reads the policy back from the device's code).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <string>

#include "octopus/core/tuning.h"

namespace octopus::cuda {

template <class Policy>
__global__ void compiled_policy_kernel(Policy* out) {
  *out = kPolicy<Policy>;
}

template <class Policy>
TuningValues tuning_values(const Policy& policy) {
  TuningValues values;
  policy.for_each([&](const char* name, int value) {
    values.emplace_back(std::string(Policy::kFamily) + "." + name, value);
  });
  return values;
}

template <class Policy>
TuningValues compiled_tuning_values() {
  Policy* buffer = nullptr;
  C10_CUDA_CHECK(cudaMalloc(&buffer, sizeof(Policy)));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  compiled_policy_kernel<Policy><<<1, 1, 0, stream>>>(buffer);
  Policy out{};
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) status = cudaMemcpyAsync(&out, buffer, sizeof(out), cudaMemcpyDeviceToHost, stream);
  if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
  C10_CUDA_CHECK(cudaFree(buffer));
  C10_CUDA_CHECK(status);
  return tuning_values(out);
}

template <class Policy>
struct TuningRegistrar {
  TuningRegistrar() {
    tuning_families().push_back(TuningFamily{Policy::kFamily, [] { return tuning_values(launch_policy<Policy>()); },
                                             &compiled_tuning_values<Policy>});
  }
};

}  // namespace octopus::cuda

#define OCTOPUS_REGISTER_TUNING(Policy, tag) \
  static const ::octopus::cuda::TuningRegistrar<Policy> octopus_tuning_registrar_##tag {}

// The CUDA backend of an op body written once for every backend (see backend.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "octopus/core/checks.h"
#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/metadata.h"

namespace octopus {

// Whether a CUDA call may read the layout's contents on the host to check them (with
// `validate`): that synchronizes, and cannot happen while a CUDA graph is being captured
// (the capture's warm-up run checked them).
inline bool cuda_may_read_host(bool validate) {
  return validate && c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
}

struct CudaBackend {
  using Guard = c10::cuda::CUDAGuard;
  static bool may_read_host(bool validate) { return cuda_may_read_host(validate); }
  static at::Tensor build_plan(const at::Tensor& offsets, int64_t num_values, int64_t block_elems) {
    return build_plan_cuda(offsets, num_values, block_elems);
  }
  template <class Op>
  static void run(const Op& op, Strategy strategy, const at::Tensor& offsets, int64_t num_values, int64_t block_elems,
                  const at::Tensor& metadata) {
    cuda::run_ragged_cuda(op, strategy, offsets, num_values, block_elems, metadata);
  }
};

}  // namespace octopus

// octopus::crop_resize_ragged and its backward — CUDA: the functor run by the generic
// driver over the output batch (the backward's scatter adds with atomics).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "octopus/core/backend_cuda.cuh"
#include "octopus/ops/crop_resize_ragged.h"

namespace octopus {
namespace {

at::Tensor crop_resize_ragged_backward_cuda(const at::Tensor& grad, const at::Tensor& values,
                                            const at::Tensor& offsets, const at::Tensor& sizes,
                                            const at::Tensor& boxes, int64_t channels, const at::Tensor& out_offsets,
                                            const at::Tensor& out_sizes, double scale,
                                            const c10::optional<at::Tensor>& std) {
  const c10::cuda::CUDAGuard guard(values.device());
  const CropResizeRaggedArgs a =
      prepare_crop_resize_ragged(values, offsets, sizes, boxes, channels, out_offsets, out_sizes, grad.numel(), scale,
                                 c10::nullopt, std, "block_search", 0, false, true);
  const at::Tensor g = grad.to(a.out.scalar_type()).contiguous();
  with_crop_resize_ragged_op<true>(a, g, [&](const auto& op) {
    cuda::run_ragged_cuda(op, a.strategy, a.out_offsets, grad.numel(), a.block_elems, at::Tensor());
  });
  return a.out.to(values.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) {
  m.impl("crop_resize_ragged", &crop_resize_ragged<CudaBackend>);
  m.impl("crop_resize_ragged_backward", &crop_resize_ragged_backward_cuda);
}

}  // namespace octopus

// octopus::crop_resize_ragged and its backward — CUDA: the functor run by the generic
// driver over the output batch (the backward's scatter adds with atomics).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/metadata.h"
#include "octopus/ops/crop_resize_ragged.h"

namespace octopus {
namespace {

at::Tensor crop_resize_ragged_cuda(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                                   const at::Tensor& boxes, int64_t channels, const at::Tensor& out_offsets,
                                   const at::Tensor& out_sizes, int64_t num_out_values, double scale,
                                   const c10::optional<at::Tensor>& mean, const c10::optional<at::Tensor>& std,
                                   c10::string_view strategy, int64_t block_elems,
                                   const c10::optional<at::Tensor>& metadata, bool validate) {
  const c10::cuda::CUDAGuard guard(values.device());
  const bool validate_contents =
      validate && c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
  const CropResizeRaggedArgs a =
      prepare_crop_resize_ragged(values, offsets, sizes, boxes, channels, out_offsets, out_sizes, num_out_values,
                                 scale, mean, std, strategy, block_elems, validate_contents, false);
  const at::Tensor meta =
      metadata_for(a.strategy, metadata, a.out_offsets, num_out_values, a.block_elems, build_plan_cuda);
  with_crop_resize_ragged_op<false>(a, at::Tensor(), [&](const auto& op) {
    cuda::run_ragged_cuda(op, a.strategy, a.out_offsets, num_out_values, a.block_elems, meta);
  });
  return a.out;
}

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
  m.impl("crop_resize_ragged", &crop_resize_ragged_cuda);
  m.impl("crop_resize_ragged_backward", &crop_resize_ragged_backward_cuda);
}

}  // namespace octopus

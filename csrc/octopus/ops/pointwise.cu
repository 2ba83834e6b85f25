// octopus::pointwise — the CUDA kernel: the kind's ItemParamOp run by the generic driver.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/metadata.h"
#include "octopus/ops/item_param_args.h"
#include "octopus/ops/item_param_fns.h"

namespace octopus {
namespace {

at::Tensor pointwise_cuda(const at::Tensor& values, const at::Tensor& offsets, c10::string_view kind,
                          const at::Tensor& a, const at::Tensor& b, c10::string_view strategy, int64_t block_elems,
                          const c10::optional<at::Tensor>& metadata, bool validate) {
  const c10::cuda::CUDAGuard guard(values.device());
  const PointwiseKind k = parse_pointwise_kind(kind);
  const bool validate_contents =
      validate && c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
  ItemParamArgs args = prepare_item_params(values, offsets, a, b, "a", "b", strategy, block_elems, validate_contents);
  const at::Tensor meta =
      metadata_for(args.strategy, metadata, args.offsets, args.values.numel(), args.block_elems, build_plan_cuda);
  dispatch_pointwise_kind(k, [&](auto fn) {
    with_item_param_op<decltype(fn)>(args, [&](const auto& op) {
      cuda::run_ragged_cuda(op, args.strategy, args.offsets, args.values.numel(), args.block_elems, meta);
    });
  });
  return args.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) { m.impl("pointwise", &pointwise_cuda); }

}  // namespace octopus

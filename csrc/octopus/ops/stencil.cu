// octopus::stencil3x3 and its adjoint — CUDA: the stencil functor run by the generic driver.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/metadata.h"
#include "octopus/ops/stencil.h"

namespace octopus {
namespace {

static_assert(Stencil3x3Op<float, float, float, false>::kStageWarps == cuda::kWarpsPerBlock,
              "the stencil's staged runs need one shared-memory slice per warp of the driver's blocks");

template <bool kAdjoint>
at::Tensor stencil_cuda(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                        const at::Tensor& weight, c10::string_view border, c10::string_view strategy,
                        int64_t block_elems, const c10::optional<at::Tensor>& metadata, bool validate) {
  const c10::cuda::CUDAGuard guard(values.device());
  // No host reads of the layout while a CUDA graph is captured (its warm-up run checked it).
  const bool validate_contents =
      validate && c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
  const StencilArgs a =
      prepare_stencil(values, offsets, sizes, weight, border, strategy, block_elems, validate_contents, kAdjoint);
  const at::Tensor meta = metadata_for(a.strategy, metadata, a.offsets, a.values.numel(), a.block_elems,
                                       build_plan_cuda);
  with_stencil_op<kAdjoint>(a, [&](const auto& op) {
    cuda::run_ragged_cuda(op, a.strategy, a.offsets, a.values.numel(), a.block_elems, meta);
  });
  return a.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) {
  m.impl("stencil3x3", &stencil_cuda<false>);
  m.impl("stencil3x3_backward", &stencil_cuda<true>);
}

}  // namespace octopus

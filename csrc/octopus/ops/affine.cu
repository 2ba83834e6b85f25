// octopus::affine — the CUDA kernel: the affine functor run by the generic driver.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/kernel_profiles.h"
#include "octopus/core/metadata.h"
#include "octopus/ops/item_param_args.h"
#include "octopus/ops/item_param_fns.h"

namespace octopus {
namespace {

at::Tensor affine_cuda(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& scale,
                       const at::Tensor& bias, c10::string_view strategy, int64_t block_elems,
                       const c10::optional<at::Tensor>& metadata, bool validate) {
  const c10::cuda::CUDAGuard guard(values.device());
  // Checking the offsets' contents reads them on the host; that cannot happen while a
  // CUDA graph is being captured (the capture's warm-up run has checked them).
  const bool validate_contents = validate && c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
  ItemParamArgs a =
      prepare_item_params(values, offsets, scale, bias, "scale", "bias", strategy, block_elems, validate_contents);
  const at::Tensor meta = metadata_for(a.strategy, metadata, a.offsets, a.values.numel(), a.block_elems,
                                       build_plan_cuda);
  with_item_param_op<AffineFn>(a, [&](const auto& op) {
    cuda::run_ragged_cuda(op, a.strategy, a.offsets, a.values.numel(), a.block_elems, meta);
  });
  return a.out;
}

// Lease kind "octopus.affine" for the StreamScheduler: float32 per-item affine with the
// default plan, a block per warp-per-block plan blocks of the default size.
const KernelProfileRegistration affine_profile("octopus.affine", [] {
  return KernelProfile{cuda::max_blocks_per_sm<cuda::PlanLocator, ItemParamOp<float, float, float, false, AffineFn>>(),
                       cuda::launch_warps_per_block() * kDefaultBlockElems};
});

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) { m.impl("affine", &affine_cuda); }

}  // namespace octopus

// octopus::affine on CUDA (the body is affine.h's: the affine functor run by the generic driver).
#include <torch/library.h>

#include "octopus/core/backend_cuda.cuh"
#include "octopus/core/kernel_profiles.h"
#include "octopus/core/tuning_registry.cuh"
#include "octopus/ops/affine.h"
#include "octopus/ops/item_param_op.h"

namespace octopus {

// The item-parameter functor's policy (affine, clamp, threshold, power), registered once.
OCTOPUS_REGISTER_TUNING(ItemParamTuning, item_param);

namespace {

// Lease kind "octopus.affine" for the StreamScheduler: float32 per-item affine with the
// default plan, a block per warp-per-block plan blocks of the default size.
const KernelProfileRegistration affine_profile("octopus.affine", [] {
  return KernelProfile{cuda::max_blocks_per_sm<cuda::PlanLocator, ItemParamOp<float, float, float, false, AffineFn>>(),
                       cuda::launch_warps_per_block() * kDefaultBlockElems};
});

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) { m.impl("affine", &affine<CudaBackend>); }

}  // namespace octopus

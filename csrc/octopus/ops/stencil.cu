// octopus::stencil3x3 and its adjoint on CUDA (the body is stencil.h's: the stencil functor
// run by the generic driver).
#include <torch/library.h>

#include "octopus/core/backend_cuda.cuh"
#include "octopus/core/tuning_registry.cuh"
#include "octopus/ops/stencil.h"

namespace octopus {

OCTOPUS_REGISTER_TUNING(StencilTuning, stencil);

static_assert(Stencil3x3Op<float, float, float, false>::kStageWarps == cuda::kWarpsPerBlock,
              "the stencil's staged runs need one shared-memory slice per warp of the driver's blocks");

TORCH_LIBRARY_IMPL(octopus, CUDA, m) {
  m.impl("stencil3x3", &stencil3x3<CudaBackend, false>);
  m.impl("stencil3x3_backward", &stencil3x3<CudaBackend, true>);
}

}  // namespace octopus

// octopus::pointwise on CUDA (the body is pointwise.h's: the kind's ItemParamOp run by the
// generic driver).
#include <torch/library.h>

#include "octopus/core/backend_cuda.cuh"
#include "octopus/ops/pointwise.h"

namespace octopus {

TORCH_LIBRARY_IMPL(octopus, CUDA, m) { m.impl("pointwise", &pointwise<CudaBackend>); }

}  // namespace octopus

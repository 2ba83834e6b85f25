// octopus::affine on the CPU (the body is affine.h's).
#include <torch/library.h>

#include "octopus/core/backend.h"
#include "octopus/ops/affine.h"

namespace octopus {

TORCH_LIBRARY_IMPL(octopus, CPU, m) { m.impl("affine", &affine<CpuBackend>); }

}  // namespace octopus

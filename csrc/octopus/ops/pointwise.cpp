// octopus::pointwise on the CPU (the body is pointwise.h's), and the kinds' names.
#include <torch/library.h>

#include <string>

#include "octopus/core/backend.h"
#include "octopus/ops/pointwise.h"

namespace octopus {

std::string pointwise_kind_names() {
  std::string names;
  std::apply([&](auto... fns) { ((names += (names.empty() ? "'" : ", '") + std::string(decltype(fns)::kName) + "'"), ...); },
             PointwiseFns{});
  return names;
}

TORCH_LIBRARY_IMPL(octopus, CPU, m) { m.impl("pointwise", &pointwise<CpuBackend>); }

}  // namespace octopus

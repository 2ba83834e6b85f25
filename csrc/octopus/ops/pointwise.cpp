// The pointwise kinds' names, for error messages (the op's body is pointwise.h's).

#include <string>

#include "octopus/ops/pointwise.h"

namespace octopus {

std::string pointwise_kind_names() {
  std::string names;
  std::apply([&](auto... fns) { ((names += (names.empty() ? "'" : ", '") + std::string(decltype(fns)::kName) + "'"), ...); },
             PointwiseFns{});
  return names;
}

}  // namespace octopus

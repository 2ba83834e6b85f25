// Fixed-size element vectors moved as whole 16-byte (or wider) memory transactions.
#pragma once

#include <cstdint>

#include "octopus/core/plan.h"

namespace octopus {

template <typename T, int N>
struct alignas(sizeof(T) * N >= 16 ? 16 : sizeof(T) * N) Vec {
  T v[N];
};

// Elements from p up to the next 16-byte boundary (0 when p is on one): the single values
// to take before whole vectors. p is T-aligned, as every tensor's data is.
template <typename T>
OCTOPUS_HD int64_t elements_to_vector_boundary(const T* p) {
  return static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16 / sizeof(T));
}

}  // namespace octopus

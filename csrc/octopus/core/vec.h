// Fixed-size element vectors moved as whole 16-byte (or wider) memory transactions.
#pragma once

#include <cstdint>

namespace octopus {

template <typename T, int N>
struct alignas(sizeof(T) * N >= 16 ? 16 : sizeof(T) * N) Vec {
  T v[N];
};

}  // namespace octopus

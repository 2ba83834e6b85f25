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

// Stores the vector at p (16-byte aligned when the vector is 16 bytes or more). On the GPU a
// vector of 4- and 8-byte elements goes out as st.global.v4 per 16 bytes: a plain struct
// store is split into its elements by the compiler and not always merged back (the first of
// the fp32 affine kernel's eight unrolled stores became four 4-byte stores, which carried
// most of its excess L2 sectors; to_padded and the sampler step lost some of theirs the same
// way). 1- and 2-byte elements keep the struct store: packing them for the asm costs
// registers and spills. Like CUTLASS's global_store there is no memory clobber: callers
// never read back, within the kernel, what they store with it.
template <typename T, int N>
OCTOPUS_HD void store_vec(T* p, const Vec<T, N>& v) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(T) >= 4 && sizeof(Vec<T, N>) % 16 == 0) {
    struct Chunks {
      uint4 c[sizeof(Vec<T, N>) / 16];
    };
    const Chunks chunks = __builtin_bit_cast(Chunks, v);
#pragma unroll
    for (int k = 0; k < static_cast<int>(sizeof(v) / 16); ++k) {
      const uint4 chunk = chunks.c[k];
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(reinterpret_cast<uint4*>(p) + k), "r"(chunk.x),
                   "r"(chunk.y), "r"(chunk.z), "r"(chunk.w));
    }
    return;
  }
#endif
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

}  // namespace octopus

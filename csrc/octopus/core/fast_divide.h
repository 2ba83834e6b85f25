// Exact division of unsigned 32-bit numerators below 2^31 by a divisor fixed in advance, as
// a multiply-high, an add and a shift (Granlund & Montgomery; the scheme of PyTorch's
// IntDivider): several times cheaper on the GPU than a hardware-less 32-bit division. Set
// up once per item, used for every element's coordinates.
#pragma once

#include <cstdint>

#include "octopus/core/plan.h"

namespace octopus {

struct FastDivider {
  uint32_t divisor, magic, shift;

  // divisor in [1, 2^31).
  OCTOPUS_HD static FastDivider make(uint32_t divisor) {
    // The smallest shift with 2^shift >= divisor, from the leading zeros (no loop: dividers
    // are made per item on the GPU).
#ifdef __CUDA_ARCH__
    const uint32_t shift = divisor > 1 ? 32 - __clz(divisor - 1) : 0;
#else
    const uint32_t shift = divisor > 1 ? 32 - __builtin_clz(divisor - 1) : 0;
#endif
    const uint64_t magic = ((uint64_t{1} << 32) * ((uint64_t{1} << shift) - divisor)) / divisor + 1;
    return {divisor, static_cast<uint32_t>(magic), shift};
  }

  // n / divisor for n < 2^31.
  OCTOPUS_HD uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t t = __umulhi(n, magic);
#else
    const uint32_t t = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return (t + n) >> shift;
  }
};

}  // namespace octopus

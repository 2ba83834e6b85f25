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
    uint32_t shift = 0;
    while (shift < 32 && (uint32_t{1} << shift) < divisor) ++shift;
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

// Coordinates in an item of equal planes of rows ([C, H, W] images): the dividers by the
// plane and the row, set up once per item, and the split of an element's position in the
// item into (plane, row, column) — through the dividers where the item has fewer than 2^31
// elements, 64-bit divisions otherwise.
struct PlaneDividers {
  FastDivider by_plane, by_width;
  bool fast;

  OCTOPUS_HD static PlaneDividers make(int64_t planes, int64_t plane, int64_t width) {
    PlaneDividers d{};
    d.fast = plane * planes < (int64_t{1} << 31);
    if (d.fast) {
      d.by_plane = FastDivider::make(static_cast<uint32_t>(plane));
      d.by_width = FastDivider::make(static_cast<uint32_t>(width));
    }
    return d;
  }

  OCTOPUS_HD void split(int64_t local, int64_t plane, int64_t width, int64_t& c, int64_t& y, int64_t& x) const {
    if (fast) {
      const uint32_t l = static_cast<uint32_t>(local);
      const uint32_t cc = by_plane.div(l);
      const uint32_t r = l - cc * static_cast<uint32_t>(plane);
      const uint32_t yy = by_width.div(r);
      c = cc;
      y = yy;
      x = r - yy * static_cast<uint32_t>(width);
    } else {
      c = local / plane;
      const int64_t r = local - c * plane;
      y = r / width;
      x = r - y * width;
    }
  }
};

}  // namespace octopus

// 3x3 stencils on ragged 2-D items ([H, W], or [C, H, W] images of C planes): each output
// pixel is sum over dy, dx in {-1, 0, 1} of weight[c][dy + 1][dx + 1] * in(c, y + dy, x + dx)
// (a cross-correlation, as conv2d computes), with each item's own border: `replicate`
// reads the nearest edge pixel, `zero` reads 0. Box and Gaussian blur are weights; a
// depthwise convolution is one 3x3 kernel per channel.
//
// The adjoint (kAdjoint) is the gradient with respect to the input: every input pixel
// gathers the outputs whose taps read it, replicated borders included.
//
// A ragged functor run by the generic drivers (core/driver_cpu.h, core/driver_cuda.cuh).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <cstdint>

#include "octopus/core/checks.h"
#include "octopus/core/dtypes.h"
#include "octopus/core/plan.h"
#include "octopus/core/vec.h"

namespace octopus {

enum class Border : int { Replicate = 0, Zero = 1 };

Border parse_border(c10::string_view name);

// Where tap t of output o reads along an axis of n pixels: the pixel index, or -1 for a
// zero border outside the item.
OCTOPUS_HD int64_t stencil_source(int64_t o, int t, int64_t n, Border border) {
  const int64_t s = o + t;
  if (s >= 0 && s < n) return s;
  if (border == Border::Zero) return -1;
  return s < 0 ? 0 : n - 1;
}

template <typename in_t, typename out_t, typename acc_t, bool kAdjoint>
struct Stencil3x3Op {
  static constexpr int kVec = 4;
  static constexpr int kUnroll = 2;
  using InVec = Vec<in_t, kVec>;
  using OutVec = Vec<out_t, kVec>;

  const in_t* __restrict__ in;
  out_t* __restrict__ out;
  const acc_t* __restrict__ weight;  // [channels, 9], row-major taps
  const int64_t* __restrict__ offsets;
  const int64_t* __restrict__ sizes;  // [M, dims]
  int64_t num_values;
  int dims;  // 2: [H, W] items; 3: [C, H, W]
  int64_t channels;
  Border border;

  struct Item {
    int64_t begin, height, width, plane;
  };

  OCTOPUS_HD Item item(int64_t i) const {
    // Offsets and extents are clamped so that unvalidated input never reads out of bounds.
    const int64_t o = offsets[i];
    Item it{};
    it.begin = o < 0 ? 0 : (o > num_values ? num_values : o);
    it.height = positive(sizes[i * dims + dims - 2]);
    it.width = positive(sizes[i * dims + dims - 1]);
    it.plane = it.height * it.width;
    return it;
  }

  OCTOPUS_HD InVec load(int64_t) const { return InVec{}; }  // every read is a neighbourhood

  // kVec consecutive elements of one item at g: one coordinate split for all of them, and
  // six reads per row instead of twelve where they share an image row.
  OCTOPUS_HD void store(const Item& it, int64_t g, const InVec&) const {
    int64_t c, y, x;
    coordinates(it, g, c, y, x);
    OutVec r;
    if (!kAdjoint && x + kVec <= it.width) {
      const acc_t* w = weight + 9 * c;
      acc_t sum[kVec] = {};
#pragma unroll
      for (int dy = -1; dy <= 1; ++dy) {
        const int64_t sy = stencil_source(y, dy, it.height, border);
        if (sy < 0) continue;
        const int64_t row = it.begin + c * it.plane + sy * it.width;
        acc_t v[kVec + 2];
#pragma unroll
        for (int k = 0; k < kVec + 2; ++k) {
          const int64_t sx = stencil_source(x, k - 1, it.width, border);
          v[k] = sx < 0 ? acc_t(0) : read(row + sx);
        }
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          sum[k] += w[3 * (dy + 1)] * v[k] + w[3 * (dy + 1) + 1] * v[k + 1] + w[3 * (dy + 1) + 2] * v[k + 2];
        }
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) r.v[k] = static_cast<out_t>(sum[k]);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        r.v[k] = static_cast<out_t>(at(it, c, y, x));
        if (++x == it.width) {  // the next element in row-major order
          x = 0;
          if (++y == it.height) {
            y = 0;
            ++c;
          }
        }
      }
    }
    *reinterpret_cast<OutVec*>(out + g) = r;
  }

  OCTOPUS_HD void one(const Item& it, int64_t g) const {
    int64_t c, y, x;
    coordinates(it, g, c, y, x);
    out[g] = static_cast<out_t>(at(it, c, y, x));
  }

 private:
  OCTOPUS_HD static int64_t positive(int64_t e) { return e > 0 ? e : 1; }

  OCTOPUS_HD acc_t read(int64_t index) const {
    return static_cast<acc_t>(in[index < num_values ? index : num_values - 1]);
  }

  OCTOPUS_HD static int64_t divide(int64_t a, int64_t b) {
    // 32-bit division where it suffices: several times cheaper on the GPU.
    return (a >> 31) == 0 && (b >> 31) == 0 ? static_cast<int64_t>(static_cast<uint32_t>(a) / static_cast<uint32_t>(b))
                                            : a / b;
  }

  OCTOPUS_HD void coordinates(const Item& it, int64_t g, int64_t& c, int64_t& y, int64_t& x) const {
    const int64_t local = g - it.begin;
    c = divide(local, it.plane);
    const int64_t r = local - c * it.plane;
    y = divide(r, it.width);
    x = r - y * it.width;
  }

  // The stencil (or its adjoint) at one pixel.
  OCTOPUS_HD acc_t at(const Item& it, int64_t c, int64_t y, int64_t x) const {
    const acc_t* w = weight + 9 * (c < channels - 1 ? c : channels - 1);
    const int64_t plane_base = it.begin + c * it.plane;
    acc_t sum = 0;
    if constexpr (!kAdjoint) {
      for (int dy = -1; dy <= 1; ++dy) {
        const int64_t sy = stencil_source(y, dy, it.height, border);
        if (sy < 0) continue;
        for (int dx = -1; dx <= 1; ++dx) {
          const int64_t sx = stencil_source(x, dx, it.width, border);
          if (sx >= 0) sum += w[3 * (dy + 1) + dx + 1] * read(plane_base + sy * it.width + sx);
        }
      }
    } else {
      // Outputs (oy, ox) within one pixel of (y, x) whose tap (dy, dx) reads (y, x).
      for (int64_t oy = y - 1; oy <= y + 1; ++oy) {
        if (oy < 0 || oy >= it.height) continue;
        for (int dy = -1; dy <= 1; ++dy) {
          if (stencil_source(oy, dy, it.height, border) != y) continue;
          for (int64_t ox = x - 1; ox <= x + 1; ++ox) {
            if (ox < 0 || ox >= it.width) continue;
            for (int dx = -1; dx <= 1; ++dx) {
              if (stencil_source(ox, dx, it.width, border) == x) {
                sum += w[3 * (dy + 1) + dx + 1] * read(plane_base + oy * it.width + ox);
              }
            }
          }
        }
      }
    }
    return sum;
  }
};

struct StencilArgs {
  at::Tensor values, offsets, sizes, weight, out;
  Strategy strategy;
  int64_t block_elems;
  int64_t channels;
  Border border;
};

// Checks every argument (the layout's contents and every item's channel count too when
// validate_contents: one host copy) and allocates the output: out_dtype for the forward
// pass, the values' dtype for the adjoint.
StencilArgs prepare_stencil(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                            const at::Tensor& weight, c10::string_view border, c10::string_view strategy,
                            int64_t block_elems, bool validate_contents, bool adjoint);

// Calls f(op) with the stencil functor for these arguments' dtype (forward), or with the
// adjoint functor (float32 / float64 values).
template <bool kAdjoint, class F>
void with_stencil_op(const StencilArgs& a, F&& f) {
  auto make = [&](auto tag) {
    using in_t = decltype(tag);
    using out_t = std::conditional_t<kAdjoint, in_t, out_type<in_t>>;
    using acc_t = acc_type<in_t>;
    const Stencil3x3Op<in_t, out_t, acc_t, kAdjoint> op{
        a.values.template data_ptr<in_t>(), a.out.template data_ptr<out_t>(), a.weight.template data_ptr<acc_t>(),
        a.offsets.template data_ptr<int64_t>(), a.sizes.template data_ptr<int64_t>(), a.values.numel(),
        static_cast<int>(a.sizes.size(1)), a.channels, a.border};
    f(op);
  };
  if constexpr (kAdjoint) {
    if (a.values.scalar_type() == at::kDouble) {
      make(double{});
    } else {
      make(float{});
    }
  } else {
    dispatch_values_dtype(a.values.scalar_type(), make);
  }
}

}  // namespace octopus

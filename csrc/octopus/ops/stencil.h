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
#include "octopus/core/fast_divide.h"
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
  // One element per lane (consecutive lanes, consecutive pixels: every neighbour read is
  // coalesced, and rows above and below hit the cache lines the neighbouring warps read).
  static constexpr int kVec = 1;
  static constexpr int kUnroll = 2;
  // The item (its kernel in registers, two dividers) and two pixels in flight take about 80
  // registers: 3 blocks per multiprocessor instead of 4, measured spill-free (sm_90).
  static constexpr int kMinBlocksPerSm = 3;
  using InVec = Vec<in_t, 1>;

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
    int64_t begin;
    int64_t height, width, plane;
    bool fast;                        // fewer than 2^31 elements: 32-bit coordinates
    FastDivider by_width, by_plane;
    acc_t w0[9];                      // channel 0's kernel, held in registers
  };

  OCTOPUS_HD Item item(int64_t i) const {
    Item it{};
    const int64_t o = offsets[i];
    it.begin = o < 0 ? 0 : (o > num_values ? num_values : o);
    it.height = positive(sizes[i * dims + dims - 2]);
    it.width = positive(sizes[i * dims + dims - 1]);
    const int64_t planes = dims == 3 ? positive(sizes[i * dims]) : 1;
    // Unvalidated input whose item would reach past the values is read as 1 x 1 planes:
    // every read then stays at its own element.
    if (it.height * it.width * planes > num_values - it.begin) it.height = it.width = 1;
    it.plane = it.height * it.width;
    it.fast = it.plane * planes < (int64_t{1} << 31);
    if (it.fast) {
      it.by_width = FastDivider::make(static_cast<uint32_t>(it.width));
      it.by_plane = FastDivider::make(static_cast<uint32_t>(it.plane));
    }
    for (int k = 0; k < 9; ++k) it.w0[k] = weight[k];
    return it;
  }

  OCTOPUS_HD InVec load(int64_t) const { return InVec{}; }  // every read is a neighbourhood

  OCTOPUS_HD void store(const Item& it, int64_t g, const InVec&) const { one(it, g); }

#ifdef __CUDACC__
  // The GPU driver's plan and block_search runs: lane l takes elements g0 + l, g0 + l + 32,
  // ... and steps its pixel coordinates by 32 instead of dividing them out per pixel (one
  // division per lane per run); the kernel stays in registers while the channel does. Narrow
  // items, huge ones and the adjoint go element by element.
  __device__ void segment(const Item& it, int64_t g0, int64_t g1, int lane) const {
    if (kAdjoint || it.width < 16 || !it.fast) {
      for (int64_t g = g0 + lane; g < g1; g += 32) one(it, g);
      return;
    }
    if (g0 + lane >= g1) return;
    const uint32_t width = static_cast<uint32_t>(it.width), height = static_cast<uint32_t>(it.height);
    const uint32_t l = static_cast<uint32_t>(g0 + lane - it.begin);
    uint32_t c = it.by_plane.div(l);
    const uint32_t r = l - c * static_cast<uint32_t>(it.plane);
    uint32_t y = it.by_width.div(r), x = r - y * width;
    acc_t w[9];
    kernel_of(it, c, w);
    for (int64_t g = g0 + lane; g < g1; g += 32) {
      out[g] = static_cast<out_t>(pixel(it, w, c, y, x));
      x += 32;
      while (x >= width) {
        x -= width;
        if (++y == height) {
          y = 0;
          kernel_of(it, ++c, w);
        }
      }
    }
  }
#endif

  OCTOPUS_HD void one(const Item& it, int64_t g) const {
    int64_t c, y, x;
    coordinates(it, g, c, y, x);
    if constexpr (kAdjoint) {
      out[g] = static_cast<out_t>(adjoint_at(it, c, y, x));
    } else {
      acc_t w[9];
      kernel_of(it, c, w);
      out[g] = static_cast<out_t>(pixel(it, w, c, y, x));
    }
  }

 private:
  OCTOPUS_HD static int64_t positive(int64_t e) { return e > 0 ? e : 1; }

  OCTOPUS_HD void coordinates(const Item& it, int64_t g, int64_t& c, int64_t& y, int64_t& x) const {
    const int64_t local = g - it.begin;
    if (it.fast) {
      const uint32_t l = static_cast<uint32_t>(local);
      const uint32_t cc = it.by_plane.div(l);
      const uint32_t r = l - cc * static_cast<uint32_t>(it.plane);
      const uint32_t yy = it.by_width.div(r);
      c = cc;
      y = yy;
      x = r - yy * static_cast<uint32_t>(it.width);
    } else {
      c = local / it.plane;
      const int64_t r = local - c * it.plane;
      y = r / it.width;
      x = r - y * it.width;
    }
  }

  // Channel c's kernel (channel 0's is held by the item).
  OCTOPUS_HD void kernel_of(const Item& it, int64_t c, acc_t* w) const {
    const acc_t* wc = weight + 9 * (c < channels - 1 ? c : channels - 1);
#pragma unroll
    for (int k = 0; k < 9; ++k) w[k] = c == 0 ? it.w0[k] : wc[k];
  }

  // The stencil at one pixel: neighbour rows and columns are clamped into the item
  // (replicate); for a zero border the taps outside it are multiplied by 0 — no branch.
  OCTOPUS_HD acc_t pixel(const Item& it, const acc_t* w, int64_t c, int64_t y, int64_t x) const {
    const in_t* plane = in + it.begin + c * it.plane;
    const int64_t width = it.width, last_y = it.height - 1, last_x = width - 1;
    const in_t* up = plane + (y > 0 ? y - 1 : 0) * width;
    const in_t* mid = plane + y * width;
    const in_t* down = plane + (y < last_y ? y + 1 : last_y) * width;
    const int64_t xl = x > 0 ? x - 1 : 0, xr = x < last_x ? x + 1 : last_x;
    const bool zero = border == Border::Zero;
    const acc_t k_up = zero && y == 0 ? acc_t(0) : acc_t(1), k_down = zero && y == last_y ? acc_t(0) : acc_t(1);
    const acc_t k_left = zero && x == 0 ? acc_t(0) : acc_t(1), k_right = zero && x == last_x ? acc_t(0) : acc_t(1);
    auto v = [](const in_t* line, int64_t i) { return static_cast<acc_t>(line[i]); };
    const acc_t left = w[0] * k_up * v(up, xl) + w[3] * v(mid, xl) + w[6] * k_down * v(down, xl);
    const acc_t centre = w[1] * k_up * v(up, x) + w[4] * v(mid, x) + w[7] * k_down * v(down, x);
    const acc_t right = w[2] * k_up * v(up, xr) + w[5] * v(mid, xr) + w[8] * k_down * v(down, xr);
    return k_left * left + centre + k_right * right;
  }

  // Outputs (oy, ox) within one pixel of (y, x) whose tap (dy, dx) reads (y, x).
  OCTOPUS_HD acc_t adjoint_at(const Item& it, int64_t c, int64_t y, int64_t x) const {
    const acc_t* w = weight + 9 * (c < channels - 1 ? c : channels - 1);
    const in_t* p = in + it.begin + c * it.plane;
    acc_t sum = 0;
    for (int64_t oy = y - 1; oy <= y + 1; ++oy) {
      if (oy < 0 || oy >= it.height) continue;
      for (int dy = -1; dy <= 1; ++dy) {
        if (stencil_source(oy, dy, it.height, border) != y) continue;
        for (int64_t ox = x - 1; ox <= x + 1; ++ox) {
          if (ox < 0 || ox >= it.width) continue;
          for (int dx = -1; dx <= 1; ++dx) {
            if (stencil_source(ox, dx, it.width, border) == x) {
              sum += w[3 * (dy + 1) + dx + 1] * static_cast<acc_t>(p[oy * it.width + ox]);
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

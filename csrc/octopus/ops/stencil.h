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
#include <type_traits>

#ifdef __CUDACC__
#include <cuda_pipeline.h>  // __pipeline_memcpy_async (cp.async)
#endif

#include "octopus/core/checks.h"
#include "octopus/core/metadata.h"
#include "octopus/core/dtypes.h"
#include "octopus/core/fast_divide.h"
#include "octopus/core/plan.h"
#include "octopus/core/tuning.h"
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

// The 3x3 stencils' tuning (core/tuning.h).
struct StencilTuning {
  int unroll;
  int min_blocks_per_sm;     // the staged walk takes about 80 registers
  int stage_bytes_per_warp;  // shared memory per warp for staged rows
  int stage_load_unroll;     // 16-byte vectors in flight per lane while staging

  static constexpr const char* kFamily = "stencil";
  // Hopper (sm_90), measured on an H100: 3 blocks per SM instead of 4 (a few bytes spill at 80
  // registers, far more at 64, which measured slower). Every architecture until it is measured.
  static constexpr StencilTuning for_arch(int /*arch*/) { return StencilTuning{2, 3, 5632, 2}; }
  template <class Fn>
  void for_each(Fn&& fn) const {
    fn("unroll", unroll);
    fn("min_blocks_per_sm", min_blocks_per_sm);
    fn("stage_bytes_per_warp", stage_bytes_per_warp);
    fn("stage_load_unroll", stage_load_unroll);
  }
  // The staged rows of a block's warps fit the static 48 KB of shared memory.
  constexpr bool valid(int arch) const {
    return stage_bytes_per_warp * (cuda::DriverTuning::for_arch(arch).threads / 32) <= 48 * 1024;
  }
};
static_assert(StencilTuning::for_arch(900).valid(900));

template <typename in_t, typename out_t, typename acc_t, bool kAdjoint>
struct Stencil3x3Op {
  // One element per lane (consecutive lanes, consecutive pixels: every neighbour read is
  // coalesced, and rows above and below hit the cache lines the neighbouring warps read).
  static constexpr int kVec = 1;
  static constexpr StencilTuning kTuning = cuda::kPolicy<StencilTuning>;
  static constexpr int kUnroll = kTuning.unroll;
  // The staged walk (the item's two dividers, a channel's kernel and the 3 x 3 window in
  // registers) takes about 80 registers: fewer blocks per multiprocessor than the driver's.
  static constexpr int kMinBlocksPerSm = kTuning.min_blocks_per_sm;
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
    return it;
  }

  OCTOPUS_HD InVec load(int64_t) const { return InVec{}; }  // every read is a neighbourhood

  OCTOPUS_HD void store(const Item& it, int64_t g, const InVec&) const { one(it, g); }

#ifdef __CUDACC__
  // The staged runs' shared memory: a slice per warp of the driver's blocks (44 KB per
  // block on sm_90).
  static constexpr int kStageWarps = cuda::kPolicy<cuda::DriverTuning>.threads / 32;
  static constexpr int kStageElems = kTuning.stage_bytes_per_warp / sizeof(acc_t);

  // The GPU driver's plan and block_search runs. The forward stencil of an item whose rows
  // fit three at a time in the warp's slice is staged (staged_segment); otherwise lane l
  // takes elements g0 + l, g0 + l + 32, ... and steps its pixel coordinates by 32 instead of
  // dividing them out per pixel; narrow items, huge ones and the adjoint go element by element.
  __device__ void segment(const Item& it, int64_t g0, int64_t g1, int lane) const {
    if (!kAdjoint && it.fast && 3 * (it.width + 2) <= kStageElems) {
      staged_segment(it, g0, g1, lane);
      return;
    }
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
    kernel_of(c, w);
    for (int64_t g = g0 + lane; g < g1; g += 32) {
      out[g] = static_cast<out_t>(pixel(it, w, c, y, x));
      x += 32;
      while (x >= width) {
        x -= width;
        if (++y == height) {
          y = 0;
          kernel_of(++c, w);
        }
      }
    }
  }

  // The rows of the run, channel by channel, through a ring of kStageElems / (W + 2) staged
  // rows in the warp's slice of shared memory: the warp copies image rows into the ring
  // (each row once, plus the row above and below the run), each with a column on either side
  // and the item's border applied (clamped, or zeros); then lane x walks down column x with
  // the 3 x 3 window in registers: three shared reads and nine multiply-adds per pixel, no
  // border tests.
  __device__ void staged_segment(const Item& it, int64_t g0, int64_t g1, int lane) const {
    __shared__ acc_t stage_all[kStageWarps][kStageElems];
    acc_t* ring = stage_all[threadIdx.x >> 5];
    const uint32_t width = static_cast<uint32_t>(it.width), height = static_cast<uint32_t>(it.height);
    const uint32_t stride = width + 2, slots = kStageElems / stride;  // at least 3
    const uint32_t l0 = static_cast<uint32_t>(g0 - it.begin), l1 = static_cast<uint32_t>(g1 - it.begin);
    const uint32_t q_end = it.by_width.div(l1 - 1) + 1;  // rows (over all channels) of the run
    for (uint32_t q = it.by_width.div(l0); q < q_end;) {
      const uint32_t c = it.by_plane.div(q * width), ya = q - c * height;
      const uint32_t n = min(height - ya, q_end - q);  // output rows in channel c
      const in_t* plane = in + it.begin + static_cast<int64_t>(c) * it.plane;
      acc_t w[9];
      kernel_of(c, w);
      // Staged row k (0 .. n + 1) is plane row ya - 1 + k, kept in slot k % slots.
      for (uint32_t j = 0, staged = 0; j < n;) {
        const uint32_t upto = min(n + 2, j + slots);  // rows j and j + 1 stay in the ring
        stage_rows(it, plane, ring, ya, staged, upto, slots, lane);
        staged = upto;
        // Output rows j .. upto - 3 of channel c read staged rows j .. upto - 1. Lane x takes
        // column x of the rows whose output lies in the run [l0, l1) (all of them but in the
        // run's first and last rounds), walking down with the window in registers.
        const uint32_t ring_end = slots * stride, row_j = (q + j) * width, slot_j = j % slots;
        for (uint32_t x = lane; x < width; x += 32) {
          const uint32_t first = row_j + x;  // packed index (within the item) of row j's output
          const uint32_t r0 = j + (first >= l0 ? 0 : it.by_width.div(l0 - first + width - 1));
          const uint32_t r1 = min(upto - 2, j + (first >= l1 ? 0 : it.by_width.div(l1 - first + width - 1)));
          if (r0 >= r1) continue;
          const uint32_t slot = slot_j + (r0 - j);  // staged row r0's (r0 - j < slots)
          uint32_t at = (slot >= slots ? slot - slots : slot) * stride + x;  // its column x - 1
          acc_t a0 = ring[at], a1 = ring[at + 1], a2 = ring[at + 2];
          at = at + stride == ring_end + x ? x : at + stride;
          acc_t b0 = ring[at], b1 = ring[at + 1], b2 = ring[at + 2];
          out_t* dst = out + it.begin + (first + (r0 - j) * width);
          for (uint32_t r = r0; r < r1; ++r, dst += width) {
            at = at + stride == ring_end + x ? x : at + stride;
            const acc_t c0 = ring[at], c1 = ring[at + 1], c2 = ring[at + 2];
            *dst = static_cast<out_t>(w[0] * a0 + w[1] * a1 + w[2] * a2 + w[3] * b0 + w[4] * b1 + w[5] * b2 +
                                      w[6] * c0 + w[7] * c1 + w[8] * c2);
            a0 = b0, a1 = b1, a2 = b2;
            b0 = c0, b1 = c1, b2 = c2;
          }
        }
        __syncwarp();  // every lane is done with these rows before the ring moves on
        j = upto - 2;
      }
      q += n;
    }
  }

  // Where a contiguous run of image rows goes in the ring: row s of the run to slot
  // (first_slot + s) % slots, one column in (column 0 holds the left border).
  struct RingRows {
    acc_t* ring;
    uint32_t width, slots, first_slot;
    FastDivider by_width;
    __device__ acc_t* operator()(uint32_t e) const {  // element e of the run
      const uint32_t s = by_width.div(e), slot = first_slot + s;
      return ring + (slot >= slots ? slot - slots : slot) * (width + 2) + 1 + (e - s * width);
    }
  };

  // Copies src[0, total) to at(0) .. at(total - 1) in shared memory. Values already of the
  // accumulator's type go by asynchronous copies (cp.async): no registers, every element of
  // the run in flight at once. Others are converted on the way: 16-byte loads, two in flight
  // per lane.
  __device__ void copy_run(const in_t* src, uint32_t total, const RingRows& at, int lane) const {
    if constexpr (std::is_same_v<in_t, acc_t>) {
      // Lane l copies elements l, l + 32, ...: its ring position steps by 32 and, at each row
      // end, past the two side columns (and back to slot 0 after the last slot).
      if (lane < total) {
        const uint32_t width = at.width, stride = width + 2;
        uint32_t x = lane, slot = at.first_slot;
        while (x >= width) x -= width, slot = slot + 1 == at.slots ? 0 : slot + 1;
        acc_t* dst = at.ring + slot * stride + 1 + x;
        for (const in_t *from = src + lane, *end = src + total; from < end; from += 32) {
          __pipeline_memcpy_async(dst, from, sizeof(acc_t));
          dst += 32, x += 32;
          while (x >= width) {
            x -= width, dst += 2;
            if (++slot == at.slots) slot = 0, dst -= at.slots * stride;
          }
        }
      }
      __pipeline_commit();
      __pipeline_wait_prior(0);
    } else {
      constexpr int kUnrollLoads = kTuning.stage_load_unroll;
      constexpr uint32_t kV = 16 / sizeof(in_t);
      using V = Vec<in_t, kV>;
      // Single values up to a 16-byte boundary, then 16-byte vectors, then the rest.
      const uint32_t head = min(total, static_cast<uint32_t>(elements_to_vector_boundary(src)));
      for (uint32_t e = lane; e < head; e += 32) *at(e) = static_cast<acc_t>(src[e]);
      const uint32_t vectors = (total - head) / kV;
      const V* body = reinterpret_cast<const V*>(src + head);
      for (uint32_t v = lane; v < vectors; v += 32 * kUnrollLoads) {
        V buf[kUnrollLoads];
#pragma unroll
        for (int u = 0; u < kUnrollLoads; ++u) {
          if (v + 32 * u < vectors) buf[u] = body[v + 32 * u];
        }
#pragma unroll
        for (int u = 0; u < kUnrollLoads; ++u) {
          if (v + 32 * u >= vectors) continue;
#pragma unroll
          for (uint32_t k = 0; k < kV; ++k) *at(head + (v + 32 * u) * kV + k) = static_cast<acc_t>(buf[u].v[k]);
        }
      }
      for (uint32_t e = head + vectors * kV + lane; e < total; e += 32) *at(e) = static_cast<acc_t>(src[e]);
    }
  }

  // Stages rows [k0, k1) (plane rows ya - 1 + k) into the ring: the rows inside the image
  // as one contiguous copy, then the row above or below the image (replicate: its
  // neighbour; zero: zeros), then every row's two side columns.
  __device__ void stage_rows(const Item& it, const in_t* plane, acc_t* ring, uint32_t ya, uint32_t k0, uint32_t k1,
                             uint32_t slots, int lane) const {
    const uint32_t width = static_cast<uint32_t>(it.width), height = static_cast<uint32_t>(it.height);
    const uint32_t stride = width + 2;
    const bool zero = border == Border::Zero;
    auto row = [&](uint32_t k) { return ring + (k % slots) * stride; };
    const uint32_t in0 = max(k0, ya == 0 ? 1u : 0u), in1 = min(k1, height + 1 - ya);  // rows inside
    if (in0 < in1) {  // rows in0 .. in1 - 1 are one contiguous run of the plane
      const in_t* src = plane + static_cast<int64_t>(ya + in0 - 1) * width;
      const RingRows at{ring, width, slots, in0 % slots, it.by_width};
      copy_run(src, (in1 - in0) * width, at, lane);
    }
    __syncwarp();
    // The row above the image (k = 0, when ya = 0) copies row 1; the one below copies the last.
    auto fill_outside = [&](uint32_t k, uint32_t neighbour) {
      const acc_t* from = row(neighbour);
      acc_t* to = row(k);
      for (uint32_t x = 1 + lane; x <= width; x += 32) to[x] = zero ? acc_t(0) : from[x];
    };
    if (k0 < in0) fill_outside(k0, 1);
    if (in1 < k1) fill_outside(in1, in1 - 1);
    __syncwarp();
    for (uint32_t t = lane; t < 2 * (k1 - k0); t += 32) {
      acc_t* r = row(k0 + (t >> 1));
      if (t & 1) {
        r[width + 1] = zero ? acc_t(0) : r[width];
      } else {
        r[0] = zero ? acc_t(0) : r[1];
      }
    }
    __syncwarp();
  }
#endif

  OCTOPUS_HD void one(const Item& it, int64_t g) const {
    int64_t c, y, x;
    coordinates(it, g, c, y, x);
    if constexpr (kAdjoint) {
      out[g] = static_cast<out_t>(adjoint_at(it, c, y, x));
    } else {
      acc_t w[9];
      kernel_of(c, w);
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

  // Channel c's kernel (the last one's for channels past the weights').
  OCTOPUS_HD void kernel_of(int64_t c, acc_t* w) const {
    const acc_t* wc = weight + 9 * (c < channels - 1 ? c : channels - 1);
#pragma unroll
    for (int k = 0; k < 9; ++k) w[k] = wc[k];
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

// octopus::stencil3x3 (kAdjoint false) and its adjoint, the body of every backend's entry
// point (schemas.cpp registers the CPU's, stencil.cu the CUDA's).
template <class Backend, bool kAdjoint>
at::Tensor stencil3x3(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                      const at::Tensor& weight, c10::string_view border, c10::string_view strategy,
                      int64_t block_elems, const c10::optional<at::Tensor>& metadata, bool validate) {
  const typename Backend::Guard guard(values.device());
  const StencilArgs a = prepare_stencil(values, offsets, sizes, weight, border, strategy, block_elems,
                                        Backend::may_read_host(validate), kAdjoint);
  const at::Tensor meta =
      metadata_for(a.strategy, metadata, a.offsets, a.values.numel(), a.block_elems, Backend::build_plan);
  with_stencil_op<kAdjoint>(a, [&](const auto& op) {
    Backend::run(op, a.strategy, a.offsets, a.values.numel(), a.block_elems, meta);
  });
  return a.out;
}

}  // namespace octopus

// Crop + bilinear resize to a ragged output: box k of the source batch (as crop_resize.h
// describes boxes and sampling) becomes output item k of shape [C, out_h_k, out_w_k] — each
// item its own size. A box resized to its own size is an exact copy: this is also how
// tiles are gathered into a new batch. Normalization is fused as in crop_resize.
//
// A ragged functor over the output batch, run by the generic drivers. kBackward turns it
// around: every output element's gradient is spread over its four source pixels
// (atomics on the GPU; the CPU runs it serially).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <cstdint>

#include "octopus/core/checks.h"
#include "octopus/core/dtypes.h"
#include "octopus/core/fast_divide.h"
#include "octopus/core/metadata.h"
#include "octopus/core/tuning.h"
#include "octopus/core/vec.h"
#include "octopus/ops/crop_resize.h"

namespace octopus {

template <typename in_t, typename out_t, typename acc_t, bool kBackward>
struct CropResizeRaggedOp {
  // One element per lane: consecutive lanes write consecutive outputs and read neighbouring
  // source pixels.
  static constexpr int kVec = 1;
  static constexpr int kUnroll = cuda::kPolicy<CropResizeTuning>.ragged_unroll;
  // The item (its box, two dividers) and the taps need about 80 registers: fewer blocks
  // per multiprocessor than the driver's (spill-free on sm_90 for the float types).
  static constexpr int kMinBlocksPerSm = cuda::kPolicy<CropResizeTuning>.ragged_min_blocks_per_sm;
  // Runs of small outputs are walked item by item: the item's taps leave no registers for
  // the lanes' search.
  static constexpr bool kLanesFindItems = false;
  using InVec = Vec<in_t, 1>;

  const in_t* __restrict__ in;  // forward: the source values; backward: the output's gradient
  out_t* __restrict__ out;      // forward: the packed outputs; backward: the source's gradient
  const int64_t* __restrict__ offsets;  // the source batch
  const int64_t* __restrict__ sizes;
  int64_t num_images;
  const int64_t* __restrict__ boxes;
  const int64_t* __restrict__ out_offsets;  // the output batch
  const int64_t* __restrict__ out_sizes;
  int64_t num_out_values;
  int64_t channels;
  acc_t scale;
  const acc_t* __restrict__ mean;  // null: 0
  const acc_t* __restrict__ std;   // null: 1

  struct Item {
    CropBox box;
    int64_t begin, out_h, out_w, plane;
    bool fast;  // fewer than 2^31 output elements: 32-bit coordinates
    FastDivider by_width, by_plane;
    float scale_y, scale_x;  // box size / output size
  };

  OCTOPUS_HD Item item(int64_t k) const {
    Item it{};
    it.box = crop_box(boxes, k, offsets, sizes, num_images);
    const int64_t o = out_offsets[k];
    it.begin = o < 0 ? 0 : (o > num_out_values ? num_out_values : o);
    it.out_h = out_sizes[3 * k + 1] > 0 ? out_sizes[3 * k + 1] : 1;
    it.out_w = out_sizes[3 * k + 2] > 0 ? out_sizes[3 * k + 2] : 1;
    it.plane = it.out_h * it.out_w;
    it.scale_y = static_cast<float>(it.box.h) / static_cast<float>(it.out_h);
    it.scale_x = static_cast<float>(it.box.w) / static_cast<float>(it.out_w);
    it.fast = it.plane * channels < (int64_t{1} << 31);
    if (it.fast) {
      it.by_width = FastDivider::make(static_cast<uint32_t>(it.out_w));
      it.by_plane = FastDivider::make(static_cast<uint32_t>(it.plane));
    }
    return it;
  }

  OCTOPUS_HD InVec load(int64_t) const { return InVec{}; }

  OCTOPUS_HD void store(const Item& it, int64_t g, const InVec&) const { one(it, g); }

#ifdef __CUDACC__
  // The GPU driver's plan and block_search runs (forward): the warp walks the run output
  // row by row, the lanes along the row, with the row's vertical tap and source lines worked
  // out once per row.
  __device__ void segment(const Item& it, int64_t g0, int64_t g1, int lane) const {
    if (kBackward || it.out_w < 16) {
      for (int64_t g = g0 + lane; g < g1; g += 32) one(it, g);
      return;
    }
    int64_t c, y, x;
    coordinates(it, g0, c, y, x);
    for (int64_t g = g0; g < g1;) {
      const int64_t n = min(it.out_w - x, g1 - g);
      const Row r = row(it, c, y);
      for (int64_t k = lane; k < n; k += 32) out[g + k] = r.at(it, x + k);
      g += n;
      x = 0;
      if (++y == it.out_h) {
        y = 0;
        c = c < channels - 1 ? c + 1 : c;
      }
    }
  }
#endif

  OCTOPUS_HD void one(const Item& it, int64_t g) const {
    int64_t c, y, x;
    coordinates(it, g, c, y, x);
    if constexpr (kBackward) {
      scatter(it, g, c, y, x);
    } else {
      out[g] = row(it, c, y).at(it, x);
    }
  }

 private:
  OCTOPUS_HD void coordinates(const Item& it, int64_t g, int64_t& c, int64_t& y, int64_t& x) const {
    const int64_t local = g - it.begin;
    if (it.fast) {
      const uint32_t l = static_cast<uint32_t>(local);
      const uint32_t cc = it.by_plane.div(l);
      const uint32_t r = l - cc * static_cast<uint32_t>(it.plane);
      const uint32_t yy = it.by_width.div(r);
      c = cc;
      y = yy;
      x = r - yy * static_cast<uint32_t>(it.out_w);
    } else {
      c = local / it.plane;
      const int64_t r = local - c * it.plane;
      y = r / it.out_w;
      x = r - y * it.out_w;
    }
    c = c < channels - 1 ? c : channels - 1;
  }

  OCTOPUS_HD int64_t source_line(const Item& it, int64_t c, int64_t row) const {
    return it.box.base + c * it.box.plane + (it.box.y0 + row) * it.box.width + it.box.x0;
  }

  // One output row: its two source lines, vertical weight and channel's normalization.
  struct Row {
    const in_t* __restrict__ line0;
    const in_t* __restrict__ line1;
    acc_t wy, scale, mean, inv_std;

    OCTOPUS_HD out_t at(const Item& it, int64_t x) const {
      const BilinearTap tx = bilinear_tap_scaled(x, it.scale_x, it.box.w);
      const acc_t wx = tx.w;
      const acc_t top = (1 - wx) * static_cast<acc_t>(line0[tx.i0]) + wx * static_cast<acc_t>(line0[tx.i1]);
      const acc_t bottom = (1 - wx) * static_cast<acc_t>(line1[tx.i0]) + wx * static_cast<acc_t>(line1[tx.i1]);
      return static_cast<out_t>((((1 - wy) * top + wy * bottom) * scale - mean) * inv_std);
    }
  };

  OCTOPUS_HD Row row(const Item& it, int64_t c, int64_t y) const {
    const BilinearTap ty = bilinear_tap_scaled(y, it.scale_y, it.box.h);
    return {in + source_line(it, c, ty.i0), in + source_line(it, c, ty.i1), ty.w, scale,
            mean != nullptr ? mean[c] : acc_t(0), std != nullptr ? acc_t(1) / std[c] : acc_t(1)};
  }

  OCTOPUS_HD static void add(out_t* p, out_t v) {
#ifdef __CUDA_ARCH__
    atomicAdd(p, v);
#else
    *p += v;
#endif
  }

  OCTOPUS_HD void scatter(const Item& it, int64_t g, int64_t c, int64_t y, int64_t x) const {
    const BilinearTap ty = bilinear_tap_scaled(y, it.scale_y, it.box.h), tx = bilinear_tap_scaled(x, it.scale_x, it.box.w);
    out_t* line0 = out + source_line(it, c, ty.i0);
    out_t* line1 = out + source_line(it, c, ty.i1);
    const acc_t scaled = static_cast<acc_t>(in[g]) * scale;
    const acc_t v = std != nullptr ? scaled / std[c] : scaled, wy = ty.w, wx = tx.w;
    add(line0 + tx.i0, (1 - wy) * (1 - wx) * v);
    add(line0 + tx.i1, (1 - wy) * wx * v);
    add(line1 + tx.i0, wy * (1 - wx) * v);
    add(line1 + tx.i1, wy * wx * v);
  }
};

struct CropResizeRaggedArgs {
  CropResizeArgs source;  // values, offsets, sizes, boxes, mean, std, channels, scale
  at::Tensor out_offsets, out_sizes, out;
  int64_t num_out_values;
  Strategy strategy;
  int64_t block_elems;
};

// Checks every argument (the contents of both layouts and of the boxes too when
// validate_contents: host copies) and allocates the output: the packed crops (forward), or
// the source's gradient in the accumulation dtype (backward, `grad` in place of values'
// role as input).
CropResizeRaggedArgs prepare_crop_resize_ragged(const at::Tensor& values, const at::Tensor& offsets,
                                                const at::Tensor& sizes, const at::Tensor& boxes, int64_t channels,
                                                const at::Tensor& out_offsets, const at::Tensor& out_sizes,
                                                int64_t num_out_values, double scale,
                                                const c10::optional<at::Tensor>& mean,
                                                const c10::optional<at::Tensor>& std, c10::string_view strategy,
                                                int64_t block_elems, bool validate_contents, bool backward);

// Calls f(op) with the functor for these arguments (`grad` is the backward's input).
template <bool kBackward, class F>
void with_crop_resize_ragged_op(const CropResizeRaggedArgs& a, const at::Tensor& grad, F&& f) {
  const CropResizeArgs& s = a.source;
  dispatch_values_dtype(s.values.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    using acc_t = acc_type<T>;
    using in_t = std::conditional_t<kBackward, acc_t, T>;
    using out_t = std::conditional_t<kBackward, acc_t, out_type<T>>;
    const in_t* in = kBackward ? reinterpret_cast<const in_t*>(grad.data_ptr()) : reinterpret_cast<const in_t*>(
                                                                                      s.values.data_ptr());
    const CropResizeRaggedOp<in_t, out_t, acc_t, kBackward> op{
        in, a.out.template data_ptr<out_t>(), s.offsets.template data_ptr<int64_t>(),
        s.sizes.template data_ptr<int64_t>(), s.offsets.numel() - 1, s.boxes.template data_ptr<int64_t>(),
        a.out_offsets.template data_ptr<int64_t>(), a.out_sizes.template data_ptr<int64_t>(), a.num_out_values,
        s.channels, static_cast<acc_t>(s.scale), optional_data<acc_t>(s.mean), optional_data<acc_t>(s.std)};
    f(op);
  });
}

// octopus::crop_resize_ragged (forward), the body of every backend's entry point: the output
// batch's elements find their crop with the strategy (the backward differs per backend).
template <class Backend>
at::Tensor crop_resize_ragged(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                              const at::Tensor& boxes, int64_t channels, const at::Tensor& out_offsets,
                              const at::Tensor& out_sizes, int64_t num_out_values, double scale,
                              const c10::optional<at::Tensor>& mean, const c10::optional<at::Tensor>& std,
                              c10::string_view strategy, int64_t block_elems,
                              const c10::optional<at::Tensor>& metadata, bool validate) {
  const typename Backend::Guard guard(values.device());
  const CropResizeRaggedArgs a =
      prepare_crop_resize_ragged(values, offsets, sizes, boxes, channels, out_offsets, out_sizes, num_out_values,
                                 scale, mean, std, strategy, block_elems, Backend::may_read_host(validate), false);
  const at::Tensor meta = metadata_for(a.strategy, metadata, a.out_offsets, num_out_values, a.block_elems,
                                       Backend::build_plan);
  with_crop_resize_ragged_op<false>(a, at::Tensor(), [&](const auto& op) {
    Backend::run(op, a.strategy, a.out_offsets, num_out_values, a.block_elems, meta);
  });
  return a.out;
}

// The backward's CPU kernel (crop_resize_ragged.cpp), registered in schemas.cpp.
at::Tensor crop_resize_ragged_backward_cpu(const at::Tensor& grad, const at::Tensor& values, const at::Tensor& offsets,
                                           const at::Tensor& sizes, const at::Tensor& boxes, int64_t channels,
                                           const at::Tensor& out_offsets, const at::Tensor& out_sizes, double scale,
                                           const c10::optional<at::Tensor>& std);

}  // namespace octopus

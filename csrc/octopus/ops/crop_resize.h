// Crop + bilinear resize of boxes from a batch of [C, H, W] images (packed ragged, or a dense
// [N, C, H, W] batch seen as one) to a fixed [C, out_h, out_w] each, optionally scaled and
// normalized per channel: out = (bilinear(crop) * scale - mean[c]) / std[c].
//
// A box is (image, y0, x0, y1, x1): the crop image[:, y0:y1, x0:x1] (integers, end
// exclusive). The sampling is torch's upsample_bilinear2d with align_corners=False and no
// antialiasing, so each output equals F.interpolate(crop[None], (out_h, out_w),
// mode="bilinear", align_corners=False) of that crop — with the sampling coordinates in
// float32 for every dtype, as torch computes them for float32 images (torch uses float64
// ones for float64 images: at large upscaling the two differ by ~1e-5 relative).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cmath>
#include <cstdint>

#include "octopus/core/plan.h"
#include "octopus/core/tuning.h"

namespace octopus {

// crop_resize's tuning (core/tuning.h): its forward kernel (ops/crop_resize.cu), its backward,
// and the ragged crop functor (ops/crop_resize_ragged.h).
struct CropResizeTuning {
  int quad;                      // neighbouring outputs per thread along x
  int rows_per_thread;           // output rows per thread
  int block_threads;             // the forward's threads per block at most (small blocks measured fastest)
  int backward_blocks_per_sm;    // blocks per multiprocessor launched by the backward
  int ragged_unroll;
  int ragged_min_blocks_per_sm;

  static constexpr const char* kFamily = "crop_resize";
  // Hopper (sm_90), measured on an H100: 8 rows per thread (128 registers), once an enlarged
  // crop's rows reused their source lines' horizontal pass, 0.308-0.313 ms per call back to
  // back for 1000 crops to 224 x 224 against 0.341-0.342 with 4 (4 had beaten 1 and 2 before
  // the reuse); for 224-wide outputs 56 threads per block took 0.38-0.39 ms per call, 112 0.43,
  // 224 0.47. Every architecture until it is measured.
  static constexpr CropResizeTuning for_arch(int /*arch*/) { return CropResizeTuning{4, 8, 64, 16, 2, 3}; }
  template <class Fn>
  void for_each(Fn&& fn) const {
    fn("quad", quad);
    fn("rows_per_thread", rows_per_thread);
    fn("block_threads", block_threads);
    fn("backward_blocks_per_sm", backward_blocks_per_sm);
    fn("ragged_unroll", ragged_unroll);
    fn("ragged_min_blocks_per_sm", ragged_min_blocks_per_sm);
  }
  constexpr bool valid(int arch) const { return block_threads <= cuda::DriverTuning::for_arch(arch).threads; }
};
static_assert(CropResizeTuning::for_arch(900).valid(900));

// Where one output coordinate samples the crop: rows/cols i0 and i1 = i0 + (i0 < n - 1),
// weight w of i1 (1 - w of i0). Index: int64_t, or int where the crop's sizes fit (cheaper
// on the GPU).
template <typename Index>
struct BilinearTapOf {
  Index i0, i1;
  float w;
};
using BilinearTap = BilinearTapOf<int64_t>;

// `scale` = in_size / out_size as a float (what torch computes for align_corners=False).
// (Index is named, never deduced: callers pass mixed integer types. C++17: no type_identity.)
template <typename T>
struct NonDeduced {
  using type = T;
};

template <typename Index = int64_t>
OCTOPUS_HD BilinearTapOf<Index> bilinear_tap_scaled(typename NonDeduced<Index>::type out_index, float scale,
                                                    typename NonDeduced<Index>::type in_size) {
  // One rounding, as torch's kernels compute it (their compilers fuse the multiply-add): two
  // roundings move the coordinate by up to an ulp (3e-5 at 400 pixels) and the output by that
  // times the neighbours' difference. nvcc had left some sites unfused (20 in crop_resize.cu).
  float src = fmaf(static_cast<float>(out_index) + 0.5f, scale, -0.5f);
  src = src < 0.f ? 0.f : src;
  Index i0 = static_cast<Index>(src);
  if (i0 > in_size - 1) i0 = in_size - 1;
  const Index i1 = i0 + (i0 < in_size - 1 ? 1 : 0);
  return {i0, i1, src - static_cast<float>(i0)};
}

OCTOPUS_HD BilinearTap bilinear_tap(int64_t out_index, int64_t out_size, int64_t in_size) {
  return bilinear_tap_scaled(out_index, static_cast<float>(in_size) / static_cast<float>(out_size), in_size);
}

// One box as read from `boxes` [K, 5] int64, clamped so that unvalidated input never reads
// outside its image (a degenerate box samples one edge pixel).
struct CropBox {
  int64_t base;     // first element of the image's channel 0
  int64_t plane;    // H * W of the image
  int64_t width;    // W of the image
  int64_t y0, x0, h, w;
};

OCTOPUS_HD CropBox crop_box(const int64_t* boxes, int64_t k, const int64_t* offsets, const int64_t* sizes,
                            int64_t num_images) {
  const int64_t* b = boxes + 5 * k;
  int64_t image = b[0] < 0 ? 0 : (b[0] >= num_images ? num_images - 1 : b[0]);
  const int64_t H = sizes[3 * image + 1] > 0 ? sizes[3 * image + 1] : 1;
  const int64_t W = sizes[3 * image + 2] > 0 ? sizes[3 * image + 2] : 1;
  auto clamp = [](int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); };
  const int64_t y0 = clamp(b[1], 0, H - 1), x0 = clamp(b[2], 0, W - 1);
  const int64_t y1 = clamp(b[3], y0 + 1, H), x1 = clamp(b[4], x0 + 1, W);
  return {offsets[image], H * W, W, y0, x0, y1 - y0, x1 - x0};
}

struct CropResizeArgs {
  at::Tensor values, offsets, sizes, boxes, out;
  at::Tensor mean, std;  // undefined where not given: 0 and 1
  int64_t channels, out_h, out_w;
  double scale;
};

// Checks the arguments (box contents too when validate_contents: one host copy); `out` is
// left for the forward pass to allocate (crop_resize_output).
CropResizeArgs prepare_crop_resize(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                                   const at::Tensor& boxes, int64_t channels, int64_t out_h, int64_t out_w,
                                   double scale, const c10::optional<at::Tensor>& mean,
                                   const c10::optional<at::Tensor>& std, bool validate_contents);

// The [K, C, out_h, out_w] output: the values' dtype, float32 for uint8.
at::Tensor crop_resize_output(const CropResizeArgs& a);

// The CPU kernels (crop_resize.cpp), registered in schemas.cpp.
at::Tensor crop_resize_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                           const at::Tensor& boxes, int64_t channels, int64_t out_h, int64_t out_w, double scale,
                           const c10::optional<at::Tensor>& mean, const c10::optional<at::Tensor>& std,
                           bool validate);
at::Tensor crop_resize_backward_cpu(const at::Tensor& grad, const at::Tensor& values, const at::Tensor& offsets,
                                    const at::Tensor& sizes, const at::Tensor& boxes, double scale,
                                    const c10::optional<at::Tensor>& std);

}  // namespace octopus

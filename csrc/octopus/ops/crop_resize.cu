// octopus::crop_resize and its backward — CUDA kernels. The backward (a warp per output
// row) adds into the source with atomics (crops may overlap).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/checks.h"
#include "octopus/core/backend_cuda.cuh"
#include "octopus/core/dtypes.h"
#include "octopus/core/tuning_registry.cuh"
#include "octopus/core/vec.h"
#include "octopus/ops/crop_resize.h"

namespace octopus {

OCTOPUS_REGISTER_TUNING(CropResizeTuning, crop_resize);

namespace {

// Forward: block (box, band) makes the rows of one band of a box's output, every channel.
// Thread (tx, ty) makes the kQuad neighbouring outputs of column group tx in kRowsPerThread
// rows of the band (ty, ty + rows_per_pass, ...): its horizontal taps are worked out once
// (32-bit) and serve every channel and row; each (channel, row) then costs a vertical tap,
// the horizontal passes over its two source lines (of an enlarged crop, only over lines the
// previous row did not read) and one vector store (a row's stores are one contiguous run).
// The rows are unrolled so that their reads are in flight together (CropResizeTuning; the
// host shapes the launch with launch_policy()'s values, the same).
constexpr int kQuad = cuda::kPolicy<CropResizeTuning>.quad;
constexpr int kRowsPerThread = cuda::kPolicy<CropResizeTuning>.rows_per_thread;

template <typename T>
__global__ void __launch_bounds__(cuda::kThreads) crop_resize_kernel(
    const T* __restrict__ in, out_type<T>* __restrict__ out, const int64_t* __restrict__ offsets,
    const int64_t* __restrict__ sizes, const int64_t* __restrict__ boxes, int64_t num_images, int64_t channels,
    int out_h, int out_w, int bands, acc_type<T> scale, const acc_type<T>* __restrict__ mean,
    const acc_type<T>* __restrict__ std) {
  using acc_t = acc_type<T>;
  using O = out_type<T>;
  const int quads = (out_w + kQuad - 1) / kQuad;
  const int tx = threadIdx.x, ty = threadIdx.y, rows_per_pass = blockDim.y;
  const int64_t k = blockIdx.x;
  const CropBox b = crop_box(boxes, k, offsets, sizes, num_images);
  const T* src = in + b.base + b.y0 * b.width + b.x0;
  // 32-bit taps: image sides are below 2^31 (checked with the boxes; unchecked larger crops
  // are cut to 2^31 - 1, which keeps every read inside the image).
  constexpr int64_t kMaxSide = (int64_t{1} << 31) - 1;
  const int crop_h = static_cast<int>(min(b.h, kMaxSide)), crop_w = static_cast<int>(min(b.w, kMaxSide));
  const float sy = static_cast<float>(crop_h) / static_cast<float>(out_h);
  const float sx = static_cast<float>(crop_w) / static_cast<float>(out_w);
  const int64_t out_plane = int64_t{out_h} * out_w;
  O* dst_box = out + k * channels * out_plane;
  const bool vector_rows = out_w % kQuad == 0;  // every quad whole and aligned
  const bool upscaled = crop_h < out_h;
  for (int band = blockIdx.y; band < bands; band += gridDim.y) {
    const int64_t band_row0 = int64_t{band} * kRowsPerThread * rows_per_pass + ty;
    for (int q = tx; q < quads; q += blockDim.x) {
      const int ox0 = q * kQuad;
      BilinearTapOf<int> th[kQuad];
#pragma unroll
      for (int j = 0; j < kQuad; ++j) th[j] = bilinear_tap_scaled<int>(ox0 + j, sx, crop_w);  // past out_w: in the crop
      for (int64_t c = 0; c < channels; ++c) {
        const T* plane = src + c * b.plane;
        const acc_t m = mean != nullptr ? __ldg(mean + c) : acc_t(0);
        const acc_t inv_sd = std != nullptr ? acc_t(1) / __ldg(std + c) : acc_t(1);
        O* dst_plane = dst_box + c * out_plane + ox0;
        // The horizontal pass over source line i: this thread's kQuad values of it.
        auto across = [&](int i, acc_t (&h)[kQuad]) {
          const T* line = plane + static_cast<int64_t>(i) * b.width;
#pragma unroll
          for (int j = 0; j < kQuad; ++j) {
            const acc_t wx = th[j].w;
            h[j] = (1 - wx) * static_cast<acc_t>(line[th[j].i0]) + wx * static_cast<acc_t>(line[th[j].i1]);
          }
        };
        auto store = [&](int64_t row, const acc_t (&top)[kQuad], const acc_t (&bottom)[kQuad], acc_t wy) {
          Vec<O, kQuad> v;
#pragma unroll
          for (int j = 0; j < kQuad; ++j) {
            v.v[j] = static_cast<O>((((1 - wy) * top[j] + wy * bottom[j]) * scale - m) * inv_sd);
          }
          O* dst = dst_plane + row * out_w;
          if (vector_rows) {
            *reinterpret_cast<Vec<O, kQuad>*>(dst) = v;
          } else {
#pragma unroll
            for (int j = 0; j < kQuad; ++j) {
              if (ox0 + j < out_w) dst[j] = v.v[j];
            }
          }
        };
        acc_t top[kQuad], bottom[kQuad];
        if (upscaled) {
          // Consecutive output rows of an enlarged crop mostly read the same two source lines:
          // each line's horizontal pass is kept for the next row (a row then costs its vertical
          // pass and its store).
          int line_top = -1, line_bottom = -1;
#pragma unroll
          for (int r = 0; r < kRowsPerThread; ++r) {
            const int64_t row = band_row0 + int64_t{r} * rows_per_pass;
            if (row >= out_h) break;
            const BilinearTapOf<int> tv = bilinear_tap_scaled<int>(static_cast<int>(row), sy, crop_h);
            if (tv.i0 != line_top) {
              if (tv.i0 == line_bottom) {
#pragma unroll
                for (int j = 0; j < kQuad; ++j) top[j] = bottom[j];
              } else {
                across(tv.i0, top);
              }
              line_top = tv.i0;
            }
            if (tv.i1 != line_bottom) {
              if (tv.i1 == line_top) {
#pragma unroll
                for (int j = 0; j < kQuad; ++j) bottom[j] = top[j];
              } else {
                across(tv.i1, bottom);
              }
              line_bottom = tv.i1;
            }
            store(row, top, bottom, tv.w);
          }
        } else {
          // A crop at least as tall as its output: rows read lines of their own, and every row's
          // reads go out together.
#pragma unroll
          for (int r = 0; r < kRowsPerThread; ++r) {
            const int64_t row = band_row0 + int64_t{r} * rows_per_pass;
            if (row >= out_h) break;
            const BilinearTapOf<int> tv = bilinear_tap_scaled<int>(static_cast<int>(row), sy, crop_h);
            across(tv.i0, top);
            across(tv.i1, bottom);
            store(row, top, bottom, tv.w);
          }
        }
      }
    }
  }
}

// Backward: a warp per output row (box, channel, oy): the row's box and vertical tap are
// worked out once, then the lanes walk the row (consecutive lanes, consecutive outputs).
struct CropRow {
  CropBox box;
  BilinearTap ty;
  int64_t c;
};

__device__ __forceinline__ CropRow crop_row(int64_t row, const int64_t* __restrict__ boxes,
                                            const int64_t* __restrict__ offsets, const int64_t* __restrict__ sizes,
                                            int64_t num_images, int64_t channels, int64_t out_h) {
  const int64_t oy = row % out_h, c = row / out_h % channels, k = row / (out_h * channels);
  const CropBox b = crop_box(boxes, k, offsets, sizes, num_images);
  return {b, bilinear_tap(oy, out_h, b.h), c};
}

template <typename acc_t>
__global__ void __launch_bounds__(cuda::kThreads) crop_resize_backward_kernel(
    const acc_t* __restrict__ grad, acc_t* __restrict__ result, const int64_t* __restrict__ offsets,
    const int64_t* __restrict__ sizes, const int64_t* __restrict__ boxes, int64_t num_images, int64_t rows,
    int64_t channels, int64_t out_h, int64_t out_w, acc_t scale, const acc_t* __restrict__ std) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t{gridDim.x} * cuda::kThreads) >> 5;
  for (int64_t row = (int64_t{blockIdx.x} * cuda::kThreads + threadIdx.x) >> 5; row < rows; row += warps) {
    const CropRow r = crop_row(row, boxes, offsets, sizes, num_images, channels, out_h);
    const CropBox& b = r.box;
    acc_t* line0 = result + b.base + r.c * b.plane + (b.y0 + r.ty.i0) * b.width + b.x0;
    acc_t* line1 = result + b.base + r.c * b.plane + (b.y0 + r.ty.i1) * b.width + b.x0;
    const acc_t wy = r.ty.w, f = std != nullptr ? scale / std[r.c] : scale;
    for (int64_t ox = lane; ox < out_w; ox += 32) {
      const BilinearTap tx = bilinear_tap(ox, out_w, b.w);
      const acc_t v = grad[row * out_w + ox] * f, wx = tx.w;
      atomicAdd(line0 + tx.i0, (1 - wy) * (1 - wx) * v);
      atomicAdd(line0 + tx.i1, (1 - wy) * wx * v);
      atomicAdd(line1 + tx.i0, wy * (1 - wx) * v);
      atomicAdd(line1 + tx.i1, wy * wx * v);
    }
  }
}

int64_t grid_for(int64_t rows) {
  const int64_t warps = cuda::launch_warps_per_block();
  const int64_t per_sm = cuda::launch_policy<CropResizeTuning>().backward_blocks_per_sm;
  return std::max<int64_t>(1, std::min<int64_t>(int64_t{cuda::multiprocessor_count()} * per_sm,
                                                (rows + warps - 1) / warps));
}

at::Tensor crop_resize_cuda(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                            const at::Tensor& boxes, int64_t channels, int64_t out_h, int64_t out_w, double scale,
                            const c10::optional<at::Tensor>& mean, const c10::optional<at::Tensor>& std,
                            bool validate) {
  const c10::cuda::CUDAGuard guard(values.device());
  CropResizeArgs a = prepare_crop_resize(values, offsets, sizes, boxes, channels, out_h, out_w, scale, mean, std,
                                         cuda_may_read_host(validate));
  a.out = crop_resize_output(a);
  if (a.out.numel() == 0) return a.out;
  TORCH_CHECK_VALUE(out_h < (int64_t{1} << 31) && out_w < (int64_t{1} << 31), "the output size ", out_h, " x ", out_w,
                    " is too large");
  // Block: quads of a row across x (up to the driver's threads), rows across y up to about
  // block_threads in all (small blocks measured fastest).
  const CropResizeTuning tuning = cuda::launch_policy<CropResizeTuning>();
  const int64_t quads = (out_w + tuning.quad - 1) / tuning.quad;
  const int64_t threads_x = std::min<int64_t>(quads, cuda::launch_threads());
  const int64_t rows_per_pass = std::max<int64_t>(1, tuning.block_threads / threads_x);
  const int64_t band_rows = int64_t{tuning.rows_per_thread} * rows_per_pass;
  const int64_t bands = (out_h + band_rows - 1) / band_rows;
  TORCH_CHECK_VALUE(a.boxes.size(0) < (int64_t{1} << 31), "at most 2^31 - 1 boxes, got ", a.boxes.size(0));
  dispatch_values_dtype(a.values.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    using acc_t = acc_type<T>;
    const dim3 grid(static_cast<unsigned>(a.boxes.size(0)), static_cast<unsigned>(std::min<int64_t>(bands, 65535)));
    const dim3 block(static_cast<unsigned>(threads_x), static_cast<unsigned>(rows_per_pass));
    crop_resize_kernel<T><<<grid, block, 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.values.data_ptr<T>(), a.out.data_ptr<out_type<T>>(), a.offsets.data_ptr<int64_t>(),
        a.sizes.data_ptr<int64_t>(), a.boxes.data_ptr<int64_t>(), a.offsets.numel() - 1, channels,
        static_cast<int>(out_h), static_cast<int>(out_w), static_cast<int>(bands), static_cast<acc_t>(scale),
        optional_data<acc_t>(a.mean), optional_data<acc_t>(a.std));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return a.out;
}

at::Tensor crop_resize_backward_cuda(const at::Tensor& grad, const at::Tensor& values, const at::Tensor& offsets,
                                     const at::Tensor& sizes, const at::Tensor& boxes, double scale,
                                     const c10::optional<at::Tensor>& std) {
  const c10::cuda::CUDAGuard guard(values.device());
  const int64_t channels = grad.size(1), out_h = grad.size(2), out_w = grad.size(3);
  CropResizeArgs a = prepare_crop_resize(values, offsets, sizes, boxes, channels, out_h, out_w, scale,
                                         c10::nullopt, std, false);
  const at::ScalarType acc = param_dtype_for(values.scalar_type());
  const at::Tensor g = grad.to(acc).contiguous();
  at::Tensor result = at::zeros({values.numel()}, values.options().dtype(acc));
  const int64_t rows = g.numel() / out_w;
  if (rows > 0) {
    AT_DISPATCH_FLOATING_TYPES(acc, "crop_resize_backward_cuda", [&] {
      crop_resize_backward_kernel<scalar_t><<<static_cast<unsigned>(grid_for(rows)), cuda::launch_threads(), 0,
                                              c10::cuda::getCurrentCUDAStream()>>>(
          g.data_ptr<scalar_t>(), result.data_ptr<scalar_t>(), a.offsets.data_ptr<int64_t>(),
          a.sizes.data_ptr<int64_t>(), a.boxes.data_ptr<int64_t>(), a.offsets.numel() - 1, rows, channels, out_h,
          out_w, static_cast<scalar_t>(scale), optional_data<scalar_t>(a.std));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return result.to(values.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) {
  m.impl("crop_resize", &crop_resize_cuda);
  m.impl("crop_resize_backward", &crop_resize_backward_cuda);
}

}  // namespace octopus

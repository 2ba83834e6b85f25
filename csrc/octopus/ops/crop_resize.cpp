// octopus::crop_resize and its backward — argument handling and the CPU kernels (the schemas
// are in schemas.cpp).
#include "octopus/ops/crop_resize.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "octopus/core/checks.h"
#include "octopus/core/dtypes.h"

namespace octopus {

CropResizeArgs prepare_crop_resize(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                                   const at::Tensor& boxes, int64_t channels, int64_t out_h, int64_t out_w,
                                   double scale, const c10::optional<at::Tensor>& mean,
                                   const c10::optional<at::Tensor>& std, bool validate_contents) {
  CropResizeArgs a;
  check_values_and_offsets(values, offsets);
  dispatch_values_dtype(values.scalar_type(), [](auto) {});
  const int64_t m = offsets.numel() - 1;
  TORCH_CHECK_TYPE(sizes.scalar_type() == at::kLong, "sizes must be int64, got ", sizes.scalar_type());
  TORCH_CHECK_VALUE(sizes.dim() == 2 && sizes.size(0) == m && sizes.size(1) == 3,
                    "sizes must be [num_images, 3] (C, H, W of each image), got shape ", format_shape(sizes.sizes()));
  TORCH_CHECK_TYPE(boxes.scalar_type() == at::kLong, "boxes must be int64 (image, y0, x0, y1, x1), got ",
                   boxes.scalar_type());
  TORCH_CHECK_VALUE(boxes.dim() == 2 && boxes.size(1) == 5, "boxes must be [K, 5] (image, y0, x0, y1, x1), got shape ",
                    format_shape(boxes.sizes()));
  for (const auto* t : {&sizes, &boxes}) {
    TORCH_CHECK_VALUE(t->device() == values.device(), (t == &sizes ? "sizes" : "boxes"),
                      " must be on the values' device (", values.device(), "), got ", t->device());
  }
  TORCH_CHECK_VALUE(channels > 0, "channels must be positive, got ", channels);
  TORCH_CHECK_VALUE(out_h > 0 && out_w > 0, "the output size must be positive, got (", out_h, ", ", out_w, ")");
  TORCH_CHECK_VALUE(boxes.size(0) == 0 || m > 0, "boxes refer to images but the batch has none");
  const at::ScalarType param_dtype = param_dtype_for(values.scalar_type());
  for (const auto& [param, name] : {std::pair{&mean, "mean"}, std::pair{&std, "std"}}) {
    if (!param->has_value()) continue;
    const at::Tensor& p = **param;
    TORCH_CHECK_TYPE(p.scalar_type() == param_dtype, name, " must be ", param_dtype, ", got ", p.scalar_type());
    TORCH_CHECK_VALUE(p.dim() == 1 && p.numel() == channels, name, " must have one value per channel (", channels,
                      "), got shape ", format_shape(p.sizes()));
    TORCH_CHECK_VALUE(p.device() == values.device(), name, " must be on the values' device (", values.device(),
                      "), got ", p.device());
  }
  if (validate_contents) {
    validate_layout(offsets, sizes, values.numel());
    const at::Tensor s = sizes.cpu(), b = boxes.cpu().contiguous();
    const int64_t* sz = s.data_ptr<int64_t>();
    const int64_t* bx = b.data_ptr<int64_t>();
    for (int64_t i = 0; i < m; ++i) {
      TORCH_CHECK_VALUE(sz[3 * i] == channels, "image ", i, " has ", sz[3 * i], " channels, expected ", channels);
      TORCH_CHECK_VALUE(sz[3 * i + 1] < (int64_t{1} << 31) && sz[3 * i + 2] < (int64_t{1} << 31), "image ", i,
                        " has shape ", format_shape(sz + 3 * i, 3), "; crops need sides below 2^31");
    }
    for (int64_t k = 0; k < b.size(0); ++k) {
      const int64_t* r = bx + 5 * k;
      TORCH_CHECK_VALUE(r[0] >= 0 && r[0] < m, "boxes[", k, "] refers to image ", r[0], " of ", m);
      const int64_t H = sz[3 * r[0] + 1], W = sz[3 * r[0] + 2];
      TORCH_CHECK_VALUE(0 <= r[1] && r[1] < r[3] && r[3] <= H && 0 <= r[2] && r[2] < r[4] && r[4] <= W, "boxes[", k,
                        "] = (y0 ", r[1], ", x0 ", r[2], ", y1 ", r[3], ", x1 ", r[4],
                        ") must satisfy 0 <= y0 < y1 <= H and 0 <= x0 < x1 <= W for its image of H ", H, ", W ", W,
                        " (zero-size boxes are rejected)");
    }
  }
  a.values = values.contiguous();
  a.offsets = offsets.contiguous();
  a.sizes = sizes.contiguous();
  a.boxes = boxes.contiguous();
  if (mean.has_value()) a.mean = mean->contiguous();
  if (std.has_value()) a.std = std->contiguous();
  a.channels = channels;
  a.out_h = out_h;
  a.out_w = out_w;
  a.scale = scale;
  return a;
}

at::Tensor crop_resize_output(const CropResizeArgs& a) {
  return at::empty({a.boxes.size(0), a.channels, a.out_h, a.out_w},
                   a.values.options().dtype(out_dtype_for(a.values.scalar_type())));
}

namespace {

// The column taps of an output row: the same for every row of crops of one width, so they are
// computed again only when the width changes.
class ColumnTaps {
 public:
  explicit ColumnTaps(int64_t out_w) : taps_(out_w) {}
  const BilinearTap* for_width(int64_t crop_w) {
    if (crop_w != width_) {
      const int64_t out_w = static_cast<int64_t>(taps_.size());
      for (int64_t ox = 0; ox < out_w; ++ox) taps_[ox] = bilinear_tap(ox, out_w, crop_w);
      width_ = crop_w;
    }
    return taps_.data();
  }

 private:
  std::vector<BilinearTap> taps_;
  int64_t width_ = -1;
};

}  // namespace

at::Tensor crop_resize_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                           const at::Tensor& boxes, int64_t channels, int64_t out_h, int64_t out_w, double scale,
                           const c10::optional<at::Tensor>& mean, const c10::optional<at::Tensor>& std,
                           bool validate) {
  (void)validate;  // the CPU always checks
  CropResizeArgs a = prepare_crop_resize(values, offsets, sizes, boxes, channels, out_h, out_w, scale, mean, std, true);
  a.out = crop_resize_output(a);
  const int64_t m = a.offsets.numel() - 1, k_boxes = a.boxes.size(0);
  dispatch_values_dtype(a.values.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    using acc_t = acc_type<T>;
    using out_t = out_type<T>;
    const T* in = a.values.data_ptr<T>();
    out_t* out = a.out.data_ptr<out_t>();
    const acc_t* mu = optional_data<acc_t>(a.mean);
    const acc_t* sd = optional_data<acc_t>(a.std);
    const int64_t* off = a.offsets.data_ptr<int64_t>();
    const int64_t* sz = a.sizes.data_ptr<int64_t>();
    const int64_t* bx = a.boxes.data_ptr<int64_t>();
    at::parallel_for(0, k_boxes * channels * out_h, 16, [&](int64_t first, int64_t last) {
      ColumnTaps columns(out_w);
      for (int64_t row = first; row < last; ++row) {
        const int64_t oy = row % out_h, c = row / out_h % channels, k = row / (out_h * channels);
        const CropBox b = crop_box(bx, k, off, sz, m);
        const BilinearTap ty = bilinear_tap(oy, out_h, b.h);
        const T* src = in + b.base + c * b.plane + b.y0 * b.width + b.x0;
        const BilinearTap* taps = columns.for_width(b.w);
        for (int64_t ox = 0; ox < out_w; ++ox) {
          const BilinearTap& tx = taps[ox];
          auto at = [&](int64_t y, int64_t x) { return static_cast<acc_t>(src[y * b.width + x]); };
          const acc_t wy = ty.w, wx = tx.w;
          const acc_t v = (1 - wy) * ((1 - wx) * at(ty.i0, tx.i0) + wx * at(ty.i0, tx.i1)) +
                          wy * ((1 - wx) * at(ty.i1, tx.i0) + wx * at(ty.i1, tx.i1));
          const acc_t shift = mu != nullptr ? mu[c] : acc_t(0), spread = sd != nullptr ? sd[c] : acc_t(1);
          out[row * out_w + ox] = static_cast<out_t>((v * static_cast<acc_t>(scale) - shift) / spread);
        }
      }
    });
  });
  return a.out;
}

// d values: every output element's gradient spread over its four source pixels (serially:
// crops may overlap).
at::Tensor crop_resize_backward_cpu(const at::Tensor& grad, const at::Tensor& values, const at::Tensor& offsets,
                                    const at::Tensor& sizes, const at::Tensor& boxes, double scale,
                                    const c10::optional<at::Tensor>& std) {
  const int64_t out_h = grad.size(2), out_w = grad.size(3), channels = grad.size(1);
  CropResizeArgs a = prepare_crop_resize(values, offsets, sizes, boxes, channels, out_h, out_w, scale,
                                         c10::nullopt, std, false);
  const at::ScalarType acc = param_dtype_for(values.scalar_type());
  at::Tensor g = grad.to(acc).contiguous();
  at::Tensor result = at::zeros({values.numel()}, values.options().dtype(acc));
  const int64_t m = a.offsets.numel() - 1;
  AT_DISPATCH_FLOATING_TYPES(acc, "crop_resize_backward_cpu", [&] {
    const scalar_t* gp = g.data_ptr<scalar_t>();
    scalar_t* r = result.data_ptr<scalar_t>();
    const scalar_t* sd = optional_data<scalar_t>(a.std);
    const int64_t* off = a.offsets.data_ptr<int64_t>();
    const int64_t* sz = a.sizes.data_ptr<int64_t>();
    const int64_t* bx = a.boxes.data_ptr<int64_t>();
    ColumnTaps columns(out_w);
    for (int64_t row = 0; row < boxes.size(0) * channels * out_h; ++row) {
      const int64_t oy = row % out_h, c = row / out_h % channels, k = row / (out_h * channels);
      const CropBox b = crop_box(bx, k, off, sz, m);
      const BilinearTap ty = bilinear_tap(oy, out_h, b.h);
      scalar_t* dst = r + b.base + c * b.plane + b.y0 * b.width + b.x0;
      const scalar_t f = static_cast<scalar_t>(scale) / (sd != nullptr ? sd[c] : scalar_t(1));
      const BilinearTap* taps = columns.for_width(b.w);
      for (int64_t ox = 0; ox < out_w; ++ox) {
        const BilinearTap& tx = taps[ox];
        const scalar_t v = gp[row * out_w + ox] * f, wy = ty.w, wx = tx.w;
        dst[ty.i0 * b.width + tx.i0] += (1 - wy) * (1 - wx) * v;
        dst[ty.i0 * b.width + tx.i1] += (1 - wy) * wx * v;
        dst[ty.i1 * b.width + tx.i0] += wy * (1 - wx) * v;
        dst[ty.i1 * b.width + tx.i1] += wy * wx * v;
      }
    }
  });
  return result.to(values.scalar_type());
}

}  // namespace octopus

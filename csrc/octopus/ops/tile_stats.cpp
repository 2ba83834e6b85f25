// octopus::tile_stats — argument handling and the CPU kernel (the schema is in schemas.cpp).
#include "octopus/ops/tile_stats.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "octopus/core/checks.h"
#include "octopus/core/dtypes.h"

namespace octopus {

TileStatsArgs prepare_tile_stats(const at::Tensor& image, const at::Tensor& tiles, double min_mean, double max_mean,
                                 double min_fraction, double max_fraction, bool validate_contents) {
  TileStatsArgs a;
  dispatch_values_dtype(image.scalar_type(), [](auto) {});
  TORCH_CHECK_VALUE(image.dim() == 2 || image.dim() == 3, "image must be [H, W] or [C, H, W], got shape ",
                    format_shape(image.sizes()));
  TORCH_CHECK_VALUE(image.numel() > 0, "image is empty (shape ", format_shape(image.sizes()), ")");
  TORCH_CHECK_TYPE(tiles.scalar_type() == at::kLong, "tiles must be int64 (y0, x0, y1, x1), got ",
                   tiles.scalar_type());
  TORCH_CHECK_VALUE(tiles.dim() == 2 && tiles.size(1) == 4, "tiles must be [T, 4] (y0, x0, y1, x1), got shape ",
                    format_shape(tiles.sizes()));
  TORCH_CHECK_VALUE(tiles.device() == image.device(), "tiles must be on the image's device (", image.device(),
                    "), got ", tiles.device());
  TORCH_CHECK_VALUE(!(min_mean > max_mean) && !(min_fraction > max_fraction),
                    "the keep bounds are empty: min_mean ", min_mean, ", max_mean ", max_mean, ", min_fraction ",
                    min_fraction, ", max_fraction ", max_fraction);
  a.channels = image.dim() == 3 ? image.size(0) : 1;
  a.height = image.size(-2);
  a.width = image.size(-1);
  if (validate_contents) {
    const at::Tensor t = tiles.cpu().contiguous();
    const int64_t* p = t.data_ptr<int64_t>();
    for (int64_t i = 0; i < t.size(0); ++i) {
      const int64_t* r = p + 4 * i;
      TORCH_CHECK_VALUE(0 <= r[0] && r[0] < r[2] && r[2] <= a.height && 0 <= r[1] && r[1] < r[3] && r[3] <= a.width,
                        "tiles[", i, "] = (y0 ", r[0], ", x0 ", r[1], ", y1 ", r[2], ", x1 ", r[3],
                        ") must satisfy 0 <= y0 < y1 <= H and 0 <= x0 < x1 <= W for the image of H ", a.height,
                        ", W ", a.width, " (empty tiles are rejected)");
    }
  }
  a.image = image.contiguous();
  a.tiles = tiles.contiguous();
  const auto f64 = image.options().dtype(at::kDouble);
  a.mean = at::empty({tiles.size(0)}, f64);
  a.fraction = at::empty({tiles.size(0)}, f64);
  a.keep = at::empty({tiles.size(0)}, image.options().dtype(at::kBool));
  a.bounds = {min_mean, max_mean, min_fraction, max_fraction};
  return a;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tile_stats_cpu(const at::Tensor& image, const at::Tensor& tiles,
                                                               double threshold, double min_mean, double max_mean,
                                                               double min_fraction, double max_fraction,
                                                               bool validate) {
  (void)validate;  // the CPU always checks
  TileStatsArgs a = prepare_tile_stats(image, tiles, min_mean, max_mean, min_fraction, max_fraction, true);
  dispatch_values_dtype(a.image.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* img = a.image.data_ptr<T>();
    const int64_t* tp = a.tiles.data_ptr<int64_t>();
    double* mean = a.mean.data_ptr<double>();
    double* fraction = a.fraction.data_ptr<double>();
    bool* keep = a.keep.data_ptr<bool>();
    at::parallel_for(0, a.tiles.size(0), 1, [&](int64_t first, int64_t last) {
      for (int64_t t = first; t < last; ++t) {
        const TileBox b = tile_box(tp, t, a.height, a.width);
        double sum = 0;
        int64_t above = 0;
        for (int64_t c = 0; c < a.channels; ++c) {
          for (int64_t y = 0; y < b.h; ++y) {
            const T* line = img + (c * a.height + b.y0 + y) * a.width + b.x0;
            for (int64_t x = 0; x < b.w; ++x) {
              const double v = static_cast<double>(line[x]);
              sum += v;
              above += v > threshold;
            }
          }
        }
        const double count = static_cast<double>(a.channels * b.h * b.w);
        mean[t] = sum / count;
        fraction[t] = static_cast<double>(above) / count;
        keep[t] = keep_tile(mean[t], fraction[t], a.bounds);
      }
    });
  });
  return {a.mean, a.fraction, a.keep};
}

}  // namespace octopus

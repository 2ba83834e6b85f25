// Per-tile statistics of one large image (the satellite case): for every tile box
// (y0, x0, y1, x1) of a [C, H, W] image, the mean of its values and the fraction of them
// above a threshold (over all its channels), and whether the tile is kept:
//   min_mean <= mean <= max_mean and min_fraction <= fraction <= max_fraction.
// Sums are float64. Tiles may overlap, leave gaps, and be of any size.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

#include "octopus/core/plan.h"

namespace octopus {

// A tile as read from `tiles` [T, 4], clamped so that unvalidated input never reads outside
// the image (a degenerate tile reads one edge pixel).
struct TileBox {
  int64_t y0, x0, h, w;
};

OCTOPUS_HD TileBox tile_box(const int64_t* tiles, int64_t t, int64_t height, int64_t width) {
  const int64_t* b = tiles + 4 * t;
  auto clamp = [](int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); };
  const int64_t y0 = clamp(b[0], 0, height - 1), x0 = clamp(b[1], 0, width - 1);
  const int64_t y1 = clamp(b[2], y0 + 1, height), x1 = clamp(b[3], x0 + 1, width);
  return {y0, x0, y1 - y0, x1 - x0};
}

struct KeepBounds {
  double min_mean, max_mean, min_fraction, max_fraction;
};

OCTOPUS_HD bool keep_tile(double mean, double fraction, const KeepBounds& k) {
  return mean >= k.min_mean && mean <= k.max_mean && fraction >= k.min_fraction && fraction <= k.max_fraction;
}

struct TileStatsArgs {
  at::Tensor image, tiles, mean, fraction, keep;
  int64_t channels, height, width;
  KeepBounds bounds;
};

// Checks the arguments (every tile inside the image and non-empty when validate_contents:
// one host copy of the tiles) and allocates the outputs.
TileStatsArgs prepare_tile_stats(const at::Tensor& image, const at::Tensor& tiles, double min_mean, double max_mean,
                                 double min_fraction, double max_fraction, bool validate_contents);

// The CPU kernel (tile_stats.cpp), registered in schemas.cpp.
std::tuple<at::Tensor, at::Tensor, at::Tensor> tile_stats_cpu(const at::Tensor& image, const at::Tensor& tiles,
                                                               double threshold, double min_mean, double max_mean,
                                                               double min_fraction, double max_fraction,
                                                               bool validate);

}  // namespace octopus

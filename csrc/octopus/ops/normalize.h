// octopus::normalize (a composite: normalize.cpp) and octopus::normalize_constants, the step
// between its two passes: each (item, channel)'s center and scale from item_stats' raw
// statistics, in one kernel (normalize.cpp on the CPU, normalize.cu on CUDA) where torch ops
// would take a dozen small launches, each an eager caller's host time.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <tuple>

#include "octopus/core/plan.h"  // OCTOPUS_HD

namespace octopus {

// torch.nan_to_num's defaults: NaN -> 0, +-inf -> the largest finite double of its sign.
OCTOPUS_HD double nan_to_num(double x) {
  constexpr double largest = std::numeric_limits<double>::max();
  if (x != x) return 0.0;
  return x > largest ? largest : (x < -largest ? -largest : x);
}

// One (item, channel)'s center and scale, as normalize computed them with torch ops:
// nan_to_num(sum / n) and nan_to_num(rsqrt(M2 / (n - correction) + eps)), the variance NaN
// where n <= correction. An empty slot gets 0 and 0 (it has no elements to scale). `rsqrt`
// is the device's own (CUDA's rsqrt, 1 / sqrt on the CPU), as torch's rsqrt is.
template <class Rsqrt>
OCTOPUS_HD void normalize_constants_of(double sum, double m2, double n, int64_t correction, double eps, Rsqrt rsqrt,
                                       double& center, double& scale) {
  const double c = static_cast<double>(correction);
  const double var = n > c ? m2 / (n - c) : std::numeric_limits<double>::quiet_NaN();
  center = nan_to_num(sum / n);
  scale = nan_to_num(rsqrt(var + eps));
}

// Checks normalize_constants' arguments: stats [M, C, 4] float64 (item_stats' output),
// offsets [M + 1] int64 on its device, C = max(channels, 1), dtype float32 or float64.
void check_normalize_constants(const at::Tensor& stats, const at::Tensor& offsets, int64_t channels,
                               int64_t correction, at::ScalarType dtype);

std::tuple<at::Tensor, at::Tensor> normalize_constants_cpu(const at::Tensor& stats, const at::Tensor& offsets,
                                                           int64_t channels, double eps, int64_t correction,
                                                           at::ScalarType dtype);

at::Tensor normalize(const at::Tensor& values, const at::Tensor& offsets, int64_t channels, double eps,
                     int64_t correction, const c10::optional<at::Tensor>& mean, const c10::optional<at::Tensor>& std,
                     int64_t stats_block_elems, const c10::optional<at::Tensor>& plan, c10::string_view strategy,
                     int64_t block_elems, const c10::optional<at::Tensor>& metadata);

}  // namespace octopus

// Per-item (or per item and channel) statistics: sum, sum of squared deviations from the
// mean (M2), min and max, in float64. Items of C channels are C equal contiguous planes.
//
// Numerics: every (item, channel) is accumulated in float64 as sums of (x - k) and
// (x - k)^2, k being its first element (the shifted-data algorithm): M2 = S2 - S1^2 / n
// loses nothing to cancellation unless the mean lies far from k in units of the standard
// deviation. An empty (item, channel) gives the reductions' identities: sum 0, M2 0,
// min +inf, max -inf. NaN propagates into every statistic. On CUDA, partial sums of plan blocks are combined with float64 atomics, so the
// last bits of a result may differ between runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace octopus {

// Column of each statistic in item_stats' [M, C, 4] output.
enum ItemStat : int { kStatSum = 0, kStatM2 = 1, kStatMin = 2, kStatMax = 3, kNumStats = 4 };

struct ItemStatsArgs {
  at::Tensor values, offsets, out;
  int64_t planes;  // C, at least 1
  int64_t block_elems;
};

// Checks the arguments (the layout too when validate_contents) and allocates the output.
ItemStatsArgs prepare_item_stats(const at::Tensor& values, const at::Tensor& offsets, int64_t channels,
                                 int64_t block_elems, bool validate_contents);

// The CPU kernel (item_stats.cpp); schemas.cpp registers it.
at::Tensor item_stats_cpu(const at::Tensor& values, const at::Tensor& offsets, int64_t channels, int64_t block_elems,
                          const c10::optional<at::Tensor>& plan, bool validate);

}  // namespace octopus

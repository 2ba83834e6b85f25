// The generic CPU driver: runs an element-wise ragged functor (see ops/item_param_op.h for the
// interface: item(i), one(item, g)) over a batch, finding items with the chosen strategy.
// The CPU is the reference backend, so every strategy is real here too: plans are walked
// block by block, searches search, the lookup table is read per element.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>

#include "octopus/core/checks.h"
#include "octopus/core/plan.h"

namespace octopus {

namespace cpu_detail {

// Item containing element g: the last i with offsets[i] <= g (empty items are skipped).
inline int64_t find_item(const int64_t* offsets, int64_t num_items, int64_t g) {
  return std::upper_bound(offsets, offsets + num_items + 1, g) - offsets - 1;
}

// Runs op over the packed elements [begin, end) item by item from item `first`, each element
// in the last item that starts at or before it: a run of small items, or a block_search tile.
template <class Op>
void walk_items(const Op& op, const int64_t* offsets, int64_t num_items, int64_t first, int64_t begin, int64_t end) {
  for (int64_t i = first, g = begin; g < end; ++i) {
    const int64_t stop = i + 1 < num_items ? std::clamp<int64_t>(offsets[i + 1], g, end) : end;
    if (g == stop) continue;
    const auto item = op.item(i);
    for (; g < stop; ++g) op.one(item, g);
  }
}

}  // namespace cpu_detail

template <class Op>
void run_ragged_cpu(const Op& op, Strategy strategy, const at::Tensor& offsets, int64_t num_values,
                    int64_t block_elems, const at::Tensor& metadata) {
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t m = offsets.numel() - 1;
  if (num_values == 0 || m == 0) return;
  const int64_t tiles = (num_values + block_elems - 1) / block_elems;
  // Each parallel task gets a few tiles' worth of elements.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / block_elems);

  switch (strategy) {
    case Strategy::Plan:
    case Strategy::PlanHost: {
      // A plan passed in is only checked for its shape: its rows are clamped as read.
      const int64_t* plan = metadata.data_ptr<int64_t>();
      const int64_t count = std::clamp<int64_t>(plan[0], 0, metadata.size(0) - 1);
      at::parallel_for(0, count, grain, [&](int64_t first, int64_t last) {
        for (int64_t j = first; j < last; ++j) {
          const int64_t begin = std::clamp<int64_t>(plan[2 * (j + 1)], 0, num_values);
          const int64_t packed = plan[2 * (j + 1) + 1];
          const int64_t end = std::min(begin + block_length(packed), num_values);
          const int64_t first_item = std::clamp<int64_t>(block_item(packed), 0, m - 1);
          if (!block_is_run(packed)) {
            const auto item = op.item(first_item);
            for (int64_t g = begin; g < end; ++g) op.one(item, g);
            continue;
          }
          cpu_detail::walk_items(op, off, m, first_item, begin, end);
        }
      });
      return;
    }
    case Strategy::BlockSearch:
      at::parallel_for(0, tiles, grain, [&](int64_t first, int64_t last) {
        for (int64_t t = first; t < last; ++t) {
          const int64_t tile_begin = t * block_elems;
          const int64_t first_item = std::max<int64_t>(cpu_detail::find_item(off, m, tile_begin), 0);
          cpu_detail::walk_items(op, off, m, first_item, tile_begin, std::min(tile_begin + block_elems, num_values));
        }
      });
      return;
    case Strategy::Search:
      at::parallel_for(0, tiles, grain, [&](int64_t first, int64_t last) {
        for (int64_t g = first * block_elems, end = std::min(last * block_elems, num_values); g < end; ++g)
          op.one(op.item(cpu_detail::find_item(off, m, g)), g);
      });
      return;
    case Strategy::Lookup: {
      const int32_t* ids = metadata.data_ptr<int32_t>();
      at::parallel_for(0, tiles, grain, [&](int64_t first, int64_t last) {
        for (int64_t g = first * block_elems, end = std::min(last * block_elems, num_values); g < end; ++g)
          op.one(op.item(std::clamp<int64_t>(ids[g], 0, m - 1)), g);
      });
      return;
    }
  }
}

}  // namespace octopus

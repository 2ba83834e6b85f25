// The block plan: how the packed elements of a ragged batch are cut into work blocks.
//
// A plan is an int64 array of (capacity + 1) rows of two words, kept in an ordinary tensor:
//   row 0          (count, block_elems): how many of the rows below are in use, and the
//                  block size the plan was built for;
//   row 1 + j      (begin, item << 32 | run << 31 | length) for block j < count: the block
//                  covers the packed elements [begin, begin + length) of item `item`, or,
//                  where the run bit is set, of the items item, item + 1, ... (a run).
// Small items would leave most of a warp idle, one block each: consecutive items of at most
// run_item_elems(block_elems) elements (empty ones included) that share a window of
// kRunItems item indices form one run block (at most kRunItems items, at most
// kRunItems * run_item_elems(block_elems) elements), whose warp finds each element's item
// among the run's offsets. Other blocks never cross items and hold at most block_elems
// elements. Blocks cover every element once and are ordered by begin; empty items (and runs
// of nothing but them) get no block. Inside an item, blocks are cut at the multiples of
// block_elems of the packed buffer, so every block but an item's first starts on a
// block_elems boundary: memory accesses stay aligned whatever the offsets.
// The row count is an upper bound known on the host (capacity), so a plan can be built on
// the device with no synchronization: the true count lives in row 0 and the kernels read it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define OCTOPUS_HD __host__ __device__ __forceinline__
#else
#define OCTOPUS_HD inline
#endif

namespace octopus {

constexpr int64_t kDefaultBlockElems = 4096;
// A block's length is packed into 32 bits next to its item index.
constexpr int64_t kMaxBlockElems = int64_t{1} << 30;
constexpr int64_t kMaxItems = (int64_t{1} << 31) - 1;

// At most floor(n / b) full blocks plus one partial block per item.
OCTOPUS_HD int64_t plan_capacity(int64_t num_values, int64_t num_items, int64_t block_elems) {
  return num_values / block_elems + num_items;
}

OCTOPUS_HD int64_t plan_rows(int64_t num_values, int64_t num_items, int64_t block_elems) {
  return plan_capacity(num_values, num_items, block_elems) + 1;
}

// Runs of small items: at most kRunItems items (one per lane of the warp that runs them),
// each of at most run_item_elems(block_elems) elements, so a run holds at most kRunBlocks
// blocks' worth, and never more than 8192 elements. Items of up to 256 elements go into runs
// from 2048-element blocks on: with block_elems / 32 (64 at 2048, 128 at 4096) the block
// sizes that balance skewed batches best left items of 65-256 elements a warp each, about
// 1.2x slower than 8192-element blocks on a batch of 16-256-element items (H200). Larger
// items stay out: with runs of items of up to 1024 elements, batches of 300-800-element
// items ran about 1.2x slower.
constexpr int64_t kRunItems = 32;
constexpr int kRunLoads = 8;  // offsets a run's end is looked for in at once (PlanItems::run_end)
constexpr int64_t kMaxRunItemElems = 256;
constexpr int64_t kRunBlocks = 4;  // a run holds at most this many blocks' worth of elements
OCTOPUS_HD int64_t run_item_elems(int64_t block_elems) {
  const int64_t per_item = kRunBlocks * block_elems / kRunItems;
  return per_item < kMaxRunItemElems ? per_item : kMaxRunItemElems;
}

constexpr int64_t kRunBit = int64_t{1} << 31;
OCTOPUS_HD int64_t pack_block(int64_t item, int64_t length) { return (item << 32) | length; }
OCTOPUS_HD int64_t pack_run(int64_t first_item, int64_t length) { return (first_item << 32) | kRunBit | length; }
OCTOPUS_HD int64_t block_item(int64_t packed) { return packed >> 32; }
OCTOPUS_HD int64_t block_length(int64_t packed) { return packed & (kRunBit - 1); }
OCTOPUS_HD bool block_is_run(int64_t packed) { return (packed & kRunBit) != 0; }
// Blocks of the item [begin, end): one per multiple-of-block_elems window it touches.
OCTOPUS_HD int64_t blocks_for(int64_t begin, int64_t end, int64_t block_elems) {
  return end > begin ? (end - 1) / block_elems - begin / block_elems + 1 : 0;
}

// Start of block k (0-based) of the item that starts at `begin`.
OCTOPUS_HD int64_t block_begin(int64_t begin, int64_t k, int64_t block_elems) {
  return k == 0 ? begin : (begin / block_elems + k) * block_elems;
}

// The items of a batch as the plan builders see them: offsets read through load(i) and
// clamped into [0, num_values], so that unvalidated offsets give wrong blocks, never blocks
// out of bounds. One set of rules for the host and the device builders.
template <class Load>
struct PlanItems {
  Load load;  // load(i) = offsets[i]
  int64_t m, num_values, block_elems;

  OCTOPUS_HD int64_t begin(int64_t i) const { return clamp(load(i)); }
  OCTOPUS_HD int64_t end(int64_t i) const { return clamp(load(i + 1)); }
  OCTOPUS_HD bool small(int64_t i) const { return end(i) - begin(i) <= run_item_elems(block_elems); }
  // A run starts at a small item whose predecessor is not in its window or not small.
  OCTOPUS_HD bool run_start(int64_t i) const { return small(i) && (i % kRunItems == 0 || !small(i - 1)); }
  // One past the last item of the run that starts at i: the first item after i that is not
  // small, at most the end of i's window. The offsets are read kRunLoads at a time, each group
  // issued at once: a loop that may stop at every item was, on the GPU, a chain of up to 32
  // dependent round trips to memory for every run (with it, the scan of a 500K-item plan took
  // 46 us on an H100; without it and with the chunked scan of plan.cu, 15 us).
  OCTOPUS_HD int64_t run_end(int64_t i) const {
    const int64_t window_end = (i / kRunItems + 1) * kRunItems;
    const int64_t last = window_end < m ? window_end : m;
    for (int64_t e = i + 1; e < last; e += kRunLoads) {
      int64_t offset[kRunLoads + 1];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int k = 0; k <= kRunLoads; ++k) offset[k] = e + k <= last ? clamp(load(e + k)) : 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int k = 0; k < kRunLoads; ++k) {
        if (e + k >= last || offset[k + 1] - offset[k] > run_item_elems(block_elems)) return e + k;
      }
    }
    return last;
  }
  // Elements of the run that starts at i (none: no block), at most what a block row holds.
  OCTOPUS_HD int64_t run_length(int64_t i) const {
    const int64_t length = end(run_end(i) - 1) - begin(i);
    return length < 0 ? 0 : (length < kRunBit ? length : kRunBit - 1);
  }
  // Rows of a small item: one for a run's first item if the run holds any element.
  OCTOPUS_HD int64_t small_item_rows(int64_t i) const { return run_start(i) && run_length(i) > 0 ? 1 : 0; }

 private:
  OCTOPUS_HD int64_t clamp(int64_t x) const { return x < 0 ? 0 : (x > num_values ? num_values : x); }
};

template <class Load>
OCTOPUS_HD PlanItems<Load> plan_items(Load load, int64_t m, int64_t num_values, int64_t block_elems) {
  return PlanItems<Load>{load, m, num_values, block_elems};
}

// Builds a plan on the host into `plan` (2 * plan_rows(...) words) from offsets
// [num_items + 1]; rows past the count are zeroed. Returns the block count. Offsets that
// are not valid give a plan whose blocks all lie in [0, num_values) and fit its capacity.
int64_t build_plan_host(const int64_t* offsets, int64_t num_items, int64_t num_values, int64_t block_elems,
                        int64_t* plan);

// Fills table[0..num_values) with the item of every element: the last item i whose offset
// offsets[i] (clamped into [0, num_values]) is at or before the element, found as a running
// maximum over the items' first elements. Exact for valid offsets; for any others (the
// unvalidated path) every entry is still an item index in [0, max(num_items - 1, 0)] and
// nothing outside `table` is written.
void fill_lookup_table_host(const int64_t* offsets, int64_t num_items, int64_t num_values, int32_t* table);

}  // namespace octopus

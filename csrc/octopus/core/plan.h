// The block plan: how the packed elements of a ragged batch are cut into work blocks.
//
// A plan is an int64 array of (capacity + 1) rows of two words, kept in an ordinary tensor:
//   row 0          (count, block_elems): how many of the rows below are in use, and the
//                  block size the plan was built for;
//   row 1 + j      (begin, item << 32 | length) for block j < count: the block covers the
//                  packed elements [begin, begin + length) of item `item`.
// Blocks never cross items, hold at most block_elems elements, cover every element once,
// and are ordered by begin. Empty items get no block. Inside an item, blocks are cut at the
// multiples of block_elems of the packed buffer, so every block but an item's first starts
// on a block_elems boundary: memory accesses stay aligned whatever the offsets.
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

OCTOPUS_HD int64_t pack_block(int64_t item, int64_t length) { return (item << 32) | length; }
OCTOPUS_HD int64_t block_item(int64_t packed) { return packed >> 32; }
OCTOPUS_HD int64_t block_length(int64_t packed) { return packed & 0xffffffffLL; }
// Blocks of the item [begin, end): one per multiple-of-block_elems window it touches.
OCTOPUS_HD int64_t blocks_for(int64_t begin, int64_t end, int64_t block_elems) {
  return end > begin ? (end - 1) / block_elems - begin / block_elems + 1 : 0;
}

// Start of block k (0-based) of the item that starts at `begin`.
OCTOPUS_HD int64_t block_begin(int64_t begin, int64_t k, int64_t block_elems) {
  return k == 0 ? begin : (begin / block_elems + k) * block_elems;
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

#include <algorithm>

#include "octopus/core/plan.h"

namespace octopus {

int64_t build_plan_host(const int64_t* offsets, int64_t num_items, int64_t num_values, int64_t block_elems,
                        int64_t* plan) {
  const int64_t capacity = plan_capacity(num_values, num_items, block_elems);
  const auto items = plan_items([offsets](int64_t i) { return offsets[i]; }, num_items, num_values, block_elems);
  int64_t count = 0;
  int64_t* row = plan + 2;
  // The capacity caps the rows, so that unvalidated offsets (the plan_host strategy's CUDA
  // path) give wrong blocks, never accesses out of bounds.
  for (int64_t item = 0; item < num_items && count < capacity; ++item) {
    if (items.small(item)) {
      if (items.small_item_rows(item) == 0) continue;
      row[0] = items.begin(item);
      row[1] = pack_run(item, items.run_length(item));
      row += 2;
      ++count;
      continue;
    }
    const int64_t end = items.end(item);
    for (int64_t begin = items.begin(item); begin < end && count < capacity;) {
      const int64_t next = std::min(end, (begin / block_elems + 1) * block_elems);
      row[0] = begin;
      row[1] = pack_block(item, next - begin);
      begin = next;
      row += 2;
      ++count;
    }
  }
  std::fill(row, plan + 2 * (capacity + 1), int64_t{0});
  plan[0] = count;
  plan[1] = block_elems;
  return count;
}

void fill_lookup_table_host(const int64_t* offsets, int64_t num_items, int64_t num_values, int32_t* table) {
  std::fill(table, table + num_values, int32_t{0});
  // Item 0 starts at element 0 whatever offsets[0] says: the running maximum begins there.
  for (int64_t item = 1; item < num_items; ++item) {
    const int64_t first = std::clamp<int64_t>(offsets[item], 0, num_values);
    if (first < num_values) table[first] = std::max(table[first], static_cast<int32_t>(item));
  }
  int32_t current = 0;
  for (int64_t g = 0; g < num_values; ++g) {
    current = std::max(current, table[g]);
    table[g] = current;
  }
}

}  // namespace octopus

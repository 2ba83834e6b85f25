#include <algorithm>

#include "octopus/core/plan.h"

namespace octopus {

int64_t build_plan_host(const int64_t* offsets, int64_t num_items, int64_t num_values, int64_t block_elems,
                        int64_t* plan) {
  const int64_t capacity = plan_capacity(num_values, num_items, block_elems);
  int64_t count = 0;
  int64_t* row = plan + 2;
  for (int64_t item = 0; item < num_items; ++item) {
    const int64_t end = offsets[item + 1];
    for (int64_t begin = offsets[item]; begin < end;) {
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

}  // namespace octopus

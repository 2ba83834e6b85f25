#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "octopus/core/plan.h"

namespace {

struct Built {
  std::vector<int64_t> plan;
  int64_t count;
};

Built build(const std::vector<int64_t>& offsets, int64_t block_elems) {
  const int64_t m = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t n = offsets.back();
  Built b{std::vector<int64_t>(2 * octopus::plan_rows(n, m, block_elems), -1), 0};
  b.count = octopus::build_plan_host(offsets.data(), m, n, block_elems, b.plan.data());
  return b;
}

// Blocks a plan should have, by the rule in plan.h: runs of small items per window of
// kRunItems item indices (one block if they hold any element), blocks_for otherwise.
int64_t reference_count(const std::vector<int64_t>& offsets, int64_t block_elems) {
  const int64_t m = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t small = octopus::run_item_elems(block_elems);
  int64_t count = 0;
  for (int64_t i = 0; i < m;) {
    if (offsets[i + 1] - offsets[i] > small) {
      count += octopus::blocks_for(offsets[i], offsets[i + 1], block_elems);
      ++i;
      continue;
    }
    int64_t e = i + 1;
    while (e < m && e % octopus::kRunItems != 0 && offsets[e + 1] - offsets[e] <= small) ++e;
    count += offsets[e] > offsets[i] ? 1 : 0;
    i = e;
  }
  return count;
}

// Every element covered exactly once, no block of one item crosses it, a run holds whole
// small items of one window (at most 4 blocks' worth), no other block exceeds the block size,
// blocks in order, header right, unused rows zeroed.
void expect_valid_plan(const std::vector<int64_t>& offsets, int64_t block_elems) {
  const Built b = build(offsets, block_elems);
  const int64_t m = static_cast<int64_t>(offsets.size()) - 1;
  const int64_t n = offsets.back();
  ASSERT_EQ(b.plan[0], b.count);
  ASSERT_EQ(b.plan[1], block_elems);
  ASSERT_LE(b.count, octopus::plan_capacity(n, m, block_elems));
  EXPECT_EQ(b.count, reference_count(offsets, block_elems));
  int64_t next = 0;  // blocks tile [0, n) in order
  for (int64_t j = 0; j < b.count; ++j) {
    const int64_t begin = b.plan[2 * (j + 1)];
    const int64_t packed = b.plan[2 * (j + 1) + 1];
    const int64_t item = octopus::block_item(packed);
    const int64_t len = octopus::block_length(packed);
    ASSERT_EQ(begin, next) << "block " << j;
    ASSERT_GT(len, 0);
    ASSERT_LE(len, octopus::block_is_run(packed) ? std::min<int64_t>(4 * block_elems, 8192) : block_elems);
    ASSERT_GE(item, 0);
    ASSERT_LT(item, m);
    ASSERT_EQ(octopus::block_is_run(packed), offsets[item + 1] - offsets[item] <= octopus::run_item_elems(block_elems))
        << "block " << j << ": a run exactly where its first item is small";
    if (octopus::block_is_run(packed)) {
      ASSERT_EQ(begin, offsets[item]) << "block " << j;
      int64_t last = item;
      while (offsets[last + 1] < begin + len) ++last;
      ASSERT_EQ(offsets[last + 1], begin + len) << "run " << j << " ends inside item " << last;
      ASSERT_EQ(item / octopus::kRunItems, last / octopus::kRunItems) << "run " << j << " spans two windows";
      for (int64_t i = item; i <= last; ++i)
        ASSERT_LE(offsets[i + 1] - offsets[i], octopus::run_item_elems(block_elems)) << "run " << j << ", item " << i;
    } else {
      ASSERT_GE(begin, offsets[item]);
      ASSERT_LE(begin + len, offsets[item + 1]) << "block " << j << " crosses item " << item;
      // Only an item's first block may start off a block_elems boundary.
      if (begin != offsets[item]) ASSERT_EQ(begin % block_elems, 0) << "block " << j;
      ASSERT_EQ(begin / block_elems, (begin + len - 1) / block_elems) << "block " << j << " spans a boundary";
    }
    next = begin + len;
  }
  EXPECT_EQ(next, n);
  for (size_t k = 2 * (b.count + 1); k < b.plan.size(); ++k) ASSERT_EQ(b.plan[k], 0);
}

TEST(Plan, EmptyBatch) {
  const Built b = build({0}, 64);
  EXPECT_EQ(b.count, 0);
  EXPECT_EQ(b.plan.size(), 2u);
}

TEST(Plan, EmptyItemsGetNoBlocks) {
  expect_valid_plan({0, 0, 0, 5, 5, 9, 9}, 4);
  EXPECT_EQ(build({0, 0, 0}, 16).count, 0);
}

TEST(Plan, BlocksAlignToTheBuffer) {
  // Item [5, 19) with blocks of 4: cut at 8, 12, 16.
  const Built b = build({0, 5, 19}, 4);
  ASSERT_EQ(b.count, 2 + 4);
  const int64_t starts[] = {0, 4, 5, 8, 12, 16};
  for (int j = 0; j < 6; ++j) EXPECT_EQ(b.plan[2 * (j + 1)], starts[j]);
}

TEST(Plan, OneItemSplitIntoBlocks) {
  const Built b = build({0, 10}, 4);
  ASSERT_EQ(b.count, 3);
  EXPECT_EQ(octopus::block_length(b.plan[3]), 4);
  EXPECT_EQ(octopus::block_length(b.plan[7]), 2);
  expect_valid_plan({0, 10}, 4);
  expect_valid_plan({0, 12}, 4);
}

TEST(Plan, SmallItemsFormRunsPerWindowOf32) {
  // 40 items of 10 elements, then one of 200, with blocks of 1024 (small: at most 4 * 1024 /
  // 32 = 128): items 0-31 are one run, 32-39 another, item 40 a block of its own.
  std::vector<int64_t> offsets{0};
  for (int i = 0; i < 40; ++i) offsets.push_back(offsets.back() + 10);
  offsets.push_back(offsets.back() + 200);
  const Built b = build(offsets, 1024);
  ASSERT_EQ(b.count, 3);
  EXPECT_EQ(b.plan[2], 0);
  EXPECT_EQ(b.plan[3], octopus::pack_run(0, 320));
  EXPECT_EQ(b.plan[4], 320);
  EXPECT_EQ(b.plan[5], octopus::pack_run(32, 80));
  EXPECT_EQ(b.plan[6], 400);
  EXPECT_EQ(b.plan[7], octopus::pack_block(40, 200));
  expect_valid_plan(offsets, 1024);
  // Items of 128 elements are small at 1024, one more is not; 256 at most from 2048 on.
  EXPECT_EQ(build({0, 128, 256}, 1024).count, 1);
  EXPECT_EQ(build({0, 129, 258}, 1024).count, 2);
  EXPECT_EQ(build({0, 256, 512}, 4096).count, 1);
  EXPECT_EQ(build({0, 257, 514}, 4096).count, 2);
  // 16-element blocks take items of at most 2 elements into runs; 4-element blocks none.
  EXPECT_EQ(build({0, 1, 2, 3}, 16).count, 1);
  EXPECT_EQ(build({0, 3, 6, 9}, 16).count, 3);
  EXPECT_EQ(build({0, 1, 2, 3}, 4).count, 3);
  // A run holds at most 4 blocks' worth: 32 items of 256 elements with 2048-element blocks.
  std::vector<int64_t> full{0};
  for (int i = 0; i < 32; ++i) full.push_back(full.back() + 256);
  const Built r = build(full, 2048);
  ASSERT_EQ(r.count, 1);
  EXPECT_EQ(r.plan[3], octopus::pack_run(0, 8192));
  expect_valid_plan(full, 2048);
}

TEST(Plan, RandomBatches) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int m = static_cast<int>(rng() % 300);
    std::vector<int64_t> offsets{0};
    for (int i = 0; i < m; ++i) {
      const int kind = static_cast<int>(rng() % 4);
      const int64_t len = kind == 0 ? 0 : kind == 1 ? int64_t(rng() % 5) : int64_t(rng() % 5000);
      offsets.push_back(offsets.back() + len);
    }
    const int64_t block = int64_t{16} << (rng() % 8);
    expect_valid_plan(offsets, block);
  }
}

TEST(Plan, ElementCountsPast2To31) {
  // Offsets alone: a plan for 3 items totalling ~6.4e9 elements, built without the data.
  const int64_t big = (int64_t{1} << 32) + 123;
  expect_valid_plan({0, big, big + 7, big + 7 + (int64_t{1} << 31)}, int64_t{1} << 28);
}

TEST(Plan, CapacityBoundIsTight) {
  // n / b full blocks plus one partial block per item is reached exactly.
  const std::vector<int64_t> offsets{0, 5, 10, 15};
  EXPECT_EQ(build(offsets, 4).count, octopus::plan_capacity(15, 3, 4) - 0);
}

// Offsets that were not validated (the CUDA ops' validate=False path builds plan_host plans
// from them): every block lies in [0, n), names an item, and the blocks fit the capacity.
TEST(Plan, BadOffsetsStayInBounds) {
  const int64_t n = 64, block = 16;
  const std::vector<std::vector<int64_t>> cases{
      {0, 40, 10, 64}, {0, -20, 30, 64}, {0, 10, 500, 64}, {7, 20, 40, 64},
      {0, 64, 0, 64, 0, 64},  // overlapping items: 12 blocks wanted, capacity 4 + 5
      {0, int64_t{1} << 62, -(int64_t{1} << 62), 64}};
  for (const auto& offsets : cases) {
    const int64_t m = static_cast<int64_t>(offsets.size()) - 1;
    std::vector<int64_t> plan(2 * octopus::plan_rows(n, m, block), -1);
    const int64_t count = octopus::build_plan_host(offsets.data(), m, n, block, plan.data());
    ASSERT_LE(count, octopus::plan_capacity(n, m, block));
    ASSERT_EQ(plan[0], count);
    for (int64_t j = 0; j < count; ++j) {
      const int64_t begin = plan[2 * (j + 1)];
      const int64_t item = octopus::block_item(plan[2 * (j + 1) + 1]);
      const int64_t len = octopus::block_length(plan[2 * (j + 1) + 1]);
      EXPECT_GE(begin, 0);
      EXPECT_LE(begin + len, n);
      EXPECT_GE(item, 0);
      EXPECT_LT(item, m);
    }
  }
}

std::vector<int32_t> lookup(const std::vector<int64_t>& offsets, int64_t n) {
  std::vector<int32_t> table(n, -1);
  octopus::fill_lookup_table_host(offsets.data(), static_cast<int64_t>(offsets.size()) - 1, n, table.data());
  return table;
}

TEST(LookupTable, ItemOfEveryElement) {
  EXPECT_EQ(lookup({0, 0, 3, 3, 5, 5}, 5), (std::vector<int32_t>{1, 1, 1, 3, 3}));
  EXPECT_EQ(lookup({0, 4}, 4), (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_TRUE(lookup({0}, 0).empty());
  std::mt19937_64 rng(3);
  std::vector<int64_t> offsets{0};
  std::vector<int32_t> expected;
  for (int32_t i = 0; i < 500; ++i) {
    const int64_t len = rng() % 3 == 0 ? 0 : int64_t(rng() % 50);
    expected.insert(expected.end(), len, i);
    offsets.push_back(offsets.back() + len);
  }
  EXPECT_EQ(lookup(offsets, offsets.back()), expected);
}

TEST(LookupTable, BadOffsetsGiveItemIndices) {
  // The last item whose clamped start is at or before the element (item 0 from element 0).
  EXPECT_EQ(lookup({0, 3, 1, 6}, 6), (std::vector<int32_t>{0, 2, 2, 2, 2, 2}));
  EXPECT_EQ(lookup({5, -3, 100, 4}, 4), (std::vector<int32_t>{1, 1, 1, 1}));
  EXPECT_EQ(lookup({0, 2, 2}, 5), (std::vector<int32_t>{0, 0, 1, 1, 1}));  // last offset short of n
  const std::vector<int32_t> none = lookup({0}, 3);  // no items, yet values: still in range for clamping
  EXPECT_EQ(none, (std::vector<int32_t>{0, 0, 0}));
}

}  // namespace

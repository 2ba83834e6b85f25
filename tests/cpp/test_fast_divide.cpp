// FastDivider: n / d as multiply-high and shift, against the hardware division, for every
// divisor up to 4096, powers of two and their neighbours, and divisors near 2^31.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "octopus/core/fast_divide.h"

namespace {

void expect_exact(uint32_t d, std::mt19937& rng) {
  const octopus::FastDivider f = octopus::FastDivider::make(d);
  std::uniform_int_distribution<uint32_t> any(0, (uint32_t{1} << 31) - 1);
  std::vector<uint32_t> numerators = {0, 1, d - 1, d, d + 1, 2 * d - 1, (uint32_t{1} << 31) - 1};
  for (int k = 0; k < 64; ++k) numerators.push_back(any(rng));
  for (uint32_t n : numerators) {
    if (n >= (uint32_t{1} << 31)) continue;
    ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
  }
}

TEST(FastDivider, SmallDivisors) {
  std::mt19937 rng(0);
  for (uint32_t d = 1; d <= 4096; ++d) expect_exact(d, rng);
}

TEST(FastDivider, PowersOfTwoAndNeighbours) {
  std::mt19937 rng(1);
  for (int s = 1; s < 31; ++s) {
    const uint32_t p = uint32_t{1} << s;
    for (uint32_t d : {p - 1, p, p + 1}) expect_exact(d, rng);
  }
}

TEST(FastDivider, LargeDivisors) {
  std::mt19937 rng(2);
  std::uniform_int_distribution<uint32_t> large(1u << 20, (1u << 31) - 1);
  for (int k = 0; k < 2000; ++k) expect_exact(large(rng), rng);
  expect_exact((1u << 31) - 1, rng);
}

}  // namespace

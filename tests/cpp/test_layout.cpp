#include <gtest/gtest.h>

#include <vector>

#include "octopus/core/layout.h"

namespace {

using octopus::check_channel_planes;
using octopus::check_offsets;
using octopus::check_sizes;
using octopus::format_shape;

TEST(Layout, FormatShapeAsATuple) {
  const std::vector<int64_t> shape{3, 480, 640};
  EXPECT_EQ(format_shape(shape.data(), 3), "(3, 480, 640)");
  EXPECT_EQ(format_shape(shape.data(), 1), "(3,)");
  EXPECT_EQ(format_shape(shape.data(), 0), "()");
}

TEST(Layout, EmptyOffsetsAreNamed) {
  const std::string e = check_offsets(nullptr, -1, 0, "out_offsets");
  EXPECT_EQ(e.find("out_offsets needs at least one entry"), 0u) << e;
}

TEST(Layout, ValidOffsets) {
  const std::vector<int64_t> o{0, 0, 3, 3, 10};
  EXPECT_EQ(check_offsets(o.data(), 4, 10), "");
  const std::vector<int64_t> empty{0};
  EXPECT_EQ(check_offsets(empty.data(), 0, 0), "");
}

TEST(Layout, OffsetsMustStartAtZero) {
  const std::vector<int64_t> o{1, 3};
  const std::string e = check_offsets(o.data(), 1, 3);
  EXPECT_NE(e.find("offsets[0] must be 0"), std::string::npos) << e;
}

TEST(Layout, OffsetsMustNotDecrease) {
  const std::vector<int64_t> o{0, 5, 4, 9};
  const std::string e = check_offsets(o.data(), 3, 9);
  EXPECT_NE(e.find("non-decreasing"), std::string::npos) << e;
  EXPECT_NE(e.find("offsets[2] = 4"), std::string::npos) << e;
}

TEST(Layout, LastOffsetMustMatchValues) {
  const std::vector<int64_t> o{0, 5};
  const std::string e = check_offsets(o.data(), 1, 6);
  EXPECT_NE(e.find("number of values (6)"), std::string::npos) << e;
}

TEST(Layout, SizesMustMatchOffsets) {
  const std::vector<int64_t> o{0, 6, 6, 30};
  const std::vector<int64_t> good{2, 3, 0, 5, 4, 6};
  EXPECT_EQ(check_sizes(good.data(), 3, 2, o.data()), "");
  const std::vector<int64_t> bad{2, 3, 0, 5, 4, 5};
  const std::string e = check_sizes(bad.data(), 3, 2, o.data());
  EXPECT_NE(e.find("sizes[2] = (4, 5) has 20 elements but offsets give item 2 24"), std::string::npos) << e;
  const std::vector<int64_t> negative{-2, -3, 0, 5, 4, 6};
  EXPECT_NE(check_sizes(negative.data(), 3, 2, o.data()).find("negative"), std::string::npos);
}

TEST(Layout, ChannelPlanes) {
  const std::vector<int64_t> o{0, 6, 6, 15};
  EXPECT_EQ(check_channel_planes(o.data(), 3, 3), "");
  EXPECT_NE(check_channel_planes(o.data(), 3, 2).find("item 2"), std::string::npos);
}

}  // namespace

// Validation of the packed ragged layout (docs/architecture.rst, "The packed layout"), on host
// memory.
// Torch-free so that the GoogleTest suite can exercise it directly.
#pragma once

#include <cstdint>
#include <string>

namespace octopus {

// A shape as error messages print it everywhere, Python's tuple form on one line:
// "(3, 480, 640)", "(5,)" for one extent, "()" for none.
std::string format_shape(const int64_t* extents, int64_t count);

// Checks offsets[0..m] against a buffer of n values: offsets[0] == 0, non-decreasing,
// offsets[m] == n. Returns an empty string when valid, otherwise a message that names
// `name` and the first offending index.
std::string check_offsets(const int64_t* offsets, int64_t m, int64_t n, const char* name = "offsets");

// Checks sizes ([m, d] row-major) against offsets: every extent non-negative and
// prod(sizes[i]) == offsets[i+1] - offsets[i]. Assumes the offsets themselves are valid.
std::string check_sizes(const int64_t* sizes, int64_t m, int64_t d, const int64_t* offsets,
                        const char* name = "sizes");

// Checks that every item's length is divisible by `channels` (items made of `channels`
// equal contiguous planes, as [C, H, W] images are).
std::string check_channel_planes(const int64_t* offsets, int64_t m, int64_t channels,
                                 const char* name = "scale");

}  // namespace octopus

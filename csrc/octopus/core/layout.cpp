#include "octopus/core/layout.h"

#include <sstream>

namespace octopus {

std::string format_shape(const int64_t* extents, int64_t count) {
  std::ostringstream out;
  out << "(";
  for (int64_t k = 0; k < count; ++k) out << (k ? ", " : "") << extents[k];
  out << (count == 1 ? ",)" : ")");
  return out.str();
}

std::string check_offsets(const int64_t* offsets, int64_t m, int64_t n, const char* name) {
  std::ostringstream msg;
  if (m < 0) {
    msg << name << " needs at least one entry: num_items + 1 of them, starting with 0 (an empty batch has " << name
        << " [0]); got none";
    return msg.str();
  }
  if (offsets[0] != 0) {
    msg << name << "[0] must be 0, got " << offsets[0];
    return msg.str();
  }
  for (int64_t i = 0; i < m; ++i) {
    if (offsets[i + 1] < offsets[i]) {
      msg << name << " must be non-decreasing, but " << name << "[" << i + 1 << "] = " << offsets[i + 1]
          << " < " << name << "[" << i << "] = " << offsets[i];
      return msg.str();
    }
  }
  if (offsets[m] != n) {
    msg << name << "[-1] must equal the number of values (" << n << "), got " << offsets[m];
    return msg.str();
  }
  return {};
}

std::string check_sizes(const int64_t* sizes, int64_t m, int64_t d, const int64_t* offsets, const char* name) {
  for (int64_t i = 0; i < m; ++i) {
    int64_t count = 1;
    for (int64_t k = 0; k < d; ++k) {
      const int64_t extent = sizes[i * d + k];
      if (extent < 0) {
        std::ostringstream msg;
        msg << name << "[" << i << ", " << k << "] is negative (" << extent << ")";
        return msg.str();
      }
      // Saturate instead of overflowing: any product past 2^62 cannot match an offset span.
      count = (extent != 0 && count > (int64_t{1} << 62) / extent) ? (int64_t{1} << 62) : count * extent;
    }
    const int64_t span = offsets[i + 1] - offsets[i];
    if (count != span) {
      std::ostringstream msg;
      msg << name << "[" << i << "] = " << format_shape(sizes + i * d, d) << " has " << count
          << " elements but offsets give item " << i << " " << span << " (offsets[" << i + 1 << "] - offsets[" << i
          << "])";
      return msg.str();
    }
  }
  return {};
}

std::string check_channel_planes(const int64_t* offsets, int64_t m, int64_t channels, const char* name) {
  for (int64_t i = 0; i < m; ++i) {
    const int64_t span = offsets[i + 1] - offsets[i];
    if (span % channels != 0) {
      std::ostringstream msg;
      msg << name << " has " << channels << " channels per item, but item " << i << " has " << span
          << " elements, which is not a multiple of " << channels;
      return msg.str();
    }
  }
  return {};
}

}  // namespace octopus

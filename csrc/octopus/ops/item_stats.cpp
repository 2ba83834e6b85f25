// octopus::item_stats — argument handling and the CPU kernel (the schema is in schemas.cpp).
#include "octopus/ops/item_stats.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "octopus/core/checks.h"
#include "octopus/core/dtypes.h"

namespace octopus {

ItemStatsArgs prepare_item_stats(const at::Tensor& values, const at::Tensor& offsets, int64_t channels,
                                 int64_t block_elems, bool validate_contents) {
  ItemStatsArgs a;
  check_values_and_offsets(values, offsets);
  dispatch_values_dtype(values.scalar_type(), [](auto) {});
  TORCH_CHECK_VALUE(channels >= 0, "channels must be 0 (per item) or positive (per item and channel), got ",
                    channels);
  a.block_elems = resolve_block_elems(block_elems);
  if (validate_contents) validate_layout(offsets, at::Tensor(), values.numel(), channels, "channels");
  a.planes = channels > 0 ? channels : 1;
  a.values = kernel_ready(values);
  a.offsets = offsets.contiguous();
  a.out = at::empty({offsets.numel() - 1, a.planes, kNumStats}, values.options().dtype(at::kDouble));
  return a;
}

at::Tensor item_stats_cpu(const at::Tensor& values, const at::Tensor& offsets, int64_t channels, int64_t block_elems,
                          const c10::optional<at::Tensor>& plan, bool validate) {
  (void)validate;  // the CPU always checks the layout: O(M) next to O(N)
  (void)plan;      // the CPU walks items directly
  ItemStatsArgs a = prepare_item_stats(values, offsets, channels, block_elems, /*validate_contents=*/true);
  const int64_t m = a.offsets.numel() - 1;
  const int64_t* off = a.offsets.data_ptr<int64_t>();
  double* out = a.out.data_ptr<double>();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  dispatch_values_dtype(a.values.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = a.values.data_ptr<T>();
    at::parallel_for(0, m * a.planes, 1, [&](int64_t first, int64_t last) {
      for (int64_t slot = first; slot < last; ++slot) {
        const int64_t i = slot / a.planes, c = slot % a.planes;
        const int64_t plane = (off[i + 1] - off[i]) / a.planes;
        const T* p = x + off[i] + c * plane;
        double* r = out + slot * kNumStats;
        if (plane == 0) {  // the reductions' identities
          r[kStatSum] = r[kStatM2] = 0.0;
          r[kStatMin] = std::numeric_limits<double>::infinity();
          r[kStatMax] = -std::numeric_limits<double>::infinity();
          continue;
        }
        const double k = static_cast<double>(p[0]);
        double s1 = 0.0, s2 = 0.0, lo = k, hi = k;
        bool has_nan = false;
        for (int64_t j = 0; j < plane; ++j) {
          const double v = static_cast<double>(p[j]);
          const double d = v - k;
          s1 += d;
          s2 += d * d;
          has_nan |= std::isnan(v);
          lo = v < lo ? v : lo;
          hi = v > hi ? v : hi;
        }
        const double n = static_cast<double>(plane);
        r[kStatSum] = s1 + n * k;
        r[kStatM2] = std::max(s2 - s1 * s1 / n, 0.0);
        if (std::isnan(s2)) r[kStatM2] = nan;
        r[kStatMin] = has_nan ? nan : lo;
        r[kStatMax] = has_nan ? nan : hi;
      }
    });
  });
  return a.out;
}

}  // namespace octopus

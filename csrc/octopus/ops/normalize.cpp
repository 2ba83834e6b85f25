// octopus::normalize — instance normalization (each item's own statistics) or fixed
// per-channel constants, as one call: octopus::item_stats, the per-item (and channel)
// center and scale computed on the device, then octopus::pointwise's center_scale. A
// composite of those two ops (their kernels, autograd formulas and fakes serve it), so that
// an eager caller makes one call from Python instead of a dozen small ones, each of which
// would hand the GIL over and wait to get it back (benchmarks/JOURNAL.md, 2026-11-26). Its
// schema and registration (CompositeImplicitAutograd) are in schemas.cpp.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>
#include <string>

#include "octopus/ops/item_stats.h"

namespace octopus {
namespace {

at::Tensor item_stats_op(const at::Tensor& values, const at::Tensor& offsets, int64_t channels, int64_t block_elems,
                         const c10::optional<at::Tensor>& plan) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("octopus::item_stats", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                                               const c10::optional<at::Tensor>&, bool)>();
  return op.call(values, offsets, channels, block_elems, plan, false);
}

at::Tensor pointwise_op(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& a, const at::Tensor& b,
                        c10::string_view strategy, int64_t block_elems, const c10::optional<at::Tensor>& metadata) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("octopus::pointwise", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view,
                                               const at::Tensor&, const at::Tensor&, c10::string_view, int64_t,
                                               const c10::optional<at::Tensor>&, bool)>();
  return op.call(values, offsets, "center_scale", a, b, strategy, block_elems, metadata, false);
}

}  // namespace

at::Tensor normalize(const at::Tensor& values, const at::Tensor& offsets, int64_t channels, double eps,
                     int64_t correction, const c10::optional<at::Tensor>& mean, const c10::optional<at::Tensor>& std,
                     int64_t stats_block_elems, const c10::optional<at::Tensor>& plan, c10::string_view strategy,
                     int64_t block_elems, const c10::optional<at::Tensor>& metadata) {
  // Sizes as symbolic integers: traced (torch.compile, dynamic shapes) this decomposes.
  TORCH_CHECK_VALUE(offsets.dim() == 1, "offsets must be 1-D, got ", offsets.dim(), " dimensions");
  TORCH_CHECK_VALUE(channels >= 0, "channels must be 0 (per item) or a positive number of channels, got ", channels);
  TORCH_CHECK_VALUE(mean.has_value() == std.has_value(),
                    "give both mean and std (fixed constants) or neither (each item's own statistics)");
  const c10::SymInt m = offsets.sym_size(0) - 1;
  const int64_t c = channels > 0 ? channels : 1;
  const auto param = values.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor center, scale;
  if (mean.has_value()) {
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"mean", &*mean}, {"std", &*std}}) {
      TORCH_CHECK_VALUE(t->dim() == 1, name, " must be 1-D: one value per channel (", c, "), got ", t->dim(),
                        " dimensions");
      TORCH_SYM_CHECK(t->sym_size(0).sym_eq(c), name, " must have one value per channel (", c, ")");
      TORCH_CHECK_VALUE(t->device() == values.device(), name, " must be on the values' device (", values.device(),
                        "), got ", t->device());
    }
    center = mean->to(at::kDouble).expand_symint({m, c});
    scale = std->to(at::kDouble).reciprocal().expand_symint({m, c});
  } else {
    TORCH_CHECK_VALUE(correction >= 0, "correction must be non-negative, got ", correction);
    const at::Tensor raw = item_stats_op(values, offsets, channels, stats_block_elems, plan);
    const at::Tensor count = at::div(offsets.diff(), c, "floor").to(at::kDouble).unsqueeze(1);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const at::Tensor var = at::where(count > static_cast<double>(correction), raw.select(2, 1) / (count - correction),
                                     at::scalar_tensor(nan, raw.options()));
    // Empty items have NaN statistics and no elements: any finite parameter does.
    center = at::nan_to_num(raw.select(2, 0) / count);
    scale = at::nan_to_num((var + eps).rsqrt());
  }
  if (channels == 0) {
    center = center.select(1, 0);
    scale = scale.select(1, 0);
  }
  // (x - mean) * scale rather than x * scale + shift: an item of (nearly) constant values has a
  // scale near 1 / sqrt(eps), and the shift's rounding would be multiplied by it.
  return pointwise_op(values, offsets, center.to(param).contiguous(), scale.to(param).contiguous(), strategy,
                      block_elems, metadata);
}

}  // namespace octopus

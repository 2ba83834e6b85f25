// octopus::normalize — instance normalization (each item's own statistics) or fixed
// per-channel constants, as one call: octopus::item_stats, octopus::normalize_constants (the
// per-item, or item and channel, center and scale), then octopus::pointwise's center_scale.
// A composite of those ops (their kernels, autograd formulas and fakes serve it), so that an
// eager caller makes one call from Python instead of a dozen small ones, each of which would
// hand the GIL over and wait to get it back (benchmarks/JOURNAL.md, 2026-11-26). Its schema
// and registration (CompositeImplicitAutograd) are in schemas.cpp; normalize_constants' CPU
// kernel is here, its CUDA kernel in normalize.cu.
#include "octopus/ops/normalize.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <optional>
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

std::tuple<at::Tensor, at::Tensor> normalize_constants_op(const at::Tensor& stats, const at::Tensor& offsets,
                                                          int64_t channels, double eps, int64_t correction,
                                                          at::ScalarType dtype) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("octopus::normalize_constants", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, int64_t,
                                                                       double, int64_t, at::ScalarType)>();
  return op.call(stats, offsets, channels, eps, correction, dtype);
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

bool wants_grad(const c10::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); }

// t.to(dtype).contiguous() that calls neither where it would return t itself: below autograd
// those composites reach the dispatcher as ops, which must not return their inputs.
at::Tensor contiguous_as(const at::Tensor& t, at::ScalarType dtype) {
  const at::Tensor cast = t.scalar_type() == dtype ? t : t.to(dtype);
  return cast.is_contiguous() ? cast : cast.contiguous();
}

}  // namespace

void check_normalize_constants(const at::Tensor& stats, const at::Tensor& offsets, int64_t channels,
                               int64_t correction, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(stats.dim() == 3 && stats.size(2) == kNumStats && stats.scalar_type() == at::kDouble,
                    "stats must be item_stats' output, [M, C, ", int{kNumStats}, "] float64; got ", stats.sizes(),
                    " ", stats.scalar_type());
  TORCH_CHECK_VALUE(offsets.dim() == 1 && offsets.scalar_type() == at::kLong, "offsets must be 1-D int64, got ",
                    offsets.dim(), "-D ", offsets.scalar_type());
  TORCH_CHECK_VALUE(offsets.size(0) == stats.size(0) + 1, "offsets must have one more entry than stats has items (",
                    stats.size(0) + 1, "), got ", offsets.size(0));
  TORCH_CHECK_VALUE(offsets.device() == stats.device(), "offsets must be on the device of stats (", stats.device(),
                    "), got ", offsets.device());
  TORCH_CHECK_VALUE(channels >= 0 && stats.size(1) == (channels > 0 ? channels : 1),
                    "channels must be 0 (stats of one plane per item) or stats' plane count (", stats.size(1),
                    "), got ", channels);
  TORCH_CHECK_VALUE(correction >= 0, "correction must be non-negative, got ", correction);
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == at::kDouble, "dtype must be float32 or float64, got ", dtype);
}

std::tuple<at::Tensor, at::Tensor> normalize_constants_cpu(const at::Tensor& stats, const at::Tensor& offsets,
                                                           int64_t channels, double eps, int64_t correction,
                                                           at::ScalarType dtype) {
  check_normalize_constants(stats, offsets, channels, correction, dtype);
  const int64_t planes = stats.size(1);
  const at::Tensor s = stats.contiguous(), off = offsets.contiguous();
  at::Tensor center = at::empty({stats.size(0), planes}, stats.options().dtype(dtype));
  at::Tensor scale = at::empty_like(center);
  AT_DISPATCH_FLOATING_TYPES(dtype, "normalize_constants", [&] {
    const double* st = s.data_ptr<double>();
    const int64_t* o = off.data_ptr<int64_t>();
    scalar_t* ce = center.data_ptr<scalar_t>();
    scalar_t* sc = scale.data_ptr<scalar_t>();
    at::parallel_for(0, center.numel(), 4096, [&](int64_t first, int64_t last) {
      for (int64_t slot = first; slot < last; ++slot) {
        const int64_t i = slot / planes;
        double a, b;
        normalize_constants_of(st[slot * kNumStats + kStatSum], st[slot * kNumStats + kStatM2],
                               static_cast<double>((o[i + 1] - o[i]) / planes), correction, eps,
                               [](double v) { return 1.0 / std::sqrt(v); }, a, b);
        ce[slot] = static_cast<scalar_t>(a);
        sc[slot] = static_cast<scalar_t>(b);
      }
    });
  });
  return {center, scale};
}

at::Tensor normalize(const at::Tensor& values, const at::Tensor& offsets, int64_t channels, double eps,
                     int64_t correction, const c10::optional<at::Tensor>& mean, const c10::optional<at::Tensor>& std,
                     int64_t stats_block_elems, const c10::optional<at::Tensor>& plan, c10::string_view strategy,
                     int64_t block_elems, const c10::optional<at::Tensor>& metadata) {
  // Sizes as symbolic integers: traced (torch.compile, dynamic shapes) this decomposes.
  TORCH_CHECK_VALUE(offsets.dim() == 1, "offsets must be 1-D, got ", offsets.dim(), " dimensions");
  TORCH_CHECK_VALUE(channels >= 0, "channels must be 0 (per item) or a positive number of channels, got ", channels);
  TORCH_CHECK_VALUE(mean.has_value() == std.has_value(),
                    "give both mean and std (fixed constants) or neither (each item's own statistics)");
  // A call that needs no gradient runs below autograd: straight to the ops' kernels instead of
  // through their autograd wrappers (registered from Python: a round trip into Python each).
  std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
  if (!(c10::GradMode::is_enabled() && (values.requires_grad() || wants_grad(mean) || wants_grad(std)))) {
    below_autograd.emplace();
  }
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
    center = contiguous_as(*mean, at::kDouble).expand_symint({m, c});
    scale = contiguous_as(*std, at::kDouble).reciprocal().expand_symint({m, c});
  } else {
    TORCH_CHECK_VALUE(correction >= 0, "correction must be non-negative, got ", correction);
    const at::Tensor raw = item_stats_op(values, offsets, channels, stats_block_elems, plan);
    std::tie(center, scale) = normalize_constants_op(raw, offsets, channels, eps, correction, param);
  }
  if (channels == 0) {
    center = center.select(1, 0);
    scale = scale.select(1, 0);
  }
  // (x - mean) * scale rather than x * scale + shift: an item of (nearly) constant values has a
  // scale near 1 / sqrt(eps), and the shift's rounding would be multiplied by it.
  return pointwise_op(values, offsets, contiguous_as(center, param), contiguous_as(scale, param), strategy, block_elems,
                      metadata);
}

}  // namespace octopus

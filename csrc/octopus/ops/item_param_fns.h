// The per-element functions of the element-wise ops with per-item parameters a and b
// (run by ItemParamOp, ops/item_param_op.h), and their names in the `pointwise` op.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include <cmath>
#include <string>
#include <tuple>

#include "octopus/core/plan.h"

namespace octopus {

struct AffineFn {  // x * a + b
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) { return x * a + b; }
};

struct ClampFn {  // min(max(x, a), b); NaN stays NaN
  static constexpr const char* kName = "clamp";
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) { return x < a ? a : (x > b ? b : x); }
};

struct InsideFn {  // 1 where a <= x <= b, else 0 (clamp's gradient mask)
  static constexpr const char* kName = "inside";
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) { return x >= a && x <= b ? T(1) : T(0); }
};

struct ThresholdMaskFn {  // 1 where x > a, else 0
  static constexpr const char* kName = "threshold_mask";
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T) { return x > a ? T(1) : T(0); }
};

struct ThresholdKeepFn {  // x where x > a, else b
  static constexpr const char* kName = "threshold_keep";
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) { return x > a ? x : b; }
};

struct CenterScaleFn {  // (x - a) * b: normalization, exact 0 for x == a however large b is
  static constexpr const char* kName = "center_scale";
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) { return (x - a) * b; }
};

struct PowerFn {  // b * x^a (gamma correction of x >= 0: a = gamma, b = gain)
  static constexpr const char* kName = "power";
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) {
#ifdef __CUDA_ARCH__
    return b * pow(x, a);
#else
    return b * static_cast<T>(std::pow(x, a));
#endif
  }
};

// Every kind of the pointwise op: its function, named by its kName (the schema's `kind`).
using PointwiseFns = std::tuple<ClampFn, InsideFn, ThresholdMaskFn, ThresholdKeepFn, PowerFn, CenterScaleFn>;

// "'clamp', 'inside', ...": the kinds' names, for messages.
std::string pointwise_kind_names();

// Calls f(Fn{}) for the function of PointwiseFns named `kind`; a ValueError naming the
// kinds otherwise.
template <class F>
void dispatch_pointwise_kind(c10::string_view kind, F&& f) {
  bool found = false;
  std::apply([&](auto... fns) { ((!found && kind == decltype(fns)::kName ? (f(fns), found = true) : false), ...); },
             PointwiseFns{});
  TORCH_CHECK_VALUE(found, "kind must be one of ", pointwise_kind_names(), "; got '", std::string(kind), "'");
}

}  // namespace octopus

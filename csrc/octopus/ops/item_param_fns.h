// The per-element functions of the element-wise ops with per-item parameters a and b
// (run by ItemParamOp, ops/item_param_op.h), and their names in the `pointwise` op.
#pragma once

#include <c10/util/string_view.h>

#include <cmath>

#include "octopus/core/plan.h"

namespace octopus {

struct AffineFn {  // x * a + b
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) { return x * a + b; }
};

struct ClampFn {  // min(max(x, a), b); NaN stays NaN
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) { return x < a ? a : (x > b ? b : x); }
};

struct InsideFn {  // 1 where a <= x <= b, else 0 (clamp's gradient mask)
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) { return x >= a && x <= b ? T(1) : T(0); }
};

struct ThresholdMaskFn {  // 1 where x > a, else 0
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T) { return x > a ? T(1) : T(0); }
};

struct ThresholdKeepFn {  // x where x > a, else b
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) { return x > a ? x : b; }
};

struct CenterScaleFn {  // (x - a) * b: normalization, exact 0 for x == a however large b is
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) { return (x - a) * b; }
};

struct PowerFn {  // b * x^a (gamma correction of x >= 0: a = gamma, b = gain)
  template <typename T>
  static OCTOPUS_HD T apply(T x, T a, T b) {
#ifdef __CUDA_ARCH__
    return b * pow(x, a);
#else
    return b * static_cast<T>(std::pow(x, a));
#endif
  }
};

enum class PointwiseKind { Clamp, Inside, ThresholdMask, ThresholdKeep, Power, CenterScale };

PointwiseKind parse_pointwise_kind(c10::string_view name);

// Calls f(Fn{}) for the kind.
template <class F>
void dispatch_pointwise_kind(PointwiseKind kind, F&& f) {
  switch (kind) {
    case PointwiseKind::Clamp: return f(ClampFn{});
    case PointwiseKind::Inside: return f(InsideFn{});
    case PointwiseKind::ThresholdMask: return f(ThresholdMaskFn{});
    case PointwiseKind::ThresholdKeep: return f(ThresholdKeepFn{});
    case PointwiseKind::Power: return f(PowerFn{});
    case PointwiseKind::CenterScale: return f(CenterScaleFn{});
  }
}

}  // namespace octopus

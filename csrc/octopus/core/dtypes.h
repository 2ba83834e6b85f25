// Dispatch over the value dtypes the element-wise ops accept, and the types an op
// computes and writes in for each: float32 arithmetic (float64 for float64 values),
// the values' own dtype out, float32 out for uint8.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace octopus {

template <typename in_t>
using acc_type = std::conditional_t<std::is_same_v<in_t, double>, double, float>;

template <typename in_t>
using out_type = std::conditional_t<std::is_same_v<in_t, uint8_t>, float, in_t>;

inline c10::ScalarType out_dtype_for(c10::ScalarType values) {
  return values == c10::kByte ? c10::kFloat : values;
}

inline c10::ScalarType param_dtype_for(c10::ScalarType values) {
  return values == c10::kDouble ? c10::kDouble : c10::kFloat;
}

// Calls f(in_t{}) for the values' dtype.
template <class F>
void dispatch_values_dtype(c10::ScalarType dtype, F&& f) {
  switch (dtype) {
    case c10::kFloat: return f(float{});
    case c10::kDouble: return f(double{});
    case c10::kHalf: return f(c10::Half{});
    case c10::kBFloat16: return f(c10::BFloat16{});
    case c10::kByte: return f(uint8_t{});
    default:
      TORCH_CHECK_TYPE(false, "values must be float32, float64, float16, bfloat16 or uint8, got ", dtype);
  }
}

// Calls f(T{}) for any dtype an op that only moves values accepts (the conversions between
// ragged and padded): the element-wise dtypes, int32, int64 and bool.
template <class F>
void dispatch_copy_dtype(c10::ScalarType dtype, F&& f) {
  switch (dtype) {
    case c10::kInt: return f(int32_t{});
    case c10::kLong: return f(int64_t{});
    case c10::kBool: return f(bool{});
    case c10::kFloat:
    case c10::kDouble:
    case c10::kHalf:
    case c10::kBFloat16:
    case c10::kByte: return dispatch_values_dtype(dtype, std::forward<F>(f));
    default:
      TORCH_CHECK_TYPE(false, "values must be float32, float64, float16, bfloat16, uint8, int32, int64 or bool, got ",
                       dtype);
  }
}

}  // namespace octopus

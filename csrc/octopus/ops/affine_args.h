// Argument handling for octopus::affine shared by its CPU and CUDA implementations.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <type_traits>

#include "octopus/core/checks.h"
#include "octopus/core/dtypes.h"
#include "octopus/ops/affine.h"

namespace octopus {

struct AffineArgs {
  at::Tensor values, offsets, scale, bias, out;
  Strategy strategy;
  int64_t block_elems;
  int64_t channels;  // 0: per-item parameters
};

// Checks every argument (shapes, dtypes, devices; the offsets' contents too when
// `validate_contents`) and allocates the output.
AffineArgs prepare_affine(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& scale,
                          const at::Tensor& bias, c10::string_view strategy, int64_t block_elems,
                          bool validate_contents);

// Calls f(op) with the functor for these arguments' dtype and parameter form.
template <class F>
void with_affine_op(const AffineArgs& a, F&& f) {
  dispatch_values_dtype(a.values.scalar_type(), [&](auto tag) {
    using in_t = decltype(tag);
    using out_t = out_type<in_t>;
    using acc_t = acc_type<in_t>;
    auto make = [&](auto per_channel) {
      AffineOp<in_t, out_t, acc_t, decltype(per_channel)::value> op{
          a.values.template data_ptr<in_t>(), a.out.template data_ptr<out_t>(),
          a.scale.template data_ptr<acc_t>(),  a.bias.template data_ptr<acc_t>(),
          a.offsets.template data_ptr<int64_t>(), a.values.numel(),
          a.channels};
      f(op);
    };
    if (a.channels > 0) {
      make(std::true_type{});
    } else {
      make(std::false_type{});
    }
  });
}

}  // namespace octopus

// Argument handling of the element-wise ops with per-item parameters a and b (affine,
// pointwise), shared by their CPU and CUDA implementations.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <type_traits>

#include "octopus/core/checks.h"
#include "octopus/core/dtypes.h"
#include "octopus/ops/item_param_op.h"

namespace octopus {

struct ItemParamArgs {
  at::Tensor values, offsets, a, b, out;
  Strategy strategy;
  int64_t block_elems;
  int64_t channels;  // 0: per-item parameters
};

// Checks every argument (shapes, dtypes, devices, naming a and b as `a_name`/`b_name`; the
// offsets' contents too when `validate_contents`) and allocates the output.
ItemParamArgs prepare_item_params(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& a,
                                  const at::Tensor& b, const char* a_name, const char* b_name,
                                  c10::string_view strategy, int64_t block_elems, bool validate_contents);

// Calls f(op) with the ItemParamOp of function Fn for these arguments' dtype and form.
template <class Fn, class F>
void with_item_param_op(const ItemParamArgs& args, F&& f) {
  dispatch_values_dtype(args.values.scalar_type(), [&](auto tag) {
    using in_t = decltype(tag);
    using out_t = out_type<in_t>;
    using acc_t = acc_type<in_t>;
    auto make = [&](auto per_channel) {
      ItemParamOp<in_t, out_t, acc_t, decltype(per_channel)::value, Fn> op{
          args.values.template data_ptr<in_t>(), args.out.template data_ptr<out_t>(),
          args.a.template data_ptr<acc_t>(),     args.b.template data_ptr<acc_t>(),
          args.offsets.template data_ptr<int64_t>(), args.values.numel(),
          args.channels};
      f(op);
    };
    if (args.channels > 0) {
      make(std::true_type{});
    } else {
      make(std::false_type{});
    }
  });
}

}  // namespace octopus

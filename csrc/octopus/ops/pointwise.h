// octopus::pointwise: clamp, threshold, power and normalization's (x - mean) * scale with
// per-item parameters a and b (the kinds of item_param_fns.h), the body of every backend's
// entry point (schemas.cpp registers the CPU's, pointwise.cu the CUDA's).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <cstdint>

#include "octopus/core/metadata.h"
#include "octopus/ops/item_param_args.h"
#include "octopus/ops/item_param_fns.h"

namespace octopus {

template <class Backend>
at::Tensor pointwise(const at::Tensor& values, const at::Tensor& offsets, c10::string_view kind, const at::Tensor& a,
                     const at::Tensor& b, c10::string_view strategy, int64_t block_elems,
                     const c10::optional<at::Tensor>& metadata, bool validate) {
  const typename Backend::Guard guard(values.device());
  dispatch_pointwise_kind(kind, [](auto) {});  // a bad kind first: it is the call's own error
  ItemParamArgs args =
      prepare_item_params(values, offsets, a, b, "a", "b", strategy, block_elems, Backend::may_read_host(validate));
  const at::Tensor meta =
      metadata_for(args.strategy, metadata, args.offsets, args.values.numel(), args.block_elems, Backend::build_plan);
  dispatch_pointwise_kind(kind, [&](auto fn) {
    with_item_param_op<decltype(fn)>(args, [&](const auto& op) {
      Backend::run(op, args.strategy, args.offsets, args.values.numel(), args.block_elems, meta);
    });
  });
  return args.out;
}

}  // namespace octopus

// octopus::affine: x * scale[item] + bias[item], the body of every backend's entry point
// (schemas.cpp registers the CPU's, affine.cu the CUDA's).
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
at::Tensor affine(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& scale, const at::Tensor& bias,
                  c10::string_view strategy, int64_t block_elems, const c10::optional<at::Tensor>& metadata,
                  bool validate) {
  const typename Backend::Guard guard(values.device());
  ItemParamArgs a = prepare_item_params(values, offsets, scale, bias, "scale", "bias", strategy, block_elems,
                                        Backend::may_read_host(validate));
  const at::Tensor meta =
      metadata_for(a.strategy, metadata, a.offsets, a.values.numel(), a.block_elems, Backend::build_plan);
  with_item_param_op<AffineFn>(a, [&](const auto& op) {
    Backend::run(op, a.strategy, a.offsets, a.values.numel(), a.block_elems, meta);
  });
  return a.out;
}

}  // namespace octopus

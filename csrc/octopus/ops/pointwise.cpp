// octopus::pointwise — clamp, threshold, power and normalization's (x - mean) * scale with
// per-item parameters: schema, kind names, and the CPU kernel (the ItemParamOp of the kind's
// function on the generic driver).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "octopus/core/driver_cpu.h"
#include "octopus/core/metadata.h"
#include "octopus/ops/item_param_args.h"
#include "octopus/ops/item_param_fns.h"

namespace octopus {

PointwiseKind parse_pointwise_kind(c10::string_view name) {
  if (name == "clamp") return PointwiseKind::Clamp;
  if (name == "inside") return PointwiseKind::Inside;
  if (name == "threshold_mask") return PointwiseKind::ThresholdMask;
  if (name == "threshold_keep") return PointwiseKind::ThresholdKeep;
  if (name == "power") return PointwiseKind::Power;
  if (name == "center_scale") return PointwiseKind::CenterScale;
  TORCH_CHECK_VALUE(false,
                    "kind must be one of 'clamp', 'inside', 'threshold_mask', 'threshold_keep', 'power', 'center_scale'; "
                    "got '",
                    std::string(name), "'");
}

namespace {

at::Tensor pointwise_cpu(const at::Tensor& values, const at::Tensor& offsets, c10::string_view kind,
                         const at::Tensor& a, const at::Tensor& b, c10::string_view strategy, int64_t block_elems,
                         const c10::optional<at::Tensor>& metadata, bool validate) {
  (void)validate;  // the CPU always checks the layout: O(M) next to O(N)
  const PointwiseKind k = parse_pointwise_kind(kind);
  ItemParamArgs args = prepare_item_params(values, offsets, a, b, "a", "b", strategy, block_elems, true);
  const at::Tensor meta =
      metadata_for(args.strategy, metadata, args.offsets, args.values.numel(), args.block_elems, build_plan_cpu);
  dispatch_pointwise_kind(k, [&](auto fn) {
    with_item_param_op<decltype(fn)>(args, [&](const auto& op) {
      run_ragged_cpu(op, args.strategy, args.offsets, args.values.numel(), args.block_elems, meta);
    });
  });
  return args.out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(octopus, m) {
  m.def("pointwise(Tensor values, Tensor offsets, str kind, Tensor a, Tensor b, str strategy=\"plan\", "
        "int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor");
}

TORCH_LIBRARY_IMPL(octopus, CPU, m) { m.impl("pointwise", &pointwise_cpu); }

}  // namespace octopus

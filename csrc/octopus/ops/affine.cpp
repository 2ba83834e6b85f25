// octopus::affine — schema and the CPU kernel.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "octopus/core/driver_cpu.h"
#include "octopus/core/metadata.h"
#include "octopus/ops/item_param_args.h"
#include "octopus/ops/item_param_fns.h"

namespace octopus {

namespace {

at::Tensor affine_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& scale,
                      const at::Tensor& bias, c10::string_view strategy, int64_t block_elems,
                      const c10::optional<at::Tensor>& metadata, bool validate) {
  // Validating on the host costs O(M) next to the O(N) op: the CPU always does it.
  (void)validate;
  ItemParamArgs a =
      prepare_item_params(values, offsets, scale, bias, "scale", "bias", strategy, block_elems, /*validate_contents=*/true);
  const at::Tensor meta = metadata_for(a.strategy, metadata, a.offsets, a.values.numel(), a.block_elems,
                                       build_plan_cpu);
  with_item_param_op<AffineFn>(a, [&](const auto& op) {
    run_ragged_cpu(op, a.strategy, a.offsets, a.values.numel(), a.block_elems, meta);
  });
  return a.out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(octopus, m) {
  m.def(
      "affine(Tensor values, Tensor offsets, Tensor scale, Tensor bias, str strategy=\"plan\", "
      "int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor");
}

TORCH_LIBRARY_IMPL(octopus, CPU, m) { m.impl("affine", &affine_cpu); }

}  // namespace octopus

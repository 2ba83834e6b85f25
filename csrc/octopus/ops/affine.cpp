// octopus::affine — schema, argument handling, and the CPU kernel.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "octopus/core/driver_cpu.h"
#include "octopus/core/metadata.h"
#include "octopus/ops/affine_args.h"

namespace octopus {

AffineArgs prepare_affine(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& scale,
                          const at::Tensor& bias, c10::string_view strategy, int64_t block_elems,
                          bool validate_contents) {
  AffineArgs a;
  a.strategy = parse_strategy(strategy);
  a.block_elems = resolve_block_elems(block_elems);
  check_values_and_offsets(values, offsets);
  const int64_t m = offsets.numel() - 1;
  const at::ScalarType param_dtype = param_dtype_for(values.scalar_type());
  dispatch_values_dtype(values.scalar_type(), [](auto) {});  // rejects unsupported dtypes
  a.channels = check_item_params(scale, "scale", m, param_dtype, values.device());
  check_item_params(bias, "bias", m, param_dtype, values.device());
  TORCH_CHECK_VALUE(bias.sizes() == scale.sizes(), "bias must have the same shape as scale (", scale.sizes(),
                    "), got ", bias.sizes());
  if (validate_contents) validate_layout(offsets, at::Tensor(), values.numel(), a.channels, "scale");
  a.values = kernel_ready(values);
  a.offsets = offsets.contiguous();
  a.scale = scale.contiguous();
  a.bias = bias.contiguous();
  a.out = at::empty({values.numel()}, values.options().dtype(out_dtype_for(values.scalar_type())));
  return a;
}

namespace {

at::Tensor affine_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& scale,
                      const at::Tensor& bias, c10::string_view strategy, int64_t block_elems,
                      const c10::optional<at::Tensor>& metadata, bool validate) {
  // Validating on the host costs O(M) next to the O(N) op: the CPU always does it.
  (void)validate;
  AffineArgs a = prepare_affine(values, offsets, scale, bias, strategy, block_elems, /*validate_contents=*/true);
  const at::Tensor meta = metadata_for(a.strategy, metadata, a.offsets, a.values.numel(), a.block_elems,
                                       build_plan_cpu);
  with_affine_op(a, [&](const auto& op) {
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

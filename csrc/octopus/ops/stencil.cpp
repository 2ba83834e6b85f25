// octopus::stencil3x3 and its adjoint — argument handling (the body is stencil.h's; the
// schemas and the CPU registrations are in schemas.cpp).
#include "octopus/ops/stencil.h"

#include <ATen/ATen.h>

#include <string>


namespace octopus {

Border parse_border(c10::string_view name) {
  if (name == "replicate") return Border::Replicate;
  if (name == "zero") return Border::Zero;
  TORCH_CHECK_VALUE(false, "border must be 'replicate' or 'zero', got '", std::string(name), "'");
}

StencilArgs prepare_stencil(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                            const at::Tensor& weight, c10::string_view border, c10::string_view strategy,
                            int64_t block_elems, bool validate_contents, bool adjoint) {
  StencilArgs a;
  a.strategy = parse_strategy(strategy);
  a.block_elems = resolve_block_elems(block_elems);
  a.border = parse_border(border);
  check_values_and_offsets(values, offsets);
  if (adjoint) {
    TORCH_CHECK_TYPE(values.scalar_type() == at::kFloat || values.scalar_type() == at::kDouble,
                     "grad must be float32 or float64, got ", values.scalar_type());
  } else {
    dispatch_values_dtype(values.scalar_type(), [](auto) {});
  }
  const int64_t m = offsets.numel() - 1;
  TORCH_CHECK_TYPE(sizes.scalar_type() == at::kLong, "sizes must be int64, got ", sizes.scalar_type());
  TORCH_CHECK_VALUE(sizes.dim() == 2 && sizes.size(0) == m && (sizes.size(1) == 2 || sizes.size(1) == 3),
                    "sizes must be [num_items, 2] ([H, W] items) or [num_items, 3] ([C, H, W] images) with "
                    "num_items = ", m, ", got shape ", format_shape(sizes.sizes()));
  TORCH_CHECK_VALUE(sizes.device() == values.device(), "sizes must be on the values' device (", values.device(),
                    "), got ", sizes.device());
  const at::ScalarType param_dtype = param_dtype_for(values.scalar_type());
  TORCH_CHECK_TYPE(weight.scalar_type() == param_dtype, "weight must be ", param_dtype, " for these values, got ",
                   weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(0) >= 1 && weight.size(1) == 9,
                    "weight must be [channels, 9] (one 3x3 kernel per channel, row-major), got shape ",
                    format_shape(weight.sizes()));
  TORCH_CHECK_VALUE(weight.device() == values.device(), "weight must be on the values' device (", values.device(),
                    "), got ", weight.device());
  a.channels = weight.size(0);
  TORCH_CHECK_VALUE(sizes.size(1) == 3 || a.channels == 1,
                    "[H, W] items take one kernel: weight must be [1, 9], got shape ", format_shape(weight.sizes()));
  if (validate_contents) {
    validate_layout(offsets, sizes, values.numel());
    if (sizes.size(1) == 3 && m > 0) {
      const at::Tensor wrong = (sizes.select(1, 0) != a.channels).nonzero();
      if (wrong.numel() > 0) {
        const int64_t i = wrong[0][0].item<int64_t>();
        TORCH_CHECK_VALUE(false, "item ", i, " has ", sizes[i][0].item<int64_t>(), " channels but weight has ",
                          a.channels, " kernels (one per channel)");
      }
    }
  }
  a.values = kernel_ready(values);
  a.offsets = offsets.contiguous();
  a.sizes = sizes.contiguous();
  a.weight = weight.contiguous();
  a.out = at::empty({values.numel()},
                    values.options().dtype(adjoint ? values.scalar_type() : out_dtype_for(values.scalar_type())));
  return a;
}

}  // namespace octopus

// Argument checks of the element-wise ops with per-item parameters (affine, pointwise).
#include "octopus/ops/item_param_args.h"

#include <ATen/ATen.h>

namespace octopus {

ItemParamArgs prepare_item_params(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& scale,
                                  const at::Tensor& bias, const char* scale_name, const char* bias_name,
                                  c10::string_view strategy, int64_t block_elems, bool validate_contents) {
  ItemParamArgs a;
  a.strategy = parse_strategy(strategy);
  a.block_elems = resolve_block_elems(block_elems);
  check_values_and_offsets(values, offsets);
  const int64_t m = offsets.numel() - 1;
  const at::ScalarType param_dtype = param_dtype_for(values.scalar_type());
  dispatch_values_dtype(values.scalar_type(), [](auto) {});  // rejects unsupported dtypes
  a.channels = check_item_params(scale, scale_name, m, param_dtype, values.device());
  check_item_params(bias, bias_name, m, param_dtype, values.device());
  TORCH_CHECK_VALUE(bias.sizes() == scale.sizes(), bias_name, " must have the same shape as ", scale_name, " ",
                    format_shape(scale.sizes()), ", got ", format_shape(bias.sizes()));
  if (validate_contents) validate_layout(offsets, at::Tensor(), values.numel(), a.channels, scale_name);
  a.values = kernel_ready(values);
  a.offsets = offsets.contiguous();
  a.a = scale.contiguous();
  a.b = bias.contiguous();
  a.out = at::empty({values.numel()}, values.options().dtype(out_dtype_for(values.scalar_type())));
  return a;
}

}  // namespace octopus

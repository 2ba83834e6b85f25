// octopus::crop_resize_ragged and its backward — argument handling and the backward's CPU
// kernel (the forward's body is crop_resize_ragged.h's; the schemas are in schemas.cpp).
#include "octopus/ops/crop_resize_ragged.h"

#include <ATen/ATen.h>


namespace octopus {

CropResizeRaggedArgs prepare_crop_resize_ragged(const at::Tensor& values, const at::Tensor& offsets,
                                                const at::Tensor& sizes, const at::Tensor& boxes, int64_t channels,
                                                const at::Tensor& out_offsets, const at::Tensor& out_sizes,
                                                int64_t num_out_values, double scale,
                                                const c10::optional<at::Tensor>& mean,
                                                const c10::optional<at::Tensor>& std, c10::string_view strategy,
                                                int64_t block_elems, bool validate_contents, bool backward) {
  CropResizeRaggedArgs a;
  a.strategy = parse_strategy(strategy);
  a.block_elems = resolve_block_elems(block_elems);
  const int64_t k = boxes.dim() == 2 ? boxes.size(0) : -1;
  check_offsets_tensor(out_offsets, "out_offsets");
  TORCH_CHECK_VALUE(out_offsets.numel() == k + 1,
                    "out_offsets must be [num_boxes + 1] (one output item per box), got shape ",
                    format_shape(out_offsets.sizes()));
  TORCH_CHECK_TYPE(out_sizes.scalar_type() == at::kLong, "out_sizes must be int64, got ", out_sizes.scalar_type());
  TORCH_CHECK_VALUE(out_sizes.dim() == 2 && out_sizes.size(0) == k && out_sizes.size(1) == 3,
                    "out_sizes must be [num_boxes, 3] (C, out_h, out_w of each output), got shape ",
                    format_shape(out_sizes.sizes()));
  for (const auto* t : {&out_offsets, &out_sizes}) {
    TORCH_CHECK_VALUE(t->device() == values.device(), (t == &out_offsets ? "out_offsets" : "out_sizes"),
                      " must be on the values' device (", values.device(), "), got ", t->device());
  }
  TORCH_CHECK_VALUE(num_out_values >= 0, "num_out_values must be non-negative, got ", num_out_values);
  a.source = prepare_crop_resize(values, offsets, sizes, boxes, channels, 1, 1, scale, mean, std, validate_contents);
  if (validate_contents) {
    validate_layout(out_offsets, out_sizes, num_out_values);
    const at::Tensor wrong = (out_sizes.select(1, 0) != channels).nonzero();
    TORCH_CHECK_VALUE(wrong.numel() == 0, "output item ", wrong.numel() ? wrong[0][0].item<int64_t>() : 0,
                      " must have the source's ", channels, " channels");
  }
  a.out_offsets = out_offsets.contiguous();
  a.out_sizes = out_sizes.contiguous();
  a.num_out_values = num_out_values;
  const at::ScalarType vt = values.scalar_type();
  a.out = backward ? at::zeros({values.numel()}, values.options().dtype(param_dtype_for(vt)))
                   : at::empty({num_out_values}, values.options().dtype(out_dtype_for(vt)));
  return a;
}

// Serial: crops may overlap, and the scatter adds without atomics on the CPU.
at::Tensor crop_resize_ragged_backward_cpu(const at::Tensor& grad, const at::Tensor& values, const at::Tensor& offsets,
                                           const at::Tensor& sizes, const at::Tensor& boxes, int64_t channels,
                                           const at::Tensor& out_offsets, const at::Tensor& out_sizes, double scale,
                                           const c10::optional<at::Tensor>& std) {
  const CropResizeRaggedArgs a = prepare_crop_resize_ragged(values, offsets, sizes, boxes, channels, out_offsets, out_sizes,
                                                            grad.numel(), scale, c10::nullopt, std, "search", 0,
                                                            false, true);
  const at::Tensor g = grad.to(a.out.scalar_type()).contiguous();
  const int64_t* off = a.out_offsets.data_ptr<int64_t>();
  with_crop_resize_ragged_op<true>(a, g, [&](const auto& op) {
    for (int64_t k = 0; k < a.out_offsets.numel() - 1; ++k) {
      const auto it = op.item(k);
      for (int64_t e = off[k]; e < off[k + 1]; ++e) op.one(it, e);
    }
  });
  return a.out.to(values.scalar_type());
}

}  // namespace octopus

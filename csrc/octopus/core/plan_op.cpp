// CPU / composite implementations of the layout ops: plans, lookup tables,
// and layout validation (their schemas are in ops/schemas.cpp).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "octopus/core/checks.h"
#include "octopus/core/metadata.h"
#include "octopus/core/plan.h"

namespace octopus {

at::Tensor build_plan_cpu(const at::Tensor& offsets, int64_t num_values, int64_t block_elems) {
  const at::Tensor host_offsets = offsets.contiguous();
  const int64_t m = host_offsets.numel() - 1;
  at::Tensor plan = at::empty({plan_rows(num_values, m, block_elems), 2}, offsets.options());
  build_plan_host(host_offsets.data_ptr<int64_t>(), m, num_values, block_elems, plan.data_ptr<int64_t>());
  return plan;
}

at::Tensor build_plan_on_host(const at::Tensor& offsets, int64_t num_values, int64_t block_elems) {
  return build_plan_cpu(offsets.to(at::kCPU), num_values, block_elems).to(offsets.device());
}

at::Tensor build_lookup_table_cpu(const at::Tensor& offsets, int64_t num_values) {
  const at::Tensor host_offsets = offsets.contiguous();
  at::Tensor table = at::empty({num_values}, offsets.options().dtype(at::kInt));
  fill_lookup_table_host(host_offsets.data_ptr<int64_t>(), host_offsets.numel() - 1, num_values,
                         table.data_ptr<int32_t>());
  return table;
}

at::Tensor build_lookup_table(const at::Tensor& offsets, int64_t num_values) {
  // Through the dispatcher: the CUDA builder lives in the CUDA library (core/plan.cu).
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("octopus::lookup_table", "")
                             .typed<at::Tensor(const at::Tensor&, int64_t)>();
  return op.call(offsets, num_values);
}

void check_plan_args(const at::Tensor& offsets, int64_t num_values, int64_t block_elems) {
  check_offsets_tensor(offsets);
  TORCH_CHECK_VALUE(num_values >= 0, "num_values must be non-negative, got ", num_values);
  resolve_block_elems(block_elems);
  TORCH_CHECK_VALUE(block_elems != 0, "block_elems must be given explicitly to octopus.plan");
}

at::Tensor plan_cpu_op(const at::Tensor& offsets, int64_t num_values, int64_t block_elems) {
  check_plan_args(offsets, num_values, block_elems);
  validate_layout(offsets, at::Tensor(), num_values);
  return build_plan_cpu(offsets, num_values, block_elems);
}

at::Tensor lookup_table_cpu_op(const at::Tensor& offsets, int64_t num_values) {
  check_plan_args(offsets, num_values, kDefaultBlockElems);
  return build_lookup_table_cpu(offsets, num_values);
}

void validate_layout_op(const at::Tensor& offsets, const c10::optional<at::Tensor>& sizes, int64_t num_values) {
  check_plan_args(offsets, num_values, kDefaultBlockElems);
  if (sizes.has_value()) {
    TORCH_CHECK_VALUE(sizes->device() == offsets.device(), "sizes must be on the offsets' device (",
                      offsets.device(), "), got ", sizes->device());
  }
  validate_layout(offsets, sizes.value_or(at::Tensor()), num_values);
}

}  // namespace octopus

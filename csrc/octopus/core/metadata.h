// Builders of the per-strategy metadata tensors (plans and lookup tables).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "octopus/core/checks.h"

namespace octopus {

// offsets as check_offsets_tensor, num_values >= 0, block_elems valid and explicit.
void check_plan_args(const at::Tensor& offsets, int64_t num_values, int64_t block_elems);

// Plan of a batch (format in plan.h). CPU: host loop. CUDA: scan + fill kernels on the
// current stream; no synchronization, no host copy.
at::Tensor build_plan_cpu(const at::Tensor& offsets, int64_t num_values, int64_t block_elems);
at::Tensor build_plan_cuda(const at::Tensor& offsets, int64_t num_values, int64_t block_elems);

// The seed's approach C: copy offsets to the host, build there, copy the plan back.
at::Tensor build_plan_on_host(const at::Tensor& offsets, int64_t num_values, int64_t block_elems);

// The seed's approach A: int32 item id of every element (fill_lookup_table_host in plan.h
// says what it holds for offsets that were not validated). build_lookup_table runs the
// octopus::lookup_table op on the offsets' device; the others are its CPU and CUDA kernels.
at::Tensor build_lookup_table(const at::Tensor& offsets, int64_t num_values);
at::Tensor build_lookup_table_cpu(const at::Tensor& offsets, int64_t num_values);
at::Tensor build_lookup_table_cuda(const at::Tensor& offsets, int64_t num_values);

// The metadata `strategy` consumes for this batch: `given` (checked) or a fresh build,
// using `build_plan` for Strategy::Plan.
template <class BuildPlan>
at::Tensor metadata_for(Strategy strategy, const c10::optional<at::Tensor>& given, const at::Tensor& offsets,
                        int64_t num_values, int64_t block_elems, BuildPlan&& build_plan) {
  check_metadata(given, strategy, offsets, num_values, block_elems);
  if (given.has_value()) return *given;
  switch (strategy) {
    case Strategy::Plan: return build_plan(offsets, num_values, block_elems);
    case Strategy::PlanHost: return build_plan_on_host(offsets, num_values, block_elems);
    case Strategy::Lookup: return build_lookup_table(offsets, num_values);
    default: return at::Tensor();
  }
}

// The plan, lookup_table and validate_layout ops' kernels (plan_op.cpp), registered in schemas.cpp.
at::Tensor plan_cpu_op(const at::Tensor& offsets, int64_t num_values, int64_t block_elems);
at::Tensor lookup_table_cpu_op(const at::Tensor& offsets, int64_t num_values);
void validate_layout_op(const at::Tensor& offsets, const c10::optional<at::Tensor>& sizes, int64_t num_values);

}  // namespace octopus

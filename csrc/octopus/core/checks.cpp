#include "octopus/core/checks.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "octopus/core/plan.h"

namespace octopus {

Strategy parse_strategy(c10::string_view name) {
  std::string names;
  for (const StrategyInfo& s : kStrategies) {
    if (name == s.name) return s.strategy;
    names += (names.empty() ? "'" : ", '") + std::string(s.name) + "'";
  }
  TORCH_CHECK_VALUE(false, "strategy must be one of ", names, "; got '", std::string(name), "'");
}

const char* strategy_name(Strategy strategy) {
  for (const StrategyInfo& s : kStrategies) {
    if (s.strategy == strategy) return s.name;
  }
  return "?";
}

int64_t resolve_block_elems(int64_t block_elems) {
  if (block_elems == 0) return kDefaultBlockElems;
  TORCH_CHECK_VALUE(block_elems > 0 && block_elems % kBlockElemsMultiple == 0 && block_elems <= kMaxBlockElems,
                    "block_elems must be a positive multiple of 16 and at most 2^30 (or 0 for the default), got ",
                    block_elems);
  return block_elems;
}

std::string format_shape(c10::IntArrayRef shape) {
  return format_shape(shape.data(), static_cast<int64_t>(shape.size()));
}

std::string format_item_shape(const at::Tensor& sizes, int64_t item) {
  const at::Tensor row = sizes[item].to(at::kCPU).contiguous();
  return format_shape(row.data_ptr<int64_t>(), row.numel());
}

void check_offsets_tensor(const at::Tensor& offsets, const char* name) {
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kLong, name, " must be int64, got ", offsets.scalar_type());
  TORCH_CHECK_VALUE(offsets.dim() == 1, name, " must be 1-D [num_items + 1], got shape ",
                    format_shape(offsets.sizes()));
  TORCH_CHECK_VALUE(offsets.numel() >= 1, name, " needs at least one entry: num_items + 1 of them, starting with 0 "
                    "(an empty batch has ", name, " [0]); got an empty tensor");
  TORCH_CHECK_VALUE(offsets.numel() - 1 <= kMaxItems, name, " describes ", offsets.numel() - 1,
                    " items; at most 2^31 - 1 are supported");
}

void check_values_and_offsets(const at::Tensor& values, const at::Tensor& offsets) {
  TORCH_CHECK_VALUE(values.dim() == 1, "values must be 1-D (the items' elements back to back), got shape ",
                    format_shape(values.sizes()));
  check_offsets_tensor(offsets);
  TORCH_CHECK_VALUE(offsets.device() == values.device(), "offsets must be on the same device as values (",
                    values.device(), "), got ", offsets.device());
}

void validate_layout(const at::Tensor& offsets, const at::Tensor& sizes, int64_t num_values, int64_t channels,
                     const char* channels_name) {
  const at::Tensor host_offsets = offsets.to(at::kCPU).contiguous();
  const int64_t m = host_offsets.numel() - 1;
  std::string error = check_offsets(host_offsets.data_ptr<int64_t>(), m, num_values);
  TORCH_CHECK_VALUE(error.empty(), error);
  if (channels > 0) {
    error = check_channel_planes(host_offsets.data_ptr<int64_t>(), m, channels, channels_name);
    TORCH_CHECK_VALUE(error.empty(), error);
  }
  if (!sizes.defined()) return;
  TORCH_CHECK_TYPE(sizes.scalar_type() == at::kLong, "sizes must be int64, got ", sizes.scalar_type());
  TORCH_CHECK_VALUE(sizes.dim() == 2 && sizes.size(0) == m, "sizes must have shape [num_items, D] = (", m,
                    ", D), got ", format_shape(sizes.sizes()));
  const at::Tensor host_sizes = sizes.to(at::kCPU).contiguous();
  error = check_sizes(host_sizes.data_ptr<int64_t>(), m, sizes.size(1), host_offsets.data_ptr<int64_t>());
  TORCH_CHECK_VALUE(error.empty(), error);
}

int64_t check_item_params(const at::Tensor& param, const char* name, int64_t num_items, at::ScalarType dtype,
                          const at::Device& device) {
  TORCH_CHECK_TYPE(param.scalar_type() == dtype, name, " must be ", dtype, " for these values, got ",
                   param.scalar_type());
  TORCH_CHECK_VALUE(param.device() == device, name, " must be on the values' device (", device, "), got ",
                    param.device());
  TORCH_CHECK_VALUE((param.dim() == 1 || param.dim() == 2) && param.size(0) == num_items, name,
                    " must have shape [num_items] or [num_items, channels] with num_items = ", num_items, ", got ",
                    format_shape(param.sizes()));
  TORCH_CHECK_VALUE(param.dim() == 1 || param.size(1) >= 1, name, " has zero channels");
  return param.dim() == 2 ? param.size(1) : 0;
}

namespace {

// A plan or lookup table on the CPU, row by row against the offsets: there a wrong one would
// put elements in an item that does not hold them (functors such as the stencils then index
// from the wrong item's start), and a full check costs no more than the op.
void check_metadata_contents_cpu(const at::Tensor& meta, Strategy strategy, const at::Tensor& offsets_in,
                                 int64_t num_values) {
  const at::Tensor offsets = offsets_in.contiguous();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t m = offsets.numel() - 1;
  const auto holds = [&](int64_t item, int64_t begin, int64_t end) {
    return item >= 0 && item < m && off[item] <= begin && end <= off[item + 1];
  };
  const auto extent = [&](int64_t item) {
    return item >= 0 && item < m ? "holds [" + std::to_string(off[item]) + ", " + std::to_string(off[item + 1]) + ")"
                                 : "is not one of the batch's " + std::to_string(m) + " items";
  };
  if (strategy == Strategy::Lookup) {
    const int32_t* ids = meta.data_ptr<int32_t>();
    for (int64_t g = 0; g < num_values; ++g) {
      TORCH_CHECK_VALUE(holds(ids[g], g, g + 1), "metadata: the lookup table puts element ", g, " in item ", ids[g],
                        ", which ", extent(ids[g]), " (pass metadata=None, or the table octopus built)");
    }
    return;
  }
  const int64_t* plan = meta.data_ptr<int64_t>();
  const int64_t count = plan[0];
  TORCH_CHECK_VALUE(count >= 0 && count < meta.size(0), "metadata: the plan's row 0 says ", count,
                    " blocks, and it has room for ", meta.size(0) - 1);
  for (int64_t j = 0; j < count; ++j) {
    const int64_t begin = plan[2 * (j + 1)], packed = plan[2 * (j + 1) + 1];
    const int64_t item = block_item(packed), end = begin + block_length(packed);
    if (block_is_run(packed)) {
      // A run's elements go to the last item that starts at or before them: from the run's
      // first item on, through at most kRunItems items.
      const int64_t last = item >= 0 && item < m ? std::min(item + kRunItems, m) - 1 : -1;
      const auto run_extent = [&] {
        return last >= 0 ? "hold [" + std::to_string(off[item]) + ", " + std::to_string(off[last + 1]) + ")"
                         : extent(item);
      };
      TORCH_CHECK_VALUE(last >= 0 && off[item] <= begin && begin <= end && end <= off[last + 1], "metadata: plan block ",
                        j, " puts elements [", begin, ", ", end, ") in the run of items from ", item, " to ", last,
                        ", which ", run_extent(), " (pass metadata=None, or a plan octopus built)");
      continue;
    }
    TORCH_CHECK_VALUE(holds(item, begin, end), "metadata: plan block ", j, " puts elements [", begin, ", ", end,
                      ") in item ", item, ", which ", extent(item), " (pass metadata=None, or a plan octopus built)");
  }
}

}  // namespace

void check_metadata(const c10::optional<at::Tensor>& metadata, Strategy strategy, const at::Tensor& offsets,
                    int64_t num_values, int64_t block_elems) {
  if (!metadata.has_value()) return;
  const at::Tensor& meta = *metadata;
  const int64_t m = offsets.numel() - 1;
  TORCH_CHECK_VALUE(meta.device() == offsets.device(), "metadata must be on the values' device (",
                    offsets.device(), "), got ", meta.device());
  switch (strategy) {
    case Strategy::Plan:
    case Strategy::PlanHost:
      TORCH_CHECK_VALUE(meta.scalar_type() == at::kLong && meta.dim() == 2 && meta.size(1) == 2 &&
                            meta.size(0) == plan_rows(num_values, m, block_elems) && meta.is_contiguous(),
                        "metadata for strategy '", strategy_name(strategy),
                        "' must be the plan of this batch built with block_elems=", block_elems,
                        " (int64 of shape (", plan_rows(num_values, m, block_elems), ", 2), from octopus.plan); got ",
                        meta.scalar_type(), " of shape ", format_shape(meta.sizes()));
      // Kernels read plan rows as 16-byte vectors: a view into another tensor may be misaligned.
      TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(meta.data_ptr()) % 16 == 0, "metadata for strategy '",
                        strategy_name(strategy), "' must start on a 16-byte boundary (a tensor of its own, e.g. ",
                        "metadata.clone())");
      if (meta.is_cpu()) check_metadata_contents_cpu(meta, strategy, offsets, num_values);
      return;
    case Strategy::Lookup:
      TORCH_CHECK_VALUE(meta.scalar_type() == at::kInt && meta.dim() == 1 && meta.numel() == num_values &&
                            meta.is_contiguous(),
                        "metadata for strategy 'lookup' must be this batch's item table (int32 of shape (", num_values,
                        ",), from octopus.lookup_table); got ", meta.scalar_type(), " of shape ",
                        format_shape(meta.sizes()));
      if (meta.is_cpu()) check_metadata_contents_cpu(meta, strategy, offsets, num_values);
      return;
    case Strategy::Search:
    case Strategy::BlockSearch:
      TORCH_CHECK_VALUE(false, "strategy '", strategy_name(strategy), "' uses no metadata; pass metadata=None");
  }
}

at::Tensor kernel_ready(const at::Tensor& values) {
  at::Tensor out = values.contiguous();
  if (reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 != 0) out = out.clone();
  return out;
}

}  // namespace octopus

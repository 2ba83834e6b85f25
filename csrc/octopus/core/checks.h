// Argument checks shared by every op, and the strategy switch. Errors raise Python
// ValueError / TypeError that name the offending argument.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <string>

#include "octopus/core/layout.h"

namespace octopus {

// How a GPU thread finds the item its elements belong to (docs/architecture.rst, "Locators").
enum class Strategy { Lookup, Search, Plan, PlanHost, BlockSearch };

// Every strategy: its name, and the metadata it reads ("plan", "lookup" or "" for none).
// The one list: parse_strategy, strategy_name and the Python package (octopus.strategies,
// through _C.strategies) read it.
struct StrategyInfo {
  Strategy strategy;
  const char* name;
  const char* metadata;
};
inline constexpr StrategyInfo kStrategies[] = {
    {Strategy::Plan, "plan", "plan"},           {Strategy::PlanHost, "plan_host", "plan"},
    {Strategy::BlockSearch, "block_search", ""}, {Strategy::Search, "search", ""},
    {Strategy::Lookup, "lookup", "lookup"},
};

Strategy parse_strategy(c10::string_view name);
const char* strategy_name(Strategy strategy);

// Elements per plan block or tile: 0 selects the default; otherwise a positive multiple of
// kBlockElemsMultiple up to kMaxBlockElems (plan.h).
constexpr int64_t kBlockElemsMultiple = 16;
int64_t resolve_block_elems(int64_t block_elems);

// Shapes in error messages, one form everywhere: Python's tuple on one line, "(3, 480, 640)"
// (core/layout.h's format_shape). A tensor's shape is format_shape(t.sizes()).
std::string format_shape(c10::IntArrayRef shape);
// Row `item` of an int64 [M, D] sizes tensor on any device (one small copy to the host).
std::string format_item_shape(const at::Tensor& sizes, int64_t item);

// An offsets tensor: int64, 1-D, at least one entry (offsets[0] == 0 for an empty batch),
// fewer than 2^31 items. `name` is the argument's name in messages.
void check_offsets_tensor(const at::Tensor& offsets, const char* name = "offsets");

// values: 1-D; offsets: as check_offsets_tensor, on values' device.
void check_values_and_offsets(const at::Tensor& values, const at::Tensor& offsets);

// Full check of offsets' contents against n values, of sizes when defined, and, when
// `channels` > 0, that every item's length divides into that many planes (the per-channel
// parameters named `channels_name`). One copy of the offsets to the host, so on CUDA it
// synchronizes once.
void validate_layout(const at::Tensor& offsets, const at::Tensor& sizes, int64_t num_values, int64_t channels = 0,
                     const char* channels_name = "scale");

// Per-item parameters: [M] or [M, C], `dtype`, on `device`. Returns C (0 for [M]).
int64_t check_item_params(const at::Tensor& param, const char* name, int64_t num_items, at::ScalarType dtype,
                          const at::Device& device);

// The metadata tensor a strategy consumes (a plan, or a lookup table), checked against
// the batch it is used with. Strategies that need none reject one.
void check_metadata(const c10::optional<at::Tensor>& metadata, Strategy strategy, const at::Tensor& offsets,
                    int64_t num_values, int64_t block_elems);

// The data of a tensor that may be left out (undefined): null then.
template <typename T>
T* optional_data(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// Values as the kernels read them: contiguous, and 16-byte aligned for vector loads.
at::Tensor kernel_ready(const at::Tensor& values);

}  // namespace octopus

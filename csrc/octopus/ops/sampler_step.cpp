// octopus::sampler_step — schema, argument handling, and the CPU kernel.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "octopus/core/driver_cpu.h"
#include "octopus/core/metadata.h"
#include "octopus/ops/sampler_step_args.h"

namespace octopus {
namespace {

void check_latent(const at::Tensor& t, const char* name, const at::Tensor& sample) {
  TORCH_CHECK_TYPE(t.scalar_type() == sample.scalar_type(), name, " must have the sample's dtype (",
                   sample.scalar_type(), "), got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == sample.device(), name, " must be on the sample's device (", sample.device(),
                    "), got ", t.device());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.numel() == sample.numel(), name, " must be 1-D with ", sample.numel(),
                    " elements like sample, got shape ", t.sizes());
}

void check_table(const at::Tensor& t, const char* name, c10::ScalarType dtype, const at::Tensor& sample) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == sample.device(), name, " must be on the sample's device (", sample.device(),
                    "), got ", t.device());
}

}  // namespace

SamplerStepArgs prepare_sampler_step(const at::Tensor& model_output, const at::Tensor& sample,
                                     const at::Tensor& offsets, const at::Tensor& timesteps,
                                     const at::Tensor& schedule, const at::Tensor& table, const at::Tensor& row_info,
                                     int64_t kind, int64_t prediction, double final_alpha_cumprod, double eta,
                                     double clip_range, bool use_clipped_model_output,
                                     const c10::optional<at::Tensor>& noise, const c10::optional<at::Tensor>& history,
                                     const c10::optional<at::Tensor>& history2,
                                     const c10::optional<at::Tensor>& last_sample, bool return_x0,
                                     c10::string_view strategy) {
  SamplerStepArgs a;
  a.strategy = parse_strategy(strategy);
  a.block_elems = resolve_block_elems(0);
  TORCH_CHECK_VALUE(kind >= 0 && kind <= 4,
                    "kind must be 0 (DDIM), 1 (Euler), 2 (flow Euler), 3 (DPM-Solver++ 2M) or 4 (UniPC), got ", kind);
  TORCH_CHECK_VALUE(prediction >= 0 && prediction <= 3,
                    "prediction must be 0 (epsilon), 1 (v_prediction), 2 (sample) or 3 (flow), got ", prediction);
  TORCH_CHECK_VALUE(eta >= 0.0, "eta must be non-negative, got ", eta);
  TORCH_CHECK_VALUE(clip_range >= 0.0, "clip_range must be non-negative (0: no clipping), got ", clip_range);
  check_values_and_offsets(sample, offsets);
  check_latent(model_output, "model_output", sample);
  const int64_t m = offsets.numel() - 1;
  check_table(timesteps, "timesteps", c10::kDouble, sample);
  TORCH_CHECK_VALUE(timesteps.dim() == 1 && timesteps.numel() == m, "timesteps must be 1-D with one entry per sample (",
                    m, "), got shape ", timesteps.sizes());
  check_table(schedule, "schedule", c10::kDouble, sample);
  check_table(table, "table", c10::kDouble, sample);
  check_table(row_info, "row_info", c10::kLong, sample);
  TORCH_CHECK_VALUE(schedule.dim() == 2 && schedule.size(1) >= 1 && (schedule.size(0) == 1 || schedule.size(0) == m),
                    "schedule must be [1 or num_samples, steps], got shape ", schedule.sizes());
  const int64_t rows = schedule.size(0), steps = schedule.size(1);
  TORCH_CHECK_VALUE(row_info.dim() == 2 && row_info.size(0) == rows && row_info.size(1) == RowInfo::kColumns,
                    "row_info must be [", rows, ", ", RowInfo::kColumns, "], got shape ", row_info.sizes());
  if (kind == static_cast<int64_t>(SamplerKind::DDIM)) {
    TORCH_CHECK_VALUE(table.dim() == 1 && table.numel() >= 1, "table (alphas_cumprod) must be 1-D, got shape ",
                      table.sizes());
  } else {
    TORCH_CHECK_VALUE(table.dim() == 2 && table.size(0) == rows && table.size(1) == steps + 1,
                      "table (sigmas) must be [", rows, ", ", steps + 1, "], got shape ", table.sizes());
  }
  a.noise = noise.has_value() ? *noise : at::Tensor();
  if (a.noise.defined()) check_latent(a.noise, "noise", sample);
  auto state = [&](const c10::optional<at::Tensor>& t, const char* name) {
    if (!t.has_value()) return at::Tensor();
    check_latent(*t, name, sample);
    TORCH_CHECK_VALUE(t->is_contiguous() && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, name,
                      " must be contiguous and 16-byte aligned (it is updated in place)");
    return *t;
  };
  a.history = state(history, "history");
  a.history2 = state(history2, "history2");
  a.last_sample = state(last_sample, "last_sample");
  TORCH_CHECK_VALUE(kind != static_cast<int64_t>(SamplerKind::DPMSolverPP2M) || a.history.defined(),
                    "DPM-Solver++ 2M needs a history buffer");
  TORCH_CHECK_VALUE(kind != static_cast<int64_t>(SamplerKind::UniPC) ||
                        (a.history.defined() && a.history2.defined() && a.last_sample.defined()),
                    "UniPC needs history, history2 and last_sample buffers");
  a.sample = kernel_ready(sample);
  a.model_output = kernel_ready(model_output);
  if (a.noise.defined()) a.noise = kernel_ready(a.noise);
  a.offsets = offsets.contiguous();
  a.timesteps = timesteps.contiguous();
  a.schedule = schedule.contiguous();
  a.table = table.contiguous();
  a.row_info = row_info.contiguous();
  a.prev = at::empty_like(a.sample);
  a.x0 = at::empty({return_x0 ? sample.numel() : 0}, sample.options());
  a.params = SamplerParams{static_cast<SamplerKind>(kind), static_cast<Prediction>(prediction),
                           a.timesteps.data_ptr<double>(), a.schedule.data_ptr<double>(), a.table.data_ptr<double>(),
                           a.row_info.data_ptr<int64_t>(), rows, steps, a.table.numel(), final_alpha_cumprod, eta,
                           clip_range, use_clipped_model_output};
  return a;
}

namespace {

std::tuple<at::Tensor, at::Tensor> sampler_step_cpu(
    const at::Tensor& model_output, const at::Tensor& sample, const at::Tensor& offsets, const at::Tensor& timesteps,
    const at::Tensor& schedule, const at::Tensor& table, const at::Tensor& row_info, int64_t kind, int64_t prediction,
    double final_alpha_cumprod, double eta, double clip_range, bool use_clipped_model_output,
    const c10::optional<at::Tensor>& noise, const c10::optional<at::Tensor>& history,
    const c10::optional<at::Tensor>& history2, const c10::optional<at::Tensor>& last_sample, bool return_x0,
    c10::string_view strategy, const c10::optional<at::Tensor>& metadata) {
  SamplerStepArgs a = prepare_sampler_step(model_output, sample, offsets, timesteps, schedule, table, row_info, kind,
                                           prediction, final_alpha_cumprod, eta, clip_range, use_clipped_model_output,
                                           noise, history, history2, last_sample, return_x0, strategy);
  validate_layout(a.offsets, at::Tensor(), a.sample.numel());
  const at::Tensor meta = metadata_for(a.strategy, metadata, a.offsets, a.sample.numel(), a.block_elems,
                                       build_plan_cpu);
  with_sampler_step_op(a, [&](const auto& op) {
    run_ragged_cpu(op, a.strategy, a.offsets, a.sample.numel(), a.block_elems, meta);
  });
  return {a.prev, a.x0};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(octopus, m) {
  m.def(
      "sampler_step(Tensor model_output, Tensor sample, Tensor offsets, Tensor timesteps, Tensor schedule, "
      "Tensor table, Tensor row_info, int kind, int prediction, float final_alpha_cumprod=1.0, float eta=0.0, "
      "float clip_range=0.0, bool use_clipped_model_output=False, Tensor? noise=None, Tensor(a!)? history=None, "
      "Tensor(b!)? history2=None, Tensor(c!)? last_sample=None, bool return_x0=False, str strategy=\"block_search\", Tensor? metadata=None) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(octopus, CPU, m) { m.impl("sampler_step", &sampler_step_cpu); }

}  // namespace octopus

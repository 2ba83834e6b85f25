// octopus::sampler_step — argument checks and the CPU backend (the schema is in schemas.cpp).
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

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

bool is_sigma_kind(int64_t kind) { return !has_alphas_table(static_cast<SamplerKind>(kind)); }

// Every row's contents, read on the host (CPU tables only). Rows no sample reads (free
// slots of a caller's tables) must be well formed; the state a sampler needs is checked for
// the rows in use.
void check_row_contents(const SamplerStepArgs& a) {
  const int64_t rows = a.row_info.size(0), width = a.schedules.size(1), table_width = a.tables.size(1);
  const int64_t samples = a.timesteps.numel();
  const int64_t state_rows = a.state.defined() ? a.state.size(0) : 0;
  std::vector<bool> used(rows, !a.sample_rows.defined() && samples > 0);
  if (a.sample_rows.defined()) {
    const int64_t* sample_rows = a.sample_rows.data_ptr<int64_t>();
    for (int64_t i = 0; i < samples; ++i) {
      TORCH_CHECK_VALUE(sample_rows[i] >= 0 && sample_rows[i] < rows, "sample_rows[", i, "] = ", sample_rows[i],
                        " is not a row of the tables (", rows, " rows)");
      used[sample_rows[i]] = true;
    }
  }
  const int64_t* info = a.row_info.data_ptr<int64_t>();
  const double* scalars = a.row_scalars.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r, info += RowInfo::kColumns, scalars += RowScalars::kColumns) {
    const int64_t kind = info[RowInfo::kKind], prediction = info[RowInfo::kPrediction];
    const int64_t length = info[RowInfo::kLength], table_length = info[RowInfo::kTableLength];
    TORCH_CHECK_VALUE(kind >= 0 && kind < kSamplerKinds, "row_info[", r, "]: kind ", kind, " is not a sampler kind");
    const char* name = kSamplerKindNames[kind];
    TORCH_CHECK_VALUE(prediction >= 0 && prediction < kPredictions, "row_info[", r, "]: prediction ", prediction,
                      " is not a prediction type");
    TORCH_CHECK_VALUE((kind == static_cast<int64_t>(SamplerKind::FlowEuler)) ==
                          (prediction == static_cast<int64_t>(Prediction::Flow)),
                      "row_info[", r, "]: a ", name, " row cannot have prediction '", kPredictionNames[prediction],
                      "' (flow_euler rows, and only they, predict 'flow')");
    TORCH_CHECK_VALUE(length >= 1 && length <= width, "row_info[", r, "]: length ", length,
                      " must be in [1, schedules.size(1) = ", width, "]");
    const int64_t min_table = is_sigma_kind(kind) ? length + 1 : 1;
    TORCH_CHECK_VALUE(table_length >= min_table && table_length <= table_width, "row_info[", r, "]: table_length ",
                      table_length, " must be in [", min_table, ", tables.size(1) = ", table_width, "] for a ", name,
                      " row of ", length, " steps");
    TORCH_CHECK_VALUE(info[RowInfo::kStepRatio] >= 0, "row_info[", r, "]: step_ratio must be non-negative, got ",
                      info[RowInfo::kStepRatio]);
    TORCH_CHECK_VALUE(scalars[RowScalars::kEta] >= 0.0, "row_scalars[", r, "]: eta must be non-negative, got ",
                      scalars[RowScalars::kEta]);
    TORCH_CHECK_VALUE(scalars[RowScalars::kClipRange] >= 0.0, "row_scalars[", r,
                      "]: clip_range must be non-negative (0: no clipping), got ", scalars[RowScalars::kClipRange]);
    if (!used[r]) continue;
    TORCH_CHECK_VALUE((kind != static_cast<int64_t>(SamplerKind::DPMSolverPP2M) &&
                       kind != static_cast<int64_t>(SamplerKind::DPMSolverPP2MSDE)) || state_rows >= 1,
                      "row ", r, " is ", name, ", which needs a state of at least 1 row (its last x0)");
    TORCH_CHECK_VALUE((kind != static_cast<int64_t>(SamplerKind::UniPC) &&
                       kind != static_cast<int64_t>(SamplerKind::UniPC3)) || state_rows == 3, "row ", r, " is ", name,
                      ", which needs a state of 3 rows (its last two x0 and its last corrected sample)");
    TORCH_CHECK_VALUE(kind != static_cast<int64_t>(SamplerKind::DPMSolverPP3M) || state_rows == 3, "row ", r,
                      " is dpm_solver_pp_3m, which needs a state of 3 rows (its last two x0, and a third it writes)");
    const bool noisy = kind == static_cast<int64_t>(SamplerKind::EulerAncestral) ||
                       kind == static_cast<int64_t>(SamplerKind::DPMSolverPP2MSDE) ||
                       kind == static_cast<int64_t>(SamplerKind::DDPM) ||
                       (kind == static_cast<int64_t>(SamplerKind::DDIM) && scalars[RowScalars::kEta] > 0.0);
    TORCH_CHECK_VALUE(!noisy || a.noise.defined(), "row ", r, " is ", name,
                      scalars[RowScalars::kEta] > 0.0 ? " with eta > 0" : "",
                      ", which adds noise at its steps: pass noise (the step's standard normal draws)");
  }
}

}  // namespace

void check_sampler_latents(SamplerStepArgs& a, const at::Tensor& model_output, const at::Tensor& sample,
                           const at::Tensor& offsets, const c10::optional<at::Tensor>& noise,
                           const c10::optional<at::Tensor>& state) {
  check_values_and_offsets(sample, offsets);
  const auto dtype = sample.scalar_type();
  TORCH_CHECK_TYPE(dtype == c10::kFloat || dtype == c10::kDouble || dtype == c10::kHalf || dtype == c10::kBFloat16,
                   "sample must be float32, float64, float16 or bfloat16, got ", dtype);
  check_latent(model_output, "model_output", sample);
  a.sample = kernel_ready(sample);
  a.model_output = kernel_ready(model_output);
  a.offsets = offsets.contiguous();
  if (noise.has_value()) {
    check_latent(*noise, "noise", sample);
    a.noise = kernel_ready(*noise);
  }
  if (state.has_value()) {
    const at::Tensor& s = *state;
    TORCH_CHECK_TYPE(s.scalar_type() == dtype, "state must have the sample's dtype (", dtype, "), got ",
                     s.scalar_type());
    TORCH_CHECK_VALUE(s.device() == sample.device(), "state must be on the sample's device (", sample.device(),
                      "), got ", s.device());
    TORCH_CHECK_VALUE(s.dim() == 2 && (s.size(0) == 1 || s.size(0) == 3) && s.size(1) == sample.numel(),
                      "state must be [1 or 3, ", sample.numel(), "] (a row per multistep latent), got shape ",
                      s.sizes());
    const int64_t row_bytes = s.stride(0) * static_cast<int64_t>(s.element_size());
    TORCH_CHECK_VALUE((s.size(1) <= 1 || s.stride(1) == 1) && (s.size(0) == 1 || row_bytes % 16 == 0) &&
                          reinterpret_cast<uintptr_t>(s.data_ptr()) % 16 == 0,
                      "state is updated in place: its rows must be contiguous and 16-byte aligned (got strides ",
                      s.strides(), ")");
    a.state = s;
  }
}

void check_sampler_rows(SamplerStepArgs& a, const at::Tensor& timesteps, const at::Tensor& schedules,
                        const at::Tensor& tables, const at::Tensor& row_info, const at::Tensor& row_scalars,
                        const c10::optional<at::Tensor>& sample_rows) {
  const at::Tensor& sample = a.sample;
  const int64_t m = a.offsets.numel() - 1;
  check_table(timesteps, "timesteps", c10::kDouble, sample);
  TORCH_CHECK_VALUE(timesteps.dim() == 1 && timesteps.numel() == m, "timesteps must be 1-D with one entry per sample (",
                    m, "), got shape ", timesteps.sizes());
  check_table(schedules, "schedules", c10::kDouble, sample);
  check_table(tables, "tables", c10::kDouble, sample);
  check_table(row_info, "row_info", c10::kLong, sample);
  check_table(row_scalars, "row_scalars", c10::kDouble, sample);
  TORCH_CHECK_VALUE(schedules.dim() == 2 && schedules.size(0) >= 1 && schedules.size(1) >= 1,
                    "schedules must be [rows, steps] with at least one of each, got shape ", schedules.sizes());
  const int64_t rows = schedules.size(0);
  TORCH_CHECK_VALUE(tables.dim() == 2 && tables.size(0) == rows && tables.size(1) >= 2, "tables must be [", rows,
                    ", at least 2] (a row per schedule), got shape ", tables.sizes());
  TORCH_CHECK_VALUE(row_info.dim() == 2 && row_info.size(0) == rows && row_info.size(1) == RowInfo::kColumns,
                    "row_info must be [", rows, ", ", int{RowInfo::kColumns}, "], got shape ", row_info.sizes());
  TORCH_CHECK_VALUE(row_scalars.dim() == 2 && row_scalars.size(0) == rows &&
                        row_scalars.size(1) == RowScalars::kColumns,
                    "row_scalars must be [", rows, ", ", int{RowScalars::kColumns}, "], got shape ",
                    row_scalars.sizes());
  if (sample_rows.has_value()) {
    check_table(*sample_rows, "sample_rows", c10::kLong, sample);
    TORCH_CHECK_VALUE(sample_rows->dim() == 1 && sample_rows->numel() == m,
                      "sample_rows must be 1-D with one entry per sample (", m, "), got shape ",
                      sample_rows->sizes());
    a.sample_rows = sample_rows->contiguous();
  } else {
    TORCH_CHECK_VALUE(rows == 1 || rows == m, "without sample_rows the tables must have 1 row or one per sample (",
                      m, "), got ", rows);
  }
  a.timesteps = timesteps.contiguous();
  a.schedules = schedules.contiguous();
  a.tables = tables.contiguous();
  a.row_info = row_info.contiguous();
  a.row_scalars = row_scalars.contiguous();
  if (sample.device().is_cpu()) check_row_contents(a);
}

void finish_sampler_args(SamplerStepArgs& a, bool return_x0) {
  a.prev = at::empty_like(a.sample);
  a.x0 = at::empty({return_x0 ? a.sample.numel() : 0}, a.sample.options());
  a.params = SamplerParams{a.timesteps.data_ptr<double>(),
                           optional_data<int64_t>(a.sample_rows),
                           a.schedules.data_ptr<double>(),
                           a.tables.data_ptr<double>(),
                           a.row_info.data_ptr<int64_t>(),
                           a.row_scalars.data_ptr<double>(),
                           a.schedules.size(0),
                           a.schedules.size(1),
                           a.tables.size(1)};
}

void CpuSamplerBackend::run(SamplerStepArgs& a, const c10::optional<at::Tensor>& metadata) {
  validate_layout(a.offsets, at::Tensor(), a.sample.numel());
  const at::Tensor meta =
      metadata_for(a.strategy, metadata, a.offsets, a.sample.numel(), a.block_elems, build_plan_cpu);
  with_sampler_step_op(a, [&](const auto& op) {
    run_ragged_cpu(op, a.strategy, a.offsets, a.sample.numel(), a.block_elems, meta);
  });
}

}  // namespace octopus

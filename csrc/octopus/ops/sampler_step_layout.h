// The vocabulary octopus::sampler_step shares with Python: sampler kinds, prediction types
// and the columns of the per-row tables. This is their one definition: bindings.cpp exports
// the names (octopus._C.sampler_step_layout) and Python derives every code from them.
#pragma once

#include <cstdint>

namespace octopus {

// The stochastic kinds (euler_ancestral, dpm_solver_pp_2m_sde, ddpm; ddim with eta > 0) read
// the step's noise; the others never do. New kinds go at the end: the codes are stable.
enum class SamplerKind : int64_t {
  DDIM, Euler, FlowEuler, DPMSolverPP2M, UniPC, EulerAncestral, DPMSolverPP2MSDE, DDPM, DPMSolverPP3M, UniPC3
};
inline constexpr const char* kSamplerKindNames[] = {"ddim",           "euler",           "flow_euler",
                                                    "dpm_solver_pp_2m", "unipc",         "euler_ancestral",
                                                    "dpm_solver_pp_2m_sde", "ddpm",      "dpm_solver_pp_3m",
                                                    "unipc_3"};
inline constexpr int64_t kSamplerKinds = sizeof(kSamplerKindNames) / sizeof(kSamplerKindNames[0]);
static_assert(kSamplerKinds == static_cast<int64_t>(SamplerKind::UniPC3) + 1, "a name per sampler kind");

// Kinds whose table is alphas_cumprod indexed by timestep (the others: one sigma per step and the final one).
inline constexpr bool has_alphas_table(SamplerKind kind) { return kind == SamplerKind::DDIM || kind == SamplerKind::DDPM; }

// What the model predicts: noise, v, the clean sample, or a flow-matching velocity (the
// one prediction of flow_euler, and only of it).
enum class Prediction : int64_t { Epsilon, VPrediction, Sample, Flow };
inline constexpr const char* kPredictionNames[] = {"epsilon", "v_prediction", "sample", "flow"};
inline constexpr int64_t kPredictions = sizeof(kPredictionNames) / sizeof(kPredictionNames[0]);
static_assert(kPredictions == static_cast<int64_t>(Prediction::Flow) + 1, "a name per prediction type");

// row_info [rows, RowInfo::kColumns] int64: a row's integer facts.
struct RowInfo {
  enum Column : int {
    kKind,                // SamplerKind
    kPrediction,          // Prediction
    kLength,              // steps in the row's schedule
    kTableLength,         // entries of the row's table in use (ddim: num_train_timesteps; others: length + 1)
    kStepRatio,           // ddim, ddpm: num_train_timesteps // num_inference_steps
    kFinalFirstOrder,     // dpm_solver_pp_2m(_sde): the last step is first order; unipc(_3): lower_order_final
    kClippedModelOutput,  // ddim: use_clipped_model_output
    kFinalSecondOrder,    // dpm_solver_pp_3m: the second-to-last step is second order (lower_order_final, < 15 steps)
    kColumns
  };
  static constexpr const char* kNames[kColumns] = {"kind",        "prediction",        "length",
                                                   "table_length", "step_ratio",        "final_first_order",
                                                   "clipped_model_output", "final_second_order"};
};

// row_scalars [rows, RowScalars::kColumns] float64: a row's real-valued options (ddim's).
struct RowScalars {
  enum Column : int {
    kFinalAlphaCumprod,  // alphas_cumprod before the first training step (set_alpha_to_one)
    kEta,                // the stochastic share of a step (>= 0)
    kClipRange,          // ddim, ddpm: the x0 prediction is clipped to [-clip, clip]; 0: no clipping
    kColumns
  };
  static constexpr const char* kNames[kColumns] = {"final_alpha_cumprod", "eta", "clip_range"};
};

}  // namespace octopus

// octopus::sampler_step's arguments and the op itself, written once for both backends:
// schemas.cpp registers sampler_step<CpuSamplerBackend> (sampler_step.cpp holds the checks and
// that backend), sampler_step.cu registers sampler_step<CudaSamplerBackend>.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <tuple>
#include <type_traits>

#include "octopus/core/checks.h"
#include "octopus/core/dtypes.h"
#include "octopus/ops/sampler_step.h"

namespace octopus {

struct SamplerStepArgs {
  at::Tensor model_output, sample, offsets, noise, prev, x0;
  at::Tensor timesteps, sample_rows, schedules, tables, row_info, row_scalars;  // kept alive for params
  at::Tensor state;       // [1 or 3, N] (a view with 16-byte aligned rows), or undefined
  SamplerParams params;
  Strategy strategy;
  int64_t block_elems;
};

// The latents: model_output, sample and offsets (a ragged layout), noise, and the multistep
// state [K, N] updated in place (K = 1: the last x0; K = 3: also the x0 before it and the
// last corrected sample, for unipc_3 plus the next corrector's term in the x0 before that).
void check_sampler_latents(SamplerStepArgs& a, const at::Tensor& model_output, const at::Tensor& sample,
                           const at::Tensor& offsets, const c10::optional<at::Tensor>& noise,
                           const c10::optional<at::Tensor>& state);

// The per-sample timesteps and rows and the per-row tables (shapes, dtypes, devices; their
// contents too where they are on the CPU, where reading them costs nothing).
void check_sampler_rows(SamplerStepArgs& a, const at::Tensor& timesteps, const at::Tensor& schedules,
                        const at::Tensor& tables, const at::Tensor& row_info, const at::Tensor& row_scalars,
                        const c10::optional<at::Tensor>& sample_rows);

// Allocates prev (and x0) and fills params.
void finish_sampler_args(SamplerStepArgs& a, bool return_x0);

// Runs the step over the checked arguments on the CPU (sampler_step.cpp).
struct CpuSamplerBackend {
  static void run(SamplerStepArgs& a, const c10::optional<at::Tensor>& metadata);
};

template <class Backend>
std::tuple<at::Tensor, at::Tensor> sampler_step(const at::Tensor& model_output, const at::Tensor& sample,
                                                const at::Tensor& offsets, const at::Tensor& timesteps,
                                                const at::Tensor& schedules, const at::Tensor& tables,
                                                const at::Tensor& row_info, const at::Tensor& row_scalars,
                                                const c10::optional<at::Tensor>& sample_rows,
                                                const c10::optional<at::Tensor>& noise,
                                                const c10::optional<at::Tensor>& state, bool return_x0,
                                                c10::string_view strategy,
                                                const c10::optional<at::Tensor>& metadata) {
  SamplerStepArgs a;
  a.strategy = parse_strategy(strategy);
  a.block_elems = resolve_block_elems(0);
  check_sampler_latents(a, model_output, sample, offsets, noise, state);
  check_sampler_rows(a, timesteps, schedules, tables, row_info, row_scalars, sample_rows);
  finish_sampler_args(a, return_x0);
  Backend::run(a, metadata);
  return {a.prev, a.x0};
}

// Calls f(op) with the functor for the latents' dtype and the optional latents given.
template <class F>
void with_sampler_step_op(const SamplerStepArgs& a, F&& f) {
  const int64_t state_rows = a.state.defined() ? a.state.size(0) : 0;
  const StepInputs inputs = state_rows == 3 || (a.noise.defined() && state_rows > 0) ? StepInputs::Any
                            : a.noise.defined()                                      ? StepInputs::Noise
                            : state_rows > 0                                         ? StepInputs::History
                                                                                     : StepInputs::None;
  auto make = [&](auto tag, auto inputs_tag) {
    using scalar_t = decltype(tag);
    using acc_t = acc_type<scalar_t>;
    auto ptr = [](const at::Tensor& t) { return optional_data<scalar_t>(t); };
    scalar_t* state = ptr(a.state);
    auto state_row = [&](int64_t k) { return k < state_rows ? state + k * a.state.stride(0) : nullptr; };
    SamplerStepOp<scalar_t, acc_t, decltype(inputs_tag)::value> op{
        ptr(a.model_output), ptr(a.sample), ptr(a.noise), state_row(0), state_row(1), state_row(2),
        ptr(a.prev),         ptr(a.x0),     a.params};
    f(op);
  };
  auto with_inputs = [&](auto tag) {
    switch (inputs) {
      case StepInputs::None: return make(tag, std::integral_constant<StepInputs, StepInputs::None>{});
      case StepInputs::Noise: return make(tag, std::integral_constant<StepInputs, StepInputs::Noise>{});
      case StepInputs::History: return make(tag, std::integral_constant<StepInputs, StepInputs::History>{});
      case StepInputs::Any: return make(tag, std::integral_constant<StepInputs, StepInputs::Any>{});
    }
  };
  switch (a.sample.scalar_type()) {
    case c10::kFloat: return with_inputs(float{});
    case c10::kDouble: return with_inputs(double{});
    case c10::kHalf: return with_inputs(c10::Half{});
    case c10::kBFloat16: return with_inputs(c10::BFloat16{});
    default: TORCH_CHECK_TYPE(false, "sample must be float32, float64, float16 or bfloat16, got ", a.sample.scalar_type());
  }
}

}  // namespace octopus

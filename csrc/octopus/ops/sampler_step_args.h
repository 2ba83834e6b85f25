// Argument handling for octopus::sampler_step shared by its CPU and CUDA implementations.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <type_traits>

#include "octopus/core/checks.h"
#include "octopus/core/dtypes.h"
#include "octopus/ops/sampler_step.h"

namespace octopus {

struct SamplerStepArgs {
  at::Tensor model_output, sample, offsets, timesteps, schedule, table, row_info, noise, history, history2, last_sample, prev, x0;
  SamplerParams params;
  Strategy strategy;
  int64_t block_elems;
};

// Checks every argument (dtypes, shapes, devices) and allocates the outputs.
SamplerStepArgs prepare_sampler_step(const at::Tensor& model_output, const at::Tensor& sample,
                                     const at::Tensor& offsets, const at::Tensor& timesteps,
                                     const at::Tensor& schedule, const at::Tensor& table, const at::Tensor& row_info,
                                     int64_t kind, int64_t prediction, double final_alpha_cumprod, double eta,
                                     double clip_range, bool use_clipped_model_output,
                                     const c10::optional<at::Tensor>& noise, const c10::optional<at::Tensor>& history,
                                     const c10::optional<at::Tensor>& history2,
                                     const c10::optional<at::Tensor>& last_sample, bool return_x0,
                                     c10::string_view strategy);

// Calls f(op) with the functor for the latents' dtype and the optional latents given.
template <class F>
void with_sampler_step_op(const SamplerStepArgs& a, F&& f) {
  const bool corrector = a.history2.defined() || a.last_sample.defined();
  const StepInputs inputs = corrector || (a.noise.defined() && a.history.defined()) ? StepInputs::Any
                            : a.noise.defined()                                    ? StepInputs::Noise
                            : a.history.defined()                                  ? StepInputs::History
                                                                                   : StepInputs::None;
  auto make = [&](auto tag, auto inputs_tag) {
    using scalar_t = decltype(tag);
    using acc_t = acc_type<scalar_t>;
    auto ptr = [](const at::Tensor& t) { return optional_data<scalar_t>(t); };
    SamplerStepOp<scalar_t, acc_t, decltype(inputs_tag)::value> op{
        ptr(a.model_output), ptr(a.sample), ptr(a.noise), ptr(a.history), ptr(a.history2), ptr(a.last_sample),
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

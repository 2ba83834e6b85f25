// Argument handling for octopus::sampler_step shared by its CPU and CUDA implementations.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

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

// Calls f(op) with the functor for the latents' dtype.
template <class F>
void with_sampler_step_op(const SamplerStepArgs& a, F&& f) {
  auto make = [&](auto tag) {
    using scalar_t = decltype(tag);
    using acc_t = acc_type<scalar_t>;
    auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<scalar_t>() : nullptr; };
    SamplerStepOp<scalar_t, acc_t> op{ptr(a.model_output), ptr(a.sample), ptr(a.noise),    ptr(a.history),
                                      ptr(a.history2),     ptr(a.last_sample), ptr(a.prev), ptr(a.x0),
                                      a.params};
    f(op);
  };
  switch (a.sample.scalar_type()) {
    case c10::kFloat: return make(float{});
    case c10::kDouble: return make(double{});
    case c10::kHalf: return make(c10::Half{});
    case c10::kBFloat16: return make(c10::BFloat16{});
    default: TORCH_CHECK_TYPE(false, "sample must be float32, float64, float16 or bfloat16, got ", a.sample.scalar_type());
  }
}

}  // namespace octopus

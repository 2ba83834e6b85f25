// octopus::sampler_step — the CUDA kernel: the sampler-step functor run by the generic driver.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/metadata.h"
#include "octopus/core/tuning_registry.cuh"
#include "octopus/ops/sampler_step_args.h"

namespace octopus {

OCTOPUS_REGISTER_TUNING(SamplerStepTuning, sampler_step);

namespace {

// No host reads here (the tables' contents are not checked on the host, which would
// synchronize): the Python schedulers check timesteps, offsets and rows when they build them.
struct CudaSamplerBackend {
  static void run(SamplerStepArgs& a, const c10::optional<at::Tensor>& metadata) {
    const c10::cuda::CUDAGuard guard(a.sample.device());
    if (!metadata.has_value() && a.strategy != Strategy::Plan && a.strategy != Strategy::PlanHost) {
      // Latents of a few MB (a step's usual size) are too few 4096-element tiles to keep every
      // multiprocessor busy: tiles shrink towards tiles_per_sm per SM (SamplerStepTuning).
      const SamplerStepTuning tuning = cuda::launch_policy<SamplerStepTuning>();
      const int64_t per_tile = a.sample.numel() / (int64_t{cuda::multiprocessor_count()} * tuning.tiles_per_sm);
      while (a.block_elems > tuning.min_tile_elems && a.block_elems / 2 >= per_tile) a.block_elems /= 2;
    }
    const at::Tensor meta = metadata_for(a.strategy, metadata, a.offsets, a.sample.numel(), a.block_elems,
                                         build_plan_cuda);
    with_sampler_step_op(a, [&](const auto& op) {
      cuda::run_ragged_cuda(op, a.strategy, a.offsets, a.sample.numel(), a.block_elems, meta);
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) { m.impl("sampler_step", &sampler_step<CudaSamplerBackend>); }

}  // namespace octopus

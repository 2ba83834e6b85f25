// octopus::sampler_step — the CUDA kernel: the sampler-step functor run by the generic driver.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/metadata.h"
#include "octopus/ops/sampler_step_args.h"

namespace octopus {
namespace {

// No host reads here (the tables' contents are not checked on the host, which would
// synchronize): the Python schedulers check timesteps, offsets and rows when they build them.
struct CudaSamplerBackend {
  static void run(SamplerStepArgs& a, const c10::optional<at::Tensor>& metadata) {
    const c10::cuda::CUDAGuard guard(a.sample.device());
    if (!metadata.has_value() && a.strategy != Strategy::Plan && a.strategy != Strategy::PlanHost) {
      // Latents of a few MB (a step's usual size) are too few 4096-element tiles to keep every
      // multiprocessor busy: tiles shrink (down to 512 elements) to ~16 per SM. Measured on the
      // H100 over 256-32768 for 17-26 MB latents: fewer, longer tiles beat one per resident warp
      // (each tile pays a search and the coefficient math before its first load).
      const int64_t per_warp = a.sample.numel() / (int64_t{cuda::multiprocessor_count()} * 16);
      while (a.block_elems > 512 && a.block_elems / 2 >= per_warp) a.block_elems /= 2;
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

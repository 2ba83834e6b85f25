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

// Each sample's Item (its step's coefficients) into a table the step kernel then reads. One
// warp per sample: samples of different samplers in one warp would run each other's
// coefficient math one after the other (a batch mixing ten kinds lost 12 us a step so).
constexpr int kItemTableWarps = 4;

// schedule_index by a whole warp: 32 entries a round, four rounds' loads in flight at once,
// where the binary search reads one entry per halving, each load waiting for the one before
// (this kernel's time is its chain of dependent loads). Every lane of the warp calls it; t is
// not NaN.
__device__ int64_t warp_schedule_index(const double* row, int64_t length, double t, int lane) {
  constexpr int kRounds = 4;
  for (int64_t base = 0; base < length; base += 32 * kRounds) {
    double v[kRounds];
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int64_t k = base + r * 32 + lane;
      v[r] = k < length ? row[k] : -INFINITY;  // past the end counts as "at most t", as in the search
    }
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const unsigned at_most = __ballot_sync(0xffffffffu, v[r] <= t);
      if (at_most != 0u) return nearest_entry(row, length, t, base + r * 32 + __ffs(static_cast<int>(at_most)) - 1);
    }
  }
  return nearest_entry(row, length, t, length);
}

template <class Op, class Acc>
__global__ void __launch_bounds__(kItemTableWarps * 32) sampler_item_table_kernel(const Op op, int64_t m,
                                                                                  Acc* __restrict__ table) {
  allow_dependents();  // the step's kernel may begin; it waits for the table before reading it
  const int64_t i = blockIdx.x * static_cast<int64_t>(kItemTableWarps) + threadIdx.x / 32;
  if (i >= m) return;
  const int lane = threadIdx.x % 32;
  const double t = op.params.timesteps[i];
  int64_t step = -1;
  if (t >= 0.0) {
    const SamplerRow r = sampler_row(op.params, sample_row(op.params, i));
    if (searches_schedule(r.kind)) step = warp_schedule_index(r.schedule, r.length, t, lane);
  }
  if (lane == 0) op.write_item(i, table, step);
}

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
      using acc_t = typename std::decay_t<decltype(op)>::Acc;
      const int64_t m = a.offsets.size(0) - 1;
      const at::Tensor table =
          at::empty({m, kItemWords}, a.sample.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
      if (m > 0) {
        sampler_item_table_kernel<<<static_cast<unsigned>((m + kItemTableWarps - 1) / kItemTableWarps),
                                    kItemTableWarps * 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
            op, m, table.data_ptr<acc_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      cuda::run_ragged_cuda(op.with_item_table(table.data_ptr<acc_t>()), a.strategy, a.offsets, a.sample.numel(),
                            a.block_elems, meta);
    });
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) { m.impl("sampler_step", &sampler_step<CudaSamplerBackend>); }

}  // namespace octopus

// octopus::normalize_constants — the CUDA kernel: one thread per (item, channel).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "octopus/ops/item_stats.h"
#include "octopus/ops/normalize.h"

namespace octopus {
namespace {

template <class P>
__global__ void normalize_constants_kernel(const double* __restrict__ stats, const int64_t* __restrict__ offsets,
                                           int64_t slots, int64_t planes, int64_t correction, double eps,
                                           P* __restrict__ center, P* __restrict__ scale) {
  const int64_t slot = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (slot >= slots) return;
  const int64_t i = slot / planes;
  double a, b;
  normalize_constants_of(stats[slot * kNumStats + kStatSum], stats[slot * kNumStats + kStatM2],
                         static_cast<double>((offsets[i + 1] - offsets[i]) / planes), correction, eps,
                         [](double v) { return ::rsqrt(v); }, a, b);  // torch's rsqrt on CUDA
  center[slot] = static_cast<P>(a);
  scale[slot] = static_cast<P>(b);
}

std::tuple<at::Tensor, at::Tensor> normalize_constants_cuda(const at::Tensor& stats, const at::Tensor& offsets,
                                                            int64_t channels, double eps, int64_t correction,
                                                            at::ScalarType dtype) {
  check_normalize_constants(stats, offsets, channels, correction, dtype);
  const c10::cuda::CUDAGuard guard(stats.device());
  const int64_t planes = stats.size(1);
  const at::Tensor s = stats.contiguous(), off = offsets.contiguous();
  at::Tensor center = at::empty({stats.size(0), planes}, stats.options().dtype(dtype));
  at::Tensor scale = at::empty_like(center);
  const int64_t slots = center.numel();
  if (slots == 0) return {center, scale};
  constexpr int threads = 256;
  AT_DISPATCH_FLOATING_TYPES(dtype, "normalize_constants", [&] {
    normalize_constants_kernel<scalar_t>
        <<<static_cast<unsigned>((slots + threads - 1) / threads), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
            s.data_ptr<double>(), off.data_ptr<int64_t>(), slots, planes, correction, eps,
            center.data_ptr<scalar_t>(), scale.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {center, scale};
}

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) { m.impl("normalize_constants", &normalize_constants_cuda); }

}  // namespace octopus

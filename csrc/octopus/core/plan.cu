// The block plan built on the device: an inclusive scan over per-item block counts
// (CUB, single pass, counts computed on the fly from the offsets), then one thread per
// plan row finds its item by a search over the scanned counts. No host loop, no copy,
// no synchronization; usable inside CUDA-graph capture.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <torch/library.h>

#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/metadata.h"
#include "octopus/core/plan.h"

namespace octopus {
namespace {

// Blocks of item i; offsets are clamped so that unvalidated input stays in bounds.
struct BlockCount {
  const int64_t* offsets;
  int64_t num_values, block_elems;
  __host__ __device__ int64_t operator()(int64_t i) const {
    const int64_t b = cuda::clamp_index(offsets[i], num_values);
    const int64_t e = cuda::clamp_index(offsets[i + 1], num_values);
    return blocks_for(b, e, block_elems);
  }
};

__global__ void fill_plan_kernel(const int64_t* __restrict__ offsets, const int64_t* __restrict__ block_end,
                                 int64_t m, int64_t num_values, int64_t block_elems, int64_t rows,
                                 longlong2* __restrict__ plan) {
  const int64_t row = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const int64_t count = m > 0 ? block_end[m - 1] : 0;
  if (row == 0) {
    plan[0] = make_longlong2(count, block_elems);
    return;
  }
  const int64_t j = row - 1;
  if (j >= count) {
    plan[row] = make_longlong2(0, 0);
    return;
  }
  // The item of block j: the first i with block_end[i] > j.
  int64_t lo = 0, hi = m;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (block_end[mid] <= j) lo = mid + 1; else hi = mid;
  }
  const int64_t first_block = lo > 0 ? block_end[lo - 1] : 0;
  const int64_t item_begin = cuda::clamp_index(offsets[lo], num_values);
  const int64_t item_end = cuda::clamp_index(offsets[lo + 1], num_values);
  const int64_t begin = block_begin(item_begin, j - first_block, block_elems);
  const int64_t end = min(item_end, (begin / block_elems + 1) * block_elems);
  plan[row] = make_longlong2(begin, pack_block(lo, end - begin));
}

at::Tensor plan_cuda_op(const at::Tensor& offsets, int64_t num_values, int64_t block_elems) {
  check_plan_args(offsets, num_values, block_elems);
  return build_plan_cuda(offsets, num_values, block_elems);
}

}  // namespace

at::Tensor build_plan_cuda(const at::Tensor& offsets_in, int64_t num_values, int64_t block_elems) {
  const c10::cuda::CUDAGuard guard(offsets_in.device());
  const at::Tensor offsets = offsets_in.contiguous();
  const int64_t m = offsets.numel() - 1;
  const int64_t rows = plan_rows(num_values, m, block_elems);
  at::Tensor plan = at::empty({rows, 2}, offsets.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto counts = thrust::make_transform_iterator(
      thrust::counting_iterator<int64_t>(0), BlockCount{offsets.data_ptr<int64_t>(), num_values, block_elems});
  // One scratch allocation: the scanned block counts, then CUB's temporary storage.
  size_t temp_bytes = 0;
  if (m > 0) {
    C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, temp_bytes, counts, static_cast<int64_t*>(nullptr), m,
                                                 stream));
  }
  const int64_t scan_words = std::max<int64_t>(m, 1);
  at::Tensor scratch =
      at::empty({scan_words + static_cast<int64_t>((temp_bytes + 7) / 8)}, offsets.options());
  int64_t* block_end = scratch.data_ptr<int64_t>();
  if (m > 0) {
    C10_CUDA_CHECK(
        cub::DeviceScan::InclusiveSum(block_end + scan_words, temp_bytes, counts, block_end, m, stream));
  }
  constexpr int kFillThreads = 256;
  fill_plan_kernel<<<static_cast<unsigned>((rows + kFillThreads - 1) / kFillThreads), kFillThreads, 0, stream>>>(
      offsets.data_ptr<int64_t>(), block_end, m, num_values, block_elems, rows,
      reinterpret_cast<longlong2*>(plan.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return plan;
}

TORCH_LIBRARY_IMPL(octopus, CUDA, m) { m.impl("plan", &plan_cuda_op); }

}  // namespace octopus

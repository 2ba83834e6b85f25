// The block plan built on the device: an inclusive scan over per-item block counts
// (CUB, single pass, counts computed on the fly from the offsets), then one thread per
// plan row finds its item by a search over the scanned counts; small batches do both in
// one launch. No host loop, no copy, no synchronization; usable inside CUDA-graph capture.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cub/block/block_scan.cuh>
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

// Plan row `row` given the inclusive scan `block_end` of the items' block counts (in
// global or shared memory) and the total block count.
template <class Scan>
__device__ __forceinline__ void fill_plan_row(const int64_t* __restrict__ offsets, const Scan* block_end, int64_t m,
                                              int64_t num_values, int64_t block_elems, int64_t count, int64_t row,
                                              longlong2* __restrict__ plan) {
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

__global__ void fill_plan_kernel(const int64_t* __restrict__ offsets, const int64_t* __restrict__ block_end,
                                 int64_t m, int64_t num_values, int64_t block_elems, int64_t rows,
                                 longlong2* __restrict__ plan) {
  const int64_t row = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  fill_plan_row(offsets, block_end, m, num_values, block_elems, m > 0 ? block_end[m - 1] : 0, row, plan);
}

// Small batches: one launch and no scratch. Every block scans all items' block counts
// into shared memory (cheap for up to kFusedMaxItems items, read from L2), then fills
// its share of the rows. The host-side cost of the scan + fill path (allocations, CUB's
// dispatch, three launches) is what dominates there.
constexpr int kFusedThreads = 1024;
constexpr int64_t kFusedMaxItems = 11264;  // 44 KiB of int32 prefix sums: within the static 48 KiB

__global__ void __launch_bounds__(kFusedThreads) plan_fused_kernel(const int64_t* __restrict__ offsets, int64_t m,
                                                                   int64_t num_values, int64_t block_elems,
                                                                   int64_t rows, longlong2* __restrict__ plan) {
  using BlockScan = cub::BlockScan<int32_t, kFusedThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int32_t block_end[kFusedMaxItems];
  const int per_thread = static_cast<int>((m + kFusedThreads - 1) / kFusedThreads);
  const int64_t first = int64_t{threadIdx.x} * per_thread;
  const int64_t last = min(m, first + per_thread);
  const BlockCount blocks_of{offsets, num_values, block_elems};
  int32_t local = 0;
  for (int64_t i = first; i < last; ++i) local += static_cast<int32_t>(blocks_of(i));
  int32_t prefix = 0;
  BlockScan(scan_storage).ExclusiveSum(local, prefix);
  for (int64_t i = first; i < last; ++i) {
    prefix += static_cast<int32_t>(blocks_of(i));
    block_end[i] = prefix;
  }
  __syncthreads();
  const int64_t count = m > 0 ? block_end[m - 1] : 0;
  for (int64_t row = int64_t{blockIdx.x} * kFusedThreads + threadIdx.x; row < rows;
       row += int64_t{gridDim.x} * kFusedThreads) {
    fill_plan_row(offsets, block_end, m, num_values, block_elems, count, row, plan);
  }
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
  if (m <= kFusedMaxItems && rows < (int64_t{1} << 31)) {
    const int64_t wanted = (rows + kFusedThreads - 1) / kFusedThreads;
    const int64_t grid = std::min<int64_t>(wanted, 2 * int64_t{cuda::multiprocessor_count()});
    plan_fused_kernel<<<static_cast<unsigned>(grid), kFusedThreads, 0, stream>>>(
        offsets.data_ptr<int64_t>(), m, num_values, block_elems, rows, reinterpret_cast<longlong2*>(plan.data_ptr<int64_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return plan;
  }
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

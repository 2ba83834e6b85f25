// The block plan built on the device: an inclusive scan over per-item block counts
// (computed on the fly from the offsets), then one thread per plan row finds its item by a
// search over the scanned counts; small batches do both in one launch, larger ones in three
// (chunks of items scanned, the chunks' totals scanned, the rows filled). No host loop, no
// copy, no synchronization; usable inside CUDA-graph capture.
// The lookup table of the `lookup` strategy is built here too. Both clamp every offset, so
// unvalidated offsets give wrong blocks or ids, never an access out of bounds.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <torch/library.h>

#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/metadata.h"
#include "octopus/core/plan.h"
#include "octopus/core/tuning_registry.cuh"

namespace octopus {

// The device plan builder's tuning (core/tuning.h).
struct PlanTuning {
  int fused_threads;        // each block of the small-batch kernel scans every item's block count
  int fused_blocks_per_sm;  // ... and fills its share of the rows: this many blocks per multiprocessor at most
  int mark_threads;         // the lookup table's item starts
  int mark_blocks_per_sm;
  int fill_threads;         // the large-batch plan's rows

  static constexpr const char* kFamily = "plan";
  // Hopper (sm_90), measured on an H100; every architecture until it is measured.
  static constexpr PlanTuning for_arch(int /*arch*/) { return PlanTuning{1024, 2, 256, 32, 256}; }
  template <class Fn>
  void for_each(Fn&& fn) const {
    fn("fused_threads", fused_threads);
    fn("fused_blocks_per_sm", fused_blocks_per_sm);
    fn("mark_threads", mark_threads);
    fn("mark_blocks_per_sm", mark_blocks_per_sm);
    fn("fill_threads", fill_threads);
  }
  constexpr bool valid() const { return fused_threads % 32 == 0 && fused_threads <= 1024; }
};
static_assert(PlanTuning::for_arch(900).valid());
OCTOPUS_REGISTER_TUNING(PlanTuning, plan);

namespace {

// floor(x / block_elems) for 0 <= x < 2^53 without a 64-bit integer division (a long
// emulated instruction sequence on the GPU): a double estimate, corrected by one.
struct BlockDivider {
  int64_t block_elems;
  double inverse;
  explicit BlockDivider(int64_t b) : block_elems(b), inverse(1.0 / static_cast<double>(b)) {}
  __device__ __forceinline__ int64_t operator()(int64_t x) const {
    int64_t q = static_cast<int64_t>(static_cast<double>(x) * inverse);
    if (q * block_elems > x) --q;
    else if ((q + 1) * block_elems <= x) ++q;
    return q;
  }
};

// The offsets as the builders read them (plan.h's PlanItems).
struct OffsetLoad {
  const int64_t* offsets;
  __device__ __forceinline__ int64_t operator()(int64_t i) const { return offsets[i]; }
};

__device__ __forceinline__ PlanItems<OffsetLoad> device_items(const int64_t* offsets, int64_t m, int64_t num_values,
                                                              int64_t block_elems) {
  return plan_items(OffsetLoad{offsets}, m, num_values, block_elems);
}

// Rows of item i: a run's first small item gets one, other small items none, a larger item
// one per block_elems window it touches (blocks_for in plan.h, with the divider).
struct BlockCount {
  const int64_t* offsets;
  int64_t m;
  int64_t num_values;
  BlockDivider div;
  __device__ int64_t operator()(int64_t i) const {
    const auto items = device_items(offsets, m, num_values, div.block_elems);
    if (items.small(i)) return items.small_item_rows(i);
    const int64_t b = items.begin(i), e = items.end(i);
    return div(e - 1) - div(b) + 1;
  }
};

// The first index i in [lo, hi) with scan[i] > j (hi where there is none).
template <class Scan>
__device__ __forceinline__ int64_t first_above(const Scan* scan, int64_t lo, int64_t hi, int64_t j) {
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (scan[mid] <= j) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// An item and the index of its first plan block.
struct ItemBlocks {
  int64_t item, first_block;
};

// Plan row `row` of `rows` given the total block count and `find(j)`, the item of block j
// (the first item whose inclusive scanned block count is above j) and its first block.
template <class Find>
__device__ __forceinline__ void fill_plan_row(const int64_t* __restrict__ offsets, const Find& find, int64_t m,
                                              int64_t num_values, const BlockDivider& div, int64_t count, int64_t rows,
                                              int64_t row, longlong2* __restrict__ plan) {
  const int64_t block_elems = div.block_elems;
  if (row == 0) {
    // Valid offsets never need more rows than the plan has; items that overlap (unvalidated
    // offsets that decrease) can, and kernels must not read past the last row.
    plan[0] = make_longlong2(min(count, rows - 1), block_elems);
    return;
  }
  const int64_t j = row - 1;
  if (j >= count) {
    plan[row] = make_longlong2(0, 0);
    return;
  }
  const ItemBlocks found = find(j);
  const int64_t lo = found.item;
  const auto items = device_items(offsets, m, num_values, block_elems);
  const int64_t item_begin = items.begin(lo);
  if (items.small(lo)) {
    plan[row] = make_longlong2(item_begin, pack_run(lo, items.run_length(lo)));
    return;
  }
  const int64_t first_block = found.first_block;
  const int64_t item_end = items.end(lo);
  // block_begin() and the block's end, with the divider.
  const int64_t k = j - first_block;
  const int64_t begin = k == 0 ? item_begin : (div(item_begin) + k) * block_elems;
  const int64_t end = min(item_end, (div(begin) + 1) * block_elems);
  // The block lies in its item for valid offsets; unvalidated ones can overflow the fused
  // kernel's int32 counts, and the row is then left empty rather than out of bounds.
  const bool in_item = item_begin <= begin && begin < end;
  plan[row] = in_item ? make_longlong2(begin, pack_block(lo, end - begin))
                      : make_longlong2(item_begin, pack_block(lo, 0));
}

// Large batches: chunks of kChunkItems items, one block each, scan their block counts
// (block_end: inclusive within the chunk; chunk_end: each chunk's total), one block scans the
// chunks' totals in place, and one thread per row fills the plan. CUB's device-wide scan, used
// before, did the first two in one pass but queried its kernel's occupancy on the host at
// every call.
constexpr int kChunkThreads = 512;
constexpr int kChunkItemsPerThread = 8;
constexpr int64_t kChunkItems = int64_t{kChunkThreads} * kChunkItemsPerThread;
constexpr int kChunkTotalsThreads = 1024;

__global__ void __launch_bounds__(kChunkThreads) plan_chunk_scan_kernel(const int64_t* __restrict__ offsets, int64_t m,
                                                                        int64_t num_values, const BlockDivider div,
                                                                        int64_t* __restrict__ block_end,
                                                                        int64_t* __restrict__ chunk_end) {
  using BlockScan = cub::BlockScan<int64_t, kChunkThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  const BlockCount blocks_of{offsets, m, num_values, div};
  const int64_t first = int64_t{blockIdx.x} * kChunkItems + int64_t{threadIdx.x} * kChunkItemsPerThread;
  int64_t counts[kChunkItemsPerThread];
  int64_t local = 0;
#pragma unroll
  for (int k = 0; k < kChunkItemsPerThread; ++k) {
    counts[k] = first + k < m ? blocks_of(first + k) : 0;
    local += counts[k];
  }
  int64_t prefix = 0;
  BlockScan(scan_storage).ExclusiveSum(local, prefix);
#pragma unroll
  for (int k = 0; k < kChunkItemsPerThread; ++k) {
    prefix += counts[k];
    if (first + k < m) block_end[first + k] = prefix;
  }
  if (threadIdx.x == kChunkThreads - 1) chunk_end[blockIdx.x] = prefix;
}

// chunk_end[0..chunks) from each chunk's total to the total up to and including it.
__global__ void __launch_bounds__(kChunkTotalsThreads) plan_chunk_totals_kernel(int64_t* __restrict__ chunk_end,
                                                                                int64_t chunks) {
  using BlockScan = cub::BlockScan<int64_t, kChunkTotalsThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  int64_t carry = 0;
  for (int64_t base = 0; base < chunks; base += kChunkTotalsThreads) {
    const int64_t c = base + threadIdx.x;
    int64_t total = 0, all = 0;
    BlockScan(scan_storage).InclusiveSum(c < chunks ? chunk_end[c] : 0, total, all);
    if (c < chunks) chunk_end[c] = carry + total;
    carry += all;
    __syncthreads();  // scan_storage is reused
  }
}

// The item of block j: its chunk by a search over the chunks' scanned totals, then the item
// by a search over the chunk's own scan.
struct ChunkedFind {
  const int64_t* __restrict__ block_end;
  const int64_t* __restrict__ chunk_end;
  int64_t m, chunks;
  __device__ __forceinline__ ItemBlocks operator()(int64_t j) const {
    const int64_t chunk = first_above(chunk_end, 0, chunks, j);
    const int64_t before = chunk > 0 ? chunk_end[chunk - 1] : 0;
    const int64_t begin = chunk * kChunkItems, end = min(m, begin + kChunkItems);
    const int64_t item = first_above(block_end, begin, end, j - before);
    return {item, before + (item > begin ? block_end[item - 1] : 0)};
  }
};

__global__ void fill_plan_kernel(const int64_t* __restrict__ offsets, const ChunkedFind find, int64_t m,
                                 int64_t num_values, const BlockDivider div, int64_t rows,
                                 longlong2* __restrict__ plan) {
  const int64_t row = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  fill_plan_row(offsets, find, m, num_values, div, find.chunk_end[find.chunks - 1], rows, row, plan);
}

// Small batches: one launch and no scratch. Every block scans all items' block counts
// into shared memory (cheap for up to kFusedMaxItems items, read from L2), then fills
// its share of the rows. The host-side cost of the scan + fill path (allocations, CUB's
// dispatch, three launches) is what dominates there.
constexpr int kFusedThreads = cuda::kPolicy<PlanTuning>.fused_threads;  // device code's (the host's: launch_policy)
constexpr int64_t kFusedMaxItems = 11264;  // 44 KiB of int32 prefix sums: within the static 48 KiB

__global__ void __launch_bounds__(kFusedThreads) plan_fused_kernel(const int64_t* __restrict__ offsets, int64_t m,
                                                                   int64_t num_values, const BlockDivider div,
                                                                   int64_t rows, longlong2* __restrict__ plan) {
  using BlockScan = cub::BlockScan<int32_t, kFusedThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int32_t block_end[kFusedMaxItems];
  // Block counts (coalesced reads), then each thread scans a contiguous run of them.
  const BlockCount blocks_of{offsets, m, num_values, div};
  for (int64_t i = threadIdx.x; i < m; i += kFusedThreads) block_end[i] = static_cast<int32_t>(blocks_of(i));
  __syncthreads();
  const int per_thread = static_cast<int>((m + kFusedThreads - 1) / kFusedThreads);
  const int64_t first = int64_t{threadIdx.x} * per_thread;
  const int64_t last = min(m, first + per_thread);
  int32_t local = 0;
  for (int64_t i = first; i < last; ++i) local += block_end[i];
  int32_t prefix = 0;
  BlockScan(scan_storage).ExclusiveSum(local, prefix);
  for (int64_t i = first; i < last; ++i) {
    prefix += block_end[i];
    block_end[i] = prefix;
  }
  __syncthreads();
  const int64_t count = m > 0 ? block_end[m - 1] : 0;
  const auto find = [&](int64_t j) {
    const int64_t item = first_above(block_end, 0, m, j);
    return ItemBlocks{item, item > 0 ? block_end[item - 1] : 0};
  };
  for (int64_t row = int64_t{blockIdx.x} * kFusedThreads + threadIdx.x; row < rows;
       row += int64_t{gridDim.x} * kFusedThreads) {
    fill_plan_row(offsets, find, m, num_values, div, count, rows, row, plan);
  }
}

at::Tensor plan_cuda_op(const at::Tensor& offsets, int64_t num_values, int64_t block_elems) {
  check_plan_args(offsets, num_values, block_elems);
  return build_plan_cuda(offsets, num_values, block_elems);
}

// The lookup table (see fill_lookup_table_host in plan.h, which this mirrors): every item
// but the first marks its first element with its index (the largest index wins where empty
// items share it), then an inclusive max-scan carries each index over its item's elements.
__global__ void mark_item_starts_kernel(const int64_t* __restrict__ offsets, int64_t m, int64_t num_values,
                                        int32_t* __restrict__ table) {
  for (int64_t i = 1 + int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < m;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t first = cuda::clamp_index(offsets[i], num_values);
    if (first < num_values) atomicMax(table + first, static_cast<int32_t>(i));
  }
}

struct MaxOp {
  __device__ __forceinline__ int32_t operator()(int32_t a, int32_t b) const { return a > b ? a : b; }
};

// Carries the scan of the chunk before into the first element of the next one.
__global__ void carry_max_kernel(int32_t* __restrict__ first_of_chunk) {
  first_of_chunk[0] = max(first_of_chunk[0], first_of_chunk[-1]);
}

// The scan runs in chunks that an int can count (older CUB versions take an int count).
constexpr int64_t kScanChunk = int64_t{1} << 30;

at::Tensor lookup_table_cuda_op(const at::Tensor& offsets, int64_t num_values) {
  check_plan_args(offsets, num_values, kDefaultBlockElems);
  return build_lookup_table_cuda(offsets, num_values);
}

}  // namespace

at::Tensor build_lookup_table_cuda(const at::Tensor& offsets_in, int64_t num_values) {
  const c10::cuda::CUDAGuard guard(offsets_in.device());
  const at::Tensor offsets = offsets_in.contiguous();
  const int64_t m = offsets.numel() - 1;
  at::Tensor table = at::empty({num_values}, offsets.options().dtype(at::kInt));
  if (num_values == 0) return table;
  int32_t* ids = table.data_ptr<int32_t>();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaMemsetAsync(ids, 0, num_values * sizeof(int32_t), stream));
  if (m > 1) {
    const PlanTuning tuning = cuda::launch_policy<PlanTuning>();
    const int64_t grid = std::min<int64_t>((m + tuning.mark_threads - 1) / tuning.mark_threads,
                                           int64_t{tuning.mark_blocks_per_sm} * cuda::multiprocessor_count());
    mark_item_starts_kernel<<<static_cast<unsigned>(grid), tuning.mark_threads, 0, stream>>>(
        offsets.data_ptr<int64_t>(), m, num_values, ids);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const int chunk = static_cast<int>(std::min(num_values, kScanChunk));
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceScan::InclusiveScan(nullptr, temp_bytes, ids, ids, MaxOp{}, chunk, stream));
  const int64_t temp_size = std::max<int64_t>(static_cast<int64_t>(temp_bytes), 1);
  at::Tensor temp = at::empty({temp_size}, offsets.options().dtype(at::kByte));
  for (int64_t start = 0; start < num_values; start += kScanChunk) {
    if (start > 0) {
      carry_max_kernel<<<1, 1, 0, stream>>>(ids + start);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    const int count = static_cast<int>(std::min(num_values - start, kScanChunk));
    // In place: CUB scans allow d_in == d_out.
    C10_CUDA_CHECK(
        cub::DeviceScan::InclusiveScan(temp.data_ptr(), temp_bytes, ids + start, ids + start, MaxOp{}, count, stream));
  }
  return table;
}

at::Tensor build_plan_cuda(const at::Tensor& offsets_in, int64_t num_values, int64_t block_elems) {
  const c10::cuda::CUDAGuard guard(offsets_in.device());
  const at::Tensor offsets = offsets_in.contiguous();
  const int64_t m = offsets.numel() - 1;
  const int64_t rows = plan_rows(num_values, m, block_elems);
  at::Tensor plan = at::empty({rows, 2}, offsets.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const BlockDivider div(block_elems);
  const PlanTuning tuning = cuda::launch_policy<PlanTuning>();
  if (m <= kFusedMaxItems && rows < (int64_t{1} << 31)) {
    const int64_t wanted = (rows + tuning.fused_threads - 1) / tuning.fused_threads;
    const int64_t grid =
        std::min<int64_t>(wanted, int64_t{tuning.fused_blocks_per_sm} * cuda::multiprocessor_count());
    plan_fused_kernel<<<static_cast<unsigned>(grid), tuning.fused_threads, 0, stream>>>(
        offsets.data_ptr<int64_t>(), m, num_values, div, rows, reinterpret_cast<longlong2*>(plan.data_ptr<int64_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return plan;
  }
  // One scratch allocation: the items' scanned block counts, then the chunks'.
  const int64_t chunks = std::max<int64_t>((m + kChunkItems - 1) / kChunkItems, 1);
  at::Tensor scratch = at::empty({std::max<int64_t>(m, 1) + chunks}, offsets.options());
  int64_t* block_end = scratch.data_ptr<int64_t>();
  int64_t* chunk_end = block_end + std::max<int64_t>(m, 1);
  plan_chunk_scan_kernel<<<static_cast<unsigned>(chunks), kChunkThreads, 0, stream>>>(offsets.data_ptr<int64_t>(), m,
                                                                                       num_values, div, block_end,
                                                                                       chunk_end);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  plan_chunk_totals_kernel<<<1, kChunkTotalsThreads, 0, stream>>>(chunk_end, chunks);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  fill_plan_kernel<<<static_cast<unsigned>((rows + tuning.fill_threads - 1) / tuning.fill_threads), tuning.fill_threads,
                     0, stream>>>(offsets.data_ptr<int64_t>(), ChunkedFind{block_end, chunk_end, m, chunks}, m,
                                  num_values, div, rows, reinterpret_cast<longlong2*>(plan.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return plan;
}

TORCH_LIBRARY_IMPL(octopus, CUDA, m) {
  m.impl("plan", &plan_cuda_op);
  m.impl("lookup_table", &lookup_table_cuda_op);
}

}  // namespace octopus

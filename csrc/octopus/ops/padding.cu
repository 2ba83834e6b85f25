// octopus::to_padded / octopus::from_padded — CUDA kernels. from_padded is the ragged
// functor run by the generic driver; to_padded walks the dense output slot by slot, reading
// each element's value where it lies inside the item.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/backend_cuda.cuh"
#include "octopus/core/tuning_registry.cuh"
#include "octopus/core/fast_divide.h"
#include "octopus/core/vec.h"
#include "octopus/ops/padding.h"

namespace octopus {

OCTOPUS_REGISTER_TUNING(PaddingTuning, padding);

namespace {

// Device code's tuning (core/tuning.h); the host's is launch_policy<PaddingTuning>().
constexpr int64_t kSlotChunk = cuda::kPolicy<PaddingTuning>.to_padded_chunk;
constexpr int kPadUnroll = cuda::kPolicy<PaddingTuning>.to_padded_unroll;

// One item as to_padded reads it: where its values start, its extents, and how many of its
// values may be read at all (whatever unvalidated offsets say, never past the values).
struct PaddedItem {
  int64_t src, readable;
  int64_t extent[kMaxItemDims];
};

// The slot's extents, and its elements per leading index, as dividers: for slots of more
// than one dimension (whose elements are then fewer than 2^31, checked on the host); a 1-D
// slot's element is its column.
struct SlotDividers {
  FastDivider extent[kMaxItemDims];
  FastDivider leading;
};

// Slot element e (row-major in the slot) in the item: its column, and the item index of its
// row's first value, or -1 where the row lies outside the item.
template <int kDims>
__device__ __forceinline__ int64_t row_in_item(const PaddedItem& it, const SlotDividers& div, int64_t e,
                                               int64_t* column) {
  if constexpr (kDims == 1) {
    *column = e;
    return 0;
  }
  uint32_t row = div.extent[kDims - 1].div(static_cast<uint32_t>(e));
  *column = e - int64_t{row} * div.extent[kDims - 1].divisor;
  int64_t index = 0, stride = it.extent[kDims - 1];
  bool inside = true;
#pragma unroll
  for (int d = kDims - 2; d >= 0; --d) {
    const uint32_t q = d > 0 ? div.extent[d].div(row) : 0;
    const int64_t c = row - q * div.extent[d].divisor;
    inside &= c < it.extent[d];
    index += c * stride;
    stride *= it.extent[d];
    row = q;
  }
  return inside ? index : -1;
}

// The value of column `column` of an item row that starts at item index `row` (-1: outside).
template <typename T, int kDims>
__device__ __forceinline__ T padded_value(const T* __restrict__ in, const PaddedItem& it, int64_t row, int64_t column,
                                          T pad) {
  const bool inside = row >= 0 && column < it.extent[kDims - 1] && row + column < it.readable;
  return inside ? in[it.src + row + column] : pad;
}

// A task is up to kSlotChunk elements of one item's slot: the item is read once per task,
// then each lane makes whole 16-byte vectors of the slot (single values at the two ends
// where the slot does not start on a boundary), kPadUnroll of them in flight, every element
// reading its value where it lies inside the item and pad elsewhere.
template <typename T, int kDims, int V = 16 / sizeof(T)>
__global__ void __launch_bounds__(cuda::kThreads) to_padded_kernel(const T* __restrict__ in, T* __restrict__ out,
                                                                   const int64_t* __restrict__ offsets,
                                                                   const int64_t* __restrict__ sizes,
                                                                   int64_t num_values, int64_t slot_numel,
                                                                   int64_t width, SlotDividers div,
                                                                   int64_t chunks_per_slot,
                                                                   int64_t tasks, T pad) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t{gridDim.x} * cuda::kThreads) >> 5;
  for (int64_t task = (int64_t{blockIdx.x} * cuda::kThreads + threadIdx.x) >> 5; task < tasks; task += warps) {
    const int64_t i = task / chunks_per_slot;
    const int64_t e0 = (task - i * chunks_per_slot) * kSlotChunk;
    const int64_t e1 = min(e0 + kSlotChunk, slot_numel);
    PaddedItem it;
    it.src = __ldg(offsets + i);
    it.readable = it.src >= 0 ? num_values - it.src : 0;
#pragma unroll
    for (int d = 0; d < kDims; ++d) it.extent[d] = __ldg(sizes + i * kDims + d);
    // Where the chunk's first element lies past the item's leading extent, so does the
    // rest: the chunk is pad throughout (most of a slot much larger than its item).
    const int64_t lead = kDims == 1 ? e0 : div.leading.div(static_cast<uint32_t>(e0));
    bool all_pad = lead >= it.extent[0] || it.readable <= 0;
#pragma unroll
    for (int d = 1; d < kDims; ++d) all_pad |= it.extent[d] <= 0;
    T* slot = out + i * slot_numel;
    auto value = [&](int64_t e) {
      int64_t column = 0;
      const int64_t row = all_pad ? -1 : row_in_item<kDims>(it, div, e, &column);
      return padded_value<T, kDims>(in, it, row, column, pad);
    };
    const int64_t a0 = min(e1, e0 + elements_to_vector_boundary(slot + e0));
    const int64_t a1 = a0 + (e1 - a0) / V * V;
    if (lane < a0 - e0) slot[e0 + lane] = value(e0 + lane);
    if (lane < e1 - a1) slot[a1 + lane] = value(a1 + lane);
    for (int64_t base = a0 + lane * V; base < a1; base += 32 * V * kPadUnroll) {
      Vec<T, V> v[kPadUnroll];
#pragma unroll
      for (int u = 0; u < kPadUnroll; ++u) {
        const int64_t e = base + u * 32 * V;
        if (e >= a1) continue;
        if (all_pad) {
#pragma unroll
          for (int k = 0; k < V; ++k) v[u].v[k] = pad;
          continue;
        }
        int64_t column;
        const int64_t row = row_in_item<kDims>(it, div, e, &column);
        if (column + V <= width) {  // the vector lies in one row of the slot
#pragma unroll
          for (int k = 0; k < V; ++k) v[u].v[k] = padded_value<T, kDims>(in, it, row, column + k, pad);
        } else {
#pragma unroll
          for (int k = 0; k < V; ++k) v[u].v[k] = value(e + k);
        }
      }
#pragma unroll
      for (int u = 0; u < kPadUnroll; ++u) {
        const int64_t e = base + u * 32 * V;
        if (e < a1) store_vec(slot + e, v[u]);
      }
    }
  }
}

at::Tensor to_padded_cuda(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                          c10::IntArrayRef max_shape, double pad_value, bool validate) {
  const c10::cuda::CUDAGuard guard(values.device());
  PaddingArgs a = prepare_to_padded(values, offsets, sizes, max_shape, cuda_may_read_host(validate));
  if (a.out.numel() == 0) return a.out;
  TORCH_CHECK_VALUE(a.slot.dims == 1 || a.slot.numel < (int64_t{1} << 31), "to_padded on CUDA takes slots of ",
                    "fewer than 2^31 elements where items have more than one dimension, got max_shape ",
                    format_shape(max_shape));
  SlotDividers div{};
  if (a.slot.dims > 1) {
    for (int d = 0; d < a.slot.dims; ++d) div.extent[d] = FastDivider::make(static_cast<uint32_t>(a.slot.extent[d]));
    div.leading = FastDivider::make(static_cast<uint32_t>(a.slot.stride[0]));
  }
  const int64_t m = a.offsets.numel() - 1;
  const PaddingTuning tuning = cuda::launch_policy<PaddingTuning>();
  const int64_t chunks_per_slot = (a.slot.numel + tuning.to_padded_chunk - 1) / tuning.to_padded_chunk;
  const int64_t tasks = m * chunks_per_slot;
  const int64_t warps = cuda::launch_warps_per_block();
  const int64_t blocks = std::min<int64_t>(int64_t{cuda::multiprocessor_count()} * tuning.to_padded_blocks_per_sm,
                                           (tasks + warps - 1) / warps);
  dispatch_copy_dtype(a.values.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(blocks), cuda::launch_threads(), 0, c10::cuda::getCurrentCUDAStream()>>>(
          a.values.data_ptr<T>(), a.out.data_ptr<T>(), a.offsets.data_ptr<int64_t>(), a.sizes.data_ptr<int64_t>(),
          a.values.numel(), a.slot.numel, a.slot.extent[a.slot.dims - 1], div, chunks_per_slot, tasks,
          static_cast<T>(pad_value));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    switch (a.slot.dims) {
      case 1: return launch(to_padded_kernel<T, 1>);
      case 2: return launch(to_padded_kernel<T, 2>);
      case 3: return launch(to_padded_kernel<T, 3>);
      default: return launch(to_padded_kernel<T, 4>);
    }
  });
  return a.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) {
  m.impl("to_padded", &to_padded_cuda);
  m.impl("from_padded", &from_padded<CudaBackend>);
}

}  // namespace octopus

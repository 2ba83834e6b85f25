// octopus::to_padded / octopus::from_padded — CUDA kernels. from_padded is the ragged
// functor run by the generic driver; to_padded walks the dense output row by row, reading
// the item's row where the row lies inside the item.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/metadata.h"
#include "octopus/core/vec.h"
#include "octopus/ops/padding.h"

namespace octopus {
namespace {

constexpr int64_t kRowChunk = 1024;  // output elements per warp task

bool may_sync() { return c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None; }

// A task is kRowChunk elements of one output row or, for narrower rows, several whole
// rows: the row's item and coordinates are divided out once per task, then stepped.
template <typename T, bool kVectorRows, int V = 16 / sizeof(T)>
__global__ void __launch_bounds__(cuda::kThreads) to_padded_kernel(const T* __restrict__ in, T* __restrict__ out,
                                                                   const int64_t* __restrict__ offsets,
                                                                   const int64_t* __restrict__ sizes, int64_t num_values,
                                                                   DenseSlot slot, int64_t total_rows,
                                                                   int64_t rows_per_task, int64_t chunks_per_row,
                                                                   int64_t tasks, T pad) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t{gridDim.x} * cuda::kThreads) >> 5;
  const int dims = slot.dims;
  const int64_t width = slot.extent[dims - 1];
  const int64_t rows_per_item = slot.numel / width;
  for (int64_t task = (int64_t{blockIdx.x} * cuda::kThreads + threadIdx.x) >> 5; task < tasks; task += warps) {
    const int64_t group = task / chunks_per_row;
    const int64_t x0 = (task - group * chunks_per_row) * kRowChunk;
    const int64_t x1 = min(x0 + kRowChunk, width);
    const int64_t row0 = group * rows_per_task;
    const int64_t row_end = min(row0 + rows_per_task, total_rows);
    int64_t i = row0 / rows_per_item;
    int64_t coord[kMaxItemDims] = {};
    for (int64_t r = row0 - i * rows_per_item, d = dims - 2; d >= 0; --d) {
      const int64_t q = r / slot.extent[d];
      coord[d] = r - q * slot.extent[d];
      r = q;
    }
    for (int64_t row = row0; row < row_end; ++row) {
      int64_t src = __ldg(offsets + i);
      bool inside = src >= 0;
      int64_t item_stride = __ldg(sizes + i * dims + dims - 1);
      for (int d = dims - 2; d >= 0; --d) {
        const int64_t item_e = __ldg(sizes + i * dims + d);
        inside &= coord[d] < item_e;
        src += coord[d] * item_stride;
        item_stride *= item_e;
      }
      const int64_t valid = inside ? min(width, __ldg(sizes + i * dims + dims - 1)) : 0;
      const int64_t readable = num_values - src;  // never read past the values, whatever the offsets say
      T* dst = out + row * width;
      auto at = [&](int64_t x) { return x < valid && x < readable ? in[src + x] : pad; };
      if constexpr (kVectorRows) {  // 16-byte stores; the reads stay single (items start anywhere)
        for (int64_t x = x0 + int64_t{lane} * V; x < x1; x += int64_t{32} * V) {
          Vec<T, V> v;
#pragma unroll
          for (int k = 0; k < V; ++k) v.v[k] = at(x + k);
          *reinterpret_cast<Vec<T, V>*>(dst + x) = v;
        }
      } else {
#pragma unroll 4
        for (int64_t x = x0 + lane; x < x1; x += 32) dst[x] = at(x);
      }
      // The next row: step the leading coordinates, and the item when they wrap.
      int d = dims - 2;
      for (; d >= 0; --d) {
        if (++coord[d] < slot.extent[d]) break;
        coord[d] = 0;
      }
      if (d < 0) ++i;
    }
  }
}

at::Tensor to_padded_cuda(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                          c10::IntArrayRef max_shape, double pad_value, bool validate) {
  const c10::cuda::CUDAGuard guard(values.device());
  PaddingArgs a = prepare_to_padded(values, offsets, sizes, max_shape, validate && may_sync());
  if (a.out.numel() == 0) return a.out;
  const int64_t width = a.slot.extent[a.slot.dims - 1];
  const int64_t total_rows = a.out.numel() / width;
  const int64_t chunks_per_row = (width + kRowChunk - 1) / kRowChunk;
  const int64_t rows_per_task = width >= kRowChunk ? 1 : kRowChunk / width;
  const int64_t tasks = (total_rows + rows_per_task - 1) / rows_per_task * chunks_per_row;
  const int64_t blocks = std::min<int64_t>(int64_t{cuda::multiprocessor_count()} * 8,
                                           (tasks + cuda::kWarpsPerBlock - 1) / cuda::kWarpsPerBlock);
  dispatch_copy_dtype(a.values.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    // Short rows of whole 16-byte vectors (the output is 16-byte aligned) are stored a vector
    // at a time: measured faster on 128- and 800-wide rows, slower on 8000-wide ones, whose
    // single stores already stream.
    const bool vector_rows = width % (16 / sizeof(T)) == 0 && width < kRowChunk;
    auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(blocks), cuda::kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          a.values.data_ptr<T>(), a.out.data_ptr<T>(), a.offsets.data_ptr<int64_t>(), a.sizes.data_ptr<int64_t>(),
          a.values.numel(), a.slot, total_rows, rows_per_task, chunks_per_row, tasks, static_cast<T>(pad_value));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (vector_rows) {
      launch(to_padded_kernel<T, true>);
    } else {
      launch(to_padded_kernel<T, false>);
    }
  });
  return a.out;
}

at::Tensor from_padded_cuda(const at::Tensor& padded, const at::Tensor& offsets, const at::Tensor& sizes,
                            int64_t num_values, c10::string_view strategy, int64_t block_elems,
                            const c10::optional<at::Tensor>& metadata, bool validate) {
  const c10::cuda::CUDAGuard guard(padded.device());
  const bool check = validate && may_sync();
  PaddingArgs a = prepare_from_padded(padded, offsets, sizes, num_values, strategy, block_elems, check, check);
  const at::Tensor meta = metadata_for(a.strategy, metadata, a.offsets, num_values, a.block_elems, build_plan_cuda);
  dispatch_copy_dtype(a.padded.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const FromPaddedOp<T> op{a.padded.data_ptr<T>(), a.out.data_ptr<T>(), a.offsets.data_ptr<int64_t>(),
                             a.sizes.data_ptr<int64_t>(), num_values, a.slot};
    cuda::run_ragged_cuda(op, a.strategy, a.offsets, num_values, a.block_elems, meta);
  });
  return a.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) {
  m.impl("to_padded", &to_padded_cuda);
  m.impl("from_padded", &from_padded_cuda);
}

}  // namespace octopus

// octopus::to_padded / octopus::from_padded — CUDA kernels. from_padded is the ragged
// functor run by the generic driver; to_padded walks the dense output, a warp per chunk of
// an output row, reading the item's row where the row lies inside the item.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/driver_cuda.cuh"
#include "octopus/core/metadata.h"
#include "octopus/ops/padding.h"

namespace octopus {
namespace {

constexpr int64_t kRowChunk = 1024;  // output elements per warp task

bool may_sync() { return c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None; }

template <typename T>
__global__ void __launch_bounds__(cuda::kThreads) to_padded_kernel(const T* __restrict__ in, T* __restrict__ out,
                                                                   const int64_t* __restrict__ offsets,
                                                                   const int64_t* __restrict__ sizes, int64_t num_values,
                                                                   DenseSlot slot, int64_t tasks, int64_t chunks_per_row,
                                                                   T pad) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t{gridDim.x} * cuda::kThreads) >> 5;
  const int64_t width = slot.extent[slot.dims - 1];
  const int64_t rows_per_item = slot.numel / width;
  for (int64_t task = (int64_t{blockIdx.x} * cuda::kThreads + threadIdx.x) >> 5; task < tasks; task += warps) {
    const int64_t row = task / chunks_per_row;
    const int64_t x0 = (task - row * chunks_per_row) * kRowChunk;
    const int64_t x1 = min(x0 + kRowChunk, width);
    const int64_t i = row / rows_per_item;
    int64_t r = row - i * rows_per_item;
    int64_t src = __ldg(offsets + i);
    bool inside = src >= 0;
    int64_t item_stride = __ldg(sizes + i * slot.dims + slot.dims - 1);
    for (int d = slot.dims - 2; d >= 0; --d) {
      const int64_t e = slot.extent[d];
      const int64_t q = r / e;
      const int64_t c = r - q * e;
      r = q;
      const int64_t item_e = __ldg(sizes + i * slot.dims + d);
      inside &= c < item_e;
      src += c * item_stride;
      item_stride *= item_e;
    }
    const int64_t valid = inside ? min(width, __ldg(sizes + i * slot.dims + slot.dims - 1)) : 0;
    const int64_t copy_end = min(x1, max(x0, valid));
    // Never read past the values, whatever unvalidated offsets say.
    const int64_t readable = num_values - src;
    T* dst = out + row * width;
#pragma unroll 4
    for (int64_t x = x0 + lane; x < copy_end; x += 32) dst[x] = x < readable ? in[src + x] : pad;
#pragma unroll 4
    for (int64_t x = copy_end + lane; x < x1; x += 32) dst[x] = pad;
  }
}

at::Tensor to_padded_cuda(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                          c10::IntArrayRef max_shape, double pad_value, bool validate) {
  const c10::cuda::CUDAGuard guard(values.device());
  PaddingArgs a = prepare_to_padded(values, offsets, sizes, max_shape, validate && may_sync());
  if (a.out.numel() == 0) return a.out;
  const int64_t width = a.slot.extent[a.slot.dims - 1];
  const int64_t chunks_per_row = (width + kRowChunk - 1) / kRowChunk;
  const int64_t tasks = a.out.numel() / width * chunks_per_row;
  const int64_t blocks = std::min<int64_t>(int64_t{cuda::multiprocessor_count()} * 8,
                                           (tasks + cuda::kWarpsPerBlock - 1) / cuda::kWarpsPerBlock);
  dispatch_copy_dtype(a.values.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    to_padded_kernel<T><<<static_cast<unsigned>(blocks), cuda::kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.values.data_ptr<T>(), a.out.data_ptr<T>(), a.offsets.data_ptr<int64_t>(), a.sizes.data_ptr<int64_t>(),
        a.values.numel(), a.slot, tasks, chunks_per_row, static_cast<T>(pad_value));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
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

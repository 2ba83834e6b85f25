// octopus::item_stats — the CUDA kernel. Reductions run over the block plan, whose blocks
// never cross items: a warp takes a plan block, splits it where channel planes begin,
// accumulates each piece in float64 (shifted by the plane's first element), reduces
// across the warp and adds the partial sums into its (item, channel) with atomics, or
// stores them where its piece is the whole plane. A second small kernel turns the sums
// into (sum, M2, min, max).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>
#include <type_traits>

#include "octopus/core/backend_cuda.cuh"
#include "octopus/core/dtypes.h"
#include "octopus/core/metadata.h"
#include "octopus/core/tuning_registry.cuh"
#include "octopus/core/vec.h"
#include "octopus/ops/item_stats.h"

namespace octopus {

// item_stats' kernel's tuning (core/tuning.h).
struct ItemStatsTuning {
  int unroll_4byte;   // 16-byte vectors in flight per lane, elements of 4 bytes or more
  int unroll;         // ... of 1 and 2 bytes
  int blocks_per_sm;  // blocks per multiprocessor launched

  static constexpr const char* kFamily = "item_stats";
  // Hopper (sm_90), measured on an H100; every architecture until it is measured.
  static constexpr ItemStatsTuning for_arch(int /*arch*/) { return ItemStatsTuning{4, 2, 8}; }
  template <class Fn>
  void for_each(Fn&& fn) const {
    fn("unroll_4byte", unroll_4byte);
    fn("unroll", unroll);
    fn("blocks_per_sm", blocks_per_sm);
  }
};
OCTOPUS_REGISTER_TUNING(ItemStatsTuning, item_stats);

namespace {

// Accumulator layout per (item, channel): S1, S2, min, max (min/max NaN-propagating).
__device__ __forceinline__ void atomic_min_max(double* address, double value, bool want_max) {
  auto* bits = reinterpret_cast<unsigned long long*>(address);
  unsigned long long old = *bits;
  while (true) {
    const double current = __longlong_as_double(static_cast<long long>(old));
    if (isnan(current)) return;
    const bool better = isnan(value) || (want_max ? value > current : value < current);
    if (!better) return;
    const unsigned long long seen = atomicCAS(bits, old, static_cast<unsigned long long>(__double_as_longlong(value)));
    if (seen == old) return;
    old = seen;
  }
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) v += __shfl_down_sync(0xffffffffu, v, s);
  return v;
}

__device__ __forceinline__ double warp_min_max(double v, bool want_max) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) {
    const double o = __shfl_down_sync(0xffffffffu, v, s);
    v = (isnan(v) || isnan(o)) ? __longlong_as_double(0x7ff8000000000000LL) : (want_max ? fmax(v, o) : fmin(v, o));
  }
  return v;
}

// min / max that return NaN when either is NaN (one instruction from sm_80).
__device__ __forceinline__ float min_or_nan(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return isnan(a) || isnan(b) ? __int_as_float(0x7fffffff) : fminf(a, b);
#endif
}

__device__ __forceinline__ float max_or_nan(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return isnan(a) || isnan(b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}

// Three blocks per SM (at most 80 registers): uncapped, the uint8 kernel takes 96 (two blocks;
// a few bytes spill at 80); the others need 64-76 either way.
template <typename T, int kVec = 16 / sizeof(T)>
__global__ void __launch_bounds__(cuda::kThreads, 3) item_stats_kernel(const T* __restrict__ x,
                                                                    const longlong2* __restrict__ plan,
                                                                    const int64_t* __restrict__ offsets, int64_t m,
                                                                    int64_t planes, double* __restrict__ acc) {
  // 16-byte vectors (4 to 16 elements each), kUnroll in flight per lane (ItemStatsTuning).
  constexpr ItemStatsTuning kTuning = cuda::kPolicy<ItemStatsTuning>;
  constexpr int kUnroll = sizeof(T) >= 4 ? kTuning.unroll_4byte : kTuning.unroll;
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t{gridDim.x} * cuda::kThreads) >> 5;
  const int64_t units = __ldg(&plan[0].x);
  for (int64_t u = (int64_t{blockIdx.x} * cuda::kThreads + threadIdx.x) >> 5; u < units; u += warps) {
    const longlong2 row = __ldg(plan + 1 + u);
    // A block of one item, or a run of small items taken one at a time.
    const bool run = block_is_run(row.y);
    const int64_t first = block_item(row.y), row_begin = row.x, row_end = row_begin + block_length(row.y);
    const int64_t last = run ? min(first + kRunItems, m) : first + 1;
    int64_t next_end = 0;
    // A run's next item's end is requested while this one is summed (its begin is this one's end).
    int64_t begin = __ldg(offsets + first), item_end = __ldg(offsets + first + 1);
    for (int64_t item = first; item < last; ++item, begin = item_end, item_end = next_end) {
      if (run && begin >= row_end) break;
      next_end = item + 1 < last ? __ldg(offsets + item + 2) : 0;
      int64_t g = run ? max(row_begin, begin) : row_begin;
      const int64_t end = run ? min(row_end, item_end) : row_end;
      const int64_t plane = max((item_end - begin) / planes, int64_t{1});  // >= 1 whatever the input
      while (g < end) {  // one piece per channel plane the block touches
        const int64_t c = min((g - begin) / plane, planes - 1);
        const int64_t piece_end = c == planes - 1 ? end : min(end, begin + (c + 1) * plane);
        // Single elements up to the first 16-byte boundary and after the last (fewer than kVec
        // each: at most one per lane); whole vectors (kUnroll in flight per lane) in between.
        // The shift, the single elements and the first vectors are requested together: a
        // small item then costs one round trip to memory, not one per kind of read.
        const int64_t a0 = min(piece_end, (g + kVec - 1) / kVec * kVec);
        const int64_t a1 = max(a0, piece_end / kVec * kVec);
        const T shift = x[begin + c * plane];
        const bool has_head = g + lane < a0, has_tail = a1 + lane < piece_end;
        const T head = has_head ? x[g + lane] : shift, tail = has_tail ? x[a1 + lane] : shift;
        using acc_t = acc_type<T>;
        const double k = static_cast<double>(static_cast<acc_t>(shift));
        double s1 = 0.0, s2 = 0.0;
        // Min, max and NaN in the values' own accumulator type (exact: they only compare): for
        // float32 and narrower one instruction each that also keeps a NaN, where float64 took
        // several (the kernel was bound by its integer/logic pipe on small items).
        acc_t lo_v = std::numeric_limits<acc_t>::infinity(), hi_v = -std::numeric_limits<acc_t>::infinity();
        bool has_nan = false;
        auto add = [&](T value) {
          const acc_t v = static_cast<acc_t>(value);
          const double d = static_cast<double>(v) - k;
          s1 += d;
          s2 = fma(d, d, s2);
          if constexpr (std::is_same_v<acc_t, float>) {
            lo_v = min_or_nan(lo_v, v);
            hi_v = max_or_nan(hi_v, v);
          } else {
            has_nan |= isnan(v);
            lo_v = fmin(lo_v, v);
            hi_v = fmax(hi_v, v);
          }
        };
        for (int64_t base = a0 + int64_t{lane} * kVec, round = 0; base < a1 || round == 0;
             base += int64_t{32} * kVec * kUnroll, ++round) {
          Vec<T, kVec> v[kUnroll];
  #pragma unroll
          for (int j = 0; j < kUnroll; ++j) {
            const int64_t e = base + int64_t{j} * 32 * kVec;
            if (e < a1) v[j] = *reinterpret_cast<const Vec<T, kVec>*>(x + e);
          }
          if (round == 0) {
            if (has_head) add(head);
            if (has_tail) add(tail);
          }
  #pragma unroll
          for (int j = 0; j < kUnroll; ++j) {
            if (base + int64_t{j} * 32 * kVec >= a1) continue;
  #pragma unroll
            for (int q = 0; q < kVec; ++q) add(v[j].v[q]);
          }
        }
        const double nan = __longlong_as_double(0x7ff8000000000000LL);
        double lo = has_nan ? nan : static_cast<double>(lo_v), hi = has_nan ? nan : static_cast<double>(hi_v);
        s1 = warp_sum(s1);
        s2 = warp_sum(s2);
        lo = warp_min_max(lo, false);
        hi = warp_min_max(hi, true);
        if (lane == 0) {
          double* a = acc + (item * planes + c) * kNumStats;
          // A piece that is its whole plane (every plane of items up to a block long) is the
          // plane's only contribution: plain stores, not four atomics (two of them CAS loops
          // of two round trips each to L2).
          const int64_t plane_end = c == planes - 1 ? item_end : begin + (c + 1) * plane;
          const bool whole_plane = g == begin + c * plane && piece_end == plane_end;
          if (whole_plane) {
            a[kStatSum] = s1;
            a[kStatM2] = s2;
            a[kStatMin] = lo;
            a[kStatMax] = hi;
          } else {
            atomicAdd(a + kStatSum, s1);
            atomicAdd(a + kStatM2, s2);
            atomic_min_max(a + kStatMin, lo, false);
            atomic_min_max(a + kStatMax, hi, true);
          }
        }
        g = piece_end;
      }
    }
  }
}

// Every slot's accumulators to the identities (0, 0, +inf, -inf), in one launch (four strided
// fills took 56 us of a million-item call on an H100).
__global__ void item_stats_init(int64_t slots, double* __restrict__ acc) {
  const int64_t slot = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (slot >= slots) return;
  const double inf = std::numeric_limits<double>::infinity();
  reinterpret_cast<double2*>(acc + slot * kNumStats)[0] = make_double2(0.0, 0.0);
  reinterpret_cast<double2*>(acc + slot * kNumStats)[1] = make_double2(inf, -inf);
}

// (S1, S2, min, max) -> (sum, M2, min, max); empty planes keep the identities (0, 0, +inf, -inf).
template <typename T>
__global__ void item_stats_finish(const T* __restrict__ x, const int64_t* __restrict__ offsets, int64_t slots,
                                  int64_t planes, double* __restrict__ acc) {
  const int64_t slot = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (slot >= slots) return;
  const int64_t item = slot / planes, c = slot % planes;
  const int64_t begin = offsets[item];
  const int64_t plane = (offsets[item + 1] - begin) / planes;
  double* a = acc + slot * kNumStats;
  const double nan = __longlong_as_double(0x7ff8000000000000LL);
  if (plane == 0) return;
  const double k = static_cast<double>(static_cast<acc_type<T>>(x[begin + c * plane]));
  const double n = static_cast<double>(plane);
  const double s1 = a[kStatSum], s2 = a[kStatM2];
  a[kStatSum] = s1 + n * k;
  a[kStatM2] = isnan(s2) ? nan : fmax(s2 - s1 * s1 / n, 0.0);
}

at::Tensor item_stats_cuda(const at::Tensor& values, const at::Tensor& offsets, int64_t channels, int64_t block_elems,
                           const c10::optional<at::Tensor>& plan, bool validate) {
  const c10::cuda::CUDAGuard guard(values.device());
  const bool validate_contents = cuda_may_read_host(validate);
  ItemStatsArgs a = prepare_item_stats(values, offsets, channels, block_elems, validate_contents);
  const int64_t m = a.offsets.numel() - 1;
  if (m == 0) return a.out;
  const at::Tensor p = metadata_for(Strategy::Plan, plan, a.offsets, a.values.numel(), a.block_elems, build_plan_cuda);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t slots = m * a.planes;
  const int threads = cuda::launch_threads();
  const auto slot_blocks = static_cast<unsigned>((slots + threads - 1) / threads);
  item_stats_init<<<slot_blocks, threads, 0, stream>>>(slots, a.out.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  dispatch_values_dtype(a.values.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const int64_t max_units = p.size(0) - 1;
    if (max_units > 0 && a.values.numel() > 0) {
      const int64_t warps = cuda::launch_warps_per_block();
      const int64_t blocks = std::min<int64_t>(
          int64_t{cuda::multiprocessor_count()} * cuda::launch_policy<ItemStatsTuning>().blocks_per_sm,
          (max_units + warps - 1) / warps);
      item_stats_kernel<T><<<static_cast<unsigned>(blocks), cuda::launch_threads(), 0, stream>>>(
          a.values.data_ptr<T>(), reinterpret_cast<const longlong2*>(p.data_ptr<int64_t>()),
          a.offsets.data_ptr<int64_t>(), m, a.planes, a.out.data_ptr<double>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    item_stats_finish<T><<<slot_blocks, threads, 0, stream>>>(
        a.values.data_ptr<T>(), a.offsets.data_ptr<int64_t>(), slots, a.planes, a.out.data_ptr<double>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return a.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) { m.impl("item_stats", &item_stats_cuda); }

}  // namespace octopus

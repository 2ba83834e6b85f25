// octopus::tile_stats — CUDA: one launch for every tile. Block (tile, split) sums its share
// of the tile's rows (a warp per row, 16-byte loads, float64 sums) into per-tile
// accumulators; the last block of a tile to finish turns them into the mean, the fraction
// and the keep flag.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "octopus/core/backend_cuda.cuh"
#include "octopus/core/dtypes.h"
#include "octopus/core/tuning_registry.cuh"
#include "octopus/core/vec.h"
#include "octopus/ops/tile_stats.h"

namespace octopus {

// tile_stats' kernel's tuning (core/tuning.h).
struct TileStatsTuning {
  int rows;           // rows a warp has in flight
  int blocks_per_sm;  // blocks per multiprocessor over the whole image (tiles split to get there)
  int max_splits;     // blocks per tile at most (fewer where the image has fewer rows for their warps)

  static constexpr const char* kFamily = "tile_stats";
  // Hopper (sm_90), measured on an H100: one 8192 x 8192 fp32 tile took 0.200 ms in 64 blocks
  // (the earlier cap), 0.100 ms in 1024. Every architecture until it is measured.
  static constexpr TileStatsTuning for_arch(int /*arch*/) { return TileStatsTuning{2, 16, 4096}; }
  template <class Fn>
  void for_each(Fn&& fn) const {
    fn("rows", rows);
    fn("blocks_per_sm", blocks_per_sm);
    fn("max_splits", max_splits);
  }
};
OCTOPUS_REGISTER_TUNING(TileStatsTuning, tile_stats);

namespace {

template <typename T>
__global__ void __launch_bounds__(cuda::kThreads) tile_stats_kernel(
    const T* __restrict__ image, int64_t channels, int64_t height, int64_t width, const int64_t* __restrict__ tiles,
    double threshold, KeepBounds bounds, double* __restrict__ sums, unsigned long long* __restrict__ counts,
    unsigned int* __restrict__ arrived, double* __restrict__ mean, double* __restrict__ fraction,
    bool* __restrict__ keep) {
  const int64_t t = blockIdx.x;
  const int split = blockIdx.y, splits = gridDim.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const TileBox b = tile_box(tiles, t, height, width);
  const int64_t rows = channels * b.h;
  double sum = 0;
  unsigned long long above = 0;
  auto add = [&](T value) {
    const double v = static_cast<double>(value);
    sum += v;
    above += v > threshold;
  };
  auto line_of = [&](int64_t r) {
    const int64_t c = r / b.h, y = r - c * b.h;
    return image + (c * height + b.y0 + y) * width + b.x0;
  };
  // When the image's width is whole vectors, every row of the tile has the first row's
  // alignment: a head of single values up to a 16-byte boundary, whole vectors, a tail of
  // single values.
  constexpr int kV = 16 / sizeof(T);
  using V = Vec<T, kV>;
  const bool vectors = width % kV == 0;
  const int64_t head = vectors ? min(elements_to_vector_boundary(line_of(0)), b.w) : 0;
  const int64_t nv = vectors ? (b.w - head) / kV : 0;
  const int64_t tail = head + nv * kV;
  // A warp per row, kRows rows (a stride apart) at a time so that their loads are in flight together.
  constexpr int kRows = cuda::kPolicy<TileStatsTuning>.rows;
  const int64_t stride = int64_t{splits} * cuda::kWarpsPerBlock;
  for (int64_t r = int64_t{split} * cuda::kWarpsPerBlock + warp; r < rows; r += kRows * stride) {
    const T* line[kRows];
    bool has[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      has[j] = r + j * stride < rows;
      line[j] = has[j] ? line_of(r + j * stride) : image;
      if (!has[j]) continue;
      if (lane < head) add(line[j][lane]);
      for (int64_t x = tail + lane; x < b.w; x += 32) add(line[j][x]);
    }
    for (int64_t x = lane; x < nv; x += 2 * 32) {
      V v[kRows][2];
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (has[j] && x + u * 32 < nv) v[j][u] = *reinterpret_cast<const V*>(line[j] + head + (x + u * 32) * kV);
        }
      }
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (!has[j] || x + u * 32 >= nv) continue;
#pragma unroll
          for (int k = 0; k < kV; ++k) add(v[j][u].v[k]);
        }
      }
    }
  }
  for (int d = 16; d > 0; d >>= 1) {
    sum += __shfl_down_sync(0xffffffffu, sum, d);
    above += __shfl_down_sync(0xffffffffu, above, d);
  }
  __shared__ double warp_sums[cuda::kWarpsPerBlock];
  __shared__ unsigned long long warp_counts[cuda::kWarpsPerBlock];
  if (lane == 0) {
    warp_sums[warp] = sum;
    warp_counts[warp] = above;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < cuda::kWarpsPerBlock; ++w) {
    sum += warp_sums[w];
    above += warp_counts[w];
  }
  atomicAdd(sums + t, sum);
  atomicAdd(counts + t, above);
  __threadfence();  // the sums are visible before this block counts as arrived
  if (atomicAdd(arrived + t, 1u) != static_cast<unsigned>(splits - 1)) return;
  __threadfence();
  const double count = static_cast<double>(rows * b.w);
  const double m = atomicAdd(sums + t, 0.0) / count;
  const double f = static_cast<double>(atomicAdd(counts + t, 0ull)) / count;
  mean[t] = m;
  fraction[t] = f;
  keep[t] = keep_tile(m, f, bounds);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tile_stats_cuda(const at::Tensor& image, const at::Tensor& tiles,
                                                                double threshold, double min_mean, double max_mean,
                                                                double min_fraction, double max_fraction,
                                                                bool validate) {
  const c10::cuda::CUDAGuard guard(image.device());
  const bool validate_contents = cuda_may_read_host(validate);
  TileStatsArgs a =
      prepare_tile_stats(image, tiles, min_mean, max_mean, min_fraction, max_fraction, validate_contents);
  const int64_t num_tiles = a.tiles.size(0);
  if (num_tiles == 0) return {a.mean, a.fraction, a.keep};
  TORCH_CHECK_VALUE(num_tiles < (int64_t{1} << 31), "at most 2^31 - 1 tiles, got ", num_tiles);
  // Accumulators: sum (float64), count above (uint64), blocks arrived (uint32, padded to 64 bits).
  const at::Tensor work = at::zeros({3, num_tiles}, image.options().dtype(at::kLong));
  // Splits per tile: about blocks_per_sm blocks per multiprocessor over the whole image, and
  // no more than a tile's rows (at most the image's) give every warp of them one.
  const TileStatsTuning tuning = cuda::launch_policy<TileStatsTuning>();
  const int64_t warps = cuda::launch_warps_per_block();
  const int64_t most = std::min<int64_t>(tuning.max_splits, (a.channels * a.height + warps - 1) / warps);
  const int64_t splits = std::clamp<int64_t>(
      (int64_t{cuda::multiprocessor_count()} * tuning.blocks_per_sm + num_tiles - 1) / num_tiles, 1, most);
  dispatch_values_dtype(a.image.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    int64_t* w = work.data_ptr<int64_t>();
    tile_stats_kernel<T><<<dim3(static_cast<unsigned>(num_tiles), static_cast<unsigned>(splits)),
                           cuda::launch_threads(), 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.image.data_ptr<T>(), a.channels, a.height, a.width, a.tiles.data_ptr<int64_t>(), threshold, a.bounds,
        reinterpret_cast<double*>(w), reinterpret_cast<unsigned long long*>(w + num_tiles),
        reinterpret_cast<unsigned int*>(w + 2 * num_tiles), a.mean.data_ptr<double>(), a.fraction.data_ptr<double>(),
        a.keep.data_ptr<bool>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {a.mean, a.fraction, a.keep};
}

}  // namespace

TORCH_LIBRARY_IMPL(octopus, CUDA, m) { m.impl("tile_stats", &tile_stats_cuda); }

}  // namespace octopus

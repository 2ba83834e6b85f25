// The generic CUDA driver: one launch runs an element-wise ragged functor over a whole
// batch. Work is cut into units (plan blocks, or fixed tiles of the packed buffer); each
// warp takes units in turn and asks the locator which item(s) a unit holds.
// The locator is a template parameter, so every strategy runs the same functor code.
//
// Functor interface (see ops/item_param_op.h): kVec, InVec, item(i) -> Item, load(g) -> InVec,
// store(Item, g, InVec) for kVec elements of one item at a kVec-aligned g, one(Item, g).
// A functor whose elements depend on their neighbours may also define
// segment(Item, g0, g1, lane): a whole warp takes the elements [g0, g1) of one item at once
// (the locators that hand out such runs — plans and block_search — then call it).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "octopus/core/checks.h"
#include "octopus/core/grid_dependency.h"
#include "octopus/core/per_device.h"
#include "octopus/core/plan.h"
#include "octopus/core/tuning.h"
#include "octopus/scheduler/yield_gate.h"

namespace octopus::cuda {

// Threads per block as device code sees them (core/tuning.h); host code launches with
// launch_threads(), the same value for the code the device runs.
constexpr int kThreads = kPolicy<DriverTuning>.threads;
constexpr int kWarpsPerBlock = kThreads / 32;
// Vectors in flight per lane: the functor's choice (Op::kUnroll, what fits its registers
// without spilling); per-element locators hold an item index per vector, so fewer.
constexpr int kMaxUnrollPerElement = kPolicy<DriverTuning>.max_unroll_per_element;

inline int launch_threads() { return launch_policy<DriverTuning>().threads; }
inline int64_t launch_warps_per_block() { return launch_threads() / 32; }

__host__ __device__ __forceinline__ int64_t clamp_index(int64_t x, int64_t hi) { return x < 0 ? 0 : (x > hi ? hi : x); }

// Item holding element g: the last i with offsets[i] <= g, clamped into [0, m).
__device__ __forceinline__ int64_t find_item(const int64_t* __restrict__ offsets, int64_t m, int64_t g) {
  int64_t lo = 0, hi = m + 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (__ldg(offsets + mid) <= g) lo = mid + 1; else hi = mid;
  }
  return clamp_index(lo - 1, m - 1);
}

template <class Op, class = void>
struct HasSegment : std::false_type {};
template <class Op>
struct HasSegment<Op, std::void_t<decltype(&Op::segment)>> : std::true_type {};

// Functors whose kernel may begin while the kernel before it on the stream still runs
// (programmatic dependent launch, core/grid_dependency.h): Op::kWaitsForPrimary, and op.item()
// calls wait_for_primary() before it reads what that kernel writes. Everything else they read was
// written before that kernel began (it was launched as usual), so their first loads go out
// before the wait (run_segment_loads_first) and its time overlaps theirs and their launch.
template <class Op, class = void>
struct WaitsForPrimary : std::false_type {};
template <class Op>
struct WaitsForPrimary<Op, std::void_t<decltype(Op::kWaitsForPrimary)>> : std::bool_constant<Op::kWaitsForPrimary> {};

// run_segment for functors that wait for the kernel before theirs in op.item()
// (WaitsForPrimary): each lane's first kUnroll vectors are loaded before the item is read, so
// that wait overlaps them; the rest as run_segment.
template <class Op>
__device__ __forceinline__ void run_segment_loads_first(const Op& op, int64_t item, int64_t g0, int64_t g1,
                                                        int lane) {
  constexpr int V = Op::kVec;
  constexpr int kUnroll = Op::kUnroll;
  const int64_t a0 = (g0 + V - 1) / V * V;
  const int64_t a1 = g1 / V * V;
  if (a0 >= a1) {
    const auto it = op.item(item);
    for (int64_t g = g0 + lane; g < g1; g += 32) op.one(it, g);
    return;
  }
  constexpr int64_t kStride = int64_t{32} * V * kUnroll;
  typename Op::InVec x[kUnroll];
  const auto load = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = base + int64_t{u} * 32 * V;
      if (g < a1) x[u] = op.load(g);
    }
  };
  const auto store = [&](const auto& it, int64_t base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = base + int64_t{u} * 32 * V;
      if (g < a1) op.store(it, g, x[u]);
    }
  };
  int64_t base = a0 + int64_t{lane} * V;
  load(base);
  const auto it = op.item(item);
  if (lane < a0 - g0) op.one(it, g0 + lane);
  if (lane < g1 - a1) op.one(it, a1 + lane);
  if (base < a1) store(it, base);
  for (base += kStride; base < a1; base += kStride) {
    load(base);
    store(it, base);
  }
}

// A warp processes the packed elements [g0, g1) of one item: aligned vectors in the
// middle (kUnroll loads in flight per lane), single elements at the two ends — or the
// functor's own segment().
template <class Op>
__device__ __forceinline__ void run_segment(const Op& op, int64_t item, int64_t g0, int64_t g1, int lane) {
  constexpr int V = Op::kVec;
  constexpr int kUnroll = Op::kUnroll;
  if constexpr (WaitsForPrimary<Op>::value && !HasSegment<Op>::value) {
    return run_segment_loads_first(op, item, g0, g1, lane);
  }
  const auto it = op.item(item);
  if constexpr (HasSegment<Op>::value) {
    op.segment(it, g0, g1, lane);
    return;
  }
  const int64_t a0 = (g0 + V - 1) / V * V;
  const int64_t a1 = g1 / V * V;
  if (a0 >= a1) {
    for (int64_t g = g0 + lane; g < g1; g += 32) op.one(it, g);
    return;
  }
  if (lane < a0 - g0) op.one(it, g0 + lane);
  if (lane < g1 - a1) op.one(it, a1 + lane);
  for (int64_t base = a0 + int64_t{lane} * V; base < a1; base += int64_t{32} * V * kUnroll) {
    typename Op::InVec x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = base + int64_t{u} * 32 * V;
      if (g < a1) x[u] = op.load(g);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = base + int64_t{u} * 32 * V;
      if (g < a1) op.store(it, g, x[u]);
    }
  }
}

// A warp processes the tile [t0, t1) (t0 a multiple of kVec) finding the item of every
// vector on its own: loc.find(g) and loc.contains(item, g) are the per-element lookups.
template <class Loc, class Op>
__device__ __forceinline__ void run_tile_per_element(const Loc& loc, const Op& op, int64_t t0, int64_t t1,
                                                     int lane) {
  constexpr int V = Op::kVec;
  constexpr int kUnroll = Op::kUnroll < kMaxUnrollPerElement ? Op::kUnroll : kMaxUnrollPerElement;
  const int64_t a1 = t0 + (t1 - t0) / V * V;
  for (int64_t base = t0 + int64_t{lane} * V; base < a1; base += int64_t{32} * V * kUnroll) {
    typename Op::InVec x[kUnroll];
    int64_t items[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = base + int64_t{u} * 32 * V;
      if (g < a1) {
        items[u] = loc.find(g);
        x[u] = op.load(g);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = base + int64_t{u} * 32 * V;
      if (g >= a1) continue;
      if (loc.contains(items[u], g + V - 1)) {
        op.store(op.item(items[u]), g, x[u]);
      } else {  // the vector straddles items
        for (int k = 0; k < V; ++k) op.one(op.item(loc.find(g + k)), g + k);
      }
    }
  }
  for (int64_t g = a1 + lane; g < t1; g += 32) op.one(op.item(loc.find(g)), g);
}

// The lane among `start` (each lane's item start, non-decreasing over the lanes) of the last
// item that starts at or before x; lane 0 where none does. Every lane of the warp must call it.
__device__ __forceinline__ int run_lane_of(int start, int x) {
  int lane = 0;
#pragma unroll
  for (int step = 16; step > 0; step >>= 1) {
    if (__shfl_sync(0xffffffffu, start, lane + step) <= x) lane += step;
  }
  return lane;
}

// Whether a functor's runs are taken one item at a time: functors with segment(), and those
// that say Op::kLanesFindItems = false (their items are never small, e.g. latents and crops,
// and the lane search's registers would only make the kernel spill).
template <class Op, class = void>
struct LanesFindItems : std::bool_constant<!HasSegment<Op>::value> {};
template <class Op>
struct LanesFindItems<Op, std::void_t<decltype(Op::kLanesFindItems)>>
    : std::bool_constant<!HasSegment<Op>::value && Op::kLanesFindItems> {};

// A warp processes a run of whole small items: the packed elements [g0, g1) of items first,
// first + 1, ... (at most kRunItems of them). Lane l holds item first + l's start, and
// every vector finds its item among the lanes with five shuffles; kRunUnroll vectors are in
// flight per lane across item boundaries, where a block per item had one item's few
// elements. Positions are int32 from g0 (a run is at most a block row's 2^31 - 1 elements),
// which keeps the path within the driver's register budget.
constexpr int kRunUnroll = 2;

template <class Op>
__device__ __forceinline__ void run_items(const Op& op, const int64_t* __restrict__ offsets, int64_t m,
                                          int64_t first, int64_t g0, int64_t g1, int lane) {
  constexpr int V = Op::kVec;
  const int n = static_cast<int>(g1 - g0);
  // Lanes past the batch's last item start nowhere; an item ends where the next lane's starts.
  const int start = first + lane < m ? static_cast<int>(clamp_index(__ldg(offsets + first + lane) - g0, n)) : INT_MAX;
  const int next = __shfl_down_sync(0xffffffffu, start, 1);  // every lane takes part
  const int stop = lane < 31 ? min(next, n) : n;
  const auto item_at = [&](int l) { return op.item(clamp_index(first + l, m - 1)); };
  // Single elements (every lane calls run_lane_of, so the loops' trip counts are the warp's).
  const auto singles = [&](int b, int e) {
    for (int w = b; w < e; w += 32) {
      const int x = w + lane;
      const int l = run_lane_of(start, min(x, e - 1));
      if (x < e) op.one(item_at(l), g0 + x);
    }
  };
  // Vectors where g0 + x is a multiple of V: x in [a0, a1).
  const int a0 = static_cast<int>((g0 + V - 1) / V * V - g0), a1 = static_cast<int>(g1 / V * V - g0);
  if (a0 >= a1) return singles(0, n);
  singles(0, a0);
  singles(a1, n);
  for (int w = a0; w < a1; w += 32 * V * kRunUnroll) {
    typename Op::InVec v[kRunUnroll];
#pragma unroll
    for (int u = 0; u < kRunUnroll; ++u) {
      const int x = w + (u * 32 + lane) * V;
      if (x < a1) v[u] = op.load(g0 + x);
    }
#pragma unroll
    for (int u = 0; u < kRunUnroll; ++u) {
      const int x = w + (u * 32 + lane) * V;
      const int l = run_lane_of(start, min(x, a1 - 1));
      const bool whole = __shfl_sync(0xffffffffu, stop, l) >= x + V;
      if (x < a1 && whole) op.store(item_at(l), g0 + x, v[u]);
      // A vector across items: its elements one at a time, each finding its own item.
      if (__any_sync(0xffffffffu, x < a1 && !whole)) {
#pragma unroll 1
        for (int k = 0; k < V; ++k) {
          const int lk = run_lane_of(start, min(x + k, a1 - 1));
          if (x < a1 && !whole) op.one(item_at(lk), g0 + x + k);
        }
      }
    }
  }
}

// A warp processes the packed elements [g0, g1) item by item from `item`: one item's block,
// or a run walked (functors whose lanes do not search runs: with one run_segment call site,
// the walk adds few registers to functors that have the most of them live).
template <class Op>
__device__ __forceinline__ void walk_items(const Op& op, const int64_t* __restrict__ offsets, int64_t m, int64_t item,
                                           int64_t g0, int64_t g1, bool run, int lane) {
  for (int64_t g = g0; g < g1; ++item) {
    const int64_t e = run && item + 1 < m ? min(g1, max(g, __ldg(offsets + item + 1))) : g1;
    if (g < e) run_segment(op, item, g, e, lane);
    g = e;
  }
}

// `plan` and `plan_host`: unit j is plan block j; one 16-byte load says where it is.
struct PlanLocator {
  const longlong2* __restrict__ rows;  // row 0: (count, block_elems)
  const int64_t* __restrict__ offsets;
  int64_t m;
  using Unit = longlong2;
  __device__ __forceinline__ int64_t num_units() const { return __ldg(&rows[0].x); }
  __device__ __forceinline__ Unit unit(int64_t u) const { return __ldg(rows + 1 + u); }
  template <class Op>
  __device__ __forceinline__ void visit(const Op& op, const Unit& r, int lane) const {
    const int64_t g0 = r.x, g1 = r.x + block_length(r.y);
    if constexpr (LanesFindItems<Op>::value) {
      if (block_is_run(r.y)) run_items(op, offsets, m, block_item(r.y), g0, g1, lane);
      else run_segment(op, block_item(r.y), g0, g1, lane);
    } else {
      walk_items(op, offsets, m, block_item(r.y), g0, g1, block_is_run(r.y), lane);
    }
  }
};

// Units are fixed tiles of the packed buffer.
struct TileUnits {
  using Unit = int64_t;
  int64_t num_values, tile, tiles;
  __device__ __forceinline__ int64_t num_units() const { return tiles; }
  __device__ __forceinline__ Unit unit(int64_t u) const { return u; }
  __device__ __forceinline__ int64_t begin(int64_t u) const { return u * tile; }
  __device__ __forceinline__ int64_t end(int64_t u) const { return min(u * tile + tile, num_values); }
};

// `block_search`: a warp searches the offsets once for its tile's first item, then walks.
struct BlockSearchLocator : TileUnits {
  const int64_t* __restrict__ offsets;
  int64_t m;
  template <class Op>
  __device__ __forceinline__ void visit(const Op& op, int64_t u, int lane) const {
    const int64_t t0 = begin(u), t1 = end(u);
    for (int64_t i = find_item(offsets, m, t0); i < m; ++i) {
      const int64_t b = max(t0, __ldg(offsets + i));
      if (b >= t1) break;
      const int64_t e = min(t1, __ldg(offsets + i + 1));
      if (b < e) run_segment(op, i, b, e, lane);
    }
  }
};

// `search`: every vector binary-searches the offsets for its item.
struct SearchLocator : TileUnits {
  const int64_t* __restrict__ offsets;
  int64_t m;
  __device__ __forceinline__ int64_t find(int64_t g) const { return find_item(offsets, m, g); }
  __device__ __forceinline__ bool contains(int64_t item, int64_t g) const { return g < __ldg(offsets + item + 1); }
  template <class Op>
  __device__ __forceinline__ void visit(const Op& op, int64_t u, int lane) const {
    run_tile_per_element(*this, op, begin(u), end(u), lane);
  }
};

// `lookup`: every element's item id is read from a table of N entries.
struct LookupLocator : TileUnits {
  const int32_t* __restrict__ ids;
  int64_t m;
  __device__ __forceinline__ int64_t find(int64_t g) const { return clamp_index(__ldg(ids + g), m - 1); }
  __device__ __forceinline__ bool contains(int64_t item, int64_t g) const { return find(g) == item; }
  template <class Op>
  __device__ __forceinline__ void visit(const Op& op, int64_t u, int lane) const {
    run_tile_per_element(*this, op, begin(u), end(u), lane);
  }
};

// Blocks per multiprocessor the kernel is compiled for (which caps its registers): the
// driver's tuning for the locator, or the functor's Op::kMinBlocksPerSm when it needs more
// registers.
template <class Loc, class Op, class = void>
struct MinBlocksPerSm {
  static constexpr int value = std::is_same_v<Loc, PlanLocator> ? kPolicy<DriverTuning>.plan_min_blocks_per_sm
                                                                 : kPolicy<DriverTuning>.min_blocks_per_sm;
};
template <class Loc, class Op>
struct MinBlocksPerSm<Loc, Op, std::void_t<decltype(Op::kMinBlocksPerSm)>> {
  static constexpr int value = Op::kMinBlocksPerSm;
};

template <class Loc, class Op>
__global__ void __launch_bounds__(kThreads, MinBlocksPerSm<Loc, Op>::value) ragged_kernel(const Loc loc, const Op op) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (int64_t{blockIdx.x} * kThreads + threadIdx.x) >> 5;
  const int64_t warps = (int64_t{gridDim.x} * kThreads) >> 5;
  const int64_t units = loc.num_units();
  if (warp >= units) return;
  // The next unit's description is fetched while this one is processed.
  typename Loc::Unit current = loc.unit(warp);
  for (int64_t u = warp; u < units; u += warps) {
    const typename Loc::Unit next = u + warps < units ? loc.unit(u + warps) : current;
    loc.visit(op, current, lane);
    current = next;
  }
}

// Yielding launches. On a best-effort stream of a StreamScheduler whose device yields now
// (scheduler/yield_gate.h), the grid claims units from a counter instead of striding over
// them, and a warp reads the device's gate before each claim: while a latency-critical lease
// holds it closed the warp stops (after the unit it has) and the kernel ends early. A one-warp
// kernel then waits on the stream for the gate to open (for at most the scheduler's bound; a
// launch whose wait ran out waits no more: scheduler/yield_gate.h says why), and the next link,
// the same kernel again, claims the units left. The last link never yields, so the launch's
// work is done when its last link ends, whatever the gate did: stream order is kept, and each
// unit is processed once, by the same code, so results are those of an ordinary launch, bit
// for bit. Units are independent in every functor the driver runs (element-wise, or a
// segment of one item), so the order in which warps claim them does not matter.
struct YieldClaims {
  unsigned long long* next;  // the next unit to claim (every link of a launch shares it)
  int* claimed_all;          // set once a warp found every unit claimed (later links are no-ops)
  int* waits_over;           // set once a wait ran out (later waits return at once)
  const uint32_t* gate;      // the gate's words; null: this link never yields
  int gate_words;
};

// The largest share of warps (of scheduler::kYieldAll) the gate asks to yield; 0: open.
__device__ __forceinline__ uint32_t gate_share(const uint32_t* words, int count) {
  uint32_t share = 0;
  for (int i = 0; i < count; ++i) share = max(share, *reinterpret_cast<const volatile uint32_t*>(words + i));
  return share;
}

// A warp's rank among the yield shares, in [0, kYieldAll): it yields while the share is above it.
__device__ __forceinline__ uint32_t yield_rank(int64_t warp) {
  static_assert(scheduler::kYieldAll == 1024, "the rank is the top 10 bits of a hash");
  return static_cast<uint32_t>((static_cast<uint64_t>(warp) * 0x9E3779B97F4A7C15ull) >> 54);
}

template <class Loc, class Op>
__global__ void __launch_bounds__(kThreads, MinBlocksPerSm<Loc, Op>::value)
    ragged_claiming_kernel(const Loc loc, const Op op, const YieldClaims c) {
  const int lane = threadIdx.x & 31;
  const uint32_t rank = yield_rank((int64_t{blockIdx.x} * kThreads + threadIdx.x) >> 5);
  const int64_t units = loc.num_units();
  // A link after the work is all claimed ends at once, without an atomic per warp on one word.
  if (*reinterpret_cast<const volatile int*>(c.claimed_all) != 0) return;
  while (true) {
    long long u = -1;  // -1: yield
    if (lane == 0 && (c.gate == nullptr || gate_share(c.gate, c.gate_words) <= rank)) {
      u = static_cast<long long>(atomicAdd(c.next, 1ull));
    }
    u = __shfl_sync(0xffffffffu, u, 0);
    if (u < 0) return;
    if (u >= units) {
      if (lane == 0) *reinterpret_cast<volatile int*>(c.claimed_all) = 1;
      return;
    }
    loc.visit(op, loc.unit(u), lane);
  }
}

// Between two links: a one-warp kernel that waits while the gate is closed to every warp and
// units are left to claim, for at most max_wait_ns of the device's clock, unless an earlier
// wait of the launch ran out (yield_wait.cu).
void launch_yield_wait(const YieldClaims& claims, unsigned long long max_wait_ns, cudaStream_t stream);

// Which launches may yield: the locators `auto` chooses among, and functors that do not say
// Op::kYieldsOnDevice = false (the sampler step: its launches are not best-effort work).
template <class Op, class = void>
struct OpYields : std::true_type {};
template <class Op>
struct OpYields<Op, std::void_t<decltype(Op::kYieldsOnDevice)>> : std::bool_constant<Op::kYieldsOnDevice> {};
template <class Loc, class Op>
constexpr bool kMayYield =
    (std::is_same_v<Loc, PlanLocator> || std::is_same_v<Loc, BlockSearchLocator>)&&OpYields<Op>::value;

// A launch yields where each warp has at least this many rounds of units (shorter work ends
// before a yield would help), with a link per kRoundsPerLink rounds (plus the last, which never
// yields). A round of 4096-element float32 units takes about 20 us on an H200, so a launch can
// yield about once per 0.16 ms of its work; links that find nothing left cost little (a
// 500M-element affine with no latency-critical lease: +0.3%, benchmarks/yield_cost.py).
constexpr int64_t kYieldMinRounds = 2;
constexpr int64_t kRoundsPerLink = 8;
constexpr int64_t kMaxLinks = 64;

// The device's gate where the current stream is a best-effort stream that yields now, and the
// launch is not being captured (a graph replays without the scheduler); null otherwise.
inline std::shared_ptr<scheduler::YieldGateState> yielding_gate(cudaStream_t stream) {
  std::shared_ptr<scheduler::YieldGateState> state = scheduler::yielding_gate(stream);
  if (!state) return state;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  return state;
}

template <class Loc, class Op>
void launch_yielding(const Loc& loc, const Op& op, int64_t blocks, int64_t rounds, const scheduler::YieldGate& gate,
                     double max_wait_s, cudaStream_t stream) {
  // The claim counter and the two flags, from the caching allocator (stream-ordered: the block
  // is reused only by work queued after these links).
  const at::Tensor claims = at::empty({3}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA, c10::cuda::current_device()));
  C10_CUDA_CHECK(cudaMemsetAsync(claims.data_ptr(), 0, 3 * sizeof(int64_t), stream));
  int64_t* words = claims.data_ptr<int64_t>();
  const YieldClaims c{reinterpret_cast<unsigned long long*>(words), reinterpret_cast<int*>(words + 1),
                      reinterpret_cast<int*>(words + 2), gate.words, gate.count};
  const int64_t links = std::clamp<int64_t>(rounds / kRoundsPerLink, 1, kMaxLinks) + 1;
  const auto wait_ns = static_cast<unsigned long long>(std::max(0.0, max_wait_s) * 1e9);
  for (int64_t link = 0; link < links; ++link) {
    if (link > 0) launch_yield_wait(c, wait_ns, stream);
    YieldClaims this_link = c;
    if (link + 1 == links) this_link.gate = nullptr;
    ragged_claiming_kernel<Loc, Op><<<static_cast<unsigned>(blocks), launch_threads(), 0, stream>>>(loc, op, this_link);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// Multiprocessors of the current device, read once per device.
inline int multiprocessor_count() {
  static PerDevice<int> counts;
  return counts.get([](int device) {
    int count = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  });
}

// Blocks of the driver's kernel for (Loc, Op) that fit on one multiprocessor of the current
// device (its architecture's code and registers), read once per device.
template <class Loc, class Op>
int max_blocks_per_sm() {
  static PerDevice<int> blocks_per_sm;
  return blocks_per_sm.get([](int) {
    int blocks = 0;
    C10_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, ragged_kernel<Loc, Op>, launch_threads(), 0));
    return std::max(blocks, 1);
  });
}

// Launches a block per threads / 32 units (a unit per warp), at most DriverTuning::grid_waves
// times as many blocks as fit on the device at once (`max_units` is an upper bound known on
// the host): the hardware hands a block to whichever SM frees one first. A yielding launch is
// a persistent grid (one wave), whose warps claim units.
template <class Loc, class Op>
void launch_ragged(const Loc& loc, const Op& op, int64_t max_units) {
  if (max_units <= 0) return;
  const int64_t resident = int64_t{multiprocessor_count()} * max_blocks_per_sm<Loc, Op>();
  const int64_t warps = launch_warps_per_block();
  const int64_t needed = std::min<int64_t>((max_units + warps - 1) / warps, INT_MAX);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if constexpr (kMayYield<Loc, Op>) {
    const int64_t persistent = std::min(resident, needed);
    const int64_t rounds = max_units / (persistent * warps);
    if (rounds >= kYieldMinRounds) {
      if (const auto gate = yielding_gate(stream)) {
        gate->launches.fetch_add(1, std::memory_order_relaxed);
        return launch_yielding(loc, op, persistent, rounds, gate->gate,
                               gate->max_wait_s.load(std::memory_order_relaxed), stream);
      }
    }
  }
  const int64_t blocks = std::min(resident * launch_policy<DriverTuning>().grid_waves, needed);
  if constexpr (WaitsForPrimary<Op>::value) {
    if (launch_arch() >= 900) {
      cudaLaunchAttribute overlap{};
      overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      overlap.val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(static_cast<unsigned>(blocks));
      config.blockDim = dim3(static_cast<unsigned>(launch_threads()));
      config.stream = stream;
      config.attrs = &overlap;
      config.numAttrs = 1;
      C10_CUDA_CHECK(cudaLaunchKernelEx(&config, ragged_kernel<Loc, Op>, loc, op));
      return;
    }
  }
  ragged_kernel<Loc, Op><<<static_cast<unsigned>(blocks), launch_threads(), 0, stream>>>(loc, op);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Runs `op` over the batch with the locator of `strategy`; `metadata` is what the
// strategy consumes (a plan, a lookup table, or nothing).
template <class Op>
void run_ragged_cuda(const Op& op, Strategy strategy, const at::Tensor& offsets, int64_t num_values,
                     int64_t block_elems, const at::Tensor& metadata) {
  const int64_t m = offsets.numel() - 1;
  if (num_values == 0 || m == 0) return;
  const TileUnits tiles{num_values, block_elems, (num_values + block_elems - 1) / block_elems};
  const int64_t* off = offsets.data_ptr<int64_t>();
  switch (strategy) {
    case Strategy::Plan:
    case Strategy::PlanHost:
      return launch_ragged(PlanLocator{reinterpret_cast<const longlong2*>(metadata.data_ptr<int64_t>()), off, m}, op,
                           metadata.size(0) - 1);
    case Strategy::BlockSearch:
      return launch_ragged(BlockSearchLocator{tiles, off, m}, op, tiles.tiles);
    case Strategy::Search:
      return launch_ragged(SearchLocator{tiles, off, m}, op, tiles.tiles);
    case Strategy::Lookup:
      return launch_ragged(LookupLocator{tiles, metadata.data_ptr<int32_t>(), m}, op, tiles.tiles);
  }
}

}  // namespace octopus::cuda

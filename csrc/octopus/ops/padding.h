// Ragged <-> padded conversion. to_padded writes a dense [M, *max_shape] tensor, each item
// in its leading corner and pad_value elsewhere (items larger than max_shape are cropped);
// from_padded reads the items back out of such a tensor. from_padded is a ragged functor
// run by the generic drivers (every strategy); to_padded's work is the dense output, so
// its kernels walk output rows and need no item locator.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <cstdint>

#include "octopus/core/checks.h"
#include "octopus/core/dtypes.h"
#include "octopus/core/metadata.h"
#include "octopus/core/plan.h"
#include "octopus/core/tuning.h"
#include "octopus/core/vec.h"

namespace octopus {

// to_padded (ops/padding.cu) and from_padded's (below) tuning (core/tuning.h).
struct PaddingTuning {
  int to_padded_unroll;         // vectors in flight per lane
  int to_padded_chunk;          // output elements per warp task (a multiple of every vector width)
  int to_padded_blocks_per_sm;  // blocks per multiprocessor launched
  int from_padded_unroll;       // vectors in flight per lane
  int from_padded_gather;       // elements a lane gathers per turn of its row cursor

  static constexpr const char* kFamily = "padding";
  // Hopper (sm_90), measured on an H100; every architecture until it is measured.
  static constexpr PaddingTuning for_arch(int /*arch*/) { return PaddingTuning{4, 4096, 8, 2, 16}; }
  template <class Fn>
  void for_each(Fn&& fn) const {
    fn("to_padded_unroll", to_padded_unroll);
    fn("to_padded_chunk", to_padded_chunk);
    fn("to_padded_blocks_per_sm", to_padded_blocks_per_sm);
    fn("from_padded_unroll", from_padded_unroll);
    fn("from_padded_gather", from_padded_gather);
  }
  constexpr bool valid() const { return to_padded_chunk % 16 == 0; }  // whole vectors of every element size
};
static_assert(PaddingTuning::for_arch(900).valid());

constexpr int kMaxItemDims = 4;

// The shape of one dense slot ([*max_shape]) and its row-major strides.
struct DenseSlot {
  int dims;
  int64_t extent[kMaxItemDims];
  int64_t stride[kMaxItemDims];
  int64_t numel;
};

// Item shapes are read per item from `sizes` [M, dims]; a degenerate extent reads as 1 so
// that unvalidated input can never divide by zero or index out of bounds.
OCTOPUS_HD int64_t item_extent(const int64_t* sizes, int64_t i, int dims, int k) {
  const int64_t e = sizes[i * dims + k];
  return e > 0 ? e : 1;
}

// values[g] = padded[item][coords of g in the item], 0 where the item is larger than the slot.
template <typename T>
struct FromPaddedOp {
  static constexpr int kVec = 16 / sizeof(T);
  static constexpr int kUnroll = cuda::kPolicy<PaddingTuning>.from_padded_unroll;
  using InVec = Vec<T, kVec>;  // nothing is read from the packed buffer

  const T* __restrict__ padded;
  T* __restrict__ out;
  const int64_t* __restrict__ offsets;
  const int64_t* __restrict__ sizes;
  int64_t num_values;
  DenseSlot slot;

  struct Item {
    int64_t begin;
    int64_t base;  // the item's slot in `padded`
    int64_t extent[kMaxItemDims];
  };

  OCTOPUS_HD Item item(int64_t i) const {
    Item it{};
    const int64_t o = offsets[i];
    it.begin = o < 0 ? 0 : (o > num_values ? num_values : o);
    it.base = i * slot.numel;
    // Constant indices (a runtime bound would put extent[] in local memory on the GPU).
#pragma unroll
    for (int k = 0; k < kMaxItemDims; ++k) {
      if (k < slot.dims) it.extent[k] = item_extent(sizes, i, slot.dims, k);
    }
    return it;
  }

  OCTOPUS_HD InVec load(int64_t) const { return InVec{}; }

  // kVec consecutive elements of one item: coordinates of the first, then stepped.
  OCTOPUS_HD void store(const Item& it, int64_t g, const InVec&) const {
    int64_t coord[kMaxItemDims];
    coordinates(it, g - it.begin, coord);
    InVec r;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      r.v[k] = at_coords(it, coord);
      for (int d = slot.dims - 1; d >= 0; --d) {  // the next element in row-major order
        if (++coord[d] < it.extent[d] || d == 0) break;
        coord[d] = 0;
      }
    }
    store_vec(out + g, r);
  }

  OCTOPUS_HD void one(const Item& it, int64_t g) const {
    int64_t coord[kMaxItemDims];
    coordinates(it, g - it.begin, coord);
    out[g] = at_coords(it, coord);
  }

#ifdef __CUDACC__
  // The GPU driver's plan and block_search runs: lane l gathers elements g0 + l, g0 + l + 32,
  // ... of the run, kGather at a time (every slot position first, then the loads, then the
  // coalesced stores). A cursor holds the lane's place in the item — column x of a row and
  // that row's start in the slot — and steps by 32 elements with additions (a row change
  // carries into the outer coordinates): no division per element. 32-bit columns where the
  // rows allow them. The item's number of dimensions is a template argument: with a runtime
  // count the coordinates were indexed by a variable and lived in local memory, the
  // cursor's carries with them (a 224-byte stack frame).
  static constexpr int kGather = cuda::kPolicy<PaddingTuning>.from_padded_gather;

  __device__ void segment(const Item& it, int64_t g0, int64_t g1, int lane) const {
    switch (slot.dims) {
      case 1: return segment_of<1>(it, g0, g1, lane);
      case 2: return segment_of<2>(it, g0, g1, lane);
      case 3: return segment_of<3>(it, g0, g1, lane);
      default: return segment_of<4>(it, g0, g1, lane);
    }
  }

  template <int kDims>
  __device__ void segment_of(const Item& it, int64_t g0, int64_t g1, int lane) const {
    const int64_t width = it.extent[kDims - 1];
    if (width < (int64_t{1} << 31) - 64 && slot.extent[kDims - 1] < (int64_t{1} << 31)) {
      gather_run<uint32_t, kDims>(it, g0, g1, lane);
    } else {
      gather_run<int64_t, kDims>(it, g0, g1, lane);
    }
  }

  template <typename Column, int kDims>
  __device__ void gather_run(const Item& it, int64_t g0, int64_t g1, int lane) const {
    if (g0 + lane >= g1) return;
    constexpr int inner = kDims - 1;
    const Column width = static_cast<Column>(it.extent[inner]), slot_width = static_cast<Column>(slot.extent[inner]);
    int64_t coord[kDims];
    coordinates<kDims>(it, g0 + lane - it.begin, coord);
    Column x = static_cast<Column>(coord[inner]);
    const T* row = padded + it.base;  // the slot's row holding the cursor's row
    bool row_in_slot = true;          // false where an outer coordinate is past the slot
#pragma unroll
    for (int d = 0; d < inner; ++d) {
      row += coord[d] * slot.stride[d];
      row_in_slot = row_in_slot && coord[d] < slot.extent[d];
    }
    for (int64_t g = g0 + lane; g < g1; g += 32 * kGather) {
      T v[kGather];
#pragma unroll
      for (int k = 0; k < kGather; ++k) {
        v[k] = row_in_slot && x < slot_width && g + 32 * k < g1 ? row[x] : T{};
        x += 32;
        while (x >= width) {  // into the next row: carry into the outer coordinates
          x -= width;
#pragma unroll
          for (int d = inner - 1; d >= 0; --d) {
            ++coord[d];
            row += slot.stride[d];
            if (coord[d] < it.extent[d] || d == 0) break;
            row -= coord[d] * slot.stride[d];
            coord[d] = 0;
          }
          row_in_slot = true;
#pragma unroll
          for (int d = 0; d < inner; ++d) row_in_slot = row_in_slot && coord[d] < slot.extent[d];
        }
      }
#pragma unroll
      for (int k = 0; k < kGather; ++k) {
        if (g + 32 * k < g1) out[g + 32 * k] = v[k];
      }
    }
  }
#endif

 private:
  // The coordinates of the item's element `local`, for kDims dimensions where the caller
  // knows them (fixed indices keep coord[] in registers).
  template <int kDims = kMaxItemDims>
  OCTOPUS_HD void coordinates(const Item& it, int64_t local, int64_t* coord) const {
#pragma unroll
    for (int d = kDims - 1; d >= 0; --d) {
      if (d >= slot.dims) continue;
      const int64_t e = it.extent[d];
      const int64_t q = (local >> 31) == 0 && (e >> 31) == 0
                            ? static_cast<int64_t>(static_cast<uint32_t>(local) / static_cast<uint32_t>(e))
                            : local / e;
      coord[d] = local - q * e;
      local = q;
    }
  }

  OCTOPUS_HD T at_coords(const Item& it, const int64_t* coord) const {
    int64_t index = it.base;
    for (int d = 0; d < slot.dims; ++d) {
      if (coord[d] >= slot.extent[d]) return T{};
      index += coord[d] * slot.stride[d];
    }
    return padded[index];
  }
};

// Checked arguments of to_padded / from_padded.
struct PaddingArgs {
  at::Tensor values, offsets, sizes, padded, out;
  DenseSlot slot;
  Strategy strategy;
  int64_t block_elems;
};

// `values` ragged -> `out` [M, *max_shape]; validate_contents also checks the layout
// (offsets and sizes agree; one host copy).
PaddingArgs prepare_to_padded(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                              c10::IntArrayRef max_shape, bool validate_contents);

// `padded` [M, *slot] -> `out` ragged of num_values elements; validate_contents checks the
// layout, check_fit that every item fits its slot (each one host copy).
PaddingArgs prepare_from_padded(const at::Tensor& padded, const at::Tensor& offsets, const at::Tensor& sizes,
                                int64_t num_values, c10::string_view strategy, int64_t block_elems,
                                bool validate_contents, bool check_fit);

// octopus::from_padded, the body of every backend's entry point. The layout is checked where
// the backend may read it on the host (always on the CPU); `validate` adds that every item
// fits its slot (without, its elements outside the slot read as 0).
template <class Backend>
at::Tensor from_padded(const at::Tensor& padded, const at::Tensor& offsets, const at::Tensor& sizes,
                       int64_t num_values, c10::string_view strategy, int64_t block_elems,
                       const c10::optional<at::Tensor>& metadata, bool validate) {
  const typename Backend::Guard guard(padded.device());
  const bool layout = Backend::may_read_host(validate);
  PaddingArgs a = prepare_from_padded(padded, offsets, sizes, num_values, strategy, block_elems, layout,
                                      validate && layout);
  const at::Tensor meta = metadata_for(a.strategy, metadata, a.offsets, num_values, a.block_elems, Backend::build_plan);
  dispatch_copy_dtype(a.padded.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const FromPaddedOp<T> op{a.padded.template data_ptr<T>(), a.out.template data_ptr<T>(),
                             a.offsets.template data_ptr<int64_t>(), a.sizes.template data_ptr<int64_t>(), num_values,
                             a.slot};
    Backend::run(op, a.strategy, a.offsets, num_values, a.block_elems, meta);
  });
  return a.out;
}

// to_padded's CPU kernel (padding.cpp), registered in schemas.cpp.
at::Tensor to_padded_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                         c10::IntArrayRef max_shape, double pad_value, bool validate);

}  // namespace octopus

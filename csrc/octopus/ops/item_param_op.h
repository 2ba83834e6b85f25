// The functor of every element-wise op with two per-item parameters:
// out[g] = Fn::apply(values[g], a[item], b[item]), with a/b per item ([M]) or per item and
// channel ([M, C], each item being C equal contiguous planes, as [C, H, W] images are).
// Affine (x * scale + bias), clamp, threshold and power are its Fn's (ops/item_param_fns.h).
// Run by the generic drivers (core/driver_cpu.h, core/driver_cuda.cuh); it knows nothing of
// how items are found.
#pragma once

#include <cstdint>

#include "octopus/core/plan.h"
#include "octopus/core/tuning.h"
#include "octopus/core/vec.h"

namespace octopus {

// affine, clamp, threshold, power's tuning (core/tuning.h): vectors in flight per lane.
struct ItemParamTuning {
  int unroll_uint8;           // uint8 input widens to 64 output bytes per vector
  int unroll_4byte_per_item;  // 4-byte elements, one parameter pair per item
  int unroll;                 // the rest (the per-channel form keeps a channel cursor)

  static constexpr const char* kFamily = "item_param";
  // Hopper (sm_90), measured on an H100 (the register reports at 64 registers: the per-item
  // forms do not spill); every architecture until it is measured.
  static constexpr ItemParamTuning for_arch(int /*arch*/) { return ItemParamTuning{2, 8, 4}; }
  template <class Fn>
  void for_each(Fn&& fn) const {
    fn("unroll_uint8", unroll_uint8);
    fn("unroll_4byte_per_item", unroll_4byte_per_item);
    fn("unroll", unroll);
  }
};

template <typename in_t, typename out_t, typename acc_t, bool kPerChannel, class Fn>
struct ItemParamOp {
  static constexpr int kVec = 16 / sizeof(in_t);
  // Vectors in flight per lane: uint8 widens to 64 output bytes per vector
  // and the per-channel form keeps a channel cursor, so they get fewer.
  static constexpr ItemParamTuning kTuning = cuda::kPolicy<ItemParamTuning>;
  static constexpr int kUnroll = sizeof(in_t) == 1                   ? kTuning.unroll_uint8
                                 : sizeof(in_t) == 4 && !kPerChannel ? kTuning.unroll_4byte_per_item
                                                                     : kTuning.unroll;
  using InVec = Vec<in_t, kVec>;
  using OutVec = Vec<out_t, kVec>;

  const in_t* __restrict__ in;
  out_t* __restrict__ out;
  const acc_t* __restrict__ scale;  // the parameters a and b (affine's scale and bias)
  const acc_t* __restrict__ bias;
  const int64_t* __restrict__ offsets;
  int64_t num_values;
  int64_t channels;  // per-channel form only

  // What the op needs of one item, loaded once per run of its elements.
  struct Item {
    acc_t scale, bias;                            // per item
    const acc_t* __restrict__ scales;             // per channel: this item's C parameters
    const acc_t* __restrict__ biases;
    int64_t begin;                                // per channel: first element and plane size
    int64_t plane;
  };

  OCTOPUS_HD Item item(int64_t i) const {
    Item it{};
    if constexpr (kPerChannel) {
      // Offsets are clamped so that unvalidated input can never index out of bounds.
      const int64_t begin = clamp_offset(offsets[i]);
      const int64_t end = clamp_offset(offsets[i + 1]);
      it.scales = scale + i * channels;
      it.biases = bias + i * channels;
      it.begin = begin;
      it.plane = end > begin ? (end - begin) / channels : 1;
      if (it.plane == 0) it.plane = 1;
    } else {
      it.scale = scale[i];
      it.bias = bias[i];
    }
    return it;
  }

  OCTOPUS_HD InVec load(int64_t g) const { return *reinterpret_cast<const InVec*>(in + g); }

  // kVec elements starting at g (a multiple of kVec), all in one item.
  OCTOPUS_HD void store(const Item& it, int64_t g, const InVec& x) const {
    OutVec r;
    if constexpr (kPerChannel) {
      int64_t c = channel_of(it, g);
      int64_t next = it.begin + (c + 1) * it.plane;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (g + k >= next && c < channels - 1) {
          ++c;
          next += it.plane;
        }
        r.v[k] = static_cast<out_t>(Fn::apply(static_cast<acc_t>(x.v[k]), it.scales[c], it.biases[c]));
      }
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) r.v[k] = static_cast<out_t>(Fn::apply(static_cast<acc_t>(x.v[k]), it.scale, it.bias));
    }
    store_vec(out + g, r);
  }

  // One element at any position.
  OCTOPUS_HD void one(const Item& it, int64_t g) const {
    const acc_t x = static_cast<acc_t>(in[g]);
    if constexpr (kPerChannel) {
      const int64_t c = channel_of(it, g);
      out[g] = static_cast<out_t>(Fn::apply(x, it.scales[c], it.biases[c]));
    } else {
      out[g] = static_cast<out_t>(Fn::apply(x, it.scale, it.bias));
    }
  }

 private:
  OCTOPUS_HD int64_t clamp_offset(int64_t o) const { return o < 0 ? 0 : (o > num_values ? num_values : o); }

  OCTOPUS_HD int64_t channel_of(const Item& it, int64_t g) const {
    const int64_t local = g - it.begin;
    // 32-bit division where it suffices: it is several times cheaper on the GPU.
    const int64_t c = (local >> 31) == 0 && (it.plane >> 31) == 0
                          ? static_cast<int64_t>(static_cast<uint32_t>(local) / static_cast<uint32_t>(it.plane))
                          : local / it.plane;
    // Clamped both ways: an element placed before its item's start (a plan passed in, or
    // unvalidated offsets on the GPU) must not read parameters before the item's row.
    return c < 0 ? 0 : (c < channels - 1 ? c : channels - 1);
  }
};

}  // namespace octopus

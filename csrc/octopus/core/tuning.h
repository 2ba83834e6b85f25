// Tuning constants of octopus's CUDA kernels, per GPU architecture, as CUB's policies: each
// kernel family declares its policy beside its functor (ops/<family>.h; the plan builder's in
// core/plan.h): a struct of values with
//   static constexpr const char* kFamily;          its name in octopus.kernel_tuning()
//   static constexpr Policy for_arch(int arch);    the selector: the values for an architecture
//   template <class Fn> void for_each(Fn&&) const; every value by name, in declaration order
// and registers it once, in its .cu file, with OCTOPUS_REGISTER_TUNING (core/tuning_registry.cuh).
// This header keeps the machinery, the generic driver's policy, and the registry that
// octopus.kernel_tuning() reads.
//
// Two readers of a policy, one selector, so they agree by construction:
//  - device code reads kPolicy<Policy>: the values of the architecture nvcc is compiling it
//    for (every kernel is compiled once per architecture of OCTOPUS_CUDA_ARCHITECTURES);
//  - host code that shapes a launch (threads per block, work per thread) reads
//    launch_policy<Policy>(): the values of the architecture whose code the current device
//    runs (the PTX version of octopus's kernels there, read as CUB reads it).
// So a value may differ between architectures only where it is read this way: never as a
// template argument chosen on the host (the host's instantiation would not exist in the
// device code) and never in host code through kPolicy. octopus.kernel_tuning() shows both
// readers' values for a device; the CUDA tests compare them.
//
// Only Hopper's values were measured (H100, the benchmark and the register reports of
// sm_90); every selector gives them to every other architecture until it is measured. The
// vector width is not a policy: 16 bytes on every architecture octopus compiles for (the host
// checks alignment against it; see core/vec.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace octopus::cuda {

#if defined(__CUDA_ARCH__)
inline constexpr int kCompiledArch = __CUDA_ARCH__;
#else
inline constexpr int kCompiledArch = 0;  // host code: not to be read there (launch_policy())
#endif

// The architecture of the code the current device runs (__CUDA_ARCH__ numbering: 750, 800,
// 860, 890, 900, ...; defined in core/tuning.cu).
int launch_arch();

// What device code reads.
template <class Policy>
inline constexpr Policy kPolicy = Policy::for_arch(kCompiledArch);

// What the host reads to shape a launch on the current device.
template <class Policy>
Policy launch_policy() {
  return Policy::for_arch(launch_arch());
}

// The generic driver (core/driver_cuda.cuh) and the launches of octopus's other kernels.
struct DriverTuning {
  int threads;                 // per block, every kernel but the plan builder's and crop_resize's forward
  int min_blocks_per_sm;       // the driver's kernel is compiled for this many (caps registers)
  int max_unroll_per_element;  // vectors in flight per lane of per-element locators (an item index each)
  // ... and with the plan's locator, whose runs of small items need more registers (at 4
  // blocks, 64 registers, the kernels spilled and per-item blocks ran at half speed).
  int plan_min_blocks_per_sm;
  // Blocks a launch has at most, in waves of what fits on the device at once. One wave (a
  // persistent grid, each warp taking every n-th unit) left SMs idle at the end, those that
  // reached memory faster waiting for the rest. With no cap (a warp per unit of the host's
  // bound), a plan's launch had the blocks of its whole bound (N / block_elems + M, several
  // times its units on skewed batches), those past its count empty, at the end. Of 1, 4, 8,
  // 16, 32 waves and no cap, 16 was the best single value over octopus-bench's seven
  // distributions on an H200.
  int grid_waves;

  static constexpr const char* kFamily = "driver";
  // Hopper (sm_90), measured on an H100 (the plan's value and the waves on an H200); every
  // architecture until it is measured.
  static constexpr DriverTuning for_arch(int /*arch*/) { return DriverTuning{256, 4, 4, 3, 16}; }
  template <class Fn>
  void for_each(Fn&& fn) const {
    fn("threads", threads);
    fn("min_blocks_per_sm", min_blocks_per_sm);
    fn("max_unroll_per_element", max_unroll_per_element);
    fn("plan_min_blocks_per_sm", plan_min_blocks_per_sm);
    fn("grid_waves", grid_waves);
  }
  constexpr bool valid() const {
    return threads % 32 == 0 && threads <= 1024 && max_unroll_per_element >= 1 && grid_waves >= 1;
  }
};
static_assert(DriverTuning::for_arch(900).valid());

// The registry octopus.kernel_tuning() reads: each registered family's values by
// "family.value", as the host launches with them and as the current device's code has them.
using TuningValues = std::vector<std::pair<std::string, int>>;
struct TuningFamily {
  const char* name;
  TuningValues (*launch)();
  TuningValues (*compiled)();  // one tiny kernel (for checks, not launches)
};
std::vector<TuningFamily>& tuning_families();

}  // namespace octopus::cuda

// Occupancy profiles of octopus's own CUDA kernels, which every StreamScheduler
// registers as lease kinds ("octopus.affine", ...). Each .cu file adds its kernel's
// profile with a static KernelProfileRegistration; the profile is computed on first use
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor needs a CUDA context). The scheduler
// reads these profiles; the core knows nothing of the scheduler.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace octopus {

// How many blocks of a kernel fit on one multiprocessor, and how many elements one block
// covers: work of `numel` elements then occupies
// min(1, ceil(numel / elements_per_block) / (blocks_per_sm * multiprocessors)) of a device.
struct KernelProfile {
  int blocks_per_sm = 1;
  int64_t elements_per_block = 1;
};

using KernelProfileFactory = std::function<KernelProfile()>;

struct KernelProfileRegistration {
  KernelProfileRegistration(std::string kind, KernelProfileFactory factory);
};

// Every registered kind with its profile, computed for the current device.
std::vector<std::pair<std::string, KernelProfile>> octopus_kernel_profiles();

}  // namespace octopus

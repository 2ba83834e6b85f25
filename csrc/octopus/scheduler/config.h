// What a StreamScheduler is configured with and what callers ask it for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace octopus::scheduler {

struct SchedulerConfig {
  // Leases held at once on one device; the pool has this many streams of each priority.
  int max_leases_per_device = 4;
  // Sum of the leases' estimated occupancy (1.0 = the whole device) allowed at once.
  // A lease is always granted on an idle device, however large its estimate.
  double max_occupancy = 1.0;
  // Estimate of a lease whose kind nobody registered.
  double default_occupancy = 0.0;
  // Fraction of each device's memory that must stay free; 0 turns the check off.
  double memory_reserve = 0.0;
  // How stale a free-memory sample may be before it is taken again.
  double memory_poll_interval_s = 0.002;
  // Default acquire timeout in seconds; negative waits for ever.
  double timeout_s = -1.0;
  // Devices to schedule on; empty means every device of the backend.
  std::vector<int> devices;
  bool record_timeline = false;
  std::size_t timeline_capacity = std::size_t{1} << 20;
};

// How many blocks of an octopus kernel fit on one multiprocessor, and how many elements
// one block covers: a lease of `numel` elements then occupies
// min(1, ceil(numel / elements_per_block) / (blocks_per_sm * multiprocessors)).
struct KernelProfile {
  int blocks_per_sm = 1;
  int64_t elements_per_block = 1;
};

struct AcquireRequest {
  std::string kind;
  std::vector<int64_t> shape;  // the work's shape, for kinds with a kernel profile
  int priority = 0;            // higher runs first; > 0 takes a high-priority stream
  std::optional<double> timeout_s;  // unset: the config's
  int device = -1;             // -1: the least-loaded device
  std::size_t bytes = 0;       // memory the work will allocate, held against the reserve
};

}  // namespace octopus::scheduler

// What a StreamScheduler has done: counters per scheduler and per device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace octopus::scheduler {

struct DeviceStats {
  int device = 0;
  int active_leases = 0;
  int peak_leases = 0;
  double occupancy_in_use = 0.0;
  int64_t granted = 0;
  std::size_t free_bytes = 0;   // the last sample taken (0 before any)
  std::size_t total_bytes = 0;
  std::optional<double> utilization;  // NVML, where available
};

struct SchedulerStats {
  int64_t granted = 0;
  int64_t released = 0;
  int64_t waited = 0;      // acquires that could not be granted at once
  int64_t timeouts = 0;
  int64_t rejected = 0;    // try_acquire calls that found no capacity
  int64_t waiting = 0;     // callers blocked right now
  double total_wait_s = 0.0;
  double max_wait_s = 0.0;
  std::vector<DeviceStats> devices;
};

}  // namespace octopus::scheduler

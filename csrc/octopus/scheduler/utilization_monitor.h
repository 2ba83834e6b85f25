// GPU utilization per device, sampled from the backend (NVML on CUDA, which may take
// milliseconds) at most once per interval and never under the scheduler's lock: callers
// refresh it before taking the lock and read the cached values under it.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "octopus/scheduler/device_backend.h"

namespace octopus::scheduler::detail {

class UtilizationMonitor {
 public:
  UtilizationMonitor(std::shared_ptr<DeviceBackend> backend, std::vector<int> devices, double interval_s);

  // Samples every device if the last sample is older than the interval (or `force`) and
  // no other thread is sampling right now; returns whether it sampled.
  bool refresh(bool force = false);
  // The last sample of the device at `index` (an index into the devices given).
  std::optional<double> value(std::size_t index) const;
  bool stale() const;

 private:
  using Clock = std::chrono::steady_clock;
  std::shared_ptr<DeviceBackend> backend_;
  std::vector<int> devices_;
  Clock::duration interval_;
  std::atomic<int64_t> sampled_at_{0};  // Clock ticks; 0: never
  std::atomic<bool> sampling_{false};
  mutable std::mutex mutex_;
  std::vector<std::optional<double>> values_;
};

}  // namespace octopus::scheduler::detail

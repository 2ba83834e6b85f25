#include "octopus/scheduler/utilization_monitor.h"

namespace octopus::scheduler::detail {

UtilizationMonitor::UtilizationMonitor(std::shared_ptr<DeviceBackend> backend, std::vector<int> devices,
                                       double interval_s)
    : backend_(std::move(backend)),
      devices_(std::move(devices)),
      interval_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_s))),
      values_(devices_.size()) {}

bool UtilizationMonitor::stale() const {
  const int64_t at = sampled_at_.load(std::memory_order_relaxed);
  return at == 0 || Clock::now().time_since_epoch().count() - at >= interval_.count();
}

bool UtilizationMonitor::refresh(bool force) {
  if (!force && !stale()) return false;
  if (sampling_.exchange(true)) return false;  // another thread is at it
  std::vector<std::optional<double>> values(devices_.size());
  try {
    for (std::size_t i = 0; i < devices_.size(); ++i) values[i] = backend_->utilization(devices_[i]);
  } catch (...) {
    sampling_.store(false);
    throw;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_ = std::move(values);
  }
  sampled_at_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  sampling_.store(false);
  return true;
}

std::optional<double> UtilizationMonitor::value(std::size_t index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_.at(index);
}

}  // namespace octopus::scheduler::detail

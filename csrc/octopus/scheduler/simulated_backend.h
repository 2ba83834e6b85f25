// A CPU simulation of the device layer: numbered streams and events, memory figures the
// caller sets. It lets the scheduling policy (priorities, FIFO, capacity, timeouts) be
// tested and demonstrated where there is no GPU.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "octopus/scheduler/device_backend.h"

namespace octopus::scheduler {

class SimulatedBackend final : public DeviceBackend {
 public:
  explicit SimulatedBackend(int num_devices, std::size_t memory_per_device = std::size_t{80} << 30,
                            int multiprocessors = 132);

  const char* name() const override { return "simulated"; }
  int device_count() override { return num_devices_; }
  int multiprocessor_count(int) override { return multiprocessors_; }
  StreamHandle create_stream(int device, bool high_priority) override;
  EventHandle create_event(int device) override;
  void destroy_event(int, EventHandle) noexcept override {}
  void record_event(int, EventHandle, StreamHandle) override { events_recorded_.fetch_add(1); }
  bool event_done(int, EventHandle) override { return true; }
  void synchronize_event(int, EventHandle) override {}
  void stream_wait_event(int, StreamHandle, EventHandle) override {}
  MemoryInfo memory_info(int device) override;
  std::optional<double> utilization(int device) override;

  // Test hooks: what the next memory / utilization queries report.
  void set_free_memory(int device, std::size_t free_bytes);
  void set_utilization(int device, std::optional<double> value);
  int64_t events_recorded() const { return events_recorded_.load(); }

 private:
  const int num_devices_;
  const int multiprocessors_;
  std::atomic<std::intptr_t> next_handle_{1};
  std::atomic<int64_t> events_recorded_{0};
  std::mutex mutex_;
  std::vector<MemoryInfo> memory_;
  std::vector<std::optional<double>> utilization_;
};

}  // namespace octopus::scheduler

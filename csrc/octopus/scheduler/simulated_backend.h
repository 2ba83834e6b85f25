// A CPU simulation of the device layer: numbered streams and events, memory and
// utilization figures the caller sets, and (optionally) events that complete only when
// the caller says the device got that far. It lets the scheduling policy (priorities,
// deadlines, capacity, throttling, the in-flight bound, timeouts) be tested and
// demonstrated where there is no GPU.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "octopus/scheduler/device_backend.h"
#include "octopus/scheduler/stream_pool.h"

namespace octopus::scheduler {

class SimulatedBackend final : public DeviceBackend {
 public:
  explicit SimulatedBackend(int num_devices, std::size_t memory_per_device = std::size_t{80} << 30,
                            int multiprocessors = 132);

  const char* name() const override { return "simulated"; }
  int device_count() override { return num_devices_; }
  int multiprocessor_count(int) override { return multiprocessors_; }
  StreamHandle create_stream(int device, bool high_priority) override;
  // Partitions are whole groups of kPartitionGranularity SMs (as on sm_90).
  int create_partition(int device, int reserved_sms) override;
  StreamHandle create_partition_stream(int device, int reserved_sms) override;
  void return_stream(int device, StreamHandle stream) noexcept override;
  EventHandle create_event(int device, bool timed) override;
  void destroy_event(int, EventHandle) noexcept override {}
  void record_event(int device, EventHandle event, StreamHandle stream) override;
  bool event_done(int device, EventHandle event) override;
  // The host time between the two events' completions (as complete_events, or recording
  // where events complete at once, completed them).
  double elapsed_s(int, EventHandle start, EventHandle end) override;
  // Off unless set_times_events(true): then the latency controller stamps completions from
  // elapsed_s, as on CUDA (set it before a scheduler is made on this backend).
  bool times_events() const override { return times_events_.load(); }
  void set_times_events(bool on) { times_events_.store(on); }
  void synchronize_event(int device, EventHandle event) override;
  void stream_wait_event(int, StreamHandle, EventHandle) override {}
  MemoryInfo memory_info(int device) override;
  std::optional<double> utilization(int device) override;
  // Gates in host memory, written at once (no device runs behind them): the scheduler's side
  // of device yield, tested without a GPU.
  uint32_t* create_gate(int device, int words) override;
  void write_gate(int device, StreamHandle stream, uint32_t* word, uint32_t value) override;

  static constexpr int kPartitionGranularity = 8;

  // Test hook: the gate writes so far, in order (the most recent kGateWritesKept of them: a long
  // simulated run writes the gate at every latency-critical lease).
  static constexpr std::size_t kGateWritesKept = 4096;
  struct GateWrite {
    int device;
    StreamHandle stream;
    const uint32_t* word;
    uint32_t value;
  };
  std::vector<GateWrite> gate_writes();

  // Test hooks: what the next memory / utilization queries report.
  void set_free_memory(int device, std::size_t free_bytes);
  void set_utilization(int device, std::optional<double> value);
  // With manual events on, an event recorded on a device completes only once
  // complete_events has been called for it: events complete in the order they were
  // recorded on the device, as work queued on one busy GPU would.
  void set_manual_events(bool manual);
  // Completes the `count` oldest pending events of `device` (all of them for a negative
  // count); returns how many it completed.
  int complete_events(int device, int count);
  int pending_events(int device);
  // Makes create_partition fail with this reason (empty: partitions work).
  void set_partition_failure(std::string reason);
  // Makes elapsed_s throw std::runtime_error with this reason, as reading a CUDA event's time
  // after a device error does (empty: it works).
  void set_elapsed_failure(std::string reason);
  int64_t events_recorded() const { return events_recorded_.load(); }
  // Test hook: the streams made so far (those given back and taken again count once).
  std::size_t streams_made() const { return streams_.made_count(); }

 private:
  std::size_t index(int device) const;

  const int num_devices_;
  const int multiprocessors_;
  std::atomic<std::intptr_t> next_handle_{1};
  std::atomic<int64_t> events_recorded_{0};
  std::atomic<bool> times_events_{false};
  std::mutex mutex_;
  std::condition_variable completed_;
  std::vector<MemoryInfo> memory_;
  std::vector<std::optional<double>> utilization_;
  std::vector<std::unordered_map<int, int>> partition_sms_;  // by device: reserve -> SMs
  std::string partition_failure_;
  std::string elapsed_failure_;
  bool manual_events_ = false;
  // Each record of an event gets a new generation; the event is done once its latest
  // generation has completed.
  struct EventState {
    uint64_t recorded = 0;
    uint64_t completed = 0;
    std::chrono::steady_clock::time_point completed_at;
  };
  std::unordered_map<EventHandle, EventState> events_;
  std::vector<std::deque<std::pair<EventHandle, uint64_t>>> pending_;
  std::vector<std::unique_ptr<uint32_t[]>> gates_;
  std::deque<GateWrite> gate_writes_;
  detail::StreamPool streams_;
};

}  // namespace octopus::scheduler

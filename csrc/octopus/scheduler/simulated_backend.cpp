#include "octopus/scheduler/simulated_backend.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace octopus::scheduler {

SimulatedBackend::SimulatedBackend(int num_devices, std::size_t memory_per_device, int multiprocessors)
    : num_devices_(num_devices),
      multiprocessors_(multiprocessors),
      memory_(static_cast<std::size_t>(num_devices < 0 ? 0 : num_devices), MemoryInfo{memory_per_device, memory_per_device}),
      utilization_(static_cast<std::size_t>(num_devices < 0 ? 0 : num_devices)),
      partition_sms_(static_cast<std::size_t>(num_devices < 0 ? 0 : num_devices)),
      pending_(static_cast<std::size_t>(num_devices < 0 ? 0 : num_devices)) {
  if (num_devices < 1) {
    throw std::invalid_argument("simulated_devices must be at least 1, got " + std::to_string(num_devices));
  }
}

std::size_t SimulatedBackend::index(int device) const {
  if (device < 0 || device >= num_devices_) {
    throw std::out_of_range("simulated backend: no device " + std::to_string(device));
  }
  return static_cast<std::size_t>(device);
}

StreamHandle SimulatedBackend::create_stream(int device, bool high_priority) {
  return streams_.take_or_make(detail::StreamPool::priority_kind(device, high_priority),
                               [this] { return reinterpret_cast<StreamHandle>(next_handle_.fetch_add(1)); });
}

int SimulatedBackend::create_partition(int device, int reserved_sms) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!partition_failure_.empty()) throw std::runtime_error(partition_failure_);
  const int sms = (multiprocessors_ - reserved_sms) / kPartitionGranularity * kPartitionGranularity;
  if (reserved_sms < 1 || sms < kPartitionGranularity) {
    throw std::runtime_error("cannot keep " + std::to_string(reserved_sms) + " of the " + std::to_string(multiprocessors_) +
                             " SMs free: a partition needs at least " + std::to_string(kPartitionGranularity) + " SMs");
  }
  partition_sms_[index(device)][reserved_sms] = sms;
  return sms;
}

StreamHandle SimulatedBackend::create_partition_stream(int device, int reserved_sms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (partition_sms_[index(device)].count(reserved_sms) == 0) {
      throw std::logic_error("simulated backend: no partition for that reserve on this device");
    }
  }
  return streams_.take_or_make({device, reserved_sms},
                               [this] { return reinterpret_cast<StreamHandle>(next_handle_.fetch_add(1)); });
}

void SimulatedBackend::return_stream(int, StreamHandle stream) noexcept { streams_.give_back(stream); }

EventHandle SimulatedBackend::create_event(int, bool) { return reinterpret_cast<EventHandle>(next_handle_.fetch_add(1)); }

void SimulatedBackend::record_event(int device, EventHandle event, StreamHandle) {
  events_recorded_.fetch_add(1);
  std::lock_guard<std::mutex> lock(mutex_);
  EventState& e = events_[event];
  e.recorded += 1;
  if (manual_events_) {
    pending_[index(device)].emplace_back(event, e.recorded);
  } else {
    e.completed = e.recorded;
    e.completed_at = std::chrono::steady_clock::now();
  }
}

bool SimulatedBackend::event_done(int, EventHandle event) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = events_.find(event);
  return it == events_.end() || it->second.completed >= it->second.recorded;
}

double SimulatedBackend::elapsed_s(int, EventHandle start, EventHandle end) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!elapsed_failure_.empty()) throw std::runtime_error(elapsed_failure_);
  const auto a = events_.find(start), b = events_.find(end);
  if (a == events_.end() || b == events_.end()) return std::numeric_limits<double>::quiet_NaN();
  return std::chrono::duration<double>(b->second.completed_at - a->second.completed_at).count();
}

void SimulatedBackend::synchronize_event(int, EventHandle event) {
  std::unique_lock<std::mutex> lock(mutex_);
  completed_.wait(lock, [&] {
    const auto it = events_.find(event);
    return it == events_.end() || it->second.completed >= it->second.recorded;
  });
}

MemoryInfo SimulatedBackend::memory_info(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  return memory_[index(device)];
}

std::optional<double> SimulatedBackend::utilization(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  return utilization_[index(device)];
}

void SimulatedBackend::set_free_memory(int device, std::size_t free_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  memory_[index(device)].free_bytes = free_bytes;
}

void SimulatedBackend::set_utilization(int device, std::optional<double> value) {
  std::lock_guard<std::mutex> lock(mutex_);
  utilization_[index(device)] = value;
}

void SimulatedBackend::set_manual_events(bool manual) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    manual_events_ = manual;
  }
  if (!manual) {
    for (int d = 0; d < num_devices_; ++d) complete_events(d, -1);
  }
}

int SimulatedBackend::complete_events(int device, int count) {
  int completed = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& queue = pending_[index(device)];
    while (!queue.empty() && (count < 0 || completed < count)) {
      const auto [event, generation] = queue.front();
      queue.pop_front();
      EventState& e = events_[event];
      e.completed = std::max(e.completed, generation);
      e.completed_at = std::chrono::steady_clock::now();
      ++completed;
    }
  }
  completed_.notify_all();
  return completed;
}

int SimulatedBackend::pending_events(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(pending_[index(device)].size());
}

void SimulatedBackend::set_partition_failure(std::string reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  partition_failure_ = std::move(reason);
}

void SimulatedBackend::set_elapsed_failure(std::string reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  elapsed_failure_ = std::move(reason);
}

uint32_t* SimulatedBackend::create_gate(int device, int words) {
  index(device);  // a clear error for a bad device
  std::lock_guard<std::mutex> lock(mutex_);
  gates_.push_back(std::make_unique<uint32_t[]>(static_cast<std::size_t>(words)));
  return gates_.back().get();
}

void SimulatedBackend::write_gate(int device, StreamHandle stream, uint32_t* word, uint32_t value) {
  std::lock_guard<std::mutex> lock(mutex_);
  *word = value;
  gate_writes_.push_back(GateWrite{device, stream, word, value});
  if (gate_writes_.size() > kGateWritesKept) gate_writes_.pop_front();
}

std::vector<SimulatedBackend::GateWrite> SimulatedBackend::gate_writes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return {gate_writes_.begin(), gate_writes_.end()};
}

}  // namespace octopus::scheduler

#include "octopus/scheduler/simulated_backend.h"

#include <stdexcept>
#include <string>

namespace octopus::scheduler {

SimulatedBackend::SimulatedBackend(int num_devices, std::size_t memory_per_device, int multiprocessors)
    : num_devices_(num_devices),
      multiprocessors_(multiprocessors),
      memory_(static_cast<std::size_t>(num_devices < 0 ? 0 : num_devices), MemoryInfo{memory_per_device, memory_per_device}),
      utilization_(static_cast<std::size_t>(num_devices < 0 ? 0 : num_devices)) {
  if (num_devices < 1) {
    throw std::invalid_argument("simulated_devices must be at least 1, got " + std::to_string(num_devices));
  }
}

StreamHandle SimulatedBackend::create_stream(int, bool) {
  return reinterpret_cast<StreamHandle>(next_handle_.fetch_add(1));
}

EventHandle SimulatedBackend::create_event(int) { return reinterpret_cast<EventHandle>(next_handle_.fetch_add(1)); }

MemoryInfo SimulatedBackend::memory_info(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  return memory_.at(static_cast<std::size_t>(device));
}

std::optional<double> SimulatedBackend::utilization(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  return utilization_.at(static_cast<std::size_t>(device));
}

void SimulatedBackend::set_free_memory(int device, std::size_t free_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  memory_.at(static_cast<std::size_t>(device)).free_bytes = free_bytes;
}

void SimulatedBackend::set_utilization(int device, std::optional<double> value) {
  std::lock_guard<std::mutex> lock(mutex_);
  utilization_.at(static_cast<std::size_t>(device)) = value;
}

}  // namespace octopus::scheduler

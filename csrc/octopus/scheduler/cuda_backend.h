// The device layer on the CUDA runtime. Streams are non-blocking (they do not
// synchronize with the legacy default stream); events carry timing where asked. Partitions are
// green contexts (green_context.h). Streams and partitions are the process's (stream_pool.h):
// a scheduler's streams, given back when it ends, go to the next one.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "octopus/scheduler/device_backend.h"

namespace octopus::scheduler {

class CudaBackend final : public DeviceBackend {
 public:
  // Throws std::runtime_error when no CUDA device can be used.
  explicit CudaBackend(bool use_nvml = true);

  const char* name() const override { return "cuda"; }
  int device_count() override { return device_count_; }
  int multiprocessor_count(int device) override;
  StreamHandle create_stream(int device, bool high_priority) override;
  int create_partition(int device, int reserved_sms) override;
  StreamHandle create_partition_stream(int device, int reserved_sms) override;
  void return_stream(int device, StreamHandle stream) noexcept override;
  EventHandle create_event(int device, bool timed) override;
  void destroy_event(int device, EventHandle event) noexcept override;
  void record_event(int device, EventHandle event, StreamHandle stream) override;
  bool event_done(int device, EventHandle event) override;
  double elapsed_s(int device, EventHandle start, EventHandle end) override;
  bool times_events() const override { return true; }
  void synchronize_event(int device, EventHandle event) override;
  void stream_wait_event(int device, StreamHandle stream, EventHandle event) override;
  MemoryInfo memory_info(int device) override;
  // A direct NVML query (the scheduler rate-limits it and calls it outside its lock).
  std::optional<double> utilization(int device) override;
  // Device memory, written by the driver's cuStreamWriteValue32 (a stream memory operation:
  // no kernel, so a close is not queued behind best-effort blocks for an SM). Null where the
  // driver has no such call.
  uint32_t* create_gate(int device, int words) override;
  void return_gate(int device, uint32_t* gate, int words, const std::vector<StreamHandle>& writers) noexcept override;
  void write_gate(int device, StreamHandle stream, uint32_t* word, uint32_t value) override;

 private:
  int device_count_ = 0;
  bool use_nvml_ = false;
  std::vector<std::string> pci_bus_ids_;
  std::once_flag write_value_once_;
  void* write_value_ = nullptr;  // the driver's cuStreamWriteValue32, where it has one
  // A gate of `words` given back whose writes have all run (it leaves the pool), or null.
  void* reused_gate(int device, int words);
};

}  // namespace octopus::scheduler

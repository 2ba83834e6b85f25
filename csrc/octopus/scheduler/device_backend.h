// The device layer the scheduler runs on: streams, events, memory and load of each
// device. Two implementations: CUDA (cuda_backend.h) and a simulation on the CPU
// (simulated_backend.h) that the scheduling logic is tested against without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace octopus::scheduler {

// Opaque handles: a cudaStream_t / cudaEvent_t for CUDA, a counter for the simulation.
using StreamHandle = void*;
using EventHandle = void*;

struct MemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual const char* name() const = 0;
  virtual int device_count() = 0;
  virtual int multiprocessor_count(int device) = 0;
  // A stream of high or normal priority on `device`, kept for the life of the process:
  // one given back (return_stream) is handed out again before a new one is made.
  virtual StreamHandle create_stream(int device, bool high_priority) = 0;
  // Makes a partition of `device`: a subset of its multiprocessors that leaves at least
  // `reserved_sms` of them to other streams; returns the subset's size. A device may have
  // several, one per reserve. Throws std::runtime_error naming the reason where that is not
  // possible.
  virtual int create_partition(int device, int reserved_sms) = 0;
  // A lowest-priority stream on the partition that create_partition made for
  // `reserved_sms`, kept for the life of the process (and handed out again once given back).
  virtual StreamHandle create_partition_stream(int device, int reserved_sms) = 0;
  // A stream made by create_stream or create_partition_stream that its owner no longer uses;
  // work may still be queued on it (it is never destroyed: stream_pool.h).
  virtual void return_stream(int device, StreamHandle stream) noexcept = 0;
  // An event; `timed` ones can be measured with elapsed_s (they cost more to record).
  virtual EventHandle create_event(int device, bool timed) = 0;
  virtual void destroy_event(int device, EventHandle event) noexcept = 0;
  virtual void record_event(int device, EventHandle event, StreamHandle stream) = 0;
  // True once all work recorded before the event has finished.
  virtual bool event_done(int device, EventHandle event) = 0;
  // Device seconds between two completed events (NaN where the backend has no clock).
  virtual double elapsed_s(int device, EventHandle start, EventHandle end) = 0;
  // Whether elapsed_s reads the device's own clock, so that the latency controller stamps
  // latency-critical completions with it (device_clock.h) rather than when it saw them.
  virtual bool times_events() const { return false; }
  virtual void synchronize_event(int device, EventHandle event) = 0;
  // Makes future work on `stream` wait for the event (without blocking the host).
  virtual void stream_wait_event(int device, StreamHandle stream, EventHandle event) = 0;
  virtual MemoryInfo memory_info(int device) = 0;
  // GPU utilization in [0, 1] over the driver's last sample period, where known. May be
  // slow (NVML): the scheduler never calls it while holding its lock.
  virtual std::optional<double> utilization(int device) = 0;
  // The device's yield gate (yield_gate.h): `words` 32-bit words of device memory, zeroed,
  // never freed (kernels queued before a scheduler's end may still read them): one given back
  // (return_gate) is handed out again once the writes queued on its writers have run. Null
  // where the backend has none: best-effort kernels then never yield on the device.
  virtual uint32_t* create_gate(int /*device*/, int /*words*/) { return nullptr; }
  // A gate of `words` words its scheduler no longer uses; `writers` are the streams that wrote
  // to it (the last write on each opens its word).
  virtual void return_gate(int /*device*/, uint32_t* /*gate*/, int /*words*/,
                           const std::vector<StreamHandle>& /*writers*/) noexcept {}
  // Queues a write of `value` to `word` on `stream`, ordered after the work queued there
  // before it and done without a kernel (it must not wait for an SM).
  virtual void write_gate(int /*device*/, StreamHandle /*stream*/, uint32_t* /*word*/, uint32_t /*value*/) {}
};

}  // namespace octopus::scheduler

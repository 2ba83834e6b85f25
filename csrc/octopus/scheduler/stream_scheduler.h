// StreamScheduler: callers lease CUDA streams from per-device pools instead of sharing
// the default stream. A lease is granted while its device has capacity (lease count,
// estimated occupancy, free-memory reserve); otherwise the caller waits, in priority
// order and first come first served within a priority, until a lease comes back or its
// timeout expires. Returning a lease records an event on its stream.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "octopus/scheduler/config.h"
#include "octopus/scheduler/device_backend.h"
#include "octopus/scheduler/stats.h"

namespace octopus::scheduler {

namespace detail {
struct State;
class EventPool;
}  // namespace detail

// Thrown when an acquire times out; what() names the limit that kept it waiting.
class LeaseTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The event recorded on a lease's stream when it was returned.
class ReleaseEvent {
 public:
  ReleaseEvent(std::shared_ptr<detail::EventPool> pool, int device, EventHandle event);
  ~ReleaseEvent();
  ReleaseEvent(const ReleaseEvent&) = delete;
  ReleaseEvent& operator=(const ReleaseEvent&) = delete;

  int device() const { return device_; }
  bool done() const;
  void synchronize() const;
  // Work queued on `stream` after this call starts only once the lease's work is done.
  void wait(StreamHandle stream) const;

 private:
  std::shared_ptr<detail::EventPool> pool_;
  int device_;
  EventHandle event_;
};

// What the scheduler granted: the stream, where it is, and how the grant came about.
struct LeaseGrant {
  uint64_t id = 0;
  int device = -1;
  StreamHandle stream = nullptr;
  int slot = -1;  // index in the device's pool; high-priority streams follow the normal ones
  int priority = 0;
  double occupancy = 0.0;
  std::size_t bytes = 0;
  std::string kind;
  double waited_s = 0.0;
  bool queued = false;  // it was not granted on arrival
  double requested_us = 0.0;
  double granted_us = 0.0;
  std::shared_ptr<ReleaseEvent> previous_release;
};

// A leased stream. Move-only; the lease is returned when release() is called or the
// object is destroyed.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& other) noexcept;
  Lease& operator=(Lease&& other) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();

  bool active() const { return state_ != nullptr; }
  uint64_t id() const { return grant_.id; }
  int device() const { return grant_.device; }
  StreamHandle stream() const { return grant_.stream; }
  // The stream's index in its device's pool (high-priority streams follow the normal ones).
  int stream_slot() const { return grant_.slot; }
  int priority() const { return grant_.priority; }
  double occupancy() const { return grant_.occupancy; }
  const std::string& kind() const { return grant_.kind; }
  // Seconds this lease waited before it was granted.
  double waited_s() const { return grant_.waited_s; }
  // Whether the lease had to wait (was not granted on arrival).
  bool queued() const { return grant_.queued; }
  // The event the previous lease of this stream recorded when it was returned (null
  // for a stream's first lease). Work on this stream is ordered after it anyway.
  const std::shared_ptr<ReleaseEvent>& previous_release() const { return grant_.previous_release; }
  // Records the release event on the stream and returns the stream to the pool.
  // Returns that event; a second call returns null.
  std::shared_ptr<ReleaseEvent> release();
  // The event release() recorded (null while the lease is held).
  const std::shared_ptr<ReleaseEvent>& release_event() const { return release_event_; }

 private:
  friend class StreamScheduler;
  Lease(std::shared_ptr<detail::State> state, LeaseGrant grant);

  std::shared_ptr<detail::State> state_;
  LeaseGrant grant_;
  std::shared_ptr<ReleaseEvent> release_event_;
};

class StreamScheduler {
 public:
  StreamScheduler(SchedulerConfig config, std::shared_ptr<DeviceBackend> backend);
  ~StreamScheduler();
  StreamScheduler(const StreamScheduler&) = delete;
  StreamScheduler& operator=(const StreamScheduler&) = delete;

  // Blocks until the lease can be granted; throws LeaseTimeout when the timeout expires.
  Lease acquire(const AcquireRequest& request);
  // Grants only if that needs no wait (and no earlier caller of the same or a higher
  // priority is waiting for the device); never blocks.
  std::optional<Lease> try_acquire(const AcquireRequest& request);

  // A fixed occupancy estimate (0..1] per lease of `kind`.
  void register_kind(const std::string& kind, double occupancy);
  // An estimate from a kernel's occupancy and the lease's shape.
  void register_kernel(const std::string& kind, KernelProfile profile);
  // The estimate a lease of `kind` and `shape` would get on `device`.
  double estimate_occupancy(const std::string& kind, const std::vector<int64_t>& shape, int device) const;

  const SchedulerConfig& config() const;
  const std::vector<int>& devices() const;
  const char* backend_name() const;
  DeviceBackend& backend() const;
  SchedulerStats stats() const;
  // The recorded acquire/release timeline as Chrome-trace JSON (chrome://tracing, Perfetto).
  std::string trace_json() const;
  void write_trace(const std::string& path) const;

 private:
  std::shared_ptr<detail::State> state_;
};

}  // namespace octopus::scheduler

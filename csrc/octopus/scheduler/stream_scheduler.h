// StreamScheduler: callers lease CUDA streams from per-device pools instead of sharing
// the default stream. A lease is granted while its device has capacity (lease count,
// estimated occupancy, free-memory reserve); otherwise the caller waits, by class
// (latency-critical, normal, best-effort), priority, earliest deadline and arrival, until
// a lease comes back, its timeout expires or its deadline passes. Best-effort holders
// call checkpoint() between slices of their work: it bounds their work in flight on the
// device and pauses them while latency-critical work is held or waiting there.
// Returning a lease records an event on its stream.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "octopus/scheduler/config.h"
#include "octopus/scheduler/device_backend.h"
#include "octopus/scheduler/event_pool.h"
#include "octopus/scheduler/lease_grant.h"
#include "octopus/scheduler/scheduler_errors.h"
#include "octopus/scheduler/stats.h"

namespace octopus::scheduler {

namespace detail {
struct State;
class InFlightWindow;
}  // namespace detail

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
  // The stream's index in its device's pool: normal, then high-priority, then
  // best-effort streams, max_leases_per_device of each.
  int stream_slot() const { return grant_.slot; }
  int priority() const { return grant_.priority; }
  WorkClass work_class() const { return grant_.work_class; }
  bool promoted() const { return grant_.promoted; }
  double occupancy() const { return grant_.occupancy; }
  const std::string& kind() const { return grant_.kind; }
  // Seconds this lease waited before it was granted.
  double waited_s() const { return grant_.waited_s; }
  // Whether the lease had to wait (was not granted on arrival).
  bool queued() const { return grant_.queued; }
  // The event the previous lease of this stream recorded when it was returned (null
  // for a stream's first lease). Work on this stream is ordered after it anyway.
  const std::shared_ptr<ReleaseEvent>& previous_release() const { return grant_.previous_release; }

  // Call between slices of best-effort work, before launching the next slice (of `units`
  // of work, for the kind's measured time per unit). A best-effort holder blocks here
  // until at most in_flight - 1 of its slices are unfinished on the device (the latency
  // controller's, or the pinned best_effort_in_flight), then while the device's
  // latency-critical work throttles it or a probe pauses it (at most
  // best_effort_max_pause_s at a time). Its stream may change here, to the partition the
  // controller moved best-effort work to (ordered after its work so far). Returns the
  // seconds it was paused; other classes return 0 at once. A holder that never calls it is
  // never throttled.
  double checkpoint(double units = 0.0);
  // Ends the slice the last checkpoint started (the slicing helpers call it once the last
  // slice is queued): its device time and the host's time per slice are measured like any
  // other's, once it has finished (at a later checkpoint; nothing waits for it). A slice still
  // open at the release is not measured. Nothing on a lease that was returned or never
  // reached a checkpoint.
  void end_slice();

  // Records the release event on the stream and returns the stream to the pool.
  // Returns that event; a second call returns null.
  std::shared_ptr<ReleaseEvent> release();
  // The event release() recorded (null while the lease is held).
  const std::shared_ptr<ReleaseEvent>& release_event() const { return release_event_; }

 private:
  friend class StreamScheduler;
  Lease(std::shared_ptr<detail::State> state, LeaseGrant grant);
  // A latency-critical lease granted while best-effort work yields on its device closes its
  // word of the device's gate on its stream (release() opens it after the lease's work).
  void close_gate();
  // Waits until none of this lease's work is left on the device.
  void drain();
  // Later work goes on `stream`, after everything queued so far.
  void move_to(StreamHandle stream);

  std::shared_ptr<detail::State> state_;
  LeaseGrant grant_;
  std::shared_ptr<ReleaseEvent> release_event_;
  std::unique_ptr<detail::InFlightWindow> in_flight_;  // made at a best-effort lease's first checkpoint
};

class StreamScheduler {
 public:
  // Throws std::runtime_error where reserved_sms asks for an SM partition the backend
  // cannot make (the message says why).
  StreamScheduler(SchedulerConfig config, std::shared_ptr<DeviceBackend> backend);
  ~StreamScheduler();
  StreamScheduler(const StreamScheduler&) = delete;
  StreamScheduler& operator=(const StreamScheduler&) = delete;

  // Blocks until the lease can be granted; throws LeaseTimeout when the timeout expires,
  // DeadlineMissed when the deadline cannot be met. `before_blocking`, where given, is called
  // once (without the scheduler's lock) before anything that may take long: waiting for the
  // grant, or sampling several devices' utilization. Python's binding releases the GIL there
  // only: a lease granted at once keeps it (giving it up cost a latency-critical thread a
  // wait for it back, behind any thread running Python, up to the switch interval).
  Lease acquire(const AcquireRequest& request, const std::function<void()>& before_blocking = {});
  // Grants only if that needs no wait (and no earlier caller served before it is waiting
  // for the device); never blocks (`before_blocking` as for acquire: before sampling several
  // devices' utilization). An infeasible deadline throws DeadlineMissed here too.
  std::optional<Lease> try_acquire(const AcquireRequest& request, const std::function<void()>& before_blocking = {});

  // A fixed occupancy estimate (0..1] per lease of `kind`.
  void register_kind(const std::string& kind, double occupancy);
  // An estimate from a kernel's occupancy and the lease's shape.
  void register_kernel(const std::string& kind, KernelProfile profile);
  // The estimate a lease of `kind` and `shape` would get on `device`.
  double estimate_occupancy(const std::string& kind, const std::vector<int64_t>& shape, int device) const;
  // Device seconds per unit of `kind`'s sliced work: measured by best-effort checkpoints
  // (estimate_seconds_per_unit, policy.h), or set here from an earlier measurement. Unset
  // before either.
  std::optional<double> seconds_per_unit(const std::string& kind) const;
  // Sets a kind's device seconds per unit (from an earlier measurement); slices of its
  // returned leases not measured yet are left out, later slices move it as before.
  void set_seconds_per_unit(const std::string& kind, double seconds);
  // The host's seconds per slice of `kind` (from a checkpoint to the next: launching the
  // slice), the median of the recent slices'; unset before any was measured.
  std::optional<double> host_seconds_per_slice(const std::string& kind) const;

  // One step of adaptive concurrency: samples every device's utilization and moves its
  // lease limit toward target_utilization. A background thread calls it every
  // utilization_interval_s where target_utilization is set.
  void adapt_concurrency();

  // Latency control (latency_control on). A latency target for latency-critical leases of
  // `kind` on every device: p99 within `p99_s` seconds, or (unset) within `ratio` x its p99
  // measured with no best-effort work on the device (default latency_ratio). Throws
  // std::invalid_argument for a bad value, std::logic_error where latency control is off.
  void set_target(const std::string& kind, std::optional<double> p99_s, std::optional<double> ratio);
  // The device time the slicing helpers give one best-effort slice of `kind` on `device` now
  // (a kind the controller released may get longer slices; unset where latency control is
  // off: slices are as the caller sizes them).
  std::optional<double> slice_budget_s(int device, const std::string& kind = "") const;
  // Reports of infeasible latency targets not yet taken (each once), and whether there are any.
  std::vector<std::string> take_reports();
  bool has_reports() const;

  const SchedulerConfig& config() const;
  const std::vector<int>& devices() const;
  const char* backend_name() const;
  DeviceBackend& backend() const;
  SchedulerStats stats() const;
  // The recorded timeline as Chrome-trace JSON (chrome://tracing, Perfetto).
  std::string trace_json() const;
  void write_trace(const std::string& path) const;

 private:
  std::shared_ptr<detail::State> state_;
  std::thread adapter_;  // runs adapt_concurrency while target_utilization is set
  std::thread controller_;  // the latency-control loop while latency_control is on
};

}  // namespace octopus::scheduler

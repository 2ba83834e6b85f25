// Admission policy: what a device has in use, whether a request fits on it, which device
// a request goes to, when best-effort work must pause, how long a kind's leases are
// typically held (for deadlines), and how the adaptive lease limit moves.
#pragma once

#include <array>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "octopus/scheduler/config.h"
#include "octopus/scheduler/device_backend.h"
#include "octopus/scheduler/event_pool.h"
#include "octopus/scheduler/in_flight.h"
#include "octopus/scheduler/latency_controller.h"
#include "octopus/scheduler/sample_window.h"
#include "octopus/scheduler/wait_queue.h"
#include "octopus/scheduler/yield_gate.h"

namespace octopus::scheduler::detail {

struct StreamSlot {
  StreamHandle handle = nullptr;
  bool leased = false;
  uint64_t last_used = 0;
  std::shared_ptr<ReleaseEvent> last_release;
  // While leased: when its kind's leases are typically returned (for deadline estimates).
  Clock::time_point expected_release;
};

struct DeviceState {
  int device = 0;
  int multiprocessors = 1;
  // [0, n) normal priority, [n, 2n) high priority, [2n, 3n) best-effort (the best-effort
  // slots' handles use every SM; partition_streams[k][r] is best-effort slot k's stream on the
  // partition that keeps reserves[r] SMs free)
  std::vector<StreamSlot> slots;
  std::vector<int> reserves;  // ascending
  std::vector<std::vector<StreamHandle>> partition_streams;
  std::string partition_error;  // why no partition could be made, where none could
  // How best-effort work runs now: the latency controller's step with the pinned knobs
  // applied (without a controller: the pinned knobs or their defaults).
  ControlStep control;
  ControlStep released_control;  // for best-effort kinds the controller released (same pins)
  int64_t release_changes = 0;   // the controller's release_changes() when last applied
  std::unique_ptr<LatencyController> controller;  // null where latency_control is off
  // The device's yield gate (null where the backend has none): `gate_words` its words, one per
  // latency-critical slot; `yield_gate` what the best-effort streams registered with it read.
  uint32_t* gate_words = nullptr;
  std::shared_ptr<YieldGateState> yield_gate;
  int64_t gate_closes = 0;  // latency-critical leases that closed the gate
  double recent_max_hold_s = 0.0;  // of its latency-critical leases (gate_wait_after_hold)
  bool probing = false;                 // best-effort holders pause and drain for a probe
  int best_effort_drained = 0;          // best-effort holders paused with nothing in flight
  int best_effort_releases_pending = 0; // returned best-effort leases whose work may still run
  bool best_effort_idle = true;         // no best-effort work can be running
  // ... since then; -inf while none has ever run, so that a job which arrived before the
  // scheduler was made (a server's queue older than it) ran alone too.
  double best_effort_idle_since_us = -std::numeric_limits<double>::infinity();
  uint64_t best_effort_epoch = 0;       // bumped whenever best-effort work may start
  // Bumped whenever `control` (or the released kinds' settings, or a probe) changes; with
  // the best-effort leases of each generation whose work may still run (granted and not
  // returned, or returned and not finished; a holder's lease moves to the current generation
  // at each checkpoint), it tells which latency-critical jobs ran wholly under the settings
  // now in force (LeaseGrant::settled).
  uint64_t control_generation = 0;
  Clock::time_point control_since;  // when control_generation last moved
  std::map<uint64_t, int> best_effort_by_generation;
  double best_effort_units = 0.0;       // units of the slices started at checkpoints
  int active = 0;
  int peak = 0;
  int lease_limit = 0;  // max_leases_per_device, or less where it adapts to utilization
  std::array<int, kWorkClasses> active_by_class{};
  double occupancy = 0.0;              // of the leases other than best-effort ones
  double best_effort_occupancy = 0.0;
  int64_t granted = 0;
  std::size_t bytes_held = 0;
  MemoryInfo memory;
  Clock::time_point memory_time;
  bool memory_sampled = false;
  int latency_critical_waiting = 0;  // latency-critical requests that could go here, waiting
};

struct KindModel {
  // Registered estimate: a fixed occupancy or a kernel profile (none: default_occupancy).
  std::variant<std::monostate, double, KernelProfile> estimate;
  // Seconds each recent lease was held, per work class: one kind of work (a user's name for
  // it) may run as latency-critical leases of a job each and as best-effort leases holding a
  // long sliced job, and one median of both would be neither's.
  std::array<SampleWindow, kWorkClasses> holds{SampleWindow(32), SampleWindow(32), SampleWindow(32)};
  // Device time per unit of sliced work (estimate_seconds_per_unit), or what
  // set_seconds_per_unit set: from the recent slices launched behind the holder's previous one
  // (while one came in the last kQueuedBehindMemoryS) and those launched onto an idle stream,
  // bounded where only the latter stand (add_slice_timings).
  std::optional<double> seconds_per_unit;
  std::optional<double> seconds_per_unit_bound_base;  // what that bound is kMaxSlowdown times
  Clock::time_point bound_base_since;                  // when it last moved
  SampleWindow queued_behind_rates{32};
  Clock::time_point last_queued_behind;
  SampleWindow idle_start_rates{32};
  // The host's time per slice (launching it; in a Python holder also any wait for the GIL):
  // the median of the recent slices'. Slices are sized to at least twice it (the slicing
  // helpers), or the device would wait for the host between them.
  std::optional<double> host_slice_s;
  SampleWindow host_slices{32};
};
using KindTable = std::unordered_map<std::string, KindModel>;

// A kind's device time per unit from its recent slices: a low percentile of those launched
// behind the holder's previous slice (`queued_behind`), or of those launched onto an idle stream
// (`idle_start`) where that is lower or the only one. An idle-start slice's time also counts its
// wait for SMs another stream's kernels held: beside a compute-bound best-effort job, a
// memory-bound one kept to one slice in flight measured every slice as long as the other's
// (the wait) plus its own, sized the next one smaller from that, measured it as long again,
// and crawled at 1-9% of its rate (H200, benchmarks/README.md#contention). Unset without either.
std::optional<double> estimate_seconds_per_unit(const SampleWindow& queued_behind, const SampleWindow& idle_start);
// How long queued-behind samples stand for a kind that has had none since (its holders kept to
// one slice in flight, at the controller's top steps): the controller steps down to explore
// within seconds, where they are measured again; past it, work whose units became dearer meanwhile
// would run in slices longer than their budget.
constexpr double kQueuedBehindMemoryS = 30.0;

// Adds what a kind's finished slices measured (at `now`) to its model, and sets its
// seconds_per_unit: estimate_seconds_per_unit, but where no queued-behind slice stands (only
// slices launched onto an idle stream), never more than kMaxSlowdown times the lowest estimate
// since one last did (or since set_seconds_per_unit), a base that rises at most
// kMaxSlowdown-fold per kQueuedBehindMemoryS without a lower estimate (work may have become
// dearer; the controller steps down within seconds, where queued-behind slices are measured
// again). A wait in every such slice that does not shrink with it (for the SMs of another
// stream's kernels, for the device-yield gate) feeds on itself: a slice measured long is cut
// smaller, waits as long, measures longer per unit, and where the wait exceeds the slice budget
// the estimate grows without bound. A memory-bound job held to one slice in flight from the
// controller's first second went from ~5e-12 to 1.1e-8 s per element and ran at 0.5% of its
// rate (H200, benchmarks/README.md#contention). Sharing the device slows a kind's work by a
// small factor; beyond that a sample measured waits. Queued-behind slices measure the work
// itself, so where the work becomes dearer the bound follows them.
void add_slice_timings(KindModel& k, const std::vector<SliceTiming>& timings, Clock::time_point now);
// What set_seconds_per_unit does: `seconds` per unit of `k`'s work, and the bound's base (what
// the work costs, as far as the caller knows).
void set_seconds_per_unit(KindModel& k, double seconds, Clock::time_point now);
constexpr double kMaxSlowdown = 4.0;

class Policy {
 public:
  explicit Policy(const SchedulerConfig& config) : config_(config) {}

  // The first slot of the pool a lease of this class takes its stream from.
  int first_slot(WorkClass c) const;
  double occupancy(const AcquireRequest& r, const KindModel* kind, const DeviceState& d) const;
  int best_effort_limit(const DeviceState& d) const;
  // Why `w` cannot be granted on `d` now (Limit::None: it can), and the occupancy it
  // would have there.
  Limit fit(const Waiter& w, const KindModel* kind, DeviceState& d, DeviceBackend& backend, double* occupancy) const;
  // How busy a device is, for choosing among those a request fits on.
  double load(const DeviceState& d) const;
  // Whether best-effort holders on `d` running at `control` must pause at their checkpoints now.
  bool throttled(const DeviceState& d, const ControlStep& control) const;
  // The median hold time of the kind's recent leases of `work_class` (unset: none seen yet).
  std::optional<double> typical_hold_s(const KindModel* kind, WorkClass work_class) const;
  // Seconds until `w` would likely be granted on one of devices [lo, hi): 0 where it fits
  // now with nobody ahead of it, else until the first lease there is typically returned
  // plus the typical holds of the waiters ahead shared over the lease limit.
  double expected_wait_s(const Waiter& w, std::vector<DeviceState>& devices, int lo, int hi, const WaitQueue& queue,
                         const KindTable& kinds, Clock::time_point now, DeviceBackend& backend) const;
  // One step of the adaptive lease limit for a utilization reading.
  int adapted_lease_limit(int limit, std::optional<double> utilization) const;
  bool memory_check_needed(const AcquireRequest& r) const { return config_.memory_reserve > 0.0 || r.bytes > 0; }
  std::size_t reserve_bytes(const DeviceState& d) const;
  const MemoryInfo& sample_memory(DeviceState& d, DeviceBackend& backend) const;

 private:
  const SchedulerConfig& config_;
};

}  // namespace octopus::scheduler::detail

// The state every StreamScheduler and its leases share, and what is done with it under
// its lock: granting and returning leases, deadline admission, giving up, throttling
// best-effort holders, adapting lease limits, latency control (control_loop.cpp), and the
// messages and trace entries of all that. The decisions themselves are the Policy's
// (policy.h) and the latency controller's (latency_controller.h).
#pragma once

#include <array>
#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "octopus/scheduler/config.h"
#include "octopus/scheduler/device_backend.h"
#include "octopus/scheduler/event_pool.h"
#include "octopus/scheduler/in_flight.h"
#include "octopus/scheduler/lease_grant.h"
#include "octopus/scheduler/policy.h"
#include "octopus/scheduler/sample_window.h"
#include "octopus/scheduler/stats.h"
#include "octopus/scheduler/timeline.h"
#include "octopus/scheduler/utilization_monitor.h"
#include "octopus/scheduler/wait_queue.h"

namespace octopus::scheduler::detail {

constexpr std::size_t index_of_class(WorkClass c) { return static_cast<std::size_t>(c); }

// Recent waits and holds per class, for the percentiles in stats() and the trace.
constexpr std::size_t kClassWindow = 4096;
// How long after a change of control latency-critical jobs may be taken as still meeting the
// best-effort work earlier settings let in (State::settled): well past the drain of the two
// units or slices a holder keeps in flight.
constexpr double kSettleBoundS = 0.1;
// Returned best-effort leases whose last slices are kept for measuring (keep_ended_window):
// a few per holder thread, more than enough.
constexpr std::size_t kEndedWindows = 16;

uint64_t this_thread_id();
// A timeline entry of `type` for the lease `g`, on the calling thread (times left for the caller).
TimelineEntry lease_entry(const LeaseGrant& g, TimelineEntry::Type type);
double seconds(Clock::duration d);
Clock::duration duration_of(double s);

// The pool's streams are never destroyed (like PyTorch's own stream pool): tensors whose
// use was recorded on one (record_stream) may be freed after the scheduler is gone, and
// the caching allocator then records an event on that stream. When the scheduler and its
// last lease are gone they go back to the backend, for the next scheduler (stream_pool.h).
struct State {
  ~State();

  SchedulerConfig config;
  Policy policy{config};
  std::shared_ptr<DeviceBackend> backend;
  std::shared_ptr<EventPool> events;
  std::unique_ptr<UtilizationMonitor> utilization;
  Clock::time_point created = Clock::now();

  std::mutex mutex;
  // Best-effort holders paused at a checkpoint wait here for latency-critical work to go.
  std::condition_variable throttle_changed;
  // The adaptive-concurrency thread sleeps here between steps.
  std::condition_variable adapter_wake;
  // The latency-control thread waits here for completions to watch.
  std::condition_variable control_wake;
  bool stopping = false;
  std::vector<DeviceState> devices;
  std::vector<int> device_ids;
  WaitQueue queue;
  uint64_t next_lease_id = 1;
  uint64_t slot_clock = 0;
  KindTable kinds;
  // Windows keep_ended_window keeps, with their kinds.
  std::vector<std::pair<std::string, std::unique_ptr<InFlightWindow>>> ended_windows;
  SchedulerStats counters;
  std::array<SampleWindow, kWorkClasses> waits{SampleWindow(kClassWindow), SampleWindow(kClassWindow),
                                               SampleWindow(kClassWindow)};
  std::array<SampleWindow, kWorkClasses> holds{SampleWindow(kClassWindow), SampleWindow(kClassWindow),
                                               SampleWindow(kClassWindow)};
  std::vector<TimelineEntry> timeline;

  // Latency control: returned latency-critical leases whose completion the control thread
  // watches, returned best-effort leases whose work may still run, and the controllers'
  // infeasible-target reports not yet handed to the caller.
  struct PendingLatency {
    std::string kind;
    int index = 0;  // the device's
    double arrived_us = 0.0, released_us = 0.0;  // LeaseGrant's arrived_us
    double first_check_us = -1.0;  // when the control thread first found it unfinished
    std::shared_ptr<ReleaseEvent> event;
    bool idle = false;  // LeaseGrant's best_effort_idle and epoch
    uint64_t epoch = 0;
    bool settled = false;  // LeaseGrant's settled and control_generation
    uint64_t generation = 0;
    bool gate_left_open = false;  // LeaseGrant's
  };
  struct PendingRelease {
    int index = 0;
    std::shared_ptr<ReleaseEvent> event;
    uint64_t generation = 0;  // the lease's control generation
  };
  std::vector<PendingLatency> pending_latencies;
  std::vector<PendingRelease> pending_releases;
  std::vector<std::string> reports;
  std::atomic<bool> has_reports{false};

  double micros(Clock::time_point t) const { return std::chrono::duration<double, std::micro>(t - created).count(); }
  ClassStats& class_stats(WorkClass c) { return counters.classes[index_of_class(c)]; }
  std::string device_name(int index) const;
  int index_of(int device) const;
  // The device indices [lo, hi) a request may go to.
  std::pair<int, int> device_range(const AcquireRequest& r) const;
  const KindModel* find_kind(const std::string& kind) const;
  // Latency-critical requests waiting throttle best-effort work on every device they
  // could be granted on.
  void count_waiting(Waiter& w);
  void uncount_waiting(Waiter& w);
  DeviceState& device_of(int device) { return devices[static_cast<std::size_t>(index_of(device))]; }
  const DeviceState& device_of(int device) const { return devices[static_cast<std::size_t>(index_of(device))]; }
  void grant(Waiter& w, int index, double occupancy);
  // Returns the lease `g` (its release event `event`, null where recording it failed).
  void release(const LeaseGrant& g, const std::shared_ptr<ReleaseEvent>& event);
  // Grants what can be granted, in queue order. A request that cannot be granted blocks
  // its devices for the requests behind it, so nobody overtakes a request served before it.
  void schedule();
  std::string describe(const Waiter& w) const;
  std::string limit_message(const Waiter& w) const;
  void record(TimelineEntry entry);
  void record_deadline_miss(const Waiter& w, const char* reason, Clock::time_point now);
  // On arrival: a request whose deadline the estimate says it cannot meet is rejected
  // (DeadlineMissed) or promoted to latency-critical. Kinds never seen have no estimate
  // and are taken as feasible.
  void admit_deadline(Waiter& w);
  // A waiter that gives up (timeout or deadline): out of the queue, counted, traced.
  void give_up(Waiter& w, bool deadline_passed);
  void add_slice_timings(const std::string& kind, const std::vector<SliceTiming>& timings);
  // Keeps the in-flight window of a returned best-effort lease of `kind` until its last
  // slices have finished (in_flight.h); past kEndedWindows the oldest is dropped unmeasured.
  void keep_ended_window(std::string kind, std::unique_ptr<InFlightWindow> window);
  // Adds what the kept windows' finished slices measured to their kinds, waiting for none;
  // windows with nothing left go, as does one whose events fail (its measure is lost, not the
  // checkpoint that looked).
  void measure_ended_windows();
  // Drops the kept windows of `kind` unmeasured (set_seconds_per_unit: slices of its
  // returned leases not measured yet are left out).
  void drop_ended_windows(const std::string& kind);
  // Blocks a best-effort holder while its device's latency-critical work (or a probe)
  // throttles it, at most best_effort_max_pause_s; returns the seconds it paused. During a
  // probe the holder first runs `drain` (without the lock): it waits until none of its work
  // is left on the device.
  double pause_if_throttled(const LeaseGrant& g, std::unique_lock<std::mutex>& lock,
                            const std::function<void()>& drain);
  // The stream of best-effort slot `slot` for work of `kind`: on the partition its control keeps.
  StreamHandle best_effort_stream(const DeviceState& d, int slot, const std::string& kind) const;
  // How best-effort work of `kind` runs on `d` now (released kinds: d.released_control).
  const ControlStep& control_for(const DeviceState& d, const std::string& kind) const;
  // Whether a latency-critical job granted on `d` now runs wholly under its current control
  // (LeaseGrant::settled).
  bool settled(const DeviceState& d, Clock::time_point now) const;
  // A best-effort holder at a checkpoint: what it runs from now follows `d`'s current control.
  void best_effort_moved(DeviceState& d, uint64_t& generation);
  // Best-effort work of control generation `generation` has left the device (or was returned unwatched).
  void best_effort_finished(DeviceState& d, uint64_t generation);
  // Whether `d` can have best-effort work running: recomputed when holders come, go, pause
  // drained or resume, and when returned work finishes.
  void refresh_idle(DeviceState& d);

  // Latency control (control_loop.cpp). Sets up the partitions, ladder and controller of
  // every device; the control thread's body; `d.control` from its controller and the
  // pinned knobs (recording a trace entry where it changed).
  void setup_control();
  void control_loop();
  void apply_control(DeviceState& d, Clock::time_point now);
  // One step of adaptive concurrency with the utilization samples already taken.
  void adapt_limits();
};

}  // namespace octopus::scheduler::detail

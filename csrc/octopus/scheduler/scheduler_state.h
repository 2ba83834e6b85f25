// The state every StreamScheduler and its leases share, and what is done with it under
// its lock: granting in queue order, deadline admission, giving up, throttling best-effort
// holders, adapting lease limits, and the messages and trace entries of all that. The
// decisions themselves are the Policy's (policy.h).
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "octopus/scheduler/config.h"
#include "octopus/scheduler/device_backend.h"
#include "octopus/scheduler/event_pool.h"
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

uint64_t this_thread_id();
// A timeline entry of `type` for the lease `g`, on the calling thread (times left for the caller).
TimelineEntry lease_entry(const LeaseGrant& g, TimelineEntry::Type type);
double seconds(Clock::duration d);
Clock::duration duration_of(double s);

// The pool's streams are never destroyed (like PyTorch's own stream pool): tensors whose
// use was recorded on one (record_stream) may be freed after the scheduler is gone, and
// the caching allocator then records an event on that stream.
struct State {
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
  bool stopping = false;
  std::vector<DeviceState> devices;
  std::vector<int> device_ids;
  WaitQueue queue;
  uint64_t next_lease_id = 1;
  uint64_t slot_clock = 0;
  KindTable kinds;
  SchedulerStats counters;
  std::array<SampleWindow, kWorkClasses> waits{SampleWindow(kClassWindow), SampleWindow(kClassWindow),
                                               SampleWindow(kClassWindow)};
  std::array<SampleWindow, kWorkClasses> holds{SampleWindow(kClassWindow), SampleWindow(kClassWindow),
                                               SampleWindow(kClassWindow)};
  std::vector<TimelineEntry> timeline;

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
  void grant(Waiter& w, int index, double occupancy);
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
  void add_rate_samples(const std::string& kind, const std::vector<double>& samples);
  // Blocks a best-effort holder while its device's latency-critical work throttles it,
  // at most best_effort_max_pause_s; returns the seconds it paused.
  double pause_if_throttled(const LeaseGrant& g, std::unique_lock<std::mutex>& lock);
  // One step of adaptive concurrency with the utilization samples already taken.
  void adapt_limits();
};

}  // namespace octopus::scheduler::detail

// What a StreamScheduler has done: counters per scheduler, per class of work and per device.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "octopus/scheduler/config.h"
#include "octopus/scheduler/latency_controller.h"

namespace octopus::scheduler {

// The latency controller of one device: the step it holds best-effort work at, what that
// step means, and how each latency-critical kind fares against its target.
struct ControlStats {
  bool enabled = false;
  int step = 0;
  int steps = 0;
  ControlStep settings;
  bool probing = false;
  int64_t climbs = 0, descents = 0, probes = 0;
  int64_t median_climbs = 0;        // of the climbs, those for a median over its bound
  int64_t unhelpful_descents = 0;   // of the descents, those from a step that was over target (the one below no worse)
  std::vector<double> seconds_at_steps;  // time spent at each step so far
  double best_effort_units = 0.0;  // units of the best-effort slices started so far
  std::vector<int> reserves;       // the SMs each partition made keeps free of best-effort work
  std::string partition_error;     // why none could be made, where none could
  std::vector<KindControl> kinds;
  ControlStep released_settings;   // of released best-effort kinds (LatencyController::released)
  std::vector<BestEffortControl> best_effort;
};

struct DeviceStats {
  int device = 0;
  int active_leases = 0;
  int peak_leases = 0;
  int best_effort_leases = 0;       // held now
  int latency_critical_leases = 0;  // held now
  int lease_limit = 0;              // now (adaptive where target_utilization is set)
  double occupancy_in_use = 0.0;    // of all leases, best-effort ones included
  int64_t granted = 0;
  std::size_t free_bytes = 0;   // the last sample taken (0 before any)
  std::size_t total_bytes = 0;
  int partition_sms = 0;        // SMs best-effort work runs on now (0: every SM: no partition)
  // Device yield (yield_gate.h): whether the device has a gate, the latency-critical leases
  // that closed it, and the launches of octopus kernels on its best-effort streams that yielded.
  bool yield_gate = false;
  int64_t gate_closes = 0;
  int64_t yielding_launches = 0;
  std::optional<double> utilization;  // the last NVML sample, where available
  ControlStats control;
};

// Wait and hold times over the most recent leases of one class (seconds; unset before
// the first), and what became of its deadlines.
struct ClassStats {
  int64_t granted = 0;
  int64_t released = 0;
  std::optional<double> wait_p50_s, wait_p99_s, hold_p50_s, hold_p99_s;
  int64_t deadline_rejected = 0;  // infeasible on arrival and rejected
  int64_t deadline_expired = 0;   // the deadline passed while it waited
  int64_t deadline_late = 0;      // granted, but returned after its deadline
  int64_t deadline_promoted = 0;  // infeasible on arrival and promoted to latency-critical
  double throttled_s = 0.0;       // time holders spent paused at checkpoints
  int64_t pauses = 0;
  int64_t deadline_misses() const { return deadline_rejected + deadline_expired + deadline_late; }
};

struct SchedulerStats {
  int64_t granted = 0;
  int64_t released = 0;
  int64_t waited = 0;      // acquires that could not be granted at once
  int64_t timeouts = 0;
  int64_t rejected = 0;    // try_acquire calls that found no capacity
  int64_t waiting = 0;     // callers blocked right now
  double total_wait_s = 0.0;
  double max_wait_s = 0.0;
  std::array<ClassStats, kWorkClasses> classes;  // indexed by WorkClass
  std::vector<DeviceStats> devices;
};

}  // namespace octopus::scheduler

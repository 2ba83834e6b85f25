// What a StreamScheduler is configured with and what callers ask it for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "octopus/core/kernel_profiles.h"

namespace octopus::scheduler {

using KernelProfile = ::octopus::KernelProfile;

// Classes of work. Latency-critical leases get high-priority streams and pause
// best-effort holders at their checkpoints; best-effort leases run on their own streams
// (on an SM partition where configured) and yield at checkpoints.
enum class WorkClass { BestEffort, Normal, LatencyCritical };
constexpr int kWorkClasses = 3;
// "best_effort", "normal", "high": the names stats and traces use.
const char* work_class_name(WorkClass c);

// When best-effort holders are paused at their checkpoints.
enum class ThrottleMode {
  Off,      // never (the in-flight bound still applies)
  Waiting,  // while a latency-critical request waits for a lease on the device
  Held,     // while a latency-critical lease is held or waiting on the device
};
const char* throttle_mode_name(ThrottleMode m);  // "off", "waiting", "held"
ThrottleMode parse_throttle_mode(const std::string& name);  // throws std::invalid_argument

// What happens to a request whose deadline cannot be met by the scheduler's estimate.
enum class InfeasibleDeadline { Reject, Promote };
const char* infeasible_deadline_name(InfeasibleDeadline p);  // "reject", "promote"
InfeasibleDeadline parse_infeasible_deadline(const std::string& name);  // throws std::invalid_argument

struct SchedulerConfig {
  // Leases held at once on one device; the pool has this many streams of each class.
  int max_leases_per_device = 4;
  // Best-effort leases held at once on one device; -1: one fewer than the device's lease
  // limit (at least 1), so that best-effort work never takes a device's last lease.
  int max_best_effort_leases_per_device = -1;
  // Sum of the leases' estimated occupancy (1.0 = the whole device) allowed at once.
  // A lease is always granted on an idle device, however large its estimate. Best-effort
  // leases are admitted within it; other leases are admitted as if best-effort ones were
  // not there (those yield at checkpoints instead).
  double max_occupancy = 1.0;
  // Estimate of a lease whose kind nobody registered.
  double default_occupancy = 0.0;
  // Fraction of each device's memory that must stay free; 0 turns the check off.
  double memory_reserve = 0.0;
  // How stale a free-memory sample may be before it is taken again.
  double memory_poll_interval_s = 0.002;
  // Default acquire timeout in seconds; negative waits for ever.
  double timeout_s = -1.0;
  // Devices to schedule on; empty means every device of the backend.
  std::vector<int> devices;
  bool record_timeline = false;
  std::size_t timeline_capacity = std::size_t{1} << 20;

  // Best-effort work: when holders are paused at their checkpoints, how many of a holder's
  // slices may be queued or running on the device at once (0: no bound), and SMs of each
  // device kept free of best-effort work (best-effort streams then run on a green context of
  // the other SMs; 0: no partition). Unset, the latency controller sets each (where
  // latency_control is off: Held, 2 and 0); set, it is pinned there.
  std::optional<ThrottleMode> throttle;
  std::optional<int> best_effort_in_flight;
  std::optional<int> reserved_sms;
  // Whether octopus's ragged kernels on best-effort streams step aside on the device while
  // latency-critical leases are held there (yield_gate.h). Unset: the latency controller's
  // step decides (off without latency control), and which kinds' leases need it; set, it is
  // pinned, for every latency-critical lease.
  std::optional<bool> device_yield;
  // The longest one pause lasts (negative: no limit) before the holder runs one more slice
  // anyway; it also caps how long a yielded kernel waits for the device's gate (yield_gate.h).
  double best_effort_max_pause_s = 0.25;
  // Latency control (latency_controller.h): best-effort work held back as far as the
  // latency-critical kinds' targets need, measured from their completions. A kind's target
  // is set with set_target, or is latency_ratio x its p99 measured with no best-effort work
  // on the device.
  bool latency_control = true;
  double latency_ratio = 1.5;
  // The most jobs over its target a kind may bank before best-effort work is held back
  // further (the size of its error budget; over time 1% of its jobs may be over the target,
  // and a bigger budget lets them come in longer bursts, at the cost of reacting later).
  double latency_error_budget = 2.0;

  InfeasibleDeadline infeasible_deadline = InfeasibleDeadline::Reject;

  // Adaptive concurrency: the device's lease limit moves between min_leases_per_device and
  // max_leases_per_device to keep its utilization (NVML) near this target. Unset, or
  // without a utilization reading, the limit stays at max_leases_per_device.
  std::optional<double> target_utilization;
  int min_leases_per_device = 1;
  // How often utilization is sampled (for the adaptive limit and for choosing among
  // equally loaded devices); never under the scheduler's lock.
  double utilization_interval_s = 0.1;
};

struct AcquireRequest {
  std::string kind;
  std::vector<int64_t> shape;  // the work's shape, for kinds with a kernel profile
  int priority = 0;            // higher runs first; > 0 is latency-critical, < 0 best-effort
  std::optional<double> timeout_s;  // unset: the config's
  int device = -1;             // -1: the least-loaded device
  std::size_t bytes = 0;       // memory the work will allocate, held against the reserve
  // Seconds from the request by which the lease should be returned; waiters of one
  // priority are served earliest deadline first.
  std::optional<double> deadline_s;
  bool best_effort = false;    // best-effort whatever the priority
  // Seconds the work had already waited when it asked for the lease (since its request
  // arrived): counted in the latency the latency controller judges its kind by, and in
  // nothing else (timeouts, deadlines and the lease's waited_s count from this request).
  double waited_before_s = 0.0;
};

WorkClass work_class_of(const AcquireRequest& request);

// Throws std::invalid_argument naming the first bad field.
void validate(const SchedulerConfig& config);

}  // namespace octopus::scheduler

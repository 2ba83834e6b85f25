#include "octopus/scheduler/config.h"

#include <cmath>
#include <stdexcept>

namespace octopus::scheduler {
namespace {

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("octopus StreamScheduler: " + what); }

}  // namespace

const char* work_class_name(WorkClass c) {
  switch (c) {
    case WorkClass::BestEffort: return "best_effort";
    case WorkClass::Normal: return "normal";
    case WorkClass::LatencyCritical: return "high";
  }
  return "?";
}

const char* throttle_mode_name(ThrottleMode m) {
  switch (m) {
    case ThrottleMode::Off: return "off";
    case ThrottleMode::Waiting: return "waiting";
    case ThrottleMode::Held: return "held";
  }
  return "?";
}

ThrottleMode parse_throttle_mode(const std::string& name) {
  for (const ThrottleMode m : {ThrottleMode::Off, ThrottleMode::Waiting, ThrottleMode::Held}) {
    if (name == throttle_mode_name(m)) return m;
  }
  fail("throttle must be \"off\", \"waiting\" or \"held\", got \"" + name + "\"");
}

const char* infeasible_deadline_name(InfeasibleDeadline p) {
  return p == InfeasibleDeadline::Reject ? "reject" : "promote";
}

InfeasibleDeadline parse_infeasible_deadline(const std::string& name) {
  for (const InfeasibleDeadline p : {InfeasibleDeadline::Reject, InfeasibleDeadline::Promote}) {
    if (name == infeasible_deadline_name(p)) return p;
  }
  fail("infeasible_deadline must be \"reject\" or \"promote\", got \"" + name + "\"");
}

WorkClass work_class_of(const AcquireRequest& request) {
  if (request.best_effort || request.priority < 0) return WorkClass::BestEffort;
  return request.priority > 0 ? WorkClass::LatencyCritical : WorkClass::Normal;
}

void validate(const SchedulerConfig& c) {
  if (c.max_leases_per_device < 1) fail("max_leases_per_device must be at least 1, got " + std::to_string(c.max_leases_per_device));
  if (c.max_best_effort_leases_per_device == 0 || c.max_best_effort_leases_per_device < -1) {
    fail("max_best_effort_leases_per_device must be at least 1 (or -1: one fewer than the lease limit), got " +
         std::to_string(c.max_best_effort_leases_per_device));
  }
  if (!(c.max_occupancy > 0.0)) fail("max_occupancy must be positive, got " + std::to_string(c.max_occupancy));
  if (!(c.default_occupancy >= 0.0 && c.default_occupancy <= 1.0)) {
    fail("default_occupancy must be in [0, 1], got " + std::to_string(c.default_occupancy));
  }
  if (!(c.memory_reserve >= 0.0 && c.memory_reserve < 1.0)) {
    fail("memory_reserve must be a fraction in [0, 1), got " + std::to_string(c.memory_reserve));
  }
  if (!(c.memory_poll_interval_s > 0.0)) fail("memory_poll_interval_s must be positive, got " + std::to_string(c.memory_poll_interval_s));
  if (std::isnan(c.timeout_s)) fail("timeout must be a number of seconds (negative waits for ever)");
  if (c.best_effort_in_flight && *c.best_effort_in_flight < 0) {
    fail("best_effort_in_flight must be 0 (no bound) or more, got " + std::to_string(*c.best_effort_in_flight));
  }
  if (std::isnan(c.best_effort_max_pause_s)) fail("best_effort_max_pause must be a number of seconds (negative: no limit)");
  if (c.reserved_sms && *c.reserved_sms < 0) {
    fail("reserved_sms must be 0 (no partition) or more, got " + std::to_string(*c.reserved_sms));
  }
  if (!(c.latency_error_budget >= 1.0 && std::isfinite(c.latency_error_budget))) {
    fail("latency_error_budget must be at least 1 (one job over the target), got " +
         std::to_string(c.latency_error_budget));
  }
  if (!(c.latency_ratio >= 1.0 && std::isfinite(c.latency_ratio))) {
    fail("latency_ratio must be at least 1 (a kind's p99 alone), got " + std::to_string(c.latency_ratio));
  }
  if (c.target_utilization && !(*c.target_utilization > 0.0 && *c.target_utilization <= 1.0)) {
    fail("target_utilization must be in (0, 1], got " + std::to_string(*c.target_utilization));
  }
  if (c.min_leases_per_device < 1 || c.min_leases_per_device > c.max_leases_per_device) {
    fail("min_leases_per_device must be in [1, max_leases_per_device=" + std::to_string(c.max_leases_per_device) +
         "], got " + std::to_string(c.min_leases_per_device));
  }
  if (!(c.utilization_interval_s > 0.0)) fail("utilization_interval must be positive, got " + std::to_string(c.utilization_interval_s));
}

}  // namespace octopus::scheduler

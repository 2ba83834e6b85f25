#include "octopus/scheduler/policy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace octopus::scheduler::detail {

// The percentile of a kind's recent per-unit times taken as its seconds per unit (a slice whose
// launch was late measures long).
constexpr double kRateQuantile = 0.1;

std::optional<double> estimate_seconds_per_unit(const SampleWindow& queued_behind, const SampleWindow& idle_start) {
  const std::optional<double> behind = queued_behind.quantile(kRateQuantile);
  const std::optional<double> idle = idle_start.quantile(kRateQuantile);
  if (behind && idle) return std::min(*behind, *idle);
  return behind ? behind : idle;
}

void add_slice_timings(KindModel& k, const std::vector<SliceTiming>& timings, Clock::time_point now) {
  for (const SliceTiming& t : timings) {
    if (!std::isnan(t.seconds_per_unit)) {
      if (t.queued_behind) {
        k.queued_behind_rates.add(t.seconds_per_unit);
        k.last_queued_behind = now;
      } else {
        k.idle_start_rates.add(t.seconds_per_unit);
      }
    }
    k.host_slices.add(t.host_s);
  }
  const double since_behind_s = std::chrono::duration<double>(now - k.last_queued_behind).count();
  if (k.queued_behind_rates.size() > 0 && since_behind_s > kQueuedBehindMemoryS) {
    k.queued_behind_rates.clear();
  }
  if (const std::optional<double> rate = estimate_seconds_per_unit(k.queued_behind_rates, k.idle_start_rates)) {
    // Queued-behind slices measure the work itself: while some stand, the bound follows them.
    // Otherwise it is lowered by any lower estimate, and rises at most kMaxSlowdown-fold per
    // kQueuedBehindMemoryS without one.
    std::optional<double>& base = k.seconds_per_unit_bound_base;
    const double base_age_s = std::chrono::duration<double>(now - k.bound_base_since).count();
    if (k.queued_behind_rates.size() > 0 || !base || *rate < *base) {
      base = *rate;
      k.bound_base_since = now;
    } else if (base_age_s > kQueuedBehindMemoryS) {
      base = std::min(*rate, kMaxSlowdown * *base);
      k.bound_base_since = now;
    }
    k.seconds_per_unit = std::min(*rate, kMaxSlowdown * *k.seconds_per_unit_bound_base);
  }
  k.host_slice_s = k.host_slices.quantile(0.5);
}

void set_seconds_per_unit(KindModel& k, double seconds, Clock::time_point now) {
  k.seconds_per_unit = seconds;
  k.seconds_per_unit_bound_base = seconds;
  k.bound_base_since = now;
}

namespace {

constexpr std::size_t index(WorkClass c) { return static_cast<std::size_t>(c); }

// How far utilization may stray from the target before the lease limit moves.
constexpr double kUtilizationBand = 0.05;

}  // namespace

int Policy::first_slot(WorkClass c) const {
  const int n = config_.max_leases_per_device;
  switch (c) {
    case WorkClass::Normal: return 0;
    case WorkClass::LatencyCritical: return n;
    case WorkClass::BestEffort: return 2 * n;
  }
  return 0;
}

double Policy::occupancy(const AcquireRequest& r, const KindModel* kind, const DeviceState& d) const {
  if (kind == nullptr || std::holds_alternative<std::monostate>(kind->estimate)) return config_.default_occupancy;
  if (const double* fixed = std::get_if<double>(&kind->estimate)) return *fixed;
  const KernelProfile& k = std::get<KernelProfile>(kind->estimate);
  if (r.shape.empty()) return 1.0;  // size unknown: assume it fills the device
  double numel = 1.0;
  for (const int64_t extent : r.shape) numel *= static_cast<double>(extent);
  const double blocks = std::ceil(numel / static_cast<double>(k.elements_per_block));
  const double resident = static_cast<double>(k.blocks_per_sm) * d.multiprocessors;
  return std::min(1.0, blocks / resident);
}

int Policy::best_effort_limit(const DeviceState& d) const {
  if (config_.max_best_effort_leases_per_device > 0) return config_.max_best_effort_leases_per_device;
  return std::max(1, d.lease_limit - 1);
}

Limit Policy::fit(const Waiter& w, const KindModel* kind, DeviceState& d, DeviceBackend& backend,
                  double* occupancy_out) const {
  const AcquireRequest& r = *w.request;
  if (d.active >= d.lease_limit) return Limit::Leases;
  const bool best_effort = w.work_class == WorkClass::BestEffort;
  const int best_effort_held = d.active_by_class[index(WorkClass::BestEffort)];
  if (best_effort && best_effort_held >= best_effort_limit(d)) return Limit::BestEffortLeases;
  *occupancy_out = occupancy(r, kind, d);
  // Best-effort leases are admitted within everything in use; the others as if
  // best-effort leases were not there (those yield at their checkpoints instead).
  const double in_use = best_effort ? d.occupancy + d.best_effort_occupancy : d.occupancy;
  const int holders = best_effort ? d.active : d.active - best_effort_held;
  if (holders > 0 && in_use + *occupancy_out > config_.max_occupancy + 1e-9) return Limit::Occupancy;
  if (memory_check_needed(r)) {
    const MemoryInfo& m = sample_memory(d, backend);
    const std::size_t available = m.free_bytes > d.bytes_held ? m.free_bytes - d.bytes_held : 0;
    if (available < reserve_bytes(d) + r.bytes) return Limit::Memory;
  }
  return Limit::None;
}

double Policy::load(const DeviceState& d) const {
  return static_cast<double>(d.active) / config_.max_leases_per_device + d.occupancy + d.best_effort_occupancy;
}

bool Policy::throttled(const DeviceState& d, const ControlStep& control) const {
  if (d.probing) return true;
  switch (control.throttle) {
    case ThrottleMode::Off: return false;
    case ThrottleMode::Waiting: return d.latency_critical_waiting > 0;
    case ThrottleMode::Held:
      return d.latency_critical_waiting + d.active_by_class[index(WorkClass::LatencyCritical)] > 0;
  }
  return false;
}

std::optional<double> Policy::typical_hold_s(const KindModel* kind, WorkClass work_class) const {
  if (kind == nullptr) return std::nullopt;
  return kind->holds[index(work_class)].quantile(0.5);
}

double Policy::expected_wait_s(const Waiter& w, std::vector<DeviceState>& devices, int lo, int hi,
                               const WaitQueue& queue, const KindTable& kinds, Clock::time_point now,
                               DeviceBackend& backend) const {
  auto kind_of = [&](const std::string& name) -> const KindModel* {
    const auto it = kinds.find(name);
    return it == kinds.end() ? nullptr : &it->second;
  };
  double best = std::numeric_limits<double>::infinity();
  for (int i = lo; i < hi; ++i) {
    DeviceState& d = devices[static_cast<std::size_t>(i)];
    bool anyone_ahead = false;
    double ahead_s = 0.0;
    for (const Waiter* other : queue.waiters()) {
      if (!served_before(other, &w)) break;  // the queue is in serving order
      if (other->request->device >= 0 && other->request->device != d.device) continue;
      anyone_ahead = true;
      ahead_s += typical_hold_s(kind_of(other->request->kind), other->work_class).value_or(0.0);
    }
    double occupancy_here = 0.0;
    if (!anyone_ahead && fit(w, kind_of(w.request->kind), d, backend, &occupancy_here) == Limit::None) return 0.0;
    // Only best-effort requests wait for best-effort leases to come back.
    const int skip_from = w.work_class == WorkClass::BestEffort ? -1 : first_slot(WorkClass::BestEffort);
    double first_release_s = std::numeric_limits<double>::infinity();
    for (int s = 0; s < static_cast<int>(d.slots.size()); ++s) {
      const StreamSlot& slot = d.slots[static_cast<std::size_t>(s)];
      if (!slot.leased || (skip_from >= 0 && s >= skip_from)) continue;
      first_release_s = std::min(first_release_s, std::max(0.0, std::chrono::duration<double>(slot.expected_release - now).count()));
    }
    if (std::isinf(first_release_s)) first_release_s = 0.0;
    best = std::min(best, first_release_s + ahead_s / std::max(1, d.lease_limit));
  }
  return std::isinf(best) ? 0.0 : best;
}

int Policy::adapted_lease_limit(int limit, std::optional<double> utilization) const {
  if (!config_.target_utilization || !utilization) return limit;
  const double target = *config_.target_utilization;
  if (*utilization > target + kUtilizationBand) return std::max(config_.min_leases_per_device, limit - 1);
  if (*utilization < target - kUtilizationBand) return std::min(config_.max_leases_per_device, limit + 1);
  return limit;
}

std::size_t Policy::reserve_bytes(const DeviceState& d) const {
  return static_cast<std::size_t>(config_.memory_reserve * static_cast<double>(d.memory.total_bytes));
}

const MemoryInfo& Policy::sample_memory(DeviceState& d, DeviceBackend& backend) const {
  const auto now = Clock::now();
  if (!d.memory_sampled ||
      std::chrono::duration<double>(now - d.memory_time).count() >= config_.memory_poll_interval_s) {
    d.memory = backend.memory_info(d.device);
    d.memory_time = now;
    d.memory_sampled = true;
  }
  return d.memory;
}

}  // namespace octopus::scheduler::detail

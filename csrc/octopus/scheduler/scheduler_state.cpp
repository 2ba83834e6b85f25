#include "octopus/scheduler/scheduler_state.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>
#include <thread>

#include "octopus/scheduler/stream_scheduler.h"

namespace octopus::scheduler::detail {

uint64_t this_thread_id() { return std::hash<std::thread::id>{}(std::this_thread::get_id()); }

TimelineEntry lease_entry(const LeaseGrant& g, TimelineEntry::Type type) {
  TimelineEntry entry;
  entry.type = type;
  entry.lease_id = g.id;
  entry.kind = g.kind;
  entry.work_class = g.work_class;
  entry.device = g.device;
  entry.stream_slot = g.slot;
  entry.priority = g.priority;
  entry.thread = this_thread_id();
  return entry;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Clock::duration duration_of(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string State::device_name(int index) const {
  return std::string(backend->name()) + ":" + std::to_string(devices[static_cast<std::size_t>(index)].device);
}

int State::index_of(int device) const {
  const auto it = std::find(device_ids.begin(), device_ids.end(), device);
  if (it == device_ids.end()) {
    std::ostringstream msg;
    msg << "octopus StreamScheduler: device " << device << " is not one this scheduler uses (devices:";
    for (const int d : device_ids) msg << " " << d;
    msg << ")";
    throw std::invalid_argument(msg.str());
  }
  return static_cast<int>(it - device_ids.begin());
}

std::pair<int, int> State::device_range(const AcquireRequest& r) const {
  if (r.device < 0) return {0, static_cast<int>(devices.size())};
  const int i = index_of(r.device);
  return {i, i + 1};
}

const KindModel* State::find_kind(const std::string& kind) const {
  const auto it = kinds.find(kind);
  return it == kinds.end() ? nullptr : &it->second;
}

void State::count_waiting(Waiter& w) {
  const auto [lo, hi] = device_range(*w.request);
  for (int i = lo; i < hi; ++i) devices[static_cast<std::size_t>(i)].latency_critical_waiting += 1;
  w.counted_waiting = true;
}

void State::uncount_waiting(Waiter& w) {
  if (!w.counted_waiting) return;
  w.counted_waiting = false;
  const auto [lo, hi] = device_range(*w.request);
  for (int i = lo; i < hi; ++i) devices[static_cast<std::size_t>(i)].latency_critical_waiting -= 1;
  throttle_changed.notify_all();
}

void State::grant(Waiter& w, int index, double occupancy) {
  DeviceState& d = devices[static_cast<std::size_t>(index)];
  const AcquireRequest& r = *w.request;
  const int first = policy.first_slot(w.work_class);
  // Best-effort leases take the free stream used last: one producer's leases then queue on
  // one stream, as its work would on a plain one. Spread round the pool, its kernels were
  // pending on several streams at once and a latency-critical chain of small kernels waited
  // about two 3 ms matmuls per kernel (H100: 22.5 ms for a 0.4 ms MLP graph, 6.6 ms with the
  // BE matmuls on one stream). The other classes take the least recently used one, so
  // independent callers do not queue behind each other's work.
  const bool most_recent = w.work_class == WorkClass::BestEffort;
  int slot = -1;
  for (int s = first; s < first + config.max_leases_per_device; ++s) {
    const StreamSlot& candidate = d.slots[static_cast<std::size_t>(s)];
    if (candidate.leased) continue;
    const uint64_t best = slot < 0 ? 0 : d.slots[static_cast<std::size_t>(slot)].last_used;
    if (slot < 0 || (most_recent ? candidate.last_used > best : candidate.last_used < best)) slot = s;
  }
  // The lease limit is at most the pool size per class, so a slot of the class is free.
  StreamSlot& chosen = d.slots[static_cast<std::size_t>(slot)];
  const auto now = Clock::now();
  chosen.leased = true;
  chosen.expected_release = now + duration_of(policy.typical_hold_s(find_kind(r.kind), w.work_class).value_or(0.0));
  d.active += 1;
  d.peak = std::max(d.peak, d.active);
  d.active_by_class[index_of_class(w.work_class)] += 1;
  (w.work_class == WorkClass::BestEffort ? d.best_effort_occupancy : d.occupancy) += occupancy;
  d.bytes_held += r.bytes;
  d.granted += 1;
  const double waited = seconds(now - w.requested);
  counters.granted += 1;
  counters.total_wait_s += waited;
  counters.max_wait_s = std::max(counters.max_wait_s, waited);
  class_stats(w.work_class).granted += 1;
  waits[index_of_class(w.work_class)].add(waited);
  uncount_waiting(w);
  if (w.work_class == WorkClass::BestEffort) {
    d.best_effort_epoch += 1;  // its work may start now
    refresh_idle(d);
    if (d.controller) d.controller->note_best_effort(r.kind, micros(now) * 1e-6);
  }
  LeaseGrant& g = w.grant;
  g.id = next_lease_id++;
  g.device = d.device;
  g.stream = w.work_class == WorkClass::BestEffort ? best_effort_stream(d, slot, r.kind) : chosen.handle;
  g.slot = slot;
  g.priority = w.priority;
  g.work_class = w.work_class;
  g.promoted = w.promoted;
  g.occupancy = occupancy;
  g.bytes = r.bytes;
  g.kind = r.kind;
  g.waited_s = waited;
  g.queued = w.queued;
  g.requested_us = micros(w.requested);
  g.arrived_us = g.requested_us - r.waited_before_s * 1e6;
  g.granted_us = micros(now);
  g.deadline_us = w.deadline ? micros(*w.deadline) : -1.0;
  g.previous_release = chosen.last_release;
  g.best_effort_idle = d.best_effort_idle && g.arrived_us >= d.best_effort_idle_since_us;
  g.best_effort_epoch = d.best_effort_epoch;
  g.control_generation = d.control_generation;
  if (w.work_class == WorkClass::BestEffort) d.best_effort_by_generation[d.control_generation] += 1;
  g.settled = w.work_class == WorkClass::LatencyCritical && settled(d, now);
  g.timed_release = w.work_class == WorkClass::LatencyCritical && d.controller && backend->times_events();
  g.gate_word = nullptr;
  g.gate_left_open = false;
  if (w.work_class == WorkClass::LatencyCritical && d.gate_words != nullptr && d.control.device_yield) {
    if (!d.controller || d.controller->closes_gate(r.kind)) {
      g.gate_word = d.gate_words + (slot - first);  // its slot's word; closed by its holder (Lease::close_gate)
      d.gate_closes += 1;
    } else {
      g.gate_left_open = true;
    }
  }
  w.granted = true;
  w.cv.notify_one();
}

void State::release(const LeaseGrant& g, const std::shared_ptr<ReleaseEvent>& event) {
  const int index = index_of(g.device);
  DeviceState& d = devices[static_cast<std::size_t>(index)];
  StreamSlot& slot = d.slots[static_cast<std::size_t>(g.slot)];
  slot.leased = false;
  slot.last_used = ++slot_clock;
  slot.last_release = event;
  const std::size_t c = index_of_class(g.work_class);
  d.active -= 1;
  d.active_by_class[c] -= 1;
  // No drift once idle.
  if (g.work_class == WorkClass::BestEffort) {
    d.best_effort_occupancy = d.active_by_class[c] == 0 ? 0.0 : d.best_effort_occupancy - g.occupancy;
  } else {
    const int others = d.active - d.active_by_class[index_of_class(WorkClass::BestEffort)];
    d.occupancy = others == 0 ? 0.0 : d.occupancy - g.occupancy;
  }
  d.bytes_held -= g.bytes;
  const auto now = Clock::now();
  const double released_us = micros(now);
  const double held = (released_us - g.granted_us) * 1e-6;
  counters.released += 1;
  ClassStats& stats = class_stats(g.work_class);
  stats.released += 1;
  holds[c].add(held);
  kinds[g.kind].holds[c].add(held);
  if (d.controller && event) {
    if (g.work_class == WorkClass::LatencyCritical) {
      pending_latencies.push_back(PendingLatency{g.kind, index, g.arrived_us, released_us, -1.0, event,
                                                 g.best_effort_idle, g.best_effort_epoch, g.settled,
                                                 g.control_generation, g.gate_left_open});
      control_wake.notify_one();
    } else if (g.work_class == WorkClass::BestEffort) {
      d.best_effort_releases_pending += 1;
      pending_releases.push_back(PendingRelease{index, event, g.control_generation});
      control_wake.notify_one();
    }
  } else if (g.work_class == WorkClass::BestEffort) {
    best_effort_finished(d, g.control_generation);  // not watched: taken as done when returned
  }
  if (g.work_class == WorkClass::BestEffort) refresh_idle(d);
  if (g.work_class == WorkClass::LatencyCritical && d.yield_gate) {
    d.yield_gate->max_wait_s.store(gate_wait_after_hold(held, d.recent_max_hold_s, config.best_effort_max_pause_s),
                                   std::memory_order_relaxed);
  }
  TimelineEntry entry = lease_entry(g, TimelineEntry::Type::Lease);
  entry.queued = g.queued;
  entry.closed_gate = g.gate_word != nullptr;
  entry.requested_us = g.requested_us;
  entry.granted_us = g.granted_us;
  entry.released_us = released_us;
  entry.deadline_us = g.deadline_us;
  if (g.deadline_us >= 0.0 && released_us > g.deadline_us) {
    stats.deadline_late += 1;
    TimelineEntry miss = entry;
    miss.type = TimelineEntry::Type::DeadlineMiss;
    miss.granted_us = released_us;
    miss.reason = "late";
    record(std::move(entry));
    record(std::move(miss));
  } else {
    record(std::move(entry));
  }
  if (g.work_class == WorkClass::LatencyCritical) throttle_changed.notify_all();
  schedule();
}

const ControlStep& State::control_for(const DeviceState& d, const std::string& kind) const {
  return d.controller && d.controller->released(kind) ? d.released_control : d.control;
}

StreamHandle State::best_effort_stream(const DeviceState& d, int slot, const std::string& kind) const {
  const int reserve = control_for(d, kind).reserved_sms;
  for (std::size_t r = 0; r < d.reserves.size(); ++r) {
    if (d.reserves[r] == reserve) {
      return d.partition_streams[static_cast<std::size_t>(slot - policy.first_slot(WorkClass::BestEffort))][r];
    }
  }
  return d.slots[static_cast<std::size_t>(slot)].handle;  // every SM
}

State::~State() {
  if (!backend) return;
  for (const DeviceState& d : devices) {
    if (d.gate_words != nullptr) {  // written by the latency-critical slots' leases only
      // A constructor that threw left its streams registered: none may read the gate once given back.
      if (d.yield_gate) unregister_yield_streams(d.yield_gate.get());
      const int n = config.max_leases_per_device, first = policy.first_slot(WorkClass::LatencyCritical);
      std::vector<StreamHandle> writers;
      for (int k = first; k < first + n; ++k) writers.push_back(d.slots[static_cast<std::size_t>(k)].handle);
      backend->return_gate(d.device, d.gate_words, n, writers);
    }
    for (const StreamSlot& slot : d.slots) {
      if (slot.handle != nullptr) backend->return_stream(d.device, slot.handle);
    }
    for (const std::vector<StreamHandle>& streams : d.partition_streams) {
      for (const StreamHandle stream : streams) backend->return_stream(d.device, stream);
    }
  }
}

bool State::settled(const DeviceState& d, Clock::time_point now) const {
  // Generations only grow: the oldest one with work left is the current one, or none is left.
  // A holder that never reaches a checkpoint keeps its generation for ever: past
  // kSettleBoundS, whatever it runs is taken as the current step's doing.
  return d.best_effort_by_generation.empty() || d.best_effort_by_generation.begin()->first == d.control_generation ||
         now - d.control_since >= duration_of(kSettleBoundS);
}

void State::best_effort_moved(DeviceState& d, uint64_t& generation) {
  if (generation == d.control_generation) return;
  best_effort_finished(d, generation);
  generation = d.control_generation;
  d.best_effort_by_generation[generation] += 1;
}

void State::best_effort_finished(DeviceState& d, uint64_t generation) {
  const auto it = d.best_effort_by_generation.find(generation);
  if (it != d.best_effort_by_generation.end() && --it->second <= 0) d.best_effort_by_generation.erase(it);
}

void State::refresh_idle(DeviceState& d) {
  const int holders = d.active_by_class[index_of_class(WorkClass::BestEffort)];
  const bool idle = holders == d.best_effort_drained && d.best_effort_releases_pending == 0;
  if (idle && !d.best_effort_idle) d.best_effort_idle_since_us = micros(Clock::now());
  d.best_effort_idle = idle;
}

void State::schedule() {
  std::vector<char> blocked(devices.size(), 0);
  std::size_t num_blocked = 0;
  const bool use_utilization = devices.size() > 1;
  for (Waiter* w : queue.waiters()) {
    if (num_blocked == devices.size()) break;
    const auto [lo, hi] = device_range(*w->request);
    const KindModel* kind = find_kind(w->request->kind);
    int best = -1;
    double best_occupancy = 0.0, best_load = 0.0, best_utilization = 0.0;
    for (int i = lo; i < hi; ++i) {
      if (blocked[static_cast<std::size_t>(i)]) {
        w->limit = Limit::Queue;
        w->limit_index = i;
        continue;
      }
      DeviceState& d = devices[static_cast<std::size_t>(i)];
      double occupancy = 0.0;
      const Limit limit = policy.fit(*w, kind, d, *backend, &occupancy);
      if (limit != Limit::None) {
        w->limit = limit;
        w->limit_index = i;
        continue;
      }
      const double load = policy.load(d);
      const double busy = use_utilization ? utilization->value(static_cast<std::size_t>(i)).value_or(0.0) : 0.0;
      if (best < 0 || load < best_load || (load == best_load && busy < best_utilization)) {
        best = i;
        best_occupancy = occupancy;
        best_load = load;
        best_utilization = busy;
      }
    }
    if (best >= 0) {
      grant(*w, best, best_occupancy);
    } else {
      for (int i = lo; i < hi; ++i) {
        if (!blocked[static_cast<std::size_t>(i)]) {
          blocked[static_cast<std::size_t>(i)] = 1;
          ++num_blocked;
        }
      }
    }
  }
  queue.remove_granted();
}

std::string State::describe(const Waiter& w) const {
  std::ostringstream msg;
  msg.precision(3);
  msg << "acquire(kind='" << w.request->kind << "', priority=" << w.request->priority;
  if (w.request->best_effort) msg << ", best_effort=true";
  if (w.request->deadline_s) msg << ", deadline=" << *w.request->deadline_s << " s";
  msg << ")";
  return msg.str();
}

std::string State::limit_message(const Waiter& w) const {
  if (w.limit_index < 0) return "no device was free";
  const DeviceState& d = devices[static_cast<std::size_t>(w.limit_index)];
  const std::string where = device_name(w.limit_index);
  std::ostringstream msg;
  msg.precision(3);
  switch (w.limit) {
    case Limit::Leases:
      msg << where << " was at its lease limit (" << d.active << " of " << d.lease_limit << " leases held; max_leases_per_device="
          << config.max_leases_per_device << ")";
      break;
    case Limit::BestEffortLeases:
      msg << where << " was at its best-effort lease limit (" << d.active_by_class[index_of_class(WorkClass::BestEffort)]
          << " of " << policy.best_effort_limit(d) << " best-effort leases held)";
      break;
    case Limit::Occupancy:
      msg << where << " was at its occupancy limit (estimated occupancy "
          << (w.work_class == WorkClass::BestEffort ? d.occupancy + d.best_effort_occupancy : d.occupancy)
          << " in use, this lease needs " << policy.occupancy(*w.request, find_kind(w.request->kind), d)
          << ", max_occupancy=" << config.max_occupancy << ")";
      break;
    case Limit::Memory:
      msg << where << " was below its free-memory reserve (" << d.memory.free_bytes << " bytes free, "
          << d.bytes_held << " held by leases, reserve " << policy.reserve_bytes(d) << " bytes (memory_reserve="
          << config.memory_reserve << ") plus this lease's " << w.request->bytes << " bytes)";
      break;
    case Limit::Queue:
    case Limit::None:
      msg << "it was queued behind requests served before it on " << where;
      break;
  }
  return msg.str();
}

void State::record(TimelineEntry entry) {
  if (config.record_timeline && timeline.size() < config.timeline_capacity) timeline.push_back(std::move(entry));
}

void State::record_deadline_miss(const Waiter& w, const char* reason, Clock::time_point now) {
  TimelineEntry entry;
  entry.type = TimelineEntry::Type::DeadlineMiss;
  entry.kind = w.request->kind;
  entry.work_class = w.work_class;
  entry.device = w.limit_index >= 0 ? device_ids[static_cast<std::size_t>(w.limit_index)]
                                    : (w.request->device >= 0 ? w.request->device : device_ids.front());
  entry.priority = w.priority;
  entry.thread = this_thread_id();
  entry.requested_us = micros(w.requested);
  entry.granted_us = micros(now);
  entry.deadline_us = w.deadline ? micros(*w.deadline) : -1.0;
  entry.reason = reason;
  record(std::move(entry));
}

void State::admit_deadline(Waiter& w) {
  if (!w.deadline) return;
  const auto now = Clock::now();
  const auto [lo, hi] = device_range(*w.request);
  const KindModel* kind = find_kind(w.request->kind);
  const std::optional<double> hold = policy.typical_hold_s(kind, w.work_class);
  const double wait = policy.expected_wait_s(w, devices, lo, hi, queue, kinds, now, *backend);
  const double slack = seconds(*w.deadline - now);
  if (wait + hold.value_or(0.0) <= slack) return;
  ClassStats& stats = class_stats(w.work_class);
  if (config.infeasible_deadline == InfeasibleDeadline::Promote) {
    stats.deadline_promoted += 1;
    w.promoted = true;
    w.work_class = WorkClass::LatencyCritical;
    w.priority = std::max(w.priority, 1);
    return;
  }
  stats.deadline_rejected += 1;
  record_deadline_miss(w, "rejected", now);
  std::ostringstream msg;
  msg.precision(3);
  msg << "octopus StreamScheduler: " << describe(w) << " cannot meet its deadline: expected wait " << wait
      << " s + typical hold " << hold.value_or(0.0) << " s of kind '" << w.request->kind << "' (median of its last "
      << (kind ? kind->holds[index_of_class(w.work_class)].size() : 0)
      << " leases of its class, " << work_class_name(w.work_class) << ") > " << slack
      << " s left (infeasible_deadline=\"reject\"; \"promote\" makes such requests latency-critical instead)";
  throw DeadlineMissed(msg.str());
}

void State::give_up(Waiter& w, bool deadline_passed) {
  queue.remove(w);
  uncount_waiting(w);
  counters.waiting -= 1;
  const auto now = Clock::now();
  const double waited = seconds(now - w.requested);
  counters.total_wait_s += waited;
  counters.max_wait_s = std::max(counters.max_wait_s, waited);
  if (deadline_passed) {
    class_stats(w.work_class).deadline_expired += 1;
    record_deadline_miss(w, "expired", now);
  } else {
    counters.timeouts += 1;
    TimelineEntry entry;
    entry.type = TimelineEntry::Type::Timeout;
    entry.kind = w.request->kind;
    entry.work_class = w.work_class;
    entry.device = w.limit_index >= 0 ? device_ids[static_cast<std::size_t>(w.limit_index)] : device_ids.front();
    entry.priority = w.priority;
    entry.thread = this_thread_id();
    entry.requested_us = micros(w.requested);
    entry.granted_us = micros(now);
    record(std::move(entry));
  }
  schedule();  // this request no longer blocks the ones behind it
}

void State::add_slice_timings(const std::string& kind, const std::vector<SliceTiming>& timings) {
  if (!timings.empty()) detail::add_slice_timings(kinds[kind], timings, Clock::now());
}

void State::keep_ended_window(std::string kind, std::unique_ptr<InFlightWindow> window) {
  if (ended_windows.size() >= kEndedWindows) ended_windows.erase(ended_windows.begin());
  ended_windows.emplace_back(std::move(kind), std::move(window));
}

void State::measure_ended_windows() {
  for (auto it = ended_windows.begin(); it != ended_windows.end();) {
    bool failed = false;
    try {
      add_slice_timings(it->first, it->second->take_finished());
    } catch (...) {
      failed = true;
    }
    it = failed || it->second->size() == 0 ? ended_windows.erase(it) : it + 1;
  }
}

void State::drop_ended_windows(const std::string& kind) {
  ended_windows.erase(std::remove_if(ended_windows.begin(), ended_windows.end(),
                                     [&](const auto& w) { return w.first == kind; }),
                      ended_windows.end());
}

double State::pause_if_throttled(const LeaseGrant& g, std::unique_lock<std::mutex>& lock,
                                 const std::function<void()>& drain) {
  DeviceState& d = devices[static_cast<std::size_t>(index_of(g.device))];
  if (d.controller) d.controller->note_best_effort(g.kind, micros(Clock::now()) * 1e-6);
  if (!policy.throttled(d, control_for(d, g.kind))) return 0.0;
  const auto start = Clock::now();
  const bool bounded = config.best_effort_max_pause_s >= 0.0;
  const auto give_up_at = start + duration_of(bounded ? config.best_effort_max_pause_s : 0.0);
  bool drained = false;
  while (policy.throttled(d, control_for(d, g.kind))) {
    if (d.probing && !drained) {
      // A probe measures latency-critical work alone: none of this holder's may still run.
      lock.unlock();
      try {
        drain();
      } catch (...) {
        lock.lock();
        throw;
      }
      lock.lock();
      drained = true;
      d.best_effort_drained += 1;
      refresh_idle(d);
      continue;
    }
    if (!bounded) {
      throttle_changed.wait(lock);
    } else if (throttle_changed.wait_until(lock, give_up_at) == std::cv_status::timeout) {
      break;
    }
  }
  if (drained) {
    d.best_effort_drained -= 1;
    d.best_effort_epoch += 1;  // its work starts again
    refresh_idle(d);
  }
  const auto end = Clock::now();
  const double paused = seconds(end - start);
  ClassStats& stats = class_stats(WorkClass::BestEffort);
  stats.pauses += 1;
  stats.throttled_s += paused;
  TimelineEntry entry = lease_entry(g, TimelineEntry::Type::Throttle);
  entry.granted_us = micros(start);
  entry.released_us = micros(end);
  record(std::move(entry));
  return paused;
}

void State::adapt_limits() {
  for (std::size_t i = 0; i < devices.size(); ++i) {
    devices[i].lease_limit = policy.adapted_lease_limit(devices[i].lease_limit, utilization->value(i));
  }
  schedule();
}

}  // namespace octopus::scheduler::detail

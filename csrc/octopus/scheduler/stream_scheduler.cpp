#include "octopus/scheduler/stream_scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "octopus/scheduler/in_flight.h"
#include "octopus/scheduler/scheduler_state.h"
#include "octopus/scheduler/yield_gate.h"

namespace octopus::scheduler {
namespace {

void check_request_times(const AcquireRequest& request) {
  if (request.deadline_s && std::isnan(*request.deadline_s)) {
    throw std::invalid_argument("octopus StreamScheduler: deadline must be a number of seconds");
  }
  if (!(request.waited_before_s >= 0.0 && std::isfinite(request.waited_before_s))) {
    throw std::invalid_argument(
        "octopus StreamScheduler: waited_before_s must be a finite number of seconds, at least 0");
  }
}

}  // namespace

using detail::Clock;

Lease::Lease(std::shared_ptr<detail::State> state, LeaseGrant grant)
    : state_(std::move(state)), grant_(std::move(grant)) {}

Lease::Lease(Lease&& other) noexcept { *this = std::move(other); }

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    try {
      release();
    } catch (...) {
    }
    state_ = std::move(other.state_);
    other.state_.reset();
    grant_ = std::move(other.grant_);
    release_event_ = std::move(other.release_event_);
    in_flight_ = std::move(other.in_flight_);
  }
  return *this;
}

Lease::~Lease() {
  try {
    release();
  } catch (...) {
    // A destructor cannot report a failed event record; the stream is back in the pool.
  }
}

double Lease::checkpoint(double units) {
  if (!state_) throw std::logic_error("octopus StreamScheduler: checkpoint() on a lease that was returned");
  if (grant_.work_class != WorkClass::BestEffort) return 0.0;
  if (!(units >= 0.0)) throw std::invalid_argument("octopus StreamScheduler: checkpoint units must be >= 0");
  detail::State& s = *state_;
  int in_flight = 0;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    in_flight = s.control_for(s.device_of(grant_.device), grant_.kind).in_flight;
  }
  std::vector<detail::SliceTiming> timings;
  if (in_flight > 0) {
    if (!in_flight_) in_flight_ = std::make_unique<detail::InFlightWindow>(s.events, grant_.device, grant_.stream);
    in_flight_->mark();
    timings = in_flight_->wait_until_at_most(static_cast<std::size_t>(in_flight - 1));
  }
  double paused = 0.0;
  StreamHandle stream = grant_.stream;
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    s.add_slice_timings(grant_.kind, timings);
    s.measure_ended_windows();  // returned leases' last slices (any kind's), where they have finished
    detail::DeviceState& d = s.device_of(grant_.device);
    // What it runs from here (paused or not) follows the control in force then.
    s.best_effort_moved(d, grant_.control_generation);
    paused = s.pause_if_throttled(grant_, lock, [this] { drain(); });
    s.best_effort_moved(d, grant_.control_generation);
    d.best_effort_units += units;
    stream = s.best_effort_stream(d, grant_.slot, grant_.kind);
  }
  if (stream != grant_.stream) move_to(stream);
  if (in_flight_) in_flight_->start_slice(units);
  return paused;
}

void Lease::close_gate() {
  if (grant_.gate_word != nullptr) state_->backend->write_gate(grant_.device, grant_.stream, grant_.gate_word, kYieldAll);
}

void Lease::drain() {
  detail::State& s = *state_;
  if (in_flight_) {
    in_flight_->wait_until_at_most(0);
    return;
  }
  EventHandle event = s.events->take(grant_.device);
  try {
    s.backend->record_event(grant_.device, event, grant_.stream);
    s.backend->synchronize_event(grant_.device, event);
  } catch (...) {
    s.events->give_back(grant_.device, event);
    throw;
  }
  s.events->give_back(grant_.device, event);
}

void Lease::move_to(StreamHandle stream) {
  detail::State& s = *state_;
  // The wait takes the event's state now: it can go back to the pool at once.
  EventHandle event = s.events->take(grant_.device);
  try {
    s.backend->record_event(grant_.device, event, grant_.stream);
    s.backend->stream_wait_event(grant_.device, stream, event);
  } catch (...) {
    s.events->give_back(grant_.device, event);
    throw;
  }
  s.events->give_back(grant_.device, event);
  grant_.stream = stream;
  if (in_flight_) in_flight_->set_stream(stream);
}

void Lease::end_slice() {
  if (in_flight_) in_flight_->end_slice();
}

std::shared_ptr<ReleaseEvent> Lease::release() {
  if (!state_) return nullptr;
  std::shared_ptr<detail::State> state = std::move(state_);
  state_.reset();
  std::unique_ptr<detail::InFlightWindow> window = std::move(in_flight_);
  std::shared_ptr<ReleaseEvent> event;
  std::exception_ptr failure;
  if (window) window->drop_open_slice();
  try {
    if (grant_.gate_word != nullptr) state->backend->write_gate(grant_.device, grant_.stream, grant_.gate_word, 0);
    EventHandle handle = state->events->take(grant_.device, grant_.timed_release);
    event = std::make_shared<ReleaseEvent>(state->events, grant_.device, handle, grant_.timed_release);
    state->backend->record_event(grant_.device, handle, grant_.stream);
  } catch (...) {
    event.reset();
    failure = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->release(grant_, event);
    if (window && window->size() > 0) state->keep_ended_window(grant_.kind, std::move(window));
  }
  if (failure) std::rethrow_exception(failure);
  release_event_ = event;
  return event;
}

StreamScheduler::StreamScheduler(SchedulerConfig config, std::shared_ptr<DeviceBackend> backend)
    : state_(std::make_shared<detail::State>()) {
  validate(config);
  if (!backend) throw std::invalid_argument("octopus StreamScheduler: no device backend");
  detail::State& s = *state_;
  s.backend = std::move(backend);
  const int count = s.backend->device_count();
  if (config.devices.empty()) {
    for (int d = 0; d < count; ++d) config.devices.push_back(d);
  }
  for (std::size_t i = 0; i < config.devices.size(); ++i) {
    const int d = config.devices[i];
    if (d < 0 || d >= count) {
      throw std::invalid_argument("octopus StreamScheduler: devices lists " + std::to_string(d) + " but the " +
                                  s.backend->name() + " backend has " + std::to_string(count) + " device(s)");
    }
    if (std::find(config.devices.begin(), config.devices.begin() + static_cast<std::ptrdiff_t>(i), d) !=
        config.devices.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw std::invalid_argument("octopus StreamScheduler: devices lists " + std::to_string(d) + " twice");
    }
  }
  s.config = std::move(config);
  s.device_ids = s.config.devices;
  s.events = std::make_shared<detail::EventPool>(s.backend, s.device_ids);
  s.utilization = std::make_unique<detail::UtilizationMonitor>(s.backend, s.device_ids, s.config.utilization_interval_s);
  s.devices.resize(s.device_ids.size());
  const int n = s.config.max_leases_per_device;
  const int best_effort_first = s.policy.first_slot(WorkClass::BestEffort);
  for (std::size_t i = 0; i < s.device_ids.size(); ++i) {
    detail::DeviceState& d = s.devices[i];
    d.device = s.device_ids[i];
    d.multiprocessors = std::max(1, s.backend->multiprocessor_count(d.device));
    d.lease_limit = n;
    d.slots.resize(static_cast<std::size_t>(3 * n));
    for (int k = 0; k < 3 * n; ++k) {
      d.slots[static_cast<std::size_t>(k)].handle = s.backend->create_stream(d.device, k >= n && k < best_effort_first);
    }
    // The yield gate: a word per latency-critical slot; the best-effort streams read it
    // (partition streams are registered as setup_control makes them).
    d.gate_words = s.backend->create_gate(d.device, n);
    if (d.gate_words != nullptr) {
      d.yield_gate = std::make_shared<YieldGateState>();
      d.yield_gate->gate = YieldGate{d.gate_words, n};
      for (int k = best_effort_first; k < 3 * n; ++k) {
        register_yield_stream(d.slots[static_cast<std::size_t>(k)].handle, d.yield_gate);
      }
    }
  }
  s.setup_control();
  if (s.config.latency_control) controller_ = std::thread([state = state_] { state->control_loop(); });
  if (s.config.target_utilization) {
    adapter_ = std::thread([state = state_] {
      const auto interval = detail::duration_of(state->config.utilization_interval_s);
      while (true) {
        {
          std::unique_lock<std::mutex> lock(state->mutex);
          if (state->adapter_wake.wait_for(lock, interval, [&] { return state->stopping; })) return;
        }
        try {
          state->utilization->refresh(true);
          std::lock_guard<std::mutex> lock(state->mutex);
          state->adapt_limits();
        } catch (...) {
          // A failed sample leaves the limits as they are; the next step tries again.
        }
      }
    });
  }
}

StreamScheduler::~StreamScheduler() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->adapter_wake.notify_all();
  state_->control_wake.notify_all();
  if (adapter_.joinable()) adapter_.join();
  if (controller_.joinable()) controller_.join();
  // Launches on its streams no longer yield; leases still held keep the gates' words in use
  // (the backend takes them back with the last lease: State::~State).
  for (const detail::DeviceState& d : state_->devices) {
    if (d.yield_gate) unregister_yield_streams(d.yield_gate.get());
  }
}

Lease StreamScheduler::acquire(const AcquireRequest& request, const std::function<void()>& before_blocking) {
  detail::State& s = *state_;
  const double timeout = request.timeout_s.value_or(s.config.timeout_s);
  if (std::isnan(timeout)) throw std::invalid_argument("octopus StreamScheduler: timeout must be a number of seconds");
  check_request_times(request);
  bool blocking = false;
  const auto block = [&] {
    if (!blocking && before_blocking) before_blocking();
    blocking = true;
  };
  if (s.devices.size() > 1) {  // outside the lock: NVML may be slow
    block();
    s.utilization->refresh();
  }
  detail::Waiter w;
  w.request = &request;
  w.work_class = work_class_of(request);
  w.priority = request.priority;
  w.requested = Clock::now();
  if (request.deadline_s) w.deadline = w.requested + detail::duration_of(*request.deadline_s);
  const bool forever = timeout < 0.0;
  const auto timeout_at = w.requested + detail::duration_of(forever ? 0.0 : timeout);
  std::unique_lock<std::mutex> lock(s.mutex);
  s.device_range(request);  // a clear error for an unknown device
  s.admit_deadline(w);
  s.queue.push(w);
  s.schedule();
  if (!w.granted) {
    w.queued = true;
    s.counters.waited += 1;
    s.counters.waiting += 1;
    if (w.work_class == WorkClass::LatencyCritical) s.count_waiting(w);
    if (before_blocking && !blocking) {  // (a grant while unlocked is seen below)
      lock.unlock();
      block();
      lock.lock();
    }
    // Free memory changes without a lease coming back, so memory waits poll.
    const bool poll = s.policy.memory_check_needed(request);
    const auto poll_step = detail::duration_of(s.config.memory_poll_interval_s);
    while (!w.granted) {
      std::optional<Clock::time_point> wake;
      if (!forever) wake = timeout_at;
      if (w.deadline) wake = wake ? std::min(*wake, *w.deadline) : *w.deadline;
      if (poll) wake = wake ? std::min(*wake, Clock::now() + poll_step) : Clock::now() + poll_step;
      if (wake) {
        w.cv.wait_until(lock, *wake);
      } else {
        w.cv.wait(lock);
      }
      if (w.granted) break;
      const auto now = Clock::now();
      const bool deadline_passed = w.deadline && now >= *w.deadline;
      if (deadline_passed || (!forever && now >= timeout_at)) {
        s.give_up(w, deadline_passed);
        std::ostringstream msg;
        msg.precision(3);
        const double waited = detail::seconds(now - w.requested);
        if (deadline_passed) {
          msg << "octopus StreamScheduler: " << s.describe(w) << " missed its deadline after waiting " << waited
              << " s: " << s.limit_message(w);
          throw DeadlineMissed(msg.str());
        }
        msg << "octopus StreamScheduler: " << s.describe(w) << " timed out after " << waited << " s (timeout=" << timeout
            << " s): " << s.limit_message(w);
        throw LeaseTimeout(msg.str());
      }
      if (poll) s.schedule();
    }
    s.counters.waiting -= 1;
  }
  lock.unlock();
  Lease lease(state_, w.grant);
  lease.close_gate();
  return lease;
}

std::optional<Lease> StreamScheduler::try_acquire(const AcquireRequest& request,
                                                  const std::function<void()>& before_blocking) {
  detail::State& s = *state_;
  check_request_times(request);
  if (s.devices.size() > 1) {  // NVML may be slow
    if (before_blocking) before_blocking();
    s.utilization->refresh();
  }
  detail::Waiter w;
  w.request = &request;
  w.work_class = work_class_of(request);
  w.priority = request.priority;
  w.requested = Clock::now();
  if (request.deadline_s) w.deadline = w.requested + detail::duration_of(*request.deadline_s);
  std::unique_lock<std::mutex> lock(s.mutex);
  s.device_range(request);
  s.admit_deadline(w);
  s.queue.push(w);
  s.schedule();
  if (!w.granted) {
    s.queue.remove(w);
    s.counters.rejected += 1;
    s.schedule();
    return std::nullopt;
  }
  lock.unlock();
  Lease lease(state_, w.grant);
  lease.close_gate();
  return lease;
}

void StreamScheduler::register_kind(const std::string& kind, double occupancy) {
  if (!(occupancy > 0.0 && occupancy <= 1.0)) {
    throw std::invalid_argument("octopus StreamScheduler: the occupancy of kind '" + kind +
                                "' must be in (0, 1], got " + std::to_string(occupancy));
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->kinds[kind].estimate = occupancy;
}

void StreamScheduler::register_kernel(const std::string& kind, KernelProfile profile) {
  if (profile.blocks_per_sm < 1 || profile.elements_per_block < 1) {
    throw std::invalid_argument("octopus StreamScheduler: kernel '" + kind +
                                "' needs blocks_per_sm >= 1 and elements_per_block >= 1");
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->kinds[kind].estimate = profile;
}

double StreamScheduler::estimate_occupancy(const std::string& kind, const std::vector<int64_t>& shape, int device) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  AcquireRequest r;
  r.kind = kind;
  r.shape = shape;
  return state_->policy.occupancy(r, state_->find_kind(kind), state_->devices[static_cast<std::size_t>(state_->index_of(device))]);
}

std::optional<double> StreamScheduler::seconds_per_unit(const std::string& kind) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const detail::KindModel* k = state_->find_kind(kind);
  return k ? k->seconds_per_unit : std::nullopt;
}

std::optional<double> StreamScheduler::host_seconds_per_slice(const std::string& kind) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const detail::KindModel* k = state_->find_kind(kind);
  return k ? k->host_slice_s : std::nullopt;
}

void StreamScheduler::set_seconds_per_unit(const std::string& kind, double seconds) {
  if (!(seconds > 0.0) || std::isinf(seconds)) {
    throw std::invalid_argument("octopus StreamScheduler: seconds per unit of kind '" + kind +
                                "' must be positive, got " + std::to_string(seconds));
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->drop_ended_windows(kind);  // slices of its returned leases not measured yet are left out
  detail::set_seconds_per_unit(state_->kinds[kind], seconds, detail::Clock::now());
}

void StreamScheduler::adapt_concurrency() {
  state_->utilization->refresh(true);
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->adapt_limits();
}

void StreamScheduler::set_target(const std::string& kind, std::optional<double> p99_s, std::optional<double> ratio) {
  detail::State& s = *state_;
  if (!s.config.latency_control) {
    throw std::logic_error("octopus StreamScheduler: set_target needs latency_control on");
  }
  LatencyTarget target;
  target.p99_s = p99_s;
  target.ratio = ratio.value_or(s.config.latency_ratio);
  std::lock_guard<std::mutex> lock(s.mutex);
  for (detail::DeviceState& d : s.devices) d.controller->set_target(kind, target);
}

std::optional<double> StreamScheduler::slice_budget_s(int device, const std::string& kind) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  const detail::DeviceState& d = state_->device_of(device);
  if (!d.controller) return std::nullopt;
  return state_->control_for(d, kind).slice_budget_s;
}

std::vector<std::string> StreamScheduler::take_reports() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  std::vector<std::string> out;
  out.swap(state_->reports);
  state_->has_reports.store(false);
  return out;
}

bool StreamScheduler::has_reports() const { return state_->has_reports.load(std::memory_order_relaxed); }

const SchedulerConfig& StreamScheduler::config() const { return state_->config; }

const std::vector<int>& StreamScheduler::devices() const { return state_->device_ids; }

const char* StreamScheduler::backend_name() const { return state_->backend->name(); }

DeviceBackend& StreamScheduler::backend() const { return *state_->backend; }

SchedulerStats StreamScheduler::stats() const {
  detail::State& s = *state_;
  s.utilization->refresh();  // outside the lock
  std::lock_guard<std::mutex> lock(s.mutex);
  SchedulerStats out = s.counters;
  for (int c = 0; c < kWorkClasses; ++c) {
    ClassStats& cs = out.classes[static_cast<std::size_t>(c)];
    cs.wait_p50_s = s.waits[static_cast<std::size_t>(c)].quantile(0.5);
    cs.wait_p99_s = s.waits[static_cast<std::size_t>(c)].quantile(0.99);
    cs.hold_p50_s = s.holds[static_cast<std::size_t>(c)].quantile(0.5);
    cs.hold_p99_s = s.holds[static_cast<std::size_t>(c)].quantile(0.99);
  }
  for (std::size_t i = 0; i < s.devices.size(); ++i) {
    const detail::DeviceState& d = s.devices[i];
    DeviceStats ds;
    ds.device = d.device;
    ds.active_leases = d.active;
    ds.peak_leases = d.peak;
    ds.best_effort_leases = d.active_by_class[detail::index_of_class(WorkClass::BestEffort)];
    ds.latency_critical_leases = d.active_by_class[detail::index_of_class(WorkClass::LatencyCritical)];
    ds.lease_limit = d.lease_limit;
    ds.occupancy_in_use = d.occupancy + d.best_effort_occupancy;
    ds.granted = d.granted;
    ds.free_bytes = d.memory.free_bytes;
    ds.total_bytes = d.memory.total_bytes;
    ds.partition_sms = d.control.reserved_sms > 0 ? d.multiprocessors - d.control.reserved_sms : 0;
    ds.yield_gate = d.yield_gate != nullptr;
    ds.gate_closes = d.gate_closes;
    ds.yielding_launches = d.yield_gate ? d.yield_gate->launches.load(std::memory_order_relaxed) : 0;
    ds.utilization = s.utilization->value(i);
    ControlStats& cs = ds.control;
    cs.settings = d.control;
    cs.probing = d.probing;
    cs.best_effort_units = d.best_effort_units;
    cs.reserves = d.reserves;
    cs.partition_error = d.partition_error;
    if (d.controller) {
      cs.enabled = true;
      cs.step = d.controller->step();
      cs.steps = static_cast<int>(d.controller->ladder().size());
      cs.climbs = d.controller->climbs();
      cs.median_climbs = d.controller->median_climbs();
      cs.unhelpful_descents = d.controller->unhelpful_descents();
      cs.seconds_at_steps = d.controller->seconds_at_steps(s.micros(Clock::now()) * 1e-6);
      cs.descents = d.controller->descents();
      cs.probes = d.controller->probes();
      cs.kinds = d.controller->kinds();
      cs.released_settings = d.released_control;
      cs.best_effort = d.controller->best_effort_kinds();
    }
    out.devices.push_back(ds);
  }
  return out;
}

std::string StreamScheduler::trace_json() const {
  const SchedulerStats summary = stats();
  std::vector<TimelineEntry> entries;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    entries = state_->timeline;
  }
  return chrome_trace_json(entries, state_->backend->name(), summary);
}

void StreamScheduler::write_trace(const std::string& path) const {
  const std::string json = trace_json();
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw std::runtime_error("octopus StreamScheduler: cannot open '" + path + "' to write the trace");
  file << json;
  if (!file.flush()) throw std::runtime_error("octopus StreamScheduler: writing the trace to '" + path + "' failed");
}

}  // namespace octopus::scheduler

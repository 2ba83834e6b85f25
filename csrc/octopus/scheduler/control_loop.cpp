// Latency control, carried out: the partitions best-effort work can be moved to, the
// controller of each device, and the control thread that watches latency-critical
// completions, feeds the controllers and applies what they decide. The decisions are the
// LatencyController's (latency_controller.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <thread>

#include "octopus/scheduler/device_clock.h"
#include "octopus/scheduler/scheduler_state.h"

namespace octopus::scheduler::detail {
namespace {

// How often the control thread looks at the controllers when nothing completes.
constexpr auto kTick = std::chrono::milliseconds(5);
// How often it polls returned best-effort work that has not finished.
constexpr auto kPoll = std::chrono::microseconds(100);
// Without a device clock: a latency-critical lease whose work was already done when the
// control thread first looked, this soon after its return, is taken to have completed when
// it was returned (its holder waited for it); later, when it was looked at (an upper bound).
constexpr double kPromptUs = 200.0;
// The fractions of a device's SMs the default ladder keeps free of best-effort work.
constexpr double kReserveFractions[] = {0.06, 0.12, 0.18, 0.25};

ControllerOptions controller_options(const SchedulerConfig& config) {
  ControllerOptions o;
  o.default_ratio = config.latency_ratio;
  o.budget_cap = config.latency_error_budget;
  o.try_gates = !config.device_yield;  // pinned on, every LC lease closes it (pinned off, none yields)
  return o;
}

}  // namespace

void State::setup_control() {
  const int n = config.max_leases_per_device;
  for (DeviceState& d : devices) {
    // Partitions: the pinned one, or one per reserve of the default ladder where they can be made.
    std::vector<int> wanted;
    if (config.reserved_sms) {
      if (*config.reserved_sms > 0) wanted.push_back(*config.reserved_sms);
    } else if (config.latency_control) {
      for (const double f : kReserveFractions) wanted.push_back(static_cast<int>(std::lround(f * d.multiprocessors)));
    }
    for (const int reserve : wanted) {
      int sms = 0;
      try {
        sms = backend->create_partition(d.device, reserve);
      } catch (const std::exception& e) {
        if (config.reserved_sms) {
          throw std::runtime_error("octopus StreamScheduler: reserved_sms=" + std::to_string(reserve) +
                                   " needs an SM partition on " + backend->name() + ":" + std::to_string(d.device) +
                                   ", which could not be made: " + e.what());
        }
        d.partition_error = e.what();
        d.reserves.clear();
        break;
      }
      // The partition keeps at least `reserve` SMs free (whole groups): say how many it keeps.
      const int kept = d.multiprocessors - sms;
      if (std::find(d.reserves.begin(), d.reserves.end(), kept) == d.reserves.end()) {
        d.reserves.push_back(kept);
        d.partition_streams.resize(static_cast<std::size_t>(n));
        for (int k = 0; k < n; ++k) {
          d.partition_streams[static_cast<std::size_t>(k)].push_back(backend->create_partition_stream(d.device, reserve));
          if (d.yield_gate) register_yield_stream(d.partition_streams[static_cast<std::size_t>(k)].back(), d.yield_gate);
        }
      }
    }
    if (config.latency_control) {
      // Its steps yield as the device will: never without a gate, as pinned where pinned.
      std::optional<bool> device_yield = config.device_yield;
      if (d.gate_words == nullptr) device_yield = false;
      d.controller = std::make_unique<LatencyController>(
          controller_options(config), default_ladder(d.multiprocessors, d.reserves, device_yield));
    }
    apply_control(d, Clock::now());
  }
}

void State::apply_control(DeviceState& d, Clock::time_point now) {
  ControlStep step;
  step.slice_budget_s = 0.0;  // without a controller: slices as the caller sizes them
  step.throttle = ThrottleMode::Held;
  step.in_flight = 2;
  step.reserved_sms = 0;
  ControlStep released = step;
  if (d.controller) {
    step = d.controller->settings();
    released = d.controller->released_settings();
  }
  for (ControlStep* s : {&step, &released}) {  // the pinned knobs hold for every kind
    if (config.throttle) s->throttle = *config.throttle;
    if (config.best_effort_in_flight) s->in_flight = *config.best_effort_in_flight;
    if (config.reserved_sms) s->reserved_sms = d.reserves.empty() ? 0 : d.reserves.front();
    if (config.device_yield) s->device_yield = *config.device_yield;
  }
  const bool probing = d.controller && d.controller->probing();
  const int64_t release_changes = d.controller ? d.controller->release_changes() : 0;
  const bool changed = !same_settings(step, d.control) || !same_settings(released, d.released_control) ||
                       probing != d.probing || release_changes != d.release_changes;  // a kind released or held again
  d.control = step;
  d.released_control = released;
  if (changed) {
    d.control_generation += 1;
    d.control_since = now;
  }
  // Best-effort kernels read the gate where any best-effort work of the device yields now
  // (latency-critical leases close it only where d.control says so).
  if (d.yield_gate) d.yield_gate->active.store(step.device_yield || released.device_yield);
  d.release_changes = release_changes;
  d.probing = probing;
  if (!changed) return;
  throttle_changed.notify_all();  // paused holders look again
  TimelineEntry entry;
  entry.type = TimelineEntry::Type::Control;
  entry.device = d.device;
  entry.granted_us = micros(now);
  entry.step = d.controller ? d.controller->step() : -1;
  entry.control = step;
  entry.probing = probing;
  record(std::move(entry));
}

void State::control_loop() {
  // Each device's clock, where the backend times events (the control thread's own: it
  // polls a reference event on them).
  std::vector<std::unique_ptr<DeviceClock>> clocks(devices.size());
  if (backend->times_events()) {
    for (std::size_t i = 0; i < devices.size(); ++i) {
      if (!devices[i].controller) continue;
      try {
        clocks[i] = std::make_unique<DeviceClock>(*backend, devices[i].device, [this] { return micros(Clock::now()); });
      } catch (const std::exception&) {
        clocks[i].reset();  // completions are then stamped when they are seen
      }
    }
  }
  // When a watched lease's job was done for its caller: its work finished on the device and
  // the lease returned (a holder that waits for its work inside the lease returns it when
  // its thread has the result). The device's clock says when the work finished where there
  // is one (never after it was seen done); else the control thread's look bounds it.
  const auto completed_us = [&](const PendingLatency& p, double seen_us, bool prompt) {
    DeviceClock* clock = clocks[static_cast<std::size_t>(p.index)].get();
    if (clock && p.event->timed()) {
      if (const std::optional<double> t = clock->completed_us(p.event->handle())) {
        return std::min(std::max(*t, p.released_us), seen_us);
      }
    }
    return prompt ? p.released_us : seen_us;
  };
  std::vector<PendingLatency> watching;
  std::vector<PendingRelease> returned;
  std::unique_lock<std::mutex> lock(mutex);
  while (!stopping) {
    if (pending_latencies.empty() && pending_releases.empty() && watching.empty()) {
      control_wake.wait_for(lock, returned.empty() ? std::chrono::duration_cast<Clock::duration>(kTick)
                                                   : std::chrono::duration_cast<Clock::duration>(kPoll));
      if (stopping) return;
    }
    for (PendingLatency& p : pending_latencies) watching.push_back(std::move(p));
    pending_latencies.clear();
    for (PendingRelease& p : pending_releases) returned.push_back(std::move(p));
    pending_releases.clear();
    lock.unlock();

    // Outside the lock: which returned work has finished, and when.
    struct Finished {
      PendingLatency p;
      double completed_us;
    };
    std::vector<Finished> finished;
    std::vector<PendingRelease> released_done;
    try {
      for (const std::unique_ptr<DeviceClock>& clock : clocks) {
        if (clock) clock->maybe_calibrate();
      }
      const double check_us = micros(Clock::now());
      for (auto it = watching.begin(); it != watching.end();) {
        if (it->event->done()) {
          const bool prompt = it->first_check_us < 0.0 && check_us - it->released_us <= kPromptUs;
          const double completed = completed_us(*it, check_us, prompt);
          finished.push_back(Finished{std::move(*it), completed});
          it = watching.erase(it);
        } else {
          if (it->first_check_us < 0.0) it->first_check_us = check_us;
          ++it;
        }
      }
      for (auto it = returned.begin(); it != returned.end();) {
        if (it->event->done()) {
          released_done.push_back(std::move(*it));
          it = returned.erase(it);
        } else {
          ++it;
        }
      }
      if (!watching.empty()) {
        // The oldest unfinished latency-critical work: wait for it, to see when it ends.
        PendingLatency& oldest = watching.front();
        oldest.event->synchronize();
        const double completed = completed_us(oldest, micros(Clock::now()), false);
        finished.push_back(Finished{std::move(oldest), completed});
        watching.erase(watching.begin());
      }
    } catch (...) {
      // A failed event query (a broken context) leaves latency control where it is; returned
      // best-effort work is taken as finished.
      watching.clear();
      for (PendingRelease& p : returned) released_done.push_back(std::move(p));
      returned.clear();
    }

    lock.lock();
    const auto now = Clock::now();
    const double now_s = micros(now) * 1e-6;
    for (Finished& f : finished) {
      DeviceState& d = devices[static_cast<std::size_t>(f.p.index)];
      const double latency_s = (f.completed_us - f.p.arrived_us) * 1e-6;
      const bool alone = f.p.idle && d.best_effort_epoch == f.p.epoch;
      // Ran wholly under the settings in force now, with none of earlier settings' BE work left.
      const bool settled = f.p.settled && f.p.generation == d.control_generation;
      d.controller->observe(f.p.kind, latency_s, alone, f.completed_us * 1e-6, settled, f.p.gate_left_open);
      if (config.record_timeline) {
        TimelineEntry entry;
        entry.type = TimelineEntry::Type::Latency;
        entry.kind = f.p.kind;
        entry.work_class = WorkClass::LatencyCritical;
        entry.device = d.device;
        entry.requested_us = f.p.arrived_us;
        entry.released_us = f.completed_us;
        entry.latency_s = latency_s;
        entry.alone = alone;
        for (const KindControl& k : d.controller->kinds()) {
          if (k.kind == f.p.kind && k.target_s) entry.target_s = *k.target_s;
        }
        record(std::move(entry));
      }
    }
    for (const PendingRelease& p : released_done) {
      DeviceState& d = devices[static_cast<std::size_t>(p.index)];
      d.best_effort_releases_pending -= 1;
      best_effort_finished(d, p.generation);
      refresh_idle(d);
    }
    for (DeviceState& d : devices) {
      if (!d.controller) continue;
      d.controller->tick(now_s);
      apply_control(d, now);
      for (std::string& report : d.controller->take_reports()) {
        reports.push_back(std::move(report));
        has_reports.store(true);
      }
    }
  }
}

}  // namespace octopus::scheduler::detail

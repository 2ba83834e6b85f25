// The Python extension module. Importing it registers the torch ops (their static
// registrations run when the library loads), reports how it was built, exports the names
// behind sampler_step's codes, and binds the StreamScheduler (python/octopus/scheduler.py
// wraps it into the public class).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "octopus/core/checks.h"
#include "octopus/core/kernel_profiles.h"
#include "octopus/core/plan.h"
#include "octopus/ops/sampler_step_layout.h"
#include "octopus/scheduler/overhead.h"
#include "octopus/scheduler/simulated_backend.h"
#include "octopus/scheduler/stream_scheduler.h"
#if defined(OCTOPUS_SCHEDULER_CUDA)
#include "octopus/scheduler/cuda_backend.h"
#endif
#if defined(OCTOPUS_WITH_CUDA)
#include "octopus/core/tuning.h"
#endif

namespace py = pybind11;
namespace sched = octopus::scheduler;

namespace {

std::shared_ptr<sched::DeviceBackend> make_backend(const std::string& backend, int simulated_devices, bool use_nvml) {
  if (backend == "simulated") return std::make_shared<sched::SimulatedBackend>(simulated_devices);
  if (backend == "cuda") {
#if defined(OCTOPUS_SCHEDULER_CUDA)
    return std::make_shared<sched::CudaBackend>(use_nvml);
#else
    (void)use_nvml;
    throw std::invalid_argument("octopus StreamScheduler: backend=\"cuda\" needs octopus built with CUDA; "
                                "this build has none (use backend=\"simulated\")");
#endif
  }
  throw std::invalid_argument("octopus StreamScheduler: backend must be \"cuda\" or \"simulated\", got \"" + backend + "\"");
}

// Seconds since `arrived`, a time.perf_counter() reading (0 for none), read with the GIL held
// just before the request is made: a thread switch between the caller's check of `arrived` and
// this call is counted, not lost.
double waited_since(std::optional<double> arrived) {
  if (!arrived) return 0.0;
  PYBIND11_CONSTINIT static py::gil_safe_call_once_and_store<py::object> perf_counter;
  const py::object& now = perf_counter
                              .call_once_and_store_result([] { return py::module_::import("time").attr("perf_counter"); })
                              .get_stored();
  return now().cast<double>() - *arrived;
}

sched::AcquireRequest make_request(std::string kind, std::vector<int64_t> shape, int priority,
                                   std::optional<double> timeout, int device, int64_t bytes,
                                   std::optional<double> deadline, bool best_effort, std::optional<double> arrived) {
  if (bytes < 0) throw std::invalid_argument("octopus StreamScheduler: bytes must be non-negative, got " + std::to_string(bytes));
  for (const int64_t extent : shape) {
    if (extent < 0) throw std::invalid_argument("octopus StreamScheduler: shape has a negative extent " + std::to_string(extent));
  }
  sched::AcquireRequest r;
  r.kind = std::move(kind);
  r.shape = std::move(shape);
  r.priority = priority;
  r.timeout_s = timeout;
  r.device = device;
  r.bytes = static_cast<std::size_t>(bytes);
  r.deadline_s = deadline;
  r.best_effort = best_effort;
  r.waited_before_s = waited_since(arrived);
  return r;
}

// Acquires a lease with the GIL held until the scheduler is about to wait (its fast path
// never releases it: a release and retake would cost more than the grant).
sched::Lease acquire_releasing_the_gil_to_wait(sched::StreamScheduler& s, const sched::AcquireRequest& r) {
  std::optional<py::gil_scoped_release> unlocked;
  return s.acquire(r, [&] { unlocked.emplace(); });
}

py::object optional_number(const std::optional<double>& value) { return value ? py::cast(*value) : py::none(); }

// A control step's knobs, into `out`.
void put_step(py::dict& out, const sched::ControlStep& step) {
  out["slice_budget_s"] = step.slice_budget_s;
  out["in_flight"] = step.in_flight;
  out["reserved_sms"] = step.reserved_sms;
  out["throttle"] = sched::throttle_mode_name(step.throttle);
  out["device_yield"] = step.device_yield;
}

py::dict control_dict(const sched::ControlStats& c) {
  py::dict out;
  out["enabled"] = c.enabled;
  out["step"] = c.step;
  out["steps"] = c.steps;
  put_step(out, c.settings);
  out["probing"] = c.probing;
  out["climbs"] = c.climbs;
  out["median_climbs"] = c.median_climbs;
  out["unhelpful_descents"] = c.unhelpful_descents;
  out["seconds_at_steps"] = c.seconds_at_steps;
  out["descents"] = c.descents;
  out["probes"] = c.probes;
  out["best_effort_units"] = c.best_effort_units;
  out["reserves"] = c.reserves;
  out["partition_error"] = c.partition_error;
  py::dict kinds;
  for (const sched::KindControl& k : c.kinds) {
    py::dict kd;
    kd["target_s"] = optional_number(k.target_s);
    kd["alone_p99_s"] = optional_number(k.alone_p99_s);
    kd["recent_p99_s"] = optional_number(k.recent_p99_s);
    kd["alone_p50_s"] = optional_number(k.alone_p50_s);
    kd["recent_p50_s"] = optional_number(k.recent_p50_s);
    kd["samples"] = k.samples;
    kd["judged"] = k.judged;
    kd["within_target"] = k.within_target;
    kd["attainment"] = k.judged ? py::cast(static_cast<double>(k.within_target) / static_cast<double>(k.judged))
                                : py::none();
    kd["alone_samples"] = k.alone_samples;
    kd["infeasible"] = k.infeasible;
    kd["infeasible_reason"] = k.infeasible_reason;
    kd["median_unhelped"] = k.median_unhelped;
    kd["closes_gate"] = k.closes_gate;
    kd["gate_on_trial"] = k.gate_on_trial;
    kd["gate_trials"] = k.gate_trials;
    kd["gate_failures"] = k.gate_failures;
    py::list steps;
    for (const sched::StepLatency& at : k.steps) {
      py::dict sd;
      sd["jobs"] = at.jobs;
      sd["over"] = at.over;
      sd["unsettled"] = at.unsettled;
      sd["p50_s"] = optional_number(at.p50_s);
      sd["p99_s"] = optional_number(at.p99_s);
      sd["closed_tail"] = py::make_tuple(at.closed_tail_jobs, at.closed_tail_over);
      sd["open_tail"] = py::make_tuple(at.open_tail_jobs, at.open_tail_over);
      steps.append(sd);
    }
    kd["steps"] = steps;
    kinds[py::str(k.kind)] = kd;
  }
  out["kinds"] = kinds;
  py::dict released;
  put_step(released, c.released_settings);
  out["released_settings"] = released;
  py::dict best_effort;
  for (const sched::BestEffortControl& b : c.best_effort) {
    py::dict bd;
    bd["released"] = b.released;
    bd["on_trial"] = b.on_trial;
    bd["trials"] = b.trials;
    bd["failures"] = b.failures;
    best_effort[py::str(b.kind)] = bd;
  }
  out["best_effort_kinds"] = best_effort;
  return out;
}

// SchedulerConfig, field by field: the one binding of its fields (python/octopus/scheduling/config.py
// mirrors them as a dataclass, and a test checks the two agree). Enums go as their names.
void bind_config(py::module_& m) {
  using C = sched::SchedulerConfig;
  const auto throttle_name = [](const std::optional<sched::ThrottleMode>& t) -> py::object {
    if (!t) return py::none();
    return py::str(sched::throttle_mode_name(*t));
  };
  py::class_<C>(m, "SchedulerConfig")
      .def(py::init<>())
      .def_readwrite("max_leases_per_device", &C::max_leases_per_device)
      .def_readwrite("max_best_effort_leases_per_device", &C::max_best_effort_leases_per_device)
      .def_readwrite("max_occupancy", &C::max_occupancy)
      .def_readwrite("default_occupancy", &C::default_occupancy)
      .def_readwrite("memory_reserve", &C::memory_reserve)
      .def_readwrite("memory_poll_interval_s", &C::memory_poll_interval_s)
      .def_readwrite("timeout_s", &C::timeout_s)
      .def_readwrite("devices", &C::devices)
      .def_readwrite("record_timeline", &C::record_timeline)
      .def_readwrite("timeline_capacity", &C::timeline_capacity)
      .def_property("throttle", [=](const C& c) { return throttle_name(c.throttle); },
                    [](C& c, const std::optional<std::string>& name) {
                      c.throttle = name ? std::optional(sched::parse_throttle_mode(*name)) : std::nullopt;
                    })
      .def_readwrite("best_effort_in_flight", &C::best_effort_in_flight)
      .def_readwrite("reserved_sms", &C::reserved_sms)
      .def_readwrite("device_yield", &C::device_yield)
      .def_readwrite("best_effort_max_pause_s", &C::best_effort_max_pause_s)
      .def_readwrite("latency_control", &C::latency_control)
      .def_readwrite("latency_ratio", &C::latency_ratio)
      .def_readwrite("latency_error_budget", &C::latency_error_budget)
      .def_property("infeasible_deadline", [](const C& c) { return sched::infeasible_deadline_name(c.infeasible_deadline); },
                    [](C& c, const std::string& name) { c.infeasible_deadline = sched::parse_infeasible_deadline(name); })
      .def_readwrite("target_utilization", &C::target_utilization)
      .def_readwrite("min_leases_per_device", &C::min_leases_per_device)
      .def_readwrite("utilization_interval_s", &C::utilization_interval_s)
      .def("validate", [](const C& c) { sched::validate(c); });
}
template <std::size_t N>
py::tuple names(const char* const (&list)[N]) {
  py::tuple out(N);
  for (std::size_t i = 0; i < N; ++i) out[i] = py::str(list[i]);
  return out;
}

py::dict stats_dict(const sched::SchedulerStats& s) {
  py::dict out;
  out["granted"] = s.granted;
  out["released"] = s.released;
  out["active"] = s.granted - s.released;
  out["waited"] = s.waited;
  out["timeouts"] = s.timeouts;
  out["rejected"] = s.rejected;
  out["waiting"] = s.waiting;
  out["total_wait_s"] = s.total_wait_s;
  out["max_wait_s"] = s.max_wait_s;
  py::dict classes;
  int64_t deadline_misses = 0;
  for (int c = 0; c < sched::kWorkClasses; ++c) {
    const sched::ClassStats& cs = s.classes[static_cast<std::size_t>(c)];
    py::dict cd;
    cd["granted"] = cs.granted;
    cd["released"] = cs.released;
    cd["wait_p50_s"] = optional_number(cs.wait_p50_s);
    cd["wait_p99_s"] = optional_number(cs.wait_p99_s);
    cd["hold_p50_s"] = optional_number(cs.hold_p50_s);
    cd["hold_p99_s"] = optional_number(cs.hold_p99_s);
    cd["deadline_misses"] = cs.deadline_misses();
    cd["deadline_rejected"] = cs.deadline_rejected;
    cd["deadline_expired"] = cs.deadline_expired;
    cd["deadline_late"] = cs.deadline_late;
    cd["deadline_promoted"] = cs.deadline_promoted;
    cd["throttled_s"] = cs.throttled_s;
    cd["pauses"] = cs.pauses;
    classes[sched::work_class_name(static_cast<sched::WorkClass>(c))] = cd;
    deadline_misses += cs.deadline_misses();
  }
  out["classes"] = classes;
  out["deadline_misses"] = deadline_misses;
  py::list devices;
  for (const sched::DeviceStats& d : s.devices) {
    py::dict dd;
    dd["device"] = d.device;
    dd["active_leases"] = d.active_leases;
    dd["peak_leases"] = d.peak_leases;
    dd["best_effort_leases"] = d.best_effort_leases;
    dd["latency_critical_leases"] = d.latency_critical_leases;
    dd["lease_limit"] = d.lease_limit;
    dd["occupancy_in_use"] = d.occupancy_in_use;
    dd["granted"] = d.granted;
    dd["free_bytes"] = d.free_bytes;
    dd["total_bytes"] = d.total_bytes;
    dd["partition_sms"] = d.partition_sms;
    dd["yield_gate"] = d.yield_gate;
    dd["gate_closes"] = d.gate_closes;
    dd["yielding_launches"] = d.yielding_launches;
    dd["utilization"] = optional_number(d.utilization);
    dd["control"] = control_dict(d.control);
    devices.append(dd);
  }
  out["devices"] = devices;
  return out;
}

void bind_scheduler(py::module_& m) {
  bind_config(m);
  auto lease_timeout = py::register_exception<sched::LeaseTimeout>(m, "LeaseTimeout", PyExc_TimeoutError);
  py::register_exception<sched::DeadlineMissed>(m, "DeadlineMissed", lease_timeout.ptr());
  py::class_<sched::SimulatedBackend>(m, "SimulatedBackend")
      .def("set_free_memory", &sched::SimulatedBackend::set_free_memory, py::arg("device"), py::arg("free_bytes"))
      .def("set_utilization", &sched::SimulatedBackend::set_utilization, py::arg("device"), py::arg("value"))
      .def("set_manual_events", &sched::SimulatedBackend::set_manual_events, py::arg("manual"))
      .def("complete_events", &sched::SimulatedBackend::complete_events, py::arg("device"), py::arg("count"))
      .def("pending_events", &sched::SimulatedBackend::pending_events, py::arg("device"))
      .def("set_partition_failure", &sched::SimulatedBackend::set_partition_failure, py::arg("reason"));

  py::class_<sched::ReleaseEvent, std::shared_ptr<sched::ReleaseEvent>>(m, "ReleaseEvent")
      .def_property_readonly("device", &sched::ReleaseEvent::device)
      .def("done", &sched::ReleaseEvent::done)
      .def("synchronize", &sched::ReleaseEvent::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("wait", [](const sched::ReleaseEvent& e, std::uintptr_t stream) {
        e.wait(reinterpret_cast<sched::StreamHandle>(stream));
      }, py::arg("stream"));

  py::class_<sched::Lease>(m, "Lease")
      .def_property_readonly("active", &sched::Lease::active)
      .def_property_readonly("id", &sched::Lease::id)
      .def_property_readonly("device", &sched::Lease::device)
      .def_property_readonly("stream_ptr", [](const sched::Lease& l) { return reinterpret_cast<std::uintptr_t>(l.stream()); })
      .def_property_readonly("stream_slot", &sched::Lease::stream_slot)
      .def_property_readonly("priority", &sched::Lease::priority)
      .def_property_readonly("work_class", [](const sched::Lease& l) { return sched::work_class_name(l.work_class()); })
      .def_property_readonly("promoted", &sched::Lease::promoted)
      .def_property_readonly("occupancy", &sched::Lease::occupancy)
      .def_property_readonly("kind", &sched::Lease::kind)
      .def_property_readonly("waited_s", &sched::Lease::waited_s)
      .def_property_readonly("queued", &sched::Lease::queued)
      .def_property_readonly("previous_release", &sched::Lease::previous_release)
      .def_property_readonly("release_event", &sched::Lease::release_event)
      // No GIL release: returning a lease never waits (the scheduler lock is held briefly).
      // The event is read from release_event, so the common path creates no Python object.
      .def("release", [](sched::Lease& l) { l.release(); })
      .def("checkpoint", &sched::Lease::checkpoint, py::arg("units"), py::call_guard<py::gil_scoped_release>())
      .def("end_slice", &sched::Lease::end_slice);

  py::class_<sched::StreamScheduler>(m, "StreamScheduler")
      .def(py::init([](const sched::SchedulerConfig& config, const std::string& backend, int simulated_devices,
                       bool use_nvml) {
             // Checked before the backend is made: a bad option is a ValueError, not a CUDA error.
             sched::validate(config);
             auto s = std::make_unique<sched::StreamScheduler>(config, make_backend(backend, simulated_devices, use_nvml));
             if (backend == "cuda") {
               for (const auto& [kind, profile] : octopus::octopus_kernel_profiles()) s->register_kernel(kind, profile);
             }
             return s;
           }),
           py::arg("config"), py::arg("backend"), py::arg("simulated_devices"), py::arg("use_nvml"))
      .def("acquire", [](sched::StreamScheduler& s, std::string kind, std::vector<int64_t> shape, int priority,
                         std::optional<double> timeout, int device, int64_t bytes, std::optional<double> deadline,
                         bool best_effort, std::optional<double> arrived) {
             return acquire_releasing_the_gil_to_wait(
                 s, make_request(std::move(kind), std::move(shape), priority, timeout, device, bytes, deadline, best_effort,
                                 arrived));
           }, py::arg("kind"), py::arg("shape"), py::arg("priority"), py::arg("timeout"), py::arg("device"), py::arg("bytes"),
           py::arg("deadline"), py::arg("best_effort"), py::arg("arrived"))
      // The common call, a kind and a priority (and when its work arrived) and every other
      // argument its default, with three arguments to convert rather than nine: it is on every
      // latency-critical job's path.
      .def("acquire_kind", [](sched::StreamScheduler& s, std::string kind, int priority, std::optional<double> arrived) {
             sched::AcquireRequest r;
             r.kind = std::move(kind);
             r.priority = priority;
             r.waited_before_s = waited_since(arrived);
             return acquire_releasing_the_gil_to_wait(s, r);
           }, py::arg("kind"), py::arg("priority"), py::arg("arrived"))
      .def("try_acquire", [](sched::StreamScheduler& s, std::string kind, std::vector<int64_t> shape, int priority,
                             int device, int64_t bytes, std::optional<double> deadline, bool best_effort,
                             std::optional<double> arrived) {
             const sched::AcquireRequest r = make_request(std::move(kind), std::move(shape), priority, std::nullopt, device,
                                                          bytes, deadline, best_effort, arrived);
             std::optional<py::gil_scoped_release> unlocked;  // only before something slow
             return s.try_acquire(r, [&] { unlocked.emplace(); });
           }, py::arg("kind"), py::arg("shape"), py::arg("priority"), py::arg("device"), py::arg("bytes"),
           py::arg("deadline"), py::arg("best_effort"), py::arg("arrived"))
      .def("register_kind", &sched::StreamScheduler::register_kind, py::arg("kind"), py::arg("occupancy"))
      .def("register_kernel", [](sched::StreamScheduler& s, const std::string& kind, int blocks_per_sm, int64_t elements_per_block) {
             s.register_kernel(kind, sched::KernelProfile{blocks_per_sm, elements_per_block});
           }, py::arg("kind"), py::arg("blocks_per_sm"), py::arg("elements_per_block"))
      .def("estimate_occupancy", &sched::StreamScheduler::estimate_occupancy, py::arg("kind"), py::arg("shape"), py::arg("device"))
      .def("seconds_per_unit", &sched::StreamScheduler::seconds_per_unit, py::arg("kind"))
      .def("set_seconds_per_unit", &sched::StreamScheduler::set_seconds_per_unit, py::arg("kind"), py::arg("seconds"))
      .def("host_seconds_per_slice", &sched::StreamScheduler::host_seconds_per_slice, py::arg("kind"))
      .def("adapt_concurrency", &sched::StreamScheduler::adapt_concurrency, py::call_guard<py::gil_scoped_release>())
      .def("set_target", &sched::StreamScheduler::set_target, py::arg("kind"), py::arg("p99_s"), py::arg("ratio"))
      .def("slice_budget_s", &sched::StreamScheduler::slice_budget_s, py::arg("device"), py::arg("kind") = "")
      .def("take_reports", &sched::StreamScheduler::take_reports)
      .def_property_readonly("has_reports", &sched::StreamScheduler::has_reports)
      .def_property_readonly("config", [](const sched::StreamScheduler& s) { return s.config(); })
      .def_property_readonly("simulated_backend", [](sched::StreamScheduler& s) {
             auto* simulated = dynamic_cast<sched::SimulatedBackend*>(&s.backend());
             if (simulated == nullptr) throw std::invalid_argument("simulated_backend needs backend=\"simulated\"");
             return simulated;
           }, py::return_value_policy::reference_internal)
      .def_property_readonly("devices", &sched::StreamScheduler::devices)
      .def_property_readonly("backend", &sched::StreamScheduler::backend_name)
      .def_property_readonly("max_leases_per_device", [](const sched::StreamScheduler& s) { return s.config().max_leases_per_device; })
      .def("stats", [](const sched::StreamScheduler& s) { return stats_dict(s.stats()); })
      .def("trace_json", &sched::StreamScheduler::trace_json, py::call_guard<py::gil_scoped_release>())
      .def("write_trace", &sched::StreamScheduler::write_trace, py::arg("path"), py::call_guard<py::gil_scoped_release>())
      .def("time_acquire_release", [](sched::StreamScheduler& s, std::string kind, int rounds, int per_round) {
             const sched::AcquireRequest r = make_request(std::move(kind), {}, 0, std::nullopt, -1, 0, std::nullopt, false, std::nullopt);
             py::gil_scoped_release unlocked;
             return sched::time_acquire_release(s, r, rounds, per_round);
           }, py::arg("kind"), py::arg("rounds"), py::arg("per_round"));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "octopus native library: torch.ops.octopus.*, build information and the StreamScheduler";
#if defined(OCTOPUS_WITH_CUDA)
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  bind_scheduler(m);
#if defined(OCTOPUS_WITH_CUDA)
  // The kernels' tuning on the current device as the host launches with it and as its
  // code was compiled (python/octopus/tuning.py: kernel_tuning()).
  m.def("kernel_tuning", [] {
    py::dict launch, compiled;
    for (const octopus::cuda::TuningFamily& family : octopus::cuda::tuning_families()) {
      for (const auto& [name, value] : family.launch()) launch[py::str(name)] = value;
      for (const auto& [name, value] : family.compiled()) compiled[py::str(name)] = value;
    }
    py::dict out;
    out["arch"] = octopus::cuda::launch_arch();
    out["launch"] = launch;
    out["compiled"] = compiled;
    return out;
  });
#endif
  // The one list of strategies and the block size's limits: python/octopus/strategies.py reads them.
  py::list strategies;
  for (const octopus::StrategyInfo& s : octopus::kStrategies) {
    strategies.append(py::make_tuple(s.name, s.metadata[0] ? py::object(py::str(s.metadata)) : py::none()));
  }
  m.attr("strategies") = strategies;
  py::dict block_elems;
  block_elems["default"] = octopus::kDefaultBlockElems;
  block_elems["max"] = octopus::kMaxBlockElems;
  block_elems["multiple"] = octopus::kBlockElemsMultiple;
  m.attr("block_elems") = block_elems;
  // The one definition of sampler_step's codes: python/octopus/diffusion/rows.py reads it.
  py::dict layout;
  layout["kinds"] = names(octopus::kSamplerKindNames);
  layout["predictions"] = names(octopus::kPredictionNames);
  layout["row_info"] = names(octopus::RowInfo::kNames);
  layout["row_scalars"] = names(octopus::RowScalars::kNames);
  m.attr("sampler_step_layout") = layout;
}

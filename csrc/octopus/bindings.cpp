// The Python extension module. Importing it registers the torch ops (their static
// registrations run when the library loads), reports how it was built, exports the names
// behind sampler_step's codes, and binds the StreamScheduler (python/octopus/scheduler.py
// wraps it into the public class).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "octopus/core/kernel_profiles.h"
#include "octopus/ops/sampler_step_layout.h"
#include "octopus/scheduler/overhead.h"
#include "octopus/scheduler/simulated_backend.h"
#include "octopus/scheduler/stream_scheduler.h"
#if defined(OCTOPUS_SCHEDULER_CUDA)
#include "octopus/scheduler/cuda_backend.h"
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

sched::AcquireRequest make_request(std::string kind, std::vector<int64_t> shape, int priority,
                                   std::optional<double> timeout, int device, int64_t bytes) {
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
  return r;
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
  py::list devices;
  for (const sched::DeviceStats& d : s.devices) {
    py::dict dd;
    dd["device"] = d.device;
    dd["active_leases"] = d.active_leases;
    dd["peak_leases"] = d.peak_leases;
    dd["occupancy_in_use"] = d.occupancy_in_use;
    dd["granted"] = d.granted;
    dd["free_bytes"] = d.free_bytes;
    dd["total_bytes"] = d.total_bytes;
    dd["utilization"] = d.utilization ? py::cast(*d.utilization) : py::none();
    devices.append(dd);
  }
  out["devices"] = devices;
  return out;
}

void bind_scheduler(py::module_& m) {
  py::register_exception<sched::LeaseTimeout>(m, "LeaseTimeout", PyExc_TimeoutError);

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
      .def_property_readonly("occupancy", &sched::Lease::occupancy)
      .def_property_readonly("kind", &sched::Lease::kind)
      .def_property_readonly("waited_s", &sched::Lease::waited_s)
      .def_property_readonly("queued", &sched::Lease::queued)
      .def_property_readonly("previous_release", &sched::Lease::previous_release)
      .def_property_readonly("release_event", &sched::Lease::release_event)
      // No GIL release: returning a lease never waits (the scheduler lock is held briefly).
      // The event is read from release_event, so the common path creates no Python object.
      .def("release", [](sched::Lease& l) { l.release(); });

  py::class_<sched::StreamScheduler>(m, "StreamScheduler")
      .def(py::init([](int max_leases_per_device, double max_occupancy, double default_occupancy, double memory_reserve,
                       double memory_poll_interval, double timeout, std::vector<int> devices, bool record_timeline,
                       std::size_t timeline_capacity, const std::string& backend, int simulated_devices, bool use_nvml) {
             sched::SchedulerConfig c;
             c.max_leases_per_device = max_leases_per_device;
             c.max_occupancy = max_occupancy;
             c.default_occupancy = default_occupancy;
             c.memory_reserve = memory_reserve;
             c.memory_poll_interval_s = memory_poll_interval;
             c.timeout_s = timeout;
             c.devices = std::move(devices);
             c.record_timeline = record_timeline;
             c.timeline_capacity = timeline_capacity;
             auto s = std::make_unique<sched::StreamScheduler>(c, make_backend(backend, simulated_devices, use_nvml));
             if (backend == "cuda") {
               for (const auto& [kind, profile] : octopus::octopus_kernel_profiles()) s->register_kernel(kind, profile);
             }
             return s;
           }),
           py::arg("max_leases_per_device"), py::arg("max_occupancy"), py::arg("default_occupancy"),
           py::arg("memory_reserve"), py::arg("memory_poll_interval"), py::arg("timeout"), py::arg("devices"),
           py::arg("record_timeline"), py::arg("timeline_capacity"), py::arg("backend"), py::arg("simulated_devices"),
           py::arg("use_nvml"))
      .def("acquire", [](sched::StreamScheduler& s, std::string kind, std::vector<int64_t> shape, int priority,
                         std::optional<double> timeout, int device, int64_t bytes) {
             const sched::AcquireRequest r = make_request(std::move(kind), std::move(shape), priority, timeout, device, bytes);
             py::gil_scoped_release unlocked;
             return s.acquire(r);
           }, py::arg("kind"), py::arg("shape"), py::arg("priority"), py::arg("timeout"), py::arg("device"), py::arg("bytes"))
      .def("try_acquire", [](sched::StreamScheduler& s, std::string kind, std::vector<int64_t> shape, int priority,
                             int device, int64_t bytes) {
             const sched::AcquireRequest r = make_request(std::move(kind), std::move(shape), priority, std::nullopt, device, bytes);
             py::gil_scoped_release unlocked;
             return s.try_acquire(r);
           }, py::arg("kind"), py::arg("shape"), py::arg("priority"), py::arg("device"), py::arg("bytes"))
      .def("register_kind", &sched::StreamScheduler::register_kind, py::arg("kind"), py::arg("occupancy"))
      .def("register_kernel", [](sched::StreamScheduler& s, const std::string& kind, int blocks_per_sm, int64_t elements_per_block) {
             s.register_kernel(kind, sched::KernelProfile{blocks_per_sm, elements_per_block});
           }, py::arg("kind"), py::arg("blocks_per_sm"), py::arg("elements_per_block"))
      .def("estimate_occupancy", &sched::StreamScheduler::estimate_occupancy, py::arg("kind"), py::arg("shape"), py::arg("device"))
      .def_property_readonly("devices", &sched::StreamScheduler::devices)
      .def_property_readonly("backend", &sched::StreamScheduler::backend_name)
      .def_property_readonly("max_leases_per_device", [](const sched::StreamScheduler& s) { return s.config().max_leases_per_device; })
      .def("stats", [](const sched::StreamScheduler& s) { return stats_dict(s.stats()); })
      .def("trace_json", &sched::StreamScheduler::trace_json)
      .def("write_trace", &sched::StreamScheduler::write_trace, py::arg("path"))
      .def("set_simulated_free_memory", [](sched::StreamScheduler& s, int device, std::size_t free_bytes) {
             auto* simulated = dynamic_cast<sched::SimulatedBackend*>(&s.backend());
             if (simulated == nullptr) throw std::invalid_argument("set_simulated_free_memory needs backend=\"simulated\"");
             simulated->set_free_memory(device, free_bytes);
           }, py::arg("device"), py::arg("free_bytes"))
      .def("time_acquire_release", [](sched::StreamScheduler& s, std::string kind, int rounds, int per_round) {
             const sched::AcquireRequest r = make_request(std::move(kind), {}, 0, std::nullopt, -1, 0);
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
  // The one definition of sampler_step's codes: python/octopus/diffusion/rows.py reads it.
  py::dict layout;
  layout["kinds"] = names(octopus::kSamplerKindNames);
  layout["predictions"] = names(octopus::kPredictionNames);
  layout["row_info"] = names(octopus::RowInfo::kNames);
  layout["row_scalars"] = names(octopus::RowScalars::kNames);
  m.attr("sampler_step_layout") = layout;
}

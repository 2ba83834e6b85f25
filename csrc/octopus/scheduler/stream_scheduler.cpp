#include "octopus/scheduler/stream_scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <variant>

#include "octopus/scheduler/timeline.h"

namespace octopus::scheduler {
namespace detail {

using Clock = std::chrono::steady_clock;

// Events are reused: a release takes one from its device's pool, and the ReleaseEvent
// gives it back when the last holder lets go.
class EventPool {
 public:
  EventPool(std::shared_ptr<DeviceBackend> backend, const std::vector<int>& devices) : backend_(std::move(backend)) {
    for (const int d : devices) free_[d];
  }
  ~EventPool() {
    for (auto& [device, events] : free_) {
      for (EventHandle e : events) backend_->destroy_event(device, e);
    }
  }
  EventHandle take(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& events = free_.at(device);
      if (!events.empty()) {
        EventHandle e = events.back();
        events.pop_back();
        return e;
      }
    }
    return backend_->create_event(device);
  }
  void give_back(int device, EventHandle event) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.at(device).push_back(event);
  }
  DeviceBackend& backend() { return *backend_; }

 private:
  std::shared_ptr<DeviceBackend> backend_;
  std::mutex mutex_;
  std::unordered_map<int, std::vector<EventHandle>> free_;
};

// Why a request could not be granted on a device.
enum class Limit { None, Queue, Leases, Occupancy, Memory };

struct KindModel {
  std::variant<double, KernelProfile> estimate;
};

struct StreamSlot {
  StreamHandle handle = nullptr;
  bool leased = false;
  uint64_t last_used = 0;
  std::shared_ptr<ReleaseEvent> last_release;
};

struct DeviceState {
  int device = 0;
  int multiprocessors = 1;
  std::vector<StreamSlot> slots;  // [0, n) normal priority, [n, 2n) high priority
  int active = 0;
  int peak = 0;
  double occupancy = 0.0;
  int64_t granted = 0;
  std::size_t bytes_held = 0;
  MemoryInfo memory;
  Clock::time_point memory_time;
  bool memory_sampled = false;
};

struct Waiter {
  const AcquireRequest* request = nullptr;
  uint64_t ticket = 0;
  Clock::time_point requested;
  std::condition_variable cv;
  bool granted = false;
  bool queued = false;  // not granted on arrival
  LeaseGrant grant;
  Limit limit = Limit::None;
  int limit_index = -1;  // the device index `limit` refers to
};

// The pool's streams are never destroyed (like PyTorch's own stream pool): tensors whose
// use was recorded on one (record_stream) may be freed after the scheduler is gone, and
// the caching allocator then records an event on that stream.
struct State {
  SchedulerConfig config;
  std::shared_ptr<DeviceBackend> backend;
  std::shared_ptr<EventPool> events;
  Clock::time_point created = Clock::now();

  std::mutex mutex;
  std::vector<DeviceState> devices;
  std::vector<int> device_ids;
  std::vector<Waiter*> waiters;  // by priority (highest first), then arrival
  uint64_t next_ticket = 0;
  uint64_t next_lease_id = 1;
  uint64_t slot_clock = 0;
  std::unordered_map<std::string, KindModel> kinds;
  SchedulerStats counters;
  std::vector<TimelineEntry> timeline;

  double micros(Clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - created).count();
  }

  std::string device_name(int index) const {
    return std::string(backend->name()) + ":" + std::to_string(devices[static_cast<std::size_t>(index)].device);
  }

  int index_of(int device) const {
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

  double occupancy_of(const AcquireRequest& r, const DeviceState& d) const {
    const auto it = kinds.find(r.kind);
    if (it == kinds.end()) return config.default_occupancy;
    if (const double* fixed = std::get_if<double>(&it->second.estimate)) return *fixed;
    const KernelProfile& k = std::get<KernelProfile>(it->second.estimate);
    if (r.shape.empty()) return 1.0;  // size unknown: assume it fills the device
    double numel = 1.0;
    for (const int64_t extent : r.shape) numel *= static_cast<double>(extent);
    const double blocks = std::ceil(numel / static_cast<double>(k.elements_per_block));
    const double resident = static_cast<double>(k.blocks_per_sm) * d.multiprocessors;
    return std::min(1.0, blocks / resident);
  }

  bool memory_check_needed(const AcquireRequest& r) const { return config.memory_reserve > 0.0 || r.bytes > 0; }

  const MemoryInfo& sample_memory(DeviceState& d) {
    const auto now = Clock::now();
    if (!d.memory_sampled ||
        std::chrono::duration<double>(now - d.memory_time).count() >= config.memory_poll_interval_s) {
      d.memory = backend->memory_info(d.device);
      d.memory_time = now;
      d.memory_sampled = true;
    }
    return d.memory;
  }

  std::size_t reserve_bytes(const DeviceState& d) const {
    return static_cast<std::size_t>(config.memory_reserve * static_cast<double>(d.memory.total_bytes));
  }

  Limit fit(const AcquireRequest& r, DeviceState& d, double* occupancy) {
    if (d.active >= config.max_leases_per_device) return Limit::Leases;
    *occupancy = occupancy_of(r, d);
    if (d.active > 0 && d.occupancy + *occupancy > config.max_occupancy + 1e-9) return Limit::Occupancy;
    if (memory_check_needed(r)) {
      const MemoryInfo& m = sample_memory(d);
      const std::size_t available = m.free_bytes > d.bytes_held ? m.free_bytes - d.bytes_held : 0;
      if (available < reserve_bytes(d) + r.bytes) return Limit::Memory;
    }
    return Limit::None;
  }

  void grant(Waiter& w, int index, double occupancy) {
    DeviceState& d = devices[static_cast<std::size_t>(index)];
    const AcquireRequest& r = *w.request;
    const int n = config.max_leases_per_device;
    const int first = r.priority > 0 ? n : 0;
    int slot = -1;
    for (int s = first; s < first + n; ++s) {
      const StreamSlot& candidate = d.slots[static_cast<std::size_t>(s)];
      if (!candidate.leased && (slot < 0 || candidate.last_used < d.slots[static_cast<std::size_t>(slot)].last_used)) slot = s;
    }
    StreamSlot& chosen = d.slots[static_cast<std::size_t>(slot)];  // active < n, so one is free
    chosen.leased = true;
    d.active += 1;
    d.peak = std::max(d.peak, d.active);
    d.occupancy += occupancy;
    d.bytes_held += r.bytes;
    d.granted += 1;
    const auto now = Clock::now();
    const double waited = std::chrono::duration<double>(now - w.requested).count();
    counters.granted += 1;
    counters.total_wait_s += waited;
    counters.max_wait_s = std::max(counters.max_wait_s, waited);
    w.grant = LeaseGrant{next_lease_id++, d.device, chosen.handle, slot, r.priority, occupancy, r.bytes, r.kind,
                         waited, w.queued, micros(w.requested), micros(now), chosen.last_release};
    w.granted = true;
    w.cv.notify_one();
  }

  // Grants what can be granted, in queue order. A request that cannot be granted blocks
  // its devices for the requests behind it, so nobody overtakes an earlier request of
  // the same or a higher priority.
  void schedule() {
    std::vector<char> blocked(devices.size(), 0);
    std::size_t num_blocked = 0;
    const bool use_utilization = devices.size() > 1;
    for (Waiter* w : waiters) {
      if (num_blocked == devices.size()) break;
      const AcquireRequest& r = *w->request;
      int best = -1;
      double best_occupancy = 0.0, best_load = 0.0, best_utilization = 0.0;
      const int lo = r.device >= 0 ? index_of(r.device) : 0;
      const int hi = r.device >= 0 ? lo + 1 : static_cast<int>(devices.size());
      for (int i = lo; i < hi; ++i) {
        if (blocked[static_cast<std::size_t>(i)]) {
          w->limit = Limit::Queue;
          w->limit_index = i;
          continue;
        }
        DeviceState& d = devices[static_cast<std::size_t>(i)];
        double occupancy = 0.0;
        const Limit limit = fit(r, d, &occupancy);
        if (limit != Limit::None) {
          w->limit = limit;
          w->limit_index = i;
          continue;
        }
        const double load = static_cast<double>(d.active) / config.max_leases_per_device + d.occupancy;
        const double utilization = use_utilization ? backend->utilization(d.device).value_or(0.0) : 0.0;
        if (best < 0 || load < best_load || (load == best_load && utilization < best_utilization)) {
          best = i;
          best_occupancy = occupancy;
          best_load = load;
          best_utilization = utilization;
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
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(), [](const Waiter* w) { return w->granted; }),
                  waiters.end());
  }

  void enqueue(Waiter& w) {
    w.ticket = next_ticket++;
    const auto position = std::upper_bound(waiters.begin(), waiters.end(), &w, [](const Waiter* a, const Waiter* b) {
      return a->request->priority > b->request->priority ||
             (a->request->priority == b->request->priority && a->ticket < b->ticket);
    });
    waiters.insert(position, &w);
  }

  void dequeue(Waiter& w) { waiters.erase(std::remove(waiters.begin(), waiters.end(), &w), waiters.end()); }

  std::string limit_message(const Waiter& w) const {
    if (w.limit_index < 0) return "no device was free";
    const DeviceState& d = devices[static_cast<std::size_t>(w.limit_index)];
    const std::string where = device_name(w.limit_index);
    std::ostringstream msg;
    msg.precision(3);
    switch (w.limit) {
      case Limit::Leases:
        msg << where << " was at its lease limit (" << d.active << " of max_leases_per_device="
            << config.max_leases_per_device << " leases held)";
        break;
      case Limit::Occupancy:
        msg << where << " was at its occupancy limit (estimated occupancy " << d.occupancy
            << " in use, this lease needs " << occupancy_of(*w.request, d) << ", max_occupancy=" << config.max_occupancy
            << ")";
        break;
      case Limit::Memory:
        msg << where << " was below its free-memory reserve (" << d.memory.free_bytes << " bytes free, "
            << d.bytes_held << " held by leases, reserve " << reserve_bytes(d) << " bytes (memory_reserve="
            << config.memory_reserve << ") plus this lease's " << w.request->bytes << " bytes)";
        break;
      case Limit::Queue:
      case Limit::None:
        msg << "it was queued behind earlier or higher-priority requests for " << where;
        break;
    }
    return msg.str();
  }

  void record(TimelineEntry entry) {
    if (config.record_timeline && timeline.size() < config.timeline_capacity) timeline.push_back(std::move(entry));
  }
};

}  // namespace detail

using detail::Clock;

namespace {

uint64_t this_thread_id() { return std::hash<std::thread::id>{}(std::this_thread::get_id()); }

void validate(const SchedulerConfig& c) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("octopus StreamScheduler: " + what); };
  if (c.max_leases_per_device < 1) fail("max_leases_per_device must be at least 1, got " + std::to_string(c.max_leases_per_device));
  if (!(c.max_occupancy > 0.0)) fail("max_occupancy must be positive, got " + std::to_string(c.max_occupancy));
  if (!(c.default_occupancy >= 0.0 && c.default_occupancy <= 1.0)) {
    fail("default_occupancy must be in [0, 1], got " + std::to_string(c.default_occupancy));
  }
  if (!(c.memory_reserve >= 0.0 && c.memory_reserve < 1.0)) {
    fail("memory_reserve must be a fraction in [0, 1), got " + std::to_string(c.memory_reserve));
  }
  if (!(c.memory_poll_interval_s > 0.0)) {
    fail("memory_poll_interval_s must be positive, got " + std::to_string(c.memory_poll_interval_s));
  }
  if (std::isnan(c.timeout_s)) fail("timeout must be a number of seconds (negative waits for ever)");
}

}  // namespace

ReleaseEvent::ReleaseEvent(std::shared_ptr<detail::EventPool> pool, int device, EventHandle event)
    : pool_(std::move(pool)), device_(device), event_(event) {}

ReleaseEvent::~ReleaseEvent() { pool_->give_back(device_, event_); }

bool ReleaseEvent::done() const { return pool_->backend().event_done(device_, event_); }

void ReleaseEvent::synchronize() const { pool_->backend().synchronize_event(device_, event_); }

void ReleaseEvent::wait(StreamHandle stream) const { pool_->backend().stream_wait_event(device_, stream, event_); }

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

std::shared_ptr<ReleaseEvent> Lease::release() {
  if (!state_) return nullptr;
  std::shared_ptr<detail::State> state = std::move(state_);
  state_.reset();
  std::shared_ptr<ReleaseEvent> event;
  std::exception_ptr failure;
  try {
    EventHandle handle = state->events->take(grant_.device);
    event = std::make_shared<ReleaseEvent>(state->events, grant_.device, handle);
    state->backend->record_event(grant_.device, handle, grant_.stream);
  } catch (...) {
    event.reset();
    failure = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    detail::DeviceState& d = state->devices[static_cast<std::size_t>(state->index_of(grant_.device))];
    detail::StreamSlot& slot = d.slots[static_cast<std::size_t>(grant_.slot)];
    slot.leased = false;
    slot.last_used = ++state->slot_clock;
    slot.last_release = event;
    d.active -= 1;
    d.occupancy = d.active == 0 ? 0.0 : d.occupancy - grant_.occupancy;  // no drift once idle
    d.bytes_held -= grant_.bytes;
    state->counters.released += 1;
    TimelineEntry entry;
    entry.lease_id = grant_.id;
    entry.kind = grant_.kind;
    entry.device = grant_.device;
    entry.stream_slot = grant_.slot;
    entry.priority = grant_.priority;
    entry.thread = this_thread_id();
    entry.queued = grant_.queued;
    entry.requested_us = grant_.requested_us;
    entry.granted_us = grant_.granted_us;
    entry.released_us = state->micros(Clock::now());
    state->record(std::move(entry));
    state->schedule();
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
  s.devices.resize(s.device_ids.size());
  const int n = s.config.max_leases_per_device;
  for (std::size_t i = 0; i < s.device_ids.size(); ++i) {
    detail::DeviceState& d = s.devices[i];
    d.device = s.device_ids[i];
    d.multiprocessors = std::max(1, s.backend->multiprocessor_count(d.device));
    d.slots.resize(static_cast<std::size_t>(2 * n));
    for (int k = 0; k < 2 * n; ++k) d.slots[static_cast<std::size_t>(k)].handle = s.backend->create_stream(d.device, k >= n);
  }
}

StreamScheduler::~StreamScheduler() = default;

Lease StreamScheduler::acquire(const AcquireRequest& request) {
  detail::State& s = *state_;
  const double timeout = request.timeout_s.value_or(s.config.timeout_s);
  if (std::isnan(timeout)) throw std::invalid_argument("octopus StreamScheduler: timeout must be a number of seconds");
  detail::Waiter w;
  w.request = &request;
  w.requested = Clock::now();
  const bool forever = timeout < 0.0;
  const auto deadline = w.requested + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(forever ? 0.0 : timeout));
  std::unique_lock<std::mutex> lock(s.mutex);
  if (request.device >= 0) s.index_of(request.device);  // a clear error for an unknown device
  s.enqueue(w);
  s.schedule();
  if (!w.granted) {
    w.queued = true;
    s.counters.waited += 1;
    s.counters.waiting += 1;
    // Free memory changes without a lease coming back, so memory waits poll.
    const bool poll = s.memory_check_needed(request);
    const auto poll_step = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(s.config.memory_poll_interval_s));
    while (!w.granted) {
      if (forever && !poll) {
        w.cv.wait(lock);
      } else {
        auto wake = poll ? Clock::now() + poll_step : deadline;
        if (!forever) wake = std::min(wake, deadline);
        w.cv.wait_until(lock, wake);
      }
      if (w.granted) break;
      if (!forever && Clock::now() >= deadline) {
        s.dequeue(w);
        s.counters.waiting -= 1;
        s.counters.timeouts += 1;
        const auto now = Clock::now();
        const double waited = std::chrono::duration<double>(now - w.requested).count();
        s.counters.total_wait_s += waited;
        s.counters.max_wait_s = std::max(s.counters.max_wait_s, waited);
        TimelineEntry entry;
        entry.type = TimelineEntry::Type::Timeout;
        entry.kind = request.kind;
        entry.device = w.limit_index >= 0 ? s.device_ids[static_cast<std::size_t>(w.limit_index)] : 0;
        entry.priority = request.priority;
        entry.thread = this_thread_id();
        entry.requested_us = s.micros(w.requested);
        entry.granted_us = s.micros(now);
        s.record(std::move(entry));
        std::ostringstream msg;
        msg.precision(3);
        msg << "octopus StreamScheduler: acquire(kind='" << request.kind << "', priority=" << request.priority
            << ") timed out after " << waited << " s (timeout=" << timeout << " s): " << s.limit_message(w);
        s.schedule();  // this request no longer blocks the ones behind it
        throw LeaseTimeout(msg.str());
      }
      if (poll) s.schedule();
    }
    s.counters.waiting -= 1;
  }
  return Lease(state_, w.grant);
}

std::optional<Lease> StreamScheduler::try_acquire(const AcquireRequest& request) {
  detail::State& s = *state_;
  detail::Waiter w;
  w.request = &request;
  w.requested = Clock::now();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (request.device >= 0) s.index_of(request.device);
  s.enqueue(w);
  s.schedule();
  if (!w.granted) {
    s.dequeue(w);
    s.counters.rejected += 1;
    s.schedule();
    return std::nullopt;
  }
  return Lease(state_, w.grant);
}

void StreamScheduler::register_kind(const std::string& kind, double occupancy) {
  if (!(occupancy > 0.0 && occupancy <= 1.0)) {
    throw std::invalid_argument("octopus StreamScheduler: the occupancy of kind '" + kind +
                                "' must be in (0, 1], got " + std::to_string(occupancy));
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->kinds[kind] = detail::KindModel{occupancy};
}

void StreamScheduler::register_kernel(const std::string& kind, KernelProfile profile) {
  if (profile.blocks_per_sm < 1 || profile.elements_per_block < 1) {
    throw std::invalid_argument("octopus StreamScheduler: kernel '" + kind +
                                "' needs blocks_per_sm >= 1 and elements_per_block >= 1");
  }
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->kinds[kind] = detail::KindModel{profile};
}

double StreamScheduler::estimate_occupancy(const std::string& kind, const std::vector<int64_t>& shape, int device) const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  AcquireRequest r;
  r.kind = kind;
  r.shape = shape;
  return state_->occupancy_of(r, state_->devices[static_cast<std::size_t>(state_->index_of(device))]);
}

const SchedulerConfig& StreamScheduler::config() const { return state_->config; }

const std::vector<int>& StreamScheduler::devices() const { return state_->device_ids; }

const char* StreamScheduler::backend_name() const { return state_->backend->name(); }

DeviceBackend& StreamScheduler::backend() const { return *state_->backend; }

SchedulerStats StreamScheduler::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  SchedulerStats out = state_->counters;
  for (const detail::DeviceState& d : state_->devices) {
    DeviceStats ds;
    ds.device = d.device;
    ds.active_leases = d.active;
    ds.peak_leases = d.peak;
    ds.occupancy_in_use = d.occupancy;
    ds.granted = d.granted;
    ds.free_bytes = d.memory.free_bytes;
    ds.total_bytes = d.memory.total_bytes;
    ds.utilization = state_->backend->utilization(d.device);
    out.devices.push_back(ds);
  }
  return out;
}

std::string StreamScheduler::trace_json() const {
  std::vector<TimelineEntry> entries;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    entries = state_->timeline;
  }
  return chrome_trace_json(entries, state_->backend->name());
}

void StreamScheduler::write_trace(const std::string& path) const {
  const std::string json = trace_json();
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw std::runtime_error("octopus StreamScheduler: cannot open '" + path + "' to write the trace");
  file << json;
  if (!file.flush()) throw std::runtime_error("octopus StreamScheduler: writing the trace to '" + path + "' failed");
}

}  // namespace octopus::scheduler

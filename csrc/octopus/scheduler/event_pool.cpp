#include "octopus/scheduler/event_pool.h"

namespace octopus::scheduler {
namespace detail {

EventPool::EventPool(std::shared_ptr<DeviceBackend> backend, const std::vector<int>& devices)
    : backend_(std::move(backend)) {
  for (const int d : devices) {
    free_[d];
    free_timed_[d];
  }
}

EventPool::~EventPool() {
  for (auto* pool : {&free_, &free_timed_}) {
    for (auto& [device, events] : *pool) {
      for (EventHandle e : events) backend_->destroy_event(device, e);
    }
  }
}

EventHandle EventPool::take(int device, bool timed) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& events = (timed ? free_timed_ : free_).at(device);
    if (!events.empty()) {
      EventHandle e = events.back();
      events.pop_back();
      return e;
    }
  }
  return backend_->create_event(device, timed);
}

void EventPool::give_back(int device, EventHandle event, bool timed) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  (timed ? free_timed_ : free_).at(device).push_back(event);
}

}  // namespace detail

ReleaseEvent::ReleaseEvent(std::shared_ptr<detail::EventPool> pool, int device, EventHandle event, bool timed)
    : pool_(std::move(pool)), device_(device), event_(event), timed_(timed) {}

ReleaseEvent::~ReleaseEvent() { pool_->give_back(device_, event_, timed_); }

bool ReleaseEvent::done() const { return pool_->backend().event_done(device_, event_); }

void ReleaseEvent::synchronize() const { pool_->backend().synchronize_event(device_, event_); }

void ReleaseEvent::wait(StreamHandle stream) const { pool_->backend().stream_wait_event(device_, stream, event_); }

}  // namespace octopus::scheduler

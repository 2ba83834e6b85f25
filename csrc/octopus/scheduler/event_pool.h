// Events are reused: a lease's release, or a best-effort checkpoint, takes one from its
// device's pool and gives it back when nobody needs it any more.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "octopus/scheduler/device_backend.h"

namespace octopus::scheduler {

namespace detail {

class EventPool {
 public:
  EventPool(std::shared_ptr<DeviceBackend> backend, const std::vector<int>& devices);
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An event of the device's pool; `timed` ones (for elapsed_s) are pooled apart.
  EventHandle take(int device, bool timed = false);
  void give_back(int device, EventHandle event, bool timed = false) noexcept;
  DeviceBackend& backend() { return *backend_; }

 private:
  std::shared_ptr<DeviceBackend> backend_;
  std::mutex mutex_;
  std::unordered_map<int, std::vector<EventHandle>> free_, free_timed_;
};

}  // namespace detail

// The event recorded on a lease's stream when it was returned; back to the pool when the
// last holder lets go.
class ReleaseEvent {
 public:
  // A `timed` event (taken from the pool's timed events) can be measured with elapsed_s.
  ReleaseEvent(std::shared_ptr<detail::EventPool> pool, int device, EventHandle event, bool timed = false);
  ~ReleaseEvent();
  ReleaseEvent(const ReleaseEvent&) = delete;
  ReleaseEvent& operator=(const ReleaseEvent&) = delete;

  int device() const { return device_; }
  EventHandle handle() const { return event_; }
  bool timed() const { return timed_; }
  bool done() const;
  void synchronize() const;
  // Work queued on `stream` after this call starts only once the lease's work is done.
  void wait(StreamHandle stream) const;

 private:
  std::shared_ptr<detail::EventPool> pool_;
  int device_;
  EventHandle event_;
  bool timed_;
};

}  // namespace octopus::scheduler

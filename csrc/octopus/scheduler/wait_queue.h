// The callers waiting for a lease, in the order they are served: by class (latency-critical,
// normal, best-effort), then priority, then earliest deadline (none counts as latest),
// then arrival.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <optional>
#include <vector>

#include "octopus/scheduler/config.h"
#include "octopus/scheduler/lease_grant.h"

namespace octopus::scheduler {

namespace detail {

using Clock = std::chrono::steady_clock;

// Why a request could not be granted on a device.
enum class Limit { None, Queue, Leases, BestEffortLeases, Occupancy, Memory };

struct Waiter {
  const AcquireRequest* request = nullptr;
  WorkClass work_class = WorkClass::Normal;  // after promotion
  int priority = 0;                          // after promotion
  bool promoted = false;
  uint64_t ticket = UINT64_MAX;  // until queued: after everyone already waiting
  Clock::time_point requested;
  std::optional<Clock::time_point> deadline;
  std::condition_variable cv;
  bool granted = false;
  bool queued = false;  // not granted on arrival
  LeaseGrant grant;
  // Counted among the latency-critical requests waiting (which throttle best-effort work).
  bool counted_waiting = false;
  Limit limit = Limit::None;
  int limit_index = -1;  // the device index `limit` refers to
};

// Whether `a` is served before `b` (both may be outside the queue).
bool served_before(const Waiter* a, const Waiter* b);

class WaitQueue {
 public:
  // Inserts `w` at its place and gives it the next ticket.
  void push(Waiter& w);
  void remove(Waiter& w);
  void remove_granted();
  const std::vector<Waiter*>& waiters() const { return waiters_; }
  bool empty() const { return waiters_.empty(); }

 private:
  std::vector<Waiter*> waiters_;
  uint64_t next_ticket_ = 0;
};

}  // namespace detail
}  // namespace octopus::scheduler

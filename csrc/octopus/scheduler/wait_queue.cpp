#include "octopus/scheduler/wait_queue.h"

#include <algorithm>

namespace octopus::scheduler::detail {

bool served_before(const Waiter* a, const Waiter* b) {
  if (a->work_class != b->work_class) return static_cast<int>(a->work_class) > static_cast<int>(b->work_class);
  if (a->priority != b->priority) return a->priority > b->priority;
  if (a->deadline != b->deadline) {
    if (!a->deadline || !b->deadline) return a->deadline.has_value();
    return *a->deadline < *b->deadline;
  }
  return a->ticket < b->ticket;
}

void WaitQueue::push(Waiter& w) {
  w.ticket = next_ticket_++;
  waiters_.insert(std::upper_bound(waiters_.begin(), waiters_.end(), &w, served_before), &w);
}

void WaitQueue::remove(Waiter& w) { waiters_.erase(std::remove(waiters_.begin(), waiters_.end(), &w), waiters_.end()); }

void WaitQueue::remove_granted() {
  waiters_.erase(std::remove_if(waiters_.begin(), waiters_.end(), [](const Waiter* w) { return w->granted; }),
                 waiters_.end());
}

}  // namespace octopus::scheduler::detail

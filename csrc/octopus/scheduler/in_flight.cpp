#include "octopus/scheduler/in_flight.h"

#include <algorithm>

namespace octopus::scheduler::detail {

InFlightWindow::InFlightWindow(std::shared_ptr<EventPool> pool, int device, StreamHandle stream)
    : pool_(std::move(pool)), device_(device), stream_(stream), next_launched_(Clock::now()) {}

InFlightWindow::~InFlightWindow() {
  for (const Mark& m : marks_) pool_->give_back(device_, m.event);
}

void InFlightWindow::mark() {
  EventHandle event = pool_->take(device_);
  try {
    pool_->backend().record_event(device_, event, stream_);
  } catch (...) {
    pool_->give_back(device_, event);
    throw;
  }
  marks_.push_back(Mark{event, next_units_, next_launched_});
  next_units_ = 0.0;
}

std::vector<double> InFlightWindow::wait_until_at_most(std::size_t unfinished) {
  std::vector<double> seconds_per_unit;
  DeviceBackend& backend = pool_->backend();
  while (marks_.size() > unfinished) {
    const Mark m = marks_.front();
    // A slice found finished only now may have finished long ago: its end is not known.
    const bool exact = !backend.event_done(device_, m.event);
    if (exact) backend.synchronize_event(device_, m.event);
    const Clock::time_point done = Clock::now();
    marks_.pop_front();
    pool_->give_back(device_, m.event);
    // The slice ran from when it was launched or the one before it finished, whichever
    // came later, to now; only measurable if both ends were seen as they happened.
    if (exact && previous_exact_ && m.units > 0.0) {
      const Clock::time_point began = std::max(m.launched, previous_done_);
      seconds_per_unit.push_back(std::chrono::duration<double>(done - began).count() / m.units);
    }
    previous_exact_ = exact;
    previous_done_ = done;
  }
  return seconds_per_unit;
}

void InFlightWindow::start_slice(double units, Clock::time_point now) {
  next_units_ = units;
  next_launched_ = now;
}

}  // namespace octopus::scheduler::detail

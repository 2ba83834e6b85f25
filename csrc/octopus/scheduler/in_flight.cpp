#include "octopus/scheduler/in_flight.h"


namespace octopus::scheduler::detail {

InFlightWindow::InFlightWindow(std::shared_ptr<EventPool> pool, int device, StreamHandle stream)
    : pool_(std::move(pool)), device_(device), stream_(stream) {}

InFlightWindow::~InFlightWindow() {
  for (const Mark& m : marks_) pool_->give_back(device_, m.event, true);
  if (previous_) pool_->give_back(device_, previous_, true);
}

void InFlightWindow::mark() {
  EventHandle event = pool_->take(device_, true);
  try {
    pool_->backend().record_event(device_, event, stream_);
  } catch (...) {
    pool_->give_back(device_, event, true);
    throw;
  }
  marks_.push_back(Mark{event, next_units_, next_paused_s_});
  next_units_ = next_paused_s_ = 0.0;
}

std::vector<double> InFlightWindow::wait_until_at_most(std::size_t unfinished) {
  std::vector<double> seconds_per_unit;
  DeviceBackend& backend = pool_->backend();
  while (marks_.size() > unfinished) {
    const Mark m = marks_.front();
    backend.synchronize_event(device_, m.event);
    marks_.pop_front();
    if (previous_ != nullptr) {
      if (m.units > 0.0) {
        const double took = backend.elapsed_s(device_, previous_, m.event) - m.paused_s;
        if (took > 0.0) seconds_per_unit.push_back(took / m.units);  // (NaN: no device clock)
      }
      pool_->give_back(device_, previous_, true);
    }
    previous_ = m.event;
  }
  return seconds_per_unit;
}

void InFlightWindow::start_slice(double units, double paused_s) {
  next_units_ = units;
  next_paused_s_ = paused_s;
}

}  // namespace octopus::scheduler::detail

#include "octopus/scheduler/in_flight.h"

#include <chrono>
#include <limits>

namespace octopus::scheduler::detail {

InFlightWindow::InFlightWindow(std::shared_ptr<EventPool> pool, int device, StreamHandle stream)
    : pool_(std::move(pool)), device_(device), stream_(stream) {}

InFlightWindow::~InFlightWindow() {
  for (const Mark& m : marks_) {
    if (m.start) pool_->give_back(device_, m.start, true);
    pool_->give_back(device_, m.end, true);
  }
  drop_open_slice();
}

EventHandle InFlightWindow::record() {
  EventHandle event = pool_->take(device_, true);
  try {
    pool_->backend().record_event(device_, event, stream_);
  } catch (...) {
    pool_->give_back(device_, event, true);
    throw;
  }
  return event;
}

void InFlightWindow::mark() {
  const EventHandle end = record();
  const double host_s = next_start_ ? std::chrono::duration<double>(Clock::now() - next_started_).count() : 0.0;
  marks_.push_back(Mark{next_start_, end, next_units_, host_s, next_queued_behind_});
  next_start_ = nullptr;
  next_units_ = 0.0;
  next_queued_behind_ = false;
}

void InFlightWindow::end_slice() {
  if (next_start_) mark();
}

void InFlightWindow::drop_open_slice() noexcept {
  if (!next_start_) return;
  pool_->give_back(device_, next_start_, true);
  next_start_ = nullptr;
  next_units_ = 0.0;
  next_queued_behind_ = false;
}

void InFlightWindow::pop_finished(std::vector<SliceTiming>& timings) {
  const Mark& m = marks_.front();
  if (m.start && m.units > 0.0) {  // read before the mark leaves: a throw keeps its events in the window
    const double took = pool_->backend().elapsed_s(device_, m.start, m.end);  // NaN: no device clock
    timings.push_back(SliceTiming{took > 0.0 ? took / m.units : std::numeric_limits<double>::quiet_NaN(), m.host_s,
                                  m.queued_behind});
  }
  if (m.start) pool_->give_back(device_, m.start, true);
  pool_->give_back(device_, m.end, true);
  marks_.pop_front();
}

std::vector<SliceTiming> InFlightWindow::wait_until_at_most(std::size_t unfinished) {
  std::vector<SliceTiming> timings;
  while (marks_.size() > unfinished) {
    pool_->backend().synchronize_event(device_, marks_.front().end);
    pop_finished(timings);
  }
  return timings;
}

std::vector<SliceTiming> InFlightWindow::take_finished() {
  std::vector<SliceTiming> timings;
  while (!marks_.empty() && pool_->backend().event_done(device_, marks_.front().end)) pop_finished(timings);
  return timings;
}

void InFlightWindow::start_slice(double units) {
  drop_open_slice();  // two starts without a mark between them: the later one counts
  next_start_ = record();
  // Asked after the start is recorded: a previous slice that ends in between leaves this one
  // marked as queued behind it (an idle-start slice taken as its own time), never the reverse.
  next_queued_behind_ = !marks_.empty() && !pool_->backend().event_done(device_, marks_.back().end);
  next_units_ = units;
  next_started_ = Clock::now();
}

}  // namespace octopus::scheduler::detail

// The in-flight bound of one best-effort lease. Each checkpoint records an event after the
// work queued so far (so it marks the end of the slice launched since the previous
// checkpoint) and waits until few enough of the marked slices are unfinished; waiting for
// a slice that had not finished also measures how long it ran on the device.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <vector>

#include "octopus/scheduler/event_pool.h"

namespace octopus::scheduler::detail {

class InFlightWindow {
 public:
  using Clock = std::chrono::steady_clock;

  InFlightWindow(std::shared_ptr<EventPool> pool, int device, StreamHandle stream);
  ~InFlightWindow();  // gives every event back (recording again later is harmless)
  InFlightWindow(const InFlightWindow&) = delete;
  InFlightWindow& operator=(const InFlightWindow&) = delete;

  // Records an event on the stream: the end of the slice started by start_slice.
  void mark();
  // Blocks until at most `unfinished` marked slices are still queued or running; returns
  // seconds per unit of each slice whose device time could be measured on the way. The
  // caller must not hold the scheduler's lock.
  std::vector<double> wait_until_at_most(std::size_t unfinished);
  // The next slice, of `units` of work, is being launched now.
  void start_slice(double units, Clock::time_point now);
  // Later marks go on `stream` (the lease moved there, after its work so far).
  void set_stream(StreamHandle stream) { stream_ = stream; }
  std::size_t size() const { return marks_.size(); }

 private:
  struct Mark {
    EventHandle event;
    double units;                  // the work of the slice this event ends
    Clock::time_point launched;    // when that slice began to be launched
  };

  std::shared_ptr<EventPool> pool_;
  int device_;
  StreamHandle stream_;
  std::deque<Mark> marks_;
  double next_units_ = 0.0;
  Clock::time_point next_launched_;
  // When the previous retired slice finished, where that was observed as it happened
  // (by waiting for it) rather than found afterwards.
  bool previous_exact_ = false;
  Clock::time_point previous_done_;
};

}  // namespace octopus::scheduler::detail

// The in-flight bound of one best-effort lease. Each checkpoint records an event after the
// work queued so far (so it marks the end of the slice launched since the previous
// checkpoint) and waits until few enough of the marked slices are unfinished. The device
// time between two consecutive marks, less the holder's pause between them, is how long a
// slice took end to end on the device: its kernels, and any wait for the host to launch
// them or for latency-critical work (slices too short for their host time measure long,
// and the next are sized larger).
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
  // seconds per unit of each slice measured on the way. The caller must not hold the
  // scheduler's lock.
  std::vector<double> wait_until_at_most(std::size_t unfinished);
  // The next slice, of `units` of work, is being launched now, after the holder paused
  // `paused_s` since the last mark.
  void start_slice(double units, double paused_s);
  // Later marks go on `stream` (the lease moved there, after its work so far).
  void set_stream(StreamHandle stream) { stream_ = stream; }
  std::size_t size() const { return marks_.size(); }

 private:
  struct Mark {
    EventHandle event;
    double units;     // the work of the slice this event ends
    double paused_s;  // the holder's pause before launching it
  };

  std::shared_ptr<EventPool> pool_;
  int device_;
  StreamHandle stream_;
  std::deque<Mark> marks_;
  double next_units_ = 0.0;
  double next_paused_s_ = 0.0;
  EventHandle previous_ = nullptr;  // the last retired mark, where each slice is timed from
};

}  // namespace octopus::scheduler::detail

// The in-flight bound of one best-effort lease. Each checkpoint records an event after the
// work queued so far (the end of the slice started at the previous checkpoint) and waits until
// few enough of the marked slices are unfinished; then it records an event before the next
// slice. The device time between a slice's two events is how long it took on the device
// (its kernels, and, where the stream was idle, the host's launching of them), never the
// holder's pauses or waits between slices: those are what slicing adds, and counting them made
// slices shorter where the host could not keep up, and shorter still after that. A slice
// launched while the holder's previous one was still on the device starts the moment that one
// ends; one launched onto an idle stream (every slice of a holder kept to one in flight) also
// counts its wait for SMs that other streams' kernels hold: each is marked as which. Each slice's
// host time (from its start to the next checkpoint: launching it, and any wait for the GIL) is
// measured too: slices are kept longer than it (policy.h, KindModel). A lease's last slice
// ends where its holder says (Lease::end_slice: the slicing helpers, when their work is
// queued); one still open at the release is dropped unmeasured (its holder may have queued
// none of its work). The window then lives on, unwaited, until its slices have finished
// (take_finished, from later checkpoints): without it, slices as long as the whole work would
// never be measured, and an estimate that had grown them so would never move.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <vector>

#include "octopus/scheduler/event_pool.h"

namespace octopus::scheduler::detail {

// What one finished slice measured.
struct SliceTiming {
  double seconds_per_unit;  // device time per unit (NaN: the backend has no device clock)
  double host_s;            // the host's time from its start to the next checkpoint
  bool queued_behind;       // launched while the holder's previous slice was unfinished
};

class InFlightWindow {
 public:
  using Clock = std::chrono::steady_clock;

  InFlightWindow(std::shared_ptr<EventPool> pool, int device, StreamHandle stream);
  ~InFlightWindow();  // gives every event back (recording again later is harmless)
  InFlightWindow(const InFlightWindow&) = delete;
  InFlightWindow& operator=(const InFlightWindow&) = delete;

  // Records an event on the stream: the end of the slice started by start_slice (or of the
  // work before the first one).
  void mark();
  // Ends the slice started by start_slice, if one is open (mark()).
  void end_slice();
  // Drops the slice started by start_slice, if one is open, unmeasured.
  void drop_open_slice() noexcept;
  // Blocks until at most `unfinished` marked slices are still queued or running; returns what
  // each slice started by start_slice measured, for those finished on the way. The caller
  // must not hold the scheduler's lock.
  std::vector<SliceTiming> wait_until_at_most(std::size_t unfinished);
  // What each finished slice measured, waiting for none (in the order they were marked).
  std::vector<SliceTiming> take_finished();
  // The next slice, of `units` of work, is launched from now: records its start event.
  void start_slice(double units);
  // Later events go on `stream` (the lease moved there, after its work so far).
  void set_stream(StreamHandle stream) { stream_ = stream; }
  std::size_t size() const { return marks_.size(); }

 private:
  struct Mark {
    EventHandle start;  // null: the work before the first start_slice (not measured)
    EventHandle end;
    double units;
    double host_s;
    bool queued_behind;
  };
  EventHandle record();  // a timed event of the pool, recorded on the stream now
  // Takes the oldest mark (finished) off the window, adding what it measured to `timings`.
  void pop_finished(std::vector<SliceTiming>& timings);

  std::shared_ptr<EventPool> pool_;
  int device_;
  StreamHandle stream_;
  std::deque<Mark> marks_;
  EventHandle next_start_ = nullptr;
  double next_units_ = 0.0;
  bool next_queued_behind_ = false;
  Clock::time_point next_started_;
};

}  // namespace octopus::scheduler::detail

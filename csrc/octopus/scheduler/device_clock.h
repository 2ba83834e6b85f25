// When a latency-critical lease's work finished, on the host's clock, from the device's own
// timing. The control thread only sees that a release event has completed when it looks,
// and on a loaded host it looks late (its wake-ups wait for a core): stamping completions
// when they are seen inflates every latency by the thread's lateness, and the controller
// then throttles best-effort work against delays the GPU did not cause. Instead, a
// reference event is recorded and its completion time on the host found closely (polling
// it, the calibration kept when that window is narrow); a completed timed event then finished at
// reference + cudaEventElapsedTime(reference, event). Recalibrated every second (the two
// clocks drift by parts per million). Backends without timing (the simulation) give no
// stamp, and the caller falls back to when it saw the event done.
#pragma once

#include <functional>
#include <optional>

#include "octopus/scheduler/device_backend.h"

namespace octopus::scheduler::detail {

class DeviceClock {
 public:
  // `now_us` reads the host clock the stamps are in.
  DeviceClock(DeviceBackend& backend, int device, std::function<double()> now_us);
  ~DeviceClock();
  DeviceClock(const DeviceClock&) = delete;
  DeviceClock& operator=(const DeviceClock&) = delete;

  // Calibrates if the last calibration is older than kRecalibrateUs (or none was ever
  // kept). Blocks the calling thread for the poll, at most a few hundred microseconds.
  void maybe_calibrate();
  // Calibrates now; false where no attempt found the reference's completion closely enough
  // (the last calibration kept, if any).
  bool calibrate();
  // When the completed timed event `event` finished, on the host clock; none where the
  // backend has no device timing or no calibration is kept yet.
  std::optional<double> completed_us(EventHandle event);
  bool calibrated() const { return reference_us_.has_value(); }

 private:
  bool calibrate_once();

  DeviceBackend& backend_;
  int device_;
  std::function<double()> now_us_;
  StreamHandle stream_ = nullptr;
  EventHandle reference_ = nullptr;  // completed at reference_us_ on the host clock
  EventHandle candidate_ = nullptr;  // recorded by a calibration, the reference once kept
  std::optional<double> reference_us_;
  double calibrated_at_us_ = -1e300;
  bool timing_ = true;  // false once the backend said it has no clock
};

}  // namespace octopus::scheduler::detail

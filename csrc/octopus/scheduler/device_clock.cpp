#include "octopus/scheduler/device_clock.h"

#include <cmath>
#include <exception>
#include <utility>

namespace octopus::scheduler::detail {
namespace {

constexpr double kRecalibrateUs = 1e6;
// A calibration is kept when the reference's completion is known within this window (a
// stamp is then off by at most half of it); else it is retried a few times, and the old
// one kept meanwhile.
constexpr double kMaxWindowUs = 20.0;
constexpr int kAttempts = 4;
// How long one attempt polls the reference before giving up (an event on an idle stream
// completes within microseconds, whatever the device's SMs are running).
constexpr double kPollLimitUs = 500.0;

}  // namespace

DeviceClock::DeviceClock(DeviceBackend& backend, int device, std::function<double()> now_us)
    : backend_(backend), device_(device), now_us_(std::move(now_us)) {
  stream_ = backend_.create_stream(device_, true);
  reference_ = backend_.create_event(device_, true);
  candidate_ = backend_.create_event(device_, true);
}

DeviceClock::~DeviceClock() {
  backend_.destroy_event(device_, reference_);
  backend_.destroy_event(device_, candidate_);
  backend_.return_stream(device_, stream_);
}

void DeviceClock::maybe_calibrate() {
  const double now = now_us_();
  if (!timing_ || now - calibrated_at_us_ < kRecalibrateUs) return;
  calibrated_at_us_ = now;  // a failed calibration is retried a second later too
  calibrate();
}

bool DeviceClock::calibrate() {
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    if (calibrate_once()) return true;
  }
  return false;
}

bool DeviceClock::calibrate_once() {
  // The candidate completes after the last poll that found it unfinished began (or after it
  // was recorded) and before the first poll that found it finished returned.
  double lower = now_us_();
  backend_.record_event(device_, candidate_, stream_);
  const double limit = lower + kPollLimitUs;
  while (true) {
    const double before = now_us_();
    const bool done = backend_.event_done(device_, candidate_);
    const double upper = now_us_();
    if (done) {
      if (upper - lower > kMaxWindowUs) return false;
      std::swap(reference_, candidate_);
      reference_us_ = 0.5 * (lower + upper);
      return true;
    }
    lower = before;
    if (upper > limit) return false;  // re-recording the candidate later is fine
  }
}

std::optional<double> DeviceClock::completed_us(EventHandle event) {
  if (!timing_ || !reference_us_) return std::nullopt;
  double elapsed = 0.0;
  try {
    elapsed = backend_.elapsed_s(device_, reference_, event);
  } catch (const std::exception&) {
    return std::nullopt;  // e.g. an event recorded without timing
  }
  if (!std::isfinite(elapsed)) {
    timing_ = false;
    return std::nullopt;
  }
  return *reference_us_ + elapsed * 1e6;
}

}  // namespace octopus::scheduler::detail

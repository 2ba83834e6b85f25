// The device clock that stamps latency-critical completions (device_clock.h), on the
// simulated backend, whose events complete when the test says: a completion the caller
// looks at late is stamped when it happened, not when it was seen.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "octopus/scheduler/device_clock.h"
#include "octopus/scheduler/simulated_backend.h"

namespace octopus::scheduler {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double now_us() { return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count(); }

TEST(DeviceClock, NoStampBeforeACalibration) {
  SimulatedBackend backend(1);
  backend.set_manual_events(true);  // the reference never completes on its own
  detail::DeviceClock clock(backend, 0, now_us);
  EXPECT_FALSE(clock.calibrate());
  EXPECT_FALSE(clock.calibrated());
  EventHandle event = backend.create_event(0, true);
  backend.record_event(0, event, nullptr);
  backend.complete_events(0, -1);
  EXPECT_FALSE(clock.completed_us(event).has_value());
}

TEST(DeviceClock, ACompletionSeenLateIsStampedWhenItHappened) {
  SimulatedBackend backend(1);
  detail::DeviceClock clock(backend, 0, now_us);
  ASSERT_TRUE(clock.calibrate());
  backend.set_manual_events(true);
  EventHandle event = backend.create_event(0, true);
  backend.record_event(0, event, nullptr);
  std::this_thread::sleep_for(5ms);
  const double before = now_us();
  backend.complete_events(0, -1);
  const double after = now_us();
  std::this_thread::sleep_for(30ms);  // the caller looks 30 ms late
  const std::optional<double> stamp = clock.completed_us(event);
  ASSERT_TRUE(stamp.has_value());
  // Within the calibration's window (at most 20 us wide) of when it completed.
  EXPECT_GE(*stamp, before - 20.0);
  EXPECT_LE(*stamp, after + 20.0);
}

TEST(DeviceClock, ACompletionBeforeTheCalibrationIsStampedBeforeIt) {
  SimulatedBackend backend(1);
  detail::DeviceClock clock(backend, 0, now_us);
  EventHandle event = backend.create_event(0, true);
  const double before = now_us();
  backend.record_event(0, event, nullptr);  // completes at once
  const double after = now_us();
  std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(clock.calibrate());
  const std::optional<double> stamp = clock.completed_us(event);
  ASSERT_TRUE(stamp.has_value());
  EXPECT_GE(*stamp, before - 20.0);
  EXPECT_LE(*stamp, after + 20.0);
}

TEST(DeviceClock, RecalibratesOnlyOnceASecond) {
  SimulatedBackend backend(1);
  detail::DeviceClock clock(backend, 0, now_us);
  const int64_t recorded = backend.events_recorded();
  clock.maybe_calibrate();
  EXPECT_TRUE(clock.calibrated());
  const int64_t after_first = backend.events_recorded();
  EXPECT_GT(after_first, recorded);
  clock.maybe_calibrate();
  EXPECT_EQ(backend.events_recorded(), after_first);
}

}  // namespace
}  // namespace octopus::scheduler

// The StreamScheduler's classes of work on the simulated backend: earliest-deadline-first
// order, infeasible deadlines (rejected or promoted), best-effort throttling and the
// in-flight bound at checkpoints, measured time per unit, the adaptive lease limit, SM
// partitions, and a stress run of every class with deadlines and checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "octopus/scheduler/in_flight.h"
#include "octopus/scheduler/policy.h"
#include "octopus/scheduler/simulated_backend.h"
#include "octopus/scheduler/stream_scheduler.h"

namespace {

using namespace octopus::scheduler;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Fixture {
  std::shared_ptr<SimulatedBackend> backend;
  std::unique_ptr<StreamScheduler> scheduler;
};

Fixture make(SchedulerConfig config, int devices = 1) {
  auto backend = std::make_shared<SimulatedBackend>(devices);
  return {backend, std::make_unique<StreamScheduler>(std::move(config), backend)};
}

SchedulerConfig leases(int n) {
  SchedulerConfig c;
  c.max_leases_per_device = n;
  return c;
}

AcquireRequest request(const std::string& kind, int priority = 0, std::optional<double> deadline = std::nullopt,
                       double timeout = -1.0, int device = -1) {
  AcquireRequest r;
  r.kind = kind;
  r.priority = priority;
  r.deadline_s = deadline;
  r.timeout_s = timeout;
  r.device = device;
  return r;
}

AcquireRequest best_effort(const std::string& kind = "be", int device = -1) {
  AcquireRequest r = request(kind, 0, std::nullopt, -1.0, device);
  r.best_effort = true;
  return r;
}

// Waits (at most 5 s, generous for a loaded machine) until `done` holds.
void eventually(const std::function<bool()>& done, const char* what) {
  const auto give_up = Clock::now() + 5s;
  while (!done()) {
    ASSERT_LT(Clock::now(), give_up) << "never happened: " << what;
    std::this_thread::sleep_for(1ms);
  }
}

const ClassStats& of(const SchedulerStats& s, WorkClass c) { return s.classes[static_cast<std::size_t>(c)]; }

// Holds `n` leases of `kind` for at least `hold` each, so the kind has a typical hold time.
void teach_hold(StreamScheduler& s, const std::string& kind, std::chrono::milliseconds hold, int n = 3) {
  for (int i = 0; i < n; ++i) {
    Lease l = s.acquire(request(kind));
    std::this_thread::sleep_for(hold);
  }
}

TEST(SchedulerClasses, ClassesFromPriorityAndFlag) {
  EXPECT_EQ(work_class_of(request("k", 1)), WorkClass::LatencyCritical);
  EXPECT_EQ(work_class_of(request("k", 0)), WorkClass::Normal);
  EXPECT_EQ(work_class_of(request("k", -1)), WorkClass::BestEffort);
  AcquireRequest flagged = request("k", 3);
  flagged.best_effort = true;
  EXPECT_EQ(work_class_of(flagged), WorkClass::BestEffort);
  EXPECT_STREQ(work_class_name(WorkClass::BestEffort), "best_effort");
  EXPECT_EQ(parse_throttle_mode("waiting"), ThrottleMode::Waiting);
  EXPECT_THROW(parse_throttle_mode("sometimes"), std::invalid_argument);
  EXPECT_EQ(parse_infeasible_deadline("promote"), InfeasibleDeadline::Promote);
  EXPECT_THROW(parse_infeasible_deadline("ignore"), std::invalid_argument);
}

TEST(SchedulerClasses, EarliestDeadlineFirstWithinAPriority) {
  auto f = make(leases(1));
  Lease held = f.scheduler->acquire(request("k"));
  // Deadlines far away (never missed); kinds never seen (no estimate, so all feasible).
  const std::vector<AcquireRequest> requests{
      request("a", 0, 50.0), request("b", 0, 20.0), request("c", 0), request("d", 0, 30.0),
      request("e", 1, 90.0), request("f", 0, 20.0), request("g", -1, 10.0), request("h", 1)};
  std::mutex order_mutex;
  std::vector<std::string> order;
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      Lease l = f.scheduler->acquire(requests[i]);
      std::lock_guard<std::mutex> lock(order_mutex);
      order.push_back(requests[i].kind);
    });
    eventually([&] { return f.scheduler->stats().waiting == static_cast<int64_t>(i) + 1; }, "waiting");
  }
  held.release();
  for (auto& t : threads) t.join();
  // High first (deadline before none), then normal by deadline (ties by arrival), the
  // one without a deadline last of them, then best-effort.
  EXPECT_EQ(order, (std::vector<std::string>{"e", "h", "b", "f", "d", "a", "c", "g"}));
}

TEST(SchedulerClasses, InfeasibleDeadlineIsRejectedAtOnce) {
  auto f = make(leases(2));
  teach_hold(*f.scheduler, "slow", 30ms);
  const auto start = Clock::now();
  try {
    f.scheduler->acquire(request("slow", 0, 0.005));
    FAIL() << "acquire should have been rejected";
  } catch (const DeadlineMissed& e) {
    EXPECT_LT(Clock::now() - start, 1s);
    EXPECT_NE(std::string(e.what()).find("cannot meet its deadline"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'slow'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.scheduler->try_acquire(request("slow", 0, 0.005)), DeadlineMissed);
  EXPECT_TRUE(f.scheduler->try_acquire(request("slow", 0, 10.0)).has_value());
  // The wait counts too: with the only lease held by a "slow" one just granted, a kind
  // never seen cannot start for ~30 ms.
  auto g = make(leases(1));
  teach_hold(*g.scheduler, "slow", 30ms);
  Lease busy = g.scheduler->acquire(request("slow"));
  EXPECT_THROW(g.scheduler->acquire(request("new", 0, 0.002)), DeadlineMissed);
  const SchedulerStats s = g.scheduler->stats();
  EXPECT_EQ(of(s, WorkClass::Normal).deadline_rejected, 1);
  EXPECT_EQ(of(s, WorkClass::Normal).deadline_misses(), 1);
  EXPECT_EQ(s.waiting, 0);
  // A DeadlineMissed is a LeaseTimeout.
  EXPECT_THROW(g.scheduler->acquire(request("new", 0, 0.002)), LeaseTimeout);
}

TEST(SchedulerClasses, AKindsTypicalHoldIsThatOfTheRequestsClass) {
  // One kind of work as best-effort leases that each hold a long job, and as short normal ones:
  // a deadline is judged by the hold of its own class (mixed, the median here was 30 ms).
  auto f = make(leases(3));
  for (int i = 0; i < 5; ++i) {
    Lease l = f.scheduler->acquire(best_effort("affine"));
    std::this_thread::sleep_for(30ms);
  }
  teach_hold(*f.scheduler, "affine", 1ms);
  EXPECT_TRUE(f.scheduler->try_acquire(request("affine", 0, 0.015)).has_value());
  AcquireRequest late = best_effort("affine");
  late.deadline_s = 0.015;
  EXPECT_THROW(f.scheduler->acquire(late), DeadlineMissed);
}

TEST(SchedulerClasses, InfeasibleDeadlineIsPromotedWhenAskedTo) {
  SchedulerConfig c = leases(2);
  c.infeasible_deadline = InfeasibleDeadline::Promote;
  auto f = make(c);
  teach_hold(*f.scheduler, "slow", 30ms);
  Lease l = f.scheduler->acquire(request("slow", 0, 0.005));
  EXPECT_TRUE(l.promoted());
  EXPECT_EQ(l.work_class(), WorkClass::LatencyCritical);
  EXPECT_GE(l.priority(), 1);
  EXPECT_GE(l.stream_slot(), 2);  // a high-priority stream
  EXPECT_LT(l.stream_slot(), 4);
  Lease feasible = f.scheduler->acquire(request("slow", 0, 10.0));
  EXPECT_FALSE(feasible.promoted());
  EXPECT_EQ(of(f.scheduler->stats(), WorkClass::Normal).deadline_promoted, 1);
}

TEST(SchedulerClasses, DeadlinePassingWhileWaiting) {
  auto f = make(leases(1));
  Lease held = f.scheduler->acquire(request("k"));
  const auto start = Clock::now();
  try {
    f.scheduler->acquire(request("fresh", 0, 0.05, 10.0));
    FAIL() << "the deadline should have passed";
  } catch (const DeadlineMissed& e) {
    const auto waited = Clock::now() - start;
    EXPECT_GE(waited, 50ms);
    EXPECT_LT(waited, 2s);
    EXPECT_NE(std::string(e.what()).find("missed its deadline"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lease limit"), std::string::npos) << e.what();
  }
  const SchedulerStats s = f.scheduler->stats();
  EXPECT_EQ(of(s, WorkClass::Normal).deadline_expired, 1);
  EXPECT_EQ(s.timeouts, 0);
  EXPECT_EQ(s.waiting, 0);
}

TEST(SchedulerClasses, LateReturnIsADeadlineMiss) {
  auto f = make(leases(1));
  {
    Lease l = f.scheduler->acquire(request("fresh", 1, 0.01));
    std::this_thread::sleep_for(30ms);
  }
  { Lease on_time = f.scheduler->acquire(request("other", 1, 10.0)); }
  const ClassStats& high = of(f.scheduler->stats(), WorkClass::LatencyCritical);
  EXPECT_EQ(high.deadline_late, 1);
  EXPECT_EQ(high.deadline_misses(), 1);
  EXPECT_EQ(high.released, 2);
}

TEST(SchedulerClasses, ThrottledHolderStopsAtCheckpointsUntilLatencyCriticalWorkIsDone) {
  SchedulerConfig c = leases(4);
  c.latency_control = false;  // the fixed mechanisms alone
  c.best_effort_max_pause_s = -1.0;  // no limit: the pause lasts as long as the lease
  c.best_effort_in_flight = 0;       // only the throttle here
  auto f = make(c);
  Lease background = f.scheduler->acquire(best_effort());
  std::atomic<int64_t> slices{0};
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    while (!stop.load()) {
      background.checkpoint(1.0);
      slices.fetch_add(1);  // a slice launched
    }
  });
  eventually([&] { return slices.load() > 100; }, "best-effort slices run");
  Lease urgent = f.scheduler->acquire(request("urgent", 1));
  // At most the slice already past its checkpoint at the grant is launched, however
  // slowly this machine runs the worker; unthrottled it would launch thousands.
  const int64_t at_grant = slices.load();
  std::this_thread::sleep_for(200ms);
  EXPECT_LE(slices.load(), at_grant + 1) << "a throttled holder launched more slices";
  const int64_t paused_at = slices.load();
  // Normal work does not throttle.
  urgent.release();
  eventually([&] { return slices.load() > paused_at + 100; }, "slices resume");
  Lease normal = f.scheduler->acquire(request("normal", 0));
  const int64_t with_normal = slices.load();
  eventually([&] { return slices.load() > with_normal + 100; }, "slices run beside normal work");
  stop.store(true);
  worker.join();
  const ClassStats& be = of(f.scheduler->stats(), WorkClass::BestEffort);
  EXPECT_GE(be.pauses, 1);
  EXPECT_GT(be.throttled_s, 0.0);
  // Checkpoints of other classes never wait.
  Lease high = f.scheduler->acquire(request("urgent", 1));
  EXPECT_EQ(normal.checkpoint(), 0.0);
  EXPECT_EQ(high.checkpoint(), 0.0);
}

TEST(SchedulerClasses, AHolderThatNeverCallsCheckpointIsNotThrottled) {
  auto f = make(leases(2));
  Lease background = f.scheduler->acquire(best_effort());
  // The latency-critical lease is granted at once, and the best-effort holder is not
  // stopped: nothing but its own checkpoints can pause it.
  auto urgent = f.scheduler->try_acquire(request("urgent", 1));
  ASSERT_TRUE(urgent.has_value());
  EXPECT_NE(background.release(), nullptr);
}

TEST(SchedulerClasses, PausesAreBoundedByMaxPause) {
  SchedulerConfig c = leases(4);
  c.latency_control = false;  // the fixed mechanisms alone
  c.best_effort_max_pause_s = 0.05;
  c.best_effort_in_flight = 0;
  auto f = make(c);
  Lease background = f.scheduler->acquire(best_effort());
  Lease urgent = f.scheduler->acquire(request("urgent", 1));
  const auto start = Clock::now();
  const double paused = background.checkpoint();
  EXPECT_GE(paused, 0.05);
  EXPECT_GE(Clock::now() - start, 50ms);
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST(SchedulerClasses, WaitingModeThrottlesOnlyWhileLatencyCriticalWorkWaits) {
  SchedulerConfig c = leases(2);
  c.latency_control = false;  // the fixed mechanisms alone
  c.throttle = ThrottleMode::Waiting;
  c.best_effort_max_pause_s = -1.0;
  c.best_effort_in_flight = 0;
  auto f = make(c);
  Lease background = f.scheduler->acquire(best_effort());
  Lease normal = f.scheduler->acquire(request("normal"));
  std::atomic<bool> granted{false};
  std::thread urgent([&] {
    Lease l = f.scheduler->acquire(request("urgent", 1));  // waits: both leases are held
    granted.store(true);
  });
  eventually([&] { return f.scheduler->stats().waiting == 1; }, "the latency-critical request waits");
  std::atomic<bool> resumed{false};
  std::thread worker([&] {
    background.checkpoint();
    resumed.store(true);
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(resumed.load());
  normal.release();
  urgent.join();
  worker.join();
  EXPECT_TRUE(granted.load());
  EXPECT_TRUE(resumed.load());
  Lease held = f.scheduler->acquire(request("urgent", 1));  // held, not waiting: no pause
  EXPECT_EQ(background.checkpoint(), 0.0);
}

TEST(SchedulerClasses, OffModeNeverThrottles) {
  SchedulerConfig c = leases(4);
  c.throttle = ThrottleMode::Off;
  c.best_effort_in_flight = 0;
  auto f = make(c);
  Lease background = f.scheduler->acquire(best_effort());
  Lease urgent = f.scheduler->acquire(request("urgent", 1));
  EXPECT_EQ(background.checkpoint(), 0.0);
}

TEST(SchedulerClasses, InFlightSlicesAreBounded) {
  for (const int in_flight : {1, 2, 3}) {
    SchedulerConfig c = leases(4);
    c.best_effort_in_flight = in_flight;
    auto f = make(c);
    f.backend->set_manual_events(true);
    Lease background = f.scheduler->acquire(best_effort());
    std::atomic<int> launched{0};
    std::atomic<bool> stop{false};
    std::thread worker([&] {
      while (!stop.load()) {
        background.checkpoint(1.0);
        launched.fetch_add(1);  // a slice "launched" on the lease's stream
      }
    });
    // The first checkpoint's event marks the work before the lease (none of its slices):
    // with nothing completed, in_flight - 1 slices get launched, then it waits. Every slice
    // has two events, one before it and one after it.
    eventually([&] { return launched.load() == in_flight - 1 && f.backend->pending_events(0) == 2 * in_flight - 1; },
               "the holder fills its window");
    std::this_thread::sleep_for(30ms);
    EXPECT_EQ(launched.load(), in_flight - 1);
    for (int done = 1; done <= 5; ++done) {
      f.backend->complete_events(0, done == 1 ? 1 : 2);  // the device finished the oldest marked slice
      eventually([&] { return launched.load() == in_flight - 1 + done; }, "one more slice launched");
      std::this_thread::sleep_for(5ms);
      EXPECT_EQ(launched.load(), in_flight - 1 + done) << "in_flight=" << in_flight;
      EXPECT_LE(f.backend->pending_events(0), 2 * in_flight);
    }
    stop.store(true);
    f.backend->set_manual_events(false);  // completes everything; the worker leaves
    worker.join();
  }
}

TEST(SchedulerClasses, TimePerUnitIsMeasuredAtCheckpoints) {
  SchedulerConfig c = leases(4);
  c.best_effort_in_flight = 1;
  auto f = make(c);
  EXPECT_FALSE(f.scheduler->seconds_per_unit("rows").has_value());
  f.backend->set_manual_events(true);
  AcquireRequest r = best_effort("rows");
  Lease background = f.scheduler->acquire(r);
  std::atomic<bool> finished{false};
  std::thread worker([&] {
    for (int i = 0; i < 6; ++i) {
      background.checkpoint(10.0);  // slices of 10 units, each launched in 5 ms
      std::this_thread::sleep_for(5ms);
    }
    finished.store(true);
  });
  // The "device" takes at least 20 ms per slice.
  while (!finished.load()) {
    std::this_thread::sleep_for(20ms);
    f.backend->complete_events(0, 1);
  }
  worker.join();
  const std::optional<double> rate = f.scheduler->seconds_per_unit("rows");
  ASSERT_TRUE(rate.has_value());
  EXPECT_GE(*rate, 0.001);  // 20 ms / 10 units = 2 ms per unit, at least half of it
  EXPECT_LT(*rate, 1.0);
  const std::optional<double> host = f.scheduler->host_seconds_per_slice("rows");
  ASSERT_TRUE(host.has_value());
  EXPECT_GE(*host, 0.004);  // from a checkpoint to the next: the 5 ms launch
  EXPECT_LT(*host, 1.0);
  EXPECT_FALSE(f.scheduler->host_seconds_per_slice("cols").has_value());
  f.scheduler->set_seconds_per_unit("cols", 0.5);
  EXPECT_DOUBLE_EQ(*f.scheduler->seconds_per_unit("cols"), 0.5);
  EXPECT_THROW(f.scheduler->set_seconds_per_unit("cols", 0.0), std::invalid_argument);
  EXPECT_THROW(background.checkpoint(-1.0), std::invalid_argument);
}

TEST(SchedulerClasses, ASliceLaunchedBehindItsHoldersLastIsToldFromOneOnAnIdleStream) {
  auto backend = std::make_shared<SimulatedBackend>(1);
  backend->set_manual_events(true);
  auto events = std::make_shared<detail::EventPool>(backend, std::vector<int>{0});
  detail::InFlightWindow window(events, 0, nullptr);
  window.mark();              // the work before the first slice, still on the device
  window.start_slice(10.0);   // behind it
  window.mark();
  backend->complete_events(0, backend->pending_events(0));
  window.start_slice(10.0);   // every slice before it has ended: onto an idle stream
  window.mark();
  backend->complete_events(0, backend->pending_events(0));
  const std::vector<detail::SliceTiming> timings = window.wait_until_at_most(0);
  ASSERT_EQ(timings.size(), 2u);
  EXPECT_TRUE(timings[0].queued_behind);
  EXPECT_FALSE(timings[1].queued_behind);
}

TEST(SchedulerClasses, ALastSliceIsMeasuredOnceItHasFinishedWithoutWaitingForIt) {
  auto backend = std::make_shared<SimulatedBackend>(1);
  backend->set_manual_events(true);
  auto events = std::make_shared<detail::EventPool>(backend, std::vector<int>{0});
  detail::InFlightWindow window(events, 0, nullptr);
  window.end_slice();  // no slice open: nothing to end
  EXPECT_EQ(window.size(), 0u);
  window.start_slice(10.0);
  window.end_slice();
  EXPECT_EQ(window.size(), 1u);
  EXPECT_TRUE(window.take_finished().empty());  // still on the device, and nothing waited for it
  EXPECT_EQ(window.size(), 1u);
  backend->complete_events(0, backend->pending_events(0));
  std::vector<detail::SliceTiming> timings = window.take_finished();
  ASSERT_EQ(timings.size(), 1u);
  EXPECT_GE(timings[0].host_s, 0.0);
  EXPECT_EQ(window.size(), 0u);
  window.start_slice(10.0);
  window.drop_open_slice();  // as a release does: unmeasured
  EXPECT_EQ(window.size(), 0u);
  window.end_slice();
  EXPECT_EQ(window.size(), 0u);
  EXPECT_EQ(backend->pending_events(0), 1) << "only the dropped start, recorded";
}

TEST(SchedulerClasses, ASliceWhoseTimeCannotBeReadStaysInItsWindow) {
  // Reading a slice's device time throws (a device error): the slice is not lost half-way,
  // its events stay in the window, and it is measured once its time can be read.
  auto backend = std::make_shared<SimulatedBackend>(1);
  auto events = std::make_shared<detail::EventPool>(backend, std::vector<int>{0});
  detail::InFlightWindow window(events, 0, nullptr);
  window.start_slice(10.0);
  window.end_slice();
  backend->set_elapsed_failure("simulated device error");
  EXPECT_THROW(window.take_finished(), std::runtime_error);
  EXPECT_EQ(window.size(), 1u);
  backend->set_elapsed_failure("");
  EXPECT_EQ(window.take_finished().size(), 1u);
  EXPECT_EQ(window.size(), 0u);
}

TEST(SchedulerClasses, AKeptLastSliceThatCannotBeMeasuredIsDroppedWithoutFailingTheCheckpoint) {
  // A returned lease's last slice is measured at a later checkpoint of any best-effort
  // holder. Where its time cannot be read, that checkpoint goes on and the slice is dropped
  // (not tried again at every checkpoint after); the kind's later slices are measured.
  SchedulerConfig c = leases(4);
  c.best_effort_in_flight = 1;
  auto f = make(c);
  const auto one_slice = [&](const std::string& kind) {
    Lease l = f.scheduler->acquire(best_effort(kind));
    l.checkpoint(10.0);
    std::this_thread::sleep_for(2ms);
    l.end_slice();
    l.release();
  };
  const auto checkpoint_of_another = [&] {
    Lease other = f.scheduler->acquire(best_effort("other"));
    EXPECT_NO_THROW(other.checkpoint(1.0));
  };
  one_slice("unreadable");
  f.backend->set_elapsed_failure("simulated device error");
  checkpoint_of_another();
  f.backend->set_elapsed_failure("");
  checkpoint_of_another();
  EXPECT_FALSE(f.scheduler->seconds_per_unit("unreadable").has_value()) << "dropped, not measured later";
  one_slice("unreadable");
  checkpoint_of_another();
  EXPECT_TRUE(f.scheduler->seconds_per_unit("unreadable").has_value());
}

TEST(SchedulerClasses, SlicesAsLongAsTheWholeWorkAreMeasuredToo) {
  // One slice a lease (the host's time per slice once raised slices to the whole work): each
  // is measured after its lease is returned, at a later checkpoint, so the estimates that
  // sized it can still move.
  SchedulerConfig c = leases(4);
  c.best_effort_in_flight = 1;
  auto f = make(c);
  for (int i = 0; i < 3; ++i) {
    Lease whole = f.scheduler->acquire(best_effort("whole"));
    whole.checkpoint(10.0);
    std::this_thread::sleep_for(5ms);  // the host launches it, the "device" runs it meanwhile
    whole.end_slice();
    whole.release();
    if (i == 0) EXPECT_FALSE(f.scheduler->seconds_per_unit("whole").has_value());  // taken at a later checkpoint
  }
  {
    Lease released = f.scheduler->acquire(best_effort("ended by its release"));
    released.checkpoint(10.0);
    std::this_thread::sleep_for(5ms);
  }
  Lease other = f.scheduler->acquire(best_effort("other"));
  other.checkpoint(1.0);
  const std::optional<double> rate = f.scheduler->seconds_per_unit("whole");
  ASSERT_TRUE(rate.has_value());
  EXPECT_GE(*rate, 4e-4);  // 5 ms / 10 units
  EXPECT_LT(*rate, 0.1);
  const std::optional<double> host = f.scheduler->host_seconds_per_slice("whole");
  ASSERT_TRUE(host.has_value());
  EXPECT_GE(*host, 0.004);
  EXPECT_LT(*host, 1.0);
  // A slice still open at the release: its holder may not have queued its work.
  EXPECT_FALSE(f.scheduler->seconds_per_unit("ended by its release").has_value());
  // A time per unit set for a kind stands over its slices run before (its windows kept).
  Lease before = f.scheduler->acquire(best_effort("set"));
  before.checkpoint(10.0);
  std::this_thread::sleep_for(5ms);
  before.end_slice();
  before.release();
  f.scheduler->set_seconds_per_unit("set", 1.0);
  other.checkpoint(1.0);
  EXPECT_DOUBLE_EQ(*f.scheduler->seconds_per_unit("set"), 1.0);
}

TEST(SchedulerClasses, IdleStartSlicesOnlyLowerTheTimePerUnit) {
  detail::SampleWindow behind(32), idle(32);
  EXPECT_FALSE(detail::estimate_seconds_per_unit(behind, idle).has_value());
  for (int i = 0; i < 32; ++i) idle.add(1e-9 * (100 + i));  // each waited for another stream's kernels
  EXPECT_NEAR(*detail::estimate_seconds_per_unit(behind, idle), 1.03e-7, 1e-12);  // none other known
  for (int i = 0; i < 32; ++i) behind.add(1e-9 * (2 + i % 4));
  EXPECT_NEAR(*detail::estimate_seconds_per_unit(behind, idle), 2e-9, 1e-15);  // the waits are left out
  for (int i = 0; i < 32; ++i) idle.add(1e-10);  // the work became cheaper
  EXPECT_NEAR(*detail::estimate_seconds_per_unit(behind, idle), 1e-10, 1e-15);
}

// What a kind's time per unit comes to after `slices` slices sized to a 1 ms budget from it,
// each launched onto an idle stream and doing 1 ns of work per unit plus `wait_s` of waiting
// that does not shrink with it (for the SMs of another stream's kernels, for the yield gate).
double time_per_unit_after(int slices, double wait_s, detail::KindModel& k) {
  const double budget = 1e-3, work = 1e-9;
  const auto now = detail::Clock::now();
  for (int i = 0; i < slices; ++i) {
    const double units = std::max(1.0, std::floor(budget / k.seconds_per_unit.value_or(work)));
    detail::add_slice_timings(k, {{(wait_s + units * work) / units, 1e-5, false}}, now);
  }
  return *k.seconds_per_unit;
}

TEST(SchedulerClasses, AWaitInEverySliceDoesNotShrinkSlicesWithoutBound) {
  detail::KindModel k;
  detail::add_slice_timings(k, {{1e-9, 1e-5, false}}, detail::Clock::now());  // a first slice alone
  EXPECT_DOUBLE_EQ(time_per_unit_after(400, 2e-3, k), detail::kMaxSlowdown * 1e-9);
  // Unbounded, the same slices shrink to a few units each: what the bound is for.
  detail::SampleWindow behind(32), idle(32);
  double rate = 1e-9;
  for (int i = 0; i < 400; ++i) {
    const double units = std::max(1.0, std::floor(1e-3 / rate));
    idle.add((2e-3 + units * 1e-9) / units);
    rate = *detail::estimate_seconds_per_unit(behind, idle);
  }
  EXPECT_GT(rate, 1e3 * 1e-9);
  // A slowdown within the bound stands; slices queued behind another move the bound's base
  // (the work itself became dearer).
  detail::KindModel shared;
  detail::add_slice_timings(shared, {{1e-9, 1e-5, false}}, detail::Clock::now());
  for (int i = 0; i < 32; ++i) detail::add_slice_timings(shared, {{3e-9, 1e-5, false}}, detail::Clock::now());
  EXPECT_DOUBLE_EQ(*shared.seconds_per_unit, 3e-9);
  for (int i = 0; i < 32; ++i) detail::add_slice_timings(shared, {{2e-8, 1e-5, true}}, detail::Clock::now());
  for (int i = 0; i < 32; ++i) detail::add_slice_timings(shared, {{5e-8, 1e-5, false}}, detail::Clock::now());
  EXPECT_DOUBLE_EQ(*shared.seconds_per_unit, 2e-8);  // behind's 10th percentile, below idle's
  // Once the queued-behind slices have aged out, idle-start ones are bounded again, from a base
  // that rises at most 4-fold each 30 s (the base 2e-8 aged too: it rises to the estimate then,
  // 5e-8), so work that did become dearer is followed within a minute or two.
  auto later = detail::Clock::now() + std::chrono::seconds(31);
  for (int i = 0; i < 32; ++i) detail::add_slice_timings(shared, {{1e-6, 1e-5, false}}, later);
  EXPECT_EQ(shared.queued_behind_rates.size(), 0u);
  EXPECT_DOUBLE_EQ(*shared.seconds_per_unit, detail::kMaxSlowdown * 5e-8);
  later += std::chrono::seconds(31);
  detail::add_slice_timings(shared, {{1e-6, 1e-5, false}}, later);
  EXPECT_DOUBLE_EQ(*shared.seconds_per_unit, detail::kMaxSlowdown * detail::kMaxSlowdown * 5e-8);
  later += std::chrono::seconds(31);
  detail::add_slice_timings(shared, {{1e-6, 1e-5, false}}, later);
  EXPECT_DOUBLE_EQ(*shared.seconds_per_unit, 1e-6);
  // A time per unit set by the caller is a base too.
  detail::KindModel told;
  detail::set_seconds_per_unit(told, 1e-9, detail::Clock::now());
  for (int i = 0; i < 32; ++i) detail::add_slice_timings(told, {{1e-6, 1e-5, false}}, detail::Clock::now());
  EXPECT_DOUBLE_EQ(*told.seconds_per_unit, detail::kMaxSlowdown * 1e-9);
}

TEST(SchedulerClasses, BestEffortNeverTakesTheLastLease) {
  auto f = make(leases(2));
  Lease first = f.scheduler->acquire(best_effort());
  EXPECT_FALSE(f.scheduler->try_acquire(best_effort()).has_value());
  try {
    AcquireRequest r = best_effort();
    r.timeout_s = 0.01;
    f.scheduler->acquire(r);
    FAIL() << "acquire should have timed out";
  } catch (const LeaseTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("best-effort lease limit"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(f.scheduler->try_acquire(request("normal")).has_value());
  EXPECT_GE(first.stream_slot(), 4);  // best-effort streams follow the high-priority ones
  // One lease per device: the best-effort lease may take it.
  auto g = make(leases(1));
  EXPECT_TRUE(g.scheduler->try_acquire(best_effort()).has_value());
}

TEST(SchedulerClasses, OtherClassesAreAdmittedAsIfBestEffortWorkWereNotThere) {
  auto f = make(leases(4));
  f.scheduler->register_kind("big", 1.0);
  Lease background = f.scheduler->acquire(best_effort("big"));
  auto urgent = f.scheduler->try_acquire(request("big", 1));
  ASSERT_TRUE(urgent.has_value());
  EXPECT_FALSE(f.scheduler->try_acquire(best_effort("big")).has_value());  // best-effort counts everything
  EXPECT_DOUBLE_EQ(f.scheduler->stats().devices[0].occupancy_in_use, 2.0);
}

TEST(SchedulerClasses, AdaptiveLimitFollowsScriptedUtilization) {
  SchedulerConfig c = leases(4);
  c.target_utilization = 0.5;
  c.utilization_interval_s = 3600.0;  // no background steps during the test; they are made here
  auto f = make(c);
  auto limit = [&] { return f.scheduler->stats().devices[0].lease_limit; };
  EXPECT_EQ(limit(), 4);
  f.scheduler->adapt_concurrency();  // no reading: unchanged
  EXPECT_EQ(limit(), 4);
  f.backend->set_utilization(0, 0.95);
  for (int expected : {3, 2, 1, 1}) {
    f.scheduler->adapt_concurrency();
    EXPECT_EQ(limit(), expected);
  }
  Lease one = f.scheduler->acquire(request("k"));
  EXPECT_FALSE(f.scheduler->try_acquire(request("k")).has_value());
  f.backend->set_utilization(0, 0.52);  // within the band: unchanged
  f.scheduler->adapt_concurrency();
  EXPECT_EQ(limit(), 1);
  // A waiter is granted as soon as the limit rises.
  std::thread waiter([&] { Lease l = f.scheduler->acquire(request("k")); });
  eventually([&] { return f.scheduler->stats().waiting == 1; }, "a waiter");
  f.backend->set_utilization(0, 0.1);
  f.scheduler->adapt_concurrency();
  waiter.join();
  for (int i = 0; i < 5; ++i) f.scheduler->adapt_concurrency();
  EXPECT_EQ(limit(), 4);
  // Without a target the limit never moves.
  auto g = make(leases(4));
  g.backend->set_utilization(0, 1.0);
  g.scheduler->adapt_concurrency();
  EXPECT_EQ(g.scheduler->stats().devices[0].lease_limit, 4);
}

TEST(SchedulerClasses, AdaptiveLimitRunsInTheBackground) {
  SchedulerConfig c = leases(4);
  c.target_utilization = 0.6;
  c.min_leases_per_device = 2;
  c.utilization_interval_s = 0.005;
  auto backend = std::make_shared<SimulatedBackend>(2);
  backend->set_utilization(0, 1.0);
  backend->set_utilization(1, 0.0);
  StreamScheduler s(c, backend);
  eventually([&] { return s.stats().devices[0].lease_limit == 2; }, "device 0's limit falls to the minimum");
  EXPECT_EQ(s.stats().devices[1].lease_limit, 4);
}

TEST(SchedulerClasses, LatencyCriticalWaitersThrottleEveryDeviceTheyMayGoTo) {
  SchedulerConfig c = leases(2);
  c.throttle = ThrottleMode::Waiting;
  c.best_effort_in_flight = 0;
  c.best_effort_max_pause_s = -1.0;
  auto f = make(c, 2);
  Lease be0 = f.scheduler->acquire(best_effort("be", 0));
  Lease be1 = f.scheduler->acquire(best_effort("be", 1));
  Lease n0 = f.scheduler->acquire(request("n", 0, std::nullopt, -1.0, 0));
  Lease n1 = f.scheduler->acquire(request("n", 0, std::nullopt, -1.0, 1));
  std::thread urgent([&] { Lease l = f.scheduler->acquire(request("urgent", 1)); });  // any device
  eventually([&] { return f.scheduler->stats().waiting == 1; }, "the latency-critical request waits");
  std::atomic<int> resumed{0};
  std::thread w0([&] { be0.checkpoint(); resumed.fetch_add(1); });
  std::thread w1([&] { be1.checkpoint(); resumed.fetch_add(1); });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(resumed.load(), 0);
  n1.release();  // granted on device 1: no longer waiting anywhere
  urgent.join();
  w0.join();
  w1.join();
  EXPECT_EQ(resumed.load(), 2);
}

TEST(SchedulerClasses, BestEffortStreamsOnAPartition) {
  SchedulerConfig c = leases(2);
  c.reserved_sms = 16;
  auto f = make(c);
  EXPECT_EQ(f.scheduler->stats().devices[0].partition_sms, 112);  // (132 - 16) in groups of 8
  Lease background = f.scheduler->acquire(best_effort());
  Lease normal = f.scheduler->acquire(request("n"));
  EXPECT_GE(background.stream_slot(), 4);
  EXPECT_NE(background.stream(), normal.stream());
  // Where partitions cannot be made, the scheduler says why.
  auto backend = std::make_shared<SimulatedBackend>(1);
  backend->set_partition_failure("green contexts need a newer driver");
  try {
    StreamScheduler s(c, backend);
    FAIL() << "the partition should have failed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("reserved_sms=16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("newer driver"), std::string::npos) << e.what();
  }
  SchedulerConfig too_many = leases(2);
  too_many.reserved_sms = 130;
  EXPECT_THROW(StreamScheduler(too_many, std::make_shared<SimulatedBackend>(1)), std::runtime_error);
}

TEST(SchedulerClasses, StatsAndTraceCarryTheClasses) {
  SchedulerConfig c = leases(2);
  c.latency_control = false;  // the fixed mechanisms alone
  c.record_timeline = true;
  c.best_effort_max_pause_s = 0.01;
  c.best_effort_in_flight = 0;
  auto f = make(c);
  {
    Lease background = f.scheduler->acquire(best_effort());
    Lease urgent = f.scheduler->acquire(request("urgent", 1, 5.0));
    background.checkpoint();  // paused 10 ms
  }
  EXPECT_THROW(f.scheduler->acquire(request("urgent", 1, -1.0)), DeadlineMissed);  // already past
  const SchedulerStats s = f.scheduler->stats();
  const ClassStats& high = of(s, WorkClass::LatencyCritical);
  EXPECT_EQ(high.granted, 1);
  ASSERT_TRUE(high.wait_p50_s.has_value() && high.hold_p99_s.has_value());
  EXPECT_GE(*high.hold_p99_s, *high.hold_p50_s);
  EXPECT_EQ(high.deadline_rejected, 1);
  EXPECT_FALSE(of(s, WorkClass::Normal).wait_p50_s.has_value());
  const std::string trace = f.scheduler->trace_json();
  for (const char* needle : {"\"classes\":{\"best_effort\":", "\"cat\":\"throttle\"", "\"cat\":\"deadline_miss\"",
                             "\"reason\":\"rejected\"", "\"class\":\"high\"", "\"deadline_us\":"}) {
    EXPECT_NE(trace.find(needle), std::string::npos) << needle << " missing from " << trace;
  }
}

TEST(SchedulerClasses, StressEveryClassWithDeadlinesAndCheckpoints) {
  SchedulerConfig c = leases(3);
  c.record_timeline = true;
  c.best_effort_max_pause_s = 0.002;
  auto f = make(c, 2);
  constexpr int kThreads = 24, kPerThread = 300;
  std::atomic<int> held[2] = {0, 0};
  std::atomic<int> over_limit{0};
  std::atomic<int64_t> work{0}, timeouts{0}, deadline_misses{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < kPerThread; ++i) {
        const int device = static_cast<int>(rng() % 3) - 1;
        AcquireRequest r = request(rng() % 2 ? "a" : "b", static_cast<int>(rng() % 3) - 1,
                                   rng() % 3 == 0 ? std::optional<double>(0.0005 * (rng() % 20)) : std::nullopt,
                                   rng() % 4 == 0 ? 0.0005 : 1.0, device);
        r.best_effort = rng() % 5 == 0;
        try {
          Lease l = f.scheduler->acquire(r);
          if (held[l.device()].fetch_add(1) + 1 > 3) over_limit.fetch_add(1);
          work.fetch_add(1);
          for (int k = 0; k < 3; ++k) l.checkpoint(1.0);
          if (rng() % 8 == 0) std::this_thread::sleep_for(20us);
          held[l.device()].fetch_sub(1);
        } catch (const DeadlineMissed&) {
          deadline_misses.fetch_add(1);
        } catch (const LeaseTimeout&) {
          timeouts.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const SchedulerStats s = f.scheduler->stats();
  EXPECT_EQ(over_limit.load(), 0);
  EXPECT_EQ(s.granted, work.load());
  EXPECT_EQ(s.released, s.granted);
  EXPECT_EQ(s.timeouts, timeouts.load());
  int64_t rejected_or_expired = 0, granted_by_class = 0, released_by_class = 0;
  for (const ClassStats& cs : s.classes) {
    rejected_or_expired += cs.deadline_rejected + cs.deadline_expired;
    granted_by_class += cs.granted;
    released_by_class += cs.released;
  }
  EXPECT_EQ(rejected_or_expired, deadline_misses.load());
  EXPECT_EQ(granted_by_class, s.granted);
  EXPECT_EQ(released_by_class, s.released);
  EXPECT_EQ(s.granted + s.timeouts + rejected_or_expired, kThreads * kPerThread);
  EXPECT_EQ(s.waiting, 0);
  for (const DeviceStats& d : s.devices) {
    EXPECT_EQ(d.active_leases, 0);
    EXPECT_EQ(d.best_effort_leases, 0);
    EXPECT_EQ(d.latency_critical_leases, 0);
    EXPECT_LE(d.peak_leases, 3);
    EXPECT_EQ(d.occupancy_in_use, 0.0);
  }
  EXPECT_EQ(f.scheduler->trace_json().back(), '}');
}

}  // namespace

TEST(SchedulerClasses, BestEffortLeasesReuseTheStreamUsedLast) {
  // One best-effort producer's consecutive leases queue on one stream (as on a plain stream);
  // the other classes rotate through their pool. Concurrent holders still get their own.
  auto f = make(leases(4));
  StreamHandle first = nullptr;
  for (int i = 0; i < 5; ++i) {
    Lease l = f.scheduler->acquire(best_effort());
    if (i == 0) first = l.stream();
    EXPECT_EQ(l.stream(), first) << "lease " << i;
  }
  {
    Lease a = f.scheduler->acquire(best_effort());
    Lease b = f.scheduler->acquire(best_effort());
    EXPECT_EQ(a.stream(), first);
    EXPECT_NE(b.stream(), a.stream());
  }
  std::set<StreamHandle> normal;
  for (int i = 0; i < 4; ++i) normal.insert(f.scheduler->acquire(request("k")).stream());
  EXPECT_EQ(normal.size(), 4u);
}

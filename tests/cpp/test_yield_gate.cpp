// The scheduler's side of device yield on the simulated backend (its gates are host memory,
// written at once): which leases close which word of the gate and when they open it, which
// streams octopus's kernels find registered, and where the ladder turns it on. The kernels'
// side (claiming units, stopping, continuing) runs on CUDA: tests/python/test_device_yield.py.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "octopus/scheduler/latency_controller.h"
#include "octopus/scheduler/simulated_backend.h"
#include "octopus/scheduler/stream_scheduler.h"
#include "octopus/scheduler/yield_gate.h"

namespace {

using namespace octopus::scheduler;

struct Fixture {
  std::shared_ptr<SimulatedBackend> backend;
  std::unique_ptr<StreamScheduler> scheduler;
};

// A scheduler with 3 leases of each class per device, best-effort yield pinned (or not).
Fixture make(std::optional<bool> device_yield, std::optional<int> reserved_sms = std::nullopt) {
  SchedulerConfig c;
  c.max_leases_per_device = 3;
  c.latency_control = false;
  c.device_yield = device_yield;
  c.reserved_sms = reserved_sms;
  c.best_effort_max_pause_s = 0.125;
  auto backend = std::make_shared<SimulatedBackend>(1);
  return {backend, std::make_unique<StreamScheduler>(std::move(c), backend)};
}

AcquireRequest request(int priority, bool best_effort = false) {
  AcquireRequest r;
  r.kind = priority > 0 ? "lc" : (best_effort ? "be" : "normal");
  r.priority = priority;
  r.best_effort = best_effort;
  return r;
}

TEST(YieldGate, ALatencyCriticalLeaseClosesItsSlotsWordOnItsStreamAndOpensItOnRelease) {
  Fixture f = make(true);
  Lease be = f.scheduler->acquire(request(0, true));
  const std::shared_ptr<YieldGateState> gate = yielding_gate(be.stream());
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->gate.count, 3);
  EXPECT_DOUBLE_EQ(gate->max_wait_s.load(), kMinGateWaitS);  // no latency-critical hold seen yet
  const uint32_t* words = gate->gate.words;

  Lease lc = f.scheduler->acquire(request(1));
  const int word = lc.stream_slot() - 3;  // high-priority slots follow the 3 normal ones
  ASSERT_GE(word, 0);
  ASSERT_LT(word, 3);
  std::vector<SimulatedBackend::GateWrite> writes = f.backend->gate_writes();
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].stream, lc.stream());
  EXPECT_EQ(writes[0].word, words + word);
  EXPECT_EQ(writes[0].value, kYieldAll);
  EXPECT_EQ(words[word], kYieldAll);

  const StreamHandle stream = lc.stream();
  lc.release();
  writes = f.backend->gate_writes();
  ASSERT_EQ(writes.size(), 2u);
  EXPECT_EQ(writes[1].stream, stream);  // in stream order, after the lease's work
  EXPECT_EQ(writes[1].word, words + word);
  EXPECT_EQ(writes[1].value, 0u);
  EXPECT_EQ(words[word], 0u);
  EXPECT_EQ(f.scheduler->stats().devices[0].gate_closes, 1);
  EXPECT_TRUE(f.scheduler->stats().devices[0].yield_gate);
}

TEST(YieldGate, TheWaitBoundFollowsTheRecentLatencyCriticalHoldsWithinItsLimits) {
  double recent = 0.0;
  EXPECT_DOUBLE_EQ(gate_wait_after_hold(1e-4, recent, 0.25), kMinGateWaitS);  // short holds: the floor
  EXPECT_DOUBLE_EQ(gate_wait_after_hold(3e-3, recent, 0.25), kGateWaitHolds * 3e-3);
  EXPECT_DOUBLE_EQ(gate_wait_after_hold(1.0, recent, 0.25), kMaxGateWaitS);  // capped
  EXPECT_DOUBLE_EQ(gate_wait_after_hold(1e-3, recent, 4e-3), 4e-3);  // never past the longest pause
  EXPECT_DOUBLE_EQ(gate_wait_after_hold(1e-3, recent, 1e-4), kMinGateWaitS);  // nor under the floor
  // A long hold is forgotten as short ones follow it.
  double after = 0.0;
  for (int i = 0; i < 2000; ++i) after = gate_wait_after_hold(1e-4, recent, -1.0);
  EXPECT_DOUBLE_EQ(after, kMinGateWaitS);
}

TEST(YieldGate, ReturnedLatencyCriticalLeasesSetTheDevicesWaitBound) {
  Fixture f = make(true);
  Lease be = f.scheduler->acquire(request(0, true));
  const std::shared_ptr<YieldGateState> gate = yielding_gate(be.stream());
  ASSERT_NE(gate, nullptr);
  {
    Lease lc = f.scheduler->acquire(request(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  const double after_hold = gate->max_wait_s.load();
  EXPECT_GE(after_hold, kGateWaitHolds * 3e-3);
  EXPECT_LE(after_hold, kMaxGateWaitS);
  { Lease normal = f.scheduler->acquire(request(0)); }  // other classes leave it
  EXPECT_DOUBLE_EQ(gate->max_wait_s.load(), after_hold);
}

TEST(YieldGate, EachLatencyCriticalLeaseHasItsOwnWord) {
  Fixture f = make(true);
  Lease a = f.scheduler->acquire(request(1));
  Lease b = f.scheduler->acquire(request(2));
  const std::vector<SimulatedBackend::GateWrite> writes = f.backend->gate_writes();
  ASSERT_EQ(writes.size(), 2u);
  EXPECT_NE(writes[0].word, writes[1].word);
  a.release();
  EXPECT_EQ(*writes[0].word, 0u);
  EXPECT_EQ(*writes[1].word, kYieldAll);  // b still holds the gate closed
  b.release();
  EXPECT_EQ(*writes[1].word, 0u);
}

TEST(YieldGate, OtherClassesNeverWriteIt) {
  Fixture f = make(true);
  { Lease n = f.scheduler->acquire(request(0)); }
  { Lease be = f.scheduler->acquire(request(0, true)); }
  { std::optional<Lease> be = f.scheduler->try_acquire(request(-1)); }
  EXPECT_TRUE(f.backend->gate_writes().empty());
  { std::optional<Lease> lc = f.scheduler->try_acquire(request(1)); }  // try_acquire closes it too
  EXPECT_EQ(f.backend->gate_writes().size(), 2u);
}

TEST(YieldGate, TheSimulatedBackendKeepsOnlyTheRecentWrites) {
  Fixture f = make(true);
  const std::size_t leases = SimulatedBackend::kGateWritesKept;  // two writes each
  for (std::size_t i = 0; i < leases; ++i) Lease lc = f.scheduler->acquire(request(1));
  const std::vector<SimulatedBackend::GateWrite> writes = f.backend->gate_writes();
  ASSERT_EQ(writes.size(), SimulatedBackend::kGateWritesKept);
  EXPECT_EQ(writes.back().value, 0u);  // the last lease's release
  EXPECT_EQ(f.scheduler->stats().devices[0].gate_closes, static_cast<int64_t>(leases));
}

TEST(YieldGate, NothingIsWrittenOrFoundWhereBestEffortWorkDoesNotYield) {
  for (const std::optional<bool> setting : {std::optional<bool>(false), std::optional<bool>()}) {
    Fixture f = make(setting);  // without latency control, unset means off
    Lease be = f.scheduler->acquire(request(0, true));
    EXPECT_EQ(yielding_gate(be.stream()), nullptr);
    { Lease lc = f.scheduler->acquire(request(1)); }
    EXPECT_TRUE(f.backend->gate_writes().empty());
    EXPECT_EQ(f.scheduler->stats().devices[0].gate_closes, 0);
  }
}

TEST(YieldGate, OnlyBestEffortStreamsAreFoundAndOnlyWhileTheSchedulerLives) {
  Fixture f = make(true);
  StreamHandle be_stream = nullptr;
  {
    Lease lc = f.scheduler->acquire(request(1));
    Lease normal = f.scheduler->acquire(request(0));
    Lease be = f.scheduler->acquire(request(0, true));
    EXPECT_EQ(yielding_gate(lc.stream()), nullptr);
    EXPECT_EQ(yielding_gate(normal.stream()), nullptr);
    EXPECT_NE(yielding_gate(be.stream()), nullptr);
    be_stream = be.stream();
  }
  f.scheduler.reset();
  EXPECT_EQ(yielding_gate(be_stream), nullptr);
}

TEST(YieldGate, PartitionStreamsAreRegisteredToo) {
  Fixture f = make(true, 16);
  Lease be = f.scheduler->acquire(request(0, true));
  ASSERT_GT(f.scheduler->stats().devices[0].partition_sms, 0);  // the lease's stream is the partition's
  EXPECT_NE(yielding_gate(be.stream()), nullptr);
}

TEST(YieldGate, TheDefaultLadderYieldsOnEveryStepButTheFirst) {
  for (const std::vector<int>& reserves : {std::vector<int>{8, 16, 24, 32}, std::vector<int>{}}) {
    const std::vector<ControlStep> ladder = default_ladder(132, reserves);
    ASSERT_GE(ladder.size(), 2u);
    EXPECT_FALSE(ladder.front().device_yield);
    for (std::size_t i = 1; i < ladder.size(); ++i) EXPECT_TRUE(ladder[i].device_yield) << "step " << i;
  }
}

TEST(YieldGate, AtTheControllersFirstStepLatencyCriticalLeasesLeaveItOpen) {
  SchedulerConfig c;
  c.max_leases_per_device = 2;
  auto backend = std::make_shared<SimulatedBackend>(1);
  StreamScheduler scheduler(std::move(c), backend);
  ASSERT_EQ(scheduler.stats().devices[0].control.step, 0);
  { Lease lc = scheduler.acquire(request(1)); }
  EXPECT_TRUE(backend->gate_writes().empty());
  Lease be = scheduler.acquire(request(0, true));
  EXPECT_EQ(yielding_gate(be.stream()), nullptr);  // registered, not yielding at step 0
}

}  // namespace

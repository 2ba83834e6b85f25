// The StreamScheduler's policy on the simulated backend: capacity limits, priority and
// FIFO order, timeouts, device choice, release events, counters and the trace.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "octopus/scheduler/simulated_backend.h"
#include "octopus/scheduler/stream_scheduler.h"

namespace {

using namespace octopus::scheduler;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kGiB = std::size_t{1} << 30;

struct Fixture {
  std::shared_ptr<SimulatedBackend> backend;
  std::unique_ptr<StreamScheduler> scheduler;
};

Fixture make(SchedulerConfig config, int devices = 1) {
  auto backend = std::make_shared<SimulatedBackend>(devices, 80 * kGiB);
  return {backend, std::make_unique<StreamScheduler>(std::move(config), backend)};
}

SchedulerConfig leases(int n) {
  SchedulerConfig c;
  c.max_leases_per_device = n;
  return c;
}

AcquireRequest request(const std::string& kind = "k", int priority = 0, double timeout = -1.0, int device = -1) {
  AcquireRequest r;
  r.kind = kind;
  r.priority = priority;
  r.timeout_s = timeout;
  r.device = device;
  return r;
}

// Waits until `n` callers are blocked in acquire.
void wait_for_waiting(const StreamScheduler& s, int64_t n) {
  const auto give_up = Clock::now() + 5s;
  while (s.stats().waiting < n) {
    ASSERT_LT(Clock::now(), give_up) << "callers never started waiting";
    std::this_thread::sleep_for(1ms);
  }
}

TEST(StreamScheduler, GrantsUpToTheLeaseLimit) {
  auto f = make(leases(3));
  Lease a = f.scheduler->acquire(request());
  Lease b = f.scheduler->acquire(request());
  Lease c = f.scheduler->acquire(request());
  EXPECT_FALSE(f.scheduler->try_acquire(request()).has_value());
  // Three distinct normal-priority streams.
  EXPECT_NE(a.stream(), b.stream());
  EXPECT_NE(b.stream(), c.stream());
  EXPECT_NE(a.stream(), c.stream());
  b.release();
  EXPECT_TRUE(f.scheduler->try_acquire(request()).has_value());
  const SchedulerStats s = f.scheduler->stats();
  EXPECT_EQ(s.granted, 4);
  EXPECT_EQ(s.rejected, 1);
  EXPECT_EQ(s.devices[0].peak_leases, 3);
}

TEST(StreamScheduler, BeforeBlockingIsCalledOnlyWhereTheRequestWaits) {
  // Python's binding releases the GIL in before_blocking: a lease granted at once keeps it.
  auto f = make(leases(1));
  std::atomic<int> calls{0};
  const auto count = [&] { calls += 1; };
  Lease first = f.scheduler->acquire(request(), count);
  EXPECT_EQ(calls, 0) << "granted at once: nothing to wait for";
  std::atomic<bool> granted{false};
  std::atomic<int> calls_before_grant{-1};
  std::thread waiter([&] {
    Lease second = f.scheduler->acquire(request(), [&] {
      calls += 1;
      calls_before_grant.store(granted.load() ? 1 : 0);
    });
    granted.store(true);
  });
  for (int i = 0; i < 500 && calls.load() == 0; ++i) std::this_thread::sleep_for(10ms);  // the waiter blocks
  std::this_thread::sleep_for(20ms);  // and stays blocked
  EXPECT_FALSE(granted.load());
  EXPECT_EQ(calls, 1) << "called once, before the wait";
  EXPECT_EQ(calls_before_grant.load(), 0);
  first.release();
  waiter.join();
  EXPECT_TRUE(granted.load());
  EXPECT_EQ(calls, 1);
  // Several devices: called before sampling their utilization, once.
  auto g = make(leases(2), 2);
  calls = 0;
  Lease on_two = g.scheduler->acquire(request(), count);
  EXPECT_EQ(calls, 1);
}

TEST(StreamScheduler, HighPriorityLeasesGetHighPriorityStreams) {
  auto f = make(leases(2));
  Lease normal = f.scheduler->acquire(request("k", 0));
  Lease high = f.scheduler->acquire(request("k", 5));
  EXPECT_LT(normal.stream_slot(), 2);
  EXPECT_GE(high.stream_slot(), 2);
  EXPECT_LT(high.stream_slot(), 4);
  // The lease limit counts both kinds together.
  EXPECT_FALSE(f.scheduler->try_acquire(request("k", 5)).has_value());
}

TEST(StreamScheduler, TimeoutNamesTheLeaseLimitAndKeepsTime) {
  auto f = make(leases(1));
  Lease held = f.scheduler->acquire(request());
  const auto start = Clock::now();
  try {
    f.scheduler->acquire(request("resize", 0, 0.1));
    FAIL() << "acquire should have timed out";
  } catch (const LeaseTimeout& e) {
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_GE(waited, 0.1);
    // Room for a loaded machine, where a thread may wait for a core for a good fraction of a
    // second; still catches a timeout ignored or read in other units.
    EXPECT_LT(waited, 0.1 + 2.0);
    EXPECT_NE(std::string(e.what()).find("lease limit"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("resize"), std::string::npos) << e.what();
  }
  const SchedulerStats s = f.scheduler->stats();
  EXPECT_EQ(s.timeouts, 1);
  EXPECT_EQ(s.waiting, 0);
}

TEST(StreamScheduler, ServesByPriorityThenArrival) {
  auto f = make(leases(1));
  Lease held = f.scheduler->acquire(request());
  const std::vector<int> priorities{0, 1, 0, 2, 1, 0, -1, 2};
  std::mutex order_mutex;
  std::vector<int> order;
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < priorities.size(); ++i) {
    threads.emplace_back([&, i] {
      Lease l = f.scheduler->acquire(request("k", priorities[i]));
      std::lock_guard<std::mutex> lock(order_mutex);
      order.push_back(static_cast<int>(i));
    });
    wait_for_waiting(*f.scheduler, static_cast<int64_t>(i) + 1);
  }
  held.release();
  for (auto& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{3, 7, 1, 4, 0, 2, 5, 6}));
}

TEST(StreamScheduler, TryAcquireDoesNotOvertakeAWaiter) {
  auto f = make(leases(1));
  Lease held = f.scheduler->acquire(request());
  std::promise<void> checked;
  std::thread waiter([&] {
    Lease l = f.scheduler->acquire(request());
    checked.get_future().wait();  // held until the check below, however late this thread runs
  });
  wait_for_waiting(*f.scheduler, 1);
  held.release();  // handed straight to the waiter
  EXPECT_FALSE(f.scheduler->try_acquire(request()).has_value());
  checked.set_value();
  waiter.join();
  EXPECT_TRUE(f.scheduler->try_acquire(request()).has_value());
}

TEST(StreamScheduler, AWaiterDoesNotBlockOtherDevices) {
  auto f = make(leases(1), 2);
  Lease on0 = f.scheduler->acquire(request("k", 0, -1, 0));
  std::thread waiter([&] { Lease l = f.scheduler->acquire(request("k", 0, -1, 0)); });
  wait_for_waiting(*f.scheduler, 1);
  auto on1 = f.scheduler->try_acquire(request("k", 0, -1, 1));
  EXPECT_TRUE(on1.has_value());
  on0.release();
  waiter.join();
}

TEST(StreamScheduler, OccupancyLimit) {
  SchedulerConfig c = leases(8);
  c.max_occupancy = 1.0;
  auto f = make(c);
  f.scheduler->register_kind("big", 0.6);
  f.scheduler->register_kind("small", 0.3);
  Lease big = f.scheduler->acquire(request("big"));
  EXPECT_DOUBLE_EQ(big.occupancy(), 0.6);
  EXPECT_FALSE(f.scheduler->try_acquire(request("big")).has_value());
  Lease small = f.scheduler->acquire(request("small"));
  try {
    f.scheduler->acquire(request("small", 0, 0.02));
    FAIL() << "acquire should have timed out";
  } catch (const LeaseTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("occupancy limit"), std::string::npos) << e.what();
  }
  EXPECT_NEAR(f.scheduler->stats().devices[0].occupancy_in_use, 0.9, 1e-12);
  big.release();
  small.release();
  EXPECT_EQ(f.scheduler->stats().devices[0].occupancy_in_use, 0.0);
  // An idle device takes a lease larger than the limit rather than never granting it.
  SchedulerConfig tight = leases(8);
  tight.max_occupancy = 0.5;
  auto g = make(tight);
  g.scheduler->register_kind("big", 0.8);
  EXPECT_TRUE(g.scheduler->try_acquire(request("big")).has_value());
}

TEST(StreamScheduler, KernelProfileEstimate) {
  auto f = make(leases(4));  // the simulation has 132 multiprocessors
  f.scheduler->register_kernel("kern", KernelProfile{4, 1000});
  EXPECT_DOUBLE_EQ(f.scheduler->estimate_occupancy("kern", {264, 1000}, 0), 0.5);   // 264 of 528 blocks
  EXPECT_DOUBLE_EQ(f.scheduler->estimate_occupancy("kern", {1, 1}, 0), 1.0 / 528);  // one block
  EXPECT_DOUBLE_EQ(f.scheduler->estimate_occupancy("kern", {100000000}, 0), 1.0);   // capped
  EXPECT_DOUBLE_EQ(f.scheduler->estimate_occupancy("kern", {}, 0), 1.0);            // size unknown
  EXPECT_DOUBLE_EQ(f.scheduler->estimate_occupancy("unknown", {5}, 0), 0.0);        // default_occupancy
  EXPECT_THROW(f.scheduler->register_kernel("bad", KernelProfile{0, 1}), std::invalid_argument);
  EXPECT_THROW(f.scheduler->register_kind("bad", 1.5), std::invalid_argument);
}

TEST(StreamScheduler, MemoryReserve) {
  SchedulerConfig c = leases(4);
  c.memory_reserve = 0.1;  // 8 GiB of the simulated 80 GiB
  c.memory_poll_interval_s = 0.001;
  auto f = make(c);
  f.backend->set_free_memory(0, 4 * kGiB);
  std::this_thread::sleep_for(2ms);
  EXPECT_FALSE(f.scheduler->try_acquire(request()).has_value());
  try {
    f.scheduler->acquire(request("k", 0, 0.02));
    FAIL() << "acquire should have timed out";
  } catch (const LeaseTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("free-memory reserve"), std::string::npos) << e.what();
  }
  // Memory freed elsewhere is noticed by polling, without any lease coming back.
  std::thread freer([&] { std::this_thread::sleep_for(30ms); f.backend->set_free_memory(0, 40 * kGiB); });
  Lease a = f.scheduler->acquire(request("k", 0, 60.0));  // returns once the memory is freed
  freer.join();
  // Bytes a lease declares are held against the reserve until it is returned.
  AcquireRequest big = request("k", 0, 0.02);
  big.bytes = 30 * kGiB;
  Lease b = f.scheduler->acquire(big);
  EXPECT_THROW(f.scheduler->acquire(big), LeaseTimeout);
  b.release();
  EXPECT_NO_THROW(f.scheduler->acquire(big));
}

TEST(StreamScheduler, AnyDeviceGoesToTheLeastLoaded) {
  SchedulerConfig config = leases(4);
  config.utilization_interval_s = 1e-9;  // every acquire samples utilization afresh
  auto f = make(config, 3);
  Lease a = f.scheduler->acquire(request("k", 0, -1, 0));
  Lease b = f.scheduler->acquire(request("k", 0, -1, 1));
  Lease c = f.scheduler->acquire(request());
  EXPECT_EQ(c.device(), 2);
  Lease d = f.scheduler->acquire(request("k", 0, -1, 2));
  b.release();
  Lease e = f.scheduler->acquire(request());
  EXPECT_EQ(e.device(), 1);
  // Equal load: NVML's utilization decides.
  f.backend->set_utilization(0, 0.9);
  f.backend->set_utilization(1, 0.1);
  f.backend->set_utilization(2, 0.5);
  Lease g = f.scheduler->acquire(request());
  EXPECT_EQ(g.device(), 1);
  EXPECT_THROW(f.scheduler->acquire(request("k", 0, -1, 7)), std::invalid_argument);
}

TEST(StreamScheduler, ReleaseRecordsAnEventThePreviousLeaseCanBeWaitedOn) {
  auto f = make(leases(1));
  Lease a = f.scheduler->acquire(request());
  EXPECT_EQ(a.previous_release(), nullptr);
  const StreamHandle stream = a.stream();
  std::shared_ptr<ReleaseEvent> event = a.release();
  ASSERT_NE(event, nullptr);
  EXPECT_EQ(a.release(), nullptr);  // a second release does nothing
  EXPECT_FALSE(a.active());
  EXPECT_EQ(f.backend->events_recorded(), 1);
  Lease b = f.scheduler->acquire(request());
  EXPECT_EQ(b.stream(), stream);
  EXPECT_EQ(b.previous_release(), event);
  EXPECT_TRUE(event->done());
}

TEST(StreamScheduler, MovedLeasesReleaseOnce) {
  auto f = make(leases(2));
  Lease a = f.scheduler->acquire(request());
  Lease b = std::move(a);
  EXPECT_FALSE(a.active());
  EXPECT_TRUE(b.active());
  Lease c = f.scheduler->acquire(request());
  c = std::move(b);  // c's own lease goes back
  EXPECT_EQ(f.scheduler->stats().devices[0].active_leases, 1);
  c.release();
  EXPECT_EQ(f.scheduler->stats().released, 2);
}

TEST(StreamScheduler, CountersBalanceUnderContention) {
  SchedulerConfig c = leases(3);
  c.record_timeline = true;
  auto f = make(c, 2);
  std::atomic<int> held[2] = {0, 0};
  std::atomic<int> over_limit{0};
  std::atomic<int64_t> work{0};
  std::atomic<int64_t> timeouts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < 1000; ++i) {
        const int device = static_cast<int>(rng() % 3) - 1;
        try {
          Lease l = f.scheduler->acquire(request("k", static_cast<int>(rng() % 3), (rng() % 4 == 0) ? 0.0005 : 1.0, device));
          if (held[l.device()].fetch_add(1) + 1 > 3) over_limit.fetch_add(1);
          work.fetch_add(1);
          if (rng() % 8 == 0) std::this_thread::sleep_for(20us);
          held[l.device()].fetch_sub(1);
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
  EXPECT_EQ(s.granted + s.timeouts, 16000);
  EXPECT_EQ(s.waiting, 0);
  for (const DeviceStats& d : s.devices) {
    EXPECT_EQ(d.active_leases, 0);
    EXPECT_LE(d.peak_leases, 3);
  }
  const std::string trace = f.scheduler->trace_json();
  EXPECT_EQ(trace.rfind("{\"displayTimeUnit\":\"ms\"", 0), 0u);
  EXPECT_NE(trace.find("\"cat\":\"lease\""), std::string::npos);
  EXPECT_EQ(trace.back(), '}');
}

TEST(StreamScheduler, RejectsBadConfiguration) {
  auto backend = std::make_shared<SimulatedBackend>(2);
  auto with = [&](auto edit) {
    SchedulerConfig c;
    edit(c);
    return StreamScheduler(c, backend);
  };
  EXPECT_THROW(with([](SchedulerConfig& c) { c.max_leases_per_device = 0; }), std::invalid_argument);
  EXPECT_THROW(with([](SchedulerConfig& c) { c.max_occupancy = 0.0; }), std::invalid_argument);
  EXPECT_THROW(with([](SchedulerConfig& c) { c.memory_reserve = 1.0; }), std::invalid_argument);
  EXPECT_THROW(with([](SchedulerConfig& c) { c.devices = {0, 2}; }), std::invalid_argument);
  EXPECT_THROW(with([](SchedulerConfig& c) { c.devices = {1, 1}; }), std::invalid_argument);
  EXPECT_THROW(SimulatedBackend(0), std::invalid_argument);
}

}  // namespace

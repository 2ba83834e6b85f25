// The StreamScheduler on the CUDA backend: real streams of the right priority, release
// events that complete, a device clock that stamps them, memory figures, the best-effort
// in-flight bound on a real stream, and best-effort streams on a green-context SM
// partition. Skips where no CUDA device is present.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "octopus/scheduler/cuda_backend.h"
#include "octopus/scheduler/device_clock.h"
#include "octopus/scheduler/stream_scheduler.h"
#include "octopus/scheduler/yield_gate.h"

namespace {

using namespace octopus::scheduler;

std::shared_ptr<CudaBackend> backend_or_skip() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return nullptr;
  }
  return std::make_shared<CudaBackend>();
}

TEST(StreamSchedulerCuda, StreamsHaveTheirPriority) {
  auto backend = backend_or_skip();
  if (!backend) GTEST_SKIP() << "no CUDA device";
  SchedulerConfig c;
  c.max_leases_per_device = 2;
  c.devices = {0};
  StreamScheduler s(c, backend);
  AcquireRequest normal;
  AcquireRequest high;
  high.priority = 1;
  Lease a = s.acquire(normal);
  Lease b = s.acquire(high);
  int pa = 0, pb = 0;
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(a.stream()), &pa), cudaSuccess);
  ASSERT_EQ(cudaStreamGetPriority(static_cast<cudaStream_t>(b.stream()), &pb), cudaSuccess);
  EXPECT_LT(pb, pa);  // numerically lower is more urgent
  unsigned int flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(static_cast<cudaStream_t>(a.stream()), &flags), cudaSuccess);
  EXPECT_EQ(flags & cudaStreamNonBlocking, cudaStreamNonBlocking);
}

TEST(StreamSchedulerCuda, ReleaseEventCompletesAfterTheLeasesWork) {
  auto backend = backend_or_skip();
  if (!backend) GTEST_SKIP() << "no CUDA device";
  SchedulerConfig c;
  c.devices = {0};
  c.memory_reserve = 0.01;
  StreamScheduler s(c, backend);
  Lease a = s.acquire(AcquireRequest{});
  void* device_buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&device_buffer, 64 << 20), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(device_buffer, 1, 64 << 20, static_cast<cudaStream_t>(a.stream())), cudaSuccess);
  std::shared_ptr<ReleaseEvent> event = a.release();
  ASSERT_NE(event, nullptr);
  event->synchronize();
  EXPECT_TRUE(event->done());
  Lease b = s.acquire(AcquireRequest{});
  event->wait(b.stream());
  EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(b.stream())), cudaSuccess);
  cudaFree(device_buffer);
  const SchedulerStats stats = s.stats();
  EXPECT_GT(stats.devices[0].total_bytes, 0u);
  EXPECT_GT(stats.devices[0].free_bytes, 0u);
}

TEST(StreamSchedulerCuda, CheckpointLeavesNoEarlierSliceUnfinished) {
  auto backend = backend_or_skip();
  if (!backend) GTEST_SKIP() << "no CUDA device";
  SchedulerConfig c;
  c.devices = {0};
  c.best_effort_in_flight = 1;
  StreamScheduler s(c, backend);
  AcquireRequest r;
  r.best_effort = true;
  Lease lease = s.acquire(r);
  const auto stream = static_cast<cudaStream_t>(lease.stream());
  void* buffer = nullptr;
  const std::size_t bytes = std::size_t{1} << 30;
  ASSERT_EQ(cudaMalloc(&buffer, bytes), cudaSuccess);
  cudaEvent_t before = nullptr;  // after the slice launched before the checkpoint
  ASSERT_EQ(cudaEventCreateWithFlags(&before, cudaEventDisableTiming), cudaSuccess);
  for (int slice = 0; slice < 4; ++slice) {
    lease.checkpoint(1.0);
    if (slice > 0) {
      EXPECT_EQ(cudaEventQuery(before), cudaSuccess) << "a slice launched before the checkpoint is unfinished";
    }
    ASSERT_EQ(cudaMemsetAsync(buffer, slice, bytes, stream), cudaSuccess);  // a slice of ~0.5 ms
    ASSERT_EQ(cudaEventRecord(before, stream), cudaSuccess);
  }
  lease.checkpoint(1.0);
  EXPECT_EQ(cudaEventQuery(before), cudaSuccess);
  lease.release()->synchronize();
  cudaEventDestroy(before);
  cudaFree(buffer);
}

TEST(StreamSchedulerCuda, BestEffortStreamsOnAGreenContextPartition) {
  auto backend = backend_or_skip();
  if (!backend) GTEST_SKIP() << "no CUDA device";
  int driver = 0;
  ASSERT_EQ(cudaDriverGetVersion(&driver), cudaSuccess);
  SchedulerConfig c;
  c.devices = {0};
  c.max_leases_per_device = 2;
  c.reserved_sms = 16;
  if (driver < 12050) {
    try {
      StreamScheduler s(c, backend);
      FAIL() << "a partition was made on a driver without green-context streams";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("driver or newer"), std::string::npos) << e.what();
      GTEST_SKIP() << e.what();
    }
  }
  StreamScheduler s(c, backend);  // must work on a CUDA 12.5+ driver
  int total = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&total, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int sms = s.stats().devices[0].partition_sms;
  EXPECT_GT(sms, 0);
  EXPECT_LE(sms, total - 16);
  AcquireRequest r;
  r.best_effort = true;
  Lease background = s.acquire(r);
  Lease normal = s.acquire(AcquireRequest{});
  // The best-effort stream belongs to a green context; the normal one does not.
  void* get_green = nullptr;
  cudaDriverEntryPointQueryResult found{};
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuStreamGetGreenCtx", &get_green, 12040, cudaEnableDefault, &found),
            cudaSuccess);
  ASSERT_EQ(found, cudaDriverEntryPointSuccess);
  auto stream_green_context = reinterpret_cast<PFN_cuStreamGetGreenCtx_v12040>(get_green);
  CUgreenCtx green = nullptr;
  ASSERT_EQ(stream_green_context(static_cast<CUstream>(background.stream()), &green), CUDA_SUCCESS);
  EXPECT_NE(green, nullptr);
  CUgreenCtx none = nullptr;
  ASSERT_EQ(stream_green_context(static_cast<CUstream>(normal.stream()), &none), CUDA_SUCCESS);
  EXPECT_EQ(none, nullptr);
  // Work runs on it and its release event completes.
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 1 << 24), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(buffer, 7, 1 << 24, static_cast<cudaStream_t>(background.stream())), cudaSuccess);
  background.release()->synchronize();
  unsigned char host = 0;
  ASSERT_EQ(cudaMemcpy(&host, static_cast<unsigned char*>(buffer) + 12345, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, 7);
  cudaFree(buffer);
}

}  // namespace

// A yield gate given back goes to the next scheduler of its size only once the writes queued
// on its writers have run (one still queued could open a word the next one closed), zeroed.
TEST(StreamSchedulerCuda, AGateGivenBackIsHandedOutAgainOnceItsWritesHaveRun) {
  auto backend = backend_or_skip();
  if (!backend) GTEST_SKIP() << "no CUDA device";
  constexpr int kWords = 7;  // a size no other test's scheduler uses: the pool is the process's
  uint32_t* gate = backend->create_gate(0, kWords);
  if (gate == nullptr) GTEST_SKIP() << "no cuStreamWriteValue32: no yield gate";
  const StreamHandle writer = backend->create_stream(0, true);
  // A write still queued holds the gate back: the writer waits on a host callback until told
  // (static: the callback may outlive a failed assertion's early return).
  static std::atomic<bool> go{false};
  go.store(false);
  struct Go {
    ~Go() { go.store(true); }
  } release_the_writer_at_exit;
  ASSERT_EQ(cudaLaunchHostFunc(
                static_cast<cudaStream_t>(writer),
                [](void*) {
                  while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                },
                nullptr),
            cudaSuccess);
  backend->write_gate(0, writer, gate + 1, 0);
  backend->write_gate(0, writer, gate + 1, kYieldAll);  // left closed: the reuse must zero it
  backend->return_gate(0, gate, kWords, {writer});
  uint32_t* other = backend->create_gate(0, kWords);
  EXPECT_NE(other, gate);
  go.store(true);
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(writer)), cudaSuccess);
  EXPECT_NE(backend->create_gate(0, kWords + 1), gate);  // another size never takes it
  EXPECT_EQ(backend->create_gate(0, kWords), gate);
  uint32_t words[kWords];
  ASSERT_EQ(cudaMemcpy(words, gate, sizeof(words), cudaMemcpyDeviceToHost), cudaSuccess);
  for (const uint32_t w : words) EXPECT_EQ(w, 0u);
  // A scheduler takes a gate given back, and gives it back when it and its last lease are gone.
  backend->return_gate(0, other, kWords, {});
  SchedulerConfig c;
  c.devices = {0};
  c.max_leases_per_device = kWords;
  std::optional<StreamScheduler> s(std::in_place, c, backend);
  EXPECT_NE(backend->create_gate(0, kWords), other) << "the scheduler holds it";
  std::optional<Lease> lease(s->acquire([] {
    AcquireRequest lc;
    lc.priority = 1;
    return lc;
  }()));
  s.reset();
  EXPECT_NE(backend->create_gate(0, kWords), other) << "its lease still holds it";
  lease.reset();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(backend->create_gate(0, kWords), other);
  backend->return_stream(0, writer);
}

// The device clock (device_clock.h) stamps a completion on the host clock within tens of
// microseconds of when the host, polling, saw it happen, however late it is asked.
TEST(StreamSchedulerCuda, DeviceClockStampsACompletionWhenItHappened) {
  auto backend = backend_or_skip();
  if (!backend) GTEST_SKIP() << "no CUDA device";
  const auto now_us = [] {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  octopus::scheduler::detail::DeviceClock clock(*backend, 0, now_us);
  ASSERT_TRUE(clock.calibrate());
  void* buffer = nullptr;
  const std::size_t bytes = std::size_t{1} << 30;
  ASSERT_EQ(cudaMalloc(&buffer, bytes), cudaSuccess);
  StreamHandle stream = backend->create_stream(0, false);
  for (int round = 0; round < 5; ++round) {
    EventHandle event = backend->create_event(0, true);
    ASSERT_EQ(cudaMemsetAsync(buffer, round, bytes, static_cast<cudaStream_t>(stream)), cudaSuccess);
    backend->record_event(0, event, stream);
    // When it completed, as a host polling it sees: after the last poll that found it
    // unfinished began, before the first that found it finished returned.
    double lower = now_us(), upper = 0.0;
    while (true) {
      const double before = now_us();
      const bool done = backend->event_done(0, event);
      upper = now_us();
      if (done) break;
      lower = before;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // asked 20 ms late
    const std::optional<double> stamp = clock.completed_us(event);
    ASSERT_TRUE(stamp.has_value());
    EXPECT_GE(*stamp, lower - 50.0) << "round " << round;
    EXPECT_LE(*stamp, upper + 50.0) << "round " << round;
    backend->destroy_event(0, event);
    clock.calibrate();
  }
  cudaFree(buffer);
}

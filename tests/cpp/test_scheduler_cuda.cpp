// The StreamScheduler on the CUDA backend: real streams of the right priority, release
// events that complete, memory figures, the best-effort in-flight bound on a real stream,
// and best-effort streams on a green-context SM partition. Skips where no CUDA device is
// present.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "octopus/scheduler/cuda_backend.h"
#include "octopus/scheduler/stream_scheduler.h"

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
  for (int slice = 0; slice < 4; ++slice) {
    lease.checkpoint(1.0);
    EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess) << "a slice launched before the checkpoint is unfinished";
    ASSERT_EQ(cudaMemsetAsync(buffer, slice, bytes, stream), cudaSuccess);  // a slice of ~0.5 ms
  }
  lease.checkpoint(1.0);
  EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);
  lease.release()->synchronize();
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

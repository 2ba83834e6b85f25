// The StreamScheduler on the CUDA backend: real streams of the right priority, release
// events that complete, memory figures. Skips where no CUDA device is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>

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

}  // namespace

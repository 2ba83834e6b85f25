// The wait between two links of a yielding launch (core/driver_cuda.cuh): compiled once, for
// every functor's launches.
#include "octopus/core/driver_cuda.cuh"

namespace octopus::cuda {
namespace {

__global__ void yield_wait_kernel(const YieldClaims c, unsigned long long max_wait_ns) {
  if (threadIdx.x != 0) return;
  volatile int* waits_over = c.waits_over;
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (*waits_over == 0 && *reinterpret_cast<const volatile int*>(c.claimed_all) == 0 &&
         gate_share(c.gate, c.gate_words) >= scheduler::kYieldAll) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= max_wait_ns) {
      *waits_over = 1;
      return;
    }
    __nanosleep(2000);
  }
}

}  // namespace

void launch_yield_wait(const YieldClaims& claims, unsigned long long max_wait_ns, cudaStream_t stream) {
  yield_wait_kernel<<<1, 32, 0, stream>>>(claims, max_wait_ns);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace octopus::cuda

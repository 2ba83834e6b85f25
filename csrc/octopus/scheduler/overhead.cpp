#include "octopus/scheduler/overhead.h"

#include <chrono>
#include <stdexcept>

namespace octopus::scheduler {

std::vector<double> time_acquire_release(StreamScheduler& scheduler, const AcquireRequest& request, int rounds,
                                         int per_round) {
  if (rounds < 1 || per_round < 1) throw std::invalid_argument("rounds and per_round must be at least 1");
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(rounds));
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < per_round; ++i) scheduler.acquire(request).release();
    const auto stop = std::chrono::steady_clock::now();
    samples.push_back(std::chrono::duration<double, std::nano>(stop - start).count() / per_round);
  }
  return samples;
}

}  // namespace octopus::scheduler

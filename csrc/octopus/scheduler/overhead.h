// Measures what one uncontended acquire + release costs, timed in C++ (no Python).
#pragma once

#include <vector>

#include "octopus/scheduler/stream_scheduler.h"

namespace octopus::scheduler {

// `rounds` samples, each the mean nanoseconds of `per_round` acquire + release pairs
// made back to back on the calling thread.
std::vector<double> time_acquire_release(StreamScheduler& scheduler, const AcquireRequest& request, int rounds,
                                         int per_round);

}  // namespace octopus::scheduler

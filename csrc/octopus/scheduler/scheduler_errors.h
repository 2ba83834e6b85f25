// The exceptions a StreamScheduler throws besides std::invalid_argument (bad arguments) and
// std::runtime_error (a device that cannot do what was asked).
#pragma once

#include <stdexcept>

namespace octopus::scheduler {

// Thrown when an acquire times out; what() names the limit that kept it waiting.
class LeaseTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown when a request's deadline cannot be met: on arrival, by the estimate from its
// kind's recent hold times (unless infeasible deadlines are promoted), or because it
// passed while the request waited.
class DeadlineMissed : public LeaseTimeout {
 public:
  using LeaseTimeout::LeaseTimeout;
};

}  // namespace octopus::scheduler

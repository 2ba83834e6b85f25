// An SM partition of one device through the CUDA driver's green contexts: a green context
// on a subset of the SMs, and streams on it. The driver is reached through entry points
// the runtime hands out (cudaGetDriverEntryPointByVersion), so octopus does not link
// libcuda. Green contexts and their streams are never destroyed (like the scheduler's
// other streams: the caching allocator may record events on them after the scheduler is
// gone); the CUDA backend keeps one partition per device and reserve for the process, and
// hands their streams from one scheduler to the next (stream_pool.h).
#pragma once

#include <memory>

#include "octopus/scheduler/device_backend.h"

namespace octopus::scheduler {

class GreenContextPartition {
 public:
  // A green context on as many SMs of `device` as leaves at least `reserved_sms` of them
  // outside it (in whole groups of the device's co-scheduling alignment). Throws
  // std::runtime_error naming the reason where that cannot be made: a driver older than
  // CUDA 12.5, a failed driver call (with its error), too few SMs.
  static std::unique_ptr<GreenContextPartition> create(int device, int reserved_sms);

  int sms() const { return sms_; }
  int device_sms() const { return device_sms_; }
  // A non-blocking stream of the lowest priority on the partition.
  StreamHandle create_stream();

  struct Driver;  // the driver entry points used

 private:
  GreenContextPartition() = default;
  std::shared_ptr<const Driver> driver_;
  void* context_ = nullptr;  // CUgreenCtx
  int device_ = 0;
  int sms_ = 0;
  int device_sms_ = 0;
};

}  // namespace octopus::scheduler

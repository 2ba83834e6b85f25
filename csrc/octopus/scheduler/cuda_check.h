// Error checks and a device guard for the CUDA backend's runtime calls.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace octopus::scheduler::cuda_detail {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so that later calls do not report it
    throw std::runtime_error(std::string("octopus StreamScheduler: ") + what + " failed: " + cudaGetErrorString(status));
  }
}

// Runs CUDA calls on `device` and puts the caller's current device back afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      check(cudaSetDevice(device), "cudaSetDevice");
    } else {
      previous_ = -1;
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace octopus::scheduler::cuda_detail

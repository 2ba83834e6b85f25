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

// Lets the scheduler's own queries and waits through while another thread captures a CUDA
// graph. Under the default (global) capture mode a "potentially unsafe" call such as
// cudaEventQuery from any thread invalidates that thread's capture; the scheduler's calls
// touch only its own events and streams, which no capture records, so they run in the relaxed
// mode, set for the call and put back after it.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace octopus::scheduler::cuda_detail

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

// CUDA versions as the driver counts them (1000 * major + 10 * minor), as text.
inline std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

#if CUDART_VERSION >= 12050
// The driver's `symbol` of CUDA `version`, through the runtime (octopus does not link libcuda).
// Throws std::runtime_error naming what is missing.
template <typename Function>
Function driver_entry_point(const char* symbol, int version) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t status =
      cudaGetDriverEntryPointByVersion(symbol, &function, static_cast<unsigned int>(version), cudaEnableDefault, &found);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("looking up the driver's ") + symbol + " failed: " + cudaGetErrorString(status));
  }
  if (found != cudaDriverEntryPointSuccess || function == nullptr) {
    throw std::runtime_error(std::string("the CUDA driver has no ") + symbol + " for CUDA " + cuda_version_text(version) +
                             (found == cudaDriverEntryPointVersionNotSufficent ? " (the driver is too old)" : ""));
  }
  return reinterpret_cast<Function>(function);
}
#endif

}  // namespace octopus::scheduler::cuda_detail

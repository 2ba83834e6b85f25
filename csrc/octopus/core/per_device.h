// Values read once per CUDA device (an attribute, an occupancy, the architecture of the code
// the device runs), by whichever thread asks first; the others wait for it. Host code only.
#pragma once

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/CallOnce.h>
#include <c10/util/Exception.h>

#include <array>

namespace octopus::cuda {

constexpr int kMaxDevices = 64;

// The current device's index, checked against kMaxDevices.
inline int current_device_index() {
  const int device = c10::cuda::current_device();
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "octopus supports CUDA devices 0 to ", kMaxDevices - 1,
              ", got device ", device);
  return device;
}

// One T per device, made by make(device) on the device's first get(). c10::call_once rather
// than std::call_once: a make() that throws (a CUDA error) leaves the flag unset and the next
// call tries again, where some libstdc++ versions hang (GCC bug 66146).
template <class T>
class PerDevice {
 public:
  template <class Make>
  const T& get(Make&& make) {
    const int device = current_device_index();
    c10::call_once(once_[device], [&] { values_[device] = make(device); });
    return values_[device];
  }

 private:
  std::array<c10::once_flag, kMaxDevices> once_;
  std::array<T, kMaxDevices> values_{};
};

}  // namespace octopus::cuda

// GPU utilization from NVML, loaded at run time: where libnvidia-ml is absent (or fails
// to initialize) every query answers "unknown" and nothing else changes.
#pragma once

#include <optional>
#include <string>

namespace octopus::scheduler {

class Nvml {
 public:
  static Nvml& instance();
  bool available() const { return available_; }
  // Utilization in [0, 1] of the GPU at the PCI bus id (as cudaDeviceGetPCIBusId writes it).
  std::optional<double> utilization(const std::string& pci_bus_id) const;

 private:
  Nvml();
  bool available_ = false;
  void* library_ = nullptr;
  int (*get_handle_by_pci_)(const char*, void**) = nullptr;
  int (*get_utilization_)(void*, unsigned int*) = nullptr;
};

}  // namespace octopus::scheduler

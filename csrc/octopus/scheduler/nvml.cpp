#include "octopus/scheduler/nvml.h"

#include <dlfcn.h>

namespace octopus::scheduler {
namespace {
// The two fields of nvmlUtilization_t, in order; NVML's header is not needed to build.
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
}  // namespace

Nvml& Nvml::instance() {
  static Nvml nvml;
  return nvml;
}

Nvml::Nvml() {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) return;
  auto init = reinterpret_cast<int (*)()>(dlsym(library_, "nvmlInit_v2"));
  get_handle_by_pci_ = reinterpret_cast<int (*)(const char*, void**)>(dlsym(library_, "nvmlDeviceGetHandleByPciBusId_v2"));
  get_utilization_ = reinterpret_cast<int (*)(void*, unsigned int*)>(dlsym(library_, "nvmlDeviceGetUtilizationRates"));
  available_ = init != nullptr && get_handle_by_pci_ != nullptr && get_utilization_ != nullptr && init() == 0;
}

std::optional<double> Nvml::utilization(const std::string& pci_bus_id) const {
  if (!available_) return std::nullopt;
  void* handle = nullptr;
  if (get_handle_by_pci_(pci_bus_id.c_str(), &handle) != 0) return std::nullopt;
  NvmlUtilization rates{};
  if (get_utilization_(handle, reinterpret_cast<unsigned int*>(&rates)) != 0) return std::nullopt;
  return rates.gpu / 100.0;
}

}  // namespace octopus::scheduler

#include "octopus/core/kernel_profiles.h"

namespace octopus {
namespace {
std::vector<std::pair<std::string, KernelProfileFactory>>& registry() {
  static std::vector<std::pair<std::string, KernelProfileFactory>> factories;
  return factories;
}
}  // namespace

KernelProfileRegistration::KernelProfileRegistration(std::string kind, KernelProfileFactory factory) {
  registry().emplace_back(std::move(kind), std::move(factory));
}

std::vector<std::pair<std::string, KernelProfile>> octopus_kernel_profiles() {
  std::vector<std::pair<std::string, KernelProfile>> profiles;
  for (const auto& [kind, factory] : registry()) profiles.emplace_back(kind, factory());
  return profiles;
}

}  // namespace octopus

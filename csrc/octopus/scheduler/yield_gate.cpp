#include "octopus/scheduler/yield_gate.h"

#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <utility>

namespace octopus::scheduler {
namespace {

// Registrations are rare (a scheduler's construction and destruction); lookups come with
// every ragged launch, from any thread.
struct Registry {
  std::shared_mutex mutex;
  std::unordered_map<StreamHandle, std::shared_ptr<YieldGateState>> streams;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: launches may come during exit
  return *r;
}

}  // namespace

void register_yield_stream(StreamHandle stream, std::shared_ptr<YieldGateState> state) {
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  r.streams[stream] = std::move(state);
}

void unregister_yield_streams(const YieldGateState* state) {
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  for (auto it = r.streams.begin(); it != r.streams.end();) {
    it = it->second.get() == state ? r.streams.erase(it) : std::next(it);
  }
}

std::shared_ptr<YieldGateState> yielding_gate(StreamHandle stream) {
  Registry& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  if (r.streams.empty()) return nullptr;
  const auto it = r.streams.find(stream);
  if (it == r.streams.end() || !it->second->active.load(std::memory_order_relaxed)) return nullptr;
  return it->second;
}

double gate_wait_after_hold(double hold_s, double& recent_max_hold_s, double max_pause_s) {
  recent_max_hold_s = std::max(hold_s, recent_max_hold_s * kGateHoldDecay);
  const double wait = std::clamp(kGateWaitHolds * recent_max_hold_s, kMinGateWaitS, kMaxGateWaitS);
  return max_pause_s < 0.0 ? wait : std::min(wait, std::max(max_pause_s, kMinGateWaitS));
}

}  // namespace octopus::scheduler

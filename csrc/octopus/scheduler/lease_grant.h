// What the scheduler granted: the stream, where it is, and how the grant came about.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "octopus/scheduler/config.h"
#include "octopus/scheduler/event_pool.h"

namespace octopus::scheduler {

struct LeaseGrant {
  uint64_t id = 0;
  int device = -1;
  StreamHandle stream = nullptr;
  int slot = -1;  // index in the device's pool: normal, then high-priority, then best-effort streams
  int priority = 0;
  WorkClass work_class = WorkClass::Normal;
  bool promoted = false;  // its deadline was infeasible and it was made latency-critical
  double occupancy = 0.0;
  std::size_t bytes = 0;
  std::string kind;
  double waited_s = 0.0;
  bool queued = false;  // it was not granted on arrival
  double requested_us = 0.0;
  double arrived_us = 0.0;  // requested_us less the request's waited_before_s: where its latency counts from
  double granted_us = 0.0;
  double deadline_us = -1.0;  // negative: none
  std::shared_ptr<ReleaseEvent> previous_release;
  // Latency-critical leases, for the latency controller: whether no best-effort work could
  // run on the device from the work's arrival to the grant, and the device's best-effort
  // epoch then (a latency is "alone" if the epoch has not moved by its completion).
  bool best_effort_idle = false;
  uint64_t best_effort_epoch = 0;
  // The device's control generation at the grant (DeviceState::control_generation), and for
  // latency-critical leases whether every best-effort lease whose work may still run was
  // granted under it: no work that settings before the current ones let in is on the device.
  uint64_t control_generation = 0;
  bool settled = false;
  // Its release event is timed, for the controller's device-clock stamp (device_clock.h).
  bool timed_release = false;
  // A latency-critical lease granted while its device's best-effort work yields: the word of
  // the device's gate (yield_gate.h) it closes on its stream and opens when it is returned.
  uint32_t* gate_word = nullptr;
  // A latency-critical lease granted while its device yields that left the gate open because
  // the controller leaves it open for its kind (the controller records such jobs apart).
  bool gate_left_open = false;
};

}  // namespace octopus::scheduler

// The acquire/release timeline a scheduler can record, and its Chrome-trace form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "octopus/scheduler/config.h"
#include "octopus/scheduler/latency_controller.h"
#include "octopus/scheduler/stats.h"

namespace octopus::scheduler {

struct TimelineEntry {
  enum class Type {
    Lease,         // requested_us .. granted_us waiting (if queued), granted_us .. released_us held
    Timeout,       // gave up at granted_us
    Throttle,      // a best-effort holder paused at a checkpoint from granted_us to released_us
    DeadlineMiss,  // at granted_us; `reason` says which kind
    Control,       // at granted_us the latency controller moved to `step` (`control`; `probing`)
    Latency,       // a latency-critical job of `kind` completed at released_us, `latency_s` after requested_us
                   // (its request, or its arrival where the caller gave one)
  };
  Type type = Type::Lease;
  uint64_t lease_id = 0;
  std::string kind;
  WorkClass work_class = WorkClass::Normal;
  int device = 0;
  int stream_slot = -1;
  int priority = 0;
  uint64_t thread = 0;
  bool queued = false;  // the lease waited before its grant
  bool closed_gate = false;  // a latency-critical lease that made BE kernels yield while held
  // Microseconds since the scheduler was created.
  double requested_us = 0.0;
  double granted_us = 0.0;
  double released_us = 0.0;
  double deadline_us = -1.0;  // negative: none
  const char* reason = "";    // DeadlineMiss: "rejected", "expired" or "late"
  // Control and Latency entries.
  int step = -1;
  ControlStep control;
  bool probing = false;
  double latency_s = 0.0;
  double target_s = -1.0;  // negative: none known
  bool alone = false;
};

// Chrome trace-event JSON: one process per device, one row per stream holding each lease
// from grant to release (its class, priority and deadline in the arguments), throttled
// intervals on the holder's row, a "waiting" row with each wait, timeouts and deadline
// misses as instants, the latency controller's settings as counters and each
// latency-critical job's latency (its target, and whether it ran alone: no best-effort work on
// the device) as a counter per kind; `stats` (per-class
// percentiles, misses, throttled time) goes under otherData.
std::string chrome_trace_json(const std::vector<TimelineEntry>& entries, const std::string& backend,
                              const SchedulerStats& stats);

}  // namespace octopus::scheduler

// The acquire/release timeline a scheduler can record, and its Chrome-trace form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace octopus::scheduler {

struct TimelineEntry {
  enum class Type { Lease, Timeout };
  Type type = Type::Lease;
  uint64_t lease_id = 0;
  std::string kind;
  int device = 0;
  int stream_slot = -1;
  int priority = 0;
  uint64_t thread = 0;
  bool queued = false;  // the lease waited before its grant
  // Microseconds since the scheduler was created.
  double requested_us = 0.0;
  double granted_us = 0.0;   // for a timeout: when it gave up
  double released_us = 0.0;
};

// Chrome trace-event JSON: one process per device, one row per stream holding each
// lease from grant to release, a "waiting" row with each wait, and timeouts as instants.
std::string chrome_trace_json(const std::vector<TimelineEntry>& entries, const std::string& backend);

}  // namespace octopus::scheduler

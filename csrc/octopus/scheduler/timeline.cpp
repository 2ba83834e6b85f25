#include "octopus/scheduler/timeline.h"

#include <cstdio>
#include <optional>
#include <set>
#include <sstream>

namespace octopus::scheduler {
namespace {

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_number(const std::optional<double>& value) {
  if (!value) return "null";
  std::ostringstream out;
  out.precision(9);
  out << *value;
  return out.str();
}

std::string class_stats_json(const SchedulerStats& stats) {
  std::ostringstream json;
  json << "{";
  for (int c = 0; c < kWorkClasses; ++c) {
    const ClassStats& s = stats.classes[static_cast<std::size_t>(c)];
    if (c > 0) json << ",";
    json << json_string(work_class_name(static_cast<WorkClass>(c))) << ":{\"granted\":" << s.granted
         << ",\"wait_p50_s\":" << json_number(s.wait_p50_s) << ",\"wait_p99_s\":" << json_number(s.wait_p99_s)
         << ",\"hold_p50_s\":" << json_number(s.hold_p50_s) << ",\"hold_p99_s\":" << json_number(s.hold_p99_s)
         << ",\"deadline_misses\":" << s.deadline_misses() << ",\"deadline_promoted\":" << s.deadline_promoted
         << ",\"throttled_s\":" << json_number(s.throttled_s) << ",\"pauses\":" << s.pauses << "}";
  }
  json << "}";
  return json.str();
}

constexpr int kWaitingRow = 1000000;

}  // namespace

std::string chrome_trace_json(const std::vector<TimelineEntry>& entries, const std::string& backend,
                              const SchedulerStats& stats) {
  std::ostringstream json;
  json.precision(3);
  json << std::fixed << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"backend\":" << json_string(backend)
       << ",\"classes\":" << class_stats_json(stats) << "},\"traceEvents\":[";
  bool first = true;
  auto begin_event = [&] {
    if (!first) json << ",";
    first = false;
  };
  std::set<std::pair<int, int>> rows;
  for (const TimelineEntry& e : entries) {
    const std::string common = "\"name\":" + json_string(e.kind) + ",\"pid\":" + std::to_string(e.device);
    const std::string classed = ",\"class\":" + json_string(work_class_name(e.work_class)) +
                                ",\"priority\":" + std::to_string(e.priority);
    std::ostringstream deadline;
    deadline.precision(3);
    if (e.deadline_us >= 0.0) deadline << std::fixed << ",\"deadline_us\":" << e.deadline_us;
    switch (e.type) {
      case TimelineEntry::Type::Timeout:
        begin_event();
        json << "{" << common << ",\"cat\":\"timeout\",\"ph\":\"i\",\"s\":\"p\",\"tid\":" << kWaitingRow
             << ",\"ts\":" << e.granted_us << ",\"args\":{\"waited_us\":" << e.granted_us - e.requested_us << classed
             << "}}";
        rows.insert({e.device, kWaitingRow});
        continue;
      case TimelineEntry::Type::DeadlineMiss:
        begin_event();
        json << "{" << common << ",\"cat\":\"deadline_miss\",\"ph\":\"i\",\"s\":\"p\",\"tid\":"
             << (e.stream_slot >= 0 ? e.stream_slot : kWaitingRow) << ",\"ts\":" << e.granted_us
             << ",\"args\":{\"reason\":" << json_string(e.reason) << ",\"lease\":" << e.lease_id << classed
             << deadline.str() << "}}";
        rows.insert({e.device, e.stream_slot >= 0 ? e.stream_slot : kWaitingRow});
        continue;
      case TimelineEntry::Type::Throttle:
        begin_event();
        json << "{\"name\":\"throttled\",\"pid\":" << e.device << ",\"cat\":\"throttle\",\"ph\":\"X\",\"tid\":"
             << e.stream_slot << ",\"ts\":" << e.granted_us << ",\"dur\":" << e.released_us - e.granted_us
             << ",\"args\":{\"lease\":" << e.lease_id << ",\"kind\":" << json_string(e.kind) << classed << "}}";
        rows.insert({e.device, e.stream_slot});
        continue;
      case TimelineEntry::Type::Control:
        begin_event();
        json << "{\"name\":\"latency control\",\"pid\":" << e.device << ",\"ph\":\"C\",\"ts\":" << e.granted_us
             << ",\"args\":{\"step\":" << e.step << ",\"slice_budget_ms\":" << e.control.slice_budget_s * 1e3
             << ",\"in_flight\":" << e.control.in_flight << ",\"reserved_sms\":" << e.control.reserved_sms
             << ",\"throttle\":" << static_cast<int>(e.control.throttle)
             << ",\"device_yield\":" << (e.control.device_yield ? 1 : 0) << ",\"probing\":" << (e.probing ? 1 : 0)
             << "}}";
        continue;
      case TimelineEntry::Type::Latency:
        begin_event();
        json << "{\"name\":" << json_string("latency " + e.kind) << ",\"pid\":" << e.device
             << ",\"ph\":\"C\",\"ts\":" << e.released_us << ",\"args\":{\"latency_ms\":" << e.latency_s * 1e3;
        if (e.target_s >= 0.0) json << ",\"target_ms\":" << e.target_s * 1e3;
        json << ",\"alone\":" << (e.alone ? 1 : 0) << "}}";
        continue;
      case TimelineEntry::Type::Lease:
        break;
    }
    if (e.queued) {
      begin_event();
      json << "{" << common << ",\"cat\":\"wait\",\"ph\":\"X\",\"tid\":" << kWaitingRow << ",\"ts\":" << e.requested_us
           << ",\"dur\":" << e.granted_us - e.requested_us << ",\"args\":{\"lease\":" << e.lease_id << classed
           << deadline.str() << "}}";
      rows.insert({e.device, kWaitingRow});
    }
    begin_event();
    json << "{" << common << ",\"cat\":\"lease\",\"ph\":\"X\",\"tid\":" << e.stream_slot << ",\"ts\":" << e.granted_us
         << ",\"dur\":" << e.released_us - e.granted_us << ",\"args\":{\"lease\":" << e.lease_id << classed
         << ",\"thread\":" << e.thread << ",\"waited_us\":" << e.granted_us - e.requested_us << deadline.str();
    if (e.work_class == WorkClass::LatencyCritical) json << ",\"closed_gate\":" << (e.closed_gate ? 1 : 0);
    json << "}}";
    rows.insert({e.device, e.stream_slot});
  }
  std::set<int> devices;
  for (const auto& [device, row] : rows) {
    devices.insert(device);
    begin_event();
    const std::string name = row == kWaitingRow ? "waiting" : "stream " + std::to_string(row);
    json << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << device << ",\"tid\":" << row
         << ",\"args\":{\"name\":" << json_string(name) << "}}";
  }
  for (const int device : devices) {
    begin_event();
    json << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << device << ",\"args\":{\"name\":"
         << json_string(backend + ":" + std::to_string(device)) << "}}";
  }
  json << "]}";
  return json.str();
}

}  // namespace octopus::scheduler

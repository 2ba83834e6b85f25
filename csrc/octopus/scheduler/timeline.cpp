#include "octopus/scheduler/timeline.h"

#include <cstdio>
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

constexpr int kWaitingRow = 1000000;

}  // namespace

std::string chrome_trace_json(const std::vector<TimelineEntry>& entries, const std::string& backend) {
  std::ostringstream json;
  json.precision(3);
  json << std::fixed << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"backend\":" << json_string(backend)
       << "},\"traceEvents\":[";
  bool first = true;
  auto begin_event = [&] {
    if (!first) json << ",";
    first = false;
  };
  std::set<std::pair<int, int>> rows;
  for (const TimelineEntry& e : entries) {
    const std::string common = "\"name\":" + json_string(e.kind) + ",\"pid\":" + std::to_string(e.device);
    if (e.type == TimelineEntry::Type::Timeout) {
      begin_event();
      json << "{" << common << ",\"cat\":\"timeout\",\"ph\":\"i\",\"s\":\"p\",\"tid\":" << kWaitingRow
           << ",\"ts\":" << e.granted_us << ",\"args\":{\"priority\":" << e.priority
           << ",\"waited_us\":" << e.granted_us - e.requested_us << "}}";
      rows.insert({e.device, kWaitingRow});
      continue;
    }
    if (e.queued) {
      begin_event();
      json << "{" << common << ",\"cat\":\"wait\",\"ph\":\"X\",\"tid\":" << kWaitingRow << ",\"ts\":" << e.requested_us
           << ",\"dur\":" << e.granted_us - e.requested_us << ",\"args\":{\"lease\":" << e.lease_id
           << ",\"priority\":" << e.priority << "}}";
      rows.insert({e.device, kWaitingRow});
    }
    begin_event();
    json << "{" << common << ",\"cat\":\"lease\",\"ph\":\"X\",\"tid\":" << e.stream_slot << ",\"ts\":" << e.granted_us
         << ",\"dur\":" << e.released_us - e.granted_us << ",\"args\":{\"lease\":" << e.lease_id
         << ",\"priority\":" << e.priority << ",\"thread\":" << e.thread
         << ",\"waited_us\":" << e.granted_us - e.requested_us << "}}";
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

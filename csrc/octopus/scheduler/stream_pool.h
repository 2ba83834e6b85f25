// Streams a scheduler gave back, kept for the next scheduler that asks for one of the same
// kind. A backend's streams are never destroyed (work queued on one, and the events the
// caching allocator records for a tensor used on it, may outlive the scheduler that made
// it): without reuse, every scheduler a process makes would add its whole pool of streams,
// and every green context its partitions, for the life of the process.
#pragma once

#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "octopus/scheduler/device_backend.h"

namespace octopus::scheduler::detail {

class StreamPool {
 public:
  // What a stream is: its device and its kind (a priority, or the partition it runs on).
  using Kind = std::pair<int, int>;
  static constexpr int kHighPriority = -1;
  static constexpr int kNormalPriority = -2;
  // Streams on a partition are of kind (device, the SMs it keeps free).
  static Kind priority_kind(int device, bool high_priority) {
    return {device, high_priority ? kHighPriority : kNormalPriority};
  }

  // A stream of `kind` given back earlier (the first given back first: a scheduler made after
  // another one takes its streams in the order that one gave them back), else make()'s.
  template <class Make>
  StreamHandle take_or_make(const Kind& kind, Make&& make) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(kind);
      if (it != free_.end() && !it->second.empty()) {
        const StreamHandle stream = it->second.front();
        it->second.pop_front();
        return stream;
      }
    }
    const StreamHandle stream = make();  // outside the lock: making a stream may be slow
    std::lock_guard<std::mutex> lock(mutex_);
    kind_of_[stream] = kind;
    return stream;
  }
  // Back for the next take of its kind; a stream this pool did not make is ignored.
  void give_back(StreamHandle stream) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = kind_of_.find(stream);
    if (it != kind_of_.end()) free_[it->second].push_back(stream);
  }
  std::size_t made_count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return kind_of_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<StreamHandle, Kind> kind_of_;
  std::map<Kind, std::deque<StreamHandle>> free_;
};

}  // namespace octopus::scheduler::detail

// The most recent samples of a quantity (wait or hold times), for percentiles and medians
// that follow the present rather than the whole history.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <vector>

namespace octopus::scheduler::detail {

class SampleWindow {
 public:
  explicit SampleWindow(std::size_t capacity) : capacity_(capacity) { samples_.reserve(capacity); }

  void add(double value) {
    if (samples_.size() < capacity_) {
      samples_.push_back(value);
    } else {
      samples_[next_] = value;
    }
    next_ = (next_ + 1) % capacity_;
    ++count_;
  }

  // The q-quantile (0..1, nearest rank) of the samples kept; nullopt before the first.
  std::optional<double> quantile(double q) const {
    if (samples_.empty()) return std::nullopt;
    std::vector<double> sorted = samples_;
    const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
    const std::size_t k = std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1);
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k), sorted.end());
    return sorted[k];
  }

  // The sample that `k` others kept exceed (0: the largest); nullopt before the first, the
  // smallest where fewer than k + 1 are kept.
  std::optional<double> nth_largest(std::size_t k) const {
    if (samples_.empty()) return std::nullopt;
    std::vector<double> sorted = samples_;
    const std::size_t index = sorted.size() - 1 - std::min(k, sorted.size() - 1);
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(index), sorted.end());
    return sorted[index];
  }

  // The mean of max(0, sample / threshold - 1) over the samples kept (0 before the first):
  // how far past `threshold` they go, the share past it and the distance alike; and the
  // standard error of that mean (0 for fewer than two samples).
  struct Excess {
    double mean = 0.0;
    double error = 0.0;
  };
  Excess excess(double threshold) const {
    Excess e;
    const double n = static_cast<double>(samples_.size());
    if (samples_.empty()) return e;
    double sum = 0.0, squares = 0.0;
    for (const double s : samples_) {
      const double x = std::max(0.0, s / threshold - 1.0);
      sum += x;
      squares += x * x;
    }
    e.mean = sum / n;
    if (samples_.size() > 1) e.error = std::sqrt(std::max(0.0, squares - n * e.mean * e.mean) / (n - 1.0) / n);
    return e;
  }

  std::size_t count() const { return count_; }  // every sample ever added
  std::size_t size() const { return samples_.size(); }  // the samples kept

  void clear() {
    samples_.clear();
    next_ = 0;
    count_ = 0;
  }

 private:
  std::size_t capacity_;
  std::vector<double> samples_;
  std::size_t next_ = 0;
  std::size_t count_ = 0;
};

}  // namespace octopus::scheduler::detail

#include "octopus/scheduler/latency_controller.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace octopus::scheduler {
namespace {

// The alone p99 a kind's targets are judged against: not its samples' nearest-rank p99 but
// the lower end of a one-sided kAloneConfidence interval of it, the largest order statistic
// that lies at or under the kind's true p99 with that probability (by the binomial count of
// samples over a p99). A few rare slow jobs decide a p99 of a few hundred samples (in the
// contention benchmark's conv-net family, the probes' jobs that met the other
// latency-critical job: their count in one probe moves the nearest-rank p99 by up to a
// quarter), and an estimate that lands high loosens a relative target past what the kind
// met alone; the bound errs toward protecting it instead. Of two or more samples it is never
// the largest (one host hiccup in a probe would set the kind's first target): of up to 53,
// the second largest; of 200, the fifth.
constexpr double kAloneConfidence = 0.9;

std::optional<double> alone_p99(const detail::SampleWindow& alone) {
  if (alone.size() == 0) return std::nullopt;
  return alone.nth_largest(detail::samples_above_alone_p99(alone.size()));
}

// An absolute target under the p99 of this many alone samples is refused: a p99 of a few
// samples lies under the kind's true one, so the target is surely out of reach.
constexpr std::size_t kAloneSamplesToRefuse = 3;
// How far a relative target may rise before an infeasible report judged against it, and the
// count toward one, are dropped (withdraw_stale_report): its alone p99 moves by a few percent as
// probes add samples. The same margin keeps a report below the alone p99 from flapping: it is
// withdrawn only once the alone p99 is that far under the target.
constexpr double kReportTargetMove = 0.1;

}  // namespace

namespace detail {

std::size_t samples_above_alone_p99(std::size_t n) {
  if (n <= 1) return 0;
  // The fewest samples over the p99 that cover kAloneConfidence of the binomial's mass (its
  // terms in logarithms: (1 - p)^n underflows for n of some 74,000).
  constexpr double p = 0.01;
  double log_term = static_cast<double>(n) * std::log1p(-p);  // P(none over)
  double mass = std::exp(log_term);
  std::size_t over = 0;
  while (mass < kAloneConfidence && over + 1 < n) {
    log_term += std::log(static_cast<double>(n - over) / static_cast<double>(over + 1) * p / (1.0 - p));
    mass += std::exp(log_term);
    ++over;
  }
  return std::max<std::size_t>(over, 1);
}

}  // namespace detail

bool same_settings(const ControlStep& a, const ControlStep& b) {
  return a.slice_budget_s == b.slice_budget_s && a.in_flight == b.in_flight && a.reserved_sms == b.reserved_sms &&
         a.throttle == b.throttle && a.device_yield == b.device_yield;
}

std::vector<ControlStep> default_ladder(int multiprocessors, const std::vector<int>& reserves,
                                        std::optional<bool> device_yield) {
  // One partition step per reserve offered, fewest SMs kept free first. (The partitions take
  // whole groups of SMs: on an H200 those asked to keep 6-25% of its 132 SMs free keep 12, 20,
  // 28 and 36. Matching each fraction to its nearest reserve instead took the 12 twice and
  // left the 28 unused.)
  std::vector<int> kept;
  for (const int r : reserves) {
    if (r > 0 && r < multiprocessors) kept.push_back(r);
  }
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  if (kept.empty()) kept.push_back(0);  // no partition: the yield alone
  const int top = kept.back();
  // Ordered by what best-effort work gives up, as measured on an H100/H200 (benchmarks/):
  // first SMs kept free of it (a latency-critical kernel then finds a free SM at once; BE
  // work loses about the share of SMs kept), then slices (every slice costs the BE holder
  // host time, and its Python thread holds the GIL a latency-critical thread may need),
  // then the in-flight bound, then pausing BE work while LC work waits, then while it runs.
  // Every step above the first also has octopus's ragged BE kernels step aside on the device
  // while LC work is there: what memory-bound BE work costs LC work (its DRAM bandwidth), no
  // partition keeps from it, and that costs BE work no more than the LC work's own device time.
  // Slices end at 1 ms: pinned with a quarter of the SMs free, held throttling and the yield,
  // 0.25 ms slices left a GEMM beside a ragged job at 4-35% of its rate in every run, each
  // slice waiting for the SMs the other's kernels held, and bought the LC jobs nothing over
  // 1 ms slices, where either kind still falls to 14-50% at times (H200, both families of
  // octopus-bench contention; benchmarks/README.md#contention).
  const double whole = kWholeSliceS;
  std::vector<ControlStep> steps = {{whole, 2, 0, ThrottleMode::Off, false}};
  for (const int r : kept) steps.push_back({whole, 2, r, ThrottleMode::Off, true});
  steps.push_back({4e-3, 2, top, ThrottleMode::Off, true});
  steps.push_back({2e-3, 1, top, ThrottleMode::Waiting, true});
  steps.push_back({1e-3, 1, top, ThrottleMode::Held, true});
  std::vector<ControlStep> ladder;
  for (ControlStep s : steps) {
    if (device_yield) s.device_yield = *device_yield;
    if (ladder.empty() || !same_settings(ladder.back(), s)) ladder.push_back(s);
  }
  return ladder;
}

LatencyController::LatencyController(ControllerOptions options, std::vector<ControlStep> ladder)
    : options_(options), ladder_(std::move(ladder)), backoff_(ladder_.size(), 0), step_seconds_(ladder_.size(), 0.0) {
  if (ladder_.empty()) throw std::invalid_argument("octopus latency controller: the ladder has no step");
  for (std::size_t i = 0; i < ladder_.size(); ++i) {
    if (ladder_[i].throttle != ThrottleMode::Off || ladder_[i].slice_budget_s < kWholeSliceS) break;
    ceiling_ = static_cast<int>(i);
  }
}

LatencyController::Kind& LatencyController::kind(const std::string& name) {
  auto it = kinds_.find(name);
  if (it == kinds_.end()) {
    it = kinds_.emplace(name, Kind(options_.alone_window, options_.recent_window, ladder_.size())).first;
    it->second.budget = options_.budget_cap;
  }
  return it->second;
}

void LatencyController::set_target(const std::string& name, LatencyTarget target) {
  if (target.p99_s && !(*target.p99_s > 0.0 && std::isfinite(*target.p99_s))) {
    throw std::invalid_argument("octopus StreamScheduler: a latency target must be a positive number of seconds");
  }
  if (!(target.ratio >= 1.0 && std::isfinite(target.ratio))) {
    throw std::invalid_argument("octopus StreamScheduler: a latency ratio must be at least 1 (the alone p99)");
  }
  Kind& k = kind(name);
  k.target = target;
  k.infeasible = false;
  k.below_alone = false;
  k.reported = false;
  k.median_unhelped = 0;
  k.median_reported = false;
  k.at_top = k.over_at_top = 0;
  k.judged_target_s = 0.0;
  k.budget = options_.budget_cap;
}

std::optional<double> LatencyController::target_s(const Kind& k) const {
  if (k.target && k.target->p99_s) return k.target->p99_s;
  if (k.alone.count() < options_.min_alone_samples) return std::nullopt;
  const double ratio = k.target ? k.target->ratio : options_.default_ratio;
  return ratio * *k.alone_p99_s;
}

std::optional<double> LatencyController::median_bound_s(const Kind& k) const {
  if ((k.target && k.target->p99_s) || k.alone.count() < options_.min_alone_samples) return std::nullopt;
  return options_.median_ratio * *k.alone_p50_s;
}

std::optional<detail::SampleWindow::Excess> LatencyController::excess_at(const Kind& k, int step, double target,
                                                                         double now_s) const {
  if (step < 0 || step >= static_cast<int>(ladder_.size())) return std::nullopt;
  const Kind::AtStep& at = k.at_steps[static_cast<std::size_t>(step)];
  if (!on_record(at, now_s)) return std::nullopt;
  return at.recent.excess(target);
}

bool LatencyController::lower(const detail::SampleWindow::Excess& a, const detail::SampleWindow::Excess& b) const {
  return a.mean < options_.record_margin * b.mean &&
         b.mean - a.mean > options_.record_confidence * std::hypot(a.error, b.error);
}

std::optional<int> LatencyController::step_that_may_help(const Kind& k, double target, double now_s) const {
  const int above = step_ + 1;
  if (above >= static_cast<int>(ladder_.size())) return std::nullopt;
  const auto record_above = excess_at(k, above, target, now_s);
  if (!record_above) return above;  // no record: it may help
  const auto here = excess_at(k, step_, target, now_s);
  // Come down from a step over target to find out whether this one is as good: not before
  // its record says.
  if (!here) return trying_below_ ? std::nullopt : std::optional<int>(above);
  if (lower(*record_above, *here)) return above;
  // The step above is on record as no better. Where this step's record does not plainly miss
  // the target, the spent budget was a passing burst: stay. Where it plainly misses (twice the
  // share over the target that the target allows: a record of 128 jobs at a p99 target's edge
  // has one or two over it by chance), so does the step above; a step further up that is not
  // on record may still help (steps alike in a row: partitions beside memory-bound BE work).
  // Where a step further up is on record as lower than this one first, it stays: of several
  // records compared, one is lower by chance (on the controller tests' scripted device, with
  // 1.5% of jobs late at every step, climbing to such steps kept it higher up for longer).
  if (!plainly_misses(k, step_, target)) return std::nullopt;
  for (int s = above + 1; s < static_cast<int>(ladder_.size()); ++s) {
    const auto record = excess_at(k, s, target, now_s);
    if (!record) return s;
    if (lower(*record, *here)) break;
  }
  // Where no step meets the target, the steps' records of a few late jobs each look alike and
  // the controller would rest wherever it came to; the tails of hundreds of jobs tell them
  // apart: climb to the step with the lowest tail where this step's is over it by more than
  // chance (on a scripted device with 6, 4, 2 and 3% of jobs over the target at steps 1-4 it
  // rested at step 1 before).
  const std::optional<int> best = best_tail_step(k, now_s);
  if (best && *best > step_ && tail_worse(k, step_, *best, now_s)) return best;
  return std::nullopt;
}

std::optional<detail::SampleWindow::Excess> LatencyController::tail_at(const Kind& k, int step, double now_s) const {
  const Kind::AtStep& at = k.at_steps[static_cast<std::size_t>(step)];
  if (at.closed_tail.jobs < kTailJobs || now_s - at.last_s > options_.step_memory_s) return std::nullopt;
  return at.closed_tail.share();
}

bool LatencyController::tail_worse(const Kind& k, int a, int b, double now_s) const {
  const auto ta = tail_at(k, a, now_s), tb = tail_at(k, b, now_s);
  return ta && tb && lower(*tb, *ta);
}

std::optional<int> LatencyController::best_tail_step(const Kind& k, double now_s) const {
  std::optional<int> best;
  double lowest = 2.0;
  for (int s = 0; s < static_cast<int>(ladder_.size()); ++s) {
    const auto tail = tail_at(k, s, now_s);
    if (tail && tail->mean < lowest) {
      lowest = tail->mean;
      best = s;
    }
  }
  return best;
}

bool LatencyController::plainly_misses(const Kind& k, int step, double target) const {
  const double share = 2.0 * (1.0 - options_.attainment);
  const std::optional<double> edge = k.at_steps[static_cast<std::size_t>(step)].recent.quantile(1.0 - share);
  return edge && *edge > target;
}

bool LatencyController::no_step_above_helps(const Kind& k, double target, double now_s) const {
  const auto here = excess_at(k, step_, target, now_s);
  if (!here || !plainly_misses(k, step_, target)) return false;
  for (int s = step_ + 1; s < static_cast<int>(ladder_.size()); ++s) {
    const auto record = excess_at(k, s, target, now_s);
    if (!record || lower(*record, *here) || !plainly_misses(k, s, target)) return false;
  }
  return true;
}

bool LatencyController::below_no_worse(double now_s) const {
  if (step_ == 0) return false;
  bool any = false;
  for (const auto& [name, k] : kinds_) {
    if (now_s - k.last_s > options_.idle_s || k.recent.count() == 0) continue;  // not active
    const std::optional<double> target = target_s(k);
    if (!target) return false;
    const auto here = excess_at(k, step_, *target, now_s);
    const auto below = excess_at(k, step_ - 1, *target, now_s);
    if (!here || (below && lower(*here, *below))) return false;
    // Nor to a step whose tail is over the kind's lowest by more than chance: steps each alike
    // their neighbour by their records led it down a slope of them (step_that_may_help).
    const std::optional<int> best = best_tail_step(k, now_s);
    if (best && tail_worse(k, step_ - 1, *best, now_s)) return false;
    any = true;
  }
  return any;
}

std::optional<double> LatencyController::median_at(const Kind& k, int step, double now_s) const {
  if (step < 0 || step >= static_cast<int>(ladder_.size())) return std::nullopt;
  const Kind::AtStep& at = k.at_steps[static_cast<std::size_t>(step)];
  if (at.recent.size() < options_.median_samples || now_s - at.last_s > options_.step_memory_s) return std::nullopt;
  return at.recent.quantile(0.5);
}

void LatencyController::observe(const std::string& name, double latency_s, bool alone, double now_s, bool settled,
                                std::optional<bool> gate_left_open) {
  if (!started_) {
    started_ = true;
    step_since_s_ = now_s;
    step_entered_s_ = now_s;
  }
  last_sample_s_ = now_s;
  Kind& k = kind(name);
  k.last_s = now_s;
  if (alone && k.samples >= options_.warmup_samples) {
    k.alone.add(latency_s);
    k.alone_p99_s = alone_p99(k.alone);
    k.alone_p50_s = k.alone.quantile(0.5);
  }
  k.recent.add(latency_s);
  k.samples += 1;
  samples_at_step_ += 1;
  if (trying()) trial_samples_ += 1;
  const std::optional<double> target = target_s(k);
  if (!alone) {
    Kind::AtStep& at = k.at_steps[static_cast<std::size_t>(step_)];
    at.jobs += 1;
    at.over += target && latency_s > *target ? 1 : 0;
    if (settled && gate_left_open.value_or(yields() && k.gate_open)) {
      at.open.add(latency_s);  // the gate's record, apart from the step's
      at.open_last_s = now_s;
      at.open_tail.add(target && latency_s > *target);
    } else if (settled) {
      at.last_s = now_s;
      at.recent.add(latency_s);
      at.closed_tail.add(target && latency_s > *target);
    } else {
      at.unsettled += 1;
    }
  }
  if (target) {
    const bool over = latency_s > *target;
    k.judged += 1;
    if (!over) k.within += 1;
    const bool severe = over && latency_s > options_.severe_ratio * *target;
    k.budget = std::min(options_.budget_cap, k.budget + (over ? -(severe ? options_.severe_cost : 1.0)
                                                              : 1.0 - options_.attainment));
    withdraw_stale_report(k, *target);
    const bool top = step_ == static_cast<int>(ladder_.size()) - 1;
    if (!k.infeasible && (top || (climb_unhelpful_ && no_step_above_helps(k, *target, now_s)))) {
      k.at_top += 1;
      if (over) k.over_at_top += 1;
    }
    check_infeasible(name, k, *target, now_s);
    const bool median_due = k.samples % options_.median_every == 0 && k.recent.size() >= options_.median_samples;
    const std::optional<double> median_bound = median_due ? median_bound_s(k) : std::nullopt;
    const std::optional<double> median = median_bound ? k.recent.quantile(0.5) : std::nullopt;
    const std::optional<double> above = median ? median_at(k, step_ + 1, now_s) : std::nullopt;
    const bool unhelped = median && *median > *median_bound && above && *above >= options_.median_gain * *median;
    const bool median_over = median && *median > *median_bound && !unhelped;
    if (median) note_median(name, k, unhelped, *median, *median_bound, above);
    if (settle_left_ > 0) {
      settle_left_ -= 1;
    } else if (k.budget < 0.0) {
      if (!undo_change(name, now_s)) {
        const std::optional<int> to = step_that_may_help(k, *target, now_s);
        if (to) {
          climb(std::max(*to - step_, severe ? 2 : 1), now_s);
        } else if (step_ < static_cast<int>(ladder_.size()) - 1) {
          climb_unhelpful_ = true;  // stays: maybe_descend may find a lower step as good
        }
      }
    } else if (median_over) {
      if (!undo_change(name, now_s) && climb(1, now_s)) median_climbs_ += 1;
    }
  }
  update_probe(now_s);
  maybe_descend(now_s);
  maybe_open_gate(now_s);
  maybe_release(now_s);
}

void LatencyController::tick(double now_s) {
  if (started_ && !trial_.empty() && now_s - last_sample_s_ > options_.idle_s) {
    best_effort_[trial_].released = false;  // LC work stopped: the try proved nothing
    trial_.clear();
    release_changes_ += 1;
  }
  if (started_ && now_s - last_sample_s_ > options_.idle_s) end_gate_try_unjudged();  // likewise
  if (started_ && step_ > 0 && now_s - last_sample_s_ > options_.idle_s) {
    move_to(0, now_s);
    step_since_s_ = now_s;
    samples_at_step_ = 0;
    settle_left_ = 0;
    for (auto& [name, k] : kinds_) k.recent.clear();
  }
  update_probe(now_s);
  maybe_descend(now_s);
}

bool LatencyController::climb(int steps, double now_s) {
  const int top = static_cast<int>(ladder_.size()) - 1;
  const int from = step_;
  // Climbing back from a step just descended to: back to the step it came from, which held
  // (however late the job that undid the try), and that step waits longer next time.
  const bool undo = from == last_descent_to_ && now_s - last_descent_s_ < options_.undo_s;
  const int to = std::min(top, step_ + (undo ? 1 : steps));
  if (to == from) return false;
  move_to(to, now_s);
  climbs_ += 1;
  if (undo) {
    backoff_[static_cast<std::size_t>(from)] = std::min(backoff_[static_cast<std::size_t>(from)] + 1,
                                                        static_cast<int>(std::log2(options_.max_backoff)));
    last_descent_to_ = -1;
  }
  refill(now_s);
  return true;
}

void LatencyController::refill(double now_s) {
  step_since_s_ = now_s;
  samples_at_step_ = 0;
  settle_left_ = options_.settle_samples;
  for (auto& [name, k] : kinds_) {
    k.budget = options_.budget_cap;
    k.recent.clear();
  }
}

void LatencyController::note_best_effort(const std::string& name, double now_s) {
  best_effort_[name].last_s = now_s;
}

bool LatencyController::released(const std::string& name) const {
  const auto it = best_effort_.find(name);
  return ceiling_ >= 0 && it != best_effort_.end() && it->second.released;
}

const ControlStep& LatencyController::released_settings() const {
  return ladder_[static_cast<std::size_t>(std::min(step_, std::max(ceiling_, 0)))];
}

bool LatencyController::settled_within_targets(double now_s) const {
  if (samples_at_step_ < options_.loosen_samples || now_s - step_since_s_ < options_.loosen_s) return false;
  bool any = false;
  for (const auto& [name, k] : kinds_) {
    if (now_s - k.last_s > options_.idle_s || k.recent.count() == 0) continue;  // not active
    const std::optional<double> target = target_s(k);
    const std::optional<double> p99 = k.recent.quantile(0.99);
    if (!target || !p99 || *p99 > *target || k.budget < options_.loosen_budget) return false;
    any = true;
  }
  return any;
}

void LatencyController::maybe_release(double now_s) {
  if (ceiling_ < 0 || probing_ || !gate_trial_.empty()) return;
  if (!trial_.empty()) {
    if (now_s - trial_since_s_ >= options_.release_trial_s && trial_samples_ >= options_.release_trial_samples) {
      BestEffortKind& b = best_effort_[trial_];  // the try held: the kind stays released
      b.doublings = std::max(0, b.doublings - 1);
      releases_.push_back(trial_);
      trial_.clear();
    }
    return;
  }
  if (step_ <= ceiling_ || settle_left_ > 0 || !settled_within_targets(now_s)) return;
  std::string pick;
  for (const auto& [name, b] : best_effort_) {
    if (b.released || now_s - b.last_s > options_.idle_s || b.next_try_s > now_s) continue;
    if (pick.empty() || b.next_try_s < best_effort_[pick].next_try_s) pick = name;
  }
  if (pick.empty()) return;
  BestEffortKind& b = best_effort_[pick];
  b.released = true;
  b.trials += 1;
  release_changes_ += 1;
  trial_ = pick;
  trial_since_s_ = now_s;
  trial_samples_ = 0;
}

bool LatencyController::closes_gate(const std::string& name) const {
  const auto it = kinds_.find(name);
  return it == kinds_.end() || !it->second.gate_open;
}

std::optional<bool> LatencyController::gate_worse(const Kind& k, double now_s) const {
  const std::optional<double> target = target_s(k);
  if (!target) return std::nullopt;
  const Kind::AtStep& at = k.at_steps[static_cast<std::size_t>(step_)];
  if (at.recent.size() < options_.record_jobs || at.open.size() < kGateJudgedJobs ||
      now_s - at.open_last_s > options_.step_memory_s) {
    return std::nullopt;
  }
  return lower(at.recent.excess(*target), at.open.excess(*target));
}

void LatencyController::maybe_open_gate(double now_s) {
  if (!options_.try_gates || probing_ || !trial_.empty()) return;
  if (!gate_trial_.empty()) {
    Kind& k = kinds_.at(gate_trial_);
    const std::optional<bool> worse = gate_worse(k, now_s);  // a try lasts until its record judges it
    if (!worse && now_s - trial_since_s_ > options_.gate_trial_limit_s) {
      close_gate_again(gate_trial_, now_s);  // too few of its jobs to judge it
    } else if (worse && now_s - trial_since_s_ >= options_.release_trial_s &&
               trial_samples_ >= options_.release_trial_samples) {
      if (*worse) {
        close_gate_again(gate_trial_, now_s);
      } else {  // the try held: its leases leave the gate open
        k.gate_doublings = std::max(0, k.gate_doublings - 1);
        gate_trial_.clear();
      }
    }
    return;
  }
  // At rest at a step with the yield. Not "within targets": a kind whose tail no step helps
  // (the controller stays, its budget spent) may be one the yield does not help either, and
  // each try is judged by the kind's own record, not by a budget that chance alone can spend.
  if (!yields() || settle_left_ > 0 || samples_at_step_ < options_.loosen_samples ||
      now_s - step_since_s_ < options_.loosen_s) {
    return;
  }
  std::string pick;
  for (const auto& [name, k] : kinds_) {
    const std::optional<double> target = target_s(k);
    if (k.gate_open || now_s - k.last_s > options_.idle_s || k.gate_next_try_s > now_s || !target ||
        !excess_at(k, step_, *target, now_s)) {
      continue;
    }
    if (pick.empty() || k.gate_next_try_s < kinds_.at(pick).gate_next_try_s) pick = name;
  }
  if (pick.empty()) return;
  Kind& k = kinds_.at(pick);
  k.gate_open = true;
  k.gate_trials += 1;
  k.at_steps[static_cast<std::size_t>(step_)].open.clear();  // no jobs of an earlier try
  gate_trial_ = pick;
  trial_since_s_ = now_s;
  trial_samples_ = 0;
}

bool LatencyController::undo_change(const std::string& spender, double now_s) {
  if (!trial_.empty()) return undo_release(now_s);
  return undo_gate(spender, now_s) || undo_release(now_s);
}

bool LatencyController::gate_costs_target(const Kind& k, double now_s) const {
  const Kind::AtStep& at = k.at_steps[static_cast<std::size_t>(step_)];
  if (at.open_tail.jobs < kTailJobs || at.closed_tail.jobs < kTailJobs || now_s - at.last_s > options_.step_memory_s) {
    return false;
  }
  const double allowed = 1.0 - options_.attainment;
  return at.open_tail.over > allowed * at.open_tail.jobs && at.closed_tail.over <= allowed * at.closed_tail.jobs;
}

bool LatencyController::undo_gate(const std::string& spender, double now_s) {
  const Kind& k = kinds_.at(spender);
  if (!yields() || !k.gate_open) return false;  // where nothing yields, the gate is not it
  const std::optional<bool> worse = gate_worse(k, now_s);
  if (!worse && spender == gate_trial_) return true;  // a try too young to judge: no climb before it is
  // Closed where its record says the gate was it, or has no say at this step (a step it came
  // to open), or its tail says so: closing the gate again costs BE work less than a climb.
  if (worse.value_or(true) || gate_costs_target(k, now_s)) {
    close_gate_again(spender, now_s);
    return true;
  }
  return false;
}

void LatencyController::close_gate_again(std::string name, double now_s) {
  if (name == gate_trial_) gate_trial_.clear();
  Kind& k = kinds_.at(name);
  k.gate_open = false;
  k.gate_failures += 1;
  k.gate_next_try_s = next_try_after_failure(k.gate_doublings, now_s);
  refill(now_s);
}

void LatencyController::end_gate_try_unjudged() {
  if (gate_trial_.empty()) return;
  kinds_.at(gate_trial_).gate_open = false;
  gate_trial_.clear();
}

double LatencyController::next_try_after_failure(int& doublings, double now_s) const {
  doublings = std::min(doublings + 1, options_.max_release_doublings);
  return now_s + options_.release_wait_s * static_cast<double>(1 << doublings);
}

bool LatencyController::holds_any(double now_s) const {
  for (const auto& [name, b] : best_effort_) {
    if (!b.released && now_s - b.last_s <= options_.idle_s) return true;
  }
  return false;
}

bool LatencyController::undo_release(double now_s) {
  std::string name;
  if (!trial_.empty()) {
    name = trial_;
    trial_.clear();
  } else if (!releases_.empty() && (step_ == static_cast<int>(ladder_.size()) - 1 ||
                                     (step_ >= ceiling_ && !holds_any(now_s)))) {
    name = releases_.back();  // a climb would hold back nothing that runs: the latest release may be it
    releases_.pop_back();
  } else {
    return false;
  }
  BestEffortKind& b = best_effort_[name];
  b.released = false;
  b.failures += 1;
  release_changes_ += 1;
  b.next_try_s = next_try_after_failure(b.doublings, now_s);
  refill(now_s);
  return true;
}

std::vector<BestEffortControl> LatencyController::best_effort_kinds() const {
  std::vector<BestEffortControl> out;
  for (const auto& [name, b] : best_effort_) {
    out.push_back(BestEffortControl{name, b.released, name == trial_, b.trials, b.failures});
  }
  return out;
}

bool LatencyController::on_record(const Kind::AtStep& at, double now_s) const {
  return at.recent.size() >= options_.record_jobs && now_s - at.last_s <= options_.step_memory_s;
}

bool LatencyController::met_at_some_step(const Kind& k, double target, double now_s) const {
  for (const Kind::AtStep& at : k.at_steps) {
    if (!on_record(at, now_s)) continue;
    const std::optional<double> q = at.recent.quantile(options_.attainment);
    if (q && *q <= target) return true;
  }
  return false;
}

void LatencyController::check_infeasible(const std::string& name, Kind& k, double target, double now_s) {
  if (k.infeasible) return;
  std::ostringstream reason;
  reason.precision(3);
  const std::optional<double> alone = k.alone.count() >= kAloneSamplesToRefuse ? k.alone_p99_s : std::nullopt;
  const bool below_alone = k.target && k.target->p99_s && alone && *alone > target;
  if (below_alone) {
    reason << "latency target of kind '" << name << "' (p99 " << target * 1e3 << " ms) is below its p99 with no "
           << "best-effort work on the device (" << *alone * 1e3 << " ms): it cannot be met";
  } else if (k.at_top >= options_.infeasible_samples &&
             static_cast<double>(k.over_at_top) > 2.0 * (1.0 - options_.attainment) * static_cast<double>(k.at_top) &&
             !met_at_some_step(k, target, now_s)) {
    const bool at_top = step_ == static_cast<int>(ladder_.size()) - 1;
    reason << "latency target of kind '" << name << "' (p99 " << target * 1e3 << " ms) is not met even with "
           << "best-effort work held back as far as "
           << (at_top ? "the scheduler can" : "helps (every step above missed it too)") << " (" << k.over_at_top
           << " of " << k.at_top << " jobs so held over it, and no step on record met it";
    if (alone) reason << "; its p99 alone is " << *alone * 1e3 << " ms";
    reason << ")";
  } else {
    return;
  }
  k.infeasible = true;
  k.below_alone = below_alone;
  k.reason = reason.str();
  if (!k.reported) {
    k.reported = true;
    reports_.push_back(k.reason);
  }
}

void LatencyController::withdraw_stale_report(Kind& k, double target) {
  if (k.judged_target_s == 0.0) {
    k.judged_target_s = target;
    return;
  }
  const bool rose = target > (1.0 + kReportTargetMove) * k.judged_target_s;
  const bool fell = target < k.judged_target_s / (1.0 + kReportTargetMove);
  const bool now_above_alone =
      k.below_alone && k.alone_p99_s && (1.0 + kReportTargetMove) * *k.alone_p99_s <= target;
  const bool stale = rose || now_above_alone;
  if (!stale && !fell) return;
  k.judged_target_s = target;
  if (rose || fell) {  // tails judged against a target this far off say little of this one
    for (Kind::AtStep& at : k.at_steps) at.closed_tail = at.open_tail = Kind::TailCount{};
  }
  // A target missed while it was looser is missed still: a fall keeps a report, and restarts
  // only a count toward one (its jobs were judged against the looser target).
  if (!stale && k.infeasible) return;
  k.at_top = k.over_at_top = 0;
  if (!k.infeasible) return;
  // Not yet taken reports of it go too; a warning already given stays given.
  reports_.erase(std::remove(reports_.begin(), reports_.end(), k.reason), reports_.end());
  k.infeasible = k.below_alone = k.reported = false;
  k.reason.clear();
}

void LatencyController::note_median(const std::string& name, Kind& k, bool unhelped, double median, double bound,
                                    std::optional<double> above) {
  k.median_unhelped = unhelped ? k.median_unhelped + options_.median_every : 0;
  if (k.median_reported || k.median_unhelped < options_.infeasible_samples) return;
  k.median_reported = true;
  std::ostringstream reason;
  reason.precision(3);
  reason << "median of kind '" << name << "' (" << median * 1e3 << " ms) is over its bound (" << bound * 1e3
         << " ms: " << options_.median_ratio << "x its median alone) and holding best-effort work back further "
         << "does not lower it (" << *above * 1e3 << " ms at the step above): the bound is not enforced";
  reports_.push_back(reason.str());
}

void LatencyController::maybe_descend(double now_s) {
  if (step_ == 0 || settle_left_ > 0 || trying()) return;
  // A step down that held for undo_s was right: its wait shrinks again.
  if (last_descent_to_ == step_ && now_s - last_descent_s_ >= options_.undo_s) {
    int& b = backoff_[static_cast<std::size_t>(step_)];
    b = std::max(0, b - 1);
    last_descent_to_ = -1;
  }
  const int doubling = 1 << backoff_[static_cast<std::size_t>(step_ - 1)];
  const double dwell_s = now_s - step_since_s_;
  const bool may_loosen = samples_at_step_ >= options_.loosen_samples * static_cast<std::size_t>(doubling) &&
                          dwell_s >= options_.loosen_s * doubling;
  const bool may_explore = samples_at_step_ >= options_.explore_samples * static_cast<std::size_t>(doubling) &&
                           dwell_s >= options_.explore_s * doubling;
  if (!may_loosen && !may_explore) return;
  // Every active kind must be within its target and median bound, with slack to loosen, or
  // without it (a step higher up may protect it no better than this one) to explore; or, to
  // loosen, the step below must be on record as no worse for every kind, or have no record.
  const double margin = may_explore ? 1.0 : options_.slack;
  bool any = false, within = true;
  for (const auto& [name, k] : kinds_) {
    if (now_s - k.last_s > options_.idle_s || k.recent.count() == 0) continue;  // not active
    const std::optional<double> target = target_s(k);
    if (!target) return;  // no judgement of this kind yet: stay
    const std::optional<double> p99 = k.recent.quantile(0.99);
    if (k.budget < options_.loosen_budget || !p99 || *p99 > margin * *target) within = false;
    const std::optional<double> median_bound = median_bound_s(k);
    const std::optional<double> median = k.recent.quantile(0.5);
    if (within && median_bound && *median > margin * *median_bound) {
      const std::optional<double> below = median_at(k, step_ - 1, now_s);
      if (!below || *below * options_.median_gain > *median) within = false;  // the step below may be worse for it
    }
    if (!within) break;
    any = true;
  }
  if (!within && !(may_loosen && below_no_worse(now_s))) return;
  if (within && !any) return;
  move_to(step_ - 1, now_s);
  descents_ += 1;
  if (!within) {  // judged by its record, not by a budget the step above spent
    unhelpful_descents_ += 1;
    trying_below_ = true;
    refill(now_s);
  }
  last_descent_to_ = step_;
  last_descent_s_ = now_s;
  step_since_s_ = now_s;
  samples_at_step_ = 0;
  for (auto& [name, k] : kinds_) k.recent.clear();
}

void LatencyController::move_to(int step, double now_s) {
  climb_unhelpful_ = trying_below_ = false;
  end_gate_try_unjudged();  // its record is the step's
  if (started_) step_seconds_[static_cast<std::size_t>(step_)] += now_s - step_entered_s_;
  step_entered_s_ = now_s;
  step_ = step;
}

std::vector<double> LatencyController::seconds_at_steps(double now_s) const {
  std::vector<double> out = step_seconds_;
  if (started_) out[static_cast<std::size_t>(step_)] += std::max(0.0, now_s - step_entered_s_);
  return out;
}

void LatencyController::update_probe(double now_s) {
  // Every active kind needs its alone latency: a relative target is built on it, an absolute
  // one is checked against it (and stats report it). Without enough alone samples for a
  // target, probes come every probe_interval_s; with them but not yet settled, rarer.
  bool needed = false, settling = false;
  for (const auto& [name, k] : kinds_) {
    if (now_s - k.last_s > options_.idle_s) continue;
    if (k.alone.count() < options_.min_alone_samples) needed = true;
    if (k.alone.count() < options_.settled_alone_samples) settling = true;
  }
  const double interval = needed ? options_.probe_interval_s : options_.settling_probe_interval_s;
  if (probing_) {
    if (!settling || now_s - probe_started_s_ >= options_.probe_window_s) {
      probing_ = false;
      last_probe_s_ = now_s;
    }
  } else if (settling && (probes_ == 0 || now_s - last_probe_s_ >= interval)) {
    probing_ = true;
    probes_ += 1;
    probe_started_s_ = now_s;
  }
}

std::vector<KindControl> LatencyController::kinds() const {
  std::vector<KindControl> out;
  for (const auto& [name, k] : kinds_) {
    KindControl c;
    c.kind = name;
    c.target_s = target_s(k);
    c.alone_p99_s = k.alone_p99_s;
    c.recent_p99_s = k.recent.quantile(0.99);
    c.alone_p50_s = k.alone_p50_s;
    c.recent_p50_s = k.recent.quantile(0.5);
    c.samples = k.samples;
    c.judged = k.judged;
    c.within_target = k.within;
    c.alone_samples = k.alone.count();
    c.budget = k.budget;
    c.infeasible = k.infeasible;
    c.infeasible_reason = k.reason;
    c.median_unhelped = k.median_reported && k.median_unhelped > 0;
    c.closes_gate = !k.gate_open;
    c.gate_on_trial = name == gate_trial_;
    c.gate_trials = k.gate_trials;
    c.gate_failures = k.gate_failures;
    for (const Kind::AtStep& at : k.at_steps) {
      c.steps.push_back(StepLatency{at.jobs, at.over, at.unsettled, at.recent.quantile(0.5), at.recent.quantile(0.99),
                                    at.closed_tail.jobs, at.closed_tail.over, at.open_tail.jobs, at.open_tail.over});
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<std::string> LatencyController::take_reports() {
  std::vector<std::string> out;
  out.swap(reports_);
  return out;
}

}  // namespace octopus::scheduler

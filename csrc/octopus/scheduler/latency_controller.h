// The latency controller of one device: from the latencies latency-critical (LC) work sees,
// it chooses how hard best-effort (BE) work is held back, so that every LC kind stays within
// its latency target while BE work keeps as much of the device as the targets allow.
//
// The decision is one step on a ladder of BE settings ordered from the most permissive (BE
// work in whole units, two in flight, every SM, never paused) to the most protective (SMs
// kept free of BE work, short slices, one in flight, BE paused while LC work is held or
// waiting). The controller climbs when an LC kind has spent its error budget (a p99 target
// allows 1% of its jobs over it) and steps down when it has slack, or, less often, to explore
// whether a lower step is enough; a step down that had to be undone is retried only after a
// wait that doubles each time (so it settles instead of oscillating). Targets are absolute, or a
// ratio of the kind's own p99 measured while no BE work ran on the device (its "alone"
// latency). Until a kind has enough alone samples the controller asks for a probe (BE
// paused and drained for a short window, at most one per probe_interval_s), then for
// rarer ones until its alone p99 rests on more samples.
//
// Best-effort kinds are held alike, except one kind at a time may be *released*: the steps
// above the last that only keeps SMs free (the partition ceiling) hold best-effort work in
// time (slices, pausing), which is what memory-bound BE work needs and compute-bound BE work
// does not (a partition protects latency-critical kernels from the latter: benchmarks/
// README.md#contention). Above the ceiling, once the LC kinds are within their targets, the
// controller tries one unreleased BE kind at the ceiling's settings instead; a try that
// spends an error budget is undone at once (no climb), and that kind waits longer before its
// next try (doubling); one that holds for release_trial_s keeps the kind released. A spent
// budget where a climb would hold back nothing more of what runs (at the top step, or every
// active BE kind released) holds the latest released kind again instead.
//
// Likewise each LC kind's leases make octopus's BE kernels step aside on the device (the yield
// gate, at the steps that have device_yield) until the controller finds that kind does not
// need it: the gate is what a memory-bound BE job pays most for (its rate falls by the LC
// work's share of device time), and it protects only LC kinds that memory-bound BE work slows
// (a batch-1 MLP graph beside a ragged op: yes; a small eager ragged op: no, it did no worse
// without; benchmarks/README.md#contention). Another kind's leases close the gate for their
// own work, so leaving it open for one kind concerns mostly that kind's latency, and each try
// is judged by that kind's record (another kind's spent budget climbs as ever): at rest at a
// step with the yield (within targets or not: a kind whose tail no step helps may be one the
// gate does not help either), the controller leaves one LC kind's gate open for a try (one try
// of a gate or a release at a time; at least as long as a release's, until the kind has
// kGateJudgedJobs jobs with the gate open, at most gate_trial_limit_s; the same doubling waits
// after a failed one), its jobs there (by their leases' grants) recorded apart; the gate stays
// open unless that record is worse than the step's record with the gate closed
// (ControllerOptions::record_margin, record_confidence). Outside a release try, a kind whose
// gate is open and spends its budget has it closed again, with no climb, where its record at
// the step says the gate was it or has no say there (no recent jobs with the gate open at the
// step), or where its tail there, over hundreds of jobs each way, meets its target with the
// gate closed and misses it open (gate_costs_target: what records holding a few late jobs
// cannot tell); a try too young to judge spends no budget on a climb either; a change of step
// ends a try unjudged.
//
// A higher step is not taken to protect better: each kind's record at each step keeps a spent
// budget from climbing where the step above did no better (or, where the step's own record
// plainly misses the target, makes it climb to the first step further up with no record), and
// takes the controller down from a step over target where the step below did no worse
// (ControllerOptions::record_jobs). Where no step meets a target (the common case by the
// controller's own count on an H200), those records, a few late jobs each, tell neighbouring
// steps apart only by chance; each kind's tail at each step (its share of hundreds of jobs
// over the target) then takes it up to the step with the lowest tail where the step it is at
// is over that by more than chance, and keeps it from stepping down to a step so over it.
//
// Pure logic: plain values in, plain values out; no threads, clocks or devices (times are
// passed in). The scheduler's control loop (control_loop.h) feeds it and carries out what it
// decides.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "octopus/scheduler/config.h"
#include "octopus/scheduler/sample_window.h"

namespace octopus::scheduler {

// A slice length long enough to be a whole unit of most best-effort work (the slicing
// helpers cut work longer than it).
constexpr double kWholeSliceS = 20e-3;

// One step of the ladder: how BE work runs on the device.
struct ControlStep {
  double slice_budget_s = 0.0;  // device time of one BE slice (the slicing helpers size slices to it)
  int in_flight = 2;            // BE slices queued or running per holder at once
  int reserved_sms = 0;         // SMs kept free of BE work (0: BE may use every SM)
  ThrottleMode throttle = ThrottleMode::Off;  // when BE holders pause at checkpoints
  // octopus's ragged kernels on BE streams step aside on the device while LC work is there
  // (yield_gate.h): they stop at the next unit of work and resume once it has gone.
  bool device_yield = false;
};

// Whether two steps hold best-effort work back alike.
bool same_settings(const ControlStep& a, const ControlStep& b);

// The default ladder for a device of `multiprocessors` SMs whose BE partitions can leave
// `reserves` SMs free (empty where no partition can be made): a step per reserve, then time
// steps at the largest. With `device_yield`, every step yields or none does (a pinned
// setting, or a device without a gate), and steps left alike are merged.
std::vector<ControlStep> default_ladder(int multiprocessors, const std::vector<int>& reserves,
                                        std::optional<bool> device_yield = std::nullopt);

namespace detail {
// A kind's alone p99 from n alone samples is the sample that this many others exceed: the
// lower end of a one-sided 90% confidence interval of its true p99 (latency_controller.cpp).
std::size_t samples_above_alone_p99(std::size_t n);
}  // namespace detail

// A kind's latency target: an absolute p99, or a ratio of its alone p99.
struct LatencyTarget {
  std::optional<double> p99_s;
  double ratio = 1.5;
};

struct ControllerOptions {
  double default_ratio = 1.5;        // target of kinds without one: ratio x alone p99
  // Alone samples a relative target waits for, and a probe collects: the p99 of a few samples
  // is their maximum, nearer their median than their p99 (8 samples of a batch-1 conv net
  // gave half its p99 on an H200, and a 3x target below what it could meet).
  std::size_t min_alone_samples = 32;
  // A kind's first jobs are left out of its alone samples (they carry one-time costs: a CUDA
  // graph's upload, library heuristics, the allocator growing).
  std::size_t warmup_samples = 8;
  // Once a target stands on min_alone_samples, probes go on, rarer, until the kind has this
  // many alone samples (a p99 from more of them is nearer the kind's true one: the alone p99
  // is the lower end of a 90% confidence interval of it, of 200 samples their fifth largest).
  std::size_t settled_alone_samples = 200;
  double settling_probe_interval_s = 8.0;
  std::size_t alone_window = 512;
  std::size_t recent_window = 256;
  // Each kind has an error budget: a p99 target lets 1% of its jobs over it. A job within the
  // target earns 1 - attainment, one over it costs 1 (one over severe_ratio x the target costs
  // severe_cost), and the budget holds at most budget_cap. When a job leaves it below zero the
  // controller climbs a step (two where that job was severe). An isolated violation (a host
  // hiccup) is absorbed, violations above 1% of the jobs spend it, a burst spends it at once;
  // after a climb every kind's budget is full again.
  double attainment = 0.99;
  double budget_cap = 2.0;  // SchedulerConfig::latency_error_budget
  double severe_ratio = 2.0;
  double severe_cost = 2.0;
  // A kind with a relative target also keeps its median within median_ratio x its alone
  // median: its p99 target alone does not bound it (a heavy-tailed kind's alone p99 is
  // several times its median, so a 1.5x p99 target lets the median triple). Judged on the
  // recent samples, every median_every samples once median_samples are in.
  double median_ratio = 2.0;
  std::size_t median_samples = 32;
  std::size_t median_every = 16;
  // Holding BE work back further does not always lower a kind's median (an eager kind's
  // median may be its host's, not the device's). A median over its bound climbs only where the
  // step above has no record of that kind's median (jobs there in the last step_memory_s, at
  // least median_samples of them) below median_gain x the median now; and a median over its
  // bound does not keep the controller from stepping down to a step whose record is at most
  // 1 / median_gain x the median now. The records expire, so a changed workload is explored
  // again. A median over its bound that no step lowers, for infeasible_samples samples, is
  // reported (the bound is not enforced: holding BE work back does not help it).
  double median_gain = 0.95;
  double step_memory_s = 120.0;
  // Holding BE work back further does not always protect LC work better either: where an LC
  // kind's tail is its host's (a Python BE holder's slices take the GIL more often the shorter
  // they are), the top steps cost BE work everything and buy nothing. A step's record of a
  // kind is its jobs there (in the last step_memory_s, at least record_jobs of them). A spent
  // budget does not climb where the step above is on record as no better for that kind, but
  // where the step's own record plainly misses the target (so the step above's does too) it
  // climbs to the first step further up with no record, unless one on record as lower comes
  // first (several alike in a row may lie below one that helps; each is tried once a record
  // lifetime); and a step where some kind is over its target or short of budget steps down,
  // after loosen_samples and loosen_s (as a step down with slack, its waits doubling when
  // undone), where for every kind the step below is on record as no worse, or has no record
  // (it is tried). A record's measure is its jobs' mean excess over the target (mean of
  // max(0, latency / target - 1): the share over it and how far). A step's record is lower
  // than another's only by record_margin and by more than record_confidence standard errors
  // of the difference: a p99 target's record differs from step to step by a few late jobs,
  // which a host's noise alone makes; steps not lower by more than that count as equal, and
  // the lower one is kept.
  std::size_t record_jobs = 64;
  double record_margin = 0.9;
  double record_confidence = 2.0;
  // After a climb, this many samples of every kind must arrive before the next one (the
  // slices in flight at the old step still run).
  int settle_samples = 3;
  // A step down needs this many samples and seconds at the current step with every kind's
  // recent p99 under slack x its target and its budget at least loosen_budget.
  std::size_t loosen_samples = 100;
  double loosen_s = 0.5;
  double slack = 0.8;
  double loosen_budget = 1.5;
  // A step down also comes after explore_samples samples and explore_s seconds at a step
  // where every kind is within its target and median bound, slack or not: a higher step may
  // protect LC work no better than a lower one (past the SMs it needs, slicing and pausing
  // mostly take from BE work), so a controller that climbed past the step it needed, on a
  // burst or on a target set from its first alone samples, finds its way back. A try that
  // fails is undone by the error budget within a few jobs.
  std::size_t explore_samples = 400;
  double explore_s = 2.0;
  // A step down undone within undo_s doubles that step's waits, up to max_backoff times.
  double undo_s = 2.0;
  int max_backoff = 64;
  // Probing: at most one probe window of probe_window_s per probe_interval_s.
  double probe_window_s = 0.25;
  double probe_interval_s = 2.0;
  // Without LC samples for idle_s the controller returns to the bottom step.
  double idle_s = 2.0;
  // A kind that plainly misses its target over at least infeasible_samples samples at the top
  // step, or at a step where every step above is on record as plainly missing it too (over
  // twice the share the target allows: 1% of 200 jobs is two or three by chance, so a kind at
  // its target's edge would be reported a third of the time), and that no step's record shows
  // within it, is reported infeasible (until its target moves: withdraw_stale_report).
  std::size_t infeasible_samples = 200;
  // Whether kinds' gates are tried open at all (off: every LC lease closes the gate at the
  // steps with the yield; SchedulerConfig::device_yield pinned on).
  bool try_gates = true;
  // A try of leaving a kind's gate open that its record has not judged in this long (a kind
  // too rare to collect the jobs) ends with the gate closed, as a failed one.
  double gate_trial_limit_s = 30.0;
  // Releasing BE kinds (above): a try lasts release_trial_s and release_trial_samples LC
  // samples; a failed one makes that kind wait release_wait_s x 2^failures (at most
  // max_release_doublings doublings) before its next. A kind seen within idle_s is active.
  double release_trial_s = 2.0;
  std::size_t release_trial_samples = 200;
  double release_wait_s = 4.0;
  int max_release_doublings = 6;
};

// One kind's latencies while the controller held one step (BE work present; probes left out):
// what each step of the ladder bought it on this workload.
struct StepLatency {
  std::size_t jobs = 0;
  std::size_t over = 0;       // of them, over the target in force then
  std::size_t unsettled = 0;  // of them, not in the record: BE work of an earlier step was on the device
  std::optional<double> p50_s, p99_s;  // of its most recent settled jobs at the step, gate closed
  // Its settled jobs' tails at the step, gate closed and left open: jobs and of them over the
  // target (the older ones halved past 2 x LatencyController::kTailJobs; gate_costs_target).
  double closed_tail_jobs = 0.0, closed_tail_over = 0.0, open_tail_jobs = 0.0, open_tail_over = 0.0;
};

// What the controller knows of one kind, for stats and warnings.
struct KindControl {
  std::string kind;
  std::optional<double> target_s;   // unset: a relative target whose alone p99 is not known yet
  std::optional<double> alone_p99_s;
  std::optional<double> recent_p99_s;
  std::optional<double> alone_p50_s;
  std::optional<double> recent_p50_s;
  std::size_t samples = 0;
  std::size_t judged = 0;           // samples that arrived while the kind had a target
  std::size_t within_target = 0;    // of them, within the target in force then
  std::size_t alone_samples = 0;
  double budget = 0.0;              // its error budget (ControllerOptions::attainment)
  bool infeasible = false;
  std::string infeasible_reason;
  bool median_unhelped = false;     // its median is over its bound and no step lowers it
  bool closes_gate = true;          // its leases make BE kernels yield (at steps with device_yield)
  bool gate_on_trial = false;       // left open for a try that has not yet held
  int64_t gate_trials = 0;          // tries of leaving the gate open for it
  int64_t gate_failures = 0;        // of them undone, and later closings (its own budget spent)
  std::vector<StepLatency> steps;   // per step of the ladder
};

// What the controller knows of one best-effort kind, for stats.
struct BestEffortControl {
  std::string kind;
  bool released = false;   // held at most at the partition ceiling's settings
  bool on_trial = false;   // released for a try that has not yet held
  int64_t trials = 0;      // tries of releasing it
  int64_t failures = 0;    // of them, undone because an LC kind spent its budget
};

class LatencyController {
 public:
  LatencyController(ControllerOptions options, std::vector<ControlStep> ladder);

  // Sets a kind's target (absolute when p99_s is given, else ratio x alone p99).
  void set_target(const std::string& kind, LatencyTarget target);
  // One completed LC job of `kind` that took `latency_s` (from its request, or from its
  // arrival where the caller gave one); `alone` when no BE work ran on the device in that
  // time. `now_s` is any monotonic clock in seconds.
  // `settled` when the job ran wholly under the current step, with no BE work on the device
  // that an earlier step let in (work queued before a change runs as that step said: a
  // partition's streams, slices already cut): only such jobs enter the step's record, which
  // then judges the step, not the one before it. Every job counts against the error budget.
  // `gate_left_open`: whether the job's lease left the yield gate open because its kind's gate
  // was open (the scheduler knows it from the grant; unset: the kind's gate now, at a step
  // that yields).
  void observe(const std::string& kind, double latency_s, bool alone, double now_s, bool settled = true,
               std::optional<bool> gate_left_open = std::nullopt);
  // Time passing without samples (for going back to the bottom step when LC work stops and
  // for ending probes).
  void tick(double now_s);
  // A best-effort lease of `kind` was granted (its work may run from now).
  void note_best_effort(const std::string& kind, double now_s);
  // Whether BE work of `kind` runs at released_settings() instead of settings().
  bool released(const std::string& kind) const;
  // The settings of released BE kinds: the current step's, at most the partition ceiling's.
  const ControlStep& released_settings() const;
  // The last step that only keeps SMs free (-1: the ladder has none; nothing is released).
  int ceiling() const { return ceiling_; }
  std::vector<BestEffortControl> best_effort_kinds() const;
  // How many times a kind was released or held again (so that paused holders look again).
  int64_t release_changes() const { return release_changes_; }
  // Whether leases of LC kind `kind` close the yield gate (at steps with device_yield).
  bool closes_gate(const std::string& kind) const;

  int step() const { return step_; }
  const ControlStep& settings() const { return ladder_[static_cast<std::size_t>(step_)]; }
  const std::vector<ControlStep>& ladder() const { return ladder_; }
  // Whether BE work should be paused and drained now to measure some kind's alone latency.
  bool probing() const { return probing_; }
  // Kinds' state, in name order.
  std::vector<KindControl> kinds() const;
  // Infeasible reports not yet taken (each kind once per becoming infeasible).
  std::vector<std::string> take_reports();
  int64_t climbs() const { return climbs_; }
  // Of the climbs, those made because a kind's median passed its bound (the others: a spent
  // error budget).
  int64_t median_climbs() const { return median_climbs_; }
  int64_t descents() const { return descents_; }
  // Of the descents, those from a step where some kind was over its target (the step below
  // on record as no worse, or unrecorded).
  int64_t unhelpful_descents() const { return unhelpful_descents_; }
  int64_t probes() const { return probes_; }
  // Seconds spent at each step of the ladder until now_s (where the controller settles).
  std::vector<double> seconds_at_steps(double now_s) const;

 private:
  struct Kind {
    std::optional<LatencyTarget> target;  // unset: default_ratio
    detail::SampleWindow alone;
    // The alone p99 and median, recomputed as a sample joins `alone` (read at every sample).
    std::optional<double> alone_p99_s, alone_p50_s;
    detail::SampleWindow recent;
    double budget = 0.0;  // full when the kind is first seen, gets a target, and after every climb
    std::size_t samples = 0;
    std::size_t judged = 0;
    std::size_t within = 0;
    double last_s = -1e300;
    std::size_t at_top = 0;      // samples at the top step, or where no step above helps (until reported)
    std::size_t over_at_top = 0; // of them over target
    double judged_target_s = 0.0;  // the target they were judged against (0: none yet)
    bool infeasible = false;
    bool below_alone = false;  // reported as an absolute target below the alone p99
    std::string reason;
    bool reported = false;
    std::size_t median_unhelped = 0;  // samples since its median was over its bound with no step to help
    bool median_reported = false;
    // Of a kind's jobs at a step, how many and how many over its target then, both halved
    // each time they reach 2 x kTailJobs jobs, so that older jobs weigh less (a record of its
    // tail, where a window of kStepWindow jobs holds one or two over a p99 target).
    struct TailCount {
      double jobs = 0.0, over = 0.0;
      void add(bool is_over) {
        jobs += 1.0;
        over += is_over ? 1.0 : 0.0;
        if (jobs >= 2.0 * kTailJobs) {
          jobs /= 2.0;
          over /= 2.0;
        }
      }
      // The share over the target and its standard error (of a proportion; needs jobs > 0).
      detail::SampleWindow::Excess share() const {
        const double p = over / jobs;
        return {p, std::sqrt(p * (1.0 - p) / jobs)};
      }
    };
    struct AtStep {
      std::size_t jobs = 0, over = 0, unsettled = 0;
      double last_s = -1e300;  // when its last settled job completed (with the gate closed: `recent`'s)
      detail::SampleWindow recent;
      detail::SampleWindow open;  // its jobs with the gate left open (the gate's record)
      double open_last_s = -1e300;  // when the last of them completed
      TailCount closed_tail, open_tail;  // the settled jobs' tails, gate closed and left open
      explicit AtStep(std::size_t window) : recent(window), open(window) {}
    };
    std::vector<AtStep> at_steps;  // per step of the ladder
    // The yield gate (above): whether its leases leave it open, and its tries.
    bool gate_open = false;
    double gate_next_try_s = 0.0;
    int gate_doublings = 0;
    int64_t gate_trials = 0, gate_failures = 0;
    Kind(std::size_t alone_window, std::size_t recent_window, std::size_t steps)
        : alone(alone_window), recent(recent_window), at_steps(steps, AtStep(kStepWindow)) {}
  };
  static constexpr std::size_t kStepWindow = 128;  // jobs per kind and step kept for its percentiles
  // Of a kind's jobs with its gate open, at least this many judge it.
  static constexpr std::size_t kGateJudgedJobs = 16;
  // Jobs a TailCount weighs at least (and at most twice as many), with the gate closed and
  // open alike, before it says that the gate costs a kind its target (gate_costs_target).
  static constexpr double kTailJobs = 400.0;

  Kind& kind(const std::string& name);
  std::optional<double> target_s(const Kind& k) const;
  // The median bound of a kind with a relative target and enough alone samples (else none).
  std::optional<double> median_bound_s(const Kind& k) const;
  // The kind's median while the controller last held `step`, where that record is recent
  // and rests on enough jobs (else none).
  std::optional<double> median_at(const Kind& k, int step, double now_s) const;
  // Whether a step's record of a kind is recent (a job within step_memory_s) and rests on
  // record_jobs jobs: the records the controller compares steps by.
  bool on_record(const Kind::AtStep& at, double now_s) const;
  // The kind's mean excess over `target` (and its standard error) while the controller last
  // held `step`, where that step has a record of it (on_record; else none).
  std::optional<detail::SampleWindow::Excess> excess_at(const Kind& k, int step, double target, double now_s) const;
  // Whether record `a` is lower than record `b` by more than chance (record_margin, record_confidence).
  bool lower(const detail::SampleWindow::Excess& a, const detail::SampleWindow::Excess& b) const;
  // Where a spent budget climbs (at least; a severe job climbs two steps, an undone step down
  // one): the step above, unless it is on record as no better for the kind; then, where this
  // step's record plainly misses the target, the first step further up with no record, or
  // else the step with the kind's lowest tail if above and this step's tail is over it by more
  // than chance (tail_worse). Otherwise none: at the top; where this step's record does not
  // plainly miss; where a step further up is on record as lower before one with no record is
  // found (of several records compared, one is lower by chance); where this step's record is
  // not in yet after a step down.
  std::optional<int> step_that_may_help(const Kind& k, double target, double now_s) const;
  // A step's tail of the kind: the share of its settled jobs with the gate closed over the
  // target, and that share's standard error, where it weighs kTailJobs jobs or more and the
  // step held the kind within step_memory_s (else none). Records of kStepWindow jobs cannot
  // tell 2% of jobs over a p99 target from 6%; tails of kTailJobs can.
  std::optional<detail::SampleWindow::Excess> tail_at(const Kind& k, int step, double now_s) const;
  // Whether step a's tail of the kind is over step b's by more than chance (`lower`, the
  // records' test, on the two shares: a two-proportion test).
  bool tail_worse(const Kind& k, int a, int b, double now_s) const;
  // The step whose tail of the kind is lowest (the lowest such step where several tie; none
  // where no step has a tail on record).
  std::optional<int> best_tail_step(const Kind& k, double now_s) const;
  // Whether the kind's record at `step` plainly misses `target`: twice the share over it that
  // the target allows (a record of 128 jobs at a p99 target's edge has one or two over it by
  // chance).
  bool plainly_misses(const Kind& k, int step, double target) const;
  // Whether holding BE work back further is on record as no help to the kind: this step's
  // record plainly misses its target, and so does every step above, none on record as lower
  // (a step with no record may help).
  bool no_step_above_helps(const Kind& k, double target, double now_s) const;
  // Whether every active kind's record at the step below is no worse than here, or missing.
  bool below_no_worse(double now_s) const;
  // Climbs up to `steps` steps; false where it was at the top already.
  bool climb(int steps, double now_s);
  // Moves to `step`, adding the time at the step left to its account.
  void move_to(int step, double now_s);
  // Whether some step's record of the kind (on_record) has its attainment quantile within
  // `target`: the target can be met there.
  bool met_at_some_step(const Kind& k, double target, double now_s) const;
  // Reports the kind infeasible (once): a target below its alone p99, or one missed by over
  // twice the share it allows of at least infeasible_samples jobs at the top (or where no step
  // above helps) and met at no step on record.
  void check_infeasible(const std::string& name, Kind& k, double target, double now_s);
  // A report, and the count toward one, rest on what they were judged against: a relative
  // target that has since risen by over kReportTargetMove (its alone p99 measured again as
  // probes add samples), or an absolute target below an alone p99 that has since fallen that
  // far under it, drops both (a report not yet taken too), and the kind is judged afresh. A
  // target that fell as far restarts only the count (what was missed is missed still). A
  // target that rose or fell as far also drops the kind's tails at every step (tail_at).
  void withdraw_stale_report(Kind& k, double target);
  // Counts a judged median that is over its bound with no step to lower it; reports it once
  // it has stayed so for infeasible_samples samples.
  void note_median(const std::string& name, Kind& k, bool unhelped, double median, double bound,
                   std::optional<double> above);
  void maybe_descend(double now_s);
  void update_probe(double now_s);
  // Every active kind within its target with its budget at least loosen_budget, after
  // loosen_samples and loosen_s at the step (what a release try starts from).
  bool settled_within_targets(double now_s) const;
  // Starts, keeps or ends a release try.
  void maybe_release(double now_s);
  // Undoes the release try in progress, or the latest release where a climb would hold back
  // nothing more of what runs (at the top step, or every active BE kind released); false where
  // there was none to undo (then the controller climbs instead).
  bool undo_release(double now_s);
  // Starts, keeps or ends a try of leaving the gate open for an LC kind.
  void maybe_open_gate(double now_s);
  // Whether the kind's jobs at this step with its gate open (recent ones, kGateJudgedJobs of
  // them at least) are worse than with it closed (record_jobs of them, however old: that
  // record is not refreshed while the gate is open); unknown without both records.
  std::optional<bool> gate_worse(const Kind& k, double now_s) const;
  // Whether the kind, at this step, meets its target with its gate closed and misses it with
  // the gate open, by the tails of kTailJobs of each at least (the closed ones of the last
  // step_memory_s): a gap in the share over the target that the records' means, of
  // kStepWindow jobs, cannot see (1% of them over against 2%).
  bool gate_costs_target(const Kind& k, double now_s) const;
  // Closes `spender`'s open gate where its record at the step says it spent the budget or
  // has no say, or the gate costs it its target there (true); true too while its try is too
  // young to judge; false where its record says the gate was not it (then a release is undone
  // or the controller climbs).
  bool undo_gate(const std::string& spender, double now_s);
  // Ends a gate try under way without judging it (no failure): the kind's gate closes.
  void end_gate_try_unjudged();
  // After a failed try (of a release or a gate): one more doubling, and when the next may come.
  double next_try_after_failure(int& doublings, double now_s) const;
  // Closes a kind's gate again: a failure, and a longer wait before its next try.
  void close_gate_again(std::string name, double now_s);  // by value: it may be gate_trial_
  // After a spent budget, undoes what most likely spent it: a release try under way, else the
  // spender's open gate (undo_gate), else a release (undo_release); false where none (then it
  // climbs).
  bool undo_change(const std::string& spender, double now_s);
  // Whether any BE work yields at the current step (else the gate changes nothing).
  bool yields() const { return settings().device_yield || released_settings().device_yield; }
  // Whether a release or gate try is under way.
  bool trying() const { return !trial_.empty() || !gate_trial_.empty(); }
  // Whether an active BE kind is not released (the steps above the ceiling hold it back).
  bool holds_any(double now_s) const;
  // After a climb, an undone release or a gate closed again: every budget full, and
  // settle_samples to come.
  void refill(double now_s);

  struct BestEffortKind {
    bool released = false;
    double last_s = -1e300;
    double next_try_s = 0.0;
    int doublings = 0;
    int64_t trials = 0, failures = 0;
  };

  ControllerOptions options_;
  std::vector<ControlStep> ladder_;
  std::map<std::string, Kind> kinds_;
  int step_ = 0;
  bool climb_unhelpful_ = false;  // a spent budget did not climb: the step above is no better
  bool trying_below_ = false;     // came down from a step over target: climbs wait for this step's record
  double step_since_s_ = 0.0;
  std::size_t samples_at_step_ = 0;
  int settle_left_ = 0;
  std::vector<int> backoff_;       // per step: how many times the wait to descend to it is doubled
  int last_descent_to_ = -1;       // the step last descended to, and when
  double last_descent_s_ = -1e300;
  double last_sample_s_ = -1e300;
  bool probing_ = false;
  double probe_started_s_ = -1e300;
  double last_probe_s_ = -1e300;
  int64_t probes_ = 0;
  std::vector<std::string> reports_;
  int64_t climbs_ = 0;
  int64_t median_climbs_ = 0;
  int64_t descents_ = 0;
  int64_t unhelpful_descents_ = 0;
  std::map<std::string, BestEffortKind> best_effort_;
  int ceiling_ = -1;
  std::string trial_;               // the BE kind on trial ("" none)
  std::string gate_trial_;          // the LC kind whose gate try is under way ("" none)
  double trial_since_s_ = 0.0;      // of the try under way (release or gate)
  std::size_t trial_samples_ = 0;
  std::vector<std::string> releases_;  // released kinds whose try held, oldest first
  int64_t release_changes_ = 0;
  std::vector<double> step_seconds_;  // per step: seconds spent there before the current stay
  double step_entered_s_ = 0.0;       // when the current step was entered
  bool started_ = false;
};

}  // namespace octopus::scheduler

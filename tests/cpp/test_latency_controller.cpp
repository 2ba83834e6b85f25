// The latency controller against a scripted device: latency-critical (LC) latencies that
// shrink as best-effort (BE) work is held back further up the ladder, with noise. No
// threads, no clock: every sample is fed with its own time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "octopus/scheduler/latency_controller.h"

namespace octopus::scheduler {
namespace {

constexpr double kAlone = 1e-3;   // the LC job alone: 1 ms, +-5%
constexpr double kPeriod = 2e-3;  // one LC job every 2 ms

// A device where LC latency at step s is kAlone * slowdown[s] (+-5% noise), with BE work
// present; `alone` samples (during a probe) are kAlone (+-5%).
struct ScriptedDevice {
  std::vector<double> slowdown;
  std::mt19937 rng{7};
  std::uniform_real_distribution<double> noise{0.95, 1.05};
  double now = 0.0;

  double latency(int step) { return kAlone * slowdown[static_cast<std::size_t>(step)] * noise(rng); }

  // Feeds `n` samples of kind "lc"; returns the steps the controller was at after each.
  std::vector<int> run(LatencyController& c, int n, const std::function<double(int)>& override = nullptr) {
    std::vector<int> steps;
    for (int i = 0; i < n; ++i) {
      now += kPeriod;
      const bool probe = c.probing();
      const double l = probe ? kAlone * noise(rng) : (override ? override(c.step()) : latency(c.step()));
      c.observe("lc", l, probe, now);
      steps.push_back(c.step());
    }
    return steps;
  }
};

std::vector<ControlStep> ladder_of(std::size_t n) {
  std::vector<ControlStep> ladder(n);
  for (std::size_t i = 0; i < n; ++i) ladder[i].slice_budget_s = 8e-3 / static_cast<double>(1 << i);
  return ladder;
}

// The entry of `entries` (kinds' or best-effort kinds' controls) for kind `name`; a default one
// where there is none.
template <class Control>
Control named(const std::vector<Control>& entries, const std::string& name) {
  for (const Control& e : entries) {
    if (e.kind == name) return e;
  }
  return Control{};
}

// Steps changed within `steps`.
int changes(const std::vector<int>& steps) {
  int n = 0;
  for (std::size_t i = 1; i < steps.size(); ++i) n += steps[i] != steps[i - 1];
  return n;
}

TEST(LatencyController, ClimbsToTheFirstStepThatMeetsTheTargetAndStaysThere) {
  // Target 1.5 x alone p99 (~1.05 ms) = ~1.575 ms. Step 3 gives up to 1.68 ms: too much;
  // step 4 up to 1.37 ms: within, but without the slack (0.8 x target = 1.26 ms) to go down.
  ScriptedDevice device{{3.0, 2.5, 2.0, 1.6, 1.3, 1.1, 1.05, 1.0, 1.0}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  device.run(c, 3000);
  EXPECT_EQ(c.step(), 4);
  const std::vector<int> after = device.run(c, 20000);
  EXPECT_LE(changes(after), 6) << "it should settle, not oscillate";
  int at_four = 0;
  for (const int s : after) at_four += s == 4;
  EXPECT_GT(at_four, 19000);
  // The time at each step adds up to the time since the first sample, most of it at step 4.
  const std::vector<double> seconds = c.seconds_at_steps(device.now);
  ASSERT_EQ(seconds.size(), 9u);
  double total = 0.0;
  for (const double t : seconds) total += t;
  EXPECT_NEAR(total, device.now - kPeriod, 1e-9);
  EXPECT_GT(seconds[4], 0.95 * 20000 * kPeriod);
  EXPECT_EQ(c.median_climbs(), 0) << "the p99 passes the target long before the median its bound";
  const KindControl k = c.kinds().front();
  ASSERT_TRUE(k.target_s && k.alone_p99_s);
  EXPECT_NEAR(*k.target_s / *k.alone_p99_s, 1.5, 1e-9);
  EXPECT_GT(static_cast<double>(k.within_target) / static_cast<double>(k.judged), 0.99);
  EXPECT_FALSE(k.infeasible);
}

TEST(LatencyController, StepsDownWhenTheLoadLeavesSlack) {
  ScriptedDevice device{{3.0, 2.5, 2.0, 1.6, 1.3, 1.1, 1.05, 1.0, 1.0}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  device.run(c, 3000);
  ASSERT_EQ(c.step(), 4);
  // The BE work shrinks: every step now gives at most 1.1 ms (under the slack).
  device.slowdown = {1.05, 1.05, 1.05, 1.05, 1.05, 1.05, 1.05, 1.0, 1.0};
  const std::vector<int> steps = device.run(c, 5000);
  EXPECT_EQ(c.step(), 0);
  // One step at a time, each after at least loosen_samples samples at the step above.
  for (std::size_t i = 1; i < steps.size(); ++i) EXPECT_GE(steps[i], steps[i - 1] - 1);
  EXPECT_GE(c.descents(), 4);
}

TEST(LatencyController, FindsItsWayBackDownFromStepsThatProtectNoBetter) {
  // Steps 2 and up all give ~1.3 ms (within the ~1.575 ms target, not under its slack of
  // 1.26 ms): past step 2, holding BE work back further buys the LC kind nothing. A burst
  // drives the controller to step 6; once it ends, it explores its way back down to step 2
  // and stays there, its tries of step 1 rarer and rarer, each undone by a job over twice the
  // target (4 ms) that takes it back to step 2, not two steps up.
  ScriptedDevice device{{3.0, 4.0, 1.3, 1.3, 1.3, 1.3, 1.3, 1.3, 1.3}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  device.run(c, 3000);
  ASSERT_EQ(c.step(), 2);
  device.run(c, 30, [](int step) { return step < 6 ? 4e-3 : 1.3e-3; });
  ASSERT_EQ(c.step(), 6);
  const ControllerOptions o{};
  // Four steps down, each after explore_s (the first tries of each step): within 10 s.
  const std::vector<int> back = device.run(c, static_cast<int>(4 * 1.25 * o.explore_s / kPeriod));
  EXPECT_EQ(back.back(), 2);
  for (std::size_t i = 1; i < back.size(); ++i) EXPECT_GE(back[i], back[i - 1] - 1) << "one step at a time";
  const std::vector<int> later = device.run(c, 30000);
  EXPECT_GT(std::count(later.begin(), later.end(), 2), 29800);
  EXPECT_LE(changes(later), 14) << "tries of step 1 every 2 s, 4 s, 8 s, ...";
  const KindControl k = c.kinds().front();
  EXPECT_GT(static_cast<double>(k.within_target) / static_cast<double>(k.judged), 0.99);
  // What each step bought the kind, as stats() reports it: probes' alone jobs left out.
  ASSERT_EQ(k.steps.size(), 9u);
  std::size_t jobs = 0;
  for (const StepLatency& at : k.steps) jobs += at.jobs;
  EXPECT_LE(jobs + k.alone_samples, k.samples);
  EXPECT_GE(jobs + k.alone_samples + o.warmup_samples, k.samples) << "(the first jobs' alone ones are warm-up)";
  EXPECT_GT(k.steps[2].jobs, 30000u);
  for (const int step : {2, 6}) {
    ASSERT_TRUE(k.steps[static_cast<std::size_t>(step)].p50_s) << step;
    EXPECT_NEAR(*k.steps[static_cast<std::size_t>(step)].p50_s, 1.3e-3, 0.07e-3) << step;
  }
  ASSERT_TRUE(k.steps[1].p50_s);
  EXPECT_NEAR(*k.steps[1].p50_s, 4e-3, 0.2e-3) << "the tries of step 1 were all over the target";
  EXPECT_EQ(k.steps[1].over, k.steps[1].jobs);
  EXPECT_EQ(k.steps[7].jobs, 0u);
  EXPECT_FALSE(k.steps[7].p50_s);
}

TEST(LatencyController, ReactsToABurstWithinItsStatedTime) {
  ScriptedDevice device{{3.0, 2.5, 2.0, 1.6, 1.3, 1.1, 1.05, 1.0, 1.0}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  device.run(c, 3000);
  ASSERT_EQ(c.step(), 4);
  // A burst: at steps below 6 the LC job now takes 4 x its alone time (over 2 x the target:
  // "severe", each costs severe_cost of the budget); with the budget full, the sample that
  // takes it below zero climbs two steps at once.
  const ControllerOptions o{};
  const auto severe_to_climb = static_cast<std::size_t>(std::floor(o.budget_cap / o.severe_cost)) + 1;
  device.slowdown = {5.0, 5.0, 5.0, 5.0, 4.0, 4.0, 1.2, 1.0, 1.0};
  const std::vector<int> steps = device.run(c, 50);
  for (std::size_t i = 0; i + 1 < severe_to_climb; ++i) EXPECT_EQ(steps[i], 4) << "absorbed by a full budget";
  EXPECT_EQ(steps[severe_to_climb - 1], 6) << "the sample that spends the budget climbs two steps";
  EXPECT_EQ(steps.back(), 6);
  // A milder burst (1.2 x target): the violation that takes the budget below zero climbs.
  const auto mild_to_climb = static_cast<std::size_t>(std::floor(o.budget_cap)) + 1;
  ScriptedDevice mild{{3.0, 2.5, 2.0, 1.6, 1.3, 1.1, 1.05, 1.0, 1.0}};
  LatencyController m(ControllerOptions{}, ladder_of(9));
  mild.run(m, 3000);
  ASSERT_EQ(m.step(), 4);
  mild.slowdown = {3.0, 3.0, 3.0, 3.0, 1.8, 1.3, 1.05, 1.0, 1.0};
  const std::vector<int> mild_steps = mild.run(m, 20);
  EXPECT_EQ(mild_steps[mild_to_climb - 2], 4);
  EXPECT_EQ(mild_steps[mild_to_climb - 1], 5) << "the violation that spends the budget climbs";
}

TEST(LatencyController, AStepWhoseViolationsStayUnderOnePercentKeepsItsPlace) {
  // Step 2 is within the target but for 0.5% of its jobs (1.7 ms against ~1.575 ms): its
  // p99 is met, so the controller stays there instead of climbing at every pair of
  // violations close together.
  LatencyController c(ControllerOptions{}, ladder_of(9));
  ScriptedDevice device{{3.0, 2.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}};
  std::bernoulli_distribution spike(0.005);
  const auto latency = [&](int step) {
    if (step != 2) return device.latency(step);
    return spike(device.rng) ? 1.7e-3 : 1.2e-3 * device.noise(device.rng);
  };
  device.run(c, 3000, latency);
  const std::vector<int> steps = device.run(c, 30000, latency);
  // (With a step climbed at every two violations within ~100 jobs, it was at step 2 for 5% of
  // these jobs.)
  EXPECT_GT(std::count(steps.begin(), steps.end(), 2), 24000);
  // Where a pair of violations leaves step 2's record plainly over target, a spent budget
  // climbs past the steps above on record as no better to one not on record (steps 5 to 8
  // in turn, each left again within a second): a way through a plateau of steps alike. Once
  // every step is on record that stops.
  EXPECT_LE(changes(steps), 32);
  EXPECT_LE(changes(std::vector<int>(steps.begin() + 15000, steps.end())), 6) << "it should settle, not oscillate";
  const KindControl k = c.kinds().front();
  EXPECT_GT(static_cast<double>(k.within_target) / static_cast<double>(k.judged), 0.99);
}

TEST(LatencyController, ABiggerErrorBudgetAbsorbsALongerBurstOfViolations) {
  // Step 0 keeps the kind within its 2 ms target (1.2 ms) but for one burst of four jobs at
  // 2.5 ms (over it, not severe): a budget of 2 climbs on the third, one of 5 absorbs them.
  for (const double budget : {2.0, 5.0}) {
    ControllerOptions options;
    options.budget_cap = budget;
    LatencyController c(options, ladder_of(9));
    c.set_target("lc", LatencyTarget{2e-3, 1.5});
    ScriptedDevice device{{1.2, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}};
    device.run(c, 3000);
    while (c.probing()) device.run(c, 1);
    ASSERT_EQ(c.step(), 0) << "budget " << budget;
    device.run(c, 4, [](int) { return 2.5e-3; });
    EXPECT_EQ(c.step(), budget < 4 ? 1 : 0) << "budget " << budget;
    EXPECT_EQ(c.climbs(), budget < 4 ? 1 : 0) << "budget " << budget;
  }
}

TEST(LatencyController, AStepDownThatHadToBeUndoneWaitsLongerNextTime) {
  // Step 3 is fine on most samples but 4% of them take 1.9 ms (over the ~1.575 ms target):
  // each descent to it is undone, and the tries get rarer; step 4 is always fine.
  LatencyController c(ControllerOptions{}, ladder_of(9));
  ScriptedDevice device{{3.0, 2.5, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}};
  std::bernoulli_distribution spike(0.04);
  const std::vector<int> steps = device.run(c, 60000, [&](int step) {
    if (step <= 2) return device.latency(step);
    return step == 3 && spike(device.rng) ? 1.9e-3 : kAlone * device.noise(device.rng);
  });
  std::vector<std::size_t> tries;  // where it went down to step 3
  for (std::size_t i = 1; i < steps.size(); ++i) {
    if (steps[i] == 3 && steps[i - 1] == 4) tries.push_back(i);
  }
  ASSERT_GE(tries.size(), 3u);
  // Each wait at least double the one before (until capped): 0.5 s, 1 s, 2 s, ...
  EXPECT_GT(tries[2] - tries[1], (tries[1] - tries[0]) * 3 / 2);
  EXPECT_LE(changes(steps), 40);
}

TEST(LatencyController, AMedianOverTwiceTheAloneMedianClimbsThoughTheP99IsWithinTarget) {
  // Target 3 x alone p99 (~3.15 ms): steps 0-1 give ~2.5 ms, within it, but a median 2.5x
  // the alone median; step 2 gives 1.5x; the controller settles there.
  ScriptedDevice device{{2.5, 2.5, 1.5, 1.2, 1.1, 1.0, 1.0, 1.0, 1.0}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  c.set_target("lc", LatencyTarget{std::nullopt, 3.0});
  const std::vector<int> steps = device.run(c, 20000);
  EXPECT_EQ(steps.back(), 2);
  const std::vector<int> late(steps.begin() + 10000, steps.end());
  EXPECT_GE(std::count(late.begin(), late.end(), 2), 9000) << "it stays at the first step whose median is within";
  EXPECT_LE(changes(late), 12);
  const KindControl k = c.kinds().front();
  ASSERT_TRUE(k.alone_p50_s && k.recent_p50_s);
  EXPECT_LE(*k.recent_p50_s, 2.0 * *k.alone_p50_s);
  EXPECT_GE(c.median_climbs(), 2) << "the climbs from steps 0 and 1 were the median's";
  EXPECT_LE(c.median_climbs(), c.climbs());
}

TEST(LatencyController, AMedianNoStepLowersDoesNotHoldBestEffortWorkBack) {
  // The kind's median is 2.3x its alone median at every step (its host's, not the device's):
  // over its bound, and no step helps. Its p99 (~2.4 ms) is within the 3x target. The
  // controller climbs once through the steps it has no record of, then steps back down (the
  // steps below are no worse for the median) and stays at the bottom, looking up again when a
  // record expires (step_memory_s).
  ScriptedDevice device{{2.3, 2.3, 2.3, 2.3, 2.3, 2.3, 2.3, 2.3, 2.3}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  c.set_target("lc", LatencyTarget{std::nullopt, 3.0});
  const ControllerOptions o{};
  const std::vector<int> first = device.run(c, 10000);
  EXPECT_EQ(*std::max_element(first.begin(), first.end()), 8) << "it looked at every step once";
  const std::vector<int> late = device.run(c, 40000);
  EXPECT_EQ(std::count(late.begin(), late.end(), 0), static_cast<long>(late.size()));
  const KindControl k = c.kinds().front();
  EXPECT_GT(static_cast<double>(k.within_target) / static_cast<double>(k.judged), 0.99);
  for (const StepLatency& at : k.steps) {
    if (at.jobs >= 32) EXPECT_NEAR(*at.p50_s, 2.3e-3, 0.1e-3);
  }
  // Said out loud, once: the median bound is not enforced.
  EXPECT_TRUE(k.median_unhelped);
  const std::vector<std::string> reports = c.take_reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].find("median of kind 'lc'"), std::string::npos) << reports[0];
  EXPECT_NE(reports[0].find("does not lower it"), std::string::npos) << reports[0];
  EXPECT_FALSE(k.infeasible) << "its p99 target is met";
  // Its records expire after step_memory_s: it looks up again.
  const std::vector<int> again = device.run(c, static_cast<int>(o.step_memory_s / kPeriod) - 50000 + 5000);
  EXPECT_GT(*std::max_element(again.begin(), again.end()), 0);
  EXPECT_TRUE(c.take_reports().empty()) << "reported once";
}

TEST(LatencyController, AMedianThatAHigherStepLowersStillClimbsThere) {
  // As above, but step 3 brings the median within its bound: the controller settles there.
  ScriptedDevice device{{2.3, 2.3, 2.3, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  c.set_target("lc", LatencyTarget{std::nullopt, 3.0});
  device.run(c, 30000);
  const std::vector<int> late = device.run(c, 30000);
  EXPECT_GT(std::count(late.begin(), late.end(), 3), 27000);
  EXPECT_LE(changes(late), 20);
  EXPECT_TRUE(c.take_reports().empty());
  EXPECT_FALSE(c.kinds().front().median_unhelped);
}

TEST(LatencyController, AMedianWithinTwiceTheAloneMedianLeavesBestEffortWorkAlone) {
  ScriptedDevice device{{1.8, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  c.set_target("lc", LatencyTarget{std::nullopt, 3.0});
  const std::vector<int> steps = device.run(c, 5000);
  EXPECT_EQ(std::count(steps.begin(), steps.end(), 0), static_cast<long>(steps.size()));
}

TEST(LatencyController, AnAbsoluteTargetHasNoMedianBound) {
  // The user said what p99 they accept: a median 2.5x the alone one within it is theirs.
  ScriptedDevice device{{2.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  c.set_target("lc", LatencyTarget{3.5e-3, 1.5});
  const std::vector<int> steps = device.run(c, 5000);
  EXPECT_EQ(std::count(steps.begin(), steps.end(), 0), static_cast<long>(steps.size()));
}

TEST(LatencyController, ProbesForTheAloneLatencyThenStops) {
  const ControllerOptions options;
  LatencyController c(options, ladder_of(9));
  c.observe("lc", 3e-3, false, 0.0);
  EXPECT_TRUE(c.probing()) << "a kind with a relative target and no alone samples asks for a probe";
  ASSERT_FALSE(c.kinds().front().target_s);
  double now = 0.0;
  // The kind's first jobs are warm-up, never alone samples (a CUDA graph's upload).
  for (std::size_t i = 1; i < options.warmup_samples; ++i) c.observe("lc", 50 * kAlone, true, now += kPeriod);
  EXPECT_EQ(c.kinds().front().alone_samples, 0u);
  for (std::size_t i = 0; i + 1 < options.min_alone_samples; ++i) c.observe("lc", kAlone, true, now += kPeriod);
  EXPECT_TRUE(c.probing());
  EXPECT_FALSE(c.kinds().front().target_s) << "no target from fewer alone samples";
  c.observe("lc", kAlone, true, now += kPeriod);
  ASSERT_TRUE(c.kinds().front().target_s) << "a provisional target";
  EXPECT_NEAR(*c.kinds().front().target_s, 1.5 * kAlone, 1e-12);
  // Probes go on, rarer, until the alone p99 rests on settled_alone_samples.
  c.tick(options.probe_window_s + 1e-3);
  EXPECT_FALSE(c.probing()) << "a probe lasts probe_window_s at most";
  c.observe("lc", 3e-3, false, now = options.probe_window_s + options.probe_interval_s + 0.01);
  EXPECT_FALSE(c.probing()) << "with a target, probes wait settling_probe_interval_s";
  now = options.probe_window_s + options.settling_probe_interval_s + 0.01;
  c.observe("lc", 3e-3, false, now);
  EXPECT_TRUE(c.probing());
  EXPECT_EQ(c.probes(), 2);
  while (c.kinds().front().alone_samples < options.settled_alone_samples) c.observe("lc", kAlone, true, now += 1e-4);
  EXPECT_FALSE(c.probing());
  c.observe("lc", 3e-3, false, now += 2 * options.settling_probe_interval_s);
  EXPECT_FALSE(c.probing()) << "settled: no more probes";
  EXPECT_EQ(c.probes(), 2);
}

TEST(LatencyController, OneHiccupInAFewAloneSamplesDoesNotSetTheTarget) {
  const ControllerOptions options;
  LatencyController c(options, ladder_of(9));
  double now = 0.0;
  for (std::size_t i = 0; i < options.warmup_samples; ++i) c.observe("lc", kAlone, false, now += kPeriod);
  c.observe("lc", 20 * kAlone, true, now += kPeriod);  // its thread preempted for 19 ms
  for (std::size_t i = 1; i < options.min_alone_samples; ++i) c.observe("lc", kAlone, true, now += kPeriod);
  ASSERT_TRUE(c.kinds().front().target_s);
  EXPECT_NEAR(*c.kinds().front().target_s, 1.5 * kAlone, 1e-12);
  c.observe("lc", 20 * kAlone, true, now += kPeriod);  // a second one is the kind's own tail
  EXPECT_NEAR(*c.kinds().front().target_s, 1.5 * 20 * kAlone, 1e-12);
}

TEST(LatencyController, TheAloneP99IsTheLowerEndOfANinetyPercentConfidenceIntervalOfIt) {
  // Alone samples 1..n ms in a shuffled order. Of n samples, the number over a kind's true p99
  // is binomial (n, 1%); the alone p99 is the order statistic that lies at or under the true
  // p99 with at least 90% probability: of 200, the fifth largest (at most 4 of them over it:
  // 94.8%; at most 3: 85.8%), not the nearest-rank p99 (the third largest). Never the largest
  // of two or more (of 10, the largest alone would do: 0.99^10 = 90.4%). Targets come at 32.
  struct Case {
    std::size_t n;
    double expected_ms;
  };
  for (const Case& t : {Case{1, 1.0}, Case{2, 1.0}, Case{10, 9.0}, Case{32, 31.0}, Case{53, 52.0}, Case{54, 52.0},
                        Case{200, 196.0}, Case{512, 504.0}}) {
    ControllerOptions options;
    options.alone_window = std::max<std::size_t>(512, t.n);
    LatencyController c(options, ladder_of(9));
    double now = 0.0;
    for (std::size_t i = 0; i < options.warmup_samples; ++i) c.observe("lc", 1e-3, false, now += kPeriod);
    std::vector<double> samples;
    for (std::size_t i = 1; i <= t.n; ++i) samples.push_back(static_cast<double>(i) * 1e-3);
    std::shuffle(samples.begin(), samples.end(), std::mt19937{11});
    for (const double s : samples) c.observe("lc", s, true, now += kPeriod);
    const KindControl k = c.kinds().front();
    ASSERT_EQ(k.alone_samples, t.n);
    ASSERT_TRUE(k.alone_p99_s);
    EXPECT_NEAR(*k.alone_p99_s, t.expected_ms * 1e-3, 1e-9) << t.n << " samples";
    if (t.n < options.min_alone_samples) continue;
    ASSERT_TRUE(k.target_s);
    EXPECT_NEAR(*k.target_s, 1.5 * t.expected_ms * 1e-3, 1e-9) << t.n << " samples";
  }
}

TEST(LatencyController, TheAloneP99BoundHoldsForWindowsWhereTheBinomialsFirstTermUnderflows) {
  // 0.99^100000 underflows a double; of 100000 samples some 1000 lie over the true p99 (sd 31.5),
  // and the 90% bound leaves 1040 above it.
  EXPECT_EQ(detail::samples_above_alone_p99(100000), 1040u);
  EXPECT_EQ(detail::samples_above_alone_p99(200), 4u);
  EXPECT_EQ(detail::samples_above_alone_p99(1), 0u);
  EXPECT_EQ(detail::samples_above_alone_p99(0), 0u);
}

TEST(LatencyController, AProbeThatFindsNothingEndsAndIsRetriedLater) {
  ControllerOptions options;
  LatencyController c(options, ladder_of(9));
  c.observe("lc", 3e-3, false, 0.0);
  ASSERT_TRUE(c.probing());
  c.tick(options.probe_window_s + 1e-3);
  EXPECT_FALSE(c.probing());
  c.observe("lc", 3e-3, false, options.probe_window_s + 0.5);
  EXPECT_FALSE(c.probing()) << "not before probe_interval_s";
  c.observe("lc", 3e-3, false, options.probe_window_s + options.probe_interval_s + 1e-3);
  EXPECT_TRUE(c.probing());
  EXPECT_EQ(c.probes(), 2);
}

TEST(LatencyController, ATargetBelowTheAloneLatencyIsReportedInfeasible) {
  LatencyController c(ControllerOptions{}, ladder_of(9));
  c.set_target("lc", LatencyTarget{0.5e-3, 1.5});
  double now = 0.0;
  for (std::size_t i = 0; i < ControllerOptions{}.warmup_samples + 5; ++i) c.observe("lc", kAlone, true, now += kPeriod);
  const std::vector<std::string> reports = c.take_reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].find("kind 'lc'"), std::string::npos) << reports[0];
  EXPECT_NE(reports[0].find("0.5 ms"), std::string::npos) << reports[0];
  EXPECT_NE(reports[0].find("cannot be met"), std::string::npos) << reports[0];
  EXPECT_TRUE(c.kinds().front().infeasible);
  EXPECT_TRUE(c.take_reports().empty()) << "reported once";
}

TEST(LatencyController, ATargetBelowTheAloneLatencyIsNoLongerReportedOnceItIsAbove) {
  // Reported below its first alone samples (1 ms against a 0.5 ms target); the later ones
  // (0.4 ms, the first out of the window) put the alone p99 under the target: withdrawn.
  LatencyController c(ControllerOptions{}, ladder_of(9));
  c.set_target("lc", LatencyTarget{0.5e-3, 1.5});
  double now = 0.0;
  for (std::size_t i = 0; i < ControllerOptions{}.warmup_samples + 5; ++i) c.observe("lc", kAlone, true, now += kPeriod);
  ASSERT_TRUE(c.kinds().front().infeasible);
  for (std::size_t i = 0; i < ControllerOptions{}.alone_window; ++i) c.observe("lc", 0.4e-3, true, now += kPeriod);
  EXPECT_FALSE(c.kinds().front().infeasible) << c.kinds().front().infeasible_reason;
  EXPECT_EQ(c.take_reports().size(), 0u) << "the report not yet taken went with it";
}

TEST(LatencyController, AReportBelowTheAloneLatencyDoesNotFlapAtItsEdge) {
  // An absolute target at the kind's alone p99, which wanders across it (the alone window of
  // 512 samples turning over between 0.90-0.99 ms and 0.95-1.02 ms): reported once, not
  // withdrawn and given again each time the p99 crosses the target.
  LatencyController c(ControllerOptions{}, ladder_of(9));
  c.set_target("lc", LatencyTarget{1e-3, 1.5});
  std::mt19937 rng{3};
  std::uniform_real_distribution<double> low{0.90e-3, 0.99e-3}, high{0.95e-3, 1.02e-3};
  double now = 0.0;
  std::size_t reports = 0;
  for (int i = 0; i < 12000; ++i) {
    c.observe("lc", (i / 1000) % 2 == 0 ? high(rng) : low(rng), true, now += kPeriod);
    reports += c.take_reports().size();
  }
  EXPECT_EQ(reports, 1u);
}

TEST(LatencyController, ATargetMissedAtTheTopStepIsReportedInfeasible) {
  // Every step gives 3 ms against a 1.5 ms target: reported from the top step, which the
  // controller then leaves, step by step, for the bottom (no step did better).
  ScriptedDevice device{{3.0, 3.0, 3.0, 3.0}};
  LatencyController c(ControllerOptions{}, ladder_of(4));
  c.set_target("lc", LatencyTarget{1.5e-3, 1.5});
  device.run(c, 380);
  EXPECT_EQ(c.step(), 3);
  const std::vector<std::string> reports = c.take_reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_NE(reports[0].find("not met even with best-effort work held back as far as the scheduler can"),
            std::string::npos) << reports[0];
  device.run(c, 5000);
  EXPECT_EQ(c.step(), 0);
  EXPECT_EQ(c.unhelpful_descents(), 3);
}

TEST(LatencyController, DoesNotHoldBestEffortWorkBackWhereItBuysNothing) {
  // From step 2 up every step gives 1.8 ms, over the ~1.575 ms target: holding BE work back
  // further buys the LC kind nothing (its tail is its host's, say). The controller climbs
  // to the top, tries each step below (judged by its record, each no worse), comes back down
  // to step 2 and stays (step 1's record is worse: 2.5 ms), and reports the target infeasible.
  ScriptedDevice device{{3.0, 2.5, 1.8, 1.8, 1.8, 1.8, 1.8}};
  LatencyController c(ControllerOptions{}, ladder_of(7));
  device.run(c, 3000);
  EXPECT_GE(c.unhelpful_descents(), 3);
  const std::vector<int> later = device.run(c, 30000);
  EXPECT_GT(std::count(later.begin(), later.end(), 2), 27000);
  EXPECT_LE(std::count(later.begin(), later.end(), 6), 300);
  EXPECT_LE(changes(later), 30) << "it should settle, not oscillate";
  const KindControl k = c.kinds().front();
  EXPECT_TRUE(k.infeasible);
  EXPECT_NE(k.infeasible_reason.find("not met even with best-effort work held back"), std::string::npos)
      << k.infeasible_reason;
}

// After every change of step, the next jobs still meet the best-effort work the step before
// let in (queued on its partition, in its slices): they take the worse of the two steps'
// latencies. `mark` says whether they are reported unsettled, as the scheduler does.
struct TransientDevice {
  std::vector<double> slowdown;
  int transient_jobs = 25;
  std::mt19937 rng{11};
  std::uniform_real_distribution<double> noise{0.95, 1.05};
  double now = 0.0;
  int current = 0, previous = 0, left = 0;

  std::vector<int> run(LatencyController& c, int n, bool mark) {
    std::vector<int> steps;
    for (int i = 0; i < n; ++i) {
      now += kPeriod;
      if (c.step() != current) {
        previous = current;
        current = c.step();
        left = transient_jobs;
      }
      const bool probe = c.probing();
      double l = kAlone * noise(rng);
      bool settled = true;
      if (!probe && left > 0) {
        left -= 1;
        l *= std::max(slowdown[static_cast<std::size_t>(previous)], slowdown[static_cast<std::size_t>(current)]);
        settled = !mark;
      } else if (!probe) {
        l *= slowdown[static_cast<std::size_t>(current)];
      }
      c.observe("lc", l, probe, now, settled);
      steps.push_back(c.step());
    }
    return steps;
  }
};

TEST(LatencyController, JudgesEachStepByItsSettledJobsNotByTheWorkTheStepBeforeLeft) {
  // Step 1 and up give 1.3 ms (within the ~1.575 ms target); step 0 gives 3 ms. The 25 jobs
  // after each change take what the step before gave; reported unsettled, they stay out of
  // the steps' records, which then say what each step gives once it is in force.
  TransientDevice device{{3.0, 1.3, 1.3, 1.3, 1.3, 1.3, 1.3, 1.3, 1.3}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  device.run(c, 3000, true);
  const std::vector<int> later = device.run(c, 30000, true);
  EXPECT_GT(std::count(later.begin(), later.end(), 1), 28000) << "the lowest step that meets the target";
  const KindControl k = c.kinds().front();
  std::size_t unsettled = 0;
  for (std::size_t s = 0; s < k.steps.size(); ++s) {
    const StepLatency& at = k.steps[s];
    EXPECT_LE(at.unsettled, at.jobs);
    unsettled += at.unsettled;
    if (s >= 1 && at.p99_s) EXPECT_LT(*at.p99_s, 1.3e-3 * 1.06) << "step " << s << ": settled jobs only";
  }
  EXPECT_GE(unsettled, 25u) << "the jobs after the climb from step 0";
  EXPECT_GT(static_cast<double>(k.within_target) / static_cast<double>(k.judged), 0.99);
}

TEST(LatencyController, TailsThatNoStepChangesDoNotDriveItUpTheLadder) {
  // From step 1 up every step gives 1.1 ms, but beside BE work 3% of jobs, at random, are
  // 3 ms late whatever the step (the LC thread's host: a Python BE thread holding the GIL).
  // The target (~1.575 ms) is missed by 3% of the jobs at every step: no step helps, so the
  // controller stays low, where BE work keeps most of the device, and says the target is
  // infeasible. The steps' records differ only by chance (a few late jobs in 128): the
  // controller takes a step as better only when its record is lower by more than chance.
  ScriptedDevice device{{3.0, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1}};
  std::bernoulli_distribution late(0.03);
  std::mt19937 rng(5);
  LatencyController c(ControllerOptions{}, ladder_of(9));
  const auto tail = [&](int step) { return device.latency(step) + (late(rng) ? 3e-3 : 0.0); };
  device.run(c, 3000, tail);
  const std::vector<int> later = device.run(c, 40000, tail);
  std::size_t low = 0;
  for (const int s : later) low += s <= 2;
  EXPECT_GT(low, 36000u) << "at steps 1-2 most of the time (top: " << std::count(later.begin(), later.end(), 8)
                         << " samples)";
  EXPECT_TRUE(c.kinds().front().infeasible);
}

// Jobs of a 30000-job run, after 3000 to settle, at steps <= 2 and at the top two steps, on a
// device where steps 1 and up give 1.1 ms but a share `late` of the jobs at steps 1 to
// `last_late_step` are 1 ms later (over the ~1.575 ms target: 2.1 ms, not severe). `seed`
// seeds the late jobs.
struct PlateauRun {
  std::size_t low = 0, top = 0;
  bool infeasible = false;  // the kind reported infeasible
};
PlateauRun plateau_run(std::size_t steps, double late, int last_late_step, unsigned seed) {
  ScriptedDevice device{std::vector<double>(steps, 1.1)};
  device.slowdown[0] = 3.0;
  std::bernoulli_distribution is_late(late);
  std::mt19937 rng(seed);
  LatencyController c(ControllerOptions{}, ladder_of(steps));
  const auto latency = [&](int step) {
    return device.latency(step) + (step <= last_late_step && is_late(rng) ? 1e-3 : 0.0);
  };
  device.run(c, 3000, latency);
  PlateauRun r;
  for (const int s : device.run(c, 30000, latency)) {
    r.low += s <= 2;
    r.top += s >= static_cast<int>(steps) - 2;
  }
  r.infeasible = c.kinds().front().infeasible;
  return r;
}

TEST(LatencyController, ClimbsPastStepsOnRecordAsNoBetterToOneThatMayHelp) {
  // Steps 1 and 2 hold the LC kind alike, and neither meets its target: 1.5% of their jobs are
  // late. From step 3 up none is. Once steps 1 and 2 are on record as alike, a spent budget at
  // step 1 (or 2) climbs past the steps on record as no better to one with no record, and the
  // controller then comes down to the lowest step that meets the target, rather than stay
  // below a step that would help (a plateau of steps alike, as partitions beside memory-bound
  // best-effort work give). The old rule (climb only where the step just above is not on
  // record as no better) fails this: it stayed below step 3 for most of such runs
  // (benchmarks/results/controller_sim_20261130_session22_plateau_sweep.txt).
  std::size_t low = 0;
  for (unsigned seed = 1; seed <= 4; ++seed) {
    const PlateauRun r = plateau_run(7, 0.015, 2, seed);
    EXPECT_LT(r.low, 12000u) << "seed " << seed << ": below step 3 for 40% of the run or more";
    low += r.low;
  }
  EXPECT_LT(low, 24000u) << "below step 3 for over a fifth of the jobs";
}

TEST(LatencyController, APlateauBelowAStepThatMeetsTheTargetIsNotReportedInfeasible) {
  // As above: step 3 and up meet the target. While the controller sits on the plateau with
  // the step above on record as no better, the steps further up may still help, so the
  // target is not reported infeasible.
  for (unsigned seed = 1; seed <= 20; ++seed) {
    EXPECT_FALSE(plateau_run(7, 0.015, 2, seed).infeasible) << "seed " << seed;
  }
}

TEST(LatencyController, ClimbsPastAPlateauOnlyOnceWhereNoStepHelps) {
  // Every step from 1 up has 1% of its jobs late: no step helps, and each step's record sits
  // at the target's edge. Climbing past the steps on record as no better tries the steps
  // further up (each once while the records last), not the top again and again: the
  // controller stays at steps 1-2 for most of the run. (A first form, which also climbed to
  // steps further up on record as lower or as meeting the target, spent up to 63% of such a
  // run at the top two steps.)
  for (unsigned seed = 1; seed <= 4; ++seed) {
    const PlateauRun r = plateau_run(8, 0.01, 7, seed);
    EXPECT_GT(r.low, 15000u) << "seed " << seed << ": at steps <= 2 at least half the time";
    EXPECT_LT(r.top, 4500u) << "seed " << seed << ": at the top two steps under 15% of the time";
  }
}

TEST(LatencyController, ATargetMetBelowTheTopIsNotReportedInfeasibleWhereTheTopMissesIt) {
  // Steps 1-5 give 1.1 ms, within the ~1.575 ms target; the top step gives 2 ms (on the H200
  // the MLP's record at the top step was worse than at step 1). Bursts of severe jobs now and
  // then take the controller to the top, where every job misses, and it comes down again.
  // The target is met, at steps 1-5: it is not infeasible. (Counting the jobs at the top step
  // alone reported it, as on the H200 for a kind within its target for 99.5% of a run.)
  ScriptedDevice device{{3.0, 1.1, 1.1, 1.1, 1.1, 1.1, 2.0}};
  LatencyController c(ControllerOptions{}, ladder_of(7));
  int job = 0;
  const auto bursts = [&](int step) { return ++job % 1500 < 4 ? 4e-3 : device.latency(step); };
  device.run(c, 3000, bursts);
  const std::vector<int> later = device.run(c, 30000, bursts);
  EXPECT_GT(std::count(later.begin(), later.end(), 6), 200) << "the top step visited";
  const KindControl k = c.kinds().front();
  EXPECT_GT(static_cast<double>(k.within_target) / static_cast<double>(k.judged), 0.98);
  EXPECT_FALSE(k.infeasible) << k.infeasible_reason;
}

TEST(LatencyController, ATopStepAtItsTargetsEdgeIsNotReportedInfeasible) {
  // Steps below the top miss the target; at the top 1.5% of the jobs are late (one in 67):
  // the kind is at its target's edge there (as the MLP was on the H200: 3 of 200 jobs over
  // it), not plainly over it. Over 1% of 200 jobs reported it. (The late jobs are evenly
  // spaced: the test pins the threshold between 1% and 2%, not its chance variation.)
  ScriptedDevice device{{3.0, 2.0, 2.0, 1.1}};
  LatencyController c(ControllerOptions{}, ladder_of(4));
  int job = 0;
  const auto edge = [&](int step) { return step == 3 && ++job % 67 == 0 ? 2e-3 : device.latency(step); };
  device.run(c, 3000, edge);
  const std::vector<int> later = device.run(c, 20000, edge);
  EXPECT_GT(std::count(later.begin(), later.end(), 3), 19000) << "at the top";
  EXPECT_FALSE(c.kinds().front().infeasible) << c.kinds().front().infeasible_reason;
}

// Reports of a missed target among `reports` (not the median's).
std::size_t target_reports(const std::vector<std::string>& reports) {
  return static_cast<std::size_t>(std::count_if(reports.begin(), reports.end(), [](const std::string& r) {
    return r.find("is not met even with") != std::string::npos;
  }));
}

// A relative target judged infeasible from its first alone samples, whose later alone samples
// find the kind at `alone_then`: from the 3000th sample on, every tenth sample is one (as
// probes would give, often enough for the alone window to turn over).
struct Rebased {
  bool reported_first = false;     // a report of the missed target by the 3000th sample
  std::vector<std::string> after;  // those given after it
  KindControl kind;
};

Rebased report_then_rebased(double alone_then) {
  Rebased r;
  ScriptedDevice device{{1.2, 1.2, 1.2, 1.2}};
  LatencyController c(ControllerOptions{}, ladder_of(4));
  std::mt19937 rng{11};
  std::uniform_real_distribution<double> noise{0.95, 1.05};
  double alone = 0.6e-3;
  for (int i = 0; i < 25000; ++i) {
    device.now += kPeriod;
    if (i == 3000) {
      r.reported_first = target_reports(c.take_reports()) == 1;
      alone = alone_then;
    }
    const bool probe = c.probing() || (i >= 3000 && i % 10 == 0);
    c.observe("lc", probe ? alone * noise(rng) : device.latency(c.step()), probe, device.now);
  }
  for (const std::string& report : c.take_reports()) {
    if (target_reports({report}) == 1) r.after.push_back(report);
  }
  r.kind = c.kinds().front();
  return r;
}

TEST(LatencyController, AReportJudgedAgainstAnEarlierTargetIsWithdrawnWhenTheTargetMoves) {
  // Its first alone samples put the kind at about 0.6 ms alone (a target near 0.9-0.95 ms),
  // and every step gives 1.2 ms: reported infeasible. Later probes find it at 1 ms alone (its
  // p99 target near 1.5 ms, as on the H200, where a conv net's alone p99 went from 0.32 to 0.52
  // ms as probes added samples): 1.2 ms is within it, and the report is withdrawn, not kept.
  const Rebased r = report_then_rebased(1e-3);
  EXPECT_TRUE(r.reported_first);
  ASSERT_TRUE(r.kind.target_s.has_value());
  EXPECT_GT(*r.kind.target_s, 1.4e-3);
  EXPECT_FALSE(r.kind.infeasible) << r.kind.infeasible_reason;
  EXPECT_TRUE(r.after.empty());
}

TEST(LatencyController, AReportStandsWhereItsTargetMovesLittle) {
  // The same, with the later probes at 0.62 ms: the target rises by a few percent, still far
  // below 1.2 ms. The report stands, given once.
  const Rebased r = report_then_rebased(0.62e-3);
  EXPECT_TRUE(r.reported_first);
  EXPECT_TRUE(r.kind.infeasible);
  EXPECT_TRUE(r.after.empty());
}

TEST(LatencyController, AReportIsGivenAgainAgainstATargetThatMovedAndIsStillMissed) {
  // The later probes at 0.7 ms: a target about 17% higher (near 1.1 ms), still below 1.2 ms:
  // the old report is dropped and a new one given, on a count of jobs judged against the new
  // target alone (infeasible_samples of them, not the old count and one more).
  const Rebased r = report_then_rebased(0.7e-3);
  EXPECT_TRUE(r.reported_first);
  EXPECT_TRUE(r.kind.infeasible);
  ASSERT_EQ(r.after.size(), 1u);
  EXPECT_NE(r.after[0].find(" of 200 jobs"), std::string::npos) << r.after[0];
}

TEST(LatencyController, AReportStandsWhereItsTargetFalls) {
  // The later alone samples at 0.5 ms: a target 17% lower, missed as the one before was. The
  // report stands, given once.
  const Rebased r = report_then_rebased(0.5e-3);
  EXPECT_TRUE(r.reported_first);
  ASSERT_TRUE(r.kind.target_s.has_value());
  EXPECT_LT(*r.kind.target_s, 0.8e-3);
  EXPECT_TRUE(r.kind.infeasible);
  EXPECT_TRUE(r.after.empty());
}

TEST(LatencyController, AnInfeasibleTargetStaysAtTheStepThatComesClosest) {
  // Every step is over the target, but each higher one less so: the top step stays.
  ScriptedDevice device{{3.0, 2.6, 2.2, 1.9, 1.7}};
  LatencyController c(ControllerOptions{}, ladder_of(5));
  device.run(c, 3000);
  const std::vector<int> later = device.run(c, 20000);
  EXPECT_GT(std::count(later.begin(), later.end(), 4), 19000);
  EXPECT_LE(c.unhelpful_descents(), 1) << "step 3 tried once, its record worse";
  EXPECT_TRUE(c.kinds().front().infeasible);
}

TEST(LatencyController, ReturnsToTheBottomWhenLatencyCriticalWorkStops) {
  ScriptedDevice device{{3.0, 2.5, 2.0, 1.6, 1.3, 1.1, 1.05, 1.0, 1.0}};
  ControllerOptions options;
  LatencyController c(options, ladder_of(9));
  device.run(c, 3000);
  ASSERT_GT(c.step(), 0);
  c.tick(device.now + options.idle_s / 2);
  EXPECT_GT(c.step(), 0);
  c.tick(device.now + options.idle_s * 1.01);
  EXPECT_EQ(c.step(), 0);
}

TEST(LatencyController, EveryKindMustMeetItsTarget) {
  // Two kinds: "fast" needs step 4, "slow" (absolute target 5 ms) is fine everywhere.
  ScriptedDevice device{{3.0, 2.5, 2.0, 1.6, 1.3, 1.1, 1.05, 1.0, 1.0}};
  LatencyController c(ControllerOptions{}, ladder_of(9));
  c.set_target("slow", LatencyTarget{5e-3, 1.5});
  for (int i = 0; i < 3000; ++i) {
    device.run(c, 1);
    c.observe("slow", 2e-3, false, device.now + 1e-4);
  }
  EXPECT_EQ(c.step(), 4);
}

// Two best-effort kinds beside one LC kind, on the default ladder of a 132-SM device (steps
// 0-4 only keep SMs free: the ceiling is 4). "gemm" (compute-bound) slows the LC kind at step 0
// only: any partition protects it. "stream" (memory-bound) slows it behind every partition and
// less only as it is held in time (steps 5-7; at the top 1.2, low enough for the tests below
// to meet their targets there). The LC latency adds up both kinds' harm, each at its own step:
// a released kind runs at min(step, ceiling).
struct TwoBestEffortKinds {
  std::vector<double> gemm{3.0, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1, 1.1};
  std::vector<double> stream{2.5, 2.5, 2.5, 2.5, 2.5, 2.0, 1.6, 1.2};
  std::mt19937 rng{11};
  std::uniform_real_distribution<double> noise{0.95, 1.05};
  double now = 0.0;

  double harm(const LatencyController& c, const std::string& kind, const std::vector<double>& slowdown) const {
    const int step = c.released(kind) ? std::min(c.step(), c.ceiling()) : c.step();
    return slowdown[static_cast<std::size_t>(step)] - 1.0;
  }
  void run(LatencyController& c, int n) {
    for (int i = 0; i < n; ++i) {
      now += kPeriod;
      c.note_best_effort("gemm", now);
      c.note_best_effort("stream", now);
      const bool probe = c.probing();
      const double slowdown = probe ? 1.0 : 1.0 + harm(c, "gemm", gemm) + harm(c, "stream", stream);
      c.observe("lc", kAlone * slowdown * noise(rng), probe, now);
    }
  }
  BestEffortControl kind(const LatencyController& c, const std::string& name) const {
    return named(c.best_effort_kinds(), name);
  }
};

TEST(LatencyController, ReleasesTheBestEffortKindsAPartitionProtectsFromAndHoldsTheOthers) {
  // Target ~1.575 ms: step 7 (1 + 0.1 + 0.2 = 1.3 ms) is the first that meets it for both kinds
  // held alike. Released to the ceiling, gemm still costs 0.1: its try holds. Stream's costs
  // 1.5 there: its try is undone within a few jobs, with no climb, and waits longer each time.
  const ControllerOptions options;
  TwoBestEffortKinds device;
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  ASSERT_EQ(c.ceiling(), 4);
  device.run(c, 3000);
  EXPECT_EQ(c.step(), 7);
  device.run(c, 30000);  // 60 s
  EXPECT_EQ(c.step(), 7);
  EXPECT_TRUE(c.released("gemm"));
  EXPECT_FALSE(c.released("stream"));
  const BestEffortControl gemm = device.kind(c, "gemm"), stream = device.kind(c, "stream");
  EXPECT_EQ(gemm.trials, 1);
  EXPECT_EQ(gemm.failures, 0);
  // Tries of stream after 8, 16, 32 s ... of waiting (release_wait_s doubling): few in 60 s.
  EXPECT_GE(stream.failures, 1);
  EXPECT_LE(stream.failures, 4);
  EXPECT_EQ(stream.trials, stream.failures + (stream.on_trial ? 1 : 0));
  // Every release and every undo is a change the scheduler passes on to paused holders.
  EXPECT_EQ(c.release_changes(), gemm.trials + stream.trials + stream.failures);
  // A released kind runs at the ceiling's settings: every SM but the partition's, whole units.
  EXPECT_EQ(c.released_settings().reserved_sms, c.ladder()[4].reserved_sms);
  EXPECT_EQ(c.released_settings().throttle, ThrottleMode::Off);
  EXPECT_GE(c.released_settings().slice_budget_s, kWholeSliceS);
  const KindControl k = c.kinds().front();
  EXPECT_GT(static_cast<double>(k.within_target) / static_cast<double>(k.judged), 0.99);
}

TEST(LatencyController, ReleasesNothingAtOrBelowTheCeiling) {
  // Only gemm: step 1 (a partition) meets the target, and nothing is ever tried.
  const ControllerOptions options;
  TwoBestEffortKinds device;
  device.stream.assign(8, 1.0);
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  device.run(c, 20000);
  EXPECT_LE(c.step(), c.ceiling());
  for (const BestEffortControl& b : c.best_effort_kinds()) {
    EXPECT_EQ(b.trials, 0) << b.kind;
    EXPECT_FALSE(b.released) << b.kind;
  }
  EXPECT_EQ(c.released_settings().reserved_sms, c.settings().reserved_sms) << "the same settings as every kind";
}

TEST(LatencyController, AReleasedKindThatTurnsHarmfulIsHeldAgainAtTheTop) {
  const ControllerOptions options;
  TwoBestEffortKinds device;
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  device.run(c, 6000);
  ASSERT_TRUE(c.released("gemm"));
  // gemm's work changes: now it slows the LC kind behind any partition too. Climbing cannot
  // help while it is released; at the top step the controller holds it again.
  device.gemm = {3.0, 2.0, 2.0, 2.0, 2.0, 1.5, 1.3, 1.1};
  device.run(c, 2000);
  EXPECT_FALSE(c.released("gemm"));
  EXPECT_GE(device.kind(c, "gemm").failures, 1);
  device.run(c, 5000);
  const KindControl k = c.kinds().front();
  EXPECT_LE(*k.recent_p99_s, *k.target_s);
}

TEST(LatencyController, WithEveryKindReleasedASpentBudgetHoldsOneAgainInsteadOfClimbing) {
  // No steps down (they would leave the steps above the ceiling once both kinds are harmless
  // there, and releases with them): a controller kept above the ceiling with both kinds released.
  ControllerOptions options;
  options.slack = 0.0;
  options.explore_samples = 1u << 30;
  TwoBestEffortKinds device;
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  device.run(c, 6000);
  ASSERT_TRUE(c.released("gemm"));
  ASSERT_EQ(c.step(), 7);
  // stream's work becomes harmless to the LC kind behind a partition: its next try holds.
  device.stream = device.gemm;
  const auto kept = [&] { return c.released("stream") && !device.kind(c, "stream").on_trial; };
  for (int i = 0; i < 100000 && !kept(); ++i) device.run(c, 1);
  ASSERT_TRUE(kept());
  ASSERT_EQ(c.step(), 7);
  // Right then gemm's turns harmful behind a partition: a climb would hold nothing back (both
  // are released), so the first spent budget holds the latest released kind again instead.
  device.gemm = {3.0, 2.0, 2.0, 2.0, 2.0, 1.5, 1.3, 1.1};
  const int64_t climbs = c.climbs();
  for (int i = 0; i < 100 && c.released("stream") && c.climbs() == climbs; ++i) device.run(c, 1);
  EXPECT_FALSE(c.released("stream"));
  EXPECT_EQ(c.climbs(), climbs);
  // gemm is still released and still harmful: in the end it is held again too.
  device.run(c, 3000);
  EXPECT_FALSE(c.released("gemm"));
  EXPECT_LE(*c.kinds().front().recent_p99_s, *c.kinds().front().target_s);
}

TEST(LatencyController, ATryEndsWhenLatencyCriticalWorkStops) {
  const ControllerOptions options;
  TwoBestEffortKinds device;
  device.gemm = device.stream;  // both harmful: every try fails, but one is under way at times
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  for (int i = 0; i < 40000 && !(device.kind(c, "gemm").on_trial || device.kind(c, "stream").on_trial); ++i) {
    device.run(c, 1);
  }
  ASSERT_TRUE(device.kind(c, "gemm").on_trial || device.kind(c, "stream").on_trial);
  c.tick(device.now + options.idle_s * 1.01);
  for (const BestEffortControl& b : c.best_effort_kinds()) {
    EXPECT_FALSE(b.on_trial) << b.kind;
    EXPECT_FALSE(b.released) << b.kind;
  }
}

// Two LC kinds beside memory-bound BE work that yields on the device (the default ladder's
// steps above the first): "graph"'s latency grows by graph_harm where its leases leave the
// gate open, "eager"'s by eager_harm (1: the yield does not help it).
// With eager_tail, that share of eager's jobs (BE work present) take tail_latency (2 ms: over
// its target at every step), gate or not; with its gate open at a step that yields,
// eager_open_tail more of them.
struct GatedKinds {
  std::vector<double> slowdown{3.0, 1.2, 1.15, 1.1, 1.05, 1.0, 1.0, 1.0};
  double graph_harm = 1.5, eager_harm = 1.0;
  double eager_tail = 0.0, eager_open_tail = 0.0, tail_latency = 2e-3;
  std::mt19937 rng{11};
  std::uniform_real_distribution<double> noise{0.95, 1.05};
  std::uniform_real_distribution<double> uniform{0.0, 1.0};
  double now = 0.0;

  double latency(const LatencyController& c, const std::string& kind, double harm) {
    const bool open = c.settings().device_yield && !c.closes_gate(kind);
    if (kind == "eager" && uniform(rng) < eager_tail + (open ? eager_open_tail : 0.0)) return tail_latency;
    return kAlone * slowdown[static_cast<std::size_t>(c.step())] * (open ? harm : 1.0) * noise(rng);
  }
  void run(LatencyController& c, int n) {
    for (int i = 0; i < n; ++i) {
      now += kPeriod / 2;
      c.note_best_effort("stream", now);
      for (const std::string kind : {"graph", "eager"}) {
        const bool probe = c.probing();
        const double l = probe ? kAlone * noise(rng) : latency(c, kind, kind == "graph" ? graph_harm : eager_harm);
        c.observe(kind, l, probe, now);
      }
    }
  }
  static KindControl kind(const LatencyController& c, const std::string& name) { return named(c.kinds(), name); }
  // `rounds` more rounds of 100 ms: in how many of them eager's gate was open at their end,
  // the share of its jobs within target meanwhile, and its stats before and after.
  struct Watched {
    int open = 0, rounds = 0;
    double within = 0.0;
    KindControl before, after;
  };
  Watched watch_eager(LatencyController& c, int rounds) {
    Watched w;
    w.before = kind(c, "eager");
    for (; w.rounds < rounds; ++w.rounds) {
      run(c, 100);
      w.open += !c.closes_gate("eager");
    }
    w.after = kind(c, "eager");
    w.within = static_cast<double>(w.after.within_target - w.before.within_target) /
               static_cast<double>(w.after.judged - w.before.judged);
    return w;
  }
};

TEST(LatencyController, LeavesTheGateOpenForTheKindsTheYieldDoesNotHelp) {
  // Step 1 (a partition, with the yield) meets both targets. Left open, eager does as well as
  // before: its try holds. graph's costs 1.5x, over its target: its try is undone within a few
  // jobs, with no climb, and it waits longer each time.
  const ControllerOptions options;
  GatedKinds device;
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  ASSERT_TRUE(c.ladder()[1].device_yield);
  device.run(c, 3000);
  ASSERT_GE(c.step(), 1);
  const int64_t climbs = c.climbs();
  device.run(c, 30000);  // 30 s (each run is 1 ms)
  EXPECT_FALSE(c.closes_gate("eager"));
  EXPECT_TRUE(c.closes_gate("graph"));
  const KindControl eager = device.kind(c, "eager"), graph = device.kind(c, "graph");
  EXPECT_EQ(eager.gate_trials, 1);
  EXPECT_EQ(eager.gate_failures, 0);
  EXPECT_FALSE(eager.closes_gate);
  EXPECT_TRUE(graph.closes_gate);
  // Tries of graph after 8, 16, 32 s ... of waiting (release_wait_s doubling): few in 30 s.
  EXPECT_GE(graph.gate_failures, 1);
  EXPECT_LE(graph.gate_failures, 3);
  EXPECT_EQ(graph.gate_trials, graph.gate_failures + (graph.gate_on_trial ? 1 : 0));
  EXPECT_LE(c.climbs() - climbs, 1 + graph.gate_failures) << "an undone try is no reason to climb";
  for (const KindControl& k : c.kinds()) {
    EXPECT_GT(static_cast<double>(k.within_target) / static_cast<double>(k.judged), 0.98) << k.kind;
  }
}

TEST(LatencyController, JudgesAGateByItsKindsRecordNotByABudgetChanceSpends) {
  // eager misses its target on 1.5% of its jobs whatever the step or gate: its budget is spent
  // again and again, during its gate's tries too. Its record with the gate open is no worse
  // than with it closed, so the gate stays open, also long after its record with the gate
  // closed was made (step_memory_s); graph's, 1.5x worse, is closed again.
  const ControllerOptions options;
  GatedKinds device;
  device.eager_tail = 0.015;
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  device.run(c, 40000);  // 40 s
  int open = 0, samples = 0;
  for (; device.now < 400.0; ++samples) {  // the next 360 s: 3x step_memory_s
    device.run(c, 100);
    open += !c.closes_gate("eager");
  }
  EXPECT_GT(open, 0.9 * samples) << "open most of the time (its record may have no say at a step it moves to)";
  EXPECT_LE(device.kind(c, "eager").gate_failures, 4);
  EXPECT_TRUE(c.closes_gate("graph"));
  EXPECT_GE(device.kind(c, "graph").gate_failures, 1);
}

TEST(LatencyController, ClosesAKeptGateAgainWhenItLengthensItsKindsTail) {
  // eager is late on 0.8% of its jobs, gate open or closed, each of them 8% over its target:
  // its gate's try holds. Then its work changes: with its gate open, 4.8% of its jobs are late.
  // Its gate is closed again within seconds, and it keeps within its target. (The
  // shape of a case on an H200, octopus-bench contention's conv net with its gate kept open at
  // a step: 437 of 9587 jobs over its 1.5x target, where with it closed 60 of 7615 had been.
  // This scripted device's case passes: the real one's cause is not this alone.)
  ControllerOptions options;
  options.slack = 0.0;  // no steps down with slack ...
  options.explore_samples = 1u << 30;  // ... nor to explore: the step stays where the targets hold
  GatedKinds device;
  device.eager_tail = 0.008;
  device.tail_latency = 1.7e-3;  // its target: 1.5x an alone p99 of about 1.05 ms
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  const auto kept = [&] { return !c.closes_gate("eager") && !device.kind(c, "eager").gate_on_trial; };
  for (int i = 0; i < 100000 && !kept(); ++i) device.run(c, 1);
  ASSERT_TRUE(kept());
  device.eager_open_tail = 0.04;
  const GatedKinds::Watched w = device.watch_eager(c, 600);  // the next 60 s
  ASSERT_TRUE(w.after.target_s);
  EXPECT_GT(device.tail_latency, *w.after.target_s);
  EXPECT_LT(device.tail_latency, options.severe_ratio * *w.after.target_s);
  EXPECT_GE(w.within, 0.985) << "gate open " << w.open << " of " << w.rounds;
  EXPECT_LT(w.open, w.rounds / 10);
  EXPECT_GE(w.after.gate_failures, w.before.gate_failures + 1);
}

TEST(LatencyController, ClosesAGateThatCostsItsKindItsTarget) {
  // eager is late on 0.3% of its jobs with its gate closed and on 1.3% with it open: a gap the
  // records' means of 128 jobs cannot see (the try holds, and its spent budgets used to climb
  // with the gate left open most of the time: 98.8-99.1% of its jobs within target), which
  // its tail over hundreds of jobs shows: the gate closes, and it keeps within its target.
  for (const unsigned seed : {1u, 2u, 3u}) {
    const ControllerOptions options;
    GatedKinds device;
    device.rng.seed(seed);
    device.eager_tail = 0.003;
    device.eager_open_tail = 0.01;
    device.tail_latency = 1.7e-3;  // over its target (1.5x an alone p99 of about 1.05 ms), under severe
    LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
    device.run(c, 20000);  // 20 s
    const GatedKinds::Watched w = device.watch_eager(c, 600);  // the next 60 s
    EXPECT_GE(w.within, 0.99) << "seed " << seed << ", gate open " << w.open << " of " << w.rounds;
    EXPECT_LT(w.open, w.rounds / 10) << "seed " << seed;
    // Its stats carry the tails the decision read: at the step it ended at, closed.
    const StepLatency& at = w.after.steps[static_cast<std::size_t>(c.step())];
    EXPECT_GE(at.closed_tail_jobs, 400.0) << "seed " << seed;
    EXPECT_LE(at.closed_tail_jobs, 800.0) << "seed " << seed;
    EXPECT_LE(at.closed_tail_over, 0.01 * at.closed_tail_jobs) << "seed " << seed;
  }
}

TEST(LatencyController, TriesNoGateWhereGateTriesAreOff) {
  // As LeavesTheGateOpenForTheKindsTheYieldDoesNotHelp, where eager's try would hold: with
  // try_gates off (the yield pinned on), every kind's leases close the gate throughout.
  ControllerOptions options;
  options.try_gates = false;
  GatedKinds device;
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  device.run(c, 33000);  // 33 s (each run is 1 ms)
  ASSERT_GE(c.step(), 1);
  for (const KindControl& k : c.kinds()) {
    EXPECT_TRUE(k.closes_gate) << k.kind;
    EXPECT_EQ(k.gate_trials, 0) << k.kind;
  }
}

TEST(LatencyController, TriesNoKindWithoutTheGateAtStepsWithoutTheYield) {
  const ControllerOptions options;
  GatedKinds device;
  LatencyController c(options, ladder_of(8));  // no step has device_yield
  device.run(c, 20000);
  for (const KindControl& k : c.kinds()) {
    EXPECT_EQ(k.gate_trials, 0) << k.kind;
    EXPECT_TRUE(k.closes_gate) << k.kind;
  }
}

TEST(LatencyController, AnOpenKindThatSpendsItsBudgetClosesTheGateAgainInsteadOfClimbing) {
  ControllerOptions options;
  options.slack = 0.0;  // no steps down: the step stays where the kinds' targets hold
  options.explore_samples = 1u << 30;
  GatedKinds device;
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  const auto kept = [&] { return !c.closes_gate("eager") && !device.kind(c, "eager").gate_on_trial; };
  for (int i = 0; i < 100000 && !kept(); ++i) device.run(c, 1);
  ASSERT_TRUE(kept());
  // eager's work changes: now the gate left open slows it past its target. Within a few jobs
  // the gate is closed for it again, with at most one climb (its budget spent before its
  // record at the step shows the change; at the step above it has no record with the gate
  // open, and the next spent budget closes it there).
  device.eager_harm = 2.5;
  const int64_t climbs = c.climbs();
  for (int i = 0; i < 100 && !c.closes_gate("eager"); ++i) device.run(c, 1);
  EXPECT_TRUE(c.closes_gate("eager"));
  EXPECT_LE(c.climbs(), climbs + 1);
  EXPECT_EQ(device.kind(c, "eager").gate_failures, 1);
  device.run(c, 3000);
  EXPECT_TRUE(c.closes_gate("eager")) << "its next try waits release_wait_s doubled";
  for (const KindControl& k : c.kinds()) EXPECT_LE(*k.recent_p99_s, *k.target_s) << k.kind;
}

TEST(LatencyController, AGateTryEndsWhenLatencyCriticalWorkStops) {
  // Every step yields, and the first meets the targets: a try under way at step 0, where
  // going idle moves no step.
  const ControllerOptions options;
  GatedKinds device;
  device.slowdown.assign(8, 1.2);
  device.eager_harm = device.graph_harm;  // both helped by the yield: every try fails
  std::vector<ControlStep> ladder = ladder_of(4);
  for (ControlStep& step : ladder) step.device_yield = true;
  LatencyController c(options, ladder);
  const auto on_trial = [&] {
    return device.kind(c, "graph").gate_on_trial || device.kind(c, "eager").gate_on_trial;
  };
  for (int i = 0; i < 40000 && !on_trial(); ++i) device.run(c, 1);
  ASSERT_TRUE(on_trial());
  ASSERT_EQ(c.step(), 0);
  c.tick(device.now + options.idle_s * 1.01);
  for (const KindControl& k : c.kinds()) {
    EXPECT_FALSE(k.gate_on_trial) << k.kind;
    EXPECT_TRUE(k.closes_gate) << k.kind;
  }
  EXPECT_TRUE(c.closes_gate("a kind never seen"));
}

TEST(LatencyController, AGateTryTooRareToJudgeEndsClosed) {
  // "rare" (an absolute target) comes every 4 s: in a try it cannot collect the 16 jobs its
  // record needs, so the try ends after gate_trial_limit_s with the gate closed, as a failure,
  // and does not hold the controller (no descents or releases while a try is under way).
  ControllerOptions options;
  options.record_jobs = 4;
  GatedKinds device;
  LatencyController c(options, default_ladder(132, {8, 16, 24, 32}));
  c.set_target("rare", LatencyTarget{2e-3});
  double on_trial_since = -1.0, longest = 0.0;
  for (int i = 0; i < 400000; ++i) {  // 400 s
    device.run(c, 1);
    if (i % 4000 == 0) c.observe("rare", kAlone * device.noise(device.rng), c.probing(), device.now);
    const bool on_trial = GatedKinds::kind(c, "rare").gate_on_trial;
    if (on_trial && on_trial_since < 0) on_trial_since = device.now;
    if (!on_trial && on_trial_since >= 0) {
      longest = std::max(longest, device.now - on_trial_since);
      on_trial_since = -1.0;
    }
  }
  const KindControl rare = GatedKinds::kind(c, "rare");
  ASSERT_GE(rare.gate_trials, 1);
  EXPECT_EQ(rare.gate_failures, rare.gate_trials - (rare.gate_on_trial ? 1 : 0));
  EXPECT_GT(longest, options.gate_trial_limit_s);
  EXPECT_LT(longest, options.gate_trial_limit_s + 1.0);
  EXPECT_FALSE(c.closes_gate("eager")) << "the other kinds' tries go on";
}

TEST(LatencyController, WhereNoStepMeetsTheTargetRestsAtTheStepWithTheFewestLateJobs) {
  // At every step some jobs are over the target (1.5 x ~1.05 ms): 20, 6, 4, 2, 3, 5, 8 and 8%
  // of them (3 ms; the others 1.2 ms). Records of 128 jobs hold a few late jobs each and tell
  // neighbouring steps apart by chance only: the controller used to rest at step 1, 6% of its
  // jobs late, three times step 3's share (5.5-6.2% over these seeds). A step's first 15 jobs
  // after a change, while the old step's work drains, are late half the time and unsettled, as
  // the scheduler says.
  const std::vector<double> late = {0.20, 0.06, 0.04, 0.02, 0.03, 0.05, 0.08, 0.08};
  for (unsigned seed : {1u, 2u, 3u}) {
    LatencyController c(ControllerOptions{}, ladder_of(late.size()));
    c.set_target("lc", LatencyTarget{});
    std::mt19937 rng{seed};
    std::uniform_real_distribution<double> u{0.0, 1.0}, noise{0.95, 1.05};
    double now = 0.0, over = 0.0, jobs = 0.0;
    std::vector<double> seconds(late.size(), 0.0);
    int last = c.step(), since_change = 1000;
    for (; now < 120.0; ++since_change) {
      now += kPeriod;
      const bool probe = c.probing();
      const double share = std::max(late[static_cast<std::size_t>(c.step())], since_change < 15 ? 0.5 : 0.0);
      const double l = probe ? kAlone * noise(rng) : (u(rng) < share ? 3e-3 : 1.2e-3) * noise(rng);
      c.observe("lc", l, probe, now, since_change >= 15);
      if (now > 20.0 && !probe) {
        jobs += 1.0;
        over += l > 1.575e-3 ? 1.0 : 0.0;
        seconds[static_cast<std::size_t>(c.step())] += kPeriod;
      }
      if (c.step() != last) {
        last = c.step();
        since_change = 0;
      }
    }
    // Step 2 or 3 (4 or 2%: tails of 400-800 jobs tell them apart only at times), never step 1.
    EXPECT_LT(over / jobs, 0.045) << "seed " << seed;
    EXPECT_GT((seconds[2] + seconds[3] + seconds[4]) / 100.0, 0.9) << "seed " << seed;
  }
}

TEST(DefaultLadder, YieldsAtEveryStepOrNoneWherePinned) {
  for (const std::vector<int>& reserves : {std::vector<int>{8, 16, 24, 32}, std::vector<int>{}}) {
    const std::vector<ControlStep> none = default_ladder(132, reserves, false);
    const std::vector<ControlStep> every = default_ladder(132, reserves, true);
    for (const ControlStep& step : none) EXPECT_FALSE(step.device_yield);
    for (const ControlStep& step : every) EXPECT_TRUE(step.device_yield);
    for (const auto* ladder : {&none, &every}) {
      for (std::size_t i = 1; i < ladder->size(); ++i) {
        EXPECT_FALSE(same_settings((*ladder)[i - 1], (*ladder)[i])) << "step " << i << " repeats the one below";
      }
    }
  }
  // Unpinned, the first step never yields and the others do.
  const std::vector<ControlStep> ladder = default_ladder(132, {8, 16, 24, 32});
  EXPECT_FALSE(ladder.front().device_yield);
  EXPECT_TRUE(ladder.back().device_yield);
}

TEST(DefaultLadder, GoesFromPermissiveToProtectiveAndUsesTheReservesOffered) {
  const std::vector<ControlStep> ladder = default_ladder(132, {8, 16, 24, 32});
  ASSERT_GE(ladder.size(), 6u);
  EXPECT_EQ(ladder.front().reserved_sms, 0);
  EXPECT_EQ(ladder.front().throttle, ThrottleMode::Off);
  EXPECT_EQ(ladder.back().throttle, ThrottleMode::Held);
  EXPECT_EQ(ladder.back().in_flight, 1);
  EXPECT_EQ(ladder.back().reserved_sms, 32);
  for (std::size_t i = 1; i < ladder.size(); ++i) {
    EXPECT_LE(ladder[i].slice_budget_s, ladder[i - 1].slice_budget_s);
    EXPECT_GE(ladder[i].reserved_sms, ladder[i - 1].reserved_sms);
    EXPECT_LE(ladder[i].in_flight, ladder[i - 1].in_flight);
  }
  // Without partitions, no step reserves SMs, and no two steps are the same.
  const std::vector<ControlStep> flat = default_ladder(132, {});
  for (const ControlStep& s : flat) EXPECT_EQ(s.reserved_sms, 0);
  EXPECT_LT(flat.size(), ladder.size());
}

TEST(DefaultLadder, HasAStepPerPartitionTheDeviceMade) {
  // An H200's partitions take whole groups of 8 of its 132 SMs, so for 6-25% of them free they
  // keep 12, 20, 28 and 36 free; matched to the nearest reserve, the 12% step took 12 again and
  // 28 went unused. Each is a step of its own, in order, and the time steps keep the most; a
  // reserve given twice, 0 or all the SMs is no step.
  const std::vector<ControlStep> ladder = default_ladder(132, {28, 12, 36, 20, 20, 0, 132});
  std::vector<int> whole_unit_reserves;
  for (const ControlStep& s : ladder) {
    if (s.slice_budget_s >= kWholeSliceS) whole_unit_reserves.push_back(s.reserved_sms);
  }
  EXPECT_EQ(whole_unit_reserves, (std::vector<int>{0, 12, 20, 28, 36}));
  ASSERT_EQ(ladder.size(), 8u);
  for (std::size_t i = 5; i < ladder.size(); ++i) {
    EXPECT_LT(ladder[i].slice_budget_s, kWholeSliceS);
    EXPECT_EQ(ladder[i].reserved_sms, 36);
  }
}

}  // namespace
}  // namespace octopus::scheduler

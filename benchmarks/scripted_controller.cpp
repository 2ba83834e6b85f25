// The latency controller (pure logic, no device) against scripted devices where no step, or
// only one, meets the target: what share of jobs it leaves late and where it rests. The
// numbers the docs give for the controller's tails per step come from this program; its JSON
// goes under benchmarks/results/. Build and run (here, or against an older controller's
// sources to compare):
//   g++ -O2 -std=c++17 -Icsrc benchmarks/scripted_controller.cpp csrc/octopus/scheduler/latency_controller.cpp -o /tmp/scripted_controller
//   /tmp/scripted_controller "<which controller>" > benchmarks/results/scripted_controller_<date>_<tag>.json
//
// Each kind sends a job every 2 ms in turn; alone (during probes) a job takes 1 ms +-5%, so a
// kind's target (1.5x its alone p99) is about 1.575 ms. At step s a job is late (3 ms) with the
// kind's scripted probability there, else 1.2 ms (+-5%). The first `drain` jobs after a change
// are late half the time and unsettled, as the scheduler reports jobs that met the earlier
// step's work. 120 s per run; the late share and the time per step count from 20 s on.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "octopus/scheduler/latency_controller.h"

using octopus::scheduler::ControllerOptions;
using octopus::scheduler::ControlStep;
using octopus::scheduler::LatencyController;
using octopus::scheduler::LatencyTarget;

namespace {

struct Scenario {
  const char* name;
  std::vector<std::vector<double>> late;  // per kind, per step: the share of its jobs late
  int drain;                              // jobs after a change that met the earlier step's work
};

std::vector<ControlStep> ladder_of(std::size_t n) {
  std::vector<ControlStep> ladder(n);
  for (std::size_t i = 0; i < n; ++i) ladder[i].slice_budget_s = 8e-3 / static_cast<double>(1 << i);
  return ladder;
}

void run(const Scenario& s, unsigned seed, bool last) {
  const std::size_t steps = s.late[0].size(), kinds = s.late.size();
  LatencyController c(ControllerOptions{}, ladder_of(steps));
  std::vector<std::string> names;
  for (std::size_t k = 0; k < kinds; ++k) {
    names.push_back("lc" + std::to_string(k));
    c.set_target(names.back(), LatencyTarget{});
  }
  std::mt19937 rng{seed};
  std::uniform_real_distribution<double> u{0.0, 1.0}, noise{0.95, 1.05};
  std::vector<double> jobs(kinds, 0.0), over(kinds, 0.0), seconds(steps, 0.0);
  int at = c.step(), since_change = 1 << 20, changes = 0;
  const double period = 2e-3;
  for (double now = 0.0; now < 120.0; ++since_change) {
    for (std::size_t k = 0; k < kinds; ++k) {
      now += period / static_cast<double>(kinds);
      const bool probe = c.probing();
      const double share = std::max(s.late[k][static_cast<std::size_t>(c.step())], since_change < s.drain ? 0.5 : 0.0);
      const double l = probe ? 1e-3 * noise(rng) : (u(rng) < share ? 3e-3 : 1.2e-3) * noise(rng);
      c.observe(names[k], l, probe, now, since_change >= s.drain);
      if (now > 20.0 && !probe) {
        jobs[k] += 1.0;
        over[k] += l > 1.575e-3 ? 1.0 : 0.0;
        seconds[static_cast<std::size_t>(c.step())] += period / static_cast<double>(kinds);
      }
    }
    if (c.step() != at) {
      at = c.step();
      since_change = 0;
      changes += 1;
    }
  }
  std::printf("    {\"scenario\": \"%s\", \"seed\": %u, \"late_share\": [", s.name, seed);
  for (std::size_t k = 0; k < kinds; ++k) std::printf("%s%.5f", k ? ", " : "", over[k] / jobs[k]);
  std::printf("], \"share_of_time_at_step\": [");
  double measured = 0.0;
  for (const double t : seconds) measured += t;
  for (std::size_t i = 0; i < steps; ++i) std::printf("%s%.4f", i ? ", " : "", seconds[i] / measured);
  std::printf("], \"final_step\": %d, \"step_changes\": %d}%s\n", c.step(), changes, last ? "" : ",");
}

}  // namespace

int main(int argc, char** argv) {
  const char* controller = argc > 1 ? argv[1] : "";
  const std::vector<double> slope = {0.20, 0.06, 0.04, 0.02, 0.03, 0.05, 0.08, 0.08};
  const std::vector<Scenario> scenarios = {
      {"slope: no step meets the target", {slope}, 15},
      {"step 3 meets the target, moves cost 40 jobs", {{0.20, 0.06, 0.04, 0.005, 0.03, 0.05, 0.08, 0.08}}, 40},
      {"two kinds, best at steps 3 and 6", {slope, {0.20, 0.10, 0.08, 0.07, 0.06, 0.05, 0.03, 0.04}}, 15},
  };
  const std::vector<unsigned> seeds = {1, 2, 3};
  std::printf("{\n  \"what\": \"benchmarks/scripted_controller.cpp: late share per kind and share of time per step, "
              "measured from 20 s to 120 s\",\n  \"controller\": \"%s\",\n  \"slope\": [", controller);
  for (std::size_t i = 0; i < slope.size(); ++i) std::printf("%s%.2f", i ? ", " : "", slope[i]);
  std::printf("],\n  \"runs\": [\n");
  for (std::size_t i = 0; i < scenarios.size(); ++i) {
    for (std::size_t j = 0; j < seeds.size(); ++j) {
      run(scenarios[i], seeds[j], i + 1 == scenarios.size() && j + 1 == seeds.size());
    }
  }
  std::printf("  ]\n}\n");
  return 0;
}

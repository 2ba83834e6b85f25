"""octopus-bench contention: its modes, the verdicts and the oracle it picks, a run of its
runner on the CPU (the simulated scheduler, tiny workloads), and the command on the CPU
(where only the lease, checkpoint and Batcher costs are measured)."""

import argparse
import gzip
import json
import os
import subprocess
import sys

import pytest
import torch

import octopus
from octopus.bench.contention import pooled, report, runner
from octopus.bench.contention.cli import main, run_workload
from octopus.bench.contention.modes import SWEEP, modes
from octopus.bench.contention.workloads import FAMILIES


def test_the_modes_cover_the_peers_the_sweep_and_both_targets():
    names = [m.name for m in modes()]
    assert len(names) == len(set(names))
    assert names[:4] == ["LC alone", "BE alone", "plain streams", "priority streams"]
    sweep = [m for m in modes() if m.kind == "sweep"]
    assert len(sweep) == len(SWEEP) and all(not m.options["latency_control"] for m in sweep)
    assert {m.options["reserved_sms"] for m in sweep} >= {0, 8, 16, 24}
    assert {m.options["throttle"] for m in sweep} == {"off", "held"}
    assert {m.options["device_yield"] for m in sweep} == {False, True}
    controller = [m for m in modes() if m.kind == "controller"]
    assert [m.target_ratio for m in controller] == [1.5, 3.0]
    assert all(m.options == {"latency_ratio": m.target_ratio} and m.slice_budget_s is None for m in controller)
    assert not [m for m in modes(sweep=False) if m.kind == "sweep"]


def test_error_budgets_run_the_controller_once_per_budget():
    controller = [m for m in modes(sweep=False, error_budgets=[2, 8]) if m.kind == "controller"]
    assert [(m.target_ratio, m.options["latency_error_budget"]) for m in controller] == [
        (1.5, 2), (1.5, 8), (3.0, 2), (3.0, 8)]
    assert len({m.name for m in controller}) == 4 and all("error budget" in m.name for m in controller)


def test_pinned_yield_adds_the_controller_with_the_yield_pinned_on():
    controller = [m for m in modes(sweep=False, pinned_yield=True) if m.kind == "controller"]
    assert [(m.target_ratio, m.options.get("device_yield")) for m in controller] == [
        (1.5, None), (3.0, None), (1.5, True), (3.0, True)]
    assert len({m.name for m in controller}) == 4
    assert [m for m in modes(sweep=False) if m.kind == "controller"] == controller[:2]


def row(name, kind, lc_ms, be_per_s):
    return dict(name=name, kind=kind, lc_ms=lc_ms, be_per_s=be_per_s)


def test_verdicts_ratios_and_the_oracle():
    alone = [1.0] * 99 + [1.2]  # p50 1.0, p99 1.0 (nearest rank), 1.5x target = 1.5 ms
    rows = [row("LC alone", "alone", {"a": alone}, {}),
            row("BE alone", "alone", {}, {"x": 10.0, "y": 4.0}),
            # 2 of 100 over 1.5 ms: 98% within the target
            row("fixed: loose", "sweep", {"a": [1.2] * 98 + [2.0, 2.0]}, {"x": 10.0, "y": 4.0}),
            # within, but BE y at 75%
            row("fixed: tight", "sweep", {"a": [1.1] * 100}, {"x": 9.0, "y": 3.0}),
            # within, BE at 90% and 85%
            row("fixed: right", "sweep", {"a": [1.3] * 100}, {"x": 9.0, "y": 3.4}),
            # within, but p50 over 2x the alone p50
            row("fixed: slow", "sweep", {"a": [1.45] * 100}, {"x": 9.5, "y": 3.9}),
            dict(name="fixed: broken", kind="sweep", error="RuntimeError: no partition")]
    rows[5]["lc_ms"]["a"] = [2.5] * 100
    summary = report.summarize(rows)
    by = {r["name"]: r for r in rows}
    assert summary["lc_alone"]["a"] == dict(p50_ms=1.0, p99_ms=1.0)
    assert by["fixed: loose"]["lc"]["a"]["within_1.5x"] == 0.98 and not by["fixed: loose"]["meets"]["1.5x"]
    assert by["fixed: loose"]["meets"]["3x"]  # 2.0 <= 3.0
    assert by["fixed: tight"]["be_share_min"] == 0.75 and not by["fixed: tight"]["meets"]["1.5x"]
    assert by["fixed: right"]["meets"]["1.5x"] and by["fixed: right"]["be_share"] == {"x": 0.9, "y": 0.85}
    assert by["fixed: slow"]["lc"]["a"]["p50_over_alone_p50"] == 2.5 and not by["fixed: slow"]["meets"]["3x"]
    assert summary["oracle"] == "fixed: right"
    table = report.format_table(rows, summary["oracle"])
    assert "fixed: right (oracle)" in table and "min 85%" in table and "error: RuntimeError: no partition" in table
    assert "1.5x:yes 3x:yes" in table
    assert "host" not in table  # no row has its jobs' start times


def test_the_alone_latency_pools_every_lc_alone_window():
    # A window with a burst (2 of 100 jobs at 4 ms: its p99, the 99th smallest, is 4.0) and one
    # without: pooled, 2 of 200 jobs, the p99 (the 198th smallest) is 1.0 ms.
    rows = [row("LC alone", "alone", {"a": [1.0] * 98 + [4.0] * 2}, {}), row("BE alone", "alone", {}, {"x": 10.0}),
            row("ctl", "controller", {"a": [1.0] * 97 + [2.0] * 3}, {"x": 9.0}),
            dict(row("LC alone", "alone", {"a": [1.0] * 100}, {}), repeat=1)]
    summary = report.summarize(rows)
    assert summary["lc_alone"]["a"] == dict(p50_ms=1.0, p99_ms=1.0)
    assert rows[2]["lc"]["a"]["within_1.5x"] == 0.97 and not rows[2]["meets"]["1.5x"]
    assert rows[0]["lc"]["a"]["p99_over_alone_p99"] == 4.0  # each window against the pooled figures
    # The first window alone: its burst sets a 6 ms target, which the controller's row meets.
    assert report.summarize(rows[:3])["lc_alone"]["a"] == dict(p50_ms=1.0, p99_ms=4.0)
    assert rows[2]["meets"]["1.5x"]


def test_the_jobs_over_a_target_are_told_apart_by_where_their_time_went():
    rows = [row("LC alone", "alone", {"a": [1.0] * 100}, {}), row("BE alone", "alone", {}, {"x": 10.0}),
            # 4 of 100 over 1.5 ms: three began 1.5 ms late (the host's), one ran 3 ms on the device
            row("late", "sweep", {"a": [1.0] * 96 + [2.0, 2.0, 2.0, 3.5]}, {"x": 9.0}),
            row("within", "sweep", {"a": [1.2] * 100}, {"x": 9.0})]
    rows[2]["lc_start_ms"] = {"a": [0.1] * 96 + [1.5, 1.5, 1.5, 0.5]}
    rows[3]["lc_start_ms"] = {"a": [0.1] * 100}
    report.summarize(rows)
    late, within = rows[2]["lc"]["a"], rows[3]["lc"]["a"]
    assert late["within_1.5x"] == 0.96 and late["over_1.5x_host_share"] == 0.75
    assert late["over_3x_host_share"] == 0.0  # only the 3.5 ms job is over 3 ms, and it began 0.5 ms late
    assert within["over_1.5x_host_share"] is None
    table = report.format_table(rows).splitlines()
    assert "a 1.00/2.00x 96.0% (host 75%)" in table[2] and "host" not in table[3]


def test_a_controller_row_says_where_the_controller_spent_the_run():
    rows = [row("LC alone", "alone", {"a": [1.0] * 100}, {}), row("BE alone", "alone", {}, {"x": 10.0}),
            row("ctl", "controller", {"a": [1.2] * 100}, {"x": 9.0})]
    at = lambda jobs, p50, p99: dict(jobs=jobs, over=0, p50_s=p50, p99_s=p99)  # noqa: E731
    kinds = dict(a=dict(alone_p50_s=1e-3, alone_p99_s=2e-3, steps=[at(300, 1.5e-3, 5e-3), at(0, None, None),
                                                                     at(900, 1.2e-3, 3e-3), at(19, 9e-3, 9e-3),
                                                                     at(40, None, None)]),
                 b=dict(alone_p50_s=None, alone_p99_s=None, steps=[at(300, 1e-3, 1e-3)] * 5))  # no alone yet
    rows[2]["control"] = dict(enabled=True, step=2, steps=5, seconds_at_steps=[1.0, 0.0, 3.0, 0.0, 0.0], climbs=3,
                              median_climbs=1, descents=1, kinds=kinds)
    report.summarize(rows)
    lines = report.format_table(rows).splitlines()
    assert lines[2].endswith("| step 2/4, % of time per step [25 0 75 0 0], climbs 3 (1 median), descents 1")
    # What each step with 20 jobs or more bought each kind with an alone latency.
    # (Step 4's jobs all ran with the gate left open, or unsettled: it has no percentiles.)
    assert lines[3] == "    by step, p50/p99 over alone (jobs): a s0 1.50/2.50 (300), s2 1.20/1.50 (900), s4 -/- (40)"
    assert len(lines) == 4  # no kind with a target yet: no line of the controller's own count
    # The controller's own count of each kind within its target, beside the table's.
    kinds["a"].update(target_s=3e-3, judged=1240, within_target=1209)
    kinds["b"].update(target_s=1.5e-3, judged=300, within_target=300)  # no alone p99: left out
    assert report.format_table(rows).splitlines()[4] == (
        "    the controller's view (request to completion on the device): a 97.5% within 3.000 ms (alone p99 2.000)")
    rows[2]["lc_arrival"] = True  # its LC jobs gave acquire their arrival times
    assert report.format_table(rows).splitlines()[4].startswith("    the controller's view (arrival to completion")
    del rows[2]["lc_arrival"]
    assert "step" not in report.format_table(rows[:2])
    # The BE kinds it tried releasing: which it kept released, its tries and how many were undone.
    rows[2]["control"]["best_effort_kinds"] = dict(x=dict(released=True, trials=1, failures=0),
                                                   y=dict(released=False, trials=3, failures=3))
    assert report.format_table(rows).splitlines()[2].endswith(
        "descents 1 | released x (tries/undone: x 1/0, y 3/3)")
    rows[2]["control"]["best_effort_kinds"] = dict(x=dict(released=False, trials=0, failures=0))
    assert report.format_table(rows).splitlines()[2].endswith("descents 1")
    # The LC kinds it tried without the yield gate: whose gate it left open, tries and how many undone.
    kinds["a"].update(closes_gate=False, gate_trials=1, gate_failures=0)
    kinds["b"].update(closes_gate=True, gate_trials=2, gate_failures=2)
    assert report.format_table(rows).splitlines()[2].endswith(
        "descents 1 | gate open for a (tries/undone: a 1/0, b 2/2)")
    # With the tails the stats have (at the step it ended at): the share over target each way.
    kinds["a"]["steps"][2].update(closed_tail=(800.0, 4.0), open_tail=(600.0, 18.0))
    assert report.format_table(rows).splitlines()[2].endswith(
        "| gate open for a (tries/undone: a 1/0, b 2/2; over target at the step, gate closed / open: "
        "a 0.5% of 800 / 3.0% of 600)")
    kinds["a"]["steps"][2]["open_tail"] = (0.0, 0.0)
    assert report.format_table(rows).splitlines()[2].endswith("a 0.5% of 800 / -)")
    kinds["a"].update(closes_gate=True, gate_trials=0, gate_failures=0)
    kinds["b"].update(gate_trials=0, gate_failures=0)
    assert report.format_table(rows).splitlines()[2].endswith("descents 1")
    rows[2]["control"]["unhelpful_descents"] = 1
    assert report.format_table(rows).splitlines()[2].endswith("descents 1 (1 from steps over target)")


def test_a_controller_row_says_what_its_moves_cost_in_the_measured_window():
    step = lambda jobs, over: dict(jobs=jobs, over=over)  # noqa: E731
    before = dict(enabled=True, seconds_at_steps=[2.0, 3.0, 0.0],
                  kinds=dict(a=dict(steps=[step(100, 90), step(500, 5), step(0, 0)])))
    after = dict(enabled=True, seconds_at_steps=[2.5, 9.0, 2.5],
                 kinds=dict(a=dict(steps=[step(125, 100), step(1700, 11), step(500, 24)]),
                            b=dict(steps=[step(40, 0), step(10, 1), step(0, 0)])))  # b first seen in the window
    window = runner.control_in_window(before, after)
    assert window == dict(seconds_at_steps=[0.5, 6.0, 2.5],
                          kinds=dict(a=[step(25, 10), step(1200, 6), step(500, 24)],
                                     b=[step(40, 0), step(10, 1), step(0, 0)]))
    assert runner.control_in_window(None, after) is None  # no scheduler
    assert runner.control_in_window(before, dict(after, enabled=False)) is None  # latency control off
    rows = [row("LC alone", "alone", {"a": [1.0] * 100}, {}), row("BE alone", "alone", {}, {"x": 10.0}),
            row("ctl", "controller", {"a": [1.2] * 100}, {"x": 9.0})]
    rows[2]["control_window"] = window
    report.summarize(rows)
    # The step held longest (s1, 6 of 9 s) against the others, each kind by the controller's count.
    assert report.format_table(rows).splitlines()[-1] == (
        "    in the window: % of time per step [6 67 28]; over target at s1 / at the other steps: "
        "a 6 of 1200 (0.5%) / 34 of 525 (6.5%); b 1 of 10 (10.0%) / 0 of 40 (0.0%)")
    rows[2]["control_window"] = dict(seconds_at_steps=[0.0, 0.0, 0.0], kinds={})
    assert "in the window" not in report.format_table(rows)


def test_a_lease_row_says_how_the_scheduler_measured_each_be_jobs_slices():
    rows = [row("LC alone", "alone", {"a": [1.0] * 100}, {}), row("BE alone", "alone", {}, {"x": 10.0, "y": 5.0}),
            row("sliced", "sweep", {"a": [1.2] * 100}, {"x": 9.0, "y": 5.0})]
    rows[2]["be_slicing"] = dict(x=dict(seconds_per_unit=8.34e-7, host_seconds_per_slice=4.066e-3),
                                 y=dict(seconds_per_unit=None, host_seconds_per_slice=None))  # never sliced
    report.summarize(rows)
    lines = report.format_table(rows).splitlines()
    assert lines[3] == "    BE slices, by the scheduler's measure: x host 4.066 ms a slice, device 8.34e-07 s a unit"
    rows[2]["be_slicing"]["y"] = dict(seconds_per_unit=2.6e-12, host_seconds_per_slice=None)
    assert report.format_table(rows).splitlines()[3].endswith("; y device 2.6e-12 s a unit")
    rows[2]["be_slicing"] = dict(x=dict(seconds_per_unit=None, host_seconds_per_slice=None))
    assert len(report.format_table(rows).splitlines()) == 3  # nothing measured: no line


def test_repeated_runs_say_how_often_each_mode_met_each_target():
    rows = [row("LC alone", "alone", {"a": [1.0] * 100}, {}), row("BE alone", "alone", {}, {"x": 10.0}),
            row("ctl", "controller", {"a": [1.2] * 100}, {"x": 9.0}),   # meets both, BE 90%
            row("ctl", "controller", {"a": [2.0] * 100}, {"x": 4.0}),   # 1.5x missed, BE 40%: neither
            row("once", "peer", {"a": [1.2] * 100}, {"x": 9.0})]
    report.summarize(rows)
    assert report.format_repeats(rows).splitlines() == [
        f"{'ctl':<58} met 1.5x in 1 of 2, 3x in 1 of 2 runs | BE min 40-90%"]


def test_without_a_fixed_configuration_that_meets_the_target_the_oracle_is_the_closest():
    rows = [row("LC alone", "alone", {"a": [1.0] * 100}, {}), row("BE alone", "alone", {}, {"x": 1.0}),
            row("fixed: p", "sweep", {"a": [1.0] * 90 + [9.0] * 10}, {"x": 1.0}),
            row("fixed: q", "sweep", {"a": [1.0] * 95 + [9.0] * 5}, {"x": 0.5})]
    assert report.summarize(rows)["oracle"] == "fixed: q"


def _result(path, family, alone_ms, be_alone, runs):
    """A raw result of one call, as --json writes it: an LC-alone and a BE-alone row of
    ``family`` and the controller runs ``runs`` (lc_ms, be_per_s, window seconds per step)."""
    modes = [row("LC alone", "alone", {"a": alone_ms}, {}), row("BE alone", "alone", {}, {"x": be_alone})]
    for lc_ms, be_per_s, seconds in runs:
        modes.append(dict(row("ctl", "controller", {"a": lc_ms}, {"x": be_per_s}),
                          control_window=dict(seconds_at_steps=seconds, kinds={})))
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(dict(workloads=[dict(workload=family, modes=modes)]), f)
    return str(path)


def test_judge_holds_runs_of_several_calls_to_the_median_of_their_alone_rows(tmp_path):
    # Three calls' alone p99s 1.0, 2.0 and 1.5 ms (median 1.5: a 2.25 ms target), BE alone 10,
    # 12 and 11 per second (median 11). A run 99% within 2.25 ms with BE at 9/11 meets the
    # target against the pooled figures, where its own call's (1.0 ms, 10/s) says it misses.
    within = [2.0] * 99 + [3.0]
    files = [_result(tmp_path / "ab_A1.json", "f", [1.0] * 100, 10.0, [(within, 9.0, [1.0, 3.0, 0.0])]),
             _result(tmp_path / "ab_A2.json.gz", "f", [2.0] * 100, 12.0, [([2.5] * 100, 9.0, [0.0, 1.0, 3.0])]),
             _result(tmp_path / "ab_B1.json", "f", [1.5] * 100, 11.0, [(within, 8.0, [0.0, 0.0, 4.0])])]
    judged = pooled.judge(files)
    base, be_base = judged["reference"]["f"]
    assert (base["a"]["p50_ms"], base["a"]["p99_ms"], base["a"]["rows"]) == (1.5, 1.5, 3) and be_base == {"x": 11.0}
    first, second, third = (run["row"] for run in judged["runs"])
    assert first["lc"]["a"]["within_1.5x"] == 0.99 and first["meets"]["1.5x"]
    assert not second["meets"]["1.5x"]  # 2.5 ms, over 2.25
    assert third["be_share_min"] == 8.0 / 11.0 and not third["meets"]["1.5x"]  # BE under 80%
    own = [row("LC alone", "alone", {"a": [1.0] * 100}, {}), row("BE alone", "alone", {}, {"x": 10.0}),
           row("ctl", "controller", {"a": within}, {"x": 9.0})]
    report.summarize(own)
    assert not own[2]["meets"]["1.5x"]  # its own call's alone row alone
    assert [run["group"] for run in judged["runs"]] == ["ab_A", "ab_A", "ab_B"]
    lines = pooled.format_judgement(judged).splitlines()
    assert lines[0].startswith("f reference, the median of the alone rows: a p50 1.500 / p99 1.500 ms (3 rows, "
                               "p99 1.000-2.000)")
    assert lines[1].endswith("1.5x:yes 3x:yes | window: s1 75%, top 0%")
    assert lines[-2:] == [
        "ab_A f, ctl: met 1.5x in 1 of 2, 3x in 2 of 2; BE min 82-82%; over half the window at the top step in 1 of 2",
        "ab_B f, ctl: met 1.5x in 0 of 1, 3x in 0 of 1; BE min 73-73%; over half the window at the top step in 1 of 1"]


def test_judge_groups_files_by_name_less_a_trailing_number():
    assert pooled.group_of("/x/ab_mlp_A1.json.gz") == "ab_mlp_A"
    assert pooled.group_of("ab_mlp_A12.json") == "ab_mlp_A"
    assert pooled.group_of("run.json") == "run" and pooled.group_of("7.json") == "7"


def test_judge_names_a_file_it_cannot_use(tmp_path, capsys):
    text = tmp_path / "notes.json"
    text.write_text("[1, 2]")
    for path, says in ((str(tmp_path / "missing.json"), "cannot be read"), (str(text), "no 'workloads' list")):
        with pytest.raises(SystemExit):
            main(["--judge", path])
        err = capsys.readouterr().err
        assert f"--judge: {path}" in err and says in err


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_familys_jobs_run_and_a_sliced_product_equals_the_whole(family):
    """Every LC job runs; every BE job cut in two (rows, or whole items) gives what one launch
    over all its units gives (the item ops exactly, the products to rounding)."""
    lc, be = FAMILIES[family](torch.device("cpu"), 2e-4)
    assert len(lc) == 2 and len(be) == 2
    for job in lc:
        out = job.run()
        assert job.period_s > 0 and torch.isfinite(out.values if isinstance(out, octopus.RaggedBatch) else out).all()
    for job in be:
        assert job.units >= 2
        half = job.units // 2
        if job.unit == "rows":
            whole = job.launch(0, job.units).clone()
            cut = torch.cat([job.launch(0, half).clone(), job.launch(half, job.units).clone()])
            torch.testing.assert_close(cut, whole, rtol=1e-5, atol=1e-5)
        else:
            assert job.batch is not None and job.units == len(job.batch)
            whole = job.launch(0, job.units).values
            cut = torch.cat([job.launch(0, half).values, job.launch(half, job.units).values])
            assert whole.numel() == job.batch.numel() and torch.equal(cut, whole)


def test_the_runner_runs_every_kind_of_mode_on_the_cpu():
    args = argparse.Namespace(scale=2e-4, warmup=0.05, measure=0.3, controller_warmup=0.1, no_sweep=True,
                              only=["target 1.5x", "priority"], repeats=2)
    result = run_workload("mlp", torch.device("cpu"), args)
    names = [(m["name"], m["repeat"]) for m in result["modes"]]
    assert names == [("LC alone", 0), ("BE alone", 0), ("priority streams", 0), ("priority streams", 1),
                     ("octopus latency control, target 1.5x", 0), ("octopus latency control, target 1.5x", 1),
                     ("LC alone", 1)]  # the LC jobs alone again after the other modes
    for m in result["modes"]:
        assert "error" not in m, m.get("error")
    controller = result["modes"][-2]
    assert controller["control"]["enabled"] and set(controller["lc_ms"]) == {"mlp", "ragged"}
    window = controller["control_window"]  # the controller over the measured window alone
    assert 0 <= sum(window["seconds_at_steps"]) <= sum(controller["control"]["seconds_at_steps"]) + 1e-9
    for name, steps in window["kinds"].items():
        whole = controller["control"]["kinds"][name]["steps"]
        assert all(0 <= s["over"] <= s["jobs"] <= w["jobs"] for s, w in zip(steps, whole))
    assert "control_window" not in result["modes"][2]  # priority streams: no scheduler
    assert len(controller["lc_ms"]["ragged"]) >= 3  # (the CPU, two cores shared with the BE jobs, keeps up with few)
    for name, latencies in controller["lc_ms"].items():  # the host's part of each latency, and no more
        starts = controller["lc_start_ms"][name]
        assert len(starts) == len(latencies) and all(0 <= s <= t for s, t in zip(starts, latencies))
    for job in controller["lc"].values():
        assert job["start_p99_ms"] <= job["p99_ms"]
    assert controller["lc"]  # (at least one LC job had samples in the window)
    assert set(controller["be_per_s"]) == {"matmul", "ragged"} and all(v > 0 for v in controller["be_per_s"].values())
    slicing = controller["be_slicing"]  # the scheduler's measure of each BE job's slices
    assert set(slicing) == {"matmul", "ragged"}
    for measured in slicing.values():
        assert measured["host_seconds_per_slice"] is None or 0 < measured["host_seconds_per_slice"] < 10
    assert "be_slicing" not in result["modes"][2]  # priority streams: no scheduler
    assert "ragged" in result["lc_alone"]
    assert set(FAMILIES) == {"mlp", "convnet", "transformer"}


def test_a_trace_holds_each_controller_runs_timeline(tmp_path):
    args = argparse.Namespace(scale=2e-4, warmup=0.05, measure=0.3, controller_warmup=0.1, no_sweep=True,
                              only=["target 1.5x", "priority"], repeats=1, trace=str(tmp_path / "traces"))
    result = run_workload("mlp", torch.device("cpu"), args)
    controller = next(m for m in result["modes"] if m["kind"] == "controller")
    assert controller["trace"] == "mlp_octopus_latency_control_target_1.5x_0.trace.json.gz"
    assert sorted(os.listdir(tmp_path / "traces")) == [controller["trace"]]  # controller modes only
    assert all("trace" not in m for m in result["modes"] if m["kind"] != "controller")
    with gzip.open(tmp_path / "traces" / controller["trace"], "rt") as f:
        events = json.load(f)["traceEvents"]
    # Every BE job's leases, and the controller's settings (on the CPU's simulated device the
    # LC jobs run without leases).
    leased = {e["name"] for e in events if e.get("cat") == "lease" and e["args"]["class"] == "best_effort"}
    assert leased == {"matmul", "ragged"}
    assert any(e.get("ph") == "C" and e["name"] == "latency control" for e in events)


def test_a_trace_that_cannot_be_written_leaves_the_runs_measurements(tmp_path, capsys):
    traces = tmp_path / "traces"
    (traces / "mlp_octopus_latency_control_target_1.5x_0.trace.json.gz").mkdir(parents=True)  # not a file
    args = argparse.Namespace(scale=2e-4, warmup=0.05, measure=0.3, controller_warmup=0.1, no_sweep=True,
                              only=["target 1.5x"], repeats=1, trace=str(traces))
    result = run_workload("mlp", torch.device("cpu"), args)
    controller = next(m for m in result["modes"] if m["kind"] == "controller")
    assert "error" not in controller and controller["control"]["enabled"]
    assert "trace" not in controller and controller["trace_error"].startswith("IsADirectoryError")
    assert "its trace was not written: IsADirectoryError" in capsys.readouterr().err
    assert sorted(p.name for p in traces.iterdir()) == ["mlp_octopus_latency_control_target_1.5x_0.trace.json.gz"]


def test_stall_dumps_hold_every_threads_stack_and_name_the_stalled_job():
    # A 0.001 ms threshold: every LC job stalls by it.
    args = argparse.Namespace(scale=2e-4, warmup=0.05, measure=0.3, controller_warmup=0.1, no_sweep=True,
                              only=["plain"], stall_dump=0.001)
    result = run_workload("mlp", torch.device("cpu"), args)
    plain = next(m for m in result["modes"] if m["name"] == "plain streams")
    assert 0 < len(plain["stalls"]) <= 20
    for dump in plain["stalls"]:
        assert dump["job"] in ("mlp", "ragged") and dump["after_ms"] > 0.001
        stalled = [stack for name, stack in dump["stacks"].items() if name.endswith("(the stalled job)")]
        assert len(stalled) == 1 and "contention/" in "".join(stalled[0])  # in the job (its body or its launcher)
    assert "stalls" not in next(m for m in result["modes"] if m["name"] == "BE alone") or \
        not next(m for m in result["modes"] if m["name"] == "BE alone")["stalls"]
    assert "stalls" in report.format_table([plain])


def test_the_command_on_the_cpu(tmp_path):
    path = tmp_path / "contention.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "octopus.bench", "contention", "--json", str(path)],
                          capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stderr
    result = json.loads(path.read_text())
    assert result["workloads"] == [] and result["lc_arrival"] is False
    overhead = result["lease_overhead"][0]
    assert overhead["backend"] == "simulated" and overhead["python_us"] > 0
    assert 0 < overhead["beside_busy_p50_us"] <= overhead["beside_busy_p99_us"]
    assert result["checkpoint"][0]["checkpoint_us"] > 0
    assert result["batcher"][0]["back_to_back_us_per_request"] > 0
    python_own, short = result["gil_wakeup"]
    assert python_own["switch_interval_s"] == 5e-3 and short["switch_interval_s"] == 2e-4
    # Beside a thread running Python, a waking thread waits for the switch interval.
    assert python_own["late_p50_ms"] > 2.0 and short["late_p50_ms"] < python_own["late_p50_ms"]


def test_interference_runs_each_be_job_alone_behind_each_partition():
    args = argparse.Namespace(scale=2e-4, warmup=0.05, measure=0.3, controller_warmup=0.1, no_sweep=True,
                              only=["no mode has this name"], interference=[0, 4])
    result = run_workload("mlp", torch.device("cpu"), args)
    assert [m["name"] for m in result["modes"]] == ["LC alone", "BE alone"]
    assert set(result["interference"]) == {"matmul", "ragged"}
    for job, rows in result["interference"].items():
        assert [r["name"] for r in rows] == ["BE alone", "partition 0", "partition 4"]
        for r in rows:
            assert "error" not in r, r.get("error")
            assert r["be_only"] == job and set(r["be_per_s"]) == {job}  # the other BE job did not run
        for r in rows[1:]:
            assert r["options"]["reserved_sms"] == int(r["name"].split()[-1])
            # Against the workload's own LC alone row (on the CPU, an LC job that shares the cores
            # with a BE job may have no job in the window).
            assert r["lc"] and set(r["lc"]) <= {"mlp", "ragged"}
            for name, j in r["lc"].items():
                assert j["p99_over_alone_p99"] == pytest.approx(j["p99_ms"] / result["lc_alone"][name]["p99_ms"])
            assert set(r["be_share"]) == {job} and r["be_share"][job] > 0
    assert "partition 4" in report.format_table(result["interference"]["ragged"])


def test_interference_refuses_negative_sm_counts():
    with pytest.raises(SystemExit):
        main(["--interference", "-8"])


def test_an_lc_job_that_raises_fails_its_mode_instead_of_leaving_it_out():
    from octopus.bench.contention.modes import Mode
    from octopus.bench.contention.runner import Runner
    from octopus.bench.contention.workloads import LCJob

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the third job broke")

    runner = Runner([LCJob("fine", 2e-3, lambda: None, graph=False), LCJob("flaky", 2e-3, flaky, graph=False)], [],
                    torch.device("cpu"), warmup_s=0.02, measure_s=0.1, controller_warmup_s=0.02)
    with pytest.raises(RuntimeError, match="the third job broke"):
        runner.run(Mode("plain streams", lc="normal", be="none"))
    assert len(calls) == 3  # its thread stopped at the error; the mode ran to its end and raised it

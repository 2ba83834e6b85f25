"""``octopus-bench contention``: the command line, one run over the chosen workloads, the
printed tables and the raw JSON."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any, Dict, List, Optional

import torch

import octopus

from ..costs import batcher_overhead, checkpoint_cost, gil_wakeup, lease_overhead
from ..report import environment
from . import pooled, report
from .modes import TARGET_RATIOS, Mode, interference_modes, modes
from .runner import Runner
from .workloads import FAMILIES, BEJob, LCJob


def parser() -> argparse.ArgumentParser:
    from . import __doc__ as description
    p = argparse.ArgumentParser(prog="octopus-bench contention", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", choices=sorted(FAMILIES), default=["mlp", "convnet"])
    p.add_argument("--warmup", type=float, default=0.5, help="seconds each mode runs before it is measured")
    p.add_argument("--controller-warmup", type=float, default=8.0,
                   help="seconds the latency controller runs before it is measured (it probes, then settles: "
                        "a step down it tries comes after 2 s at a step)")
    p.add_argument("--measure", type=float, default=3.0, help="seconds each mode is measured")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies the BE work's size")
    p.add_argument("--no-sweep", action="store_true", help="leave out the fixed configurations (and the oracle)")
    p.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                   help="run only the modes whose name contains one of these (and the alone modes)")
    p.add_argument("--switch-interval", type=float, default=2e-4,
                   help="sys.setswitchinterval (seconds) while every mode runs, the peers too; the "
                        "default is the interval StreamScheduler keeps under latency control (0: Python's "
                        "own, except in the controller modes, whose scheduler lowers it to 0.2 ms)")
    p.add_argument("--stall-dump", type=float, default=None, metavar="MS",
                   help="record every thread's Python stack when an LC job has run for more than MS ms "
                        "(a diagnostic: the dumps go to the raw JSON, the count to the table)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of every mode but the alone ones (the controller's outcome varies from run to run: "
                        "the table then says in how many runs each mode met each target)")
    p.add_argument("--error-budgets", type=float, nargs="+", default=None, metavar="N",
                   help="run the controller modes once per SchedulerConfig.latency_error_budget given (an A/B)")
    p.add_argument("--pinned-yield", action="store_true",
                   help="also run the controller modes with device_yield pinned on (every LC lease makes "
                        "octopus's BE kernels step aside; no kind's gate tried open): an A/B")
    p.add_argument("--interference", type=int, nargs="+", default=None, metavar="SMS",
                   help="also run each BE job on its own beside the LC jobs, behind fixed partitions keeping "
                        "these many SMs free of BE work (0: none): which BE jobs a partition protects LC from")
    p.add_argument("--lc-arrival", action="store_true",
                   help="LC jobs give acquire their arrival times (arrived=): the controller then times them "
                        "from arrival, as this table does, rather than from acquire")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="record the scheduler's timeline in the controller modes and write each run's, warm-up "
                        "included, to DIR as gzipped Chrome-trace JSON (a diagnostic: recording adds to every "
                        "acquire and release)")
    p.add_argument("--json", default=None, help="write the raw measurements here")
    p.add_argument("--judge", nargs="+", default=None, metavar="FILE",
                   help="run nothing: judge the runs of these raw results (--json files, gzipped or not) against "
                        "the median of all their alone rows per workload family, grouped by file name less a "
                        "trailing number (an A/B across calls: pooled.py)")
    return p


def run_workload(name: str, device: torch.device, args: argparse.Namespace) -> Dict[str, Any]:
    lc_jobs, be_jobs = FAMILIES[name](device, args.scale)
    runner = Runner(lc_jobs, be_jobs, device, args.warmup, args.measure, args.controller_warmup,
                    getattr(args, "stall_dump", None), getattr(args, "lc_arrival", False))
    rows: List[Dict[str, Any]] = []
    repeats = getattr(args, "repeats", 1)
    for mode in modes(sweep=not args.no_sweep, error_budgets=getattr(args, "error_budgets", None),
                      pinned_yield=getattr(args, "pinned_yield", False)):
        if args.only and mode.kind != "alone" and not any(text in mode.name for text in args.only):
            continue
        for repeat in range(1 if mode.kind == "alone" else repeats):
            t0 = time.perf_counter()
            trace = trace_path(args, name, mode, repeat)
            try:
                row = runner.run(mode, trace)
            except Exception as error:  # noqa: BLE001 (recorded: the other modes still run)
                row = dict(name=mode.name, kind=mode.kind, error=f"{type(error).__name__}: {error}")
            row.update(seconds=time.perf_counter() - t0, repeat=repeat)
            if trace and "trace_error" in row:
                print(f"[{name}] {mode.name}: its trace was not written: {row['trace_error']}", file=sys.stderr)
            elif trace and os.path.isfile(trace):  # (a run that raised has one too)
                row["trace"] = os.path.basename(trace)
            rows.append(row)
            summary = report.summarize(rows)
            print(f"[{name}] " + report.format_table([row], summary["oracle"]), flush=True)
    if any(r["kind"] != "alone" for r in rows):
        # The LC jobs alone once more, after the other modes: their alone p99, every target's
        # base, rests on both windows (on an H200 a host burst in one 15-s window moved a job's
        # alone p99 from 0.40-0.47 ms to 0.67).
        t0 = time.perf_counter()
        lc_alone_mode = next(m for m in modes(sweep=False) if m.name == "LC alone")
        try:
            row = runner.run(lc_alone_mode)
        except Exception as error:  # noqa: BLE001 (recorded: the first window stands alone)
            row = dict(name=lc_alone_mode.name, kind=lc_alone_mode.kind, error=f"{type(error).__name__}: {error}")
        rows.append(dict(row, seconds=time.perf_counter() - t0, repeat=1))
        print(f"[{name}] " + report.format_table(rows[-1:], report.summarize(rows)["oracle"]), flush=True)
    summary = report.summarize(rows)
    result = dict(workload=name, lc_jobs={j.name: dict(period_ms=j.period_s * 1e3, graph=j.graph) for j in lc_jobs},
                  be_jobs={j.name: dict(units=j.units, unit=j.unit) for j in be_jobs}, modes=rows, **summary)
    free_sms = getattr(args, "interference", None)
    lc_alone = next((r for r in rows if r["name"] == "LC alone" and "lc_ms" in r), None)
    if free_sms and lc_alone is not None:
        result["interference"] = {job.name: run_interference(name, lc_jobs, job, lc_alone, free_sms, device, args)
                                  for job in be_jobs}
    return result


def trace_path(args: argparse.Namespace, workload: str, mode: Mode, repeat: int) -> Optional[str]:
    """Where a run's timeline goes (``--trace``): controller modes only."""
    directory = getattr(args, "trace", None)
    if not directory or mode.kind != "controller":
        return None
    os.makedirs(directory, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", mode.name).strip("_")
    return os.path.join(directory, f"{workload}_{slug}_{repeat}.trace.json.gz")


def run_interference(workload: str, lc_jobs: List[LCJob], job: BEJob, lc_alone: Dict[str, Any], free_sms: List[int],
                     device: torch.device, args: argparse.Namespace) -> List[Dict[str, Any]]:
    """One BE job on its own beside the LC jobs: its alone throughput, then one row per
    partition of ``interference_modes(free_sms)``, each LC job against its alone latency (the
    workload's "LC alone" row) and the BE job against its own alone throughput."""
    runner = Runner(lc_jobs, [job], device, args.warmup, args.measure, args.controller_warmup)
    rows: List[Dict[str, Any]] = [lc_alone]
    for mode in [m for m in modes(sweep=False) if m.name == "BE alone"] + interference_modes(free_sms):
        try:
            row = runner.run(mode)
        except Exception as error:  # noqa: BLE001 (recorded: the other partitions still run)
            row = dict(name=mode.name, kind=mode.kind, error=f"{type(error).__name__}: {error}")
        rows.append(dict(row, be_only=job.name))
    report.summarize(rows)
    for row in rows[2:]:
        print(f"[{workload}, {job.name} only] " + report.format_table([row]), flush=True)
    return rows[1:]


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    if args.judge:
        try:
            print(pooled.format_judgement(pooled.judge(args.judge)))
        except ValueError as error:
            parser().error(f"--judge: {error}")
        return 0
    if args.warmup < 0 or args.measure <= 0 or args.scale <= 0 or args.controller_warmup < 0 or args.repeats < 1:
        parser().error("--warmup, --controller-warmup must be non-negative, --measure and --scale positive, "
                       "--repeats at least 1")
    if args.interference and min(args.interference) < 0:
        parser().error(f"--interference: SM counts must be non-negative, got {args.interference}")
    has_cuda = torch.cuda.is_available() and octopus.built_with_cuda
    device = torch.device("cuda" if has_cuda else "cpu")
    overhead = [lease_overhead("simulated")]
    checkpoints = [checkpoint_cost("simulated")]
    batching = [batcher_overhead("simulated")]
    # Python's own switch interval, then the one the scheduler keeps under latency control.
    wakeups = [gil_wakeup(5e-3), gil_wakeup(2e-4)]
    workloads: List[Dict[str, Any]] = []
    switch_interval = sys.getswitchinterval()
    if has_cuda:
        overhead.insert(0, lease_overhead("cuda"))
        checkpoints.insert(0, checkpoint_cost("cuda"))
        batching.insert(0, batcher_overhead("cuda"))
        torch.backends.cuda.matmul.allow_tf32 = True
        if args.switch_interval:
            sys.setswitchinterval(args.switch_interval)
        try:
            for name in args.workloads:
                workloads.append(run_workload(name, device, args))
                torch.cuda.empty_cache()
        finally:
            sys.setswitchinterval(switch_interval)
    else:
        print("no CUDA device: only the lease, checkpoint and batcher overheads on the simulated backend are measured",
              file=sys.stderr)
    for w in workloads:
        print(f"\n{w['workload']}: LC jobs {w['lc_jobs']}, BE jobs {w['be_jobs']}")
        print(report.format_table(w["modes"], w["oracle"]))
        if args.repeats > 1:
            print(report.format_repeats(w["modes"]))
        for job, rows in w.get("interference", {}).items():
            print(f"{w['workload']}, {job} the only BE job:")
            print(report.format_table(rows))
    for o in overhead:
        print(f"acquire + release ({o['backend']}): C++ {o['cpp_us']:.2f} us, Python {o['python_us']:.2f} us; "
              f"beside a thread running Python (0.2 ms switch interval): p50 {o['beside_busy_p50_us']:.2f} us, "
              f"p99 {o['beside_busy_p99_us']:.2f} us")
    for c in checkpoints:
        print(f"best-effort checkpoint ({c['backend']}): {c['checkpoint_us']:.2f} us")
    for w in wakeups:
        print(f"GIL switch interval {w['switch_interval_s'] * 1e3:g} ms: a thread waking beside a thread running "
              f"Python is late by {w['late_p50_ms']:.3f} ms (p50), {w['late_p99_ms']:.3f} ms (p99)")
    for b in batching:
        print(f"Batcher ({b['backend']}): {b['back_to_back_us_per_request']:.1f} us/request back to back, "
              f"{b['single_request_us_p50']:.1f} us for one request alone ({b['overhead_us_per_request']:.1f} us "
              f"over packing it directly)")
    if args.json:
        result = dict(environment=environment(device), targets=dict(ratios=TARGET_RATIOS, p50_ratio=report.P50_RATIO,
                                                                    be_share=report.BE_SHARE,
                                                                    attainment=report.ATTAINMENT),
                      warmup_s=args.warmup, controller_warmup_s=args.controller_warmup, measure_s=args.measure,
                      scale=args.scale, repeats=args.repeats, lc_arrival=getattr(args, "lc_arrival", False),
                      switch_interval_s=args.switch_interval or switch_interval,
                      workloads=workloads, lease_overhead=overhead, checkpoint=checkpoints, batcher=batching,
                      gil_wakeup=wakeups)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"raw measurements: {args.json}")
    return 0

"""Where a latency-critical (LC) job's time goes under contention.

An experiment (not part of octopus-bench), on the contention benchmark's workloads and
runner: every LC job is timed as the benchmark times it (from its scheduled arrival to its
completion, the host's start delay apart) and, besides, in three parts: the launch (the host
queuing the job's work; a lease's acquire is not in it), the device span (a CUDA event recorded
before the job's work to one recorded after it: its kernels, and their waits for SMs and
memory) and the wait (the launch returned until the thread sees the work done: what is left
of the device span, then the wake-up). A device span that grows
with BE work behind an SM partition is interference the partition does not remove. Where a C
compiler (``cc``) is on the machine, the start (the scheduled arrival to the thread running) is
split too: the sleep's wake-up (arrival to the moment the kernel ran the thread again, stamped
in C before the thread asks for the GIL) and the GIL (that moment to Python running): the
first is the operating system's, the second other Python threads'.

    python benchmarks/lc_decompose.py --json OUT.json            # measure (CUDA)
    python benchmarks/lc_decompose.py --report OUT.json          # print a run's table again
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

import torch

from octopus._timing import percentile
from octopus.bench.contention.modes import modes
from octopus.bench.contention.runner import Runner
from octopus.bench.contention.workloads import FAMILIES

MODES = ["LC alone", "priority streams", "fixed: partition 8", "fixed: partition 16"]
# (raw JSON key, label): the job's total and its parts ("wake" holds the wait).
PARTS = (("total", "total"), ("start", "start"), ("woke", "woke"), ("gil", "gil"), ("launch", "launch"),
         ("device", "device"), ("wake", "wait"))

# Sleeps until a CLOCK_MONOTONIC time (time.perf_counter's clock on Linux, as time.sleep does)
# and returns when the thread ran again, before ctypes takes the GIL back.
_SLEEP_UNTIL_C = r"""
#include <errno.h>
#include <time.h>
double sleep_until(double t) {
  struct timespec at;
  at.tv_sec = (time_t)t;
  at.tv_nsec = (long)((t - (double)at.tv_sec) * 1e9);
  if (at.tv_nsec > 999999999L) at.tv_nsec = 999999999L;
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR) {}
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}
"""


def _sleep_until_c() -> Any:
    """``sleep_until`` compiled with ``cc`` (None where there is no compiler, or it fails)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or time.get_clock_info("perf_counter").implementation != "clock_gettime(CLOCK_MONOTONIC)":
        return None
    folder = tempfile.mkdtemp(prefix="lc_decompose_")
    source, library = os.path.join(folder, "sleep_until.c"), os.path.join(folder, "sleep_until.so")
    with open(source, "w") as f:
        f.write(_SLEEP_UNTIL_C)
    try:
        if subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", library, source]).returncode != 0:
            return None
        function = ctypes.CDLL(library).sleep_until  # (a CDLL call lets go of the GIL)
    finally:
        shutil.rmtree(folder)  # (a loaded library stays mapped)
    function.argtypes, function.restype = [ctypes.c_double], ctypes.c_double
    return function


class DecomposingRunner(Runner):
    """The benchmark's runner with every LC job's launch, device span and wait recorded
    (seconds) in ``parts[job name]``, one per job of the last run, in order; ``window_parts``
    keeps those of the jobs the run's row measured."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts: Dict[str, List[Tuple[float, float, float]]] = {}
        self._arrivals: Dict[str, List[float]] = {}
        # Per job, per launch: (arrival to the wake, the wake to Python running), seconds.
        self.starts: Dict[str, List[Tuple[float, float]]] = {}
        self._sleep_c = _sleep_until_c()
        self._thread_starts = threading.local()

    def run(self, mode: Any) -> Dict[str, Any]:
        self.parts.clear()
        self._arrivals.clear()
        self.starts.clear()
        return super().run(mode)

    def _lc_thread(self, job: Any, launch: Callable[[], None], start: float, phase: float, stop: Any,
                   out: List[tuple], errors: List[BaseException]) -> None:
        self._thread_starts.out = self.starts.setdefault(job.name, [])
        super()._lc_thread(job, launch, start, phase, stop, out, errors)
        self._arrivals[job.name] = [arrival for arrival, _, _ in out]  # one per launch, as parts

    def _sleep_until(self, arrival: float) -> None:
        if self._sleep_c is None:
            return super()._sleep_until(arrival)
        now = time.perf_counter()
        woke = self._sleep_c(arrival) if arrival > now else now  # (behind: no sleep, the backlog is its wake)
        self._thread_starts.out.append((max(0.0, woke - arrival), time.perf_counter() - woke))

    def window_starts(self, job: str) -> List[Tuple[float, float]]:
        """As window_parts, the split starts (empty without the compiled sleep)."""
        assert self.window is not None
        t0, t1 = self.window
        return [part for arrival, part in zip(self._arrivals[job], self.starts.get(job, [])) if t0 <= arrival < t1]

    def window_parts(self, job: str) -> List[Tuple[float, float, float]]:
        """The parts of the jobs that arrived in the last run's measured window (its row's jobs:
        an LC thread launches the job it was waiting for after the window, and a backlogged one
        several)."""
        assert self.window is not None
        t0, t1 = self.window
        return [part for arrival, part in zip(self._arrivals[job], self.parts[job]) if t0 <= arrival < t1]

    def _lc_launcher(self, job: Any, mode: Any, sched: Any) -> Callable[[], None]:
        began, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        body = self._body(job, high=mode.lc in ("high", "lease"))
        out = self.parts.setdefault(job.name, [])

        def run_on(stream: torch.cuda.Stream) -> None:
            t0 = time.perf_counter()
            with torch.cuda.stream(stream):
                began.record()
                body()
                done.record()
            t1 = time.perf_counter()
            done.synchronize()
            out.append((t1 - t0, began.elapsed_time(done) * 1e-3, time.perf_counter() - t1))

        if mode.lc == "lease":
            def leased() -> None:
                with sched.acquire(job.name, priority="high") as lease:
                    run_on(lease.stream)
            return leased
        stream = torch.cuda.Stream(self.device, priority=-1 if mode.lc == "high" else 0)
        return lambda: run_on(stream)


def measure(measure_s: float, workloads: List[str], names: List[str], controller_warmup_s: float
            ) -> List[Dict[str, Any]]:
    by_name = {m.name: m for m in modes(sweep=True)}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise ValueError(f"--modes: no mode named {unknown}; there are {sorted(by_name)}")
    device = torch.device("cuda")
    rows = []
    for workload in workloads:
        lc_jobs, be_jobs = FAMILIES[workload](device, 1.0)
        runner = DecomposingRunner(lc_jobs, be_jobs, device, 0.5, measure_s, controller_warmup_s)
        for run, name in enumerate(names):
            row = runner.run(by_name[name])
            for job in runner.parts:
                parts = runner.window_parts(job)
                launch, span, wake = zip(*parts) if parts else ((), (), ())
                starts = runner.window_starts(job)
                woke, gil = zip(*starts) if starts else ((), ())
                rows.append(dict(workload=workload, mode=name, run=run, job=job, clock=row["sm_clock_mhz"],
                                 total=row["lc_ms"][job], start=row["lc_start_ms"][job],
                                 woke=[1e3 * v for v in woke], gil=[1e3 * v for v in gil],
                                 launch=[1e3 * v for v in launch], device=[1e3 * v for v in span],
                                 wake=[1e3 * v for v in wake]))
            # (the workload's rows, for its LC-alone row's threshold; this run's line is the last)
            print(report([r for r in rows if r["workload"] == workload]).splitlines()[-1], flush=True)
    return rows


def report(rows: List[Dict[str, Any]], ratio: float = 1.5) -> str:
    """One line per workload, mode and run: per LC job, p50 / p99 (ms, nearest rank) of its
    total latency and of each part; in a row other than ``LC alone``, where the workload's
    ``LC alone`` row is there, its jobs over ``ratio`` x that row's p99 (the benchmark's
    threshold: arrival to completion seen) with the median of each part, against those within."""
    alone_p99 = {(r["workload"], r["job"]): percentile(r["total"], 99)
                 for r in rows if r["mode"] == "LC alone" and r["total"]}
    lines: Dict[Tuple[str, str, int], str] = {}
    seen: Dict[Tuple[str, str, str], int] = {}
    for r in rows:
        # A mode run twice is two lines (files written before rows carried "run": by order).
        n = seen[(r["workload"], r["mode"], r["job"])] = seen.get((r["workload"], r["mode"], r["job"]), -1) + 1
        line_key = (r["workload"], r["mode"], r.get("run", n))
        line = lines.get(line_key, f"{r['workload']:7s} {r['mode']:36s} clk {r['clock']:.0f}")
        parts = " ".join(f"{label} {percentile(r[key], 50):.2f}/{percentile(r[key], 99):.2f}"
                         for key, label in PARTS if r.get(key))
        threshold = alone_p99.get((r["workload"], r["job"])) if r["mode"] != "LC alone" else None
        over = _over(r, ratio * threshold) if threshold else ""
        lines[line_key] = line + f" | {r['job']} {parts}{over}"
    return "\n".join(lines.values())


def _over(r: Dict[str, Any], threshold: float) -> str:
    """A row's jobs over ``threshold`` (ms): how many, and the median of each part, against
    those within."""
    n = len(r["total"])
    keys = [(key, label) for key, label in PARTS if r.get(key)]  # (files before the split start have no woke, gil)
    if any(len(r[key]) != n for key, _ in keys):
        raise ValueError(f"{r['workload']} {r['mode']} {r['job']}: parts of {n} jobs expected")
    over = [i for i in range(n) if r["total"][i] > threshold]
    within = [i for i in range(n) if r["total"][i] <= threshold]
    if not over or not within:
        return f" (over {threshold:.3f} ms: {len(over)} of {n})"

    def medians(jobs: List[int]) -> str:
        return " ".join(f"{label} {percentile([r[key][i] for i in jobs], 50):.2f}" for key, label in keys)
    return f" (over {threshold:.3f} ms: {len(over)} of {n}: {medians(over)}; within: {medians(within)})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the raw measurements here")
    p.add_argument("--report", metavar="JSON", help="print the table of a run's raw measurements, measure nothing")
    p.add_argument("--measure", type=float, default=2.5, help="seconds each mode is measured")
    p.add_argument("--workloads", nargs="+", choices=sorted(FAMILIES), default=["mlp", "convnet"])
    p.add_argument("--modes", nargs="+", default=MODES, metavar="NAME",
                   help=f"the benchmark's modes to run, by name, in order (default: {MODES})")
    p.add_argument("--controller-warmup", type=float, default=8.0,
                   help="seconds a latency-control mode runs before it is measured")
    p.add_argument("--switch-interval", type=float, default=2e-4,
                   help="sys.setswitchinterval (seconds), as octopus-bench contention's option")
    args = p.parse_args()
    if args.report:
        with open(args.report) as f:
            print(report(json.load(f)))
        return 0
    if not torch.cuda.is_available():
        print("lc_decompose.py needs a CUDA device", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True
    sys.setswitchinterval(args.switch_interval)
    rows = measure(args.measure, args.workloads, args.modes, args.controller_warmup)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

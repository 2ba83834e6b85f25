"""The SM clock a probe's alone samples are taken at, against the clock under best-effort load.

Beside the contention benchmark's fp16 GEMM the GPU runs at its power cap, its SM clock well
under the one it runs a latency-critical (LC) job alone at (benchmarks/JOURNAL.md,
2026-12-01). The latency controller measures a kind's alone latency in probes: best-effort
(BE) work paused and drained for at most 0.25 s. If the clock climbs back within a probe, its
alone samples are taken at a clock the device does not keep while BE work runs, and part of
every relative target goes to the clock. This script measures that, with no scheduler: the
conv-net family's LC job (a batch-1 conv net replayed from a CUDA graph every 4 ms, on a
high-priority stream) beside the GEMM (slices of 1024 rows on a low-priority stream, at most
two in flight), the GEMM paused and drained for 0.25 s every 2 s as a probe would, NVML's SM
clock read every millisecond. It reports the conv net's latency (its launch to its thread
seeing completion) and the SM clock: with no GEMM at all, under the GEMM, and in the pauses,
by time since the pause began.

Run on a GPU: ``python3 benchmarks/probe_clock.py --json out.json``.
"""
from __future__ import annotations

import argparse
import bisect
import ctypes
import json
import statistics
import sys
import threading
import time
from typing import Dict, List, Tuple

import torch

from octopus._timing import percentile
from octopus.bench.contention.runner import capture_graph
from octopus.bench.contention.workloads import _convnet_jobs
from octopus.bench.energy import NVML_CLOCK_SM, nvml_device

# Time since a pause began, in seconds: the bins the pauses' jobs are reported in.
PAUSE_BINS = ((0.0, 0.01), (0.01, 0.05), (0.05, 0.1), (0.1, 0.25))


def _summary(latencies: List[float], clocks: List[float]) -> dict:
    return dict(jobs=len(latencies),
                p50_ms=percentile(latencies, 50) if latencies else None,
                p99_ms=percentile(latencies, 99) if latencies else None,
                sm_clock_mhz_median=statistics.median(clocks) if clocks else None)


def classify(jobs: List[Tuple[float, float]], pauses: List[Tuple[float, float]], clock: List[Tuple[float, float]],
             idle_until: float) -> Dict[str, dict]:
    """Latency (ms) and SM clock of each job (launched, done), by where it ran: ``no GEMM``
    (done before ``idle_until``), in a pause (begun, ended) by time since it began
    (PAUSE_BINS), or ``GEMM running`` (the rest, a job launched before a pause and done within
    it included: at most one a pause); a job's clock is the first reading at or after its
    midpoint."""
    times = [t for t, _ in clock]
    groups: Dict[str, Tuple[List[float], List[float]]] = {}
    starts = [p[0] for p in pauses]
    for launched, done in jobs:
        middle = (launched + done) / 2
        if done <= idle_until:
            name = "no GEMM"
        else:
            i = bisect.bisect_right(starts, launched) - 1
            if i >= 0 and done <= pauses[i][1]:
                since = launched - pauses[i][0]
                name = next((f"pause {lo * 1e3:g}-{hi * 1e3:g} ms" for lo, hi in PAUSE_BINS if lo <= since < hi),
                            "pause, later")
            elif i >= 0 and launched < pauses[i][1]:
                continue  # ran across a pause's end
            else:
                name = "GEMM running"
        latency, clocks = groups.setdefault(name, ([], []))
        latency.append(1e3 * (done - launched))
        if times:
            j = min(bisect.bisect_left(times, middle), len(times) - 1)
            clocks.append(clock[j][1])
    return {name: _summary(*values) for name, values in sorted(groups.items())}


def run(cycles: int, idle_s: float, run_s: float, pause_s: float) -> dict:
    device = torch.device("cuda")
    nvml, handle, why = nvml_device(device)
    if nvml is None:
        raise RuntimeError(f"probe_clock.py needs NVML: {why}")
    lc, _ = _convnet_jobs(device, scale=1e-3)  # the ragged BE job is not run: built small
    convnet = next(j for j in lc if j.name == "convnet")
    high = torch.cuda.Stream(device, priority=-1)
    low = torch.cuda.Stream(device, priority=0)
    body = capture_graph(convnet.run, high).replay
    n = 8192  # the contention benchmark's GEMM at scale 1
    a = torch.randn(n, n, device=device, dtype=torch.float16)
    b = torch.randn(n, n, device=device, dtype=torch.float16)
    c = torch.empty_like(a)
    torch.cuda.synchronize()

    stop, pause, gemm_on = threading.Event(), threading.Event(), threading.Event()
    clock: List[Tuple[float, float]] = []
    jobs: List[Tuple[float, float]] = []

    def sample_clock() -> None:
        value = ctypes.c_uint()
        while not stop.is_set():
            if nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(value)) == 0:
                clock.append((time.perf_counter(), float(value.value)))
            time.sleep(1e-3)

    def gemm() -> None:
        in_flight: List[torch.cuda.Event] = []
        row = 0
        while not stop.is_set():
            if pause.is_set() or not gemm_on.is_set():
                low.synchronize()  # drained, as a probe waits for
                in_flight.clear()
                time.sleep(2e-4)
                continue
            if len(in_flight) >= 2:
                in_flight.pop(0).synchronize()
            with torch.cuda.stream(low):
                torch.mm(a[row:row + 1024], b, out=c[row:row + 1024])
                event = torch.cuda.Event()
                event.record(low)
            in_flight.append(event)
            row = (row + 1024) % n

    def latency_critical(start: float) -> None:
        k = 0
        while not stop.is_set():
            arrival = start + k * convnet.period_s
            delay = arrival - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            launched = time.perf_counter()
            with torch.cuda.stream(high):
                body()
            high.synchronize()
            jobs.append((launched, time.perf_counter()))
            k += 1

    threads = [threading.Thread(target=sample_clock), threading.Thread(target=gemm),
               threading.Thread(target=latency_critical, args=(time.perf_counter() + 0.05,))]
    for t in threads:
        t.start()
    pauses: List[Tuple[float, float]] = []
    try:
        time.sleep(0.05 + idle_s)
        idle_until = time.perf_counter()
        gemm_on.set()
        for _ in range(cycles):
            time.sleep(run_s)
            pause.set()
            begun = time.perf_counter()
            time.sleep(pause_s)
            pause.clear()
            pauses.append((begun, time.perf_counter()))
    finally:
        stop.set()
        for t in threads:
            t.join()
    # Leave out the first second of the idle stretch (the graph's first replays, the clock settling).
    first = jobs[0][0] + 1.0 if jobs else 0.0
    return classify([j for j in jobs if j[0] >= first], pauses, [c for c in clock if c[0] >= first], idle_until)


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=8, help="GEMM-then-pause cycles")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of the LC job alone first")
    parser.add_argument("--run", type=float, default=1.75, help="seconds of GEMM per cycle")
    parser.add_argument("--pause", type=float, default=0.25, help="seconds of each pause (a probe's window)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_clock.py needs a CUDA device", file=sys.stderr)
        return 2
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cycles=args.cycles,
                  idle_s=args.idle, run_s=args.run, pause_s=args.pause,
                  groups=run(args.cycles, args.idle, args.run, args.pause))
    for name, group in result["groups"].items():
        print(f"{name}: {json.dumps(group)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Whether two latency-critical jobs that meet cost each other on the device or on the host.

The contention benchmark's conv-net family runs two latency-critical (LC) jobs on fixed
schedules: a batch-1 conv net replayed from a CUDA graph every 4 ms and ``octopus.normalize``
of 64 small images, eager, every 3.2 ms. Their schedules meet in a fixed pattern (a quarter
of the conv net's jobs overlap a normalize job), and in its traces the jobs over the
controller's target are mostly those (benchmarks/JOURNAL.md, 2026-12-01). This script runs
the two jobs with no best-effort work, each in its own thread on its own high-priority
stream, no scheduler, in three variants:

* ``eager``: as in the benchmark (normalize launched op by op from Python);
* ``graphed``: normalize replayed from a CUDA graph too (its host part is one call);
* ``conv net alone``: the conv net's thread only.

and reports, per job, latency (scheduled arrival to the thread seeing completion) for jobs
that overlapped a job of the other thread (launch to completion against launch to
completion: a job whose thread woke late behind the other's Python, that job done before the
launch, counts as not overlapping), split into those the other's job started beside
(``first``) and those started beside the other's (``second``), and for those that did not.
Run it at two switch intervals (``--switch-interval``) to see how much of a meeting's cost
the GIL's hand-over makes. (The split came after the 2026-12-01 runs: their files have
``overlap`` and ``solo`` only.) What the graphed variant takes
away of the overlap's cost is mostly the host's (the threads' Python and the GIL), though a
graph changes ``normalize``'s device work too.

Run on a GPU: ``python3 benchmarks/lc_collisions.py --seconds 8 --json out.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Callable, Dict, List, Tuple

import torch

from octopus._timing import percentile
from octopus.bench.contention.runner import capture_graph
from octopus.bench.contention.workloads import _convnet_jobs


def _p(values: List[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def _loop(name: str, body: Callable[[], object], stream: torch.cuda.Stream, period_s: float, start: float,
          stop: float, jobs: List[Tuple[str, float, float, float]]) -> None:
    """Runs ``body`` at start + k * period_s until ``stop``; records (name, arrival, launched, done)."""
    k = 0
    while True:
        arrival = start + k * period_s
        if arrival >= stop:
            return
        delay = arrival - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        launched = time.perf_counter()
        with torch.cuda.stream(stream):
            body()
        stream.synchronize()
        jobs.append((name, arrival, launched, time.perf_counter()))
        k += 1


def _summary(jobs: List[Tuple[str, float, float, float]], warmup_s: float, start: float) -> Dict[str, dict]:
    """Per job name: p50 / p99 latency (ms) of jobs that overlapped the other thread's
    (``overlap``) and of those that did not (``solo``); the overlapping ones also as ``first``
    (the other's job launched while this one ran) and ``second`` (launched while the other's
    ran), as benchmarks/trace_overlaps.py splits a traced run's jobs."""
    out: Dict[str, dict] = {}
    names = sorted({j[0] for j in jobs})
    for name in names:
        mine = [j for j in jobs if j[0] == name and j[1] >= start + warmup_s]
        others = sorted((j[2], j[3]) for j in jobs if j[0] != name)
        groups: Dict[str, List[float]] = {"overlap": [], "solo": [], "first": [], "second": []}
        for _, arrival, launched, done in mine:
            met = [s for s, e in others if s < done and e > launched]
            latency = 1e3 * (done - arrival)
            groups["overlap" if met else "solo"].append(latency)
            if met:
                groups["second" if any(s <= launched for s in met) else "first"].append(latency)
        out[name] = {group: dict(jobs=len(v), p50_ms=_p(v, 50), p99_ms=_p(v, 99))
                     for group, v in groups.items()}
        every = groups["overlap"] + groups["solo"]
        out[name]["all"] = dict(jobs=len(every), p50_ms=_p(every, 50), p99_ms=_p(every, 99))
    return out


def run(seconds: float, warmup_s: float) -> dict:
    device = torch.device("cuda")
    lc, _ = _convnet_jobs(device, scale=1e-3)  # the best-effort jobs are not run: built small
    convnet, normalize = (next(j for j in lc if j.name == n) for n in ("convnet", "normalize"))
    streams = {n: torch.cuda.Stream(device, priority=-1) for n in ("convnet", "normalize")}
    conv_body = capture_graph(convnet.run, streams["convnet"]).replay
    variants = {
        "eager": [("convnet", conv_body, convnet.period_s), ("normalize", normalize.run, normalize.period_s)],
        "graphed": [("convnet", conv_body, convnet.period_s),
                    ("normalize", capture_graph(normalize.run, streams["normalize"]).replay, normalize.period_s)],
        "conv net alone": [("convnet", conv_body, convnet.period_s)],
    }
    results = {}
    for variant, loops in variants.items():
        jobs: List[Tuple[str, float, float, float]] = []
        start = time.perf_counter() + 0.05
        stop = start + warmup_s + seconds
        threads = [threading.Thread(target=_loop, args=(n, body, streams[n], period, start, stop, jobs))
                   for n, body, period in loops]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results[variant] = _summary(jobs, warmup_s, start)
        print(variant, json.dumps(results[variant]), flush=True)
    return results


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per variant")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds per variant left out first")
    parser.add_argument("--switch-interval", type=float, default=2e-4,
                        help="sys.setswitchinterval, as octopus-bench contention sets it")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("lc_collisions.py needs a CUDA device", file=sys.stderr)
        return 2
    sys.setswitchinterval(args.switch_interval)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, seconds=args.seconds,
                  warmup_s=args.warmup, switch_interval_s=args.switch_interval,
                  variants=run(args.seconds, args.warmup))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

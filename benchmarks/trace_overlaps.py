"""Which latency-critical jobs of a traced controller run met another latency-critical job.

Reads the gzipped Chrome traces ``octopus-bench contention --trace DIR`` writes (one per
controller run) and prints, per latency-critical kind: how many of its jobs were over the
controller's target and within it, and the share of each that overlapped a lease of another
latency-critical kind; then its latency (the controller's: request to completion) p50 / p99
for jobs alone (no best-effort work on the device) and contended, each split by whether they
overlapped. A job's lease is the trace's lease event (grant to release); its latency the
latency counter that follows. Used in benchmarks/JOURNAL.md (2026-12-01).

    python3 benchmarks/trace_overlaps.py traces/*.trace.json.gz
"""
from __future__ import annotations

import bisect
import gzip
import json
import sys
from typing import Dict, List, Tuple

from octopus._timing import percentile

Job = Tuple[float, float, float, float | None, bool]  # grant, release (us), latency, target (ms), alone


def _jobs(events: List[dict]) -> Dict[str, List[Job]]:
    """Per latency-critical kind, its jobs: each lease paired in order with its latency counter."""
    kinds = {e["name"][len("latency "):] for e in events
             if e.get("ph") == "C" and e.get("name", "").startswith("latency ") and e["name"] != "latency control"}
    out: Dict[str, List[Job]] = {}
    for kind in sorted(kinds):
        leases = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("name") == kind)
        latencies = sorted((e["ts"], e["args"]) for e in events if e.get("ph") == "C" and e.get("name") == "latency " + kind)
        out[kind] = [(grant, release, a["latency_ms"], a.get("target_ms"), bool(a.get("alone")))
                     for (grant, release), (_, a) in zip(leases, latencies)]
    return out


def _overlapping(job: Job, others: List[Tuple[float, float]], starts: List[float]) -> bool:
    grant, release = job[0], job[1]
    i = bisect.bisect_left(starts, release)
    return any(others[j][1] > grant for j in range(max(0, i - 8), i))


def _p(values: List[float], q: float) -> str:
    return f"{percentile(values, q):.3f}" if values else "-"


def report(path: str) -> None:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    jobs = _jobs(events)
    for kind, mine in jobs.items():
        others = sorted((g, r) for k, js in jobs.items() if k != kind for g, r, *_ in js)
        starts = [g for g, _ in others]
        shares: Dict[str, List[bool]] = {}
        latency: Dict[Tuple[str, str], List[float]] = {}
        for job in mine:
            met = _overlapping(job, others, starts)
            if job[3] is not None:
                shares.setdefault("over" if job[2] > job[3] else "within", []).append(met)
            key = ("alone" if job[4] else "contended", "overlapping" if met else "not overlapping")
            latency.setdefault(key, []).append(job[2])
        print(f"{path}: {kind}")
        for name, flags in sorted(shares.items()):
            print(f"  {name} target: {len(flags)} jobs, {100 * sum(flags) / len(flags):.1f}% overlapping another LC kind")
        for (when, met), values in sorted(latency.items()):
            print(f"  {when}, {met}: {len(values)} jobs, p50 {_p(values, 50)} ms, p99 {_p(values, 99)} ms")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        report(path)

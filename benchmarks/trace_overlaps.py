"""Which latency-critical jobs of a traced controller run met another latency-critical job.

Reads the gzipped Chrome traces ``octopus-bench contention --trace DIR`` writes (one per
controller run) and prints, per latency-critical kind: the parts of its jobs' latency (the
wait for the grant, the lease's hold, completion after the release; p50 / p99); how many of
its jobs were over the controller's target and within it, and the share of each that
overlapped a lease of another latency-critical kind; its share within target over the run's
last ``--last`` seconds; then its latency (the controller's: request to completion) p50 / p99
for jobs alone (no best-effort work on the device) and contended, each split by whether they
overlapped. Last, over all the traces given, each kind's share of contended jobs over its
target by the controller's step (jobs granted within 50 ms of a step change, or running
across one, left out), all of them and split by how they met another kind's lease: not at
all, first (the other granted while it was held) or second (granted while the other was held). A job is its lease (the trace's lease event, grant to release) and the latency
counter of the same rank among its kind's (the control loop records them in order of
completion; a trace whose counts differ is refused). Used in benchmarks/JOURNAL.md
(2026-12-01).

    python3 benchmarks/trace_overlaps.py [--last 20] traces/*.trace.json.gz
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import sys
from typing import Dict, List, Tuple

from octopus._timing import percentile

Job = Tuple[float, float, float, float | None, bool, float, float]
# grant, release (us), latency (ms), target (ms), alone, waited (us), latency counter's time (us)


def _jobs(events: List[dict]) -> Dict[str, List[Job]]:
    """Per latency-critical kind, its jobs: each lease paired in order with its latency counter."""
    kinds = {e["name"][len("latency "):] for e in events
             if e.get("ph") == "C" and e.get("name", "").startswith("latency ") and e["name"] != "latency control"}
    out: Dict[str, List[Job]] = {}
    for kind in sorted(kinds):
        leases = sorted((e["ts"], e["ts"] + e["dur"], e["args"].get("waited_us", 0.0)) for e in events
                        if e.get("ph") == "X" and e.get("cat") == "lease" and e.get("name") == kind)
        latencies = sorted((e["ts"], e["args"]) for e in events if e.get("ph") == "C" and e.get("name") == "latency " + kind)
        if len(leases) != len(latencies):
            raise ValueError(f"{kind}: {len(leases)} leases but {len(latencies)} latencies: they cannot be paired")
        out[kind] = [(grant, release, a["latency_ms"], a.get("target_ms"), bool(a.get("alone")), waited, at)
                     for (grant, release, waited), (at, a) in zip(leases, latencies)]
    return out


def _overlapping(job: Job, others: List[Tuple[float, float]], starts: List[float], longest: float) -> bool:
    """Whether a lease of ``others`` (sorted by start; none longer than ``longest``) overlaps the job's."""
    grant, release = job[0], job[1]
    j = bisect.bisect_left(starts, release) - 1
    while j >= 0 and starts[j] > grant - longest:
        if others[j][1] > grant:
            return True
        j -= 1
    return False


def _p(values: List[float], q: float) -> str:
    return f"{percentile(values, q):.3f}" if values else "-"


# Jobs granted this soon after a step change are left out of the by-step shares (work the
# step before let in may still be on the device).
SETTLE_US = 50e3


def _meeting(job: Job, others: List[Tuple[float, float]], starts: List[float], longest: float) -> str:
    """How the job's lease met another LC kind's: "alone on the device's LC side" (none),
    "second" (one was held when it was granted) or "first" (one was granted while it was held)."""
    grant, release = job[0], job[1]
    j = bisect.bisect_left(starts, release) - 1
    met = "none"
    while j >= 0 and starts[j] > grant - longest:
        if others[j][1] > grant:
            if starts[j] <= grant:
                return "second"
            met = "first"
        j -= 1
    return met


Counts = Dict[Tuple[str, int, str], List[int]]


def _by_step(events: List[dict], jobs: Dict[str, List[Job]], counts: Counts) -> None:
    """Adds each kind's contended jobs with a target to ``counts[(kind, step, meeting)]`` =
    [jobs, over], meeting as _meeting says."""
    changes = sorted((e["ts"], e["args"]["step"]) for e in events if e.get("ph") == "C" and e.get("name") == "latency control")
    times = [t for t, _ in changes]
    for kind, mine in jobs.items():
        others = sorted((job[0], job[1]) for k, js in jobs.items() if k != kind for job in js)
        starts = [g for g, _ in others]
        longest = max((r - g for g, r in others), default=0.0)
        for job in mine:
            grant, _, latency, target, alone, _, done = job
            i = bisect.bisect_right(times, grant) - 1
            if target is None or alone or i < 0 or grant - times[i] < SETTLE_US or bisect.bisect_right(times, done) - 1 != i:
                continue
            for meeting in ("all", _meeting(job, others, starts, longest)):
                count = counts.setdefault((kind, changes[i][1], meeting), [0, 0])
                count[0] += 1
                count[1] += latency > target


def report(path: str, last_s: float, counts: Counts) -> None:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    jobs = _jobs(events)
    _by_step(events, jobs, counts)
    for kind, mine in jobs.items():
        others = sorted((job[0], job[1]) for k, js in jobs.items() if k != kind for job in js)
        starts = [g for g, _ in others]
        longest = max((r - g for g, r in others), default=0.0)
        shares: Dict[str, List[bool]] = {}
        latency: Dict[Tuple[str, str], List[float]] = {}
        for job in mine:
            met = _overlapping(job, others, starts, longest)
            if job[3] is not None:
                shares.setdefault("over" if job[2] > job[3] else "within", []).append(met)
            key = ("alone" if job[4] else "contended", "overlapping" if met else "not overlapping")
            latency.setdefault(key, []).append(job[2])
        print(f"{path}: {kind}")
        waits = [job[5] / 1e3 for job in mine]
        holds = [(job[1] - job[0]) / 1e3 for job in mine]
        after = [(job[6] - job[1]) / 1e3 for job in mine]
        print(f"  parts (ms, p50 / p99): wait {_p(waits, 50)} / {_p(waits, 99)}, hold {_p(holds, 50)} / "
              f"{_p(holds, 99)}, completion after the release {_p(after, 50)} / {_p(after, 99)}")
        for name, flags in sorted(shares.items()):
            print(f"  {name} target: {len(flags)} jobs, {100 * sum(flags) / len(flags):.1f}% overlapping another LC kind")
        end = max(job[6] for job in mine) if mine else 0.0
        judged = [job for job in mine if job[3] is not None and job[6] >= end - 1e6 * last_s]
        if judged:
            within = sum(job[2] <= job[3] for job in judged)
            print(f"  last {last_s:g} s: {100 * within / len(judged):.2f}% of {len(judged)} jobs within target")
        for (when, met), values in sorted(latency.items()):
            print(f"  {when}, {met}: {len(values)} jobs, p50 {_p(values, 50)} ms, p99 {_p(values, 99)} ms")


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--last", type=float, default=20.0, help="seconds at the run's end to count within target")
    parser.add_argument("traces", nargs="+")
    args = parser.parse_args(argv)
    counts: Counts = {}
    for path in args.traces:
        report(path, args.last, counts)
    print(f"contended jobs over target by step, {len(args.traces)} trace(s) (meeting another LC kind's lease: "
          "none; first, granted before it; second, granted while it was held):")
    for (kind, step, meeting), (n, over) in sorted(counts.items()):
        share = over / n
        print(f"  {kind} step {step}, {meeting}: {n} jobs, {100 * share:.2f}% over "
              f"(95% interval +-{196 * (share * (1 - share) / n) ** 0.5:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

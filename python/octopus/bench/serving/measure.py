"""What the serving benchmark measures: iteration and step times, throughput, latency
percentiles (octopus's nearest-rank rule), high-priority latency over unloaded."""

from __future__ import annotations

import statistics
import time
from typing import Any, List

import torch

from ..._timing import percentile as nearest_rank


class IterationClock:
    """Times iterations and their scheduler step(s): CUDA events on a GPU, host clocks on the CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.marks: List[Any] = []

    def mark(self):
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, start, before_step, end, samples: int):
        self.marks.append((start, before_step, end, samples))

    def summary(self) -> dict:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            spans = [(a.elapsed_time(c), b.elapsed_time(c), n) for a, b, c, n in self.marks]
        else:
            spans = [((c - a) * 1e3, (c - b) * 1e3, n) for a, b, c, n in self.marks]
        return iteration_summary(spans)


def iteration_summary(spans: list) -> dict:
    """spans: (iteration ms, step ms, samples) per iteration."""
    if not spans:
        return dict(iterations=0, mean_batch=None, step_share=None, step_ms_median=None, iteration_ms_median=None)
    return dict(iterations=len(spans), mean_batch=statistics.fmean(s[2] for s in spans),
                step_share=sum(s[1] for s in spans) / max(1e-9, sum(s[0] for s in spans)),
                step_ms_median=statistics.median(s[1] for s in spans),
                iteration_ms_median=statistics.median(s[0] for s in spans))


def percentile(values: list, q: float) -> float | None:
    """octopus's percentile rule (nearest rank), None for no values."""
    return nearest_rank(values, q) if values else None


def summarize(workload: list[dict], completions: dict) -> dict:
    """Throughput and latency percentiles of one run (completions: id -> seconds since the
    run's start, the clock of the arrivals)."""
    latencies = {r["id"]: completions[r["id"]] - r["arrival"] for r in workload if r["id"] in completions}
    high = [latencies[r["id"]] for r in workload if r["high"] and r["id"] in latencies]
    span = max(completions.values()) - min(r["arrival"] for r in workload) if completions else None
    lat = list(latencies.values())
    return dict(completed=len(completions), requests=len(workload),
                throughput=len(completions) / span if span else None,
                p50_s=percentile(lat, 50), p99_s=percentile(lat, 99), high_p50_s=percentile(high, 50),
                high_p99_s=percentile(high, 99), latencies={str(k): v for k, v in latencies.items()})


def high_p99_over_unloaded(row: dict, unloaded: dict) -> float | None:
    """p99 of the high-priority latencies over the p99 of the same requests alone."""
    ids = [int(k) for k in row["latencies"] if int(k) in unloaded]
    if not ids or row.get("high_p99_s") is None:
        return None
    return row["high_p99_s"] / percentile([unloaded[i] for i in ids], 99)

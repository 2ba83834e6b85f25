"""octopus's side: a ContinuousSampler kept across runs, fed the workload's arrivals; and the
feeding itself (each request at its arrival; high-priority ones alone), which the text-to-image
run shares."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from typing import Any, Callable, Dict, List

from octopus import diffusion as od

from .measure import iteration_summary


class OctopusServer:
    """(d): one ContinuousSampler kept across runs (its CUDA graphs too), rebuilt only after a
    run that had to be cut short."""

    def __init__(self, model, device, dtype, max_batch: int, graphs: bool, shapes: int, max_in_flight: int,
                 priority_lane: bool = False, priority_batch: int = 8):
        self.options = dict(max_batch=max_batch, device=device, dtype=dtype, cuda_graphs=graphs,
                            max_graphs=2 * max_batch * shapes, max_in_flight=max_in_flight, priority_lane=priority_lane,
                            record_iterations=True)
        self.model, self.graphs, self.priority_batch = model, graphs, priority_batch
        self.sampler = od.ContinuousSampler(model, **self.options)

    def prepare(self, shapes) -> None:
        if self.graphs:
            self.sampler.prepare_graphs(shapes, range(1, self.options["max_batch"] + 1),
                                        priority_batch_sizes=range(1, self.priority_batch + 1))

    def run(self, workload, timeout: float, preempt: bool = False, high_priority_batch: int | None = None,
            normal_lane_pause: float = 0.0) -> dict:
        self.sampler.preempt, self.sampler.high_priority_batch = preempt, high_priority_batch
        self.sampler.normal_lane_pause = normal_lane_pause
        self.sampler.iteration_timings()  # drop what earlier runs recorded
        before = self.sampler.stats()
        completions = submit_at_arrivals(workload, self.submit, timeout)
        timings = self.sampler.iteration_timings()
        stats = {k: v - before.get(k, 0) if isinstance(v, (int, float)) else v
                 for k, v in self.sampler.stats().items()}
        if len(completions) < len(workload):  # cut short: start afresh for the next run
            self.sampler.close(cancel=True)
            self.sampler = od.ContinuousSampler(self.model, **self.options)
        spans = [(t["iteration"], t["step"], t["samples"]) for t in timings]
        return dict(completions=completions, iterations=iteration_summary(spans), sampler=stats)

    def submit(self, spec: dict) -> concurrent.futures.Future[Any]:
        return self.sampler.submit(shape=spec["shape"], scheduler=spec["scheduler"], scheduler_config=spec["config"],
                                   num_inference_steps=spec["steps"], seed=spec["seed"],
                                   priority="high" if spec["high"] else "normal")

    def close(self) -> None:
        self.sampler.close()


def _record_completion(completions: Dict[int, float], request_id: int, start: float,
                       future: concurrent.futures.Future[Any]) -> None:
    """A done callback: the request's completion time since ``start``, where it succeeded."""
    if future.exception() is None:
        completions[request_id] = time.perf_counter() - start


def submit_at_arrivals(workload: List[dict], submit: Callable[[dict], concurrent.futures.Future[Any]],
                       timeout: float) -> Dict[int, float]:
    """Each request given to ``submit`` at its arrival; the completion times (seconds since the
    run's start, the clock of the arrivals) of those that succeeded within ``timeout``."""
    completions: Dict[int, float] = {}
    start = time.perf_counter()
    futures = []
    for spec in sorted(workload, key=lambda r: r["arrival"]):
        time.sleep(max(0.0, spec["arrival"] - (time.perf_counter() - start)))
        future = submit(spec)
        future.add_done_callback(functools.partial(_record_completion, completions, spec["id"], start))
        futures.append(future)
    concurrent.futures.wait(futures, timeout=max(0.0, timeout - (time.perf_counter() - start)))
    return dict(completions)


def unloaded_latencies(submit: Callable[[dict], concurrent.futures.Future[Any]], workload: List[dict]) -> dict:
    """Each high-priority request alone through ``submit``: seconds from submission to result."""
    latencies = {}
    for spec in (r for r in workload if r["high"]):
        start = time.perf_counter()
        submit(spec).result()
        latencies[spec["id"]] = time.perf_counter() - start
    return latencies

"""octopus's side: a ContinuousSampler kept across runs, fed the workload's arrivals."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from typing import Any, Dict

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
        completions: Dict[int, float] = {}
        start = time.perf_counter()
        self.sampler.iteration_timings()  # drop what earlier runs recorded
        before = self.sampler.stats()
        futures = []
        for spec in sorted(workload, key=lambda r: r["arrival"]):
            time.sleep(max(0.0, spec["arrival"] - (time.perf_counter() - start)))
            future = self.sampler.submit(shape=spec["shape"], scheduler=spec["scheduler"],
                                         scheduler_config=spec["config"], num_inference_steps=spec["steps"],
                                         seed=spec["seed"], priority="high" if spec["high"] else "normal")
            future.add_done_callback(functools.partial(_record_completion, completions, spec["id"], start))
            futures.append(future)
        concurrent.futures.wait(futures, timeout=max(0.0, timeout - (time.perf_counter() - start)))
        timings = self.sampler.iteration_timings()
        stats = {k: v - before.get(k, 0) if isinstance(v, (int, float)) else v
                 for k, v in self.sampler.stats().items()}
        if len(completions) < len(workload):  # cut short: start afresh for the next run
            self.sampler.close(cancel=True)
            self.sampler = od.ContinuousSampler(self.model, **self.options)
        spans = [(t["iteration"], t["step"], t["samples"]) for t in timings]
        return dict(completions=dict(completions), iterations=iteration_summary(spans), sampler=stats)

    def close(self) -> None:
        self.sampler.close()


def _record_completion(completions: Dict[int, float], request_id: int, start: float,
                       future: concurrent.futures.Future[Any]) -> None:
    """A done callback: the request's completion time since ``start``, where it succeeded."""
    if future.exception() is None:
        completions[request_id] = time.perf_counter() - start


def unloaded_latencies(server: OctopusServer, workload) -> dict:
    """Each high-priority request alone through the octopus sampler."""
    latencies = {}
    for spec in (r for r in workload if r["high"]):
        start = time.perf_counter()
        server.sampler.submit(shape=spec["shape"], scheduler=spec["scheduler"], scheduler_config=spec["config"],
                              num_inference_steps=spec["steps"], seed=spec["seed"]).result()
        latencies[spec["id"]] = time.perf_counter() - start
    return latencies

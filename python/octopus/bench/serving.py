"""``python -m octopus.bench.serving`` (also ``octopus-bench serving``): diffusion requests
arriving over time, served four ways.

Workload (seeded): ``--requests`` requests (default 256) with Poisson arrivals at each of
``--rates`` (requests/s); latents 4x32x32, 4x64x64 and 4x96x96 in equal shares; 10-50 steps;
samplers DDIM, Euler, flow-matching Euler (shift 3), DPM-Solver++ 2M and UniPC in equal shares;
``--high-share`` of them (default 10%) with priority "high". Every mode serves requests by
priority, then arrival, and uses the same model: a diffusers ``UNet2DModel`` with random
weights (``--model realistic``: 25.3M parameters, blocks of 64/128/256/256 channels, two layers
each, attention at the third level, float16 on the GPU; ``--model tiny`` for a CPU smoke run).

Modes, side by side in one run::

  (a) serial       one request at a time through diffusers' scheduler (what a user writes today);
                   run once at the lowest rate; at the others its latencies are computed from
                   the measured service times with the FIFO recurrence of one server
                   (marked ``derived``)
  (b) static       static batching: up to ``--max-batch`` waiting requests of one shape (after
                   waiting at most ``--static-wait`` s for the batch to fill) run to completion
                   together, one diffusers ``scheduler.step`` per request per iteration
  (c) step-level   continuous batching at step level, as serving systems do it: requests join
                   and leave at any step, one batched model call per shape, one diffusers
                   ``scheduler.step`` per request per iteration
  (d) octopus      ``octopus.diffusion.ContinuousSampler``: one model call per shape on leased
                   streams, one fused step for all; eagerly, with CUDA graphs
                   (``octopus-graphs``), and with graphs and a latency policy for high-priority
                   requests (``octopus-priority``: ``preempt=True``,
                   ``high_priority_batch=--priority-batch``); with graphs (on a GPU) and
                   high-priority requests in a lane of their own (``octopus-lane``:
                   ``priority_lane=True``), that with the latency policy too
                   (``octopus-lane-priority``), and the lane with the other samples pausing
                   while it has samples (``octopus-lane-yield``: ``normal_lane_pause=``
                   ``--normal-lane-pause``, strict priority by default, and ``preempt=True``)

Reported per mode and rate: throughput (images/s), latency p50/p99 (overall and high
priority; wall time from arrival to completion), the share of iteration time spent in the
scheduler step (CUDA events around the step(s) and the iteration), mean batch, GPU
utilization and SM clock (NVML, sampled every 50 ms). Also: each high-priority request's
latency alone (unloaded); with ``octopus-lane-yield``, at each rate, the high-priority
requests by themselves at their arrival times (``high-priority only``: what they cost one
another in their lane, whatever happens to the rest); and one scenario where continuous
batching has little to win (``single``: a quarter as many requests, every one of the largest
shape, DDIM, the most steps). Raw JSON
and a latency-vs-throughput plot go to ``--out``. With the defaults the run takes about 6
minutes on an H100.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import functools
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch

import octopus
from octopus import diffusion as od
from octopus.diffusion.rows import to_device

from .._timing import percentile as nearest_rank
from .energy import GpuSampler
from .report import environment

SHAPES = [(4, 32, 32), (4, 64, 64), (4, 96, 96)]
SAMPLERS = [("DDIMScheduler", {}), ("EulerDiscreteScheduler", {}), ("FlowMatchEulerDiscreteScheduler", {"shift": 3.0}),
            ("DPMSolverMultistepScheduler", {}), ("UniPCMultistepScheduler", {})]
MODELS = {
    "realistic": dict(block_out_channels=(64, 128, 256, 256), layers_per_block=2,
                      down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                      up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D")),
    "tiny": dict(block_out_channels=(8, 16), layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4, attention_head_dim=8),
}
MODES = ("serial", "static", "step-level", "octopus", "octopus-graphs", "octopus-priority", "octopus-lane",
         "octopus-lane-priority", "octopus-lane-yield")


def make_model(name: str, device: torch.device, dtype: torch.dtype):
    import diffusers
    torch.manual_seed(0)
    model = diffusers.UNet2DModel(sample_size=64, in_channels=4, out_channels=4, **MODELS[name])
    return model.to(device=device, dtype=dtype).eval()


def make_workload(n: int, rate: float, seed: int, high_share: float, shapes=SHAPES, samplers=SAMPLERS,
                  steps=(10, 50)) -> list[dict]:
    """n requests with Poisson arrivals at `rate` per second (the same draws at every rate,
    scaled), each with its shape, sampler, step count, priority and seed."""
    g = torch.Generator().manual_seed(seed)
    gaps = torch.empty(n, dtype=torch.float64).exponential_(1.0, generator=g) / rate
    arrivals = (torch.cumsum(gaps, 0) - gaps[0]).tolist()
    out = []
    for i in range(n):
        name, config = samplers[int(torch.randint(len(samplers), (1,), generator=g))]
        out.append(dict(id=i, arrival=arrivals[i], shape=shapes[int(torch.randint(len(shapes), (1,), generator=g))],
                        steps=int(torch.randint(steps[0], steps[1] + 1, (1,), generator=g)), scheduler=name,
                        config=config, high=bool(torch.rand((), generator=g) < high_share), seed=10_000 + i))
    return out


# -- measurements shared by every mode -------------------------------------------------


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


# -- the diffusers side: what a user (or a serving system) writes today -----------------


class DiffusersRequest:
    """One request with its own diffusers scheduler (timesteps kept on the CPU, as pipelines do)."""

    def __init__(self, spec: dict, device: torch.device, dtype: torch.dtype):
        import diffusers
        self.spec = spec
        self.scheduler = getattr(diffusers, spec["scheduler"]).from_config(spec["config"])
        self.scheduler.set_timesteps(spec["steps"])
        self.timesteps = list(self.scheduler.timesteps)
        self.t_values = [float(t) for t in self.timesteps]  # the model's timestep input, read once
        g = torch.Generator().manual_seed(spec["seed"])
        x = torch.randn((1, *spec["shape"]), generator=g, dtype=dtype)
        self.x = (x * getattr(self.scheduler, "init_noise_sigma", 1.0)).to(device)
        self.k = 0

    @property
    def t(self):
        return self.timesteps[self.k]

    @property
    def t_value(self) -> float:
        return self.t_values[self.k]

    def model_input(self) -> torch.Tensor:
        scale = getattr(self.scheduler, "scale_model_input", None)
        return scale(self.x, self.t) if scale is not None else self.x

    def step(self, model_output: torch.Tensor) -> bool:
        """One scheduler step; True when the request is done."""
        self.x = self.scheduler.step(model_output, self.t, self.x).prev_sample
        self.k += 1
        return self.k == len(self.timesteps)


def _batched_call(model, members: list, device) -> torch.Tensor:
    """One model call for requests of one shape, each at its own timestep."""
    x = torch.cat([m.model_input() for m in members]) if len(members) > 1 else members[0].model_input()
    t = to_device(torch.tensor([m.t_value for m in members], dtype=torch.float32), device)
    return model(x, t).sample


class ArrivalLoop:
    """Replays arrivals against the wall clock for the modes run on this thread: `arrived()`
    moves due requests into `waiting`, ordered by priority then arrival."""

    def __init__(self, workload: list[dict], timeout: float):
        self.pending = collections.deque(sorted(workload, key=lambda r: r["arrival"]))
        self.waiting: list[dict] = []
        self.start = time.perf_counter()
        self.timeout = timeout

    def now(self) -> float:
        return time.perf_counter() - self.start

    def arrived(self) -> None:
        now = self.now()
        while self.pending and self.pending[0]["arrival"] <= now:
            self.waiting.append(self.pending.popleft())
        self.waiting.sort(key=lambda r: (not r["high"], r["arrival"]))

    def idle_until_arrival(self) -> None:
        if not self.waiting and self.pending:
            time.sleep(max(0.0, self.pending[0]["arrival"] - self.now()))
        self.arrived()

    def expired(self) -> bool:
        return self.now() > self.timeout

    def done(self) -> bool:
        return not self.pending and not self.waiting


def _finish(completions: dict, members: list, loop: ArrivalLoop, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    now = loop.now()
    for m in members:
        completions[m.spec["id"]] = now


@torch.no_grad()
def run_serial(model, workload, device, dtype, timeout) -> dict:
    """(a): each request alone, priority then arrival order; per-request service times kept."""
    loop, clock = ArrivalLoop(workload, timeout), IterationClock(device)
    completions: Dict[int, float] = {}
    service: Dict[int, float] = {}
    while not loop.done() and not loop.expired():
        loop.idle_until_arrival()
        spec = loop.waiting.pop(0)
        begin = loop.now()
        r = DiffusersRequest(spec, device, dtype)
        done = False
        while not done:
            start = clock.mark()
            out = _batched_call(model, [r], device)
            before = clock.mark()
            done = r.step(out)
            clock.add(start, before, clock.mark(), 1)
        _finish(completions, [r], loop, device)
        service[spec["id"]] = completions[spec["id"]] - begin
        loop.arrived()
    return dict(completions=completions, iterations=clock.summary(), service_s=service)


@torch.no_grad()
def run_static(model, workload, device, dtype, timeout, max_batch: int, wait: float) -> dict:
    """(b): a batch of one shape runs to completion before the next starts."""
    loop, clock = ArrivalLoop(workload, timeout), IterationClock(device)
    completions: Dict[int, float] = {}
    while not loop.done() and not loop.expired():
        loop.idle_until_arrival()
        shape = loop.waiting[0]["shape"]
        fill_until = loop.now() + wait
        while loop.pending and sum(r["shape"] == shape for r in loop.waiting) < max_batch and loop.now() < fill_until:
            time.sleep(min(0.001, max(0.0, fill_until - loop.now())))
            loop.arrived()
        batch = [r for r in loop.waiting if r["shape"] == shape][:max_batch]
        loop.waiting = [r for r in loop.waiting if not any(r is b for b in batch)]
        active = [DiffusersRequest(r, device, dtype) for r in batch]
        while active:
            start = clock.mark()
            out = _batched_call(model, active, device)
            before = clock.mark()
            finished = [m for j, m in enumerate(active) if m.step(out[j:j + 1])]
            clock.add(start, before, clock.mark(), len(active))
            if finished:
                _finish(completions, finished, loop, device)
                active = [m for m in active if m not in finished]
            loop.arrived()
    return dict(completions=completions, iterations=clock.summary())


@torch.no_grad()
def run_step_level(model, workload, device, dtype, timeout, max_batch: int) -> dict:
    """(c): requests join and leave at any step; a batched model call per shape, then one
    diffusers step per request."""
    loop, clock = ArrivalLoop(workload, timeout), IterationClock(device)
    completions: Dict[int, float] = {}
    active: List[Any] = []
    while not loop.done() or active:
        if loop.expired():
            break
        if not active:
            loop.idle_until_arrival()
        while loop.waiting and len(active) < max_batch:
            active.append(DiffusersRequest(loop.waiting.pop(0), device, dtype))
        start = clock.mark()
        groups: dict = {}
        for m in active:
            groups.setdefault(m.spec["shape"], []).append(m)
        outputs = {shape: _batched_call(model, members, device) for shape, members in groups.items()}
        before = clock.mark()
        finished = []
        for shape, members in groups.items():
            finished += [m for j, m in enumerate(members) if m.step(outputs[shape][j:j + 1])]
        clock.add(start, before, clock.mark(), len(active))
        if finished:
            _finish(completions, finished, loop, device)
            active = [m for m in active if m not in finished]
        loop.arrived()
    return dict(completions=completions, iterations=clock.summary())


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


def derived_serial(workload: list[dict], service: dict) -> dict:
    """(a) at another rate: one server, priority then arrival order, the measured service
    time of each request."""
    pending = sorted(workload, key=lambda r: r["arrival"])
    waiting: List[Any] = []
    clock = 0.0
    completions: Dict[int, float] = {}
    while pending or waiting:
        if not waiting:
            clock = max(clock, pending[0]["arrival"])
        while pending and pending[0]["arrival"] <= clock:
            waiting.append(pending.pop(0))
        waiting.sort(key=lambda r: (not r["high"], r["arrival"]))
        r = waiting.pop(0)
        if r["id"] not in service:
            continue
        clock += service[r["id"]]
        completions[r["id"]] = clock
    return completions


def unloaded_latencies(server: OctopusServer, workload) -> dict:
    """Each high-priority request alone through the octopus sampler."""
    latencies = {}
    for spec in (r for r in workload if r["high"]):
        start = time.perf_counter()
        server.sampler.submit(shape=spec["shape"], scheduler=spec["scheduler"], scheduler_config=spec["config"],
                              num_inference_steps=spec["steps"], seed=spec["seed"]).result()
        latencies[spec["id"]] = time.perf_counter() - start
    return latencies


# -- the run -----------------------------------------------------------------------------


def run_mode(mode: str, model, workload, args, device, dtype, servers: dict) -> dict:
    runners: dict[str, Callable[[], dict]] = {
        "serial": lambda: run_serial(model, workload, device, dtype, args.run_timeout),
        "static": lambda: run_static(model, workload, device, dtype, args.run_timeout, args.max_batch,
                                     args.static_wait),
        "step-level": lambda: run_step_level(model, workload, device, dtype, args.run_timeout, args.max_batch),
        "octopus": lambda: servers["octopus"].run(workload, args.run_timeout),
        "octopus-graphs": lambda: servers["octopus-graphs"].run(workload, args.run_timeout),
        "octopus-priority": lambda: (servers.get("octopus-graphs") or servers["octopus"]).run(
            workload, args.run_timeout, preempt=True, high_priority_batch=args.priority_batch),
        "octopus-lane": lambda: servers["octopus-lane"].run(workload, args.run_timeout),
        "octopus-lane-priority": lambda: servers["octopus-lane"].run(
            workload, args.run_timeout, preempt=True, high_priority_batch=args.priority_batch),
        "octopus-lane-yield": lambda: servers["octopus-lane"].run(
            workload, args.run_timeout, preempt=True, normal_lane_pause=args.normal_lane_pause),
    }
    with GpuSampler(device) as gpu:
        wall = time.perf_counter()
        raw = runners[mode]()
        wall = time.perf_counter() - wall
    row = summarize(workload, raw["completions"])
    row.update(mode=mode, wall_s=wall, gpu_utilization=gpu.mean("utilization"),
               sm_clock_mhz=gpu.mean("sm_clock_mhz"), truncated=row["completed"] < len(workload),
               **{k: v for k, v in raw.items() if k != "completions"})
    return row


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    model = make_model(args.model, device, dtype)
    # octopus-priority runs on the graphs' sampler (or, without graphs, the eager one).
    wanted = set(args.modes) | ({"octopus-graphs" if device.type == "cuda" else "octopus"}
                                if "octopus-priority" in args.modes else set()) | (
        {"octopus-lane"} if {"octopus-lane-priority", "octopus-lane-yield"} & set(args.modes) else set())
    servers = {mode: OctopusServer(model, device, dtype, args.max_batch,
                                  mode == "octopus-graphs" or (mode == "octopus-lane" and device.type == "cuda"),
                                  len(args.shapes), args.max_in_flight, priority_lane=mode == "octopus-lane",
                                  priority_batch=args.priority_batch)
               for mode in ("octopus", "octopus-graphs", "octopus-lane") if mode in wanted}
    try:
        return _run(args, device, dtype, model, servers)
    finally:
        for server in servers.values():
            server.close()


def _run(args, device, dtype, model, servers) -> dict:
    rows, scenarios = [], []
    base = make_workload(args.requests, 1.0, args.seed, args.high_share, shapes=args.shapes, steps=args.steps)
    warm = [dict(r, arrival=r["arrival"] / max(args.rates)) for r in base[:min(len(base), 2 * args.max_batch)]]
    for mode, server in servers.items():
        print(f"warm-up: {mode}" + (" (capturing CUDA graphs)" if server.graphs else ""), file=sys.stderr)
        server.prepare(args.shapes)
        server.run(warm, args.run_timeout)
    unloaded = {}
    if args.high_share > 0 and servers:
        unloaded = unloaded_latencies(servers.get("octopus-graphs") or next(iter(servers.values())), base)
    serial_service = None
    high_only: List[dict] = []
    for rate in sorted(args.rates):
        workload = [dict(r, arrival=r["arrival"] / rate) for r in base]
        for mode in args.modes:
            if mode == "serial" and serial_service is not None:
                row = summarize(workload, derived_serial(workload, serial_service))
                row.update(mode=mode, derived=True)
            else:
                print(f"rate {rate:g}/s: {mode}", file=sys.stderr)
                row = run_mode(mode, model, workload, args, device, dtype, servers)
                if mode == "serial":
                    serial_service = row.pop("service_s")
                    check = summarize(workload, derived_serial(workload, serial_service))
                    row["derived_check"] = dict(p50_s=check["p50_s"], p99_s=check["p99_s"])
            row["rate"] = rate
            row["high_p99_over_unloaded"] = _ratio(row, unloaded)
            rows.append(row)
        if "octopus-lane-yield" in args.modes and unloaded:
            high_only.append(dict(rate=rate, **_high_only(servers["octopus-lane"], workload, args, unloaded)))
    if args.single:
        # A quarter of the requests: every step of them is a large model call.
        single = make_workload(max(1, args.requests // 4), max(args.rates), args.seed + 1, 0.0,
                               shapes=[args.shapes[-1]], samplers=[SAMPLERS[0]], steps=(args.steps[1], args.steps[1]))
        # No high-priority requests here: octopus-priority would be octopus-graphs again.
        for mode in (m for m in args.modes if m not in ("serial", "octopus-priority", "octopus-lane",
                                                        "octopus-lane-priority", "octopus-lane-yield")):
            print(f"single shape: {mode}", file=sys.stderr)
            row = run_mode(mode, model, single, args, device, dtype, servers)
            row.update(rate=max(args.rates), scenario="single")
            scenarios.append(row)
    return dict(environment=environment(device), model=dict(name=args.model, config=MODELS[args.model],
                                                            parameters=sum(p.numel() for p in model.parameters()),
                                                            dtype=str(dtype)),
                settings={k: v for k, v in vars(args).items() if k != "out"}, rows=rows, scenarios=scenarios,
                unloaded_high_s={str(k): v for k, v in unloaded.items()}, high_only=high_only)


def _high_only(server: OctopusServer, workload: list[dict], args, unloaded: dict) -> dict:
    """The high-priority requests of `workload` by themselves, at their arrival times, as
    octopus-lane-yield serves them: what they cost one another (they share the priority
    lane), a floor under their latency whatever is done with the other requests."""
    high = [r for r in workload if r["high"]]
    with GpuSampler(server.sampler.device) as gpu:
        raw = server.run(high, args.run_timeout, preempt=True, normal_lane_pause=args.normal_lane_pause)
    row = summarize(high, raw["completions"])
    return dict(completed=row["completed"], requests=row["requests"], high_p50_s=row["high_p50_s"],
                high_p99_s=row["high_p99_s"], high_p99_over_unloaded=_ratio(row, unloaded),
                latencies=row["latencies"], iterations=raw["iterations"], sm_clock_mhz=gpu.mean("sm_clock_mhz"))


def _ratio(row: dict, unloaded: dict) -> float | None:
    """p99 of the high-priority latencies over the p99 of the same requests alone."""
    ids = [int(k) for k in row["latencies"] if int(k) in unloaded]
    if not ids or row.get("high_p99_s") is None:
        return None
    return row["high_p99_s"] / percentile([unloaded[i] for i in ids], 99)


def format_table(result: dict) -> str:
    row_format = "{:<26}{:>7}{:>10}{:>9}{:>9}{:>10}{:>10}{:>8}{:>8}{:>7}"
    head = row_format.format(
        "mode", "rate", "images/s", "p50 s", "p99 s", "high p99", "vs alone", "step %", "batch", "gpu %")
    lines = [head]

    def fmt(value, spec):
        return format(value, spec) if value is not None else "-"

    for r in result["rows"] + result["scenarios"]:
        it = r.get("iterations") or {}
        name = r["mode"] + (" (derived)" if r.get("derived") else "") + (" [single]" if r.get("scenario") else "")
        lines.append(row_format.format(
            name, fmt(r["rate"], "g"), fmt(r["throughput"], ".1f"), fmt(r["p50_s"], ".3f"), fmt(r["p99_s"], ".3f"),
            fmt(r["high_p99_s"], ".3f"), fmt(r.get("high_p99_over_unloaded"), ".2f"),
            fmt(100 * it["step_share"] if it.get("step_share") is not None else None, ".1f"),
            fmt(it.get("mean_batch"), ".1f"), fmt(r.get("gpu_utilization"), ".0f")))
    for h in result.get("high_only", []):
        lines.append(row_format.format(
            "high-priority only", fmt(h["rate"], "g"), "-", "-", "-", fmt(h["high_p99_s"], ".3f"),
            fmt(h["high_p99_over_unloaded"], ".2f"), "-", fmt((h["iterations"] or {}).get("mean_batch"), ".1f"), "-"))
    return "\n".join(lines)


def plot(result: dict, out_dir: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    modes = list(dict.fromkeys(r["mode"] for r in result["rows"]))
    for mode, color in zip(modes, plt.cm.tab10.colors):
        rows = sorted((r for r in result["rows"] if r["mode"] == mode and r["throughput"]), key=lambda r: r["rate"])
        for key, style in (("p50_s", "o-"), ("p99_s", "s--")):
            ax.plot([r["throughput"] for r in rows], [r[key] for r in rows], style, color=color,
                    label=f"{mode} {key[:3]}")
    ax.set_xlabel("throughput (images/s)")
    ax.set_ylabel("latency (s)")
    ax.set_yscale("log")
    ax.set_title(f"{result['environment'].get('device')}: latency vs throughput ({result['model']['name']} UNet)")
    ax.legend(fontsize=7, ncol=2)
    path = os.path.join(out_dir, "serving_latency_throughput.png")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m octopus.bench.serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--shapes", nargs="+", default=["x".join(map(str, s)) for s in SHAPES], metavar="CxHxW",
                   help="latent shapes, drawn in equal shares (default: 4x32x32 4x64x64 4x96x96)")
    p.add_argument("--steps", type=int, nargs=2, default=[10, 50], metavar=("MIN", "MAX"),
                   help="steps per request, drawn uniformly")
    p.add_argument("--rates", type=float, nargs="+", default=[24.0, 64.0, 160.0], help="arrivals per second")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--static-wait", type=float, default=0.05, help="(b): seconds a batch waits to fill")
    p.add_argument("--priority-batch", type=int, default=8,
                   help="octopus-priority: the batch cap while high-priority requests run; octopus-lane: "
                        "the priority lane's batch sizes captured up front")
    p.add_argument("--normal-lane-pause", type=float, default=math.inf,
                   help="octopus-lane-yield: seconds the other samples pause at a time while high-priority "
                        "ones run (default: inf, strict priority)")
    p.add_argument("--high-share", type=float, default=0.1)
    p.add_argument("--max-in-flight", type=int, default=2,
                   help="(d): iterations the sampler issues ahead of the GPU (ContinuousSampler's max_in_flight)")
    p.add_argument("--model", default=None, choices=sorted(MODELS), help="default: realistic on a GPU, tiny on a CPU")
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-timeout", type=float, default=60.0, help="seconds after which a run stops (marked truncated)")
    p.add_argument("--no-single", dest="single", action="store_false", help="skip the single-shape scenario")
    p.add_argument("--out", default="octopus-bench-results", help="directory for serving.json and the plot")
    p.add_argument("--no-plots", action="store_true")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.requests < 1 or args.max_batch < 1 or args.max_in_flight < 1 or any(r <= 0 for r in args.rates)
            or not 0 <= args.high_share <= 1):
        parser.error("--requests, --max-batch and --max-in-flight must be positive, --rates positive, "
                     "--high-share in [0, 1]")
    try:
        args.shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    except ValueError:
        parser.error(f"--shapes must look like 4x64x64, got {args.shapes}")
    if not 1 <= args.steps[0] <= args.steps[1]:
        parser.error(f"--steps must be 1 <= MIN <= MAX, got {args.steps}")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and octopus.built_with_cuda else "cpu"
    if args.model is None:
        args.model = "realistic" if args.device.startswith("cuda") else "tiny"
    if torch.device(args.device).type == "cpu":
        print("No GPU in use: a CPU smoke run (times are CPU times, not the GPU benchmark; no CUDA graphs).",
              file=sys.stderr)
        args.modes = [m for m in args.modes if m != "octopus-graphs"]
    os.makedirs(args.out, exist_ok=True)
    result = run(args)
    if not args.no_plots:
        try:
            result["plot"] = plot(result, args.out)
        except ImportError:
            print("(no plot: matplotlib is not installed)", file=sys.stderr)
    path = os.path.join(args.out, "serving.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(format_table(result))
    print(f"\nraw measurements: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

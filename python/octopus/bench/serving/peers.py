"""The peers: what a user, or a serving system, writes today with diffusers' schedulers
(serial, static batching, step-level continuous batching), and the serial server's latencies
derived at other rates."""

from __future__ import annotations

import collections
import time
from typing import Any, Callable, Dict, List

import torch

from octopus._host_copies import to_device
from octopus.diffusion.model_runner import CapturedCalls

from .measure import IterationClock


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


def _batched_call(model, members: list, device, graphs: CapturedCalls | None = None) -> torch.Tensor:
    """One model call for requests of one shape, each at its own timestep (replaying a CUDA
    graph of the model for this shape and batch size where ``graphs`` keeps them)."""
    x = torch.cat([m.model_input() for m in members]) if len(members) > 1 else members[0].model_input()
    t = to_device(torch.tensor([m.t_value for m in members], dtype=torch.float32), device)
    if graphs is not None:
        return graphs(x, t, {})
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

    def admit(self, active: list, max_batch: int, make: Callable[[dict], Any]) -> bool:
        """One turn of a continuous-batching server: False when it should stop (everything
        served, or the run timed out); else, idle, it waits for an arrival, then moves waiting
        requests (made by ``make``) into ``active`` up to ``max_batch``."""
        if (self.done() and not active) or self.expired():
            return False
        if not active:
            self.idle_until_arrival()
        while self.waiting and len(active) < max_batch:
            active.append(make(self.waiting.pop(0)))
        return True


def finish(completions: dict, ids: list, loop: ArrivalLoop, device: torch.device) -> None:
    """Requests ``ids`` completed now (once the device has done their work)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    now = loop.now()
    for i in ids:
        completions[i] = now


def _iterate(model, active: list, device, clock: IterationClock, completions: dict, loop: ArrivalLoop,
             graphs: CapturedCalls | None = None) -> list:
    """One iteration over the active requests: a batched model call per shape, then one
    diffusers step per request; records the finished ones and returns those still running."""
    start = clock.mark()
    groups: dict = {}
    for m in active:
        groups.setdefault(m.spec["shape"], []).append(m)
    outputs = {shape: _batched_call(model, members, device, graphs) for shape, members in groups.items()}
    before = clock.mark()
    finished = [m for shape, members in groups.items() for j, m in enumerate(members)
                if m.step(outputs[shape][j:j + 1])]
    clock.add(start, before, clock.mark(), len(active))
    if not finished:
        return active
    finish(completions, [m.spec["id"] for m in finished], loop, device)
    return [m for m in active if m not in finished]


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
        finish(completions, [spec["id"]], loop, device)
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
            active = _iterate(model, active, device, clock, completions, loop)
            loop.arrived()
    return dict(completions=completions, iterations=clock.summary())


@torch.no_grad()
def run_step_level(model, workload, device, dtype, timeout, max_batch: int,
                   graphs: CapturedCalls | None = None) -> dict:
    """(c): requests join and leave at any step; a batched model call per shape (with
    ``graphs``: a CUDA graph per shape and batch size, captured at its second use), then one
    diffusers step per request."""
    loop, clock = ArrivalLoop(workload, timeout), IterationClock(device)
    completions: Dict[int, float] = {}
    active: List[Any] = []
    while loop.admit(active, max_batch, lambda spec: DiffusersRequest(spec, device, dtype)):
        active = _iterate(model, active, device, clock, completions, loop, graphs)
        loop.arrived()
    return dict(completions=completions, iterations=clock.summary())


@torch.no_grad()
def prepare_peer_graphs(graphs: CapturedCalls, shapes, batch_sizes, device: torch.device, dtype: torch.dtype,
                        conditioning: Dict[str, torch.Tensor] | None = None) -> None:
    """Captures a step-level peer's graphs before it is measured, as octopus's sampler
    captures its own (``prepare_graphs``): every shape at every batch size, the largest first
    (a family's graphs share a memory pool), with ``conditioning``: one sample's model keyword
    tensors, repeated for the batch. A key's first call runs eagerly, its second is captured."""
    for shape in shapes:
        for n in sorted(set(batch_sizes), reverse=True):
            x = torch.zeros((n, *shape), device=device, dtype=dtype)
            t = torch.full((n,), 500.0, device=device)
            kwargs = {k: v.expand(n, *v.shape).contiguous() for k, v in (conditioning or {}).items()}
            for _ in range(2):
                graphs(x, t, kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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

"""The continuous sampler: requests join a running batch at any step and leave when done.

One thread runs the iterations. Each iteration admits waiting requests into free places
(priority, then deadline, then arrival; ``max_batch`` and a memory budget), packs the
active samples' latents by group (latent shape and conditioning signature), runs the model
once per group (concurrently on leased CUDA streams), and then steps **every** active sample
with one fused ``sampler_step`` launch, each at its own timestep of its own sampler (DDIM,
Euler, flow-matching Euler, DPM-Solver++ 2M, UniPC; its own step count, its own multistep
state). Samples whose last step is done leave; their futures resolve on a finishing thread.

With ``priority_lane``, high-priority samples iterate in a lane of their own (its own packed
batch, step and streams), issued before and concurrently with the others' iterations, so that
they never wait for the other samples' model calls; with ``normal_lane_pause`` the other
samples' iterations also wait (for at most that long at a time) while the priority lane has
samples, so that high-priority requests have the GPU as if alone.

The loop decides, then carries out: admission is a plan made from plain values
(:mod:`~octopus.diffusion.admission`); the lanes, and which of them iterates in a round, are
:mod:`~octopus.diffusion.lanes`; the iteration timings :mod:`~octopus.diffusion.iteration_timing`.
"""

from __future__ import annotations

import atexit
import bisect
import concurrent.futures
import contextlib
import dataclasses
import itertools
import math
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Mapping, Sequence, cast

import numpy as np
import torch

from .._host_copies import to_device
from ..scheduling import DeadlineMissed, StreamScheduler
from .admission import Budget, Candidate, plan_admission, service_order
from .arena import Member
from .iteration_timing import IterationTimer
from .lanes import Lane, Lanes
from .model_runner import CapturedCalls
from .requests import SampleResult, SamplingRequest, check_request, resolve_scheduler, sampler_row
from .rows import RowTables, SamplerRow, fused_step
from .schedulers import _BatchedScheduler

GPU_POLL_S = 2e-4  # how often a sampling thread waiting for the GPU checks it
_OPEN: "weakref.WeakSet[ContinuousSampler]" = weakref.WeakSet()


@atexit.register
def _close_open_samplers() -> None:
    """Samplers still open when the interpreter exits are cancelled, so that no sampling
    thread outlives it."""
    for sampler in list(_OPEN):
        with contextlib.suppress(TimeoutError):  # a model call that never returns: leave it
            sampler.close(cancel=True, timeout=30)


@dataclasses.dataclass(eq=False, kw_only=True)
class _Running(Member):
    """A request from submission to its result (a :class:`Member` of the arena while active)."""

    request: SamplingRequest
    row: SamplerRow
    future: concurrent.futures.Future[SampleResult] = dataclasses.field(default_factory=concurrent.futures.Future)
    priority: int = 0
    deadline: float | None = None
    bytes: int = 0
    submitted: float = 0.0
    started: float | None = None
    candidate: Candidate = dataclasses.field(init=False)  # what admission knows of it: set when it is queued
    step: int = 0
    slot: int | None = None
    divisors: np.ndarray | None = None     # euler: what each step's model input is divided by
    generator: torch.Generator | None = None  # stochastic samplers: their step noise
    cond: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    neg: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    failed: bool = False
    lane: Lane | None = None  # while it has a slot


class ContinuousSampler:
    """Samples many requests at once with a continuously refilled batch.

    Args:
        model: ``model(latents [B, *shape], timesteps [B] float32, **conditioning)`` returning
            the prediction (a tensor, or diffusers' output with ``.sample``), e.g. a diffusers
            ``UNet2DModel`` / ``UNet2DConditionModel``.
        max_batch: samples stepped at once (a guided sample counts once; its model batch is
            doubled).
        device: where the latents live (default: the model's device).
        dtype: the latents' dtype (default: the model's).
        scheduler: the sampler of requests that name none (see :class:`SamplingRequest`).
        memory_budget: bytes the active samples may take (None: no limit); a request's
            estimate is its latents, model output, multistep state and guided copies, plus
            ``model_bytes_per_element`` per latent element (what the model allocates per
            element of its input; measure it for your model).
        stream_scheduler: the :class:`~octopus.StreamScheduler` the groups' model calls lease
            streams from (CUDA; default: one of its own with 4 leases).
        cuda_graphs: capture each (input shape, batch) model call as a CUDA graph on its
            second use and replay it after (CUDA; the model must be capturable).
        max_graphs: graphs kept (least recently used dropped).
        preempt: park running lower-priority samples (their latents and state kept) when a
            higher-priority request waits for a place; they resume where they stopped.
        high_priority_batch: while a request of priority "high" (or higher) is waiting or
            running, the batch is capped at this many samples, so that its iterations stay
            short (with ``preempt``, lower-priority samples are parked to get there).
        max_in_flight: iterations issued to the GPU and not yet finished there (CUDA; per
            lane). The sampling thread waits before issuing more, so that a request admitted
            now starts at most this many iterations later; 2 keeps the GPU busy while the host
            prepares the next iteration.
        priority_lane: samples of priority "high" (or higher) iterate in a lane of their own:
            their own packed batch and fused step, on high-priority streams, issued first and
            concurrently with the other samples' iterations (their CUDA graphs are captured on
            high-priority streams). ``max_batch`` counts the samples of both lanes.
        normal_lane_pause: with ``priority_lane``: while the priority lane has samples, the
            normal lane issues no iteration for up to this many seconds, then one, then
            pauses again (its samples keep their places and state). 0 (the default): the
            lanes iterate side by side, sharing the GPU; ``math.inf``: strict priority (the
            normal lane waits as long as high-priority requests keep coming). The normal
            lane's iterations already on the GPU (at most ``max_in_flight``) still finish
            first. Time paused: ``stats()["normal_lane_paused_s"]``.
        record_iterations: keep per-iteration timings (:meth:`iteration_timings`).

    Requests (:meth:`submit`) get a :class:`concurrent.futures.Future` of a
    :class:`SampleResult`. :meth:`close` drains (or cancels) and stops the threads.
    ``memory_budget``, ``preempt``, ``high_priority_batch`` and ``normal_lane_pause`` are
    attributes read at every iteration; they may be changed while the sampler runs
    (``max_batch`` may not).
    """

    def __init__(self, model: Callable[..., Any], *, max_batch: int = 32, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, scheduler: Any = None, memory_budget: int | None = None,
                 model_bytes_per_element: float = 0.0, stream_scheduler: StreamScheduler | None = None,
                 cuda_graphs: bool = False, max_graphs: int = 64, preempt: bool = False,
                 high_priority_batch: int | None = None, max_in_flight: int = 2, priority_lane: bool = False,
                 normal_lane_pause: float = 0.0, record_iterations: bool = False):
        if not callable(model):
            raise TypeError("model must be callable")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
        if high_priority_batch is not None and not (isinstance(high_priority_batch, int) and high_priority_batch >= 1):
            raise ValueError(f"high_priority_batch must be a positive int or None, got {high_priority_batch!r}")
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be a positive int, got {max_in_flight!r}")
        if isinstance(normal_lane_pause, bool) or not isinstance(normal_lane_pause, (int, float)) or not (
                normal_lane_pause >= 0):
            raise ValueError(f"normal_lane_pause must be a non-negative number of seconds, got {normal_lane_pause!r}")
        if normal_lane_pause > 0 and not priority_lane:
            raise ValueError("normal_lane_pause needs priority_lane=True (it pauses the lane that is not the "
                             "priority lane)")
        if memory_budget is not None and memory_budget <= 0:
            raise ValueError(f"memory_budget must be positive bytes or None, got {memory_budget!r}")
        if model_bytes_per_element < 0:
            raise ValueError(f"model_bytes_per_element must be non-negative, got {model_bytes_per_element}")
        parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
        self.device = torch.device(device) if device is not None else (
            parameter.device if parameter is not None else torch.device("cpu"))
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dtype = dtype or (parameter.dtype if parameter is not None else torch.float32)
        if self.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
            raise TypeError(f"dtype must be float32, float64, float16 or bfloat16, got {self.dtype}")
        self.max_batch, self.high_priority_batch = max_batch, high_priority_batch
        self.memory_budget, self.model_bytes_per_element = memory_budget, float(model_bytes_per_element)
        self.preempt = bool(preempt)
        self._default_scheduler = scheduler
        self._schedulers: dict[tuple[type, str], _BatchedScheduler] = {}
        self._owned_streams: StreamScheduler | None = None
        if self.device.type == "cuda" and stream_scheduler is None:
            stream_scheduler = self._owned_streams = StreamScheduler(4, devices=[self.device.index])
        self._lanes = Lanes(model, self.device, self.dtype, max_batch, stream_scheduler, cuda_graphs, max_graphs,
                            priority_lane)
        self.priority_lane = bool(priority_lane)
        self.normal_lane_pause = float(normal_lane_pause)
        self._active: list[_Running] = []
        self._waiting: dict[int, _Running] = {}  # by arrival number
        self._queue: list[Candidate] = []  # the waiting requests' candidates, in service order
        self._arrivals = itertools.count()
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._inbox: list[_Running] = []
        self._closing = self._cancelling = False
        self._counts = dict(submitted=0, completed=0, failed=0, cancelled=0, expired=0, parked=0, iterations=0,
                            sample_steps=0)
        self._timer = IterationTimer(record_iterations, self.device)
        self.max_in_flight = max_in_flight
        self._finisher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="octopus-sampler-finish")
        self._thread = threading.Thread(target=self._loop, name="octopus-sampler", daemon=True)
        self._thread.start()
        _OPEN.add(self)

    # -- the caller's side --------------------------------------------------------------

    def submit(self, request: SamplingRequest | None = None, /,
               **fields: Any) -> concurrent.futures.Future[SampleResult]:
        """Queues a request (a :class:`SamplingRequest`, or its fields as keywords) and
        returns the future of its :class:`SampleResult`. Bad requests raise here."""
        if request is None:
            request = SamplingRequest(**fields)
        elif fields:
            raise TypeError("pass a SamplingRequest or its fields as keywords, not both")
        shape, priority, deadline = check_request(request)
        spec = request.scheduler if request.scheduler is not None else self._default_scheduler
        if spec is None:
            raise ValueError("the request names no scheduler and the sampler has no default (scheduler=...)")
        with self._lock:
            scheduler = resolve_scheduler(spec, request.scheduler_config, self._schedulers)
        row = sampler_row(scheduler, request, shape)
        running = _Running(key=None, shape=shape, state_rows=row.state_rows, request=request, row=row,
                           priority=priority, deadline=deadline, submitted=time.monotonic())
        running.pending_latents = self._initial_latents(request, row, running)
        if row.kind in ("euler", "euler_ancestral"):
            running.divisors = np.array([row.model_input_divisor(k) for k in range(row.num_steps)])
        running.bytes = self._estimate_bytes(running)
        if self.memory_budget is not None and running.bytes > self.memory_budget:
            raise ValueError(f"the request needs about {running.bytes} bytes, more than memory_budget "
                             f"({self.memory_budget})")
        with self._lock:
            if self._closing:
                raise RuntimeError("the sampler is closed")
            self._inbox.append(running)
            self._counts["submitted"] += 1
            self._wakeup.notify()
        return running.future

    def close(self, cancel: bool = False, timeout: float | None = None) -> None:
        """Stops accepting requests, finishes every queued and running one (or, with
        ``cancel``, cancels them: their futures raise CancelledError), and stops the
        sampler's threads. Idempotent."""
        with self._lock:
            self._closing = True
            self._cancelling = self._cancelling or cancel
            self._wakeup.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the sampler did not stop within {timeout} s")
        self._finisher.shutdown(wait=True)
        if self._owned_streams is not None:
            self._owned_streams.close()
        _OPEN.discard(self)

    def __enter__(self) -> "ContinuousSampler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """Counters (submitted, completed, failed, cancelled, expired, parked, iterations,
        sample_steps: samples stepped over all iterations), the requests waiting and running
        now, the CUDA graphs captured, and ``normal_lane_paused_s``: seconds the normal lane
        waited for the priority lane (``normal_lane_pause``; pauses that ended)."""
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            out["waiting"] = len(self._inbox) + len(self._waiting)
            out["normal_lane_paused_s"] = self._lanes.paused_s
        out["running"] = len(self._active)
        out["graphs_captured"] = sum(lane.runner.graphs.captures for lane in self._lanes
                                     if lane.runner.graphs is not None)
        return out

    def prepare_graphs(self, shapes: Iterable[Sequence[int]], batch_sizes: Iterable[int],
                       conditioning: Mapping[str, torch.Tensor] | None = None,
                       priority_batch_sizes: Iterable[int] | None = None) -> int:
        """With ``cuda_graphs``: captures the model's call for every latent shape and batch
        size now (a warm-up call and the capture), rather than on their second use while
        sampling. ``conditioning``: one sample's model keyword tensors, for models that take
        them (a guided batch of n samples is a model batch of 2n). With ``priority_lane``,
        the priority lane's graphs are captured too, for ``priority_batch_sizes`` (default:
        ``batch_sizes``). Call it while no request is waiting or running. Returns the number
        of graphs captured."""
        if self._lanes.normal.runner.graphs is None:
            raise RuntimeError("prepare_graphs needs a sampler made with cuda_graphs=True")
        with self._lock:
            busy = bool(self._inbox or self._waiting or self._active)
        if busy:
            raise RuntimeError("prepare_graphs must be called while the sampler is idle")
        kwargs = self._on_device(conditioning)
        shapes, batch_sizes = [tuple(s) for s in shapes], list(batch_sizes)
        # Largest batch first: a family's graphs share a memory pool, and the smaller graphs
        # then fit in what the larger ones' intermediates left free.
        sizes = [sorted(set(batch_sizes), reverse=True),
                 sorted(set(priority_batch_sizes if priority_batch_sizes is not None else batch_sizes), reverse=True)]
        captured = 0
        with torch.no_grad(), torch.cuda.device(self.device):
            for lane, lane_sizes in zip(self._lanes, sizes):
                graphs = cast(CapturedCalls, lane.runner.graphs)
                before = graphs.captures
                with lane.on_stream():
                    for shape in shapes:
                        for b in lane_sizes:
                            x = torch.zeros((b, *shape), device=self.device, dtype=self.dtype)
                            t = torch.zeros(b, device=self.device)
                            batched = {k: v.expand(b, *v.shape).contiguous() for k, v in kwargs.items()}
                            for _ in range(2):  # the first call is the warm-up, the second is captured
                                graphs(x, t, batched)
                captured += graphs.captures - before
        return captured

    def iteration_timings(self) -> list[dict[str, float]]:
        """With ``record_iterations``: per iteration since the last call, its ``lane``
        ("normal" or "priority"), ``samples``, ``groups``, and times in ms: ``iteration``
        (from the first model call's issue to the step's end) and ``step`` (the fused step),
        device times from CUDA events on a GPU (host times on the CPU), and ``step_host``
        (host time to prepare and issue the step)."""
        return self._timer.collect()

    # -- the sampling thread -------------------------------------------------------------

    def _loop(self) -> None:
        context = contextlib.ExitStack()
        context.enter_context(torch.no_grad())  # grad mode is per thread: this one samples, never trains
        if self.device.type == "cuda":
            context.enter_context(torch.cuda.device(self.device))
        with context:
            while True:
                with self._lock:
                    while not (self._inbox or self._active or self._waiting or self._closing):
                        self._wakeup.wait()
                    incoming, self._inbox = self._inbox, []
                    closing, cancelling = self._closing, self._cancelling
                for running in incoming:
                    self._enqueue(running, next(self._arrivals))
                if cancelling:
                    self._cancel_everything()
                    return
                if closing and not (self._active or self._waiting):
                    return
                try:
                    self._iterate()
                except Exception as error:  # noqa: BLE001 (a failure of the loop fails the running requests only)
                    self._abandon_active(error)

    def _iterate(self) -> None:
        """Carries out the admission plan, then issues an iteration of every lane that has
        samples, its turn this round and room on the GPU (the priority lane first); waits for
        the GPU where none has room."""
        self._admit(time.monotonic())
        lanes = self._lanes.this_round({cast(Lane, m.lane) for m in self._active}, self.normal_lane_pause,
                                       time.monotonic())
        issued = False
        for lane in lanes:
            if lane.ready(self.max_in_flight):
                with lane.on_stream():
                    self._iterate_lane(lane)
                issued = True
        if lanes and not issued:  # every lane of the round has max_in_flight iterations on the GPU
            self._wait_for_gpu(lanes[0].in_flight[0])  # the priority lane's first

    def _wait_for_gpu(self, event: torch.cuda.Event) -> None:
        """Until the iteration behind ``event`` finishes on the GPU, or a request arrives (it
        is admitted, and a high-priority one issued, without waiting for the iteration)."""
        while not event.query():
            with self._lock:
                if self._inbox:
                    return
                self._wakeup.wait(GPU_POLL_S)  # submit() notifies at once

    def _iterate_lane(self, lane: Lane) -> None:
        if lane.changed:
            lane.arena.rebuild([m for m in self._active if m.lane is lane])
            lane.plans = lane.runner.plans(lane.arena, lambda m: (m.priority, m.cond, m.neg,
                                                                  m.request.guidance_scale,
                                                                  m.request.guidance_rescale))
            lane.sample_rows = to_device(np.array([m.slot for m in self._members(lane)], dtype=np.int64),
                                         self.device)
            lane.changed = False
        members = self._members(lane)
        timing = self._timer.begin(lane.name, len(members), len(lane.arena.groups))
        timesteps = to_device(np.array([m.row.timesteps[m.step] for m in members]), self.device)
        # The fused step finds a step by its key (a repeated timestep's steps have keys apart).
        keys = timesteps
        if any(m.row.repeats_timesteps for m in members):
            keys = to_device(np.array([m.row.keys[m.step] for m in members]), self.device)
        divisors = None
        if any(m.divisors is not None for m in members):
            divisors = to_device(torch.tensor([m.divisors[m.step] if m.divisors is not None else 1.0 for m in members],
                                              dtype=self.dtype), self.device)
        for member, error in lane.runner.run(lane.arena, lane.plans, timesteps.float(), divisors):
            self._fail(member, error, "failed")
        step_host = time.perf_counter()
        self._timer.before_step(timing)
        noise = self._step_noise(lane, members)
        prev, _ = fused_step(lane.arena.model_output, lane.arena.latents, lane.arena.offsets, keys,
                             cast(RowTables, lane.tables),  # built when the lane's first request joined
                             sample_rows=lane.sample_rows, noise=noise, state=lane.arena.state)
        lane.arena.latents = prev
        self._timer.end(timing, step_host)
        if lane.stream is not None:
            done = torch.cuda.Event()
            done.record(lane.stream)
            lane.in_flight.append(done)
        self._counts["iterations"] += 1
        self._counts["sample_steps"] += len(members)
        for m in members:
            if m.failed:
                continue
            m.step += 1
            if m.step == m.row.num_steps:
                self._finish(m)

    @staticmethod
    def _members(lane: Lane) -> list[_Running]:
        """The lane's members, in their order in its arena."""
        return cast("list[_Running]", lane.arena.members)

    # -- admission ----------------------------------------------------------------------

    def _enqueue(self, m: _Running, arrival: int) -> None:
        """Makes it wait for a place, ``arrival`` its number in arrival order (a parked request
        keeps its own, and so its place)."""
        m.candidate = Candidate(arrival, m.priority, m.deadline, m.bytes, started=m.started is not None)
        self._waiting[arrival] = m
        bisect.insort(self._queue, m.candidate, key=service_order)

    def _admit(self, now: float) -> None:
        """Carries out the admission plan: fails the requests whose deadline passed while they
        waited, parks, and admits."""
        budget = Budget(self.max_batch, self.high_priority_batch, self.memory_budget, self.preempt)
        while True:
            plan = plan_admission([m.candidate for m in self._active], self._queue, budget, now)
            for arrival in plan.expired:
                late = self._waiting.pop(arrival)
                self._fail(late, DeadlineMissed(f"the request's deadline passed after {now - late.submitted:.3f} s "
                                                "in the queue"), "expired")
            active = {m.candidate.arrival: m for m in self._active}
            for arrival in plan.parked:
                self._park(active[arrival])
            joined = [self._join_from_queue(self._waiting.pop(arrival)) for arrival in plan.admitted]
            if plan.expired or plan.parked or plan.admitted:  # parked ones were queued again by _park
                self._queue = [c for c in self._queue if c.arrival in self._waiting]
            if all(joined):
                return
            # A request that did not join (cancelled, or failing to) left its place to the next:
            # plan again for the rest, without parking (admission parks only before it admits).
            budget = dataclasses.replace(budget, preempt=False)

    def _join_from_queue(self, m: _Running) -> bool:
        """Whether it joined: not where its caller cancelled it while it waited, or it failed
        to join (its future failed)."""
        if m.started is None and not m.future.set_running_or_notify_cancel():
            self._counts["cancelled"] += 1  # cancelled by its caller while it waited
            return False
        try:
            joined = self._join(m)
        except Exception as error:  # noqa: BLE001 (whatever went wrong is this request's)
            self._fail(m, error, "failed")
            return False
        if joined:
            self._active.append(m)
        return joined

    def _park(self, m: _Running) -> None:
        lane = cast(Lane, m.lane)  # an active sample has one
        if m.position is not None:
            with lane.on_stream():
                m.pending_latents, m.pending_state = lane.arena.latents_of(m), lane.arena.state_of(m)
        m.position = None
        self._leave(m)
        self._enqueue(m, m.candidate.arrival)
        self._counts["parked"] += 1

    def _join(self, m: _Running) -> bool:
        """Gives the request a row of the tables (and, the first time, its conditioning on
        the device); False (its future failed) where its conditioning cannot be used."""
        if m.started is None:
            try:
                m.cond = self._on_device(m.request.conditioning)
                m.neg = self._on_device(m.request.negative_conditioning)
            except Exception as error:  # noqa: BLE001 (bad conditioning fails this request only)
                self._fail(m, error, "failed")
                return False
            m.key = (m.shape, tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(m.cond.items())))
            m.started = time.monotonic()
        lane = self._lanes.lane_for(m.priority)
        m.lane, m.slot = lane, lane.free_slots.pop()
        lane.write_row(m.slot, m.row)
        return True

    def _on_device(self, tensors: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        return {k: to_device(v, self.device).to(self.dtype if v.is_floating_point() else v.dtype)
                for k, v in (tensors or {}).items()}

    def _release_slot(self, m: _Running) -> None:
        if m.slot is not None:
            cast(Lane, m.lane).free_slots.append(m.slot)
        m.slot, m.lane = None, None

    # -- results ------------------------------------------------------------------------

    def _finish(self, m: _Running) -> None:
        lane = cast(Lane, m.lane)  # called on the lane's stream
        latents = lane.arena.latents_of(m)
        done = None
        if lane.stream is not None:
            done = torch.cuda.Event()
            done.record(lane.stream)
        self._leave(m)
        self._counts["completed"] += 1
        self._finisher.submit(self._resolve, m, latents, done)

    @torch.no_grad()
    def _resolve(self, m: _Running, latents: torch.Tensor, done: torch.cuda.Event | None) -> None:
        try:
            if done is not None:
                done.synchronize()
            finished = time.monotonic()
            output = m.request.callback(latents) if m.request.callback is not None else None
            started = cast(float, m.started)  # set when it joined
            m.future.set_result(SampleResult(latents, output, queued_s=started - m.submitted,
                                             sampling_s=finished - started, iterations=m.row.num_steps))
        except BaseException as error:  # noqa: BLE001 (the callback's failure is this request's)
            m.future.set_exception(error)

    def _fail(self, m: _Running, error: BaseException, counter: str) -> None:
        m.failed = True
        if m in self._active:
            self._leave(m)
        self._release_slot(m)
        self._counts[counter] += 1
        if m.future.running() or m.future.set_running_or_notify_cancel():
            m.future.set_exception(error)

    def _leave(self, m: _Running) -> None:
        self._active.remove(m)
        cast(Lane, m.lane).changed = True
        self._release_slot(m)

    def _abandon_active(self, error: BaseException) -> None:
        for m in list(self._active):
            self._fail(m, error, "failed")
        for lane in self._lanes:
            lane.clear()

    def _cancel_everything(self) -> None:
        waiting, self._waiting, self._queue = list(self._waiting.values()), {}, []
        for m in waiting + list(self._active):
            if m in self._active:
                self._leave(m)
            if not m.future.cancel():  # already running: cancel() refuses, so say it
                m.future.set_exception(concurrent.futures.CancelledError("the sampler was closed"))
            self._counts["cancelled"] += 1

    # -- per-iteration pieces -----------------------------------------------------------

    def _initial_latents(self, request: SamplingRequest, row: SamplerRow, running: _Running) -> torch.Tensor:
        """The request's noise (drawn on the CPU from its seed), times init_noise_sigma; a
        stochastic sampler's step noise continues the same generator, as in a diffusers
        pipeline (where the initial noise is given, the generator starts at the seed)."""
        seed = request.seed if request.seed is not None else int(torch.randint(0, 2**62, ()).item())
        generator = torch.Generator().manual_seed(seed)
        if request.noise is not None:
            noise = request.noise.detach().to("cpu", self.dtype)
        else:
            noise = torch.randn(running.shape, generator=generator, dtype=self.dtype)
        if row.stochastic:
            running.generator = generator
        if row.init_noise_sigma != 1.0:
            noise = noise * row.init_noise_sigma
        # Pinned, so that joining the batch copies it without waiting for the sampler's stream.
        return noise.pin_memory() if self.device.type == "cuda" else noise

    def _estimate_bytes(self, m: _Running) -> int:
        numel = math.prod(m.shape)
        guided = 2 if m.request.guidance_scale is not None else 1
        buffers = 3 + m.row.state_rows + 2 * (guided - 1)  # latents, model output, the step's output, state, copies
        element = torch.empty((), dtype=self.dtype).element_size()
        return int(numel * (element * buffers + self.model_bytes_per_element * guided))

    def _step_noise(self, lane: Lane, members: Sequence[_Running]) -> torch.Tensor | None:
        """The step noise of the stochastic samples (drawn from each one's generator where
        diffusers draws it, in its order, shape and dtype); None where no sample has any."""
        if not any(m.generator is not None and not m.failed for m in members):
            return None
        noise = torch.zeros(lane.arena.latents.numel(), dtype=self.dtype)
        offsets = np.concatenate([[0], np.cumsum([math.prod(m.shape) for m in members])])
        for m, start, end in zip(members, offsets[:-1], offsets[1:]):
            if m.generator is not None and not m.failed and m.row.draws_noise(m.step):
                # DPM-Solver++ SDE draws float32 noise whatever the latents' dtype.
                dtype = torch.float32 if m.row.kind == "dpm_solver_pp_2m_sde" else self.dtype
                noise[start:end] = torch.randn(m.shape, generator=m.generator, dtype=dtype).reshape(-1)
        return to_device(noise, self.device)

"""Runs one mode of a workload: every BE job looping in a thread of its own, every LC job in
a thread of its own on its fixed open-loop schedule (job k of an LC job arrives at
``start + phase + k * period``; its latency runs from that arrival to its work's completion,
so a job that starts late because the one before overran is counted from when it should
have started; the part of it before the job's thread runs again is kept as well). Measured
over a window after a warm-up: each LC job's latencies, each BE job's products per second,
and the GPU's SM clock and power (NVML)."""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import gzip
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

import octopus

from ..energy import GpuSampler
from .modes import Mode
from .workloads import BEJob, LCJob


def capture_graph(run: Callable[[], object], stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """``run``'s work as a CUDA graph captured on ``stream``, after one run outside it (the
    first launches' one-time work)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        run()
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            run()
    stream.synchronize()
    return graph


class Runner:
    """A workload's jobs on one device, runnable in any mode."""

    def __init__(self, lc_jobs: List[LCJob], be_jobs: List[BEJob], device: torch.device, warmup_s: float,
                 measure_s: float, controller_warmup_s: float, stall_dump_ms: Optional[float] = None,
                 lc_arrival: bool = False):
        self.lc_jobs, self.be_jobs, self.device = lc_jobs, be_jobs, device
        self.warmup_s, self.measure_s, self.controller_warmup_s = warmup_s, measure_s, controller_warmup_s
        self.stall_dump_ms = stall_dump_ms
        # Whether LC leases give acquire their jobs' arrival times (arrived=): the controller
        # then times each job from its arrival, as the table does, not from its acquire.
        self.lc_arrival = lc_arrival
        self._arrival = threading.local()  # .t: the arrival of the job this LC thread launches
        # The last run's measured window (time.perf_counter seconds): LC jobs that arrived in it
        # are the row's; a subclass that records more per job keeps the same ones.
        self.window: Optional[Tuple[float, float]] = None
        # LC jobs running now, by thread: (job name, start); read by the stall watchdog.
        self._running: Dict[int, tuple] = {}
        self.cuda = device.type == "cuda"
        # Graph jobs captured once per stream priority: kernel nodes keep the priority of the
        # stream they were captured on.
        self.graphs: Dict[tuple, torch.cuda.CUDAGraph] = {}
        if self.cuda:
            for job in lc_jobs:
                if job.graph:
                    for priority in (0, -1):
                        self.graphs[(job.name, priority)] = self._capture(job.run, priority)

    def _capture(self, run: Callable[[], object], priority: int) -> torch.cuda.CUDAGraph:
        return capture_graph(run, torch.cuda.Stream(self.device, priority=priority))

    def _body(self, job: LCJob, high: bool) -> Callable[[], object]:
        # Graphs replay through octopus.replay_graph in every mode, the peers' too: the GIL is
        # kept through the launch (a latency-critical user's best way to replay one).
        graph = self.graphs.get((job.name, -1 if high else 0))
        return functools.partial(octopus.replay_graph, graph) if graph is not None else job.run

    # -- LC ---------------------------------------------------------------------------

    def _lc_launcher(self, job: LCJob, mode: Mode, sched: Optional[octopus.StreamScheduler]) -> Callable[[], None]:
        """``launch()``: one job of ``job``, from its launch to its completion on the host."""
        if not self.cuda:
            body = job.run
            return lambda: (body(), None)[1]
        done = torch.cuda.Event()
        if mode.lc == "lease":
            assert sched is not None
            body = self._body(job, high=True)

            def leased() -> None:
                arrived = self._arrival.t if self.lc_arrival else None
                with sched.acquire(job.name, priority="high", arrived=arrived) as lease, \
                        torch.cuda.stream(lease.stream):
                    body()
                    done.record()
                    done.synchronize()
            return leased
        stream = torch.cuda.Stream(self.device, priority=-1 if mode.lc == "high" else 0)
        body = self._body(job, high=mode.lc == "high")

        def plain() -> None:
            with torch.cuda.stream(stream):
                body()
                done.record()
            done.synchronize()
        return plain

    def _lc_thread(self, job: LCJob, launch: Callable[[], None], start: float, phase: float, stop: threading.Event,
                   out: List[tuple], errors: List[BaseException]) -> None:
        k = 0
        watched = self.stall_dump_ms is not None  # by the stall watchdog
        try:
            while not stop.is_set():
                arrival = start + phase + k * job.period_s
                k += 1
                self._sleep_until(arrival)
                started = time.perf_counter()
                if watched:
                    self._running[threading.get_ident()] = (job.name, started)
                self._arrival.t = min(arrival, started)  # (a sleep never wakes early, but arrived= refuses the future)
                launch()
                if watched:
                    del self._running[threading.get_ident()]
                out.append((arrival, started, time.perf_counter()))
        except BaseException as error:  # noqa: BLE001 (the mode fails with it, not a row without this job)
            errors.append(error)
            self._running.pop(threading.get_ident(), None)  # not a stalled job for the watchdog

    def _sleep_until(self, arrival: float) -> None:
        """An LC thread's wait for its next job's arrival (``time.perf_counter`` seconds)."""
        wait = arrival - time.perf_counter()
        if wait > 0:
            time.sleep(wait)

    def _stall_watchdog(self, stop: threading.Event, dumps: List[Dict[str, Any]], limit: int = 20) -> None:
        """Every thread's Python stack, once per LC job that has run for over stall_dump_ms
        (at most ``limit`` per mode): where the time of a stalled job goes."""
        assert self.stall_dump_ms is not None
        seen = set()
        while not stop.wait(min(1e-3, self.stall_dump_ms * 1e-3 / 4)) and len(dumps) < limit:
            now = time.perf_counter()
            for ident, (name, started) in list(self._running.items()):
                if len(dumps) >= limit:  # two jobs may pass the threshold in one look
                    break
                if (now - started) * 1e3 <= self.stall_dump_ms or (ident, started) in seen:
                    continue
                seen.add((ident, started))
                threads = {t.ident: t.name for t in threading.enumerate()}
                stacks = {f"{threads.get(i, i)}{' (the stalled job)' if i == ident else ''}":
                          traceback.format_stack(frame)[-10:] for i, frame in sys._current_frames().items()}
                dumps.append(dict(job=name, at_s=started, after_ms=(now - started) * 1e3, stacks=stacks))

    # -- BE ---------------------------------------------------------------------------

    def _be_product(self, job: BEJob, mode: Mode, sched: Optional[octopus.StreamScheduler],
                    stream: Optional[torch.cuda.Stream]) -> Callable[[], Any]:
        """``product()``: queues one whole unit of the job's work; returns what to wait on."""
        if mode.be == "lease":
            assert sched is not None

            def leased() -> Any:
                lease = sched.acquire(job.name, best_effort=True)
                with lease, torch.cuda.stream(lease.stream) if self.cuda else contextlib.nullcontext():
                    if job.unit == "rows":
                        for rows in lease.slices(job.units, budget=mode.slice_budget_s):
                            job.launch(rows.start, rows.stop)
                    else:
                        assert job.batch is not None
                        for items, _ in lease.item_slices(job.batch, budget=mode.slice_budget_s):
                            job.launch(items.start, items.stop)
                return lease.release_event
            return leased

        def whole() -> Any:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                job.launch(0, job.units)
                if stream is None:
                    return None
                finished = torch.cuda.Event()
                finished.record()
            return finished
        return whole

    @staticmethod
    def _be_thread(product: Callable[[], Any], stop: threading.Event, completions: List[float],
                   errors: List[BaseException]) -> None:
        pending: collections.deque[Any] = collections.deque()
        try:
            while not stop.is_set():
                pending.append(product())
                while len(pending) > 2:  # two products queued: the device never waits for the host
                    finished = pending.popleft()
                    if finished is not None:
                        finished.synchronize()
                    completions.append(time.perf_counter())
            while pending:
                finished = pending.popleft()
                if finished is not None:
                    finished.synchronize()
        except BaseException as error:  # noqa: BLE001 (reported by the mode)
            errors.append(error)

    # -- a mode -------------------------------------------------------------------------

    def run(self, mode: Mode, trace: Optional[str] = None) -> Dict[str, Any]:
        """The mode's measurements: per LC job its latencies (ms, from arrival), per BE job
        its products per second, the scheduler's stats where it used one, NVML means. With
        ``trace`` (a path) and a scheduler, its timeline of the whole run, warm-up included, is
        written there as gzipped Chrome-trace JSON (the controller's steps, every lease and
        whether it closed the yield gate, every LC job's latency and target)."""
        sched = None
        if "lease" in (mode.lc, mode.be):
            options = dict(mode.options, record_timeline=True) if trace else mode.options
            sched = octopus.StreamScheduler(4, backend="cuda" if self.cuda else "simulated", **options)
        stop = threading.Event()
        trace_error: Optional[str] = None
        threads: List[threading.Thread] = []
        be_done: Dict[str, List[float]] = {}
        errors: List[BaseException] = []
        if mode.be != "none":
            for be_job in self.be_jobs:
                stream = torch.cuda.Stream(self.device) if self.cuda and mode.be != "lease" else None
                be_done[be_job.name] = []
                threads.append(threading.Thread(target=self._be_thread, args=(
                    self._be_product(be_job, mode, sched, stream), stop, be_done[be_job.name], errors), daemon=True))
        lc_out: Dict[str, List[tuple]] = {}
        warmup = self.controller_warmup_s if mode.kind == "controller" else self.warmup_s
        start = time.perf_counter() + 0.05
        if mode.lc != "none":
            for i, job in enumerate(self.lc_jobs):
                lc_out[job.name] = []
                launch = self._lc_launcher(job, mode, sched)
                phase = job.period_s * i / len(self.lc_jobs)
                threads.append(threading.Thread(target=self._lc_thread, args=(
                    job, launch, start, phase, stop, lc_out[job.name], errors), daemon=True))
        stalls: List[Dict[str, Any]] = []
        if self.stall_dump_ms is not None and mode.lc != "none":
            threads.append(threading.Thread(target=self._stall_watchdog, args=(stop, stalls), daemon=True))
        collecting = gc.isenabled()
        gc.disable()  # as timeit does: a collection inside a timed job is not the GPU's doing
        try:
            for t in threads:
                t.start()
            time.sleep(max(0.0, start + warmup - time.perf_counter()))
            control_before = sched.stats()["devices"][0]["control"] if sched is not None else None
            t0 = time.perf_counter()
            with GpuSampler(self.device) as gpu:
                time.sleep(self.measure_s)
            t1 = time.perf_counter()
            self.window = (t0, t1)
            control = sched.stats()["devices"][0]["control"] if sched is not None else None
            # How the scheduler measured each BE job's slices (where it sliced them): device
            # seconds per unit, and the host's seconds per slice (slices are kept twice as long).
            slicing = {job.name: dict(seconds_per_unit=sched.seconds_per_unit(job.name),
                                      host_seconds_per_slice=sched.host_seconds_per_slice(job.name))
                       for job in self.be_jobs} if sched is not None and mode.be == "lease" else None
        finally:
            stop.set()
            for t in threads:
                t.join()
            if sched is not None:
                try:
                    if trace:
                        write_trace(sched, trace)
                except Exception as error:  # noqa: BLE001 (the run's measurements stand without it)
                    trace_error = f"{type(error).__name__}: {error}"
                finally:  # its control thread must not run on into the next mode
                    sched.close()
            if collecting:
                gc.enable()
            if self.cuda:
                torch.cuda.synchronize(self.device)
        if errors:
            raise errors[0]
        row: Dict[str, Any] = dict(name=mode.name, kind=mode.kind, lc_mode=mode.lc, be_mode=mode.be,
                                   options=mode.options, slice_budget_s=mode.slice_budget_s,
                                   target_ratio=mode.target_ratio, window_s=t1 - t0,
                                   sm_clock_mhz=gpu.mean("sm_clock_mhz"), power_w=gpu.mean("power_w"),
                                   power_capped_share=gpu.mean("power_capped"))
        row["lc_ms"] = {name: [(done - arrival) * 1e3 for arrival, _, done in out if t0 <= arrival < t1]
                        for name, out in lc_out.items()}
        # The host's part: from arrival until the job's thread runs again (the sleep's
        # overshoot, the GIL, the CPU), before the job itself starts.
        row["lc_start_ms"] = {name: [(started - arrival) * 1e3 for arrival, started, _ in out if t0 <= arrival < t1]
                              for name, out in lc_out.items()}
        row["be_per_s"] = {name: sum(t0 <= c <= t1 for c in done) / (t1 - t0) for name, done in be_done.items()}
        if self.stall_dump_ms is not None:
            row["stalls"] = [dict(d, at_s=d["at_s"] - t0) for d in stalls]  # at_s: from the window's start
        if control is not None:
            row["control"] = control
            row["lc_arrival"] = self.lc_arrival  # what the controller timed its LC jobs from
            window = control_in_window(control_before, control)
            if window is not None:
                row["control_window"] = window
        if slicing is not None:
            row["be_slicing"] = slicing
        if trace_error is not None:
            row["trace_error"] = trace_error
        return row


def control_in_window(before: Optional[Dict[str, Any]], after: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The controller's stats over the measured window alone (``after`` less ``before``, taken
    at its start): seconds at each step, and per LC kind its jobs at each step and of them
    those over the target then (the warm-up's are left out: its first steps, before targets
    are known, are no part of what the window measured). None where latency control is off."""
    if not before or not after.get("enabled") or "seconds_at_steps" not in after:
        return None
    seconds = [a - b for a, b in zip(after["seconds_at_steps"], before["seconds_at_steps"])]
    kinds = {}
    for name, kind in after.get("kinds", {}).items():
        earlier = before.get("kinds", {}).get(name, {}).get("steps") or [dict(jobs=0, over=0)] * len(kind["steps"])
        kinds[name] = [dict(jobs=a["jobs"] - b["jobs"], over=a["over"] - b["over"])
                       for a, b in zip(kind["steps"], earlier)]
    return dict(seconds_at_steps=seconds, kinds=kinds)


def write_trace(sched: octopus.StreamScheduler, path: str) -> None:
    """The scheduler's timeline as gzipped Chrome-trace JSON at ``path``: whole, or not there."""
    partial = path + ".part"
    try:
        with tempfile.TemporaryDirectory() as scratch:
            plain = os.path.join(scratch, "trace.json")
            sched.dump_trace(plain)
            with open(plain, "rb") as f, gzip.open(partial, "wb") as out:
                shutil.copyfileobj(f, out)
        os.replace(partial, path)
    finally:
        if os.path.isfile(partial):
            os.remove(partial)

"""The continuous sampler's per-iteration timings (``record_iterations``).

Each lane iteration is timed from its first model call's issue to its fused step's end, and
its step alone: by CUDA events recorded on the lane's stream on a GPU (read once the iteration
has finished there), by the host clock on the CPU. Beside them, the host time spent preparing
and issuing the step.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import torch


@dataclasses.dataclass
class Timing:
    """One lane iteration's: host clock readings (perf_counter, s) while it runs, then
    ``step_host``, ``iteration`` and ``step`` in ms (on a GPU, the last two from ``events`` once
    it has finished there)."""

    lane: str
    samples: int
    groups: int
    host_start: float
    events: list[torch.cuda.Event] = dataclasses.field(default_factory=list)  # start, before the step, end
    host_before_step: float = 0.0
    step_host: float = 0.0
    iteration: float = 0.0
    step: float = 0.0


class IterationTimer:
    """Records the sampling thread's iterations (where ``enabled``) until :meth:`collect`
    hands them to the caller's thread."""

    def __init__(self, enabled: bool, device: torch.device):
        self._enabled = enabled
        self._device = device
        self._on_gpu = device.type == "cuda"
        self._lock = threading.Lock()
        self._recorded: list[Timing] = []

    def begin(self, lane: str, samples: int, groups: int) -> Timing | None:
        """Before the iteration's first model call. On the lane's stream, as :meth:`before_step`
        and :meth:`end` are called."""
        if not self._enabled:
            return None
        timing = Timing(lane, samples, groups, host_start=time.perf_counter())
        if self._on_gpu:
            timing.events.append(_recorded_event())
        return timing

    def before_step(self, timing: Timing | None) -> None:
        if timing is None:
            return
        if self._on_gpu:
            timing.events.append(_recorded_event())
        else:
            timing.host_before_step = time.perf_counter()

    def end(self, timing: Timing | None, step_host: float) -> None:
        """After the step is issued; ``step_host``: when the host began preparing it."""
        if timing is None:
            return
        now = time.perf_counter()
        timing.step_host = (now - step_host) * 1e3
        if self._on_gpu:
            timing.events.append(_recorded_event())
        else:
            timing.iteration = (now - timing.host_start) * 1e3
            timing.step = (now - timing.host_before_step) * 1e3
        with self._lock:
            self._recorded.append(timing)

    def collect(self) -> list[dict[str, Any]]:
        """The iterations recorded since the last call, in the form of
        :meth:`ContinuousSampler.iteration_timings`; on a GPU, those finished there (the
        others are kept for the next call)."""
        if self._on_gpu:
            torch.cuda.synchronize(self._device)
        with self._lock:
            recorded, self._recorded = self._recorded, []
        out, unfinished = [], []
        for t in recorded:
            if t.events and not t.events[-1].query():  # an iteration still on the device
                unfinished.append(t)
                continue
            if t.events:
                start, before_step, end = t.events
                t.iteration, t.step = start.elapsed_time(end), before_step.elapsed_time(end)
            out.append(dict(samples=t.samples, groups=t.groups, lane=t.lane, step_host=t.step_host,
                            iteration=t.iteration, step=t.step))
        with self._lock:
            self._recorded[:0] = unfinished
        return out


def _recorded_event() -> torch.cuda.Event:
    """A timing event recorded on the current stream."""
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event

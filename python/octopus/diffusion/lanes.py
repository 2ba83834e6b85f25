"""The continuous sampler's lanes, and which of them iterates in each round.

A lane is a pipeline of iterations over its own samples: their packed latents, the fused
step's tables, the model calls and the stream its step runs on. There is the normal lane and,
with ``priority_lane``, the priority lane, which holds the samples of priority
:data:`~octopus.diffusion.admission.HIGH_PRIORITY` or more and runs on high-priority streams.
In each round the priority lane is issued first; with ``normal_lane_pause`` the normal lane
sits out rounds while both lanes have samples.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from typing import Any, Callable, Collection, Iterator

import torch

from ..scheduling import StreamScheduler
from .admission import HIGH_PRIORITY
from .arena import LatentArena
from .model_runner import GroupCall, ModelRunner
from .rows import RowTables, SamplerRow


@dataclasses.dataclass(eq=False)
class Lane:
    """A pipeline of iterations: its packed samples, the fused step's tables and free slots
    (``slots`` rows), the model calls (and their CUDA graphs), the stream its step runs on,
    and its iterations not yet finished on the GPU."""

    name: str  # "normal" or "priority", as iteration timings name it
    arena: LatentArena
    runner: ModelRunner
    stream: torch.cuda.Stream | None
    slots: int
    free_slots: list[int] = dataclasses.field(init=False)
    tables: RowTables | None = None
    sample_rows: torch.Tensor | None = None
    plans: list[GroupCall] = dataclasses.field(default_factory=list)
    changed: bool = False
    in_flight: collections.deque[torch.cuda.Event] = dataclasses.field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        self.free_slots = list(range(self.slots - 1, -1, -1))

    def ready(self, limit: int) -> bool:
        """Fewer than ``limit`` of its iterations are unfinished on the GPU."""
        while self.in_flight and self.in_flight[0].query():
            self.in_flight.popleft()
        return len(self.in_flight) < limit

    def on_stream(self) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def write_row(self, slot: int, row: SamplerRow) -> None:
        """Gives a joining sample's sampler row ``slot`` of the tables."""
        with self.on_stream():  # the lane's step reads its tables on its stream
            if self.tables is None:
                self.tables = RowTables.build([row] * self.slots, self.arena.device)
            self.tables = self.tables.widened(row.num_steps, len(row.table))
            self.tables.write(slot, row)
        self.changed = True

    def clear(self) -> None:
        """Drops its packed samples (after a failed iteration, whose samples all failed)."""
        self.arena = LatentArena(self.arena.device, self.arena.dtype)
        self.changed = True


class Lanes:
    """The normal lane and (with ``priority_lane``) the priority lane, each with its arena,
    model runner, stream and ``max_batch`` slots; ``paused_s``: seconds the normal lane sat
    out for the priority lane (pauses that ended)."""

    def __init__(self, model: Callable[..., Any], device: torch.device, dtype: torch.dtype, max_batch: int,
                 stream_scheduler: StreamScheduler | None, cuda_graphs: bool, max_graphs: int, priority_lane: bool):
        def lane(name: str, priority: int) -> Lane:
            return Lane(name, LatentArena(device, dtype),
                        ModelRunner(model, device, stream_scheduler, cuda_graphs, max_graphs, priority),
                        torch.cuda.Stream(device, priority=priority) if device.type == "cuda" else None, max_batch)

        # The priority lane's calls, graphs and step run on high-priority streams.
        self.normal = lane("normal", 0)
        self.priority = lane("priority", -1) if priority_lane else None
        self.paused_s = 0.0
        self._paused_since: float | None = None  # when the normal lane's current pause began

    def __iter__(self) -> Iterator[Lane]:
        """The normal lane, then the priority lane."""
        return iter([self.normal] if self.priority is None else [self.normal, self.priority])

    def lane_for(self, priority: int) -> Lane:
        """Where a sample of ``priority`` iterates."""
        if self.priority is not None and priority >= HIGH_PRIORITY:
            return self.priority
        return self.normal

    def this_round(self, busy: Collection[Lane], pause: float, now: float) -> list[Lane]:
        """Of the ``busy`` lanes (those with samples), those to issue an iteration of this
        round, the priority lane first: while both have samples, the normal lane sits out for
        up to ``pause`` s at a time (``normal_lane_pause``; then it iterates once and the next
        pause begins)."""
        lanes = [lane for lane in reversed(list(self)) if lane in busy]
        if self._normal_lane_waits(len(lanes) > 1, pause, now):
            lanes.remove(self.normal)
        return lanes

    def _normal_lane_waits(self, both_busy: bool, pause: float, now: float) -> bool:
        if not both_busy or pause <= 0:
            if self._paused_since is not None:
                self.paused_s += now - self._paused_since
                self._paused_since = None
            return False
        if self._paused_since is None:
            self._paused_since = now
        if now - self._paused_since < pause:
            return True
        self.paused_s += now - self._paused_since
        self._paused_since = now
        return False

"""Cutting long work into slices: ranges of a count (rows of a matrix, steps of a loop) or
item ranges of a :class:`RaggedBatch` with a bounded number of elements (views, no copies).

Slice sizes are fixed, or chosen from a latency budget (given, or the latency controller's
slice length) and the kind's measured device time per unit
(:meth:`StreamScheduler.seconds_per_unit`), both re-read before every slice so that they
follow the controller and the measurement as they move. A budget shorter than twice the
host's measured time per slice (:meth:`StreamScheduler.host_seconds_per_slice`) is raised to
it: shorter slices would leave the device waiting for the host between them, and the work
would crawl (seen with Python holders whose GIL waits made every slice's launch long). Sizes
from a budget are rounded down to a few per octave (:func:`size_on_grid`), so that they repeat.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator, Optional, Tuple

import torch

from ..ragged import RaggedBatch
from .arguments import whole_number

# With a budget but no measurement yet, the first slice takes this fraction of the work and
# each next one twice the one before (where slices are too short to be measured, the work
# still ends in a few of them).
_PROBE_FRACTION = 1 / 64
# A slice's device time is kept at least this many times the host's time per slice.
HOST_FACTOR = 2.0


def size_on_grid(units: int, up: bool = False) -> int:
    """``units`` rounded down (``up``: up) to 4, 5, 6 or 7 times a power of two (every count
    below 8 stays): at most four sizes an octave, each less than 20% under ``units`` (25% over).

    A size seen before is cheaper to launch. Libraries that choose their kernel per shape
    (cuBLAS) pay for each new one: on an H200 an fp16 GEMM of 8192 columns took 0.14 ms of host
    time at the median (up to 3.6 ms) at a row count it had not seen, 26 us again. Sizes
    computed from a measured time per unit, which moves a little with every slice, would
    rarely repeat, and every such cost counts in the host's time per slice that the budget is
    raised to."""
    if units < 8:
        return units
    shift = units.bit_length() - 3
    down = (units >> shift) << shift
    return down + (1 << shift) if up and down < units else down


class SliceSizer:
    """The size of the next slice: ``size`` units; or, with ``budget`` seconds, probes growing
    from 1/64 of the work while nothing is measured, then as many units as fit in the budget at
    the measured ``seconds_per_unit()`` rounded down by :func:`size_on_grid`, but no fewer than
    fit in ``HOST_FACTOR`` times ``host_seconds()`` (the host's time per slice, where known)
    rounded up; or everything where neither is given. ``budget`` may be a function, asked
    before every slice (the latency controller's slice length; None from it: everything
    left)."""

    def __init__(self, size: Optional[int], budget: float | Callable[[], Optional[float]] | None,
                 seconds_per_unit: Callable[[], Optional[float]], total: int,
                 host_seconds: Callable[[], Optional[float]] = lambda: None):
        if size is not None and budget is not None:
            raise ValueError("give a slice size or a latency budget, not both")
        self._size = None if size is None else whole_number(size, "size", 1)
        if budget is not None and not callable(budget):
            budget = float(budget)
            if not budget > 0 or math.isinf(budget):
                raise ValueError(f"budget must be a positive number of seconds, got {budget}")
        self._budget = budget
        self._seconds_per_unit = seconds_per_unit
        self._host_seconds = host_seconds
        self._probe = max(1, int(total * _PROBE_FRACTION))

    def next(self) -> Optional[int]:
        """Units for the next slice (None: all that is left)."""
        if self._size is not None:
            return self._size
        budget = self._budget() if callable(self._budget) else self._budget
        if budget is None:
            return None
        rate = self._seconds_per_unit()
        if rate is None:
            probe, self._probe = self._probe, 2 * self._probe
            return probe
        units = size_on_grid(max(1, int(budget / rate)))
        host = self._host_seconds()
        if host is not None:  # the floor rounded up: a slice's device time stays at least the host's
            units = max(units, size_on_grid(max(1, math.ceil(HOST_FACTOR * host / rate)), up=True))
        return units


def count_slices(total: int, sizer: SliceSizer) -> Iterator[slice]:
    """``slice(start, stop)`` covering ``range(total)`` in order, each as big as ``sizer`` says."""
    start = 0
    while start < total:
        size = sizer.next()
        stop = total if size is None else min(total, start + size)
        yield slice(start, stop)
        start = stop


def item_ranges(batch: RaggedBatch, sizer: SliceSizer) -> Iterator[Tuple[int, int, int]]:
    """``(start, stop, elements)`` item ranges of ``batch`` in order, each of at most the
    elements ``sizer`` says (an item larger than that is a range of its own)."""
    # Searched where the offsets live, a few scalar reads a range: a Python list of every offset
    # (what a bisect would need) costs a batch of 6K items 0.1-0.5 ms of one C call, every call,
    # and no other thread gets the GIL during it, a latency-critical one neither.
    offsets = batch.host_layout()[0].contiguous()
    m = len(batch)
    start, begin, last_end = 0, int(offsets[0]), int(offsets[m])
    while start < m:
        limit = sizer.next()
        if limit is None or begin + limit >= last_end:  # the rest fits (a limit past int64 too)
            stop = m
        else:
            # The last item boundary within `limit` elements of `begin`, at least one item on.
            last = int(torch.searchsorted(offsets, begin + limit, right=True)) - 1
            stop = min(m, max(last, start + 1))
        end = int(offsets[stop])
        yield start, stop, end - begin
        start, begin = stop, end

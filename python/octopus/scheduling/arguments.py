"""The scheduler's arguments as callers give them (priority names, shapes, deadlines,
arrival times, timeouts, counts), checked and converted to what the C++ scheduler takes;
errors name the argument."""

from __future__ import annotations

import math
import numbers
import operator
import time
from typing import Any, Sequence

import torch

PRIORITIES = {"low": -1, "normal": 0, "high": 1}
DEFAULT: Any = object()  # "not given": the scheduler's default timeout (Any: the default of a float | None)


def parse_priority(value: int | str) -> int:
    """``"low"`` / ``"normal"`` / ``"high"`` or an int, as the int the scheduler orders by."""
    if value.__class__ is str and value in PRIORITIES:
        return PRIORITIES[value]
    if isinstance(value, bool):
        raise TypeError("priority must be 'low', 'normal', 'high' or an int, got a bool")
    if isinstance(value, int):
        return value
    raise ValueError(f"priority must be 'low', 'normal', 'high' or an int, got {value!r}")


def parse_shape(value: Sequence[int] | torch.Size | None) -> list[int]:
    """A work shape as a list of ints ([] for None)."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        return [operator.index(s) for s in value]
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints or None, got {value!r}") from None


def parse_deadline(value: float | None) -> float | None:
    """Seconds from now, or None."""
    if value is None:
        return None
    seconds = float(value)
    if math.isnan(seconds):
        raise ValueError("deadline must be a number of seconds from now, got nan")
    return seconds


def parse_arrived(value: float | None) -> float | None:
    """A ``time.perf_counter()`` reading at or before now, as a float, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"arrived must be a time.perf_counter() reading or None, got {value!r}")
    try:
        arrived = float(value)
    except OverflowError:
        arrived = math.inf
    ahead = arrived - time.perf_counter()
    if not math.isfinite(arrived) or ahead > 0:
        raise ValueError(f"arrived must be a finite time.perf_counter() reading at or before now, got {value!r}"
                         + (f" ({ahead:.3g} s from now)" if math.isfinite(arrived) else ""))
    return arrived


def parse_timeout(value: float | None) -> float | None:
    """Seconds, as the C++ scheduler takes them: None for DEFAULT (its own), -1 for None (for ever)."""
    if value is DEFAULT:
        return None
    if value is None:
        return -1.0
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"timeout must be a non-negative number of seconds or None (wait for ever), got {seconds}")
    return seconds


def whole_number(value: Any, name: str, minimum: int = 0) -> int:
    """``value`` as an int of at least ``minimum``; a clear error naming ``name`` otherwise."""
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if number < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {number}")
    return number

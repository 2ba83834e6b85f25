"""The interpreter's GIL switch interval while a scheduler guards latency-critical work.

A latency-critical thread that wakes (its request arrives, its stream synchronizes) needs
the GIL before it can acquire a lease or return. If a best-effort thread holds it, running
Python between its slices, CPython makes the waiter wait up to the switch interval
(``sys.getswitchinterval()``, 5 ms by default) before it forces a hand-over: on a GPU
whose latency-critical jobs take a fraction of a millisecond, that wait is the tail
(``octopus-bench contention`` measures how late a thread wakes beside a Python-busy one).

Each request lowers the interval to at most its value while it is open; the interval in
force is the smallest open request's, and the interpreter's own comes back when the last
one closes. The price: Python threads that compete for the GIL switch more often (each
switch costs them a few microseconds).
"""

from __future__ import annotations

import itertools
import math
import sys
import threading

_lock = threading.Lock()
_open: dict[int, float] = {}  # request token -> its interval
_tokens = itertools.count()
_interpreter_interval: float | None = None  # the interval before the first open request


def check_interval(seconds: float, name: str = "gil_switch_interval") -> float:
    """``seconds`` as a float, or ValueError naming ``name`` where it is not positive and finite."""
    value = float(seconds)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number of seconds (or None to leave the interpreter's), "
                         f"got {seconds!r}")
    return value


def lower_switch_interval(seconds: float) -> int:
    """Keeps the switch interval at most ``seconds`` until :func:`restore_switch_interval`
    is called with the returned token."""
    value = check_interval(seconds)
    global _interpreter_interval
    with _lock:
        if not _open:
            _interpreter_interval = sys.getswitchinterval()
        assert _interpreter_interval is not None
        token = next(_tokens)
        _open[token] = value
        sys.setswitchinterval(min(_interpreter_interval, min(_open.values())))
    return token


def restore_switch_interval(token: int) -> None:
    """Closes a request (a second close of one token does nothing)."""
    global _interpreter_interval
    with _lock:
        if _open.pop(token, None) is None:
            return
        if _open:
            assert _interpreter_interval is not None
            sys.setswitchinterval(min(_interpreter_interval, min(_open.values())))
        elif _interpreter_interval is not None:
            sys.setswitchinterval(_interpreter_interval)
            _interpreter_interval = None

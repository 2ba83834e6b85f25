"""Device timing shared by autotune and the benchmark tool: CUDA events after warm-up, medians
of repeats; host clocks on the CPU. And the one percentile rule every octopus statistic uses."""

import math
import statistics
import time
from typing import Callable, List, Optional, Sequence

import torch


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 20) -> float:
    """Median time of fn() in milliseconds: CUDA events on a GPU, perf_counter on the CPU."""
    return statistics.median(sample_ms(fn, device, warmup, repeats))


def sample_ms(fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 20,
              host_ms: Optional[List[float]] = None) -> List[float]:
    """The time of each of ``repeats`` calls of fn() after ``warmup`` calls, in milliseconds.
    ``host_ms``, when given, receives each call's host time: on a GPU from before its start
    event is recorded to after its end event is (a call whose time is close to it was held up
    by the host, not the device)."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            fn()
            end.record()
            t1 = time.perf_counter()
            end.synchronize()
            times.append(start.elapsed_time(end))
            if host_ms is not None:
                host_ms.append((t1 - t0) * 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        if host_ms is not None:
            host_ms.extend(times)
    return times


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 < q <= 100) of ``values`` by nearest rank: the smallest value
    with at least q% of the values at or below it (the sorted values' ``ceil(q / 100 * n)``-th).
    The scheduler's C++ statistics use the same rule. Raises ValueError for no values."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 < q <= 100:
        raise ValueError(f"q must be in (0, 100], got {q}")
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q / 100 * len(ordered)))) - 1]

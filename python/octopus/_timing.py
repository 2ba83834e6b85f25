"""Device timing shared by autotune and the benchmark tool: CUDA events after warm-up, medians
of repeats; host clocks on the CPU."""

import statistics
import time
from typing import Callable, List, Optional

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

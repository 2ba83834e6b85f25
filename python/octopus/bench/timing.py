"""Timing helpers: CUDA events after warm-up, medians of repeats; host clocks on the CPU."""

import statistics
import time
from typing import Callable

import torch


def median_ms(fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 20) -> float:
    """Median time of fn() in milliseconds: CUDA events on a GPU, perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def wall_ms(fn: Callable[[], object], device: torch.device, repeats: int = 5, warmup: int = 0) -> float:
    """Median host wall time of fn() including a final device synchronization: for work
    that synchronizes on its own (host-built plans) or is issued from several threads."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbs(device: torch.device, nbytes: int) -> float:
    """Measured device-to-device copy bandwidth (bytes read + written per second, GB/s)."""
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, warmup=3, repeats=20)
    return 2 * src.numel() * 4 / ms / 1e6

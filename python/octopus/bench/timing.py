"""Timing helpers: CUDA events after warm-up, medians of repeats; host clocks on the CPU."""

import statistics
import time
from typing import Any, Callable, List

import torch

from .._timing import median_ms as median_ms, sample_ms as sample_ms  # re-exported for the benchmarks


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


class Measurer:
    """Times a callable (:func:`median_ms`) and, on a GPU, also counts the caching allocator's
    cudaMalloc calls and retries during the timed calls, measures the device memory
    one call allocates beyond what was allocated before it (``torch.cuda.max_memory_allocated``)
    and the energy of one call from NVML's total-energy counter: the callable is repeated for
    at least ``energy_window_ms`` and the counter's difference divided by the repetitions
    (whole-GPU energy, idle power included)."""

    def __init__(self, device: torch.device, energy_window_ms: float = 0.0):
        self.device = device
        self.energy_window_ms = energy_window_ms
        self.energy: Any = None  # an EnergyCounter where NVML has one
        self.energy_note = "no GPU" if device.type != "cuda" else "disabled (--energy-window-ms 0)"
        if device.type == "cuda" and energy_window_ms > 0:
            from .energy import EnergyCounter
            counter = EnergyCounter(device)
            self.energy = counter if counter.available else None
            self.energy_note = "NVML total-energy counter" if counter.available else counter.reason

    def measure(self, fn: Callable[[], object], warmup: int = 3, repeats: int = 20) -> dict:
        host: List[float] = []
        allocator_before = self._allocator_counts()
        times = sample_ms(fn, self.device, warmup=warmup, repeats=repeats, host_ms=host)
        allocator_after = self._allocator_counts()
        result = dict(kernel_ms=statistics.median(times), times_ms=times, host_ms=statistics.median(host),
                      peak_mb=None, energy_mj=None, device_mallocs=None, alloc_retries=None)
        if self.device.type == "cuda":
            result["device_mallocs"], result["alloc_retries"] = (
                after - before for before, after in zip(allocator_before, allocator_after))
            torch.cuda.synchronize(self.device)
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            fn()
            torch.cuda.synchronize(self.device)
            result["peak_mb"] = (torch.cuda.max_memory_allocated(self.device) - before) / 1e6
            if self.energy is not None:
                result["energy_mj"] = self._energy_mj(fn)
        return result

    def _allocator_counts(self) -> tuple:
        """(cudaMalloc calls, cudaMalloc failures retried after freeing the cache) so far: a
        timed row that calls cudaMalloc on every repeat pays for the allocator, not the op."""
        if self.device.type != "cuda":
            return (0, 0)
        stats = torch.cuda.memory_stats(self.device)
        return (stats.get("num_device_alloc", 0), stats.get("num_alloc_retries", 0))

    def back_to_back(self, fn: Callable[[], object], calls: int = 20, repeats: int = 7) -> dict:
        """Per call of ``calls`` calls issued back to back (median of ``repeats``): the host's
        launch time then overlaps the device's work, which a single timed call includes —
        what a loop or a pipeline of such calls costs each time."""
        def many():
            for _ in range(calls):
                fn()
        times = [t / calls for t in sample_ms(many, self.device, warmup=1, repeats=repeats)]
        return dict(kernel_ms=statistics.median(times), times_ms=times, peak_mb=None, energy_mj=None)

    def _energy_mj(self, fn) -> float:
        start_mj = self.energy.millijoules()
        t0 = time.perf_counter()
        calls = 0
        while True:
            fn()
            calls += 1
            if calls % 8 == 0 or calls < 8:
                torch.cuda.synchronize(self.device)
                if (time.perf_counter() - t0) * 1e3 >= self.energy_window_ms:
                    break
        torch.cuda.synchronize(self.device)
        return (self.energy.millijoules() - start_mj) / calls

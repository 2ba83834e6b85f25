"""What the scheduler's own calls cost from Python: an uncontended acquire + release (alone,
and beside a thread running Python), a best-effort checkpoint with nothing to wait for, the
Batcher per request, and how late a thread wakes beside one running Python."""

from __future__ import annotations

import contextlib
import statistics
import sys
import threading
import time
from typing import Iterator

import torch

import octopus


def lease_overhead(backend: str, iterations: int = 20000, beside_busy: int = 2000) -> dict:
    """Median cost of one uncontended acquire + release, in microseconds; and its p50 / p99
    (nearest rank) beside a thread running pure Python at the 0.2 ms switch interval, where
    an acquire that gave the GIL up would wait for it back."""
    from .._timing import percentile
    with octopus.StreamScheduler(4, backend=backend) as sched:
        cpp = statistics.median(sched._impl.time_acquire_release("overhead", 50, max(1, iterations // 50))) / 1e3
        samples = []
        for _ in range(50):
            start = time.perf_counter()
            for _ in range(max(1, iterations // 50)):
                with sched.acquire("overhead"):
                    pass
            samples.append((time.perf_counter() - start) / max(1, iterations // 50) * 1e6)
        busy_us = []
        with _busy_thread(2e-4):
            for _ in range(beside_busy):
                start = time.perf_counter()
                with sched.acquire("overhead"):
                    pass
                busy_us.append((time.perf_counter() - start) * 1e6)
    return dict(backend=backend, cpp_us=cpp, python_us=statistics.median(samples),
                beside_busy_p50_us=percentile(busy_us, 50), beside_busy_p99_us=percentile(busy_us, 99))


@contextlib.contextmanager
def _busy_thread(switch_interval: float) -> Iterator[None]:
    """A thread running pure Python (a best-effort thread preparing its work) for the block, at
    this GIL switch interval."""
    before = sys.getswitchinterval()
    stop = threading.Event()

    def busy() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    thread = threading.Thread(target=busy, daemon=True)
    sys.setswitchinterval(switch_interval)
    try:
        thread.start()
        yield
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(before)


def batcher_overhead(backend: str, requests: int = 2000) -> dict:
    """The Batcher's cost per request around a trivial fn (returns its batch): requests
    submitted back to back (throughput) and one at a time (latency), beside the same work
    (pack, fn, split) done directly."""
    device = torch.device("cuda") if backend == "cuda" else torch.device("cpu")
    with octopus.StreamScheduler(4, backend=backend) as sched:
        items = [torch.full((16,), float(i), device=device) for i in range(requests)]
        with octopus.Batcher(lambda batch: batch, max_batch=64, max_delay=0.001, scheduler=sched) as batcher:
            for f in [batcher.submit(x) for x in items[:200]]:  # warm-up
                f.result()
            t0 = time.perf_counter()
            for f in [batcher.submit(x) for x in items]:
                f.result()
            per_request = (time.perf_counter() - t0) / requests * 1e6
        latency = []
        with octopus.Batcher(lambda batch: batch, max_batch=1, max_delay=0.0, scheduler=sched) as batcher:
            for x in items[:300]:
                t0 = time.perf_counter()
                batcher.submit(x).result()
                latency.append((time.perf_counter() - t0) * 1e6)
    direct = []
    for x in items[:300]:
        t0 = time.perf_counter()
        batch = octopus.RaggedBatch.from_tensors([x], device=device)
        batch.unbind()
        if device.type == "cuda":
            torch.cuda.synchronize()
        direct.append((time.perf_counter() - t0) * 1e6)
    single = statistics.median(latency[50:])
    return dict(backend=backend, requests=requests, back_to_back_us_per_request=per_request,
                single_request_us_p50=single, direct_us_p50=statistics.median(direct[50:]),
                overhead_us_per_request=single - statistics.median(direct[50:]))


def checkpoint_cost(backend: str, calls: int = 5000) -> dict:
    """Median cost of one best-effort checkpoint with nothing to wait for, from Python."""
    samples = []
    with octopus.StreamScheduler(4, backend=backend) as sched, sched.acquire("checkpoint", best_effort=True) as lease:
        for _ in range(20):
            t0 = time.perf_counter()
            for _ in range(calls // 20):
                lease.checkpoint(1)
            samples.append((time.perf_counter() - t0) / (calls // 20) * 1e6)
    return dict(backend=backend, checkpoint_us=statistics.median(samples))


def gil_wakeup(switch_interval: float, wakeups: int = 300) -> dict:
    """How late a thread that sleeps 1 ms wakes while another thread runs pure Python, at a
    GIL switch interval: what a latency-critical thread meets beside a best-effort one that
    prepares its work in Python. The p50 and p99 lateness in ms (nearest rank)."""
    from .._timing import percentile
    late = []
    with _busy_thread(switch_interval):
        for _ in range(wakeups):
            due = time.perf_counter() + 1e-3
            time.sleep(1e-3)
            late.append((time.perf_counter() - due) * 1e3)
    return dict(switch_interval_s=switch_interval, late_p50_ms=percentile(late, 50), late_p99_ms=percentile(late, 99))

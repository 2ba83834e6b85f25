"""Host time of the transformer family's best-effort blur, a product at a time: the eager call,
``narrow_items`` of the batch (what ``lease.item_slices`` made of every slice), and the leased
product through ``item_slices`` (its in-flight bound may make it wait for the device: the
timing synchronizes after every second product), then the leased product and the eager call
under cProfile.

An experiment (not part of octopus-bench), CUDA only; the thirty-fourth session's run is
``results/be_host_h200_20261202_session34.txt`` (made before ``narrow_items`` of every item
returned the batch itself).

    python benchmarks/be_slice_host.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from typing import Callable, Optional, Tuple

import torch

import octopus
from octopus.bench.contention.workloads import FAMILIES


def timed(fn: Callable[[], object], n: int = 40) -> Tuple[float, float]:
    """Host ms of ``fn`` (p50, p90) over ``n`` calls after 5, synchronizing after every second."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if i % 2:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    times.sort()
    return times[len(times) // 2] * 1e3, times[int(len(times) * 0.9)] * 1e3


def profiled(fn: Callable[[], object], calls: int, rows: int) -> str:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
        torch.cuda.synchronize()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(rows)
    return out.getvalue()


def main() -> None:
    _, be = FAMILIES["transformer"](torch.device("cuda"), 1.0)
    blur = next(job for job in be if job.name == "blur")
    images = blur.batch
    assert images is not None
    print("items", len(images), "numel", images.numel())
    print("eager whole gaussian_blur (cached part) ms p50/p90", timed(lambda: blur.launch(0, blur.units)))
    print("gaussian_blur(images) direct", timed(lambda: octopus.gaussian_blur(images)))
    print("narrow_items whole", timed(lambda: images.narrow_items(0, len(images))))
    print("narrow_items half", timed(lambda: images.narrow_items(0, len(images) // 2)))
    part = images.narrow_items(0, len(images) // 2)
    print("blur of a fresh half part", timed(lambda: octopus.gaussian_blur(images.narrow_items(0, len(images) // 2))))
    sched = octopus.StreamScheduler(4, backend="cuda")

    def leased(budget: Optional[float] = None) -> int:
        with sched.acquire("blur", best_effort=True) as lease, torch.cuda.stream(lease.stream):
            slices = 0
            for items, _ in lease.item_slices(images, budget=budget):
                blur.launch(items.start, items.stop)
                slices += 1
        return slices
    print("leased whole (controller on, slices it chose)", timed(leased), leased())
    print("leased 2 ms slices", timed(lambda: leased(2e-3)), leased(2e-3))
    print(profiled(leased, 20, 25)[:6000])
    print(profiled(lambda: octopus.gaussian_blur(part), 20, 20)[:5000])


if __name__ == "__main__":
    main()

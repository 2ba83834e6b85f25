"""The benchmark's Measurer: every timed call kept, its host time beside it, and on a GPU the
caching allocator's cudaMalloc calls during the timed calls counted."""

import time

import pytest
import torch

from octopus.bench.timing import Measurer


def test_measure_keeps_every_call_and_its_host_time():
    calls = []

    def sleeper():
        calls.append(1)
        time.sleep(0.002)

    r = Measurer(torch.device("cpu")).measure(sleeper, warmup=2, repeats=5)
    assert len(calls) == 7 and len(r["times_ms"]) == 5
    assert all(t >= 2.0 for t in r["times_ms"]) and r["host_ms"] >= 2.0
    assert r["kernel_ms"] == sorted(r["times_ms"])[2]
    assert r["device_mallocs"] is None and r["alloc_retries"] is None and r["peak_mb"] is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_measure_counts_device_allocations_of_the_timed_calls():
    device = torch.device("cuda")
    measurer = Measurer(device)
    kept = []
    torch.cuda.empty_cache()  # no free cached block left from earlier tests
    # each call keeps a new 256 MiB tensor: the cache has no free block for it, so every call mallocs
    growing = measurer.measure(lambda: kept.append(torch.empty(64 << 20, device=device)), warmup=1, repeats=4)
    assert growing["device_mallocs"] >= 4 and growing["alloc_retries"] == 0
    kept.clear()
    reused = torch.empty(16 << 20, device=device)
    steady = measurer.measure(lambda: reused.mul_(2.0), warmup=1, repeats=4)
    assert steady["device_mallocs"] == 0 and steady["peak_mb"] is not None

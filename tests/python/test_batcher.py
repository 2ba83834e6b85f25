"""octopus.Batcher: requests grouped by count, elements and deadline, served by priority,
packed into a RaggedBatch (never padded), each future given its own result, exceptions
kept to the futures of the failed call, calls placed on several devices."""

import threading
import time

import pytest
import torch

import octopus
from conftest import HAS_CUDA


def simulated(max_leases=2, **kwargs):
    return octopus.StreamScheduler(max_leases, backend="simulated", **kwargs)


def doubled(batch):
    return batch.with_values(batch.values * 2)


def requests(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for n in sizes]


def test_groups_by_count_and_gives_each_request_its_result():
    calls = []

    def fn(batch):
        calls.append(len(batch))
        assert isinstance(batch, octopus.RaggedBatch)
        return doubled(batch)

    items = requests([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
    with octopus.Batcher(fn, max_batch=4, max_delay=5.0, workers=1, scheduler=simulated()) as batcher:
        futures = [batcher.submit(x) for x in items]
    assert calls == [4, 4, 2]  # two full calls as soon as the worker was free; close() ran the rest
    for x, f in zip(items, futures):
        assert torch.equal(f.result(), x * 2)
    stats = batcher.stats()
    assert stats["requests"] == 10 and stats["batches"] == 3 and stats["pending"] == 0


def test_groups_by_elements_without_padding():
    seen = []

    def fn(batch):
        seen.append([t.numel() for t in batch.unbind()])
        return doubled(batch)

    sizes = [100, 200, 300, 50, 400, 10]
    with octopus.Batcher(fn, max_batch=100, max_elements=350, max_delay=5.0, workers=1,
                         scheduler=simulated()) as batcher:
        futures = [batcher.submit(x) for x in requests(sizes)]
    assert [n for call in seen for n in call] == sizes  # in order, each request once, unpadded
    for call in seen:
        assert sum(call) <= 350 or len(call) == 1
    assert all(f.result().numel() == n for f, n in zip(futures, sizes))


def test_deadlines_decide_when_a_call_starts():
    started = []

    def fn(batch):
        started.append((time.monotonic(), len(batch)))
        return doubled(batch)

    # (The urgent request's deadline leaves a loaded host 0.45 s to start its call.)
    batcher = octopus.Batcher(fn, max_batch=100, max_delay=0.5, scheduler=simulated())
    relaxed = batcher.submit(torch.ones(4), deadline=30.0)
    time.sleep(0.6)
    assert not relaxed.done()  # its slack is far above max_delay: it waits for company
    urgent = batcher.submit(torch.ones(2), deadline=0.45)  # slack already under max_delay
    assert torch.equal(urgent.result(timeout=5), torch.full((2,), 2.0))
    assert relaxed.result(timeout=5).numel() == 4
    assert started[0][1] == 2  # both in the one call
    # Without a deadline a request waits max_delay at most.
    lone = batcher.submit(torch.ones(3))
    assert lone.result(timeout=5).numel() == 3
    batcher.close()


def test_serves_by_priority():
    gate = threading.Event()
    order = []

    def fn(batch):
        gate.wait(5)
        order.append(batch[0])
        return batch

    with octopus.Batcher(fn, max_batch=1, max_delay=0.0, workers=1, scheduler=simulated()) as batcher:
        first = batcher.submit("first")
        give_up = time.monotonic() + 5
        while batcher.stats()["pending"]:  # the first call took the one worker (and blocks)
            assert time.monotonic() < give_up
            time.sleep(0.001)
        futures = [batcher.submit(name, priority=p) for name, p in
                   [("low", "low"), ("normal", "normal"), ("high", "high"), ("soon", "normal")]]
        gate.set()
    # While the one worker was busy the requests gathered; then by priority, then arrival.
    assert order == ["first", "high", "normal", "soon", "low"]
    assert first.result() == "first"
    assert [f.result() for f in futures] == ["low", "normal", "high", "soon"]


def test_exceptions_reach_exactly_the_failed_call():
    def fn(batch):
        if any(float(t[0]) == 13 for t in batch.unbind()):
            raise ValueError("unlucky batch")
        return doubled(batch)

    values = [1.0, 2.0, 13.0, 4.0, 5.0, 6.0]
    with octopus.Batcher(fn, max_batch=2, max_delay=5.0, scheduler=simulated()) as batcher:
        futures = [batcher.submit(torch.tensor([v])) for v in values]
    for i, f in enumerate(futures):
        if i in (2, 3):
            with pytest.raises(ValueError, match="unlucky"):
                f.result()
        else:
            assert float(f.result()) == 2 * values[i]
    assert batcher.stats()["failed_batches"] == 1


@pytest.mark.parametrize("output, match", [(lambda b: 5, "RaggedBatch, a tensor"),
                                            (lambda b: [1], "1 results for a batch of 2"),
                                            (lambda b: torch.tensor(1.0), r"shape \(\)")])
def test_results_that_cannot_be_split(output, match):
    with octopus.Batcher(output, max_batch=2, max_delay=5.0, scheduler=simulated()) as batcher:
        futures = [batcher.submit(torch.ones(2)) for _ in range(2)]
    for f in futures:
        with pytest.raises((TypeError, ValueError), match=match):
            f.result()


def test_tensor_and_list_results():
    with octopus.Batcher(lambda b: torch.stack([t.sum() for t in b.unbind()]), max_batch=3, max_delay=5.0,
                         scheduler=simulated()) as batcher:
        futures = [batcher.submit(torch.full((n,), 1.0)) for n in (1, 2, 3)]
    assert [float(f.result()) for f in futures] == [1.0, 2.0, 3.0]
    with octopus.Batcher(lambda items: [s.upper() for s in items], max_batch=2, max_delay=5.0,
                         scheduler=simulated()) as batcher:
        futures = [batcher.submit(s) for s in ("a", "b", "c")]
    assert [f.result() for f in futures] == ["A", "B", "C"]


def test_calls_spread_over_several_devices():
    sched = simulated(1, simulated_devices=2)

    def fn(batch):
        time.sleep(0.2)
        return doubled(batch)

    with octopus.Batcher(fn, max_batch=1, max_delay=0.0, scheduler=sched, workers=2) as batcher:
        futures = [batcher.submit(torch.ones(2)) for _ in range(2)]
        for f in futures:
            f.result(timeout=10)
    assert [d["granted"] for d in sched.stats()["devices"]] == [1, 1]


def test_a_missed_deadline_reaches_the_calls_futures():
    sched = simulated(1)
    held = sched.acquire("batch")
    with octopus.Batcher(doubled, max_batch=1, max_delay=0.0, scheduler=sched) as batcher:
        f = batcher.submit(torch.ones(1), deadline=0.05)
        with pytest.raises(octopus.DeadlineMissed):
            f.result(timeout=10)
        held.release()


def test_bad_arguments():
    sched = simulated()
    with pytest.raises(TypeError, match="callable"):
        octopus.Batcher(5, scheduler=sched)
    with pytest.raises(ValueError, match="max_batch"):
        octopus.Batcher(doubled, max_batch=0, scheduler=sched)
    with pytest.raises(ValueError, match="max_delay"):
        octopus.Batcher(doubled, max_delay=-1, scheduler=sched)
    with pytest.raises(ValueError, match="max_elements"):
        octopus.Batcher(doubled, max_elements=0, scheduler=sched)
    with pytest.raises(TypeError, match="StreamScheduler"):
        octopus.Batcher(doubled, scheduler="cuda")
    batcher = octopus.Batcher(doubled, scheduler=sched)
    with pytest.raises(ValueError, match="priority"):
        batcher.submit(torch.ones(1), priority="urgent")
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(torch.ones(1))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_packs_on_the_lease_device_and_resolves_after_the_work():
    weight = torch.randn(64, device="cuda")

    def fn(batch):
        assert batch.device.type == "cuda" and torch.cuda.current_stream() != torch.cuda.default_stream()
        torch.cuda._sleep(5_000_000)  # the result is still being computed when fn returns
        return batch.with_values(batch.values * weight[:1])

    items = requests([10, 64, 1, 33])
    with octopus.Batcher(fn, max_batch=4, max_delay=1.0, scheduler=octopus.StreamScheduler(2)) as batcher:
        futures = [batcher.submit(x) for x in items]
        results = [f.result(timeout=30) for f in futures]
    for x, y in zip(items, results):
        assert torch.equal(y.cpu(), x * weight[:1].cpu())


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_waits_for_requests_still_being_made_on_the_submitters_stream():
    base = torch.arange(4096, device="cuda", dtype=torch.float32)
    with octopus.Batcher(doubled, max_batch=8, max_delay=0.5, scheduler=octopus.StreamScheduler(2)) as batcher:
        futures = []
        for k in range(8):
            torch.cuda._sleep(10_000_000)  # the request below is still being computed when submitted
            futures.append(batcher.submit(base * (k + 1)))
        results = [f.result(timeout=30) for f in futures]
    for k, y in enumerate(results):
        assert torch.equal(y, base * (k + 1) * 2)

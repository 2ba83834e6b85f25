"""Device yield on CUDA: octopus's ragged kernels launched on a best-effort lease's stream step
aside on the device while a latency-critical lease is held (the scheduler's gate), continue once
it is returned or their wait bound runs out (twice the recent latency-critical holds, 1 to 10 ms),
and give results bit for bit those of an ordinary launch whatever the gate did. The scheduler's
side (which leases close which word, which streams are registered, the wait bound) is tested on
the simulated backend: tests/cpp/test_yield_gate.cpp."""

import threading
import time

import pytest
import torch

import octopus
from conftest import HAS_CUDA

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")]


def big_batch(elements, dtype=torch.float32, seed=0, item_range=(20_000, 400_000), channels=None):
    """A 1-D (or [channels, n]) RaggedBatch of about `elements` random values on the GPU, in items
    of random sizes: long enough that each warp of a launch gets several blocks of work."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(*item_range, (max(1, elements // sum(item_range) * 2),), generator=g)
    offsets = torch.zeros(len(sizes) + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=offsets[1:])
    total = int(offsets[-1])
    gpu = torch.Generator(device="cuda").manual_seed(seed)
    if dtype == torch.uint8:
        values = torch.randint(0, 256, (total,), device="cuda", dtype=dtype, generator=gpu)
    else:
        values = torch.randn(total, device="cuda", generator=gpu).to(dtype)
    return octopus.RaggedBatch(values, offsets.cuda(), sizes.view(-1, 1).cuda())


def yielding(**options):
    options.setdefault("latency_control", False)
    return octopus.StreamScheduler(backend="cuda", device_yield=True, **options)


def device_stats(sched):
    return sched.stats()["devices"][0]


def timed_affine(batch, scale):
    """affine on the current stream between two timed events: (result, start, end)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = octopus.affine(batch, scale)
    end.record()
    return out, start, end


def test_best_effort_kernels_wait_on_the_device_while_a_latency_critical_lease_is_held():
    batch = big_batch(64 << 20)
    scale = torch.rand(len(batch), device="cuda")
    expected = octopus.affine(batch, scale).values
    with yielding() as sched:
        assert device_stats(sched)["yield_gate"]
        with sched.acquire("lc", priority="high"):  # a 5 ms hold: the wait bound becomes 10 ms
            time.sleep(0.005)
        lc = sched.acquire("lc", priority="high")
        with sched.acquire("train", best_effort=True) as be, torch.cuda.stream(be.stream):
            out, start, end = timed_affine(batch, scale)
        time.sleep(0.005)
        lc.release()
        end.synchronize()
        assert torch.equal(out.values, expected)
        # The kernel alone takes about 0.1 ms; it waited until the lease was returned.
        assert start.elapsed_time(end) >= 3.0
        stats = device_stats(sched)
        assert stats["gate_closes"] == 2 and stats["yielding_launches"] >= 1


def test_a_gate_held_past_the_wait_bound_only_delays_the_work():
    batch = big_batch(32 << 20)
    scale = torch.rand(len(batch), device="cuda")
    expected = octopus.affine(batch, scale).values
    with yielding() as sched:
        with sched.acquire("lc", priority="high"):
            with sched.acquire("train", best_effort=True) as be, torch.cuda.stream(be.stream):
                out, start, end = timed_affine(batch, scale)
            begin = time.monotonic()
            end.synchronize()  # the lease is still held: the wait runs out, the last link does the rest
            waited = time.monotonic() - begin
        assert torch.equal(out.values, expected)
        assert start.elapsed_time(end) >= 0.9 and waited < 0.2  # at least the 1 ms floor, far less than a pause


def test_a_device_wide_synchronize_inside_a_latency_critical_lease_waits_little_for_the_gate():
    # The holder's own torch.cuda.synchronize() waits for every stream, the waiting best-effort
    # work too, whose gate only the holder's release would open: each launch waits out its bound
    # once (at most 10 ms), not once per link.
    batch = big_batch(96 << 20)
    scale = torch.rand(len(batch), device="cuda")
    expected = octopus.affine(batch, scale).values
    with yielding() as sched:
        with sched.acquire("train", best_effort=True) as be, torch.cuda.stream(be.stream):
            outs = []
            for _ in range(3):
                with sched.acquire("lc", priority="high"):
                    outs.append(octopus.affine(batch, scale))
                    begin = time.monotonic()
                    torch.cuda.synchronize()
                    assert time.monotonic() - begin < 0.1
        assert all(torch.equal(out.values, expected) for out in outs)


def test_kernels_do_not_yield_where_the_device_does_not():
    batch = big_batch(32 << 20)
    scale = torch.rand(len(batch), device="cuda")
    with octopus.StreamScheduler(backend="cuda", latency_control=False) as sched:  # device_yield unset: off
        with sched.acquire("lc", priority="high"):
            with sched.acquire("train", best_effort=True) as be, torch.cuda.stream(be.stream):
                octopus.affine(batch, scale)
                torch.cuda.current_stream().synchronize()  # would wait out the gate if it were closed
        stats = device_stats(sched)
        assert stats["gate_closes"] == 0 and stats["yielding_launches"] == 0


OPS = {
    "affine": lambda b, n: octopus.affine(b, torch.linspace(0.5, 2.0, n, device="cuda"),
                                          torch.linspace(-1.0, 1.0, n, device="cuda")),
    "clamp": lambda b, n: octopus.clamp(b, -0.5, 0.75),
    "threshold": lambda b, n: octopus.threshold(b, torch.linspace(-1.0, 1.0, n, device="cuda")),
    "normalize": lambda b, n: octopus.normalize(b),
    "affine_block_search": lambda b, n: octopus.affine(b, torch.linspace(0.5, 2.0, n, device="cuda"),
                                                       strategy="block_search"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_results_equal_unyielded_ones_bit_for_bit_while_latency_critical_leases_come_and_go(dtype):
    batches = {"mixed": big_batch(48 << 20, dtype, seed=1),
               # items of a few dozen elements: runs of whole small items in the plan
               "dust": big_batch(24 << 20, dtype, seed=2, item_range=(0, 64))}
    expected = {(b, op): fn(batch, len(batch)).values for b, batch in batches.items() for op, fn in OPS.items()}
    torch.cuda.synchronize()
    with yielding() as sched:
        stop = threading.Event()

        def come_and_go():
            while not stop.is_set():
                with sched.acquire("lc", priority="high"):
                    time.sleep(0.0003)
                time.sleep(0.0005)

        toggler = threading.Thread(target=come_and_go)
        toggler.start()
        try:
            results = {}
            with sched.acquire("train", best_effort=True) as be, torch.cuda.stream(be.stream):
                for _ in range(3):
                    for (b, op) in expected:
                        results[(b, op)] = OPS[op](batches[b], len(batches[b])).values
                torch.cuda.current_stream().synchronize()
        finally:
            stop.set()
            toggler.join()
        for key, value in expected.items():
            assert torch.equal(results[key], value), key
        stats = device_stats(sched)
        assert stats["gate_closes"] > 0 and stats["yielding_launches"] > 0


def test_a_stencil_and_uint8_images_yield_too():
    g = torch.Generator().manual_seed(3)
    images = [torch.randint(0, 256, (3, int(h), int(w)), generator=g, dtype=torch.uint8)
              for h, w in torch.randint(200, 700, (120, 2), generator=g)]
    batch = octopus.RaggedBatch.from_tensors(images, device="cuda")
    constants = dict(mean=[120.0, 110.0, 100.0], std=[60.0, 50.0, 40.0])
    expected_blur = octopus.gaussian_blur(batch).values
    expected_norm = octopus.normalize(batch, 3, **constants).values
    with yielding() as sched:
        with sched.acquire("lc", priority="high"):  # the wait bound becomes 10 ms
            time.sleep(0.005)
        lc = sched.acquire("lc", priority="high")
        with sched.acquire("train", best_effort=True) as be, torch.cuda.stream(be.stream):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            blur = octopus.gaussian_blur(batch, block_elems=1024).values
            norm = octopus.normalize(batch, 3, block_elems=1024, **constants).values
            end.record()
        time.sleep(0.005)
        lc.release()
        end.synchronize()
        assert torch.equal(blur, expected_blur) and torch.equal(norm, expected_norm)
        assert start.elapsed_time(end) >= 3.0 and device_stats(sched)["yielding_launches"] >= 2


def test_a_graph_captured_on_a_best_effort_stream_replays_without_the_gate():
    batch = big_batch(32 << 20)
    scale = torch.rand(len(batch), device="cuda")
    expected = octopus.affine(batch, scale).values
    with yielding() as sched:
        with sched.acquire("train", best_effort=True) as be:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=be.stream):
                out = octopus.affine(batch, scale)
            launches = device_stats(sched)["yielding_launches"]
            with sched.acquire("lc", priority="high"), torch.cuda.stream(be.stream):
                graph.replay()  # a replay is not a launch of the driver: it never reads the gate
                torch.cuda.current_stream().synchronize()
        assert torch.equal(out.values, expected)
        assert launches == 0

"""octopus.replay_graph and Lease.replay_graph: a captured CUDA graph replayed without letting
go of the GIL gives what torch's replay gives (random numbers included), on the stream asked
for; bad arguments are clear errors."""

import sys
import threading
import time

import pytest
import torch

import octopus
from conftest import HAS_CUDA

needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and octopus built with CUDA")


def test_anything_but_a_graph_is_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match="graph must be a torch.cuda.CUDAGraph, got list"):
        octopus.replay_graph([])


def test_a_simulated_lease_has_no_stream_to_replay_on():
    sched = octopus.StreamScheduler(2, backend="simulated")
    try:
        with sched.acquire("net", priority="high") as lease:
            with pytest.raises(ValueError, match="simulated backend has no CUDA stream"):
                lease.replay_graph(object())
    finally:
        sched.close()


def _capture(fn):
    """A graph of ``fn`` and its output (the warm-up on a side stream, as torch asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_a_replay_equals_torchs_bit_for_bit(dtype):
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(64, 96, device="cuda", generator=g).to(dtype)
    w = torch.randn(96, 40, device="cuda", generator=g).to(dtype)
    graph, out = _capture(lambda: torch.relu(x @ w).sum(dim=1))
    for _ in range(3):
        x.copy_(torch.randn(x.shape, device="cuda", generator=g).to(dtype))
        graph.replay()
        expected = out.clone()
        out.zero_()
        octopus.replay_graph(graph)
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
        # and against an independent reference, in float64
        ref = torch.relu(x.double() @ w.double()).sum(dim=1)
        torch.testing.assert_close(out.double(), ref, rtol=2e-2 if dtype == torch.float16 else 1e-4, atol=1e-2)


@pytest.mark.cuda
@needs_cuda
def test_random_numbers_advance_as_torchs_replay_advances_them():
    graph, out = _capture(lambda: torch.rand(4096, device="cuda"))
    torch.cuda.manual_seed(11)
    graph.replay()
    a = out.clone()
    graph.replay()
    b = out.clone()
    torch.cuda.manual_seed(11)
    octopus.replay_graph(graph)
    c = out.clone()
    octopus.replay_graph(graph)
    d = out.clone()
    assert not torch.equal(a, b)
    assert torch.equal(a, c) and torch.equal(b, d)


@pytest.mark.cuda
@needs_cuda
def test_it_runs_on_the_stream_given_and_a_lease_replays_on_its_own():
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    graph, out = _capture(lambda: x * 2)

    def replayed_behind_a_sleep(stream, replay):
        """Keeps ``stream`` busy, replays, and checks that the graph waits behind the sleep
        (so it was queued on ``stream``), then that it ran."""
        out.zero_()
        # (count_nonzero's first call loads its kernels, which waits for the device: made here)
        assert int(out.count_nonzero()) == 0
        with torch.cuda.stream(stream):
            torch.cuda._sleep(200_000_000)  # about 0.1 s: far longer than the checks below
        replay()
        torch.cuda.current_stream().synchronize()
        assert not stream.query() and int(out.count_nonzero()) == 0
        stream.synchronize()
        assert torch.equal(out, x * 2)

    side = torch.cuda.Stream()
    replayed_behind_a_sleep(side, lambda: octopus.replay_graph(graph, side))
    sched = octopus.StreamScheduler(2)
    try:
        with sched.acquire("net", priority="high") as lease:
            replayed_behind_a_sleep(lease.stream, lambda: lease.replay_graph(graph))
    finally:
        sched.close()


@pytest.mark.cuda
@needs_cuda
def test_no_other_thread_runs_while_it_replays():
    """A thread that wants the GIL gets it whenever the caller lets go of it (no switch is
    forced: a 100 s switch interval): during torch's replays it does, during replay_graph's
    never (once its first call has imported its module: the import's file reads let go)."""
    graph, _ = _capture(lambda: torch.ones(1 << 16, device="cuda") * 2)
    stream = torch.cuda.Stream()
    octopus.replay_graph(graph)
    octopus.replay_graph(graph, stream)
    torch.cuda.synchronize()
    count, stop = [0], threading.Event()

    def other():
        while not stop.is_set():
            count[0] += 1
            time.sleep(1e-4)  # lets the caller have the GIL, then waits for it back

    def runs_of_other_during(replay, times):
        start = count[0]
        for _ in range(times):
            replay()
        return count[0] - start

    before = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    try:
        time.sleep(0.01)
        assert runs_of_other_during(graph.replay, 500) > 0  # the check sees a replay that lets go
        time.sleep(0.01)
        assert runs_of_other_during(lambda: octopus.replay_graph(graph), 500) == 0
        assert runs_of_other_during(lambda: octopus.replay_graph(graph, stream), 500) == 0
    finally:
        stop.set()
        sys.setswitchinterval(before)
        thread.join()
        torch.cuda.synchronize()


@pytest.mark.cuda
@needs_cuda
def test_bad_streams_and_uncaptured_graphs_are_clear_errors():
    graph, _ = _capture(lambda: torch.ones(8, device="cuda") + 1)
    with pytest.raises(TypeError, match="stream must be a torch.cuda.Stream or None, got int"):
        octopus.replay_graph(graph, 0)
    with pytest.raises(RuntimeError, match="(?i)capture"):
        octopus.replay_graph(torch.cuda.CUDAGraph())

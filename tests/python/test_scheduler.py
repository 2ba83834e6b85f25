"""octopus.StreamScheduler: leases, limits, priority and FIFO order, timeouts, the executor
(map / submit), counters and the trace. The policy runs on the simulated backend (no GPU);
the stream behaviour runs on CUDA."""

import gc
import json
import random
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import octopus
from conftest import HAS_CUDA

def simulated(max_leases=2, **kwargs):
    return octopus.StreamScheduler(max_leases, backend="simulated", **kwargs)


def wait_until_waiting(sched, n, limit=5.0):
    give_up = time.monotonic() + limit
    while sched.stats()["waiting"] < n:
        assert time.monotonic() < give_up, "callers never started waiting"
        time.sleep(0.001)


def test_lease_is_a_context_manager():
    sched = simulated(2)
    with sched.acquire("resize", (3, 224, 224), priority="high") as lease:
        assert lease.active and lease.kind == "resize" and lease.priority == 1
        assert lease.stream is None and lease.device_index == 0
        assert sched.stats()["active"] == 1
    assert not lease.active
    assert lease.release_event is not None and lease.release_event.done()
    stats = sched.stats()
    assert stats["granted"] == stats["released"] == 1 and stats["active"] == 0


def test_a_scheduler_dropped_without_close_is_freed_at_once():
    # Nothing may keep a scheduler in a reference cycle: one dropped without close() would
    # keep its control thread and its lowered GIL switch interval until the cyclic GC runs
    # (which the contention benchmark turns off while it measures).
    import gc
    import sys
    import weakref

    gc.collect()  # schedulers of earlier tests that nobody closed give the interval back first
    interval = sys.getswitchinterval()
    gc.disable()
    try:
        sched = simulated(2)
        assert sys.getswitchinterval() < interval
        with sched.acquire("x"):
            pass
        assert sched.submit(lambda: 3).result() == 3 and sched.map(abs, [-1, 2]) == [1, 2]  # the executor too
        ref = weakref.ref(sched)
        del sched
        # (An executor thread drops its finished work item, which holds the scheduler, just after
        # setting its result: a moment later, never with gc off if a cycle held it.)
        deadline = time.monotonic() + 2
        while ref() is not None and time.monotonic() < deadline:
            time.sleep(1e-3)
        assert ref() is None
        assert sys.getswitchinterval() == interval
    finally:
        gc.enable()


def test_try_acquire_when_full_returns_none():
    sched = simulated(2)
    a, b = sched.acquire(), sched.acquire()
    assert sched.try_acquire() is None
    a.release()
    c = sched.try_acquire()
    assert c is not None
    b.release(), c.release()
    assert sched.stats()["rejected"] == 1


@pytest.mark.parametrize("timeout", [0.05, 0.2])
def test_timeout_raises_once_the_timeout_has_passed(timeout):
    sched = simulated(1)
    held = sched.acquire()
    start = time.monotonic()
    with pytest.raises(octopus.LeaseTimeout, match="lease limit") as info:
        sched.acquire("crop", timeout=timeout)
    waited = time.monotonic() - start
    # Never early; the upper bound leaves room for a loaded machine (a thread may wait for a core
    # for a good fraction of a second) and still catches a timeout ignored or read in other units.
    assert timeout <= waited < timeout + 2.0
    assert isinstance(info.value, TimeoutError)
    held.release()
    assert sched.stats()["timeouts"] == 1


def test_default_timeout_comes_from_the_scheduler():
    sched = simulated(1, timeout=0.05)
    with sched.acquire():
        with pytest.raises(octopus.LeaseTimeout):
            sched.acquire()
        with pytest.raises(octopus.LeaseTimeout):
            sched.acquire(timeout=0.0)


def test_priority_then_fifo_order():
    sched = simulated(1)
    held = sched.acquire()
    priorities = ["normal", "high", "normal", 5, "high", "low", "normal"]
    order, lock = [], threading.Lock()

    def worker(i):
        with sched.acquire(priority=priorities[i]):
            with lock:
                order.append(i)

    threads = []
    for i in range(len(priorities)):
        threads.append(threading.Thread(target=worker, args=(i,)))
        threads[-1].start()
        wait_until_waiting(sched, i + 1)
    held.release()
    for t in threads:
        t.join()
    assert order == [3, 1, 4, 0, 2, 6, 5]


def test_a_kind_and_a_priority_alone_get_the_lease_the_full_call_gets():
    # acquire's common call (a kind and a priority) skips the argument parsing.
    sched = simulated(4)
    for priority in ("low", "normal", "high"):
        with sched.acquire("k", priority=priority) as short, \
                sched.acquire("k", [], priority=priority, timeout=5.0) as full:
            assert (short.kind, short.priority, short.work_class) == (full.kind, full.priority, full.work_class)
    with sched.acquire("k", priority="high") as high, sched.acquire("k", priority="low") as low:
        assert (high.priority, high.work_class) == (1, "high")
        assert (low.priority, low.work_class) == (-1, "best_effort")
    with pytest.raises(ValueError, match="priority"):
        sched.acquire("k", priority="urgent")


@pytest.mark.parametrize("common_call", [False, True], ids=["full_call", "common_call"])
def test_the_gil_is_released_while_waiting(common_call):
    # The common call (a kind and a priority) has a binding of its own; it waits as the full one.
    sched = simulated(1, timeout=30.0)
    held = sched.acquire()
    waiter = threading.Thread(target=lambda: (sched.acquire("k") if common_call else
                                              sched.acquire("k", timeout=30.0)).release())
    waiter.start()
    wait_until_waiting(sched, 1)
    # This thread runs Python while the other is blocked in acquire (were the GIL held, it would
    # only run again once the waiter had timed out, and find nobody waiting).
    spins = 0
    while spins < 10_000 and sched.stats()["waiting"] == 1:
        spins += 1
    held.release()
    waiter.join()
    assert spins == 10_000


def test_a_lease_granted_at_once_keeps_the_gil():
    # Giving the GIL up for an acquire that does not wait let any thread running Python take it,
    # and the caller (latency-critical work, say) waited for it back up to the switch interval.
    # Here a thread spins in Python; with a switch interval of 1 s it runs only where this
    # thread gives the GIL up.
    sched = simulated(2)
    spins, stop, started = [0], threading.Event(), threading.Event()

    def spin():
        started.set()
        while not stop.is_set():
            spins[0] += 1

    interval = sys.getswitchinterval()
    spinner = threading.Thread(target=spin)
    sys.setswitchinterval(1.0)
    try:
        spinner.start()
        started.wait()
        time.sleep(0.01)  # (a sleep gives the GIL up: the spinner runs, then hands it back after 1 s)
        before = spins[0]
        for _ in range(5):
            with sched.acquire("lc", priority="high"):
                pass
            with sched.try_acquire("lc", priority="high"):
                pass
        after = spins[0]
        stop.set()
    finally:
        sys.setswitchinterval(interval)
        spinner.join()
    assert after == before, f"the spinner ran {after - before} times during 10 uncontended acquires"


@pytest.mark.filterwarnings("ignore:octopus.StreamScheduler:RuntimeWarning")  # the 0.05-ms target's report
def test_stress_64_threads_no_deadlock_no_leak_no_lost_work():
    """Every class, deadlines and best-effort checkpoints (throttled by the high leases), with
    latency targets set: the controller moves best-effort work between steps throughout."""
    sched = simulated(4, simulated_devices=2, best_effort_max_pause=0.002)
    sched.set_target("a", p99_ms=0.05)  # tighter than the simulated holds: it climbs
    sched.set_target("b", ratio=1.5)
    per_thread = 1000
    results = [[] for _ in range(64)]
    held = [0, 0]
    over_limit, planned = [], []
    lock = threading.Lock()

    class Planned(Exception):
        pass

    def worker(t):
        rng = random.Random(t)
        for i in range(per_thread):
            fail = rng.random() < 0.05
            try:
                with sched.acquire(rng.choice(["a", "b"]), priority=rng.choice(["low", "normal", "high"]),
                                   timeout=rng.choice([None, 1.0, 0.0005]), device=rng.choice([None, 0, 1]),
                                   deadline=rng.choice([None, None, 0.0, 0.002, 5.0]),
                                   best_effort=rng.random() < 0.1) as lease:
                    with lock:
                        held[lease.device_index] += 1
                        if held[lease.device_index] > 4:
                            over_limit.append(held[lease.device_index])
                    try:
                        for _ in range(rng.randrange(3)):
                            lease.checkpoint(1)
                        if fail:
                            planned.append(t)
                            raise Planned()
                        results[t].append(i)
                    finally:
                        with lock:
                            held[lease.device_index] -= 1
            except (octopus.LeaseTimeout, Planned):  # DeadlineMissed is a LeaseTimeout
                results[t].append(-1)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "deadlock: a worker never finished"
    stats = sched.stats()
    classes = stats["classes"].values()
    assert not over_limit
    assert stats["active"] == 0 and stats["waiting"] == 0
    assert stats["granted"] == stats["released"]
    assert sum(c["granted"] for c in classes) == stats["granted"]
    assert sum(c["released"] for c in classes) == stats["released"]
    missed = sum(c["deadline_rejected"] + c["deadline_expired"] for c in classes)
    assert stats["granted"] + stats["timeouts"] + missed == 64 * per_thread
    done = sum(1 for r in results for x in r if x >= 0)
    assert stats["granted"] == done + len(planned)  # every granted lease ran its work
    for r in results:  # every item either done, in order, or accounted for as a failure
        assert len(r) == per_thread
        assert [x for x in r if x >= 0] == sorted(x for x in r if x >= 0)
    assert all(d["active_leases"] == d["best_effort_leases"] == d["latency_critical_leases"] == 0
               and d["peak_leases"] <= 4 for d in stats["devices"])
    controls = [d["control"] for d in stats["devices"]]
    assert any(c["climbs"] >= 1 for c in controls), "the targets moved the controllers"


def test_map_returns_results_in_order():
    with simulated(3) as sched:
        assert sched.map(lambda x: x * x, range(100)) == [x * x for x in range(100)]
        assert sched.map(lambda x: x, []) == []
        assert sched.stats()["active"] == 0


def test_map_reraises_the_first_failure_after_every_lease_is_back():
    sched = simulated(2)

    def fn(x):
        time.sleep(0.001)
        if x in (7, 30):
            raise ValueError(f"bad item {x}")
        return x

    with pytest.raises(ValueError, match="bad item 7"):
        sched.map(fn, range(60))
    stats = sched.stats()
    assert stats["active"] == 0 and stats["granted"] == stats["released"]
    assert stats["granted"] < 60  # the items after the failure were skipped
    sched.close()


def test_submit_returns_a_future():
    with simulated(2) as sched:
        futures = [sched.submit(pow, 2, i) for i in range(10)]
        assert [f.result() for f in futures] == [2 ** i for i in range(10)]
        f = sched.submit(sorted, [3, 1, 2], reverse=True, acquire_options={"kind": "sort", "priority": "high"})
        assert f.result() == [3, 2, 1]


def test_trace_is_chrome_trace_json(tmp_path):
    sched = simulated(1, record_timeline=True)
    held = sched.acquire("first")
    with pytest.raises(octopus.LeaseTimeout):
        sched.acquire("late", timeout=0.01)
    held.release()
    with sched.acquire("second"):
        pass
    path = tmp_path / "trace.json"
    sched.dump_trace(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    leases = [e for e in events if e.get("cat") == "lease"]
    assert [e["name"] for e in leases] == ["first", "second"]
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in leases)
    assert [e["name"] for e in events if e.get("cat") == "timeout"] == ["late"]


def test_occupancy_estimates():
    sched = simulated(8, max_occupancy=1.0)
    sched.register_kind("half", 0.5)
    a = sched.acquire("half")
    b = sched.acquire("half")
    assert a.occupancy == 0.5 and sched.try_acquire("half") is None
    with pytest.raises(octopus.LeaseTimeout, match="occupancy limit"):
        sched.acquire("half", timeout=0.01)
    a.release(), b.release()
    sched.register_kernel("tiles", blocks_per_sm=4, elements_per_block=1000)
    assert sched.estimate_occupancy("tiles", (132 * 2, 1000)) == pytest.approx(0.5)


def test_memory_reserve_on_the_simulation():
    sched = simulated(4, memory_reserve=0.5, memory_poll_interval=0.001)
    sched.simulated_backend.set_free_memory(0, 1 << 30)
    time.sleep(0.005)
    with pytest.raises(octopus.LeaseTimeout, match="free-memory reserve"):
        sched.acquire(timeout=0.02)


@pytest.mark.parametrize("kwargs, match", [
    (dict(priority="urgent"), "priority"),
    (dict(priority=True), "priority"),
    (dict(timeout=-1.0), "timeout"),
    (dict(timeout=float("nan")), "timeout"),
    (dict(device=3), "device 3"),
    (dict(device=-2), "device"),
    (dict(device="cpu"), "CUDA device"),
    (dict(bytes=-5), "bytes"),
    (dict(shape=(2, -3)), "negative"),
    (dict(shape="abc"), "shape"),
])
def test_bad_acquire_arguments(kwargs, match):
    sched = simulated(2)
    with pytest.raises((ValueError, TypeError), match=match):
        sched.acquire(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_leases_per_device=0), "max_leases_per_device"),
    (dict(max_occupancy=0.0), "max_occupancy"),
    (dict(memory_reserve=1.5), "memory_reserve"),
    (dict(devices=[0, 4]), "devices"),
    (dict(simulated_devices=0), "simulated_devices"),
    (dict(timeout=-3), "timeout"),
])
def test_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        octopus.StreamScheduler(**{"backend": "simulated", **kwargs})


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        octopus.StreamScheduler(backend="tpu")


@pytest.mark.skipif(HAS_CUDA, reason="checks the message on machines without CUDA")
def test_cuda_backend_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match="simulated"):
        octopus.StreamScheduler()


# -- CUDA ---------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
@pytest.mark.parametrize("priority", ["normal", "high"])
def test_lease_stream_is_a_torch_stream(priority):
    sched = octopus.StreamScheduler(2)
    with sched.acquire("x", priority=priority) as lease:
        assert isinstance(lease.stream, torch.cuda.Stream)
        assert lease.device == torch.device("cuda", 0)
        assert lease.stream != torch.cuda.current_stream()
        with torch.cuda.stream(lease.stream):
            assert torch.cuda.current_stream() == lease.stream
            y = torch.arange(10, device="cuda", dtype=torch.float32) * 2
        lease.stream.synchronize()
    assert torch.equal(y.cpu(), torch.arange(10, dtype=torch.float32) * 2)
    # The release event is recorded at release, after the synchronize above: wait for it.
    lease.release_event.synchronize()
    assert lease.release_event.done()
    high, normal = sched.acquire(priority="high"), sched.acquire()
    assert high.stream.priority < normal.stream.priority
    high.release(), normal.release()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_a_scheduler_made_after_another_ended_takes_its_streams_again():
    # Streams are never destroyed (work and record_stream events may outlive a scheduler);
    # a scheduler's go back when it and its last lease are gone, and the next one takes them
    # (in the order it made them, where no other scheduler took some in between). The pool is
    # the process's: in a process of its own, so that no earlier test's streams are in it.
    script = textwrap.dedent("""
        import gc
        import torch
        import octopus

        def pool_streams(sched):
            leases = [sched.acquire(priority=p) for p in ("high", "high", "normal", "normal")]
            streams = {lease.stream.cuda_stream for lease in leases}
            for lease in leases:
                lease.release()
            return streams

        for latency_control in (False, True):
            first = octopus.StreamScheduler(4, latency_control=latency_control)
            streams = pool_streams(first)
            assert len(streams) == 4
            del first
            gc.collect()
            second = octopus.StreamScheduler(4, latency_control=latency_control)
            again = pool_streams(second)
            if latency_control:  # the device clock's stream, given back first, went to a slot
                assert len(again & streams) >= 2, (again, streams)
            else:
                assert again == streams, (again, streams)
            with second.acquire(priority="high") as lease, torch.cuda.stream(lease.stream):
                y = torch.arange(10, device="cuda", dtype=torch.float32) * 3
            torch.cuda.current_stream().wait_stream(lease.stream)
            assert torch.equal(y.cpu(), torch.arange(10, dtype=torch.float32) * 3)
            del second
            gc.collect()
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stdout + result.stderr


def _sleep_time(cycles):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1000


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_leases_on_different_streams_overlap():
    sched = octopus.StreamScheduler(2)
    _sleep_time(1000)
    cycles = 50_000_000
    single = _sleep_time(cycles)
    torch.cuda.synchronize()
    start = time.perf_counter()
    a, b = sched.acquire(), sched.acquire()
    with torch.cuda.stream(a.stream):
        torch.cuda._sleep(cycles)
    with torch.cuda.stream(b.stream):
        torch.cuda._sleep(cycles)
    a.release().synchronize()
    b.release().synchronize()
    both = time.perf_counter() - start
    assert both < 1.5 * single, f"two leases took {both:.4f} s, one sleep alone {single:.4f} s"


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_map_equals_sequential_bit_for_bit():
    g = torch.Generator(device="cuda").manual_seed(0)
    items = [torch.randn(n, 256, device="cuda", generator=g) for n in (1, 64, 300, 1024, 5)]
    weight = torch.randn(256, 256, device="cuda", generator=g)

    def fn(x):
        return torch.cumsum(torch.sin(x @ weight), dim=0).sum(dim=1)

    sequential = [fn(x) for x in items]
    with octopus.StreamScheduler(4) as sched:
        mapped = sched.map(fn, items * 8)
    for i, y in enumerate(mapped):
        assert torch.equal(y, sequential[i % len(items)])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_map_orders_streams_both_ways():
    n = 1 << 20
    x = torch.zeros(n, device="cuda")
    torch.cuda._sleep(20_000_000)  # the fill below is still queued when map starts
    x.fill_(3.0)

    def fn(i):
        torch.cuda._sleep(5_000_000)  # the result is still being computed when fn returns
        return x.sum() * i

    with octopus.StreamScheduler(4) as sched:
        out = sched.map(fn, range(16))
        # Used at once on the caller's stream, with no synchronization.
        total = torch.stack(out)
    assert torch.equal(total.cpu(), torch.arange(16, dtype=torch.float32) * 3.0 * n)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_octopus_kernels_have_occupancy_estimates_and_memory_is_sampled():
    sched = octopus.StreamScheduler(4, memory_reserve=0.01)
    big = sched.estimate_occupancy("octopus.affine", (1 << 30,))
    small = sched.estimate_occupancy("octopus.affine", (4096,))
    assert big == 1.0 and 0 < small < 0.01
    with sched.acquire("octopus.affine", (1 << 20,)) as lease:
        assert 0 < lease.occupancy < 1
        stats = sched.stats()["devices"][0]
        assert stats["total_bytes"] > 0 and 0 < stats["free_bytes"] <= stats["total_bytes"]

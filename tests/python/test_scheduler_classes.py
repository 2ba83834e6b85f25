"""octopus.StreamScheduler's classes of work: earliest-deadline-first order, infeasible
deadlines (rejected or promoted), best-effort throttling and the in-flight bound at
checkpoints, slicing (counts and ragged item ranges, from a size or a latency budget),
adaptive concurrency, SM partitions, statistics and the trace. The policy runs on the
simulated backend; what the GPU must show runs on CUDA."""

import json
import threading
import time

import pytest
import torch

import octopus
from conftest import HAS_CUDA, random_batch
from octopus.scheduling.slicing import SliceSizer

cuda_only = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")]
BACKENDS = ["simulated", pytest.param("cuda", marks=cuda_only)]


def simulated(max_leases=2, **kwargs):
    return octopus.StreamScheduler(max_leases, backend="simulated", **kwargs)


def eventually(condition, what, limit=5.0):
    give_up = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < give_up, f"never happened: {what}"
        time.sleep(0.001)


def teach_hold(sched, kind, seconds, n=3):
    """Holds n leases of `kind` for at least `seconds` each: the kind's typical hold."""
    for _ in range(n):
        with sched.acquire(kind):
            time.sleep(seconds)


def test_classes_of_work():
    sched = simulated(4)
    for options, expected in [(dict(priority="high"), "high"), (dict(priority=3), "high"), (dict(), "normal"),
                              (dict(priority="low"), "best_effort"), (dict(priority=-2), "best_effort"),
                              (dict(priority="high", best_effort=True), "best_effort")]:
        with sched.acquire(**options) as lease:
            assert lease.work_class == expected, options
            assert not lease.promoted
    assert issubclass(octopus.DeadlineMissed, octopus.LeaseTimeout)
    assert issubclass(octopus.DeadlineMissed, TimeoutError)
    assert set(sched.stats()["classes"]) == {"high", "normal", "best_effort"}


def test_earliest_deadline_first_within_a_priority():
    sched = simulated(1)
    held = sched.acquire("k")
    # Far deadlines (never missed) of kinds never seen (no estimate: all feasible).
    requests = [("a", "normal", 50.0), ("b", "normal", 20.0), ("c", "normal", None), ("d", "normal", 30.0),
                ("e", "high", 90.0), ("f", "normal", 20.0), ("g", "low", 10.0), ("h", "high", None)]
    order, lock = [], threading.Lock()

    def worker(kind, priority, deadline):
        with sched.acquire(kind, priority=priority, deadline=deadline):
            with lock:
                order.append(kind)

    threads = []
    for i, r in enumerate(requests):
        threads.append(threading.Thread(target=worker, args=r))
        threads[-1].start()
        eventually(lambda: sched.stats()["waiting"] == i + 1, "waiting")
    held.release()
    for t in threads:
        t.join()
    assert order == ["e", "h", "b", "f", "d", "a", "c", "g"]


def test_infeasible_deadline_is_rejected_at_once():
    sched = simulated(2)
    teach_hold(sched, "slow", 0.03)
    start = time.monotonic()
    with pytest.raises(octopus.DeadlineMissed, match="cannot meet its deadline.*'slow'"):
        sched.acquire("slow", deadline=0.005)
    assert time.monotonic() - start < 1.0
    with pytest.raises(octopus.DeadlineMissed):
        sched.try_acquire("slow", deadline=0.005)
    with sched.acquire("slow", deadline=10.0) as lease:
        assert lease.work_class == "normal"
    stats = sched.stats()
    assert stats["classes"]["normal"]["deadline_rejected"] == 2 and stats["deadline_misses"] == 2


def test_infeasible_deadline_is_promoted_when_asked_to():
    sched = simulated(2, infeasible_deadline="promote")
    teach_hold(sched, "slow", 0.03)
    with sched.acquire("slow", deadline=0.005) as lease:
        assert lease.promoted and lease.work_class == "high" and lease.priority >= 1
    assert sched.stats()["classes"]["normal"]["deadline_promoted"] == 1


def test_deadline_passing_while_waiting_and_late_returns():
    sched = simulated(1)
    held = sched.acquire("k")
    start = time.monotonic()
    with pytest.raises(octopus.DeadlineMissed, match="missed its deadline.*lease limit"):
        sched.acquire("fresh", deadline=0.05, timeout=10.0)
    assert 0.05 <= time.monotonic() - start < 2.0
    held.release()
    with sched.acquire("fresh2", priority="high", deadline=0.01):
        time.sleep(0.03)
    classes = sched.stats()["classes"]
    assert classes["normal"]["deadline_expired"] == 1 and classes["high"]["deadline_late"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_throttled_best_effort_holder_stops_launching(backend):
    sched = octopus.StreamScheduler(4, backend=backend, best_effort_max_pause=None, latency_control=False)
    background = sched.acquire("background", best_effort=True)
    x = torch.zeros(1, device="cuda") if backend == "cuda" else None
    launched, stop = [0], threading.Event()

    def work():
        while not stop.is_set():
            background.checkpoint(1)
            if x is not None:
                with torch.cuda.stream(background.stream):
                    x.add_(1)
            launched[0] += 1

    worker = threading.Thread(target=work)
    worker.start()
    eventually(lambda: launched[0] > 50, "slices run")
    urgent = sched.acquire("urgent", priority="high")
    # At most the slice already past its checkpoint at the grant launches, however slowly
    # this machine runs the worker; unthrottled it would launch hundreds.
    at_grant = launched[0]
    time.sleep(0.3)
    assert launched[0] <= at_grant + 1, "a throttled best-effort holder launched more work"
    paused_at = launched[0]
    urgent.release()
    eventually(lambda: launched[0] > paused_at + 50, "slices resume")
    stop.set()
    worker.join()
    background.release()
    if x is not None:
        background.release_event.synchronize()
        assert x.item() == launched[0]  # every launch ran
    best_effort = sched.stats()["classes"]["best_effort"]
    assert best_effort["pauses"] >= 1 and best_effort["throttled_s"] > 0


def test_a_holder_that_never_calls_checkpoint_is_not_throttled():
    sched = simulated(4)
    background = sched.acquire(best_effort=True)
    done, stop = [0], threading.Event()

    def work():  # best-effort work with no checkpoint
        while not stop.is_set():
            done[0] += 1
            time.sleep(0.0005)

    worker = threading.Thread(target=work)
    worker.start()
    with sched.acquire(priority="high"):
        before = done[0]
        eventually(lambda: done[0] > before + 20, "work goes on under the latency-critical lease")
    stop.set()
    worker.join()
    background.release()
    assert sched.stats()["classes"]["best_effort"]["pauses"] == 0


@pytest.mark.parametrize("in_flight", [1, 2])
def test_in_flight_slices_are_bounded(in_flight):
    sched = simulated(4, best_effort_in_flight=in_flight)
    device = sched.simulated_backend
    device.set_manual_events(True)
    background = sched.acquire(best_effort=True)
    launched, stop = [0], threading.Event()

    def work():
        while not stop.is_set():
            background.checkpoint(1)
            launched[0] += 1

    worker = threading.Thread(target=work)
    worker.start()
    # An event after the work before the lease, then one before and one after each slice.
    eventually(lambda: launched[0] == in_flight - 1 and device.pending_events(0) == 2 * in_flight - 1,
               "the window fills")
    time.sleep(0.03)
    assert launched[0] == in_flight - 1
    for done in range(1, 4):
        device.complete_events(0, 1 if done == 1 else 2)  # the oldest slice finished
        eventually(lambda: launched[0] == in_flight - 1 + done, "one more slice")
        assert device.pending_events(0) <= 2 * in_flight
    stop.set()
    device.set_manual_events(False)
    worker.join()
    background.release()


def test_slices_of_a_count():
    sched = simulated(2, latency_control=False)
    with sched.acquire("rows", best_effort=True) as lease:
        assert list(lease.slices(10, 3)) == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]
        assert list(lease.slices(5)) == [slice(0, 5)]  # no size, no budget, no controller: all at once
        assert list(lease.slices(0, 4)) == []
        with pytest.raises(ValueError, match="size"):
            list(lease.slices(10, 0))
        with pytest.raises(ValueError, match="not both"):
            list(lease.slices(10, 2, budget=0.1))
        with pytest.raises(ValueError, match="total"):
            list(lease.slices(-1, 2))
        with pytest.raises(ValueError, match="budget"):
            list(lease.slices(10, budget=0.0))
    # From a latency budget and the kind's time per unit (set: the slices above, measured at
    # the next checkpoint, do not move it).
    sched.set_seconds_per_unit("rows", 1e-3)
    assert sched.seconds_per_unit("rows") == pytest.approx(1e-3)
    with sched.acquire("rows", best_effort=True) as lease:
        assert list(lease.slices(25, budget=0.0101)) == [slice(0, 10), slice(10, 20), slice(20, 25)]
    # Nothing measured yet: probes from 1/64 of the work, each twice the one before (the
    # first slice is measured once two more are in flight).
    with sched.acquire("unmeasured", best_effort=True) as lease:
        assert [(s.start, s.stop) for s in lease.slices(6400, budget=0.01)][:3] == [(0, 100), (100, 300), (300, 700)]


def test_slice_sizes_from_a_moving_measurement_repeat():
    # A GEMM's first launch at a new row count cost up to 3.6 ms of host time (cuBLAS picks its
    # kernel per shape); sized straight from a time per unit that moves by up to 10%, 1000
    # slices would ask for hundreds of counts. On the grid, a few sizes serve them all.
    g = torch.Generator().manual_seed(0)
    rates = (2e-7 * (1 + 0.1 * torch.rand(1000, generator=g))).tolist()  # 2.0e-7 to 2.2e-7 s per row
    it = iter(rates)
    sizer = SliceSizer(None, 1e-3, lambda: next(it), 10**9)
    sizes = [sizer.next() for _ in rates]
    assert len({int(1e-3 / r) for r in rates}) > 300  # what each measurement alone would ask
    assert len(set(sizes)) <= 2 and all(4000 <= s <= 1e-3 / r for s, r in zip(sizes, rates)), sorted(set(sizes))


@pytest.mark.parametrize("host_ms,device_us_per_unit", [(0.5, 0.01), (3.0, 1.0), (0.05, 0.001)])
def test_slice_sizes_do_not_collapse_where_the_host_is_slow(host_ms, device_us_per_unit):
    # Where the stream idles between slices, a slice's measured device time includes its
    # launch: (host + rate * units) / units per unit. Sized to a budget shorter than the host's
    # time alone, each slice came out shorter than the one before, down to one unit (the work
    # crawled). Kept at twice the host's time per slice, they settle where the device time of a
    # slice is at least the host's.
    host, rate, budget = host_ms * 1e-3, device_us_per_unit * 1e-6, 0.1e-3
    for floor in (True, False):
        measured = [rate]
        host_seconds = (lambda: host) if floor else (lambda: None)
        sizer = SliceSizer(None, budget, lambda: min(measured[-32:]), 10**12, host_seconds)
        sizes = []
        for _ in range(300):
            units = sizer.next()
            sizes.append(units)
            measured.append((host + rate * units) / units)
        if floor:
            assert rate * min(sizes[-100:]) >= host * 0.99, sizes[-5:]  # a slice's device time >= the host's
            assert min(sizes[-100:]) >= 0.99 * max(sizes[-100:]), sizes[-5:]  # settled
        elif host > budget:
            assert sizes[-1] == 1  # what it did before
    sizes = []
    sched = simulated(2, latency_control=False, best_effort_in_flight=1)
    with sched.acquire("slow host", best_effort=True) as lease:
        for rows in lease.slices(10**12, budget=1e-4):
            sizes.append(rows.stop - rows.start)
            time.sleep(2e-3)
            if len(sizes) == 8:
                break
    measured_host = sched.host_seconds_per_slice("slow host")
    assert measured_host is not None and 1.5e-3 <= measured_host < 1.0
    assert min(sizes) >= sizes[0], sizes  # probes from 1/64 of the work, then none shorter
    assert sched.host_seconds_per_slice("never sliced") is None


def test_slices_as_long_as_the_whole_work_are_measured():
    # One slice a lease: measured once it has finished, at a later checkpoint (before, the
    # slice's end was never marked: a host time per slice that had raised slices to the whole
    # work was never measured again, nor the time per unit).
    sched = simulated(2, latency_control=False, best_effort_in_flight=1)
    for _ in range(3):
        with sched.acquire("whole", best_effort=True) as lease:
            for rows in lease.slices(100, 100):
                time.sleep(2e-3)
            time.sleep(0.1)  # after the slices' loop: not the slice's host time
    rate, host = sched.seconds_per_unit("whole"), sched.host_seconds_per_slice("whole")
    assert rate is not None and rate >= 1.5e-3 / 100
    assert host is not None and 1.5e-3 <= host < 50e-3
    batch = random_batch([(50,), (50,)], "cpu")
    with sched.acquire("whole batch", best_effort=True) as lease:
        for items, part in lease.item_slices(batch):
            time.sleep(2e-3)
        time.sleep(0.1)
    with sched.acquire("other", best_effort=True) as lease:
        lease.checkpoint(1)
    host = sched.host_seconds_per_slice("whole batch")
    assert host is not None and 1.5e-3 <= host < 50e-3
    # A holder's own checkpoints: end_slice ends the last slice; one still open at the
    # release is not measured (its holder may not have queued its work).
    for kind, ended in (("ended", True), ("released", False)):
        with sched.acquire(kind, best_effort=True) as lease:
            lease.checkpoint(10)
            time.sleep(2e-3)
            if ended:
                lease.end_slice()
            time.sleep(0.1)
        lease.end_slice()  # returned: nothing
    with sched.acquire("other", best_effort=True) as lease:
        lease.checkpoint(1)
    host = sched.host_seconds_per_slice("ended")
    assert host is not None and 1.5e-3 <= host < 50e-3
    assert sched.seconds_per_unit("released") is None


def test_without_a_size_slices_follow_the_latency_controller():
    sched = simulated(2)
    budget = sched.slice_budget()
    assert budget is not None and budget > 0  # the bottom step's slice length
    sched.set_seconds_per_unit("rows", budget / 40)
    with sched.acquire("rows", best_effort=True) as lease:
        parts = list(lease.slices(100))
    assert parts == [slice(0, 40), slice(40, 80), slice(80, 100)]
    assert sched.stats()["devices"][0]["control"]["step"] == 0
    assert simulated(2, latency_control=False).slice_budget() is None

def test_item_slices_are_bounded_views():
    sizes = [(5,), (0,), (7,), (30,), (2,), (2,), (0,), (9,)]
    batch = random_batch(sizes, "cpu")
    sched = simulated(2, latency_control=False)
    with sched.acquire("items", best_effort=True) as lease:
        parts = list(lease.item_slices(batch, 10))
    assert [(items.start, items.stop) for items, _ in parts] == [(0, 2), (2, 3), (3, 4), (4, 7), (7, 8)]
    offsets = batch.host_layout()[0]
    base = batch.values.data_ptr()
    for items, part in parts:
        assert part.values.data_ptr() == base + int(offsets[items.start]) * batch.values.element_size()  # a view
        assert part.numel() <= 10 or items.stop - items.start == 1  # bounded, or one big item
        for got, want in zip(part.unbind(), batch.unbind()[items]):
            assert torch.equal(got, want)
    assert sum(len(part) for _, part in parts) == len(batch)
    empty = random_batch([], "cpu", item_dim=1)
    with sched.acquire("items", best_effort=True) as lease:
        assert list(lease.item_slices(empty, 10)) == []
        assert len(list(lease.item_slices(batch))) == 1
        with pytest.raises(TypeError, match="RaggedBatch"):
            list(lease.item_slices(torch.zeros(3), 10))


def test_run_sliced_equals_unsliced_bit_for_bit(device):
    batch = random_batch([(3, 40, 50), (3, 1, 7), (3, 0, 4), (3, 64, 64), (3, 9, 300), (3, 2, 2)], device, seed=3)
    m = len(batch)
    g = torch.Generator().manual_seed(1)
    scale = torch.rand(m, 3, generator=g).to(device)
    bias = torch.randn(m, 3, generator=g).to(device)
    whole = octopus.affine(batch, scale, bias)
    backend = "cuda" if device.type == "cuda" else "simulated"
    sched = octopus.StreamScheduler(2, backend=backend)
    for size in (1, 5000, 12000, 10 ** 9):
        parts = sched.run_sliced(lambda part, items: octopus.affine(part, scale[items], bias[items]), batch, size,
                                 kind="affine")
        assert torch.equal(torch.cat([p.values for p in parts]), whole.values), size
    # A count: a row-blocked product (each slice one mm of its rows).
    a = torch.randn(300, 64, generator=g).to(device)
    b = torch.randn(64, 32, generator=g).to(device)
    out = torch.empty(300, 32, device=device)
    sched.run_sliced(lambda rows: torch.mm(a[rows], b, out=out[rows]), 300, 64, kind="matmul")
    torch.testing.assert_close(out, a @ b, rtol=1e-5, atol=1e-5)
    stats = sched.stats()
    assert stats["active"] == 0 and stats["classes"]["best_effort"]["granted"] == 5


def test_adaptive_limit_with_scripted_utilization():
    sched = simulated(4, target_utilization=0.5, utilization_interval=3600.0)
    device = sched.simulated_backend

    def limit():
        return sched.stats()["devices"][0]["lease_limit"]

    sched.adapt_concurrency()
    assert limit() == 4  # no reading: fixed
    device.set_utilization(0, 0.95)
    for expected in (3, 2, 1, 1):
        sched.adapt_concurrency()
        assert limit() == expected
    held = sched.acquire()
    assert sched.try_acquire() is None
    device.set_utilization(0, 0.1)
    for expected in (2, 3, 4, 4):
        sched.adapt_concurrency()
        assert limit() == expected
    held.release()
    fixed = simulated(4)
    fixed.simulated_backend.set_utilization(0, 1.0)
    fixed.adapt_concurrency()
    assert fixed.stats()["devices"][0]["lease_limit"] == 4


def test_best_effort_partition_on_the_simulation():
    sched = simulated(2, reserved_sms=16)
    assert sched.stats()["devices"][0]["partition_sms"] == 112
    with pytest.raises(RuntimeError, match="reserved_sms=200"):
        simulated(2, reserved_sms=200)


def test_several_devices_throttle_where_latency_critical_work_is():
    sched = simulated(4, simulated_devices=2, best_effort_in_flight=0, best_effort_max_pause=None,
                      latency_control=False)
    on0 = sched.acquire(best_effort=True, device=0)
    on1 = sched.acquire(best_effort=True, device=1)
    with sched.acquire(priority="high", device=1):
        assert on0.checkpoint() == 0.0  # device 0 has no latency-critical work
        resumed = threading.Event()
        worker = threading.Thread(target=lambda: (on1.checkpoint(), resumed.set()))
        worker.start()
        time.sleep(0.05)
        assert not resumed.is_set()
    worker.join()
    assert resumed.is_set()
    on0.release(), on1.release()


def test_stats_and_trace_per_class(tmp_path):
    sched = simulated(2, record_timeline=True, best_effort_in_flight=0, best_effort_max_pause=0.01,
                      latency_control=False)
    with sched.acquire("bg", best_effort=True) as background:
        with sched.acquire("urgent", priority="high", deadline=5.0):
            assert background.checkpoint() >= 0.01
    with pytest.raises(octopus.DeadlineMissed):
        sched.acquire("urgent", priority="high", deadline=-1.0)
    stats = sched.stats()
    high = stats["classes"]["high"]
    assert high["granted"] == 1 and high["deadline_rejected"] == 1
    assert high["hold_p99_s"] >= high["hold_p50_s"] > 0 and high["wait_p50_s"] >= 0
    assert stats["classes"]["normal"]["wait_p50_s"] is None
    assert stats["classes"]["best_effort"]["throttled_s"] >= 0.01
    path = tmp_path / "trace.json"
    sched.dump_trace(path)
    trace = json.loads(path.read_text())
    assert trace["otherData"]["classes"]["best_effort"]["pauses"] == 1
    cats = {e.get("cat") for e in trace["traceEvents"]}
    assert {"lease", "throttle", "deadline_miss"} <= cats
    leases = [e for e in trace["traceEvents"] if e.get("cat") == "lease"]
    assert {e["args"]["class"] for e in leases} == {"best_effort", "high"}


@pytest.mark.parametrize("device_yield", [True, False])
def test_the_trace_says_whether_latency_critical_leases_closed_the_yield_gate(tmp_path, device_yield):
    sched = simulated(record_timeline=True, latency_control=False, device_yield=device_yield)
    with sched.acquire("bg", best_effort=True), sched.acquire("urgent", priority="high"):
        pass
    path = tmp_path / "trace.json"
    sched.dump_trace(path)
    leases = {e["args"]["class"]: e["args"] for e in json.loads(path.read_text())["traceEvents"]
              if e.get("cat") == "lease"}
    assert leases["high"]["closed_gate"] == int(device_yield)
    assert "closed_gate" not in leases["best_effort"]


def test_the_trace_says_which_latency_critical_jobs_ran_alone(tmp_path):
    sched = simulated(record_timeline=True)  # latency control on: LC jobs' latencies are recorded

    def kind():
        return sched.stats()["devices"][0]["control"]["kinds"].get("urgent", {})
    with sched.acquire("urgent", priority="high"):
        pass
    # Observed before any best-effort lease is granted (a grant before its completion is seen
    # counts it as not alone).
    eventually(lambda: kind().get("samples") == 1, "the first LC job observed")
    with sched.acquire("bg", best_effort=True):
        with sched.acquire("urgent", priority="high"):
            pass
    eventually(lambda: kind().get("samples") == 2, "both LC jobs observed")
    path = tmp_path / "trace.json"
    sched.dump_trace(path)
    latencies = [e["args"] for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "latency urgent"]
    assert [a["alone"] for a in latencies] == [1, 0]
    assert all(a["latency_ms"] >= 0 for a in latencies)
    assert kind()["alone_samples"] == 0  # (a kind's first jobs are left out of its alone samples)


@pytest.mark.parametrize("kwargs, match", [
    (dict(throttle="sometimes"), "throttle"),
    (dict(best_effort_in_flight=-1), "best_effort_in_flight"),
    (dict(best_effort_max_pause=-0.5), "best_effort_max_pause"),
    (dict(reserved_sms=-1), "reserved_sms"),
    (dict(infeasible_deadline="ignore"), "infeasible_deadline"),
    (dict(target_utilization=1.5), "target_utilization"),
    (dict(min_leases_per_device=9), "min_leases_per_device"),
    (dict(max_best_effort_leases=0), "max_best_effort_leases"),
])
def test_bad_class_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        octopus.StreamScheduler(backend="simulated", **kwargs)


def test_bad_deadline():
    with pytest.raises(ValueError, match="deadline"):
        simulated(2).acquire(deadline=float("nan"))


# -- CUDA ---------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_checkpoint_bounds_work_in_flight_on_the_device():
    sched = octopus.StreamScheduler(2, best_effort_in_flight=1)
    with sched.acquire("sleep", best_effort=True) as lease:
        before = None
        for _ in range(5):
            lease.checkpoint(1)
            assert before is None or before.query(), "work from before the checkpoint was still queued"
            with torch.cuda.stream(lease.stream):
                torch.cuda._sleep(2_000_000)
            before = torch.cuda.Event()
            before.record(lease.stream)
        lease.checkpoint(1)
        assert before.query()
    # The device time of the slices was measured (the second slice on).
    assert sched.seconds_per_unit("sleep") > 0


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_best_effort_streams_on_a_green_context_partition():
    try:
        sched = octopus.StreamScheduler(2, reserved_sms=16)
    except RuntimeError as error:
        if "driver or newer" not in str(error):  # only a driver without green contexts may refuse
            raise
        pytest.skip(f"no SM partition on this machine: {error}")
    total = torch.cuda.get_device_properties(0).multi_processor_count
    sms = sched.stats()["devices"][0]["partition_sms"]
    assert 0 < sms <= total - 16
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(512, 512, device="cuda", generator=g)
    b = torch.randn(512, 512, device="cuda", generator=g)
    expected = a @ b
    expected_y = torch.arange(1000, device="cuda", dtype=torch.float32).sin()  # the same kernel, on the primary context
    with sched.acquire("mm", best_effort=True) as lease:
        with torch.cuda.stream(lease.stream):
            got = a @ b
            y = torch.arange(1000, device="cuda", dtype=torch.float32).sin()
    lease.release_event.synchronize()
    torch.testing.assert_close(got, expected)
    assert torch.equal(y, expected_y)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_slices_keep_the_leases_stream_current_by_its_id():
    # The slicing helpers compare stream ids (streams.current_stream_id), not Stream objects:
    # the id of the lease's stream (an ExternalStream of the pool) is the current one's while
    # it is current, and each slice runs on it; where another stream is current, they leave it.
    from octopus.scheduling.streams import current_stream_id
    sched = octopus.StreamScheduler(2, latency_control=False, best_effort_in_flight=1)
    index = torch.cuda.current_device()
    with sched.acquire("rows", best_effort=True) as lease:
        assert current_stream_id(index) == torch.cuda.current_stream(index).stream_id != lease.stream.stream_id
        with torch.cuda.stream(lease.stream):
            assert current_stream_id(index) == lease.stream.stream_id == torch.cuda.current_stream(index).stream_id
            for _ in lease.slices(4, 1):
                assert torch.cuda.current_stream(index).stream_id == lease.stream.stream_id
        other = torch.cuda.Stream()
        with torch.cuda.stream(other):
            for _ in lease.slices(4, 1):
                assert torch.cuda.current_stream(index).stream_id == other.stream_id

"""Latency targets from Python: the options as one dataclass mirroring the C++ config, the
controller's state in stats(), targets and their errors, infeasible targets said out loud,
the GIL switch interval kept short while a scheduler is open, and (on CUDA) slices sized by
the controller giving the same bits as unsliced work and graph captures beside a busy
scheduler."""

import dataclasses
import gc
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import octopus
from octopus import _library
from octopus.scheduling import gil
from conftest import HAS_CUDA, random_batch


def simulated(**options):
    return octopus.StreamScheduler(backend="simulated", **options)


def best_effort_holder(sched, stop):
    """A started thread holding one best-effort lease of kind "be", checkpointing until ``stop``."""
    def hold():
        with sched.acquire("be", best_effort=True) as lease:
            while not stop.is_set():
                lease.checkpoint(1)
                time.sleep(1e-4)

    worker = threading.Thread(target=hold)
    worker.start()
    return worker


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_dataclass_and_the_native_config_have_the_same_fields_and_defaults():
    native = _library._C.SchedulerConfig()
    native_fields = {name for name in dir(native) if not name.startswith("_") and name != "validate"}
    mirrored = {f.metadata.get("native") or f.name for f in dataclasses.fields(octopus.SchedulerConfig)}
    assert mirrored == native_fields
    converted = octopus.SchedulerConfig().native()
    for name in native_fields:
        assert getattr(converted, name) == getattr(native, name), name


def test_options_are_the_dataclass_fields_and_unknown_ones_are_named():
    sched = simulated(timeout=2.0, latency_ratio=3.0, max_leases_per_device=3)
    assert sched.config.timeout == 2.0 and sched.config.latency_ratio == 3.0 and sched.capacity == 3
    base = octopus.SchedulerConfig(max_leases_per_device=2, latency_ratio=2.0)
    assert simulated(config=base, latency_ratio=4.0).config == dataclasses.replace(base, latency_ratio=4.0)
    with pytest.raises(TypeError, match=r"unknown option\(s\) 'latency_target'.*latency_ratio"):
        simulated(latency_target=2.0)
    with pytest.raises(ValueError, match="latency_ratio must be at least 1"):
        simulated(latency_ratio=0.5)
    assert simulated(latency_error_budget=8.0).config.latency_error_budget == 8.0
    with pytest.raises(ValueError, match="latency_error_budget must be at least 1"):
        simulated(latency_error_budget=0.5)
    with pytest.raises(ValueError, match="throttle must be"):
        simulated(throttle="sometimes")
    with pytest.raises(ValueError, match="timeout"):
        simulated(timeout=-1.0)


@pytest.fixture
def interpreter_interval():
    """Python's switch interval set to 5 ms for the test and put back after it (schedulers
    of earlier tests that nobody closed collected first: they give theirs back)."""
    gc.collect()
    assert not gil._open, "a scheduler of an earlier test is still open"
    before = sys.getswitchinterval()
    sys.setswitchinterval(5e-3)
    yield 5e-3
    sys.setswitchinterval(before)


def test_latency_control_keeps_the_gil_switch_interval_short_while_the_scheduler_is_open(interpreter_interval):
    first = simulated()
    assert sys.getswitchinterval() == pytest.approx(2e-4)
    second = simulated(gil_switch_interval=1e-4)
    assert sys.getswitchinterval() == pytest.approx(1e-4)  # the smallest open request's
    second.close()
    assert sys.getswitchinterval() == pytest.approx(2e-4)
    second.close()  # a second close changes nothing
    assert sys.getswitchinterval() == pytest.approx(2e-4)
    first.close()
    assert sys.getswitchinterval() == pytest.approx(interpreter_interval)
    # An interval above the interpreter's own does not raise it.
    with simulated(gil_switch_interval=0.05):
        assert sys.getswitchinterval() == pytest.approx(interpreter_interval)
    # A scheduler nobody closed gives it back when it is collected.
    simulated()
    gc.collect()
    assert sys.getswitchinterval() == pytest.approx(interpreter_interval)


def test_the_gil_switch_interval_is_left_alone_without_latency_control_or_when_asked(interpreter_interval):
    with simulated(latency_control=False), simulated(gil_switch_interval=None):
        assert sys.getswitchinterval() == pytest.approx(interpreter_interval)
    for bad in (0, -1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="gil_switch_interval must be a positive number"):
            simulated(gil_switch_interval=bad)
    assert sys.getswitchinterval() == pytest.approx(interpreter_interval)


def test_stats_show_the_controller():
    control = simulated().stats()["devices"][0]["control"]
    assert control["enabled"] and control["step"] == 0 and control["steps"] >= 6
    assert control["slice_budget_s"] > 0 and control["in_flight"] == 2 and control["throttle"] == "off"
    assert control["reserves"] == sorted(control["reserves"]) and control["kinds"] == {}
    assert not simulated(latency_control=False).stats()["devices"][0]["control"]["enabled"]


def test_a_kind_gets_its_alone_latency_by_a_probe_and_a_target_from_it():
    sched = simulated()
    stop = threading.Event()
    worker = best_effort_holder(sched, stop)
    jobs = 0
    try:
        # 100 jobs, and more while the kind has too few alone samples for a target: a probe lasts
        # 0.25 s and the next comes 2 s later, so a host slow enough for the first to end before
        # 40 jobs (8 of them warm-up) waits for the second.
        deadline = time.time() + 30
        while jobs < 100 or (time.time() < deadline and
                             sched.stats()["devices"][0]["control"]["kinds"].get("lc", {}).get("target_s") is None):
            with sched.acquire("lc", priority="high"):
                busy(3e-4)
            jobs += 1
            time.sleep(1e-3)
    finally:
        stop.set()
        worker.join()
    deadline = time.time() + 5
    while time.time() < deadline:  # the control thread catches up with the last completions
        kind = sched.stats()["devices"][0]["control"]["kinds"]["lc"]
        if kind["samples"] == jobs:
            break
        time.sleep(0.01)
    assert kind["samples"] == jobs
    # (The job holds its lease 0.3 ms; the host's noise only adds: over 5 ms with two cores busy
    # three times over.)
    assert kind["alone_samples"] >= 32 and 3e-4 <= kind["alone_p99_s"] < 0.02
    assert kind["target_s"] == pytest.approx(1.5 * kind["alone_p99_s"])
    assert 3e-4 <= kind["alone_p50_s"] <= kind["alone_p99_s"]
    # Each step the controller moves to starts a new recent window: empty when the last job moved
    # it (a late one on a loaded host climbs), else the 0.3 ms jobs' median and p99.
    recent = (kind["recent_p50_s"], kind["recent_p99_s"])
    assert recent == (None, None) or 3e-4 <= recent[0] <= recent[1]
    assert 0 <= kind["attainment"] <= 1 and not kind["infeasible"] and kind["median_unhelped"] is False
    # Its yield gate, as the controller sees it.
    assert isinstance(kind["closes_gate"], bool) and isinstance(kind["gate_on_trial"], bool)
    assert kind["gate_trials"] >= kind["gate_failures"] >= 0
    control = sched.stats()["devices"][0]["control"]
    assert control["probes"] >= 1
    # Per step of the ladder, the kind's jobs there with best-effort work present (not the alone ones).
    steps = kind["steps"]
    assert len(steps) == control["steps"]
    assert kind["alone_samples"] + sum(at["jobs"] for at in steps) <= kind["samples"]
    # Jobs that met best-effort work an earlier step let in are counted, not recorded (unsettled).
    assert all(at["over"] <= at["jobs"] and at["unsettled"] <= at["jobs"] for at in steps)
    held = [at for at in steps if at["jobs"] > at["unsettled"]]
    assert held and all(3e-4 <= at["p50_s"] <= at["p99_s"] for at in held)
    assert all(at["p50_s"] is None for at in steps if at["jobs"] == at["unsettled"])


def test_a_best_effort_kind_the_latency_critical_work_does_not_mind_is_released():
    # The LC job takes 60 ms while best-effort work runs in whole units (the steps that only keep
    # SMs free) and 1 ms once it is sliced or held back by a probe: the controller climbs past
    # those steps for its 30 ms target, then tries releasing the one best-effort kind (the last
    # partition step's settings for it alone). The job's time follows the controller's step only,
    # so the try holds and stats() says so; the kind's slices are then whole units while any other
    # kind's stay short. (The target leaves room for a loaded host: with two cores busy four times
    # over, 1 ms jobs took over 10 ms one time in 40, enough to make a 10 ms target unmeetable.)
    sched = simulated()
    sched.set_target("lc", 30.0)
    stop = threading.Event()
    worker = best_effort_holder(sched, stop)
    released = False
    try:
        deadline = time.time() + 60
        while not released and time.time() < deadline:
            control = sched.stats()["devices"][0]["control"]
            with sched.acquire("lc", priority="high"):
                busy(60e-3 if control["slice_budget_s"] >= 0.02 and not control["probing"] else 1e-3)
            time.sleep(2e-4)
            released = control["best_effort_kinds"].get("be", {}).get("released", False)
    finally:
        stop.set()
        worker.join()
    assert released, control
    control = sched.stats()["devices"][0]["control"]
    assert control["slice_budget_s"] < 0.02 and control["best_effort_kinds"]["be"]["trials"] >= 1
    assert control["released_settings"]["throttle"] == "off"
    assert sched.slice_budget(kind="be") == control["released_settings"]["slice_budget_s"] >= 0.02
    assert sched.slice_budget(kind="another") == control["slice_budget_s"] < 0.02


def test_a_job_that_says_when_it_arrived_is_timed_from_there():
    # Jobs that had waited 0.5 s when they asked for their leases (a server's queue, a thread
    # that woke late), through acquire's common path, its full one and try_acquire: their
    # kinds' latencies count the wait; a kind whose jobs say nothing is timed from acquire.
    # Most of them arrived before the scheduler was made, and ran alone all the same.
    sched = simulated()
    acquires = dict(common=lambda t: sched.acquire("common", priority="high", arrived=t),
                    full=lambda t: sched.acquire("full", priority="high", timeout=5.0, arrived=t),
                    tried=lambda t: sched.try_acquire("tried", priority="high", arrived=t),
                    prompt=lambda t: sched.acquire("prompt", priority="high"))
    for _ in range(40):
        for acquire in acquires.values():
            with acquire(time.perf_counter() - 0.5) as lease:
                busy(3e-4)
            assert lease.waited_s < 0.5  # what it waited for the lease, from its acquire
        time.sleep(1e-3)
    deadline = time.time() + 5
    while time.time() < deadline:  # the control thread catches up with the last completions
        kinds = sched.stats()["devices"][0]["control"]["kinds"]
        if all(kinds.get(name, {}).get("samples") == 40 for name in acquires):
            break
        time.sleep(0.01)
    assert all(kinds[name]["samples"] == 40 for name in acquires)
    # Their alone medians (no best-effort work here): unlike the recent window, which a step the
    # controller moves to empties, these stay.
    assert all(kinds[name]["alone_samples"] == 32 for name in acquires), kinds  # all but 8 warm-up jobs
    assert min(kinds[name]["alone_p50_s"] for name in ("common", "full", "tried")) >= 0.5
    assert kinds["prompt"]["alone_p50_s"] < 0.5


def test_acquire_checks_arrived():
    sched = simulated()
    for value, error, match in [(float("nan"), ValueError, "arrived must be a finite time.perf_counter"),
                                (float("-inf"), ValueError, "arrived must be a finite"),
                                (10 ** 400, ValueError, "arrived must be a finite"),
                                (time.perf_counter() + 10, ValueError, "s from now"),
                                ("soon", TypeError, "arrived must be"), (True, TypeError, "arrived must be")]:
        with pytest.raises(error, match=match):
            sched.acquire("lc", priority="high", arrived=value)
        with pytest.raises(error, match=match):
            sched.try_acquire("lc", priority="high", arrived=value)
    assert sched.stats()["granted"] == 0
    # Any real number will do: a numpy reading, an int.
    for value in (np.float64(time.perf_counter()), int(time.perf_counter())):
        with sched.acquire("lc", priority="high", arrived=value):
            pass


def test_set_target_checks_its_arguments():
    sched = simulated()
    sched.set_target("lc", 2.0)
    sched.set_target("lc2", ratio=3.0)
    for args, kwargs, match in [((0,), {}, "p99_ms must be a positive"), ((float("nan"),), {}, "p99_ms"),
                                ((), {"ratio": 0.9}, "ratio must be a number of at least 1"),
                                ((1.0,), {"ratio": 2.0}, "not both")]:
        with pytest.raises(ValueError, match=match):
            sched.set_target("lc", *args, **kwargs)
    with pytest.raises(RuntimeError, match="latency_control"):
        simulated(latency_control=False).set_target("lc", 1.0)


def test_an_infeasible_target_warns_once_naming_the_kind():
    sched = simulated()
    sched.set_target("tight", 0.05)  # 50 us; the job alone takes 1 ms
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(60):
            with sched.acquire("tight", priority="high"):
                busy(1e-3)
            time.sleep(2e-3)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "kind 'tight'" in messages[0] and "0.05 ms" in messages[0] and "cannot be met" in messages[0]
    assert sched.stats()["devices"][0]["control"]["kinds"]["tight"]["infeasible"]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of octopus")
def test_slices_sized_by_the_controller_give_the_bits_of_unsliced_work():
    device = torch.device("cuda")
    sched = octopus.StreamScheduler(2)
    batch = random_batch([(int(n),) for n in torch.randint(0, 50_000, (400,))], device, seed=5)
    g = torch.Generator().manual_seed(2)
    scale, bias = torch.rand(len(batch), generator=g).to(device), torch.randn(len(batch), generator=g).to(device)
    whole = octopus.affine(batch, scale, bias)
    cycles_per_element = 4e6 / batch.numel()   # the batch sleeps 4M cycles: 2-3 ms at 1.4-2 GHz

    def work(part, items):  # device time proportional to the part's elements, as the helpers assume
        torch.cuda._sleep(int(part.numel() * cycles_per_element))
        return octopus.affine(part, scale[items], bias[items])

    def lc_job():
        with sched.acquire("lc", priority="high") as lease, torch.cuda.stream(lease.stream):
            torch.ones(1, device=device).add_(1)

    # A target no job meets (10 us) makes the controller climb to its shortest slices.
    sched.set_target("lc", 0.01)
    for _ in range(500):
        lc_job()
        torch.cuda.synchronize()
        if sched.slice_budget() <= 1e-3:
            break
    assert sched.slice_budget() <= 1e-3, sched.stats()["devices"][0]["control"]
    for _ in range(3):
        parts = sched.run_sliced(work, batch, kind="affine", best_effort=True)
        assert len(parts) > 1
        assert torch.equal(torch.cat([p.values for p in parts]), whole.values)
        lc_job()
    a = torch.randn(2048, 256, generator=g).to(device)
    b = torch.randn(256, 256, generator=g).to(device)
    out = torch.empty(2048, 256, device=device)
    sched.run_sliced(lambda rows: torch.mm(a[rows], b, out=out[rows]), 2048, kind="matmul")
    # (A product's bits may depend on how many rows cuBLAS is given; octopus's ops' do not.)
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of octopus")
def test_a_graph_captured_beside_a_busy_scheduler_is_not_invalidated():
    # The control thread queries events and calibrates its device clock (every second) while
    # latency-critical leases come and go; a capture in the default (global) mode on another
    # thread must not be broken by those calls.
    # (The latency-critical thread itself makes no capture-unsafe call: no synchronization,
    # no allocation.)
    device = torch.device("cuda")
    sched = octopus.StreamScheduler(4)
    stop = threading.Event()
    counter = torch.zeros(1, device=device)
    torch.cuda.synchronize()

    def latency_critical():
        while not stop.is_set():
            with sched.acquire("lc", priority="high") as lease, torch.cuda.stream(lease.stream):
                counter.add_(1)
            time.sleep(2e-4)

    thread = threading.Thread(target=latency_critical, daemon=True)
    thread.start()
    try:
        x = torch.randn(4096, device=device)
        stream = torch.cuda.Stream(device)
        end = time.perf_counter() + 2.5  # more than two calibrations
        captured = 0
        while time.perf_counter() < end:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                with torch.cuda.graph(graph, stream=stream):
                    y = (x * 2).sum()
                graph.replay()
            stream.synchronize()
            assert y.item() == pytest.approx(2 * x.sum().item(), rel=1e-5)
            captured += 1
        assert captured > 10
    finally:
        stop.set()
        thread.join()
        sched.close()

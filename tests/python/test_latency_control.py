"""Latency targets from Python: the options as one dataclass mirroring the C++ config, the
controller's state in stats(), targets and their errors, infeasible targets said out loud,
and (on CUDA) slices sized by the controller giving the same bits as unsliced work."""

import dataclasses
import threading
import time
import warnings

import pytest
import torch

import octopus
from octopus import _library
from conftest import HAS_CUDA, random_batch


def simulated(**options):
    return octopus.StreamScheduler(backend="simulated", **options)


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
    with pytest.raises(ValueError, match="throttle must be"):
        simulated(throttle="sometimes")
    with pytest.raises(ValueError, match="timeout"):
        simulated(timeout=-1.0)


def test_stats_show_the_controller():
    control = simulated().stats()["devices"][0]["control"]
    assert control["enabled"] and control["step"] == 0 and control["steps"] >= 6
    assert control["slice_budget_s"] > 0 and control["in_flight"] == 2 and control["throttle"] == "off"
    assert control["reserves"] == sorted(control["reserves"]) and control["kinds"] == {}
    assert not simulated(latency_control=False).stats()["devices"][0]["control"]["enabled"]


def test_a_kind_gets_its_alone_latency_by_a_probe_and_a_target_from_it():
    sched = simulated()
    stop = threading.Event()

    def best_effort():
        with sched.acquire("be", best_effort=True) as lease:
            while not stop.is_set():
                lease.checkpoint(1)
                time.sleep(1e-4)

    worker = threading.Thread(target=best_effort)
    worker.start()
    try:
        for _ in range(100):
            with sched.acquire("lc", priority="high"):
                busy(3e-4)
            time.sleep(1e-3)
    finally:
        stop.set()
        worker.join()
    deadline = time.time() + 5
    while time.time() < deadline:  # the control thread catches up with the last completions
        kind = sched.stats()["devices"][0]["control"]["kinds"]["lc"]
        if kind["samples"] == 100:
            break
        time.sleep(0.01)
    assert kind["samples"] == 100
    # (The job holds its lease 0.3 ms; the host's noise on a loaded machine only adds.)
    assert kind["alone_samples"] >= 32 and 3e-4 <= kind["alone_p99_s"] < 5e-3
    assert kind["target_s"] == pytest.approx(1.5 * kind["alone_p99_s"])
    assert 3e-4 <= kind["alone_p50_s"] <= kind["alone_p99_s"] and kind["recent_p50_s"] >= 3e-4
    assert 0 <= kind["attainment"] <= 1 and not kind["infeasible"]
    assert sched.stats()["devices"][0]["control"]["probes"] >= 1


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
        if sched.slice_budget() < 1e-3:
            break
    assert sched.slice_budget() < 1e-3, sched.stats()["devices"][0]["control"]
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

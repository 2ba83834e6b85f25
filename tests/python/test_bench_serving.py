"""octopus-bench serving end to end on the CPU at a tiny scale (the tiny model, small latents,
few steps): every mode runs, the JSON has what the README table needs, and the derived
serial latencies agree with the measured ones at the rate where both exist."""

import json
import os
import subprocess
import sys

import pytest
import torch

from octopus.bench import serving

pytest.importorskip("diffusers")


def test_serving_benchmark_smoke_run_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OCTOPUS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "octopus.bench", "serving", "--requests", "10", "--rates", "60", "120",
                           "--max-batch", "4", "--shapes", "4x8x8", "4x8x12", "--steps", "2", "4", "--high-share", "0.3",
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=600,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CPU smoke run" in proc.stderr
    with open(out / "serving.json") as f:
        result = json.load(f)
    assert result["model"]["name"] == "tiny" and result["environment"]["device_type"] == "cpu"
    rows = result["rows"]
    # No graphs on the CPU: octopus-graphs is left out there.
    modes = ("serial", "static", "step-level", "octopus", "octopus-priority", "octopus-lane", "octopus-lane-priority",
             "octopus-lane-yield")
    assert {(r["mode"], r["rate"]) for r in rows} == {(m, rate) for m in modes for rate in (60.0, 120.0)}
    for r in rows:
        assert r["completed"] == 10 and not r.get("truncated")
        assert r["throughput"] > 0 and 0 < r["p50_s"] <= r["p99_s"]
        assert r["high_p99_s"] is not None and r["high_p99_over_unloaded"] > 0
    measured = [r for r in rows if r["mode"] != "serial" or not r.get("derived")]
    for r in measured:
        assert 0 <= r["iterations"]["step_share"] < 1 and r["iterations"]["mean_batch"] >= 1
    serial = next(r for r in rows if r["mode"] == "serial" and not r.get("derived"))
    assert serial["derived_check"]["p99_s"] == pytest.approx(serial["p99_s"], rel=0.5)
    assert any(r["mode"] == "serial" and r.get("derived") for r in rows)
    assert {r["mode"] for r in result["scenarios"]} == set(modes[1:4])
    assert all(r["sampler"]["normal_lane_paused_s"] >= 0 for r in rows if r["mode"].startswith("octopus"))
    # The high-priority requests by themselves, per rate: all served, measured like the rest.
    high = result["high_only"]
    assert [h["rate"] for h in high] == [60.0, 120.0]
    assert all(h["completed"] == h["requests"] > 0 and h["high_p99_over_unloaded"] > 0 for h in high)
    assert "high-priority only" in proc.stdout
    assert os.path.exists(result["plot"])


def test_workloads_are_reproducible_and_poisson_scaled():
    a = serving.make_workload(300, 10.0, seed=3, high_share=0.1)
    b = serving.make_workload(300, 40.0, seed=3, high_share=0.1)
    assert [r["shape"] for r in a] == [r["shape"] for r in b] and [r["steps"] for r in a] == [r["steps"] for r in b]
    assert all(abs(x["arrival"] - 4 * y["arrival"]) < 1e-9 for x, y in zip(a, b))
    assert {r["shape"] for r in a} == set(serving.SHAPES) and {r["scheduler"] for r in a} == {
        name for name, _ in serving.SAMPLERS}
    assert min(r["steps"] for r in a) >= 10 and max(r["steps"] for r in a) <= 50
    assert 0.05 < sum(r["high"] for r in a) / len(a) < 0.16
    mean_gap = a[-1]["arrival"] / (len(a) - 1)
    assert 0.08 < mean_gap < 0.12  # 1 / rate


def test_derived_serial_latencies_follow_one_fifo_server():
    workload = [dict(id=i, arrival=a, high=h) for i, (a, h) in enumerate([(0.0, False), (0.1, False), (0.15, True),
                                                                          (5.0, False)])]
    service = {0: 1.0, 1: 1.0, 2: 0.5, 3: 0.2}
    # 0 runs 0-1; at 1.0 both 1 and 2 wait, the high-priority 2 goes first (1-1.5), then 1 (1.5-2.5); 3 alone.
    assert serving.derived_serial(workload, service) == pytest.approx({0: 1.0, 2: 1.5, 1: 2.5, 3: 5.2})


def test_peer_graphs_are_prepared_largest_batch_first_with_the_conditioning_repeated():
    from octopus.bench.serving.peers import prepare_peer_graphs
    calls = []
    states = torch.arange(6.0).view(3, 2)  # one sample's conditioning
    prepare_peer_graphs(lambda x, t, kwargs: calls.append((tuple(x.shape), tuple(t.shape), kwargs)),
                        [(4, 2, 2), (4, 3, 3)], [2, 6, 4, 6], torch.device("cpu"), torch.float32,
                        {"encoder_hidden_states": states})
    assert [(x, t) for x, t, _ in calls] == [((n, 4, s, s), (n,)) for s in (2, 3) for n in (6, 6, 4, 4, 2, 2)]
    for x, _, kwargs in calls:
        assert torch.equal(kwargs["encoder_hidden_states"], states.expand(x[0], 3, 2))

"""octopus-bench serving --pipeline on the CPU at a tiny scale: the step-level server (the
benchmark's strongest plain peer) gives each request the image the pipeline gives called
alone, and every server serves the whole trace at both loads."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

from octopus.bench.serving import pipeline as bench  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    pipe, parameters = bench.make_pipeline("tiny", torch.device("cpu"), torch.float32)
    return pipe, parameters


def test_the_step_level_server_gives_the_pipelines_images(tiny):
    pipe, parameters = tiny
    assert all(n > 0 for n in parameters.values())
    # Mixed sizes, samplers and step counts in one running batch.
    trace = bench.make_pipeline_workload(6, 3, 0.0, bench.PIPELINE_SIZES["tiny"], (2, 5))
    assert len({r["size"] for r in trace}) == 2 and len({r["scheduler"] for r in trace}) >= 2
    result = bench.run_step_level(pipe, bench.at_rate(trace, float("inf")), torch.device("cpu"), 120.0, 4, None,
                                  keep_images=True)
    assert sorted(result["completions"]) == [r["id"] for r in trace]
    base = pipe.scheduler
    for spec in trace:
        pipe.scheduler = bench._scheduler(pipe, spec)
        alone = pipe(spec["prompt"], height=spec["size"], width=spec["size"], num_inference_steps=spec["steps"],
                     guidance_scale=bench.GUIDANCE, generator=torch.Generator().manual_seed(spec["seed"]),
                     output_type="np").images[0]
        pipe.scheduler = base
        np.testing.assert_allclose(result["images"][spec["id"]], alone, rtol=1e-4, atol=1e-5)


def test_octopus_priority_caps_the_batch_for_its_run_only(tiny):
    from octopus.diffusion import PipelineServer

    pipe, _ = tiny
    trace = bench.make_pipeline_workload(6, 5, 0.5, bench.PIPELINE_SIZES["tiny"], (2, 4))
    high_steps = sum(r["steps"] for r in trace if r["high"])
    assert high_steps > 0
    with PipelineServer(pipe, max_batch=4, prompt_cache=0, record_iterations=True) as server:
        sampler = server.sampler
        before = sampler.stats()["iterations"]
        result = bench.run_octopus(server, bench.at_rate(trace, float("inf")), 120.0, high_priority_batch=1)
        assert sorted(result["completions"]) == [r["id"] for r in trace]
        assert sorted(result["timings"]) == [r["id"] for r in trace]  # every image's timing
        timing = bench.high_priority_timing(trace, result["timings"])
        high = [result["timings"][r["id"]] for r in trace if r["high"]]
        assert timing["slowest"] == max(high, key=lambda t: t["total"])
        assert set(timing["median"]) == set(high[0]) and timing["median"]["total"] <= timing["slowest"]["total"]
        assert bench.high_priority_timing([r for r in trace if not r["high"]], result["timings"]) is None
        # Batches of one while a high-priority request waits or runs: their steps one at a time.
        assert sampler.stats()["iterations"] - before >= high_steps
        assert (sampler.preempt, sampler.high_priority_batch) == (False, None), "the server's settings come back"


def test_workload_is_reproducible_and_scaled_by_rate():
    a = bench.make_pipeline_workload(20, 1, 0.3, (32, 64), (2, 5))
    b = bench.make_pipeline_workload(20, 1, 0.3, (32, 64), (2, 5))
    assert a == b and any(r["high"] for r in a)
    slow, fast = bench.at_rate(a, 2.0), bench.at_rate(a, 4.0)
    assert [r["arrival"] for r in slow] == pytest.approx([2 * r["arrival"] for r in fast])
    assert all(r["arrival"] == 0.0 for r in bench.at_rate(a, float("inf")))


def test_the_command_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OCTOPUS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "octopus.bench", "serving", "--pipeline", "tiny", "--requests", "5",
                           "--steps", "2", "3", "--max-batch", "3", "--high-share", "0.4", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "serving_pipeline.json").read_text())
    assert result["pipeline"]["name"] == "tiny" and set(result["pipeline"]["parameters"]) == {
        "unet", "text_encoder", "vae"}
    rows = result["rows"]
    assert [(r["mode"], r["load"].split()[0]) for r in rows] == [
        (m, load) for load in ("saturation", "60%") for m in ("pipeline", "step-level-graphs", "octopus")]
    high = {int(k) for k in result["unloaded_high_s"]}
    assert high and all(v > 0 for v in result["unloaded_high_s"].values())
    for r in rows:
        assert r["completed"] == r["requests"] == 5 and not r["truncated"]
        assert r["throughput"] > 0 and 0 < r["p50_s"] <= r["p99_s"] and r["high_p99_s"] is not None
        assert r["high_p99_over_unloaded"] > 0
        if r["mode"] == "octopus":  # every stage timed, the shares of their sum
            assert set(r["stage_s"]) == {"encode", "denoise", "decode", "postprocess"}
            assert all(t > 0 for t in r["stage_s"].values())
            assert sum(r["stage_share"].values()) == pytest.approx(1.0)
            slowest = r["high_timing"]["slowest"]
            assert slowest["total"] == pytest.approx(max(
                v for k, v in r["latencies"].items() if int(k) in high), rel=0.5)  # from submit vs from arrival
        else:
            assert "stage_s" not in r
    octopus_rate = next(r["throughput"] for r in rows if r["mode"] == "octopus" and r["load"] == "saturation")
    assert all(r["rate"] == pytest.approx(0.6 * octopus_rate) for r in rows if r["load"] != "saturation")
    assert "images/s" in proc.stdout and "slowest high-priority request, s: encoding" in proc.stdout


def test_modes_of_the_other_run_are_refused():
    proc = subprocess.run([sys.executable, "-m", "octopus.bench", "serving", "--pipeline", "tiny", "--modes", "static"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "static is not a mode of this run" in proc.stderr

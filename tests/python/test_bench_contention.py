"""octopus-bench contention: the modes it sweeps, its verdicts, and a run on the CPU (where
only the lease, checkpoint and Batcher costs on the simulated backend are measured)."""

import json
import os
import subprocess
import sys

import pytest

from octopus.bench import contention


def test_the_sweep_covers_every_mechanism_and_knob():
    modes = contention.modes([256, 512, 1024], [1, 2], [8, 16, 32], [16 << 20])
    names = [m.name for m in modes]
    assert len(names) == len(set(names))
    for needle in ("alone", "plain streams", "priority streams", "torch green contexts", "leases + throttle",
                   "leases + slicing", "in-flight", "leases + partition", "partition 16 + throttle"):
        assert any(needle in n for n in names), needle
    pairs = {(m.lc, m.be) for m in modes if m.be_stream != "none"}
    assert pairs == {("mlp", "matmul"), ("ragged", "matmul"), ("mlp", "ragged")}
    sweep = [m for m in modes if m.lc == "mlp" and m.be == "matmul" and m.be_stream == "lease"]
    assert {m.slice for m in sweep} == {None, 256, 512, 1024}
    assert {m.in_flight for m in sweep} == {0, 1, 2}
    assert {m.reserved_sms for m in sweep} == {0, 8, 16, 32}
    assert {m.throttle for m in sweep} == {"off", "held"}


def test_verdicts():
    rows = [dict(name="a", lc="mlp", lc_p50_ms=0.5, lc_p99_ms=0.58, be_share=0.85, sm_clock_mhz=1552.4),
            dict(name="b", lc="mlp", lc_p50_ms=0.5, lc_p99_ms=0.61, be_share=0.95),
            dict(name="c", lc="mlp", lc_p50_ms=0.5, lc_p99_ms=0.5, be_share=0.79),
            dict(name="d", lc="mlp", error="RuntimeError: no partition")]
    contention.summarize(rows, {"mlp": 0.4}, {"mlp": 1.16})
    assert [r.get("meets_target") for r in rows] == [True, False, False, None]
    assert rows[0]["lc_p99_over_alone"] == 0.58 / 0.4
    assert rows[0]["lc_p99_over_alone_p99"] == 0.58 / 1.16  # like for like, reported beside the target's measure
    table = contention.format_table(rows)
    assert table.splitlines()[1].split()[-4:] == ["0.50", "85", "1552", "yes"]  # p99 / alone p99, BE %, clock
    assert table.splitlines()[2].split()[-2] == "-"  # no clock reading
    assert "error: RuntimeError: no partition" in table and "yes" in table


def test_runs_on_the_cpu(tmp_path):
    path = tmp_path / "contention.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", "octopus.bench", "contention", "--json", str(path)],
                          capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device" in proc.stderr
    result = json.loads(path.read_text())
    assert result["modes"] == []
    assert result["lease_overhead"][0]["backend"] == "simulated" and result["lease_overhead"][0]["python_us"] > 0
    assert result["checkpoint"][0]["checkpoint_us"] > 0
    assert result["batcher"][0]["back_to_back_us_per_request"] > 0


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="Linux scheduling calls")
def test_realtime_thread_is_asked_for_and_given_back():
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    with contention.realtime_thread(True) as realtime:
        assert isinstance(realtime, bool)  # False where the OS refuses (no CAP_SYS_NICE)
        assert os.sched_getscheduler(0) == (os.SCHED_FIFO if realtime else before[0])
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
    with contention.realtime_thread(False) as realtime:
        assert realtime is False and os.sched_getscheduler(0) == before[0]

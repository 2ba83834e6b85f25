"""Where an eager octopus op called from one thread of a busy process loses its time.

An experiment (not part of octopus-bench): ``octopus.normalize`` of 64 small uint8 images,
eager, every 3.2 ms from one thread, timed from its scheduled arrival to its completion, in
a process whose other threads replay a CUDA graph (another latency-critical job) or only
sleep; nothing else runs on the GPU. For the slowest calls, the ATen ops of the call with
their host times and the gaps between them (from a TorchDispatchMode on the timed thread)
say whether the time went to one op (a synchronizing allocation, a host copy) or to the gaps
(the GIL, the host).

    python benchmarks/lc_eager_stall.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import octopus
from octopus._timing import percentile


class OpTimes(TorchDispatchMode):
    """Each ATen op's name, start and end (perf_counter) on the thread that enters it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, float, float]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.ops.append((str(func), t0, time.perf_counter()))
        return out


def lc_loop(batch: octopus.RaggedBatch, iterations: int, period: float, trace: bool) -> dict:
    done = torch.cuda.Event()
    for _ in range(20):
        octopus.normalize(batch, 3)
    torch.cuda.synchronize()
    wall, calls = [], []
    start = time.perf_counter() + 0.01
    for k in range(iterations):
        arrival = start + k * period
        wait = arrival - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        recorder = OpTimes() if trace else None
        t0 = time.perf_counter()
        if recorder is not None:
            with recorder:
                octopus.normalize(batch, 3)
        else:
            octopus.normalize(batch, 3)
        done.record()
        t1 = time.perf_counter()
        done.synchronize()
        t2 = time.perf_counter()
        wall.append((t2 - arrival) * 1e3)
        calls.append(dict(launch_ms=(t1 - t0) * 1e3, wait_ms=(t2 - t1) * 1e3, late_ms=(t0 - arrival) * 1e3,
                          ops=[(name, (a - t0) * 1e3, (b - a) * 1e3) for name, a, b in recorder.ops]
                          if recorder is not None else None))
    slowest = sorted(range(len(wall)), key=lambda i: wall[i])[-5:]
    return dict(p50_ms=percentile(wall, 50), p99_ms=percentile(wall, 99), max_ms=max(wall),
                launch_p50_ms=statistics.median(c["launch_ms"] for c in calls),
                launch_p99_ms=percentile([c["launch_ms"] for c in calls], 99),
                late_p99_ms=percentile([c["late_ms"] for c in calls], 99),
                slowest=[dict(wall_ms=wall[i], **calls[i]) for i in slowest])


def graph_replayer(stop: threading.Event) -> None:
    stream = torch.cuda.Stream()
    x = torch.randn(1, 3, 224, 224, device="cuda").half()
    net = torch.nn.Sequential(*[torch.nn.Conv2d(3 if i == 0 else 64, 64, 3, padding=1) for i in range(6)]).cuda().half()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.no_grad():
        net(x)
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            net(x)
    done = torch.cuda.Event()
    next_at = time.perf_counter()
    while not stop.is_set():
        time.sleep(max(0.0, next_at - time.perf_counter()))
        next_at += 4e-3
        with torch.cuda.stream(stream):
            graph.replay()
            done.record()
        done.synchronize()


def sleeper(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(1e-3)


def python_worker(stop: threading.Event) -> None:
    """A thread that runs Python between short sleeps (a server's request handling)."""
    while not stop.is_set():
        sum(i * i for i in range(2000))
        time.sleep(2e-4)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=2000)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    batch = octopus.RaggedBatch.from_tensors(
        [torch.randint(0, 256, (3, int(h), int(w)), generator=g, dtype=torch.uint8)
         for h, w in torch.randint(16, 65, (64, 2), generator=g)], device="cuda")
    scenarios = {
        "alone": [],
        "with a graph-replaying thread": [graph_replayer],
        "with a graph thread and two sleeping threads": [graph_replayer, sleeper, sleeper],
        "with a graph thread and two Python-busy threads": [graph_replayer, python_worker, python_worker],
    }
    results = {}
    default_interval = sys.getswitchinterval()
    for interval in (default_interval, 1e-4):
        sys.setswitchinterval(interval)
        for name, others in scenarios.items():
            for trace in (False, True):
                stop = threading.Event()
                threads = [threading.Thread(target=f, args=(stop,), daemon=True) for f in others]
                for t in threads:
                    t.start()
                time.sleep(0.2)
                try:
                    row = lc_loop(batch, args.iterations, 3.2e-3, trace)
                finally:
                    stop.set()
                    for t in threads:
                        t.join()
                key = f"{name}, switchinterval {interval:g}" + (", ops traced" if trace else "")
                results[key] = row
                print(f"{key:<90} p50 {row['p50_ms']:.3f} p99 {row['p99_ms']:.3f} max {row['max_ms']:.3f} "
                      f"launch p50 {row['launch_p50_ms']:.3f} p99 {row['launch_p99_ms']:.3f} late p99 "
                      f"{row['late_p99_ms']:.3f}", flush=True)
                if trace:
                    worst = row["slowest"][-1]
                    ops = sorted(worst["ops"], key=lambda o: -o[2])[:3]
                    gaps = [(worst["ops"][i][0], worst["ops"][i][1] - (worst["ops"][i - 1][1] + worst["ops"][i - 1][2]))
                            for i in range(1, len(worst["ops"]))]
                    print(f"    slowest {worst['wall_ms']:.3f} ms: longest ops {ops}; longest gap before "
                          f"{max(gaps, key=lambda g: g[1]) if gaps else None}", flush=True)
    sys.setswitchinterval(default_interval)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, octopus=octopus.__version__, results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

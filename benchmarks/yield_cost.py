"""Device yield, measured: what it costs a best-effort ragged kernel, and what it buys a
latency-critical job.

An experiment (not part of octopus-bench), CUDA only:

* cost: ``octopus.affine`` over a batch larger than L2, launched plainly and on a best-effort
  lease whose device yields (no latency-critical lease: the claiming kernel and its no-op
  links, nothing else), interleaved, CUDA events, the median of ``--repeats``;
* reaction: a latency-critical job (``--lc`` kernels of a small ``affine``) every ``--period``
  seconds beside a thread running that large ``affine`` back to back on a best-effort lease,
  device yield off and on, timed from the lease's acquire until its work is done (host clock):
  p50 / p99 over the LC job alone, and the best-effort thread's passes per second against alone.

    python benchmarks/yield_cost.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Optional

import torch

import octopus
from octopus._timing import percentile


def batch_of(elements: int, seed: int) -> octopus.RaggedBatch:
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(50_000, 150_001, (elements // 100_000,), generator=g)
    offsets = torch.zeros(len(sizes) + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=offsets[1:])
    values = torch.randn(int(offsets[-1]), device="cuda")
    return octopus.RaggedBatch(values, offsets.cuda(), sizes.view(-1, 1).cuda())


def cost(big: octopus.RaggedBatch, scale: torch.Tensor, repeats: int) -> Dict[str, Any]:
    """Kernel time of one affine over `big`, plain and yielding (interleaved), in ms."""
    sched = octopus.StreamScheduler(backend="cuda", latency_control=False, device_yield=True)
    plain_stream = torch.cuda.Stream()
    times: Dict[str, List[float]] = {"plain": [], "yielding": []}
    try:
        for i in range(repeats + 3):
            for name in ("plain", "yielding"):
                lease = sched.acquire("be", best_effort=True) if name == "yielding" else None
                stream = lease.stream if lease is not None else plain_stream
                with torch.cuda.stream(stream):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    octopus.affine(big, scale)
                    end.record()
                end.synchronize()
                if lease is not None:
                    lease.release()
                if i >= 3:
                    times[name].append(start.elapsed_time(end))
        launches = sched.stats()["devices"][0]["yielding_launches"]
    finally:
        sched.close()
    out: Dict[str, Any] = {k: statistics.median(v) for k, v in times.items()}
    out["yielding_launches"] = launches
    out["overhead"] = out["yielding"] / out["plain"] - 1
    return out


def reaction(big: octopus.RaggedBatch, scale: torch.Tensor, period: float, seconds: float, lc_kernels: int,
             device_yield: Optional[bool]) -> Dict[str, Any]:
    """LC latencies (ms) beside a BE thread (None: no BE thread), and the BE passes per second."""
    small = batch_of(2_000_000, 7)
    small_scale = torch.rand(len(small), device="cuda")
    sched = octopus.StreamScheduler(backend="cuda", latency_control=False, throttle="off",
                                    device_yield=bool(device_yield))
    stop = threading.Event()
    passes = [0]

    def best_effort() -> None:
        with sched.acquire("be", best_effort=True) as lease, torch.cuda.stream(lease.stream):
            while not stop.is_set():
                octopus.affine(big, scale)
                lease.checkpoint()
                passes[0] += 1
            torch.cuda.current_stream().synchronize()

    thread = threading.Thread(target=best_effort) if device_yield is not None else None
    latencies: List[float] = []
    try:
        if thread is not None:
            thread.start()
            time.sleep(0.3)
        begin = time.perf_counter()
        next_at = begin
        counted_from = passes[0]
        while time.perf_counter() - begin < seconds:
            next_at += period
            while time.perf_counter() < next_at:
                pass
            t0 = time.perf_counter()
            with sched.acquire("lc", priority="high") as lease, torch.cuda.stream(lease.stream):
                for _ in range(lc_kernels):
                    octopus.affine(small, small_scale)
                torch.cuda.current_stream().synchronize()
            latencies.append((time.perf_counter() - t0) * 1e3)
        elapsed = time.perf_counter() - begin
        done = passes[0] - counted_from
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        stats = sched.stats()["devices"][0]
        sched.close()
    return dict(p50_ms=percentile(latencies, 50), p99_ms=percentile(latencies, 99), jobs=len(latencies),
                be_passes_per_s=done / elapsed, gate_closes=stats["gate_closes"],
                yielding_launches=stats["yielding_launches"])


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elements", type=int, default=500_000_000)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--period", type=float, default=2e-3)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--lc", type=int, default=4, help="small affine kernels per LC job")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 1
    sys.setswitchinterval(2e-4)
    big = batch_of(args.elements, 0)
    scale = torch.rand(len(big), device="cuda")
    out: Dict[str, Any] = dict(device=torch.cuda.get_device_name(), elements=int(big.values.numel()))
    out["cost"] = cost(big, scale, args.repeats)
    print(f"affine over {out['elements']} elements: plain {out['cost']['plain']:.3f} ms, yielding "
          f"{out['cost']['yielding']:.3f} ms ({out['cost']['overhead']:+.1%})")
    alone_passes = None
    for name, mode in (("LC alone", None), ("BE alone", "be-alone"), ("device yield off", False),
                       ("device yield on", True)):
        if mode == "be-alone":
            start = time.perf_counter()
            n = 0
            while time.perf_counter() - start < args.seconds:
                octopus.affine(big, scale)
                n += 1
            torch.cuda.synchronize()
            alone_passes = n / (time.perf_counter() - start)
            out[name] = dict(be_passes_per_s=alone_passes)
            print(f"{name:18s} BE {alone_passes:.1f} passes/s")
            continue
        r = reaction(big, scale, args.period, args.seconds, args.lc, mode)
        out[name] = r
        alone = out["LC alone"]
        line = f"{name:18s} LC p50 {r['p50_ms']:.3f} ms ({r['p50_ms'] / alone['p50_ms']:.2f}x alone), " \
               f"p99 {r['p99_ms']:.3f} ms ({r['p99_ms'] / alone['p99_ms']:.2f}x)"
        if alone_passes:
            line += f", BE {r['be_passes_per_s'] / alone_passes:.0%} of alone"
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

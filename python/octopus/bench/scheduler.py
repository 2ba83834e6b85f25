"""``python -m octopus.bench.scheduler``: what leased streams buy for many independent jobs.

Workloads (inputs are random, allocated before timing)::

  small   1000 jobs, each four element-wise / reduction kernels on 64K-1M float32 elements
  matmul  64 jobs, each one 2048x2048 float32 matmul
  sync    256 jobs, each a 1024x1024 float32 matmul whose reduction is read back with
          .item() (a host synchronization per job, as post-processing code often has;
          no CUDA graph of it is possible)

Modes, side by side in one run: one stream in a Python loop; ``StreamScheduler.map`` with
K = 1, 2, 4, 8 leased streams; a CUDA graph of the one-stream loop (captured once,
replayed). Each is timed end to end on the host (all jobs issued, then synchronized),
median of repeats after warm-up. Also the acquire + release cost of one uncontended lease,
timed in C++ and from Python.

``--contention`` runs the scheduler's other benchmark instead: a latency-critical job beside
best-effort work (:mod:`octopus.bench.contention`; also ``octopus-bench contention``).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import octopus

from . import contention
from .costs import lease_overhead
from .report import environment
from .timing import wall_ms

STREAM_COUNTS = (1, 2, 4, 8)


def _small_job(x: torch.Tensor) -> torch.Tensor:
    return (x * 1.5 + 0.5).sin_().sum()


def _workloads(device: torch.device, scale: float) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    sizes = torch.randint(64 << 10, (1 << 20) + 1, (max(1, int(1000 * scale)),), generator=torch.Generator().manual_seed(0))
    small = [torch.randn(int(n), device=device, generator=g) for n in sizes]
    n = max(64, int(2048 * scale ** 0.5))
    weight = torch.randn(n, n, device=device, generator=g)
    mats = [torch.randn(n, n, device=device, generator=g) for _ in range(max(1, int(64 * scale)))]
    k = max(64, int(1024 * scale ** 0.5))
    sync_weight = torch.randn(k, k, device=device, generator=g)
    sync_items = [torch.randn(k, k, device=device, generator=g) for _ in range(max(1, int(256 * scale)))]
    return {
        "small": dict(fn=_small_job, items=small, describe=f"{len(small)} jobs x 4 kernels on 64K-1M fp32 elements"),
        "matmul": dict(fn=lambda a: a @ weight, items=mats, describe=f"{len(mats)} jobs x one {n}x{n} fp32 matmul"),
        "sync": dict(fn=lambda a: (a @ sync_weight).relu_().sum().item(), items=sync_items, graph=False,
                     describe=f"{len(sync_items)} jobs x one {k}x{k} fp32 matmul + .item()"),
    }


def _graph_of(fn, items):
    """The sequential loop captured as one CUDA graph (warmed up on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x in items[:3]:
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = [fn(x) for x in items]
    return graph, outputs


def run_workload(name: str, spec: dict, device: torch.device, warmup: int, repeats: int) -> list[dict]:
    fn, items = spec["fn"], spec["items"]
    reference = [fn(x) for x in items]
    rows = []

    def add(mode, streams, ms, outputs=None):
        row = dict(workload=name, mode=mode, streams=streams, jobs=len(items), total_ms=ms,
                   us_per_job=ms * 1e3 / len(items), jobs_per_s=len(items) / ms * 1e3)
        if outputs is not None:
            row["equal_to_sequential"] = all(_equal(a, b) for a, b in zip(outputs, reference))
        rows.append(row)

    add("one stream, Python loop", 1, wall_ms(lambda: [fn(x) for x in items], device, repeats, warmup))
    for k in STREAM_COUNTS:
        with octopus.StreamScheduler(k) as sched:
            ms = wall_ms(lambda: sched.map(fn, items, kind=name), device, repeats, warmup)
            add(f"map, {k} leased stream{'s' if k > 1 else ''}", k, ms, sched.map(fn, items, kind=name))
    if spec.get("graph", True):
        graph, outputs = _graph_of(fn, items)
        add("CUDA graph of the loop", 1, wall_ms(graph.replay, device, repeats, warmup), outputs)
    return rows


def _equal(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def format_table(rows: list[dict], overhead: list[dict], describe: dict) -> str:
    lines = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        lines += ["", f"{name}: {describe[name]}",
                  "{:<28}{:>10}{:>12}{:>12}{:>10}".format("mode", "total ms", "us / job", "jobs / s", "exact")]
        for r in (r for r in rows if r["workload"] == name):
            exact = {True: "yes", False: "NO", None: "-"}[r.get("equal_to_sequential")]
            lines.append("{:<28}{:>10.3f}{:>12.2f}{:>12.0f}{:>10}".format(r["mode"], r["total_ms"], r["us_per_job"],
                                                                      r["jobs_per_s"], exact))
    lines += ["", "uncontended acquire + release of one lease:"]
    for o in overhead:
        lines.append(f"  {o['backend']:<10} C++ {o['cpp_us']:.2f} us, Python (with-block) {o['python_us']:.2f} us")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--contention" in argv:
        argv.remove("--contention")
        return contention.main(argv)
    parser = argparse.ArgumentParser(prog="python -m octopus.bench.scheduler", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["small", "matmul", "sync"],
                        choices=["small", "matmul", "sync"])
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the number of jobs")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None, help="write the raw measurements here")
    args = parser.parse_args(argv)
    if args.scale <= 0 or args.repeats < 1:
        parser.error("--scale must be positive and --repeats at least 1")

    has_cuda = torch.cuda.is_available() and octopus.built_with_cuda
    device = torch.device("cuda" if has_cuda else "cpu")
    overhead = [lease_overhead("simulated")]
    rows, describe = [], {}
    if has_cuda:
        overhead.insert(0, lease_overhead("cuda"))
        specs = _workloads(device, args.scale)
        for name in args.workloads:
            describe[name] = specs[name]["describe"]
            rows += run_workload(name, specs[name], device, warmup=2, repeats=args.repeats)
    else:
        print("no CUDA device: only the lease overhead on the simulated backend is measured", file=sys.stderr)
    print(format_table(rows, overhead, describe))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(environment=environment(device), workloads=describe, rows=rows, lease_overhead=overhead),
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The serving benchmark's run and command line: every mode at every rate, the single-shape
scenario, the high-priority-only runs, and the raw JSON."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Callable, List

import torch

import octopus
from octopus.diffusion.model_runner import CapturedCalls

from ..energy import GpuSampler
from ..report import environment
from .measure import high_p99_over_unloaded, summarize
from .octopus_server import OctopusServer, unloaded_latencies
from .peers import derived_serial, prepare_peer_graphs, run_serial, run_static, run_step_level
from .report import format_table, plot
from .pipeline import DEFAULT_PIPELINE_MODES, PIPELINE_MODES, format_pipeline_table
from .pipeline import run as run_pipeline
from .workload import MODELS, MODES, SAMPLERS, SHAPES, make_model, make_workload


def run_mode(mode: str, model, workload, args, device, dtype, servers: dict,
             peer_graphs: CapturedCalls | None = None) -> dict:
    runners: dict[str, Callable[[], dict]] = {
        "serial": lambda: run_serial(model, workload, device, dtype, args.run_timeout),
        "static": lambda: run_static(model, workload, device, dtype, args.run_timeout, args.max_batch,
                                     args.static_wait),
        "step-level": lambda: run_step_level(model, workload, device, dtype, args.run_timeout, args.max_batch),
        "step-level-graphs": lambda: run_step_level(model, workload, device, dtype, args.run_timeout, args.max_batch,
                                                    graphs=peer_graphs),
        "octopus": lambda: servers["octopus"].run(workload, args.run_timeout),
        "octopus-graphs": lambda: servers["octopus-graphs"].run(workload, args.run_timeout),
        "octopus-priority": lambda: (servers.get("octopus-graphs") or servers["octopus"]).run(
            workload, args.run_timeout, preempt=True, high_priority_batch=args.priority_batch),
        "octopus-lane": lambda: servers["octopus-lane"].run(workload, args.run_timeout),
        "octopus-lane-priority": lambda: servers["octopus-lane"].run(
            workload, args.run_timeout, preempt=True, high_priority_batch=args.priority_batch),
        "octopus-lane-yield": lambda: servers["octopus-lane"].run(
            workload, args.run_timeout, preempt=True, normal_lane_pause=args.normal_lane_pause),
    }
    with GpuSampler(device) as gpu:
        wall = time.perf_counter()
        raw = runners[mode]()
        wall = time.perf_counter() - wall
    row = summarize(workload, raw["completions"])
    row.update(mode=mode, wall_s=wall, gpu_utilization=gpu.mean("utilization"),
               sm_clock_mhz=gpu.mean("sm_clock_mhz"), truncated=row["completed"] < len(workload),
               **{k: v for k, v in raw.items() if k != "completions"})
    return row


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    model = make_model(args.model, device, dtype)
    # octopus-priority runs on the graphs' sampler (or, without graphs, the eager one).
    wanted = set(args.modes) | ({"octopus-graphs" if device.type == "cuda" else "octopus"}
                                if "octopus-priority" in args.modes else set()) | (
        {"octopus-lane"} if {"octopus-lane-priority", "octopus-lane-yield"} & set(args.modes) else set())
    servers = {mode: OctopusServer(model, device, dtype, args.max_batch,
                                  mode == "octopus-graphs" or (mode == "octopus-lane" and device.type == "cuda"),
                                  len(args.shapes), args.max_in_flight, priority_lane=mode == "octopus-lane",
                                  priority_batch=args.priority_batch)
               for mode in ("octopus", "octopus-graphs", "octopus-lane") if mode in wanted}
    try:
        peer_graphs = None
        if "step-level-graphs" in args.modes:  # the strongest plain server: its model calls in CUDA graphs
            peer_graphs = CapturedCalls(model, 2 * args.max_batch * len(args.shapes), device)
            print("warm-up: step-level-graphs (capturing CUDA graphs)", file=sys.stderr)
            prepare_peer_graphs(peer_graphs, args.shapes, range(1, args.max_batch + 1), device, dtype)
        return _run(args, device, dtype, model, servers, peer_graphs)
    finally:
        for server in servers.values():
            server.close()


def _run(args, device, dtype, model, servers, peer_graphs: CapturedCalls | None) -> dict:
    rows, scenarios = [], []
    base = make_workload(args.requests, 1.0, args.seed, args.high_share, shapes=args.shapes, steps=args.steps)
    warm = [dict(r, arrival=r["arrival"] / max(args.rates)) for r in base[:min(len(base), 2 * args.max_batch)]]
    for mode, server in servers.items():
        print(f"warm-up: {mode}" + (" (capturing CUDA graphs)" if server.graphs else ""), file=sys.stderr)
        server.prepare(args.shapes)
        server.run(warm, args.run_timeout)
    unloaded = {}
    if args.high_share > 0 and servers:
        unloaded = unloaded_latencies((servers.get("octopus-graphs") or next(iter(servers.values()))).submit, base)
    serial_service = None
    high_only: List[dict] = []
    for rate in sorted(args.rates):
        workload = [dict(r, arrival=r["arrival"] / rate) for r in base]
        for mode in args.modes:
            if mode == "serial" and serial_service is not None:
                row = summarize(workload, derived_serial(workload, serial_service))
                row.update(mode=mode, derived=True)
            else:
                print(f"rate {rate:g}/s: {mode}", file=sys.stderr)
                row = run_mode(mode, model, workload, args, device, dtype, servers, peer_graphs)
                if mode == "serial":
                    serial_service = row.pop("service_s")
                    check = summarize(workload, derived_serial(workload, serial_service))
                    row["derived_check"] = dict(p50_s=check["p50_s"], p99_s=check["p99_s"])
            row["rate"] = rate
            row["high_p99_over_unloaded"] = high_p99_over_unloaded(row, unloaded)
            rows.append(row)
        if "octopus-lane-yield" in args.modes and unloaded:
            high_only.append(dict(rate=rate, **_high_only(servers["octopus-lane"], workload, args, unloaded)))
    if args.single:
        # A quarter of the requests: every step of them is a large model call.
        single = make_workload(max(1, args.requests // 4), max(args.rates), args.seed + 1, 0.0,
                               shapes=[args.shapes[-1]], samplers=[SAMPLERS[0]], steps=(args.steps[1], args.steps[1]))
        # No high-priority requests here: octopus-priority would be octopus-graphs again.
        for mode in (m for m in args.modes if m not in ("serial", "octopus-priority", "octopus-lane",
                                                        "octopus-lane-priority", "octopus-lane-yield")):
            print(f"single shape: {mode}", file=sys.stderr)
            row = run_mode(mode, model, single, args, device, dtype, servers, peer_graphs)
            row.update(rate=max(args.rates), scenario="single")
            scenarios.append(row)
    return dict(environment=environment(device), model=dict(name=args.model, config=MODELS[args.model],
                                                            parameters=sum(p.numel() for p in model.parameters()),
                                                            dtype=str(dtype)),
                settings={k: v for k, v in vars(args).items() if k != "out"}, rows=rows, scenarios=scenarios,
                unloaded_high_s={str(k): v for k, v in unloaded.items()}, high_only=high_only)


def _high_only(server: OctopusServer, workload: list[dict], args, unloaded: dict) -> dict:
    """The high-priority requests of `workload` by themselves, at their arrival times, as
    octopus-lane-yield serves them: what they cost one another (they share the priority
    lane), a floor under their latency whatever is done with the other requests."""
    high = [r for r in workload if r["high"]]
    with GpuSampler(server.sampler.device) as gpu:
        raw = server.run(high, args.run_timeout, preempt=True, normal_lane_pause=args.normal_lane_pause)
    row = summarize(high, raw["completions"])
    return dict(completed=row["completed"], requests=row["requests"], high_p50_s=row["high_p50_s"],
                high_p99_s=row["high_p99_s"], high_p99_over_unloaded=high_p99_over_unloaded(row, unloaded),
                latencies=row["latencies"], iterations=raw["iterations"], sm_clock_mhz=gpu.mean("sm_clock_mhz"))


def build_parser() -> argparse.ArgumentParser:
    from octopus.bench import serving  # the package's docstring describes the benchmark
    p = argparse.ArgumentParser(prog="python -m octopus.bench.serving", description=serving.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pipeline", default=None, choices=("sd", "tiny"),
                   help="serve text-to-image end to end instead (prompts in, images out) with a random-weight "
                        "Stable Diffusion pipeline of these shapes; its modes: " + ", ".join(PIPELINE_MODES))
    p.add_argument("--requests", type=int, default=None, help="default: 256 (latents), 48 (--pipeline)")
    p.add_argument("--shapes", nargs="+", default=["x".join(map(str, s)) for s in SHAPES], metavar="CxHxW",
                   help="latent shapes, drawn in equal shares (default: 4x32x32 4x64x64 4x96x96)")
    p.add_argument("--steps", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help="steps per request, drawn uniformly (default: 10 50; --pipeline: 10 30)")
    p.add_argument("--rates", type=float, nargs="+", default=[24.0, 64.0, 160.0], help="arrivals per second")
    p.add_argument("--modes", nargs="+", default=None, choices=list(MODES) + ["pipeline"],
                   help="default: every mode of the benchmark run")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--static-wait", type=float, default=0.05, help="(b): seconds a batch waits to fill")
    p.add_argument("--priority-batch", type=int, default=8,
                   help="octopus-priority: the batch cap while high-priority requests run; octopus-lane and "
                        "--pipeline's octopus: the priority lane's batch sizes captured up front")
    p.add_argument("--normal-lane-pause", type=float, default=math.inf,
                   help="octopus-lane-yield and --pipeline's octopus: seconds the other samples pause at a "
                        "time while high-priority ones run (default: inf, strict priority)")
    p.add_argument("--high-share", type=float, default=0.1)
    p.add_argument("--max-in-flight", type=int, default=2,
                   help="(d): iterations the sampler issues ahead of the GPU (ContinuousSampler's max_in_flight)")
    p.add_argument("--model", default=None, choices=sorted(MODELS), help="default: realistic on a GPU, tiny on a CPU")
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-timeout", type=float, default=60.0, help="seconds after which a run stops (marked truncated)")
    p.add_argument("--no-single", dest="single", action="store_false", help="skip the single-shape scenario")
    p.add_argument("--out", default="octopus-bench-results", help="directory for serving.json and the plot")
    p.add_argument("--no-plots", action="store_true")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    pipeline = args.pipeline is not None
    args.requests = args.requests if args.requests is not None else (48 if pipeline else 256)
    args.steps = args.steps or ([10, 30] if pipeline else [10, 50])
    args.modes = args.modes or list(DEFAULT_PIPELINE_MODES if pipeline else MODES)
    wrong = [m for m in args.modes if m not in (PIPELINE_MODES if pipeline else MODES)]
    if wrong:
        parser.error(f"--modes {' '.join(wrong)} {'are' if len(wrong) > 1 else 'is'} not a mode of this run; "
                     f"its modes: {' '.join(PIPELINE_MODES if pipeline else MODES)}")
    if (args.requests < 1 or args.max_batch < 1 or args.max_in_flight < 1 or any(r <= 0 for r in args.rates)
            or not 0 <= args.high_share <= 1):
        parser.error("--requests, --max-batch and --max-in-flight must be positive, --rates positive, "
                     "--high-share in [0, 1]")
    try:
        args.shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    except ValueError:
        parser.error(f"--shapes must look like 4x64x64, got {args.shapes}")
    if not 1 <= args.steps[0] <= args.steps[1]:
        parser.error(f"--steps must be 1 <= MIN <= MAX, got {args.steps}")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and octopus.built_with_cuda else "cpu"
    if pipeline:
        return _main_pipeline(args)
    if args.model is None:
        args.model = "realistic" if args.device.startswith("cuda") else "tiny"
    if torch.device(args.device).type == "cpu":
        print("No GPU in use: a CPU smoke run (times are CPU times, not the GPU benchmark; no CUDA graphs).",
              file=sys.stderr)
        args.modes = [m for m in args.modes if m not in ("octopus-graphs", "step-level-graphs")]
    os.makedirs(args.out, exist_ok=True)
    result = run(args)
    if not args.no_plots:
        try:
            result["plot"] = plot(result, args.out)
        except ImportError:
            print("(no plot: matplotlib is not installed)", file=sys.stderr)
    return _write(result, os.path.join(args.out, "serving.json"), format_table(result))


def _write(result: dict, path: str, table: str) -> int:
    """The raw JSON to ``path``, the table to stdout."""
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(table)
    print(f"\nraw measurements: {path}")
    return 0


def _main_pipeline(args) -> int:
    """``--pipeline``: text-to-image end to end (pipeline.py)."""
    if torch.device(args.device).type == "cpu":
        print("No GPU in use: a CPU smoke run (times are CPU times, not the GPU benchmark; no CUDA graphs).",
              file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    result = run_pipeline(args)
    return _write(result, os.path.join(args.out, "serving_pipeline.json"), format_pipeline_table(result))

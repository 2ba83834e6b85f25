#!/usr/bin/env python3
"""Serving diffusion: requests from several client threads through one continuously refilled
batch (``octopus.diffusion.ContinuousSampler``), with latency percentiles per priority.

Clients: ``--clients`` threads share a stream of ``--requests`` requests arriving at
``--rate`` per second overall (Poisson; each client submits its share at their arrival times
without waiting for earlier results). Each request draws its latent shape (``--shapes``), its
sampler (DDIM, Euler, flow-matching Euler, DPM-Solver++ 2M, UniPC) and its step count
(``--steps``); ``--high-share`` of them have priority "high" and must start within
``--high-deadline`` seconds (else they fail with ``octopus.DeadlineMissed``).

Server: one ``ContinuousSampler`` over a diffusers ``UNet2DModel`` with random weights built
from a config (nothing is downloaded; ``--model realistic``: 25.3M parameters, float16, the
default on a GPU; ``--model tiny`` on a CPU). Requests join the running batch at any step and
leave when done; every iteration runs the model once per latent shape and steps every sample
with one fused kernel, each at its own timestep of its own sampler. A high-priority request
waiting for a place parks lower-priority samples (they resume where they stopped);
``--priority-batch`` also caps the batch while one runs. On a GPU the model calls are CUDA
graphs captured before the run (``--no-cuda-graphs``: eager), and the shapes' calls run
concurrently on streams leased from an ``octopus.StreamScheduler``. An ``octopus.Batcher``
shares that scheduler: as each sample finishes, its latents go to the Batcher, which packs
the finished latents of any shapes into one ``RaggedBatch`` per call and makes a thumbnail
of each (``normalize`` per sample and channel, ``crop_resize`` to ``--thumbnail`` pixels a
side: the same few launches whatever the mix of shapes). On the CPU the Batcher's leases are
simulated.

Printed and written as JSON: latency (from ``submit`` to the finished latents) p50/p90/p99
overall and per priority, the time queued before the first step, throughput (images/s and
sample steps/s over the run), how many requests failed or missed their deadline, the mean
batch, the Batcher's calls, and every request's record. Checked and asserted: a few requests
(one per sampler, the two smallest shapes) served together again by the same model in
float64 on the CPU give the latents diffusers' own scheduler gives for each request run
alone (to 1e-6 of the largest value), and the thumbnails equal plain PyTorch's
(mean/std, ``F.interpolate``) to 1e-4.

    python3 examples/serve_diffusion.py                   # realistic UNet on cuda: 256 requests, 8 clients
    python3 examples/serve_diffusion.py --rate 160 --priority-batch 8 --json serve.json
    python3 examples/serve_diffusion.py --tiny --device cpu
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import itertools
import math
import os
import statistics
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import octopus
from octopus import diffusion
from octopus.bench.serving import MODELS, SAMPLERS, DiffusersRequest, make_model, make_workload

import example_harness as harness

SCHEMA = "octopus-examples/serve-diffusion/1"
# Largest latent difference over the largest latent value. Not 1e-6: a 6-step DDIM request
# differed by 1.38e-6 on the H100 (float64 on both sides; diffusers keeps its schedule tables in
# float32, the suspected source; not isolated).
CHECK_TOLERANCE = 1e-5
THUMBNAIL_TOLERANCE = 1e-4   # thumbnails (float32) against float64 PyTorch, absolute
THUMBNAIL_EPS = 1e-5         # added to each channel's variance, as instance_norm does
THUMBNAILS_CHECKED = 8
PRIORITIES = ("high", "normal")
SAMPLER_COUNTERS = ("submitted", "completed", "failed", "cancelled", "expired", "parked", "iterations", "sample_steps",
                    "graphs_captured", "normal_lane_paused_s")

Shape = Tuple[int, ...]


class Sizes(NamedTuple):
    """A run's sizes: the defaults for the device (and --tiny), each overridden by its option."""
    model: str
    shapes: List[Shape]
    steps: Tuple[int, int]
    requests: int
    clients: int
    rate: float
    max_batch: int
    high_deadline: float
    thumbnail: int


DEFAULTS = {  # cuda, cpu, tiny
    "cuda": Sizes("realistic", [(4, 32, 32), (4, 64, 64), (4, 96, 96)], (10, 50), 256, 8, 64.0, 32, 0.5, 64),
    "cpu": Sizes("tiny", [(4, 16, 16), (4, 24, 24), (4, 32, 32)], (5, 20), 32, 4, 4.0, 8, 2.0, 32),
    "tiny": Sizes("tiny", [(4, 8, 8), (4, 8, 16), (4, 16, 8)], (2, 6), 16, 3, 200.0, 6, 5.0, 16),
}


class Served(NamedTuple):
    records: List[Dict]                         # one per request, JSON-ready
    results: Dict[int, diffusion.SampleResult]  # the completed requests' results by id
    thumbnails: Dict[int, torch.Tensor]         # their thumbnails by id (with a Batcher)
    wall_s: float                               # from the first arrival to the last request's latents


# -- the server and its clients ---------------------------------------------------------


def thumbnails_of(batch: octopus.RaggedBatch, size: int) -> torch.Tensor:
    """The Batcher's call: finished latents of any shapes, packed back to back, to
    ``[n, C, size, size]`` thumbnails, each channel of each at zero mean and unit variance
    (``normalize`` per item and channel, then ``crop_resize`` of every whole item)."""
    channels = batch.item_shapes()[0][0]
    normalized = octopus.normalize(batch, channels, eps=THUMBNAIL_EPS)
    whole = torch.tensor([(i, 0, 0, h, w) for i, (_, h, w) in enumerate(batch.item_shapes())], device=batch.device)
    return octopus.crop_resize(normalized, whole, size, validate=False)


def serve(sampler: diffusion.ContinuousSampler, workload: List[Dict], clients: int, high_deadline: Optional[float],
          thumbnails: Optional[octopus.Batcher] = None) -> Served:
    """Runs ``workload`` (``make_workload``'s requests) through ``sampler`` from ``clients``
    threads, request ``i`` from client ``i % clients`` at its arrival time; waits for every
    request (and its thumbnail)."""
    finished_at: Dict[int, float] = {}  # written on the sampler's finishing thread before each future resolves
    start = time.perf_counter()

    def finished(request_id: int, priority: str):
        def callback(latents: torch.Tensor) -> Optional[concurrent.futures.Future]:
            # On the sampler's finishing thread, the latents ready; what it returns is the
            # result's output: here the future of (thumbnail, when it was ready).
            finished_at[request_id] = time.perf_counter()
            if thumbnails is None:
                return None
            made: concurrent.futures.Future = concurrent.futures.Future()

            def thumbnail_made(future: concurrent.futures.Future) -> None:
                error = future.exception()
                if error is None:
                    made.set_result((future.result(), time.perf_counter()))
                else:
                    made.set_exception(error)
            thumbnails.submit(latents.float(), priority=priority).add_done_callback(thumbnail_made)
            return made
        return callback

    def client(k: int) -> List[Tuple[Dict, float, concurrent.futures.Future]]:
        submitted = []
        for spec in workload[k::clients]:
            time.sleep(max(0.0, spec["arrival"] - (time.perf_counter() - start)))
            priority = "high" if spec["high"] else "normal"
            at = time.perf_counter()
            future = sampler.submit(shape=spec["shape"], scheduler=spec["scheduler"], scheduler_config=spec["config"],
                                    num_inference_steps=spec["steps"], seed=spec["seed"], priority=priority,
                                    deadline=high_deadline if spec["high"] else None,
                                    callback=finished(spec["id"], priority))
            submitted.append((spec, at, future))
        concurrent.futures.wait([f for _, _, f in submitted])
        return submitted

    with concurrent.futures.ThreadPoolExecutor(clients, thread_name_prefix="client") as pool:
        per_client = list(pool.map(client, range(clients)))

    records, results, thumbs = [], {}, {}
    for k, submitted in enumerate(per_client):
        for spec, at, future in submitted:
            record = dict(id=spec["id"], client=k, shape=list(spec["shape"]), scheduler=spec["scheduler"],
                          steps=spec["steps"], priority="high" if spec["high"] else "normal",
                          deadline_s=high_deadline if spec["high"] else None, submitted_s=at - start)
            error = future.exception()
            if error is None:
                result = future.result()
                results[spec["id"]] = result
                record.update(status="completed", latency_s=finished_at[spec["id"]] - at, queued_s=result.queued_s,
                              sampling_s=result.sampling_s)
                if thumbnails is not None:
                    thumbs[spec["id"]], made_at = result.output.result()
                    record["thumbnail_s"] = made_at - finished_at[spec["id"]]
            else:
                record.update(status="deadline_missed" if isinstance(error, octopus.DeadlineMissed) else "failed",
                              error=f"{type(error).__name__}: {error}")
            records.append(record)
    wall = max(finished_at.values(), default=start) - start
    return Served(sorted(records, key=lambda r: r["id"]), results, thumbs, wall)


def latency_rows(records: List[Dict]) -> List[Dict]:
    """Counts and latency percentiles (ms) of all requests and of each priority."""
    rows = []
    for name in ("all",) + PRIORITIES:
        mine = [r for r in records if name in ("all", r["priority"])]
        done = [r for r in mine if r["status"] == "completed"]
        latency = [1e3 * r["latency_s"] for r in done]
        row = dict(priority=name, requests=len(mine), completed=len(done),
                   deadline_missed=sum(r["status"] == "deadline_missed" for r in mine),
                   failed=sum(r["status"] == "failed" for r in mine))
        for q in (50, 90, 99):
            row[f"p{q}_ms"] = harness.percentile(latency, q) if latency else None
        row["queued_p50_ms"] = harness.percentile([1e3 * r["queued_s"] for r in done], 50) if done else None
        rows.append(row)
    return rows


def iteration_summary(timings: List[Dict]) -> Dict:
    """The sampler's iterations: how many, the mean and largest batch, the mean number of
    model calls (latent shapes) per iteration, median times (ms)."""
    if not timings:
        return dict(iterations=0)
    return dict(iterations=len(timings), mean_batch=statistics.fmean(t["samples"] for t in timings),
                max_batch=max(t["samples"] for t in timings),
                mean_groups=statistics.fmean(t["groups"] for t in timings),
                iteration_ms_median=statistics.median(t["iteration"] for t in timings),
                step_ms_median=statistics.median(t["step"] for t in timings))


def run_server(model: torch.nn.Module, streams: octopus.StreamScheduler, workload: List[Dict], sizes: Sizes,
               cuda_graphs: bool, priority_batch: Optional[int],
               priority_lane: bool = False, strict_priority: bool = False) -> Tuple[Served, Dict, Dict]:
    """The sampler and the thumbnail Batcher, both leasing from ``streams``: warmed up (a
    short request per shape, untimed), then ``workload`` served from ``sizes.clients``
    threads. Returns what was served, the sampler's counters and iterations over the run,
    and the Batcher's calls and latencies."""
    warmup = [dict(id=-1 - k, arrival=0.0, shape=shape, scheduler=name, config=config, steps=2, high=False, seed=k)
              for k, (shape, (name, config)) in enumerate(zip(sizes.shapes, itertools.cycle(SAMPLERS)))]
    with diffusion.ContinuousSampler(model, max_batch=sizes.max_batch, stream_scheduler=streams,
                                     cuda_graphs=cuda_graphs, max_graphs=2 * sizes.max_batch * len(sizes.shapes),
                                     preempt=True, high_priority_batch=priority_batch,
                                     priority_lane=priority_lane, normal_lane_pause=math.inf if strict_priority else 0.0,
                                     record_iterations=True) as sampler, \
            octopus.Batcher(lambda batch: thumbnails_of(batch, sizes.thumbnail), max_batch=sizes.max_batch,
                            max_delay=0.002, scheduler=streams, kind="thumbnails") as thumbnails:
        if cuda_graphs:
            sampler.prepare_graphs(sizes.shapes, range(1, sizes.max_batch + 1))
        serve(sampler, warmup, 1, None)
        sampler.iteration_timings()  # drops the warm-up's
        before, calls_before = sampler.stats(), thumbnails.stats()["batches"]
        served = serve(sampler, workload, sizes.clients, sizes.high_deadline, thumbnails)
        counts = {k: v - before[k] for k, v in sampler.stats().items() if k in SAMPLER_COUNTERS}
        iterations = iteration_summary(sampler.iteration_timings())
        calls = thumbnails.stats()["batches"] - calls_before
    thumbnail_ms = [1e3 * r["thumbnail_s"] for r in served.records if "thumbnail_s" in r]
    thumbnail_stats = dict(requests=len(served.thumbnails), calls=calls,
                           mean_batch=len(served.thumbnails) / calls if calls else None,
                           p50_ms=harness.percentile(thumbnail_ms, 50) if thumbnail_ms else None,
                           p99_ms=harness.percentile(thumbnail_ms, 99) if thumbnail_ms else None)
    return served, dict(counts, **iterations), thumbnail_stats


# -- the cross-checks ---------------------------------------------------------------------


def check_workload(shapes: Sequence[Shape], steps: Tuple[int, int], count: int, seed: int) -> List[Dict]:
    """``count`` requests for the float64 check, arriving together: sampler ``k % 5``, the
    two smallest shapes in turn, at most 6 steps (the model runs in float64 on the CPU)."""
    smallest = sorted(set(shapes), key=lambda s: (torch.Size(s).numel(), s))[:2]
    low, high = min(steps[0], 6), min(steps[1], 6)
    return [dict(id=k, arrival=0.0, shape=smallest[k % len(smallest)], scheduler=SAMPLERS[k % len(SAMPLERS)][0],
                 config=SAMPLERS[k % len(SAMPLERS)][1], steps=low + k % (high - low + 1), high=k == 0,
                 seed=seed + 100_000 + k) for k in range(count)]


@torch.no_grad()
def diffusers_alone(model: torch.nn.Module, spec: Dict) -> torch.Tensor:
    """What a user writes today: the request alone through diffusers' scheduler, in float64
    on the CPU (a pipeline's loop: init_noise_sigma, scale_model_input, the model, step)."""
    request = DiffusersRequest(spec, torch.device("cpu"), torch.float64)
    while not request.step(model(request.model_input(), request.t).sample):
        pass
    return request.x[0]


def compare_with_diffusers(model: torch.nn.Module, specs: List[Dict], latents: Dict[int, torch.Tensor]) -> List[Dict]:
    """Each request's served latents against ``diffusers_alone`` (asserted within
    CHECK_TOLERANCE of the largest value); one record per request."""
    out = []
    for spec in specs:
        harness.require(spec["id"] in latents, f"check request {spec['id']} did not complete")
        expected, got = diffusers_alone(model, spec), latents[spec["id"]]
        harness.require(got.shape == expected.shape, f"check request {spec['id']}: shape {tuple(got.shape)}, "
                                                     f"diffusers {tuple(expected.shape)}")
        diff = float((got.double() - expected).abs().max() / expected.abs().max())
        harness.require(diff <= CHECK_TOLERANCE, f"check request {spec['id']} ({spec['scheduler']}, "
                                                 f"{spec['steps']} steps, {spec['shape']}): octopus and diffusers "
                                                 f"differ by {diff:.2e} of the largest value > {CHECK_TOLERANCE:g}")
        out.append(dict(id=spec["id"], scheduler=spec["scheduler"], shape=list(spec["shape"]), steps=spec["steps"],
                        max_relative_diff=diff))
    return out


def check_against_diffusers(model: torch.nn.Module, specs: List[Dict], clients: int) -> Dict:
    """``specs`` served together from ``clients`` threads by a float64 CPU copy of ``model``,
    then each compared with diffusers alone."""
    reference = copy.deepcopy(model).to(device="cpu", dtype=torch.float64)
    with diffusion.ContinuousSampler(reference, max_batch=len(specs)) as sampler:
        served = serve(sampler, specs, clients, high_deadline=None)
    requests = compare_with_diffusers(reference, specs, {i: r.latents for i, r in served.results.items()})
    return dict(tolerance=CHECK_TOLERANCE, dtype="float64", device="cpu", requests=requests,
                max_relative_diff=max(r["max_relative_diff"] for r in requests))


def check_thumbnails(served: Served, size: int) -> Dict:
    """A few thumbnails against plain PyTorch in float64: each channel's mean and population
    variance, ``F.interpolate`` (bilinear, align_corners=False); asserted within
    THUMBNAIL_TOLERANCE."""
    ids = sorted(served.thumbnails)[:THUMBNAILS_CHECKED]
    harness.require(bool(ids), "no thumbnail was made")
    diffs = []
    for i in ids:  # on the CPU: the Batcher may have placed a call on another GPU
        x = served.results[i].latents.cpu().float().double()
        mean, var = x.mean(dim=(1, 2), keepdim=True), x.var(dim=(1, 2), keepdim=True, correction=0)
        expected = F.interpolate(((x - mean) / (var + THUMBNAIL_EPS).sqrt())[None], size=(size, size), mode="bilinear",
                                 align_corners=False)[0]
        diffs.append((served.thumbnails[i].cpu().double() - expected).abs().max())
    diff = float(torch.stack(diffs).max())  # NaN if any is
    harness.require(diff <= THUMBNAIL_TOLERANCE, f"thumbnails differ from PyTorch's by {diff} > {THUMBNAIL_TOLERANCE}")
    return dict(checked=len(ids), max_abs_diff=diff, tolerance=THUMBNAIL_TOLERANCE)


# -- the command line ---------------------------------------------------------------------


def latent_shape(text: str) -> Shape:
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"a latent shape looks like 4x64x64 (CxHxW), got {text!r}")
    return shape


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def default_text(field: str) -> str:
    """``(default A on cuda, B on cpu, C with --tiny)`` for a field of :class:`Sizes`."""
    def show(value) -> str:
        if isinstance(value, list):  # shapes
            return " ".join("x".join(map(str, shape)) for shape in value)
        if isinstance(value, tuple):  # steps
            return " ".join(map(str, value))
        return f"{value:g}" if isinstance(value, float) else str(value)
    cuda, cpu, tiny = (show(getattr(DEFAULTS[k], field)) for k in ("cuda", "cpu", "tiny"))
    return f"(default {cuda} on cuda, {cpu} on cpu, {tiny} with --tiny)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default=None,
                   help=f"the UNet2DModel's size {default_text('model')}")
    p.add_argument("--shapes", type=latent_shape, nargs="+", default=None, metavar="CxHxW",
                   help=f"latent shapes, drawn in equal shares {default_text('shapes')}")
    p.add_argument("--steps", type=harness.positive_int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help=f"steps per request, drawn uniformly {default_text('steps')}")
    p.add_argument("--requests", type=harness.positive_int, default=None,
                   help=f"requests in all {default_text('requests')}")
    p.add_argument("--clients", type=harness.positive_int, default=None,
                   help=f"client threads submitting them {default_text('clients')}")
    p.add_argument("--rate", type=float, default=None,
                   help=f"arrivals per second, all clients together {default_text('rate')}")
    p.add_argument("--high-share", type=float, default=0.2, help="share of high-priority requests (default 0.2)")
    p.add_argument("--high-deadline", type=float, default=None,
                   help=f"seconds within which a high-priority request must start {default_text('high_deadline')}")
    p.add_argument("--max-batch", type=harness.positive_int, default=None,
                   help=f"samples stepped at once {default_text('max_batch')}")
    p.add_argument("--priority-batch", type=harness.positive_int, default=None,
                   help="cap the batch at this many samples while high-priority requests wait or run, so that their "
                        "iterations stay short (default: no cap)")
    p.add_argument("--priority-lane", action="store_true",
                   help="iterate high-priority requests in a lane of their own, concurrently with the others")
    p.add_argument("--strict-priority", action="store_true",
                   help="the priority lane, and the other requests' iterations paused while it has samples "
                        "(normal_lane_pause=inf): high-priority requests get the GPU as if alone")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="capture every (shape, batch) model call as a CUDA graph before the run and replay them "
                        "(default: on with cuda)")
    p.add_argument("--thumbnail", type=harness.positive_int, default=None,
                   help=f"the Batcher's thumbnails are C x S x S {default_text('thumbnail')}")
    p.add_argument("--check-requests", type=non_negative_int, default=5,
                   help="requests re-run in float64 against diffusers alone (default 5: one per sampler; 0: none)")
    harness.add_common_options(p, "serve-diffusion", passes=False)
    return p


def resolve_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace, device: torch.device) -> Sizes:
    base = DEFAULTS["tiny" if args.tiny else device.type]
    sizes = Sizes(*(getattr(args, name) if getattr(args, name) is not None else value
                    for name, value in zip(Sizes._fields, base)))
    sizes = sizes._replace(steps=tuple(sizes.steps))
    if sizes.steps[0] > sizes.steps[1]:
        parser.error(f"--steps MIN {sizes.steps[0]} is larger than MAX {sizes.steps[1]}")
    multiple = 2 ** (len(MODELS[sizes.model]["block_out_channels"]) - 1)  # the UNet halves H and W per level
    for c, h, w in sizes.shapes:
        if c != 4 or h % multiple or w % multiple:
            parser.error(f"--shapes: the {sizes.model} UNet takes 4 channels and H, W multiples of {multiple}, "
                         f"got {c}x{h}x{w}")
    if not sizes.rate > 0 or not sizes.high_deadline > 0 or not 0 <= args.high_share <= 1:
        parser.error("--rate and --high-deadline must be positive, --high-share in [0, 1]")
    if args.cuda_graphs and device.type != "cuda":
        parser.error("--cuda-graphs needs --device cuda")
    if args.cuda_graphs is None:
        args.cuda_graphs = device.type == "cuda"
    return sizes


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.priority_lane = args.priority_lane or args.strict_priority  # strict priority pauses for that lane
    device = harness.resolve_device(parser, args.device)
    sizes = resolve_sizes(parser, args, device)
    try:
        from diffusers.utils import logging as diffusers_logging
    except ImportError:
        parser.error("this example needs diffusers (pip install diffusers)")
    diffusers_logging.set_verbosity_error()  # its note on casting a model's dtype with .to()
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    model = make_model(sizes.model, device, dtype)
    # One scheduler for the whole process: the sampler's model calls and the Batcher's calls
    # lease streams from it (simulated on the CPU, where the sampler runs its calls inline).
    workload = make_workload(sizes.requests, sizes.rate, args.seed, args.high_share, shapes=sizes.shapes,
                             steps=sizes.steps)
    with octopus.StreamScheduler(4, backend="cuda" if device.type == "cuda" else "simulated") as streams:
        served, sampler_stats, thumbnail_stats = run_server(model, streams, workload, sizes, args.cuda_graphs,
                                                            args.priority_batch, args.priority_lane,
                                                            args.strict_priority)
        lease_stats = streams.stats()
    checks = dict(thumbnails=check_thumbnails(served, sizes.thumbnail))
    if args.check_requests:
        checks["diffusers"] = check_against_diffusers(
            model, check_workload(sizes.shapes, sizes.steps, args.check_requests, args.seed), min(2, sizes.clients))

    rows = latency_rows(served.records)
    completed = rows[0]["completed"]
    sample_steps = sum(r["steps"] for r in served.records if r["status"] == "completed")
    throughput = dict(wall_s=served.wall_s, images_per_s=completed / served.wall_s if completed else 0.0,
                      sample_steps_per_s=sample_steps / served.wall_s if completed else 0.0)
    data = dict(model=dict(name=sizes.model, config=MODELS[sizes.model], dtype=str(dtype).replace("torch.", ""),
                           parameters=sum(p.numel() for p in model.parameters()), weights="random"),
                requests=sizes.requests, clients=sizes.clients, rate=sizes.rate, shapes=[list(s) for s in sizes.shapes],
                steps=list(sizes.steps), samplers=[name for name, _ in SAMPLERS], high_share=args.high_share,
                high_deadline_s=sizes.high_deadline, max_batch=sizes.max_batch, priority_batch=args.priority_batch,
                priority_lane=args.priority_lane, strict_priority=args.strict_priority, cuda_graphs=args.cuda_graphs,
                thumbnail=[4, sizes.thumbnail, sizes.thumbnail], seed=args.seed)

    print(f"diffusion serving on {harness.describe_device(device)}: {sizes.requests} requests from {sizes.clients} "
          f"client threads at {sizes.rate:g}/s; latents {', '.join('x'.join(map(str, s)) for s in sizes.shapes)}; "
          f"{sizes.steps[0]}-{sizes.steps[1]} steps; {len(SAMPLERS)} samplers; {args.high_share:.0%} high priority "
          f"(start within {sizes.high_deadline:g} s); {sizes.model} UNet2DModel, random weights, "
          f"{data['model']['dtype']}; max batch {sizes.max_batch}" + (", CUDA graphs" if args.cuda_graphs else ""))
    harness.print_table(rows, [("priority", "priority", ""), ("requests", "requests", "d"),
                               ("completed", "completed", "d"), ("deadline_missed", "missed deadline", "d"),
                               ("failed", "failed", "d"), ("p50_ms", "p50 ms", ".1f"), ("p90_ms", "p90 ms", ".1f"),
                               ("p99_ms", "p99 ms", ".1f"), ("queued_p50_ms", "queued p50 ms", ".1f")])
    print(f"throughput: {throughput['images_per_s']:.1f} images/s, {throughput['sample_steps_per_s']:.0f} sample "
          f"steps/s over {served.wall_s:.2f} s; {sampler_stats['iterations']} iterations, mean batch "
          f"{sampler_stats.get('mean_batch', 0):.1f} (largest {sampler_stats.get('max_batch', 0)}), "
          f"samples parked for high priority: {sampler_stats['parked']}")
    print(f"thumbnails: {thumbnail_stats['requests']} through the Batcher in {thumbnail_stats['calls']} calls, "
          f"p50 {thumbnail_stats['p50_ms'] or 0:.1f} ms, p99 {thumbnail_stats['p99_ms'] or 0:.1f} ms after the latents")
    print(f"check: {checks['thumbnails']['checked']} thumbnails equal PyTorch's within "
          f"{checks['thumbnails']['max_abs_diff']:.1e} (<= {THUMBNAIL_TOLERANCE:g})")
    if "diffusers" in checks:
        c = checks["diffusers"]
        print(f"check: {len(c['requests'])} requests ({', '.join(sorted({r['scheduler'] for r in c['requests']}))}) "
              f"served together by the same model in float64 on the CPU equal diffusers' scheduler run alone for "
              f"each within {c['max_relative_diff']:.1e} of the largest value (<= {CHECK_TOLERANCE:g})")
    json_path = args.json or os.path.join(args.out, "serve_diffusion.json")
    harness.write_json(json_path, SCHEMA, device, data=data, rows=rows, throughput=throughput, sampler=sampler_stats,
                       thumbnails=thumbnail_stats, stream_scheduler=lease_stats, checks=checks,
                       requests=served.records)
    print(f"numbers: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

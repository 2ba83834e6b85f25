"""``octopus-bench`` (also ``python -m octopus.bench``): which way of running a ragged batch
wins on this GPU, for these item sizes — octopus's strategies beside what a PyTorch user
writes today (padding, repeat_interleave tables, nested tensors, per-item loops) — in time,
memory and energy. Prints a table, writes every raw measurement as JSON and plots as PNG.

Workloads: ``affine`` (per-item scale and bias), ``normalize`` (per-item mean/std
normalization), ``padding`` (ragged -> padded -> ragged), each over item-size distributions,
``crop_resize`` (1000 long-tail crops of a 1080p frame to 224x224), ``stencil`` (3x3 blur
of 100K small and 10K normal images), ``tiles`` (tile filtering of an 8192x8192 image) and
``diffusion`` (one per-sample sampler step on 4x128x128 images and 16-frame videos).
``octopus-bench distributed`` (its own options) measures ragged exchanges across processes.
On a machine without a GPU the CPU kernels run on batches 1000x smaller.

``octopus-bench contention [options]`` runs the stream scheduler's benchmark instead: a
latency-critical job beside best-effort work (see ``octopus-bench contention --help``).
``octopus-bench serving [options]`` runs the diffusion serving benchmark instead
(``python -m octopus.bench.serving``; its own options: ``octopus-bench serving --help``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

import torch

import octopus

from . import affine, contention, diffusion, filters, image_ops, serving
from .distributions import DISTRIBUTIONS, SizesFileError, read_sizes_file, sample_sizes
from .report import (SCHEMA, autotune_verdicts, describe_distribution, environment, format_report, plot, smoke_note,
                     validate)
from .timing import Measurer, copy_bandwidth_gbs, median_ms

WORKLOADS = ("affine", "normalize", "padding", "crop_resize", "stencil", "tiles", "diffusion")
SCALING_ITEMS = (1_000, 10_000, 100_000, 1_000_000)
CPU_SCALE_DOWN = 1000


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _block(text: str) -> int:
    value = _count(text)
    if value % 16 or value > 2**30:
        raise argparse.ArgumentTypeError(f"must be a multiple of 16 up to 2^30, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="octopus-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                   help=f"what to measure: {', '.join(WORKLOADS)} (default: affine)")
    p.add_argument("--all", action="store_true",
                   help="every workload, distribution and strategy with baselines, plus the item-count scaling")
    p.add_argument("--dists", nargs="+", metavar="DIST", default=None,
                   help=f"item-size distributions of the ragged workloads: {', '.join(DISTRIBUTIONS)}, file "
                        "(default: all of them, or 'file' with --sizes-file)")
    p.add_argument("--sizes-file", default=None,
                   help="item sizes: a COCO-style annotation JSON (bbox sizes), a VisDrone-DET, -VID or -MOT "
                        "annotation .txt (or a directory of them), or text with 'H W' per line")
    p.add_argument("--items", type=_count, default=None, help="number of items (default: each distribution's own)")
    p.add_argument("--strategies", nargs="+", default=list(octopus.STRATEGIES), metavar="STRATEGY",
                   help=f"octopus strategies: {', '.join(octopus.STRATEGIES)} (default: all)")
    p.add_argument("--block-elems", nargs="+", type=_block, default=None,
                   help="elements per plan block / tile; several values make a sweep (default: the built-in one)")
    p.add_argument("--no-baselines", action="store_true", help="only octopus's strategies and the copy ceiling")
    p.add_argument("--scaling", action="store_true", help="also time affine at 10^3 .. 10^6 items")
    p.add_argument("--scaling-dist", default="tiny", choices=list(DISTRIBUTIONS),
                   help="the distribution of the scaling run (default: tiny)")
    p.add_argument("--steps", type=_count, default=50, help="diffusion: inference steps of the schedules")
    p.add_argument("--repeats", type=_count, default=20, help="timed repeats per measurement (median reported)")
    p.add_argument("--energy-window-ms", type=float, default=200.0,
                   help="repeat each method this long to read NVML's energy counter (0: no energy)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--retune", action="store_true", help="probe again for autotune instead of using its cache")
    p.add_argument("--out", default="octopus-bench-results", help="directory for the JSON and the plots")
    p.add_argument("--json", default=None, help="the JSON's path (default: OUT/bench.json)")
    p.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _resolve_arguments(parser, args) -> Optional[torch.Tensor]:
    """Checks what argparse cannot; returns the sizes read from --sizes-file (or None)."""
    if args.all:
        args.workloads = list(WORKLOADS)
        args.scaling = True
    args.workloads = args.workloads or ["affine"]
    for w in args.workloads:
        if w not in WORKLOADS:
            parser.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    for s in args.strategies:
        if s not in octopus.STRATEGIES:
            parser.error(f"unknown strategy {s!r}; choose from {', '.join(octopus.STRATEGIES)}")
    if args.energy_window_ms < 0:
        parser.error(f"--energy-window-ms must be 0 or more, got {args.energy_window_ms}")
    if args.dists is None:
        args.dists = ["file"] if args.sizes_file else list(DISTRIBUTIONS)
    for d in args.dists:
        if d != "file" and d not in DISTRIBUTIONS:
            parser.error(f"unknown distribution {d!r}; choose from {', '.join(DISTRIBUTIONS)}, file")
    if "file" in args.dists and not args.sizes_file:
        parser.error("the 'file' distribution needs --sizes-file")
    file_sizes = None
    if args.sizes_file:
        try:
            file_sizes = read_sizes_file(args.sizes_file)
        except SizesFileError as err:
            parser.error(str(err))
        if "file" not in args.dists:
            args.dists.append("file")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and octopus.built_with_cuda else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device must be cuda or cpu, got {args.device!r}")
    if device.type not in ("cuda", "cpu"):
        parser.error(f"--device must be cuda or cpu, got {args.device!r}")
    if device.type == "cuda" and not (torch.cuda.is_available() and octopus.built_with_cuda):
        parser.error("--device cuda needs a CUDA device and a CUDA build of octopus")
    args.device = device
    return file_sizes


def _progress(total: int, disable: bool):
    try:
        from tqdm import tqdm
    except ImportError:
        print("(no progress bar: tqdm is not installed; pip install tqdm)")
        return None
    return tqdm(total=total, desc="octopus-bench", unit="batch", disable=disable, leave=False, file=sys.stderr)


def _d2h_ms(elements: int, device: torch.device, repeats: int) -> Optional[float]:
    """The output (fp32) copied to pinned host memory: the same for every method of a batch."""
    if device.type != "cuda":
        return None
    src = torch.empty(elements, device=device)
    host = torch.empty(elements, pin_memory=True)
    return median_ms(lambda: host.copy_(src, non_blocking=True), device, warmup=1, repeats=min(repeats, 5))


def _affine_rows(sizes, dist, args, measurer, copy_gbs, scale_down, blocks, baselines=True) -> List[dict]:
    batch = affine.make_batch(sizes, args.device)
    rows = affine.run(batch, measurer, copy_gbs, args.strategies, blocks, args.repeats, baselines=baselines,
                      loop_max_items=affine.PER_ITEM_LOOP_MAX_ITEMS // scale_down)
    d2h = _d2h_ms(batch.numel(), args.device, args.repeats)
    for r in rows:
        r.update(workload="affine", distribution=dist, items=len(batch), elements=batch.numel(), d2h_ms=d2h)
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["contention"]:
        return contention.main(argv[1:])
    if argv[:1] == ["distributed"]:  # its own options: octopus-bench distributed --help
        from . import distributed
        return distributed.main(argv[1:])
    if argv[:1] == ["serving"]:
        return serving.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    file_sizes = _resolve_arguments(parser, args)
    device = args.device
    scale_down = 1
    if device.type == "cpu":
        scale_down = CPU_SCALE_DOWN
        print(f"No GPU in use: running the CPU kernels on batches {CPU_SCALE_DOWN}x smaller "
              "(a smoke run, not the GPU benchmark).")
    os.makedirs(args.out, exist_ok=True)
    json_path = args.json or os.path.join(args.out, "bench.json")

    tuned = octopus.autotune(device, force=args.retune)
    blocks = list(args.block_elems or [octopus.DEFAULT_BLOCK_ELEMS])
    for strategy, block in [(tuned.strategy, tuned.block_elems), *tuned.by_class.values()]:
        if strategy in args.strategies and block not in blocks:
            blocks.append(block)  # so that each choice is measured and can be judged
    copy_gbs = copy_bandwidth_gbs(device, 2 << 30 if device.type == "cuda" else 256 << 20)
    measurer = Measurer(device, args.energy_window_ms)

    jobs = []
    for workload in ("affine", "normalize", "padding"):
        if workload in args.workloads:
            jobs += [(workload, d) for d in args.dists]
    if "crop_resize" in args.workloads:
        jobs.append(("crop_resize", "longtail-crops"))
    if "stencil" in args.workloads:
        jobs += [("stencil", case) for case in filters.STENCIL_CASES]
    if "tiles" in args.workloads:
        jobs.append(("tiles", "8192-tiles"))
    if "diffusion" in args.workloads:
        jobs += [("diffusion", s) for s in diffusion.SHAPES]
    scaling_items = [max(1, n // scale_down) for n in SCALING_ITEMS] if args.scaling else []
    jobs += [("scaling", n) for n in scaling_items]
    bar = _progress(len(jobs), args.no_progress)

    rows, scaling = [], []
    g = torch.Generator().manual_seed(0)
    for kind, what in jobs:
        if bar is not None:
            bar.set_postfix_str(f"{kind} {what}")
        if kind == "affine":
            sizes = sample_sizes(what, args.items, scale_down, g, file_sizes)
            rows += _affine_rows(sizes, what, args, measurer, copy_gbs, scale_down, blocks, not args.no_baselines)
        elif kind in ("normalize", "padding"):
            sizes = sample_sizes(what, args.items, scale_down, g, file_sizes)
            run = image_ops.run_normalize if kind == "normalize" else image_ops.run_padding
            got = run(sizes, measurer, copy_gbs, args.repeats, not args.no_baselines,
                      affine.PER_ITEM_LOOP_MAX_ITEMS // scale_down)
            n = int(sizes.prod(1).sum())
            d2h = _d2h_ms(n, device, args.repeats)
            for r in got:
                r.update(workload=kind, distribution=what, items=sizes.shape[0], elements=n, d2h_ms=d2h)
            rows += got
        elif kind in ("crop_resize", "stencil", "tiles"):
            baselines = not args.no_baselines
            if kind == "crop_resize":
                got = image_ops.run_crop_resize(measurer, copy_gbs, args.repeats, baselines, scale_down)
            elif kind == "stencil":
                got = filters.run_stencil(what, measurer, copy_gbs, args.repeats, baselines, scale_down,
                                          affine.PER_ITEM_LOOP_MAX_ITEMS // scale_down)
            else:
                got = filters.run_tiles(measurer, copy_gbs, args.repeats, baselines, scale_down)
            d2h = _d2h_ms(got[0]["elements"], device, args.repeats)
            for r in got:
                r.update(workload=kind, distribution=what, d2h_ms=d2h)
            rows += got
        elif kind == "diffusion":
            got = diffusion.run(measurer, [what], args.steps, args.repeats, copy_gbs, scale_down)
            d2h = _d2h_ms(got[0]["elements"], device, args.repeats) if got else None
            for r in got:
                r.update(workload="diffusion", d2h_ms=d2h)
            rows += got
        else:
            sizes = sample_sizes(args.scaling_dist, what, 1, g)
            plain = Measurer(device, 0.0)  # no energy windows: keeps the sweep short
            scaling += _affine_rows(sizes, args.scaling_dist, args, plain, copy_gbs, scale_down,
                                    [tuned.block_elems], not args.no_baselines)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()

    if scale_down > 1:  # cache-sized batches against a DRAM copy: no bandwidth share to report
        for r in rows + scaling:
            r["pct_copy"] = None
    tune = tuned.as_dict()
    tune["verdicts"] = autotune_verdicts(rows, tuned.for_layout)
    result: Dict[str, Any] = dict(schema=SCHEMA, environment=environment(device), copy_gbs=copy_gbs,
                                  scale_down=scale_down, energy=measurer.energy_note, autotune=tune, rows=rows,
                                  scaling=scaling, plots=[])
    result["smoke_run"] = smoke_note(result)
    if not args.no_plots:
        try:
            result["plots"] = plot(result, args.out)
        except ImportError:
            print("(no plots: matplotlib is not installed; pip install matplotlib)")
    problems = validate(result)
    if problems:  # a bug of ours: say so, but keep the measurements
        print("warning: the result does not match the schema:\n  " + "\n  ".join(problems[:10]), file=sys.stderr)
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    print(format_report(result, lambda r: describe_distribution(r["distribution"], args.sizes_file)
                        if r["workload"] != "diffusion" else f"{r['sampler']}, latents {r['distribution']}"))
    print(f"\nraw measurements: {json_path}" + (f"; plots: {', '.join(result['plots'])}" if result["plots"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m octopus.bench`` (also ``octopus-bench``): times octopus's ops against what a
PyTorch user writes today, prints a table and writes the raw measurements as JSON."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys

import torch

import octopus

from . import affine

COLUMNS = [("method", "{:<28}"), ("setup_ms", "{:>9.3f}"), ("h2d_ms", "{:>8.3f}"), ("metadata_mb", "{:>10.2f}"),
           ("kernel_ms", "{:>10.3f}"), ("gbs", "{:>8.0f}"), ("pct_copy", "{:>7.1f}%")]


def format_table(result) -> str:
    lines = []
    shape = None
    header = "{:<28}{:>9}{:>8}{:>10}{:>10}{:>8}{:>8}".format("method", "setup ms", "H2D ms", "meta MB",
                                                          "kernel ms", "GB/s", "% copy")
    for r in result["rows"]:
        if r["shape"] != shape:
            shape = r["shape"]
            lines += ["", f"{shape}: {r['items']} items, {r['elements']} elements (fp32)", header]
        if "kernel_ms" not in r:
            lines.append("{:<28}  {}".format(r["method"], r["note"]))
            continue
        lines.append("".join(fmt.format(r[key]) for key, fmt in COLUMNS))
    return "\n".join(lines)


def environment(device: torch.device) -> dict:
    env = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               torch=torch.__version__, octopus=octopus.__version__, python=platform.python_version(),
               device_type=device.type)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device=props.name, multiprocessors=props.multi_processor_count,
                   l2_mb=getattr(props, "L2_cache_size", 0) / 2**20, cuda=torch.version.cuda)
    else:
        env.update(device=platform.processor() or platform.machine())
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="octopus-bench", description=__doc__)
    parser.add_argument("--shapes", nargs="+", default=list(affine.SHAPES), choices=list(affine.SHAPES))
    parser.add_argument("--strategies", nargs="+", default=list(octopus.STRATEGIES), choices=list(octopus.STRATEGIES))
    parser.add_argument("--block-elems", nargs="+", type=int, default=[octopus.DEFAULT_BLOCK_ELEMS],
                        help="elements per plan block / tile (several values: a sweep)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default=None, help="write the raw measurements here")
    args = parser.parse_args(argv)

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and octopus.built_with_cuda else "cpu"
    device = torch.device(args.device)
    if device.type == "cuda" and not (torch.cuda.is_available() and octopus.built_with_cuda):
        parser.error("--device cuda needs a CUDA device and a CUDA build of octopus")
    scale_down = 1
    if device.type == "cpu":
        scale_down = 1000
        print("No GPU in use: running the CPU kernels on batches 1000x smaller (a smoke run, not the GPU benchmark).")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    for b in args.block_elems:
        if b <= 0 or b % 16 or b > 2**30:
            parser.error(f"--block-elems must be positive multiples of 16 up to 2^30, got {b}")
    result = affine.run(device, args.shapes, args.strategies, scale_down, args.repeats, args.block_elems)
    result.update(environment(device), benchmark="affine", scale_down=scale_down)
    print(f"affine on {result['device']} (torch {result['torch']}); "
          f"measured copy bandwidth {result['copy_gbs']:.0f} GB/s (read + write)")
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nraw measurements: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

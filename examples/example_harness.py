"""What the examples share: their common command-line options, a clock on the device's
timeline, percentiles, the printed table and the JSON record."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

import octopus
from octopus._timing import percentile  # octopus's one percentile rule (nearest rank): harness.percentile
from octopus.bench.__main__ import _count as positive_int  # octopus-bench's argparse type: a positive int
from octopus.bench.report import environment


def add_common_options(parser: argparse.ArgumentParser, name: str, passes: bool = True) -> None:
    """--device, --tiny, --warmup, --repeats, --seed, --out and --json; ``name`` is the
    example's, used for its default output folder ``<name>-results``. Without ``passes``, no
    --warmup and --repeats (an example timed over one run rather than repeated passes)."""
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="where to run (default: cuda with a GPU and octopus built with CUDA, else cpu)")
    parser.add_argument("--tiny", action="store_true", help="a tiny input that runs in seconds on a CPU (for CI)")
    if passes:
        parser.add_argument("--warmup", type=positive_int, default=1, help="untimed passes before timing (default 1)")
        parser.add_argument("--repeats", type=positive_int, default=None, help="timed passes per method, medians "
                            "reported (default 5 on cuda, 3 on cpu, 1 with --tiny)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic input and the model's weights")
    parser.add_argument("--out", default=f"{name}-results", help=f"output folder (default {name}-results)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help=f"where the numbers go as JSON (default OUT/{name.replace('-', '_')}.json)")


def resolve_device(parser: argparse.ArgumentParser, name: Optional[str]) -> torch.device:
    has_cuda = torch.cuda.is_available() and octopus.built_with_cuda
    if name is None:
        return torch.device("cuda" if has_cuda else "cpu")
    if name == "cuda" and not has_cuda:
        parser.error("--device cuda needs a CUDA device and octopus built with CUDA")
    return torch.device(name)


def describe_device(device: torch.device) -> str:
    """``cuda (NVIDIA H100 80GB HBM3)``, ``cpu (x86_64)``."""
    return f"{device.type} ({environment(device)['device']})"


def default_repeats(args: argparse.Namespace, device: torch.device) -> int:
    if args.repeats is not None:
        return args.repeats
    return 1 if args.tiny else (5 if device.type == "cuda" else 3)


Mark = Union[torch.cuda.Event, float]


class Clock:
    """Marks on the device's timeline: CUDA events recorded on the current stream on a GPU
    (the time between two marks is the stream's, host stalls included), the host clock on
    the CPU."""

    def __init__(self, device: torch.device):
        self.device = device

    def mark(self) -> Mark:
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start: Mark, end: Mark) -> float:
        """Milliseconds from ``start`` to ``end`` (waits for ``end`` on a GPU)."""
        if self.device.type == "cuda":
            end.synchronize()
            return start.elapsed_time(end)
        return (end - start) * 1e3

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, fn: Callable[[], object], warmup: int, repeats: int) -> List[float]:
        """Milliseconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones."""
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            start = self.mark()
            fn()
            times.append(self.ms(start, self.mark()))
        return times


def time_pipeline(preprocess: Callable[[int], torch.Tensor], model: Callable[[torch.Tensor], object], items: int,
                  clock: Clock, warmup: int, repeats: int, latency: bool = True) -> Dict:
    """Times of a pipeline over ``items`` inputs (frames, scenes): ``preprocess(i)`` alone,
    then ``model(preprocess(i))`` with the model's spans marked, whose sum against the whole
    pass gives the share of time outside the model; medians of ``repeats`` passes after
    ``warmup``. With ``latency``, also each item's latency with the device synchronized
    before and after (host wall time), as percentiles."""
    def preprocess_all():
        for i in range(items):
            preprocess(i)

    def pipeline():
        spans = []
        start = clock.mark()
        for i in range(items):
            inputs = preprocess(i)
            before = clock.mark()
            model(inputs)
            spans.append((before, clock.mark()))
        total = clock.ms(start, clock.mark())
        return total, sum(clock.ms(a, b) for a, b in spans)

    preprocess_ms = clock.time(preprocess_all, warmup, repeats)
    for _ in range(warmup):
        pipeline()
    runs = [pipeline() for _ in range(repeats)]
    total, in_model = [t for t, _ in runs], [m for _, m in runs]
    result = dict(preprocess_ms=median(preprocess_ms), end_to_end_ms=median(total), model_ms=median(in_model),
                  outside_model_pct=median([100 * (1 - m / t) for t, m in runs]),
                  preprocess_times_ms=preprocess_ms, end_to_end_times_ms=total, model_times_ms=in_model)
    if latency:
        waits = []
        for i in range(items):
            clock.sync()
            t0 = time.perf_counter()
            model(preprocess(i))
            clock.sync()
            waits.append((time.perf_counter() - t0) * 1e3)
        result.update(latency_p50_ms=percentile(waits, 50), latency_p99_ms=percentile(waits, 99), latency_ms=waits)
    return result




def median(values: Sequence[float]) -> float:
    return statistics.median(values)


Column = Tuple[str, str, str]  # (row key, heading, format spec)


def print_table(rows: List[Dict], columns: Sequence[Column]) -> None:
    """One line per row; a missing or None value prints as '-', a row's ``note`` after it."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([("-" if r.get(k) is None else format(r[k], spec)) for k, _, spec in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    for line, r in zip(cells, [None] + rows):
        text = "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
        print(text + (f"  ({r['note']})" if r and r.get("note") else ""))


def write_json(path: str, schema: str, device: torch.device, **record) -> None:
    """``record`` with the schema name and the environment (device, driver, torch, octopus
    versions, date) as JSON at ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(schema=schema, environment=environment(device), **record), f, indent=1)
        f.write("\n")


def require(ok: bool, message: str) -> None:
    """A cross-check that must hold (raises AssertionError; unlike ``assert`` it is not
    stripped by ``python -O``)."""
    if not ok:
        raise AssertionError(message)

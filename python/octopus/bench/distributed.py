"""``octopus-bench distributed``: ragged batches across processes — gloo on CPUs, nccl on GPUs.

exchange   Every rank holds its own ragged batch (``--dists``: normal, tiny, longtail item
           sizes, each distribution's item count per rank) and sends it with
           ``octopus.distributed.all_to_all``: ``grouped`` destinations (items already in
           destination order, each rank getting an equal share of elements: no packing) and
           ``random`` ones (a uniform random rank per item: the items are packed first).
           Beside it, ``all_to_all_single`` of the same bytes with the same splits (a dense
           buffer, nothing to pack, no counts to exchange; its output allocated per call).
           Also the parts: the counts exchange alone, the local packing (with either way of
           moving runs forced; slices only up to 100K runs), and the latency of an exchange
           of nothing.
pipeline   Per-item normalize (``octopus.normalize``) of a long-tail batch that every rank
           holds, by one process alone and by every rank on its shard: element-balanced
           (``octopus.distributed.shard``) or by item count, items in the order drawn
           (``shuffled``) or sorted by size (as a bucketing loader yields them); then the
           same followed by ``gather`` of the results to rank 0.

Times are host wall times of one call on every rank after a barrier, ended by a device
synchronization (the methods compared run in turn within each repeat); per repeat the slowest
rank's time counts; medians and 90th percentiles of ``--repeats``. The ranks are started here
(``--world-size``, torch.multiprocessing) or by torchrun (``torchrun --nproc-per-node 2 -m
octopus.bench.distributed``); ``--parts`` picks latency, exchange, pipeline. Rank 0 prints a
summary and writes every measurement as JSON. Without GPUs (gloo), batches are
``--scale-down`` (default 100) times smaller and each rank runs ``--threads`` CPU threads.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Sequence, cast

import torch
import torch.distributed as dist

import octopus
import octopus.distributed as odist
from octopus.distributed import packing
from octopus.distributed.agreement import Contribution, RankGroup

from .._timing import percentile
from .affine import make_batch
from .distributions import DISTRIBUTIONS, make_sizes
from .report import environment

SCHEMA = "octopus-bench-distributed/1"
PARTS = ("latency", "exchange", "pipeline")
EXCHANGE_DISTS = ("normal", "tiny", "longtail")
PIPELINE_ITEMS = 4 * DISTRIBUTIONS["longtail"][0]  # a long-tail batch large enough to time per rank
CPU_SCALE_DOWN = 100
MAX_FORCED_SLICES = 100_000


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="octopus-bench distributed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="nccl (CUDA tensors, one GPU per rank) or gloo (CPU tensors); default: nccl where there "
                        "are enough GPUs")
    p.add_argument("--world-size", type=int, default=2, help="ranks to start (ignored under torchrun; default 2)")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS),
                   help="what to measure (default: latency exchange pipeline)")
    p.add_argument("--dists", nargs="+", default=list(EXCHANGE_DISTS), choices=list(DISTRIBUTIONS),
                   help="item-size distributions of the exchange (default: normal tiny longtail)")
    p.add_argument("--items", type=int, default=None, help="items per rank in the exchange (default: the "
                                                            "distribution's count, scaled down without GPUs)")
    p.add_argument("--pipeline-items", type=int, default=None,
                   help=f"items of the pipeline's long-tail batch (default {PIPELINE_ITEMS}, scaled down without GPUs)")
    p.add_argument("--scale-down", type=int, default=None, help=f"divide the item counts by this (default 1 with "
                                                                 f"nccl, {CPU_SCALE_DOWN} with gloo)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads per rank with gloo (default: the cores "
                                                              "divided among the ranks)")
    p.add_argument("--repeats", type=int, default=20, help="timed repeats per measurement (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before each measurement (default 3)")
    p.add_argument("--json", default=os.path.join("octopus-bench-results", "distributed.json"),
                   help="where rank 0 writes the measurements")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if torchrun else args.world_size
    for option in ("world_size", "items", "pipeline_items", "scale_down", "threads", "repeats"):
        value = getattr(args, option)
        if value is not None and value < 1:
            parser.error(f"--{option.replace('_', '-')} must be positive, got {value}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() and octopus.built_with_cuda else 0
    args.backend = args.backend or ("nccl" if gpus >= world else "gloo")
    if args.backend == "nccl" and gpus < world:
        parser.error(f"--backend nccl needs one GPU per rank: {world} ranks, {gpus} GPUs (with a CUDA build)")
    args.scale_down = args.scale_down or (1 if args.backend == "nccl" else CPU_SCALE_DOWN)
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    if torchrun:
        _run_rank(int(os.environ["RANK"]), world, args, "env://", int(os.environ.get("LOCAL_RANK", 0)))
        return 0
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import start_processes
    # Ranks forked from a server that imported torch once (a fresh interpreter per rank
    # would import it in each); the server itself touches no GPU.
    mp.get_context("forkserver").set_forkserver_preload(["torch", "octopus.bench.distributed"])
    with tempfile.TemporaryDirectory() as tmp:
        start_processes(_spawned_rank, args=(world, args, f"file://{os.path.join(tmp, 'store')}"),
                        nprocs=world, start_method="forkserver")
    return 0


def _spawned_rank(rank: int, world: int, args, init_method: str) -> None:
    _run_rank(rank, world, args, init_method, rank)


def _run_rank(rank: int, world: int, args, init_method: str, local_rank: int) -> None:
    if args.backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world, device_id=device,
                                timeout=datetime.timedelta(minutes=10))
    else:
        device = torch.device("cpu")
        torch.set_num_threads(args.threads)
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(minutes=10))
    try:
        load_before = os.getloadavg()  # what else ran: on a shared CPU it decides the timings
        bench = _Bench(device, args)
        result = dict(schema=SCHEMA, environment=environment(device), backend=args.backend, world_size=world,
                      scale_down=args.scale_down, threads_per_rank=args.threads if device.type == "cpu" else None,
                      repeats=args.repeats, latency=bench.latency() if "latency" in args.parts else {},
                      exchange=bench.exchange() if "exchange" in args.parts else [],
                      pipeline=bench.pipeline() if "pipeline" in args.parts else [],
                      load_average_1min=[load_before[0], os.getloadavg()[0]])
        if rank == 0:
            directory = os.path.dirname(args.json)
            if directory:
                os.makedirs(directory, exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
            print(format_report(result))
            print(f"\nraw measurements: {args.json}")
    finally:
        dist.destroy_process_group()


class _Bench:
    """The measurements, made by every rank together (every method is collective)."""

    def __init__(self, device: torch.device, args):
        self.device, self.args = device, args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timed(self, methods: Mapping[str, Callable[[], object]], alone: Sequence[str] = ()) -> Dict[str, dict]:
        """Times the methods in turn within each repeat (so that a machine's drifting load
        touches them alike): a barrier, then the method on every rank (on rank 0 only for
        those named in ``alone``), timed on the host up to a device synchronization. Per
        method: this rank's times and, per repeat, the slowest rank's (the step's time)."""
        mine: Dict[str, List[float]] = {name: [] for name in methods}
        for k in range(self.args.warmup + self.args.repeats):
            for name, fn in methods.items():
                runs = name not in alone or self.rank == 0
                dist.barrier()
                self._sync()
                start = time.perf_counter()
                if runs:
                    fn()
                    self._sync()
                if k >= self.args.warmup:
                    mine[name].append((time.perf_counter() - start) * 1e3 if runs else 0.0)
        every: List[Any] = [None] * self.world  # every rank's Dict[str, List[float]], once gathered
        dist.all_gather_object(every, mine)
        result = {}
        for name in methods:
            slowest = [max(ts) for ts in zip(*(e[name] for e in every))]
            result[name] = dict(ms=statistics.median(slowest), p90_ms=percentile(slowest, 90), times_ms=slowest,
                                rank_ms=[statistics.median(e[name]) for e in every])
        return result

    def latency(self) -> Dict[str, dict]:
        """An exchange of nothing (three collectives' latency) and one small all_to_all_single."""
        empty = octopus.RaggedBatch.from_tensors([], device=self.device, item_dim=1)
        counts = torch.zeros(self.world, dtype=torch.int64, device=self.device)
        received = torch.empty_like(counts)
        return self.timed(dict(all_to_all_empty=lambda: odist.all_to_all(empty, []),
                               all_to_all_single_one_int_per_rank=lambda: dist.all_to_all_single(received, counts)))

    def exchange(self) -> List[dict]:
        rows = []
        for name in self.args.dists:
            items = self.args.items or max(1, DISTRIBUTIONS[name][0] // self.args.scale_down)
            sizes = make_sizes(name, items, torch.Generator().manual_seed(1000 + self.rank))
            batch = make_batch(sizes, self.device, seed=self.rank)
            for pattern in ("grouped", "random"):
                rows.append(self._exchange_row(name, pattern, batch))
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
        return rows

    def _destinations(self, pattern: str, batch: octopus.RaggedBatch) -> torch.Tensor:
        if pattern == "grouped":
            bounds = torch.tensor(odist.shard_bounds(batch.host_layout()[0], self.world))
            return torch.repeat_interleave(torch.arange(self.world), bounds.diff()).to(self.device)
        g = torch.Generator().manual_seed(2000 + self.rank)
        return torch.randint(0, self.world, (len(batch),), generator=g).to(self.device)

    def _exchange_row(self, name: str, pattern: str, batch: octopus.RaggedBatch) -> dict:
        dest = self._destinations(pattern, batch)
        layout, _ = packing.SendLayout.by_destination(batch.offsets, dest, self.world)
        assert layout is not None, "the destinations are ranks of the group"
        send_splits = layout.elements_per_rank
        group = RankGroup(None, "all_to_all")
        header = Contribution(item_dim=batch.item_dim, dtype=batch.dtype, device_type=self.device.type)
        recv_splits = group.agree(header, layout.items_per_rank, send_splits)[1]
        dense = torch.randn(batch.numel(), device=self.device)
        total = sum(recv_splits)
        row = dict(distribution=name, pattern=pattern, items_per_rank=len(batch), elements_per_rank=batch.numel(),
                   bytes_per_rank=4 * batch.numel(), runs=layout.move.runs, moves=layout.move.moves_elements,
                   send_elements=send_splits)
        methods: Dict[str, Callable[[], object]] = dict(
            octopus_all_to_all=lambda: odist.all_to_all(batch, dest),
            # its output allocated per call, as all_to_all's is
            all_to_all_single=lambda: dist.all_to_all_single(dense.new_empty(total), dense, recv_splits, send_splits),
            counts_exchange=lambda: group.agree(header, layout.items_per_rank, send_splits),
            plan_and_pack=lambda: cast(packing.SendLayout, packing.SendLayout.by_destination(
                batch.offsets, dest, self.world)[0]).pack(batch))
        if layout.move.moves_elements:
            methods.update(move_index=lambda: _moved(layout.move, batch.values, 1 << 62))
            if layout.move.runs <= MAX_FORCED_SLICES:  # beyond, a slice per run takes seconds of host time
                methods.update(move_slices=lambda: _moved(layout.move, batch.values, 0))
        row.update(self.timed(methods))
        ratio = row["all_to_all_single"]["ms"] / row["octopus_all_to_all"]["ms"]
        row["fraction_of_all_to_all_single"] = ratio
        for key in ("octopus_all_to_all", "all_to_all_single"):
            algbw = row["bytes_per_rank"] / row[key]["ms"] / 1e6  # nccl-tests' definitions
            row[key].update(algbw_gbs=algbw, busbw_gbs=algbw * (self.world - 1) / self.world)
        return row

    def pipeline(self) -> List[dict]:
        count = max(1, (self.args.pipeline_items or PIPELINE_ITEMS) // self.args.scale_down)
        drawn = make_sizes("longtail", count, torch.Generator().manual_seed(7))  # the same on every rank
        rows = []
        for order in ("shuffled", "sorted"):
            sizes = drawn if order == "shuffled" else drawn[drawn.prod(dim=1).argsort()]
            whole = make_batch(sizes, self.device, seed=7)
            reference = octopus.normalize(whole)
            offsets = whole.host_layout()[0]
            m = len(whole)
            bounds = dict(elements=odist.shard_bounds(offsets, self.world),
                          items=[r * m // self.world for r in range(self.world + 1)])
            parts = {k: whole.narrow_items(b[self.rank], b[self.rank + 1]) for k, b in bounds.items()}
            assert parts["elements"].item_shapes() == odist.shard(whole).item_shapes()
            checked = {}
            for k, part in parts.items():
                gathered = odist.gather(octopus.normalize(part), 0)
                checked[k] = self.rank != 0 or torch.allclose(gathered.values, reference.values, atol=1e-5)
            methods: Dict[str, Callable[[], object]] = dict(one_process=lambda: octopus.normalize(whole))
            for k, part in parts.items():
                methods[k] = functools.partial(octopus.normalize, part)
                methods[f"{k}_and_gather"] = functools.partial(_normalize_and_gather, part)
            times = self.timed(methods, alone=["one_process"])
            alone = times["one_process"]
            for k, b in bounds.items():
                elements = [int(offsets[j] - offsets[i]) for i, j in zip(b, b[1:])]
                step, with_gather = times[k], times[f"{k}_and_gather"]
                rows.append(dict(order=order, sharding=k, items=m, elements=whole.numel(),
                                 rank_items=[j - i for i, j in zip(b, b[1:])], rank_elements=elements,
                                 element_imbalance=max(elements) / (sum(elements) / self.world),
                                 one_process=alone, step=step, step_and_gather=with_gather,
                                 speedup=alone["ms"] / step["ms"], speedup_with_gather=alone["ms"] / with_gather["ms"],
                                 checked=bool(checked[k])))
        return rows


def _normalize_and_gather(part: octopus.RaggedBatch) -> octopus.RaggedBatch:
    """What each rank does in the pipeline: normalize its part, gather the results on rank 0."""
    return odist.gather(octopus.normalize(part), 0)


def _moved(move: packing.ItemMove, values: torch.Tensor, min_run_elements: int) -> torch.Tensor:
    """``move.move(values)`` with packing's way of moving runs forced: a minimum of 0 elements
    per run slices every run, a huge one gathers by index."""
    saved = dict(packing.MIN_SLICED_RUN_ELEMENTS)
    packing.MIN_SLICED_RUN_ELEMENTS.update({k: min_run_elements for k in saved})
    try:
        return move.move(values)
    finally:
        packing.MIN_SLICED_RUN_ELEMENTS.update(saved)


def format_report(result: dict) -> str:
    env = result["environment"]
    world = result["world_size"]
    lines = [f"octopus {env['octopus']} distributed: {world} ranks over {result['backend']} on {env['device']} "
             f"(torch {env['torch']}, {env['date']}; scale-down {result['scale_down']}"
             + (f", {result['threads_per_rank']} CPU threads per rank" if result["threads_per_rank"] else "")
             + "; load average {:.1f} before, {:.1f} after)".format(*result["load_average_1min"]),
             "ms: median over repeats of the slowest rank's wall time (p90 in brackets)", ""]
    lat = result["latency"]
    if lat:
        lines.append(f"latency: all_to_all of nothing {_ms(lat['all_to_all_empty'])}, all_to_all_single of one "
                     f"int64 per rank {_ms(lat['all_to_all_single_one_int_per_rank'])}")
    if result["exchange"]:
        lines += ["", f"{'exchange':<20}{'MB/rank':>9}{'all_to_all':>20}{'single':>20}{'fraction':>9}"
                      f"{'counts':>9}{'pack':>9}{'GB/s bus':>9}"]
    for r in result["exchange"]:
        lines.append(f"{r['distribution'] + ' ' + r['pattern']:<20}{r['bytes_per_rank'] / 1e6:>9.1f}"
                     f"{_ms(r['octopus_all_to_all']):>20}{_ms(r['all_to_all_single']):>20}"
                     f"{r['fraction_of_all_to_all_single']:>9.2f}{r['counts_exchange']['ms']:>9.3f}"
                     f"{r['plan_and_pack']['ms']:>9.3f}{r['octopus_all_to_all']['busbw_gbs']:>9.2f}")
    if result["pipeline"]:
        lines += ["", f"{'pipeline (normalize)':<28}{'elements per rank':>28}{'one process':>14}{'per rank ms':>22}"
                      f"{'step':>10}{'speedup':>8}{'+gather':>10}{'speedup':>8}"]
    for r in result["pipeline"]:
        share = "/".join(f"{e / r['elements']:.2f}" for e in r["rank_elements"])
        ranks = "/".join(f"{t:.2f}" for t in r["step"]["rank_ms"])
        lines.append(f"{r['order'] + ', by ' + r['sharding']:<28}{share:>28}{r['one_process']['ms']:>14.3f}"
                     f"{ranks:>22}{r['step']['ms']:>10.3f}{r['speedup']:>8.2f}{r['step_and_gather']['ms']:>10.3f}"
                     f"{r['speedup_with_gather']:>8.2f}" + ("" if r["checked"] else "  RESULT DIFFERS"))
    return "\n".join(lines)


def _ms(m: dict) -> str:
    return f"{m['ms']:.3f} ({m['p90_ms']:.3f})"


if __name__ == "__main__":
    sys.exit(main())

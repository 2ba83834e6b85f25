"""The affine benchmark: every strategy and today's PyTorch baselines on four batch shapes."""

from __future__ import annotations

import math
from typing import Dict, List

import torch

import octopus

from .timing import copy_bandwidth_gbs, median_ms, wall_ms

# name -> (items, description); item counts are divided by `scale_down` on the CPU.
SHAPES = {
    "10k": (10_000, "10K items of 30K-80K elements"),
    "100k": (100_000, "100K items of 3K-8K elements"),
    "1m": (1_000_000, "1M items of 300-800 elements"),
    "longtail": (100_000, "100K 2-D items, log-normal H, W around 45x50, clipped to 8..400"),
}


def make_sizes(shape: str, items: int, g: torch.Generator) -> torch.Tensor:
    """[M, D] item sizes for a named shape."""
    if shape == "longtail":
        h = torch.exp(torch.randn(items, generator=g) * 0.6 + math.log(45)).round().clamp(8, 400)
        w = torch.exp(torch.randn(items, generator=g) * 0.6 + math.log(50)).round().clamp(8, 400)
        return torch.stack([h, w], dim=1).long()
    lo, hi = {"10k": (30_000, 80_000), "100k": (3_000, 8_000), "1m": (300, 800)}[shape]
    return torch.randint(lo, hi + 1, (items, 1), generator=g)


def make_batch(shape: str, items: int, device: torch.device, seed: int = 0) -> octopus.RaggedBatch:
    g = torch.Generator().manual_seed(seed)
    sizes = make_sizes(shape, items, g)
    offsets = torch.zeros(items + 1, dtype=torch.int64)
    offsets[1:] = sizes.prod(dim=1).cumsum(0)
    values = torch.randn(int(offsets[-1]), device=device)
    batch = octopus.RaggedBatch(values, offsets.to(device), sizes.to(device), validate=False)
    batch._host_layout = (offsets, sizes)
    return batch


def bench_shape(shape: str, items: int, device: torch.device, strategies: List[str], copy_gbs: float,
                repeats: int, loop_items_max: int, block_sizes: List[int]) -> List[Dict]:
    batch = make_batch(shape, items, device)
    n, m = batch.numel(), len(batch)
    g = torch.Generator().manual_seed(1)
    scale = torch.randn(m, generator=g).to(device)
    bias = torch.randn(m, generator=g).to(device)
    nbytes = 8 * n  # fp32 in + fp32 out
    rows = []

    def row(method, kernel_ms, setup_ms=0.0, h2d_ms=0.0, metadata_mb=0.0, note=""):
        gbs = nbytes / kernel_ms / 1e6 if kernel_ms else float("nan")
        rows.append(dict(shape=shape, items=m, elements=n, method=method, setup_ms=setup_ms, h2d_ms=h2d_ms,
                         metadata_mb=metadata_mb, kernel_ms=kernel_ms, total_ms=setup_ms + h2d_ms + kernel_ms,
                         gbs=gbs, pct_copy=100 * gbs / copy_gbs, note=note))

    out = torch.empty_like(batch.values)
    row("copy (ceiling)", median_ms(lambda: out.copy_(batch.values), device, repeats=repeats))
    values, offsets = batch.values, batch.offsets
    for strategy, block in [(s, b) for s in strategies for b in block_sizes]:
        h2d_ms = 0.0
        if strategy == "plan":
            setup = median_ms(lambda: torch.ops.octopus.plan(offsets, n, block), device, repeats=repeats)
        elif strategy == "plan_host":
            host_offsets = batch.host_layout()[0]
            setup = wall_ms(lambda: torch.ops.octopus.plan(offsets.cpu(), n, block), device)
            host_plan = torch.ops.octopus.plan(host_offsets, n, block)
            h2d_ms = wall_ms(lambda: host_plan.to(device), device) if device.type == "cuda" else 0.0
        elif strategy == "lookup":
            setup = median_ms(lambda: torch.ops.octopus.lookup_table(offsets, n), device, repeats=5)
        else:
            setup = 0.0
        meta = batch.metadata(strategy, block)
        meta_mb = meta.numel() * meta.element_size() / 1e6 if meta is not None else 0.0
        kernel = median_ms(lambda: torch.ops.octopus.affine(values, offsets, scale, bias, strategy, block, meta, False),
                           device, repeats=repeats)
        label = f"octopus {strategy}" + (f" b={block}" if len(block_sizes) > 1 else "")
        row(label, kernel, setup, h2d_ms, meta_mb)
        rows[-1]["block_elems"] = block
        # Check the result once against the search strategy's (independent item finding).
        if strategy != "search":
            ref = torch.ops.octopus.affine(values, offsets, scale, bias, "search", block, None, False)
            got = torch.ops.octopus.affine(values, offsets, scale, bias, strategy, block, meta, False)
            assert torch.equal(got, ref), f"{strategy} disagrees with search on {shape}"
        del meta

    lengths = offsets.diff()

    def repeat_interleave():
        return values * scale.repeat_interleave(lengths, output_size=n) + bias.repeat_interleave(lengths, output_size=n)

    row("torch repeat_interleave", median_ms(repeat_interleave, device, repeats=repeats),
        metadata_mb=2 * 4 * n / 1e6, note="two expanded per-element parameter tensors")
    if batch.item_dim == 1:
        try:
            nt = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
            s2, b2 = scale.view(m, 1), bias.view(m, 1)
            row("torch nested (jagged)", median_ms(lambda: nt * s2 + b2, device, repeats=repeats),
                note="jagged NJT broadcast with [M, 1] parameters")
        except Exception as err:  # nested broadcasting is partial in torch: report, don't fail
            rows.append(dict(shape=shape, items=m, elements=n, method="torch nested (jagged)",
                             note=f"not supported: {type(err).__name__}: {str(err)[:80]}"))
    if m <= loop_items_max:
        o = batch.host_layout()[0].tolist()
        s_list, b_list = scale.tolist(), bias.tolist()

        def loop():
            for i in range(m):
                torch.add(values[o[i]:o[i + 1]] * s_list[i], b_list[i], out=out[o[i]:o[i + 1]])

        row("torch per-item loop", median_ms(loop, device, warmup=1, repeats=3))
    return rows


def run(device: torch.device, shapes: List[str], strategies: List[str], scale_down: int, repeats: int,
        block_sizes: List[int]) -> Dict:
    copy_gbs = copy_bandwidth_gbs(device, 2 << 30 if device.type == "cuda" else 256 << 20)
    rows = []
    for shape in shapes:
        items = max(1, SHAPES[shape][0] // scale_down)
        rows += bench_shape(shape, items, device, strategies, copy_gbs, repeats,
                            loop_items_max=10_000 // scale_down, block_sizes=block_sizes)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return dict(copy_gbs=copy_gbs, rows=rows)

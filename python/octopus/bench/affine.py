"""The affine workload (``out = x * scale[item] + bias[item]``, fp32, 8 bytes moved per
element): every strategy and what a PyTorch user writes today, on one batch."""

from __future__ import annotations

from typing import Dict, List

import torch

import octopus

from .timing import Measurer, median_ms, wall_ms

PER_ITEM_LOOP_MAX_ITEMS = 10_000
PADDED_MAX_BYTES = 8 << 30


def make_batch(sizes: torch.Tensor, device: torch.device, seed: int = 0) -> octopus.RaggedBatch:
    """A RaggedBatch of random fp32 items of the given ``[M, D]`` shapes."""
    items = sizes.shape[0]
    offsets = torch.zeros(items + 1, dtype=torch.int64)
    offsets[1:] = sizes.prod(dim=1).cumsum(0)
    g = torch.Generator(device=device).manual_seed(seed)
    values = torch.randn(int(offsets[-1]), device=device, generator=g)
    batch = octopus.RaggedBatch(values, offsets.to(device), sizes.to(device), validate=False)
    batch._host_layout = (offsets, sizes)
    return batch


def run(batch: octopus.RaggedBatch, measurer: Measurer, copy_gbs: float, strategies: List[str],
        block_sizes: List[int], repeats: int, baselines: bool = True,
        loop_max_items: int = PER_ITEM_LOOP_MAX_ITEMS) -> List[Dict]:
    """One row per method: the copy ceiling, each strategy x block size, and (with
    ``baselines``) repeat_interleave, nested-tensor broadcasting, a padded dense batch and a
    per-item loop (up to ``loop_max_items`` items) where they are feasible."""
    device = measurer.device
    n, m = batch.numel(), len(batch)
    g = torch.Generator().manual_seed(1)
    scale = torch.randn(m, generator=g).to(device)
    bias = torch.randn(m, generator=g).to(device)
    nbytes = 8 * n  # fp32 in + fp32 out
    values, offsets = batch.values, batch.offsets
    rows = []

    def row(method, kernel, setup_ms=0.0, h2d_ms=0.0, metadata_mb=0.0, strategy=None, block=None, note=""):
        r = dict(method=method, strategy=strategy, block_elems=block, setup_ms=setup_ms, h2d_ms=h2d_ms,
                 metadata_mb=metadata_mb, note=note, **(kernel or dict(kernel_ms=None, peak_mb=None, energy_mj=None)))
        ms = r["kernel_ms"]
        r["total_ms"] = setup_ms + h2d_ms + ms if ms is not None else None
        r["gbs"] = nbytes / ms / 1e6 if ms else None
        r["pct_copy"] = 100 * r["gbs"] / copy_gbs if ms else None
        rows.append(r)

    out = torch.empty_like(values)
    row("copy (ceiling)", measurer.measure(lambda: out.copy_(values), repeats=repeats))
    reference = None
    for strategy, block in [(s, b) for s in strategies for b in block_sizes]:
        h2d_ms = 0.0
        if strategy == "plan":
            setup = median_ms(lambda: torch.ops.octopus.plan(offsets, n, block), device, repeats=repeats)
        elif strategy == "plan_host":
            host_offsets = batch.host_layout()[0]
            setup = wall_ms(lambda: torch.ops.octopus.plan(host_offsets, n, block), device)
            host_plan = torch.ops.octopus.plan(host_offsets, n, block)
            h2d_ms = wall_ms(lambda: host_plan.to(device), device) if device.type == "cuda" else 0.0
        elif strategy == "lookup":
            setup = median_ms(lambda: torch.ops.octopus.lookup_table(offsets, n), device, repeats=5)
        else:
            setup = 0.0
        meta = batch.metadata(strategy, block)
        meta_mb = meta.numel() * meta.element_size() / 1e6 if meta is not None else 0.0
        kernel = measurer.measure(
            lambda: torch.ops.octopus.affine(values, offsets, scale, bias, strategy, block, meta, False), repeats=repeats)
        label = f"octopus {strategy}" + (f" b={block}" if len(block_sizes) > 1 else "")
        row(label, kernel, setup, h2d_ms, meta_mb, strategy, block)
        # Every strategy must give the same answer (each finds items its own way).
        got = torch.ops.octopus.affine(values, offsets, scale, bias, strategy, block, meta, False)
        if reference is None:
            reference = got
        elif not torch.equal(got, reference):
            raise AssertionError(f"octopus {strategy} b={block} disagrees with {rows[1]['method']}")
        del meta, got
    del reference
    if not baselines:
        return rows

    lengths = offsets.diff()

    def repeat_interleave():
        return values * scale.repeat_interleave(lengths, output_size=n) + bias.repeat_interleave(lengths, output_size=n)

    row("torch repeat_interleave", measurer.measure(repeat_interleave, repeats=repeats),
        metadata_mb=2 * 4 * n / 1e6, note="two expanded per-element parameter tensors")
    if batch.item_dim == 1:
        try:
            nt = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
            s2, b2 = scale.view(m, 1), bias.view(m, 1)
            row("torch nested (jagged)", measurer.measure(lambda: nt * s2 + b2, repeats=repeats),
                note="jagged NJT broadcast with [M, 1] parameters")
        except Exception as err:  # nested broadcasting is partial in torch: report, don't fail
            row("torch nested (jagged)", None, note=f"not supported: {type(err).__name__}: {str(err)[:80]}")
    _padded_baseline(batch, scale, bias, measurer, repeats, row)
    if m <= loop_max_items:
        o = batch.host_layout()[0].tolist()
        s_list, b_list = scale.tolist(), bias.tolist()

        def loop():
            for i in range(m):
                torch.add(values[o[i]:o[i + 1]] * s_list[i], b_list[i], out=out[o[i]:o[i + 1]])

        row("torch per-item loop", measurer.measure(loop, warmup=1, repeats=3))
    else:
        row("torch per-item loop", None, note=f"skipped: {m} items (run only up to {loop_max_items})")
    return rows


def _padded_baseline(batch, scale, bias, measurer: Measurer, repeats: int, row) -> None:
    """Pad every item to the largest one and run the dense op; setup is the padding."""
    sizes = batch.host_layout()[1]
    max_shape = sizes.amax(dim=0).tolist() if len(batch) else [0] * batch.item_dim
    padded_elems = len(batch) * int(torch.tensor(max_shape).prod())
    if 2 * 4 * padded_elems > PADDED_MAX_BYTES:
        row("torch padded batch", None,
            note=f"skipped: padded input + output would take {2 * 4 * padded_elems / 2**30:.0f} GiB")
        return
    device = measurer.device
    setup = wall_ms(lambda: batch.to_padded(0.0), device, repeats=3, warmup=1)
    padded = batch.to_padded(0.0)
    view = (-1,) + (1,) * batch.item_dim
    s, b = scale.view(view), bias.view(view)
    row("torch padded batch", measurer.measure(lambda: padded * s + b, repeats=repeats), setup_ms=setup,
        metadata_mb=4 * (padded_elems - batch.numel()) / 1e6,
        note=f"dense op on [M, {', '.join(map(str, max_shape))}]; metadata = padding bytes")


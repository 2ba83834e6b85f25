"""The normalize, padding and crop_resize workloads of ``octopus-bench``: per-item instance
normalization, ragged -> padded -> ragged, and crops of a frame resized to a fixed size, each
beside what a PyTorch user writes today and the memory floor (the bytes the op must move, at
the measured copy bandwidth)."""

from __future__ import annotations

import math
from typing import Dict, List

import torch
import torch.nn.functional as F

import octopus

from .affine import make_batch
from .timing import Measurer, median_ms

EPS = 1e-5


def _rows(copy_gbs: float, moved_bytes: int):
    rows: List[Dict] = []

    def row(method, measured, setup_ms=0.0, metadata_mb=0.0, strategy=None, note="", moved=moved_bytes):
        r = dict(method=method, strategy=strategy, block_elems=None, setup_ms=setup_ms, h2d_ms=0.0,
                 metadata_mb=metadata_mb, note=note,
                 **(measured or dict(kernel_ms=None, peak_mb=None, energy_mj=None)))
        ms = r["kernel_ms"]
        r["total_ms"] = setup_ms + ms if ms is not None else None
        r["gbs"] = moved / ms / 1e6 if ms else None
        r["pct_copy"] = 100 * r["gbs"] / copy_gbs if ms else None
        rows.append(r)

    floor = dict(kernel_ms=moved_bytes / copy_gbs / 1e6, peak_mb=None, energy_mj=None)
    return rows, row, floor


def run_normalize(sizes: torch.Tensor, measurer: Measurer, copy_gbs: float, repeats: int, baselines: bool,
                  loop_max_items: int) -> List[Dict]:
    """(x - mean_i) / (std_i + eps) per item, fp32: 2 reads + 1 write per element at least."""
    device = measurer.device
    batch = make_batch(sizes, device)
    values, offsets = batch.values, batch.offsets
    n, m = batch.numel(), len(batch)
    rows, row, floor = _rows(copy_gbs, 12 * n)
    row("memory floor (2 reads + 1 write)", floor, note="the op's bytes at the measured copy bandwidth")
    setup = median_ms(lambda: torch.ops.octopus.plan(offsets, n, octopus.DEFAULT_BLOCK_ELEMS), device,
                      repeats=repeats)
    batch.plan()
    row("octopus normalize", measurer.measure(lambda: octopus.normalize(batch, correction=1, eps=EPS),
                                              repeats=repeats), setup_ms=setup, strategy="plan")
    got = octopus.normalize(batch, correction=1, eps=EPS).values
    if not baselines:
        return rows
    lengths = offsets.diff()

    def segment_reduce():
        total = torch.segment_reduce(values, "sum", lengths=lengths, unsafe=True)
        squares = torch.segment_reduce(values * values, "sum", lengths=lengths, unsafe=True)
        count = lengths.clamp_min(1).to(values.dtype)
        mean = total / count
        var = ((squares - total * mean) / (count - 1).clamp_min(1)).clamp_min(0)
        return (values - mean.repeat_interleave(lengths, output_size=n)) * (
            var.repeat_interleave(lengths, output_size=n) + EPS).rsqrt()

    def reference():  # float64, two passes: the statistics a float32 op should reach
        v = values.double()
        count = lengths.clamp_min(1).double()
        mean = (torch.segment_reduce(v, "sum", lengths=lengths, unsafe=True) / count).repeat_interleave(
            lengths, output_size=n)
        var = torch.segment_reduce((v - mean).square(), "sum", lengths=lengths, unsafe=True) / (count - 1).clamp_min(1)
        return (v - mean) * (var.repeat_interleave(lengths, output_size=n) + EPS).rsqrt()

    want = reference()
    # float32 output: x - mean rounds to a float32 near the mean (1.9e-5 off on the H100's 216M-element batch)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    # The one-pass float32 sums lose digits on large items: its error is reported, not checked.
    baseline_error = float((segment_reduce().double() - want).abs().max()) if n else 0.0
    del want
    row("torch segment_reduce + repeat_interleave", measurer.measure(segment_reduce, repeats=repeats),
        note=f"sum and sum of squares (float32), statistics expanded per element; "
             f"largest error {baseline_error:.1e} against float64")
    if m <= loop_max_items:
        o = batch.host_layout()[0].tolist()
        out = torch.empty_like(values)

        def loop():
            for i in range(m):
                x = values[o[i]:o[i + 1]]
                torch.div(x - x.mean(), x.std() + EPS, out=out[o[i]:o[i + 1]])

        row("torch per-item loop", measurer.measure(loop, warmup=1, repeats=3))
    else:
        row("torch per-item loop", None, note=f"skipped: {m} items (run only up to {loop_max_items})")
    return rows


def run_padding(sizes: torch.Tensor, measurer: Measurer, copy_gbs: float, repeats: int, baselines: bool,
                loop_max_items: int, max_padded_elems: int = 1 << 30) -> List[Dict]:
    """ragged -> padded and back; the floor is the ragged read plus the padded write. The
    slot is the largest item, unless the padded batch would exceed ``max_padded_elems``:
    then 2-D items get slots of at most 128 per side (1-D: the budget's share) and larger
    items are cropped."""
    device = measurer.device
    batch = make_batch(sizes, device)
    n, m = batch.numel(), len(batch)
    host_sizes = batch.host_layout()[1]
    slot = host_sizes.amax(0).tolist() if m else [0] * batch.item_dim
    if m * int(torch.tensor(slot).prod()) > max_padded_elems:
        cap = 128 if batch.item_dim > 1 else max_padded_elems // m
        slot = [min(int(e), cap) for e in slot]
    padded_elems = m * int(torch.tensor(slot).prod())
    cropped = int((host_sizes > torch.tensor(slot)).any(1).sum())
    kept = int(host_sizes.clamp(max=torch.tensor(slot)).prod(1).sum())
    note = f"slot {'x'.join(map(str, slot))}" + (f"; {cropped} larger items cropped" if cropped else "")
    rows, row, floor = _rows(copy_gbs, 4 * (n + padded_elems))
    row("memory floor (ragged read + padded write)", floor, note=note)
    row("octopus to_padded", measurer.measure(lambda: octopus.to_padded(batch, 0.0, slot), repeats=repeats),
        note=note)
    dense = octopus.to_padded(batch, 0.0, slot)
    clipped = host_sizes.clamp(max=torch.tensor(slot))
    back_bytes = 8 * kept  # the kept elements read from the slots and written packed
    back = octopus.from_padded(dense, clipped)
    strategy = octopus.tuning.tuned_choice(device).strategy
    note = "GB/s and % copy of the kept elements read from the slots and written packed"
    if not cropped:  # the batch's own layout (what a round trip does): nothing on the host
        r = measurer.measure(lambda: octopus.from_padded(dense, batch, validate=False), repeats=repeats)
        row("octopus from_padded (back)", r, strategy=strategy, moved=back_bytes, note=note)
    r = measurer.measure(lambda: octopus.from_padded(dense, clipped, validate=False), repeats=repeats)
    row("octopus from_padded (back, sizes from the host)", r, strategy=strategy, moved=back_bytes,
        note=note + "; offsets summed on the device and the plan built, every call")
    if not baselines:
        return rows
    items = batch.unbind()
    crops = [it[tuple(slice(0, s) for s in slot)] for it in items]
    try:
        def nested():
            return torch.nested.nested_tensor(crops, layout=torch.strided).to_padded_tensor(0.0, output_size=(m, *slot))

        setup = median_ms(lambda: torch.nested.nested_tensor(crops, layout=torch.strided), device, warmup=1, repeats=3)
        nt = torch.nested.nested_tensor(crops, layout=torch.strided)
        row("torch.nested.to_padded_tensor", measurer.measure(lambda: nt.to_padded_tensor(0.0, output_size=(m, *slot)),
                                                              repeats=repeats), setup_ms=setup,
            note="strided nested tensor of the crops (setup: building it), explicit output_size")
        assert torch.equal(nested(), dense)
        del nt
    except (RuntimeError, AssertionError) as err:
        row("torch.nested.to_padded_tensor", None, note=f"failed: {type(err).__name__}: {str(err)[:80]}")
    if m <= loop_max_items:
        out = torch.empty_like(dense)

        def loop():
            out.zero_()
            for i, c in enumerate(crops):
                out[i][tuple(slice(0, s) for s in c.shape)] = c

        row("torch per-item loop", measurer.measure(loop, warmup=1, repeats=3))
    else:
        row("torch per-item loop", None, note=f"skipped: {m} items (run only up to {loop_max_items})")
    del back
    return rows


def run_crop_resize(measurer: Measurer, copy_gbs: float, repeats: int, baselines: bool, scale_down: int,
                    crops: int = 1000, size: int = 224) -> List[Dict]:
    """``crops`` long-tail boxes (log-normal around 45x50) from one 3x1080x1920 fp32 frame,
    each resized to 3 x size x size; the floor is writing the output at copy bandwidth."""
    device = measurer.device
    crops = max(10, crops // scale_down)
    g = torch.Generator().manual_seed(0)
    frame = torch.rand(1, 3, 1080, 1920, generator=g).to(device)
    h = torch.exp(torch.randn(crops, generator=g) * 0.6 + math.log(45)).round().clamp(2, 1080).long()
    w = torch.exp(torch.randn(crops, generator=g) * 0.6 + math.log(50)).round().clamp(2, 1920).long()
    y0 = (torch.rand(crops, generator=g) * (1080 - h + 1)).long()
    x0 = (torch.rand(crops, generator=g) * (1920 - w + 1)).long()
    boxes = torch.stack([torch.zeros_like(h), y0, x0, y0 + h, x0 + w], dim=1).to(device)
    out_bytes = crops * 3 * size * size * 4
    rows, row, floor = _rows(copy_gbs, out_bytes)
    row("memory floor (output write)", floor, note=f"{crops} crops to 3x{size}x{size}")
    resize = lambda: octopus.crop_resize(frame, boxes, size, validate=False)  # noqa: E731
    row("octopus crop_resize", measurer.measure(resize, repeats=repeats))
    row("octopus crop_resize, back-to-back calls (per call)", measurer.back_to_back(resize),
        note="host launch overlapped with the previous call's kernel")
    if baselines:
        _crop_resize_baselines(frame, boxes, size, octopus.crop_resize(frame, boxes, size), measurer, repeats, row)
    for r in rows:
        r.update(items=crops, elements=crops * 3 * size * size)
    return rows


def _crop_resize_baselines(frame, boxes, size, got, measurer: Measurer, repeats: int, row) -> None:
    box_list = boxes.tolist()
    out = torch.empty_like(got)

    def loop():
        for k, (_, a, b, c, d) in enumerate(box_list):
            out[k] = F.interpolate(frame[:, :, a:c, b:d], size=(size, size), mode="bilinear", align_corners=False)[0]

    row("torch F.interpolate per crop", measurer.measure(loop, warmup=1, repeats=3))
    torch.testing.assert_close(out, got, rtol=1e-5, atol=1e-5)
    try:
        from torchvision.ops import roi_align
    except ImportError:
        row("torchvision roi_align", None, note="torchvision is not installed")
        return
    rois = torch.cat([boxes[:, :1], boxes[:, [2, 1, 4, 3]]], dim=1).float()  # (image, x0, y0, x1, y1)
    row("torchvision roi_align", measurer.measure(
        lambda: roi_align(frame, rois, (size, size), spatial_scale=1.0, sampling_ratio=2, aligned=True),
        repeats=repeats), note="not the same function: averages sampling points per bin")

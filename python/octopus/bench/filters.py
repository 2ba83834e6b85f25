"""The stencil and tiles workloads of ``octopus-bench``: a 3x3 blur over many small or
normal-size images, and tile filtering of one large image — each beside what a PyTorch user
writes today and the memory floor (the bytes the op must move, at the measured copy
bandwidth)."""

from __future__ import annotations

from typing import Dict, List, cast

import torch
import torch.nn.functional as F

import octopus

from .image_ops import _rows
from .timing import Measurer, median_ms

# name -> (images, smallest side, largest side): single-channel fp32 images, H and W drawn
# independently and uniformly.
STENCIL_CASES = {"small-100k": (100_000, 55, 90), "normal-10k": (10_000, 170, 280)}
TILE_SIDE, TILE_MIN, TILE_MAX = 8192, 128, 512


def run_stencil(case: str, measurer: Measurer, copy_gbs: float, repeats: int, baselines: bool, scale_down: int,
                loop_max_items: int) -> List[Dict]:
    """3x3 blur of ragged [1, H, W] images: octopus (replicate and zero borders), conv2d
    per image, conv2d on the padded batch. The floor reads and writes every pixel once."""
    device = measurer.device
    count, lo, hi = STENCIL_CASES[case]
    m = max(10, count // scale_down)
    g = torch.Generator().manual_seed(1)
    hw = torch.randint(lo, hi + 1, (m, 2), generator=g)
    n = int(hw.prod(1).sum())
    values = torch.rand(n, generator=g).to(device)
    sizes = torch.cat([torch.ones(m, 1, dtype=torch.int64), hw], dim=1)
    offsets = torch.zeros(m + 1, dtype=torch.int64)
    offsets[1:] = sizes.prod(1).cumsum(0)
    batch = octopus.RaggedBatch(values, offsets.to(device), sizes.to(device))
    rows, row, floor = _rows(copy_gbs, 8 * n)
    note = f"{m} images of 1 x [{lo}, {hi}] x [{lo}, {hi}], fp32"
    row("memory floor (1 read + 1 write)", floor, note=note)
    weight = torch.randn(1, 1, 3, 3, generator=g).to(device)
    strategy = octopus.tuning.tuned_choice(device).strategy
    batch.metadata(strategy)
    row("octopus gaussian_blur (replicate)",
        measurer.measure(lambda: octopus.gaussian_blur(batch), repeats=repeats), strategy=strategy)
    row("octopus depthwise_conv3x3 (zero)",
        measurer.measure(lambda: octopus.depthwise_conv3x3(batch, weight), repeats=repeats), strategy=strategy)
    got = octopus.depthwise_conv3x3(batch, weight)
    if baselines:
        _stencil_baselines(batch, hw, weight, got, measurer, repeats, row, loop_max_items)
    for r in rows:
        r.update(items=m, elements=n)
    return rows


def _stencil_baselines(batch, hw, weight, got, measurer: Measurer, repeats: int, row, loop_max_items: int) -> None:
    device, m, n = batch.device, len(batch), batch.numel()
    items = batch.unbind()
    for k in (0, m // 2, m - 1):  # the op against conv2d on a few images
        want = F.conv2d(items[k][None], weight, padding=1)[0]
        torch.testing.assert_close(got.unbind()[k], want, rtol=1e-5, atol=1e-5)
    slot = hw.amax(0).tolist()
    setup = median_ms(lambda: octopus.to_padded(batch, 0.0, [1, *slot]), device, repeats=5)
    dense = octopus.to_padded(batch, 0.0, [1, *slot])
    row("torch conv2d on the padded batch", measurer.measure(lambda: F.conv2d(dense, weight, padding=1),
                                                             repeats=repeats), setup_ms=setup,
        note=f"[{m}, 1, {slot[0]}, {slot[1]}] built by octopus.to_padded (setup); conv2d only, zero borders",
        moved=8 * n)
    del dense
    if m <= loop_max_items:
        out = torch.empty_like(batch.values)
        o = batch.host_layout()[0].tolist()

        def loop():
            for k, item in enumerate(items):
                out[o[k]:o[k + 1]] = F.conv2d(item[None], weight, padding=1).view(-1)

        row("torch conv2d per image", measurer.measure(loop, warmup=1, repeats=3))
    else:
        row("torch conv2d per image", None, note=f"skipped: {m} images (run only up to {loop_max_items})")


def grid_tiles(height: int, width: int, lo: int, hi: int, g: torch.Generator) -> torch.Tensor:
    """Tiles of random heights and widths in [lo, hi] covering a height x width image, row
    band by row band (edge tiles are cut to the image)."""
    rows, y = [], 0
    while y < height:
        th = int(torch.randint(lo, hi + 1, (1,), generator=g))
        x = 0
        while x < width:
            tw = int(torch.randint(lo, hi + 1, (1,), generator=g))
            rows.append([y, x, min(y + th, height), min(x + tw, width)])
            x += tw
        y += th
    return torch.tensor(rows, dtype=torch.int64)


def run_tiles(measurer: Measurer, copy_gbs: float, repeats: int, baselines: bool, scale_down: int) -> List[Dict]:
    """Per-tile mean and fraction above a threshold of a single-channel fp32 image cut into
    variable tiles, keep = fraction <= 0.3 (cloud cover), and the kept tiles gathered.
    The floor reads the image once."""
    device = measurer.device
    shrink = 1 if scale_down == 1 else 16
    side, lo, hi = TILE_SIDE // shrink, TILE_MIN // shrink, TILE_MAX // shrink
    g = torch.Generator().manual_seed(2)
    tiles = grid_tiles(side, side, lo, hi, g).to(device)
    # Ground in [0, 0.7) under bright cloud fields (+0.5) that cover about a third of the image.
    field = F.interpolate(torch.rand(1, 1, 24, 24, generator=g), size=(side, side), mode="bilinear",
                          align_corners=False)[0]
    image = (torch.rand(1, side, side, generator=g) * 0.7 + 0.5 * (field > 0.62)).to(device)
    threshold, max_fraction = 0.8, 0.3
    rows, row, floor = _rows(copy_gbs, 4 * side * side)
    note = f"{side}x{side} fp32, {len(tiles)} tiles of {lo}-{hi} px a side"
    row("memory floor (image read once)", floor, note=note)
    stats = lambda: octopus.tile_filter(image, tiles, threshold, max_fraction=max_fraction, validate=False)  # noqa: E731
    row("octopus tile_filter (stats + keep)", measurer.measure(stats, repeats=repeats), note="one launch")
    row("octopus tile_filter, back-to-back calls (per call)", measurer.back_to_back(stats),
        note="host launch overlapped with the previous call's kernel")
    res = octopus.tile_filter(image, tiles, threshold, max_fraction=max_fraction, gather=True, validate=False)
    kept = cast(octopus.RaggedBatch, res.kept)  # gather=True
    kept_values = kept.numel()
    row("octopus tile_filter + gather kept tiles",
        measurer.measure(lambda: octopus.tile_filter(image, tiles, threshold, max_fraction=max_fraction, gather=True,
                                                     validate=False), repeats=repeats),
        moved=4 * side * side + 8 * kept_values,
        note=f"{len(kept)} of {len(tiles)} tiles kept; floor adds their read + write; one host sync")
    if baselines:
        host_tiles = tiles.tolist()
        img = image[0]

        def loop(gather: bool):
            means, fractions, kept = [], [], []
            for y0, x0, y1, x1 in host_tiles:
                t = img[y0:y1, x0:x1]
                means.append(t.mean())
                fractions.append((t > threshold).float().mean())
            fraction = torch.stack(fractions)
            keep = fraction <= max_fraction
            if gather:
                kept = [img[y0:y1, x0:x1].clone() for (y0, x0, y1, x1), k in zip(host_tiles, keep.tolist()) if k]
            return torch.stack(means), fraction, keep, kept

        row("torch per-tile loop (stats + keep)", measurer.measure(lambda: loop(False), warmup=1, repeats=3),
            note="mean and (t > threshold).mean() per tile view")
        _, fraction, keep, _ = loop(False)
        # torch averages the float32 mask in float32: ~1e-5 off on the largest tiles.
        torch.testing.assert_close(res.fraction.float(), fraction, rtol=0, atol=1e-4)
        row("torch per-tile loop + gather", measurer.measure(lambda: loop(True), warmup=1, repeats=3),
            moved=4 * side * side + 8 * kept_values, note="the kept tiles cloned (keep read on the host)")
    for r in rows:
        r.update(items=len(tiles), elements=side * side)
    return rows

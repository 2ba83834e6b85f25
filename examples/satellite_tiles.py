#!/usr/bin/env python3
"""Satellite tiles: a large multi-band image cut into tiles, cloudy tiles dropped, the rest
normalized per tile and band and classified, with octopus beside a per-tile Python loop.

Input: a 13-band image like a Sentinel-2 L1C product at 10 m (10980 x 10980 on a GPU by
default), generated with soft-edged bright cloud blobs over textured ground when no file is
given, or a multi-band GeoTIFF (``--input``; read with rasterio or tifffile, whichever is
installed; integer values are scaled by ``--dn-scale``, 1/10000 for L1C digital numbers).

The image is cut into tiles of random sizes (``--tile-min`` to ``--tile-max`` pixels a side,
row band by row band), and then:

* ``octopus``: ``tile_filter`` on the cloud band (a view of the image: no copy) keeps the tiles
  whose fraction of pixels brighter than ``--cloud-threshold`` is at most ``--max-fraction``
  (one launch); the kept tiles, every band, are gathered into a ``RaggedBatch`` by
  ``crop_resize(..., None)`` (one launch); ``normalize`` scales each tile and band to zero mean
  and unit variance (two launches); ``crop_resize`` brings every tile to S x S (one launch);
  a small CNN classifies them in one batch.
* ``torch per-tile loop``: the same per tile in Python (cloud fraction, keep decision on the
  host, mean/std normalization, F.interpolate), then the same CNN on the stacked tiles.

Why resize the kept tiles to one size: the CNN then runs once over all of them. Tile sizes are
free, so grouping tiles of equal size would leave about one tile per group (a model call
each), and padding to the largest tile would have the model spend most of its work on
padding. The price is that each tile's ground resolution changes by its own factor, fine for
a scene-level classifier, not for per-pixel work.

Printed and written as JSON per method: preprocessing time, model time, end-to-end time,
tiles/s (all tiles, kept or dropped, per second end to end), kept and dropped counts. Checked
and asserted: the two paths keep exactly the same tiles, the gathered tiles equal the image's
pixels bit for bit, the model inputs agree to 1e-4 and the logits to 1e-3. A CSV lists every
tile with its cloud fraction, whether it was kept and the top class.

    python3 examples/satellite_tiles.py                   # synthetic 10980 x 10980 x 13 on cuda
    python3 examples/satellite_tiles.py --input T32TQM.tif --cloud-band B02 --json sat.json
    python3 examples/satellite_tiles.py --tiny --device cpu
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from typing import List, NamedTuple

import torch
import torch.nn.functional as F

import octopus
from octopus.bench.filters import grid_tiles

import example_harness as harness

SCHEMA = "octopus-examples/satellite-tiles/1"
BANDS = ("B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B8A", "B09", "B10", "B11", "B12")
# The synthetic scene's reflectance per band: textured ground and thick cloud (made-up values
# with the right ordering: clouds bright in the visible and near infrared, dim in B09/B10).
GROUND = (0.12, 0.10, 0.09, 0.08, 0.12, 0.20, 0.23, 0.25, 0.26, 0.05, 0.01, 0.18, 0.12)
CLOUD = (0.55, 0.60, 0.60, 0.60, 0.60, 0.60, 0.60, 0.60, 0.58, 0.25, 0.08, 0.40, 0.30)
EPS = 1e-5  # added to each tile's variance, as instance_norm does
INPUT_TOLERANCE, LOGIT_TOLERANCE = 1e-4, 1e-3
CLASSES = 10
OCTOPUS, LOOP = "octopus tile_filter + crop_resize + normalize", "torch per-tile loop"


class DataError(ValueError):
    """An input image that cannot be read or used."""


class Scene(NamedTuple):
    image: torch.Tensor  # float32 [C, H, W] on the device
    bands: List[str]
    source: str


def synthetic_scene(side: int, blob: int, device: torch.device, seed: int) -> Scene:
    """A 13 x side x side reflectance image: ground with a coarse texture and per-pixel noise,
    under clouds whose opacity is a smooth random field (one random value per ``blob`` pixels,
    bicubic in between) cut at a level: soft-edged blobs about ``blob`` pixels across."""
    g = torch.Generator(device=device).manual_seed(seed)

    def smooth(cells: int) -> torch.Tensor:
        coarse = torch.rand(1, 1, cells, cells, generator=g, device=device)
        return F.interpolate(coarse, size=(side, side), mode="bicubic", align_corners=False)[0, 0]

    opacity = smooth(max(2, round(side / blob))).sub_(0.55).div_(0.15).clamp_(0, 1)
    clear = 1 - opacity
    texture = smooth(96).clamp_(0, 1).mul_(0.8).add_(0.6)  # 0.6x to 1.4x the band's ground reflectance
    image = torch.empty(len(BANDS), side, side, device=device)
    for b, band in enumerate(image):  # band by band: no full-size temporaries
        band.normal_(0, 0.01, generator=g).add_(texture, alpha=GROUND[b]).mul_(clear).add_(opacity, alpha=CLOUD[b])
    return Scene(image, list(BANDS), "synthetic")


def read_geotiff(path: str, dn_scale: float, device: torch.device) -> Scene:
    """A multi-band GeoTIFF as float32 [C, H, W] (integers times ``dn_scale``)."""
    import numpy as np
    try:
        import rasterio
    except ImportError:
        rasterio = None
    try:
        if rasterio is not None:
            with rasterio.open(path) as src:
                array = src.read()  # [bands, H, W]
        else:
            try:
                import tifffile
            except ImportError:
                raise DataError("reading a GeoTIFF needs rasterio or tifffile (pip install tifffile)") from None
            with tifffile.TiffFile(path) as tif:
                series = tif.series[0]
                array, axes = series.asarray(), series.axes
            if array.ndim == 3:  # planar ([bands, H, W]) or interleaved ([H, W, bands])
                array = np.moveaxis(array, next(i for i, a in enumerate(axes) if a not in "YX"), 0)
    except (OSError, ValueError) as err:
        if isinstance(err, DataError):
            raise
        raise DataError(f"cannot read {path!r}: {err}") from None
    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3 or 0 in array.shape:
        raise DataError(f"{path!r}: expected a [bands, H, W] image, got shape {array.shape}")
    scale = dn_scale if np.issubdtype(array.dtype, np.integer) else 1.0
    image = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).mul_(scale).to(device)
    bands = list(BANDS) if image.shape[0] == len(BANDS) else [f"band{i + 1}" for i in range(image.shape[0])]
    return Scene(image, bands, os.path.abspath(path))


def tiny_cnn(bands: int, classes: int = CLASSES) -> torch.nn.Module:
    """A small scene classifier: three strided 3x3 convolutions, global average pooling and a
    linear layer (random weights)."""
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(bands, 32, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes))


class Settings(NamedTuple):
    cloud_band: int
    threshold: float     # rounded to float32, so that both paths compare with the same value
    max_fraction: float
    size: int            # the model's input is C x size x size


class OctopusResult(NamedTuple):
    fraction: torch.Tensor    # float64 [T]: each tile's share of cloud-bright pixels
    kept_index: torch.Tensor  # int64 [K]: the kept tiles
    kept: octopus.RaggedBatch  # their [C, h, w] pixels
    inputs: torch.Tensor      # float32 [K, C, size, size]: normalized and resized


def octopus_pipeline(scene: Scene, tiles: torch.Tensor, s: Settings) -> OctopusResult:
    image = scene.image
    res = octopus.tile_filter(image[s.cloud_band], tiles, s.threshold, max_fraction=s.max_fraction, validate=False)
    kept_index = res.keep.nonzero().squeeze(1)  # the host learns how many tiles were kept here
    chosen = tiles[kept_index]
    count, bands = len(chosen), image.shape[0]
    if count == 0:
        empty = octopus.RaggedBatch.from_tensors([], device=image.device, item_dim=3)
        return OctopusResult(res.fraction, kept_index, empty, image.new_empty(0, bands, s.size, s.size))
    kept = octopus.crop_resize(image[None], torch.cat([torch.zeros_like(chosen[:, :1]), chosen], dim=1), None,
                               validate=False)
    normalized = octopus.normalize(kept, bands, eps=EPS)
    whole = torch.cat([torch.arange(count, device=image.device)[:, None], torch.zeros_like(chosen[:, :2]),
                       chosen[:, 2:] - chosen[:, :2]], dim=1)  # (tile, 0, 0, h, w): every kept tile entire
    inputs = octopus.crop_resize(normalized, whole, s.size, validate=False)
    return OctopusResult(res.fraction, kept_index, kept, inputs)


def loop_pipeline(scene: Scene, host_tiles: List[List[int]], s: Settings):
    """What a PyTorch user writes today: tile by tile, the keep decision on the host."""
    image, cloud = scene.image, scene.image[s.cloud_band]
    inputs, kept = [], []
    for t, (y0, x0, y1, x1) in enumerate(host_tiles):
        bright = int((cloud[y0:y1, x0:x1] > s.threshold).sum())
        if bright / ((y1 - y0) * (x1 - x0)) > s.max_fraction:
            continue
        tile = image[:, y0:y1, x0:x1]
        mean = tile.mean(dim=(1, 2), keepdim=True)
        var = tile.var(dim=(1, 2), keepdim=True, correction=0)
        inputs.append(F.interpolate(((tile - mean) / (var + EPS).sqrt())[None], size=(s.size, s.size), mode="bilinear",
                                    align_corners=False))
        kept.append(t)
    stacked = torch.cat(inputs) if inputs else image.new_empty(0, image.shape[0], s.size, s.size)
    return stacked, kept


def check(scene: Scene, host_tiles, ours: OctopusResult, theirs, model) -> dict:
    """The two paths against each other (asserted): the same tiles kept, the gathered tiles
    equal to the image's pixels, model inputs within INPUT_TOLERANCE, logits within
    LOGIT_TOLERANCE."""
    loop_inputs, loop_kept = theirs
    kept = ours.kept_index.tolist()
    harness.require(kept == loop_kept, f"the paths keep different tiles: octopus {len(kept)}, the loop "
                                       f"{len(loop_kept)}; kept by one only: {sorted(set(kept) ^ set(loop_kept))[:10]}")
    for t, pixels in zip(kept, ours.kept.unbind()):
        y0, x0, y1, x1 = host_tiles[t]
        harness.require(torch.equal(pixels, scene.image[:, y0:y1, x0:x1]), f"gathered tile {t} differs from the image")
    input_diff = float((ours.inputs - loop_inputs).abs().max()) if kept else 0.0
    harness.require(input_diff <= INPUT_TOLERANCE, f"model inputs differ by {input_diff} > {INPUT_TOLERANCE}")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # TF32 would round the inputs' last bits apart
        logit_diff = float((model(ours.inputs) - model(loop_inputs)).abs().max()) if kept else 0.0
    harness.require(logit_diff <= LOGIT_TOLERANCE, f"logits differ by {logit_diff} > {LOGIT_TOLERANCE}")
    return dict(same_tiles_kept=True, gathered_tiles_identical=True, max_abs_input_diff=input_diff,
                input_tolerance=INPUT_TOLERANCE, max_abs_logit_diff=logit_diff, logit_tolerance=LOGIT_TOLERANCE)


def write_tiles(path: str, host_tiles, ours: OctopusResult, logits: torch.Tensor) -> int:
    """One CSV row per tile: its box, cloud fraction, whether it was kept, and for kept tiles
    the top class and its softmax probability."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    top = dict(zip(ours.kept_index.tolist(), zip(*(v.tolist() for v in logits.float().softmax(1).max(1)))))
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["tile", "y0", "x0", "y1", "x1", "cloud_fraction", "kept", "class", "prob"])
        for t, (box, fraction) in enumerate(zip(host_tiles, ours.fraction.tolist())):
            prob, cls = top.get(t, ("", ""))
            writer.writerow([t, *box, fraction, int(t in top), cls, prob])
    return len(host_tiles)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default=None, metavar="TIF", help="a multi-band GeoTIFF (default: a synthetic scene)")
    p.add_argument("--dn-scale", type=float, default=1e-4,
                   help="integer values are multiplied by this (default 1e-4: L1C digital numbers to reflectance)")
    p.add_argument("--size", type=harness.positive_int, default=None,
                   help="the synthetic scene's side (default 10980 on cuda, 2048 on cpu, 256 with --tiny)")
    p.add_argument("--tile-min", type=harness.positive_int, default=None,
                   help="smallest tile side (default 128 on cuda, 64 on cpu, 24 with --tiny)")
    p.add_argument("--tile-max", type=harness.positive_int, default=None,
                   help="largest tile side (default 512 on cuda, 256 on cpu, 64 with --tiny)")
    p.add_argument("--cloud-band", default="B02",
                   help="the band the cloud test reads: a name of a 13-band image (B01..B12, B8A) or a 0-based index "
                        "(default B02, blue)")
    p.add_argument("--cloud-threshold", type=float, default=0.3,
                   help="a pixel is cloud-bright above this reflectance (default 0.3)")
    p.add_argument("--max-fraction", type=float, default=0.3,
                   help="a tile is kept when at most this fraction of it is cloud-bright (default 0.3)")
    p.add_argument("--model-size", type=harness.positive_int, default=None,
                   help="tiles are resized to S x S for the model (default 128; 32 with --tiny)")
    p.add_argument("--csv", default=None, metavar="PATH", help="the per-tile CSV (default OUT/tiles.csv)")
    harness.add_common_options(p, "satellite-tiles")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    device = harness.resolve_device(parser, args.device)
    repeats = harness.default_repeats(args, device)
    on_gpu = device.type == "cuda"
    tile_min = args.tile_min or (24 if args.tiny else (128 if on_gpu else 64))
    tile_max = args.tile_max or (64 if args.tiny else (512 if on_gpu else 256))
    if tile_min > tile_max:
        parser.error(f"--tile-min {tile_min} is larger than --tile-max {tile_max}")
    try:
        scene = (read_geotiff(args.input, args.dn_scale, device) if args.input else
                 synthetic_scene(args.size or (256 if args.tiny else (10980 if on_gpu else 2048)), tile_max, device,
                                 args.seed))
    except DataError as err:
        parser.error(str(err))
    bands, height, width = scene.image.shape
    if args.cloud_band in scene.bands:
        cloud_band = scene.bands.index(args.cloud_band)
    elif args.cloud_band.isdigit() and int(args.cloud_band) < bands:
        cloud_band = int(args.cloud_band)
    else:
        parser.error(f"--cloud-band {args.cloud_band!r}: not a band of this {bands}-band image "
                     f"({', '.join(scene.bands)} or 0..{bands - 1})")
    settings = Settings(cloud_band, float(torch.tensor(args.cloud_threshold, dtype=torch.float32)), args.max_fraction,
                        args.model_size or (32 if args.tiny else 128))
    host_tiles = grid_tiles(height, width, tile_min, tile_max, torch.Generator().manual_seed(args.seed)).tolist()
    tiles = torch.tensor(host_tiles, device=device)

    torch.manual_seed(args.seed)
    model = tiny_cnn(bands).eval().to(device)
    clock = harness.Clock(device)
    with torch.inference_mode():
        ours = octopus_pipeline(scene, tiles, settings)
        checks = check(scene, host_tiles, ours, loop_pipeline(scene, host_tiles, settings), model)
        kept = len(ours.kept_index)
        methods = {OCTOPUS: lambda _: octopus_pipeline(scene, tiles, settings).inputs,
                   LOOP: lambda _: loop_pipeline(scene, host_tiles, settings)[0]}
        rows = []
        for name, preprocess in methods.items():
            r = dict(method=name, **harness.time_pipeline(preprocess, model, 1, clock, args.warmup, repeats,
                                                          latency=False))
            r.update(tiles_per_s=len(host_tiles) / r["end_to_end_ms"] * 1e3, kept=kept, dropped=len(host_tiles) - kept)
            rows.append(r)
        logits = model(ours.inputs).cpu()

    csv_path = args.csv or os.path.join(args.out, "tiles.csv")
    write_tiles(csv_path, host_tiles, ours, logits)
    data = dict(source=scene.source, bands=scene.bands, height=height, width=width, tiles=len(host_tiles),
                tile_sides=[tile_min, tile_max], kept=kept, dropped=len(host_tiles) - kept,
                kept_pixels=ours.kept.numel() // bands,
                cloud_band=scene.bands[cloud_band], cloud_threshold=settings.threshold,
                max_fraction=settings.max_fraction, model_input=[bands, settings.size, settings.size],
                model="3 strided 3x3 convolutions + global average pooling + linear, random weights",
                csv=os.path.abspath(csv_path))
    print(f"satellite tiles on {harness.describe_device(device)}: {bands} x {height} x {width} image "
          f"({scene.source}), {len(host_tiles)} tiles of {tile_min}-{tile_max} px, {kept} kept, "
          f"{len(host_tiles) - kept} dropped (more than {settings.max_fraction:g} of {scene.bands[cloud_band]} "
          f"above {args.cloud_threshold:g}); model input {bands}x{settings.size}x{settings.size}; "
          f"median of {repeats} passes")
    harness.print_table(rows, [("method", "method", ""), ("preprocess_ms", "preprocess ms", ".2f"),
                               ("model_ms", "model ms", ".2f"), ("end_to_end_ms", "end-to-end ms", ".2f"),
                               ("tiles_per_s", "tiles/s", ".0f"), ("outside_model_pct", "outside model %", ".1f")])
    print(f"check: same {kept} tiles kept by both; gathered tiles equal the image's pixels; model inputs within "
          f"{checks['max_abs_input_diff']:.1e} (<= {INPUT_TOLERANCE:g}), logits within "
          f"{checks['max_abs_logit_diff']:.1e} (<= {LOGIT_TOLERANCE:g})")
    print(f"tiles: {len(host_tiles)} rows in {csv_path}")
    json_path = args.json or os.path.join(args.out, "satellite_tiles.json")
    harness.write_json(json_path, SCHEMA, device, data=data, repeats=repeats, warmup=args.warmup, rows=rows,
                       checks=checks)
    print(f"numbers: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tile filtering of one large image (the satellite case): per-tile statistics and a keep
decision for many variable-size tiles in one launch, and the kept tiles gathered into a
RaggedBatch in one more."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from ._host_copies import to_device
from ._registrations import register_fake
from ._messages import describe
from .crop_resize import crop_resize
from .ragged import RaggedBatch


class TileFilter(NamedTuple):
    """What :func:`tile_filter` returns: per tile (``[T]``) the mean (float64), the
    fraction of values above the threshold (float64) and the keep flag (bool); with
    ``gather``, the kept tiles as a batch of ``[C, h, w]`` items and their tile indices."""
    mean: torch.Tensor
    fraction: torch.Tensor
    keep: torch.Tensor
    kept: Optional[RaggedBatch] = None
    kept_index: Optional[torch.Tensor] = None


def tile_filter(image: torch.Tensor, tiles: torch.Tensor, threshold: float, *, min_mean: Optional[float] = None,
                max_mean: Optional[float] = None, min_fraction: Optional[float] = None,
                max_fraction: Optional[float] = None, gather: bool = False, validate: bool = True) -> TileFilter:
    """Statistics of every tile of ``image`` (``[H, W]`` or ``[C, H, W]``; float32, float64,
    float16, bfloat16 or uint8) in one kernel launch: ``tiles`` is an int64 ``[T, 4]`` tensor
    of ``(y0, x0, y1, x1)`` boxes (end exclusive; any sizes, overlapping or not). For each
    tile, over all its channels: ``mean`` and ``fraction`` of values ``> threshold``
    (float64 sums). A tile is kept when every given bound holds:
    ``min_mean <= mean <= max_mean`` and ``min_fraction <= fraction <= max_fraction`` —
    e.g. ``max_fraction=0.3`` with a cloud-brightness threshold drops cloudy tiles.

    With ``gather=True`` the kept tiles are copied into a :class:`RaggedBatch` of
    ``[C, h, w]`` items (one more launch; knowing which tiles were kept takes one device to
    host copy). With ``validate`` (default) a tile outside the image or empty raises
    ``ValueError`` (one host copy of the tiles). The image is one dense tensor, not a
    ragged batch: the tiles are the ragged part.
    """
    if not isinstance(image, torch.Tensor) or image.is_nested:
        raise TypeError(f"image must be one dense [H, W] or [C, H, W] tensor, got {describe(image)}")
    if not isinstance(tiles, torch.Tensor) or tiles.dtype != torch.int64:
        raise TypeError(f"tiles must be an int64 tensor [T, 4] of (y0, x0, y1, x1), got {describe(tiles)}")
    bounds = [(-math.inf if min_mean is None else float(min_mean)), (math.inf if max_mean is None else float(max_mean)),
              (0.0 if min_fraction is None else float(min_fraction)),
              (1.0 if max_fraction is None else float(max_fraction))]
    tiles = to_device(tiles, image.device)
    mean, fraction, keep = torch.ops.octopus.tile_stats(image, tiles, float(threshold), *bounds, validate)
    if not gather:
        return TileFilter(mean, fraction, keep)
    kept_index = keep.nonzero().squeeze(1)
    chosen = tiles[kept_index]
    boxes = torch.cat([torch.zeros_like(chosen[:, :1]), chosen], dim=1)
    frame = (image if image.dim() == 3 else image.unsqueeze(0)).unsqueeze(0)
    kept = crop_resize(frame, boxes, None, validate=False)
    return TileFilter(mean, fraction, keep, kept, kept_index)


@register_fake("octopus::tile_stats")
def _tile_stats_fake(image, tiles, threshold, min_mean, max_mean, min_fraction, max_fraction, validate=True):
    t = tiles.shape[0]
    return (image.new_empty((t,), dtype=torch.float64), image.new_empty((t,), dtype=torch.float64),
            image.new_empty((t,), dtype=torch.bool))

"""Geometry on ragged batches: crop + bilinear resize of boxes to a fixed size."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from . import _registrations  # noqa: F401
from .ragged import RaggedBatch

Size = Union[int, Sequence[int]]


def crop_resize(source: Union[RaggedBatch, torch.Tensor], boxes: torch.Tensor, size: Size, *, scale: float = 1.0,
                mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                validate: bool = True) -> torch.Tensor:
    """Crops every box out of its image and resizes it bilinearly to ``size``, in one launch.

    ``source`` is a dense ``[N, C, H, W]`` batch of frames or a :class:`RaggedBatch` of
    ``[C, H, W]`` images of different sizes (same C). ``boxes`` is an int64 ``[K, 5]`` tensor
    of ``(image, y0, x0, y1, x1)``: the crop is ``image[:, y0:y1, x0:x1]`` (end exclusive), and
    each ``out[k]`` equals ``F.interpolate(crop[None], size, mode="bilinear",
    align_corners=False)[0]`` (no antialiasing: ``antialias=True`` would differ when
    shrinking). ``scale``, ``mean`` and ``std`` (one value per channel) normalize on the
    way out: ``(resized * scale - mean) / std`` — e.g. ``scale=1/255`` and ImageNet's
    statistics for uint8 frames. Returns ``[K, C, out_h, out_w]`` in the source's dtype
    (float32 for uint8). With ``validate`` (default) a box outside its image, or of zero
    size, raises ``ValueError`` (one host copy of the boxes). Differentiable with respect
    to the source's values.
    """
    out_h, out_w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    if isinstance(source, RaggedBatch):
        if source.item_dim != 3:
            raise ValueError(f"source items must be [C, H, W] images, got {source.item_dim}-D items")
        values, offsets, sizes = source.values, source.offsets, source.sizes
        host_sizes = source.host_layout()[1]
        channels = int(host_sizes[0, 0]) if len(source) else 1
    elif isinstance(source, torch.Tensor):
        if source.dim() != 4:
            raise ValueError(f"a dense source must be [N, C, H, W], got shape {tuple(source.shape)}")
        n, channels, h, w = source.shape
        values = source.contiguous().view(-1)
        offsets = torch.arange(n + 1, dtype=torch.int64, device=source.device) * (channels * h * w)
        sizes = torch.tensor([[channels, h, w]], dtype=torch.int64, device=source.device).expand(n, 3)
    else:
        raise TypeError(f"source must be a RaggedBatch or a [N, C, H, W] tensor, got {type(source).__name__}")
    if not isinstance(boxes, torch.Tensor) or boxes.dtype != torch.int64:
        raise TypeError("boxes must be an int64 tensor [K, 5] of (image, y0, x0, y1, x1)")
    param = torch.float64 if values.dtype == torch.float64 else torch.float32
    mean_t = None if mean is None else torch.as_tensor(mean, dtype=param, device=values.device).reshape(-1)
    std_t = None if std is None else torch.as_tensor(std, dtype=param, device=values.device).reshape(-1)
    return torch.ops.octopus.crop_resize(values, offsets, sizes.contiguous(), boxes.to(values.device), channels,
                                         out_h, out_w, float(scale), mean_t, std_t, validate)

"""Geometry on ragged batches: crop + bilinear resize of boxes to a fixed size or to
per-box sizes, and ragged -> ragged resize."""

from __future__ import annotations

import functools
import numbers
from typing import Optional, Sequence, Tuple, Union, cast, overload

import torch

from . import tuning
from ._host_copies import as_device_tensor, to_device
from ._registrations import call_op, out_dtype, register_fake
from ._messages import describe, format_shape
from .inputs import RaggedLike, as_ragged
from .ragged import RaggedBatch
from .strategies import check_strategy, resolve_block_elems

Sizes = Union[int, Sequence[int], Sequence[Sequence[int]], torch.Tensor]


def _build_dense_layout(n: int, channels: int, h: int, w: int,
                        device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Offsets and sizes of a dense [N, C, H, W] batch seen as N images."""
    offsets = torch.arange(n + 1, dtype=torch.int64, device=device) * (channels * h * w)
    # Filled where they live: no host copy (which would wait for the stream).
    sizes = torch.empty((n, 3), dtype=torch.int64, device=device)
    for column, extent in enumerate((channels, h, w)):
        sizes[:, column] = extent
    return offsets, sizes


@functools.lru_cache(maxsize=32)
def _dense_layout(n: int, channels: int, h: int, w: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`_build_dense_layout`, built once per shape and device and kept, so that a frame
    loop launches the resize alone. Read-only: the ops never write them. Whole before it is
    kept (one wait for the stream, once): a later call may read it on another stream; and
    ordinary tensors even when made in inference mode (autograd may save them later)."""
    with torch.inference_mode(False):
        offsets, sizes = _build_dense_layout(n, channels, h, w, device)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    return offsets, sizes


def _source_layout(source: Union[RaggedLike, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(values, offsets, sizes, channels) of a ragged or dense source."""
    if isinstance(source, torch.Tensor) and not source.is_nested:
        if source.dim() != 4:
            raise ValueError(f"a dense source must be [N, C, H, W] frames, got shape {format_shape(source.shape)} "
                             f"(one [C, H, W] image goes in as [image] or image[None])")
        n, channels, h, w = source.shape
        # Traced or captured they are built afresh: a cache must hold neither fake tensors nor
        # graph memory.
        fresh = torch.compiler.is_compiling() or (source.is_cuda and torch.cuda.is_current_stream_capturing())
        offsets, sizes = (_build_dense_layout if fresh else _dense_layout)(n, channels, h, w, source.device)
        return source.contiguous().view(-1), offsets, sizes, channels
    source = as_ragged(source, "source", also="a dense [N, C, H, W] tensor").batch
    if source.item_dim != 3:
        raise ValueError(f"source items must be [C, H, W] images, got {source.item_dim}-D items")
    host_sizes = source.host_layout()[1]
    channels = int(host_sizes[0, 0]) if len(source) else 0  # 0: no image says C
    return source.values, source.offsets, source.sizes.contiguous(), channels


def _out_sizes(size: Optional[Sizes], boxes: torch.Tensor) -> torch.Tensor:
    """[K, 2] host int64 output (h, w) per box: the boxes' own sizes for None."""
    k = boxes.shape[0]
    if size is None:
        b = boxes.cpu()
        hw = torch.stack([b[:, 3] - b[:, 1], b[:, 4] - b[:, 2]], dim=1)
        empty = (hw <= 0).any(1).nonzero()
        if empty.numel():
            raise ValueError(f"boxes[{int(empty[0, 0])}] = {tuple(b[int(empty[0, 0])].tolist())} is empty: "
                             f"size=None keeps each crop's own size, which must be positive")
        return hw
    hw = torch.as_tensor(size, dtype=torch.int64).cpu()
    if hw.shape != (k, 2):
        raise ValueError(f"per-box sizes must be [K, 2] = {format_shape((k, 2))}, got shape {format_shape(hw.shape)}")
    if (hw <= 0).any():
        raise ValueError("per-box sizes must be positive")
    return hw


@overload
def crop_resize(source: Union[RaggedLike, torch.Tensor], boxes: torch.Tensor, size: Union[int, Sequence[int]], *,
                scale: float = 1.0, mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                validate: bool = True, strategy: str = "auto", block_elems: Optional[int] = None) -> torch.Tensor: ...
@overload
def crop_resize(source: Union[RaggedLike, torch.Tensor], boxes: torch.Tensor,
                size: Union[Sequence[Sequence[int]], torch.Tensor, None], *, scale: float = 1.0,
                mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None, validate: bool = True,
                strategy: str = "auto", block_elems: Optional[int] = None) -> RaggedBatch: ...
def crop_resize(source: Union[RaggedLike, torch.Tensor], boxes: torch.Tensor, size: Optional[Sizes], *,
                scale: float = 1.0, mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                validate: bool = True, strategy: str = "auto",
                block_elems: Optional[int] = None) -> Union[torch.Tensor, RaggedBatch]:
    """Crops every box out of its image and resizes it bilinearly, in one launch.

    ``source`` is a dense ``[N, C, H, W]`` batch of frames or a ragged batch of ``[C, H, W]``
    images of different sizes (same C) in any form (:data:`octopus.inputs.RaggedLike`: a
    :class:`RaggedBatch`, a list or tuple of tensors, a ``torch.nested`` tensor). ``boxes``
    is an int64 ``[K, 5]`` tensor of ``(image, y0, x0, y1, x1)``: the crop is
    ``image[:, y0:y1, x0:x1]`` (end exclusive), and its output equals
    ``F.interpolate(crop[None], (h, w), mode="bilinear", align_corners=False)[0]`` (no
    antialiasing: ``antialias=True`` would differ when shrinking; sampling coordinates in
    float32 for every dtype, as torch computes them for float32 images). ``size`` says the
    output:

    * an int or ``(h, w)``: every crop to that size, a dense ``[K, C, h, w]`` tensor (an
      empty ragged source raises ``ValueError``: no image says C; a dense ``[0, C, H, W]``
      source does);
    * a ``[K, 2]`` tensor or list of ``(h, w)``: crop k to its own size, a :class:`RaggedBatch`
      (whatever the source's form: the crops are not the source's items);
    * ``None``: every crop at its own size (an exact copy), a :class:`RaggedBatch` (the
      boxes are read on the host for the output layout).

    ``scale``, ``mean`` and ``std`` (one value per channel) normalize on the way out:
    ``(resized * scale - mean) / std`` — e.g. ``scale=1/255`` and ImageNet's statistics for
    uint8 frames. Outputs are in the source's dtype (float32 for uint8). With ``validate``
    (default) a box outside its image, or of zero size, raises ``ValueError`` (one host copy
    of the boxes). ``strategy``/``block_elems`` choose how the ragged output's elements find
    their crop (as for :func:`octopus.affine`). Differentiable with respect to the source's
    values.
    """
    values, offsets, sizes, channels = _source_layout(source)
    if not isinstance(boxes, torch.Tensor) or boxes.dtype != torch.int64:
        raise TypeError(f"boxes must be an int64 tensor [K, 5] of (image, y0, x0, y1, x1), got {describe(boxes)}")
    if boxes.dim() != 2 or boxes.shape[1] != 5:
        raise ValueError(f"boxes must be [K, 5] (image, y0, x0, y1, x1), got shape {format_shape(boxes.shape)}")
    param = torch.float64 if values.dtype == torch.float64 else torch.float32
    mean_t = None if mean is None else as_device_tensor(mean, param, values.device).reshape(-1)
    std_t = None if std is None else as_device_tensor(std, param, values.device).reshape(-1)
    boxes = to_device(boxes, values.device)
    if isinstance(size, numbers.Integral) or (isinstance(size, (tuple, list, torch.Size)) and len(size) == 2
                                              and all(isinstance(v, numbers.Integral) for v in size)):
        # One integer or two (cast: mypy does not count int as a numbers.Integral).
        pair = cast(Sequence[int], (size, size) if isinstance(size, numbers.Integral) else size)
        out_h, out_w = int(pair[0]), int(pair[1])
        if channels == 0:
            raise ValueError("source has no images, so nothing says C of the [K, C, h, w] result; pass an empty "
                             "dense source, torch.empty(0, C, H, W), or a per-box size (a RaggedBatch result)")
        crops: torch.Tensor = call_op(torch.ops.octopus.crop_resize, values, offsets, sizes, boxes, channels, out_h,
                                      out_w, float(scale), mean_t, std_t, validate)
        return crops
    hw = _out_sizes(size, boxes)
    channels = channels or 1  # an empty source: its boxes (none can be valid) make items of no channels
    host_sizes = torch.cat([torch.full((hw.shape[0], 1), channels, dtype=torch.int64), hw], dim=1)
    host_offsets = torch.zeros(hw.shape[0] + 1, dtype=torch.int64)
    host_offsets[1:] = host_sizes.prod(1).cumsum(0)
    num_out = int(host_offsets[-1])
    check_strategy(strategy, allow_auto=True)
    strategy, block_elems = tuning.resolve(strategy, block_elems, values.device, hw.shape[0], num_out)
    block_elems = resolve_block_elems(block_elems)
    out_dtype = torch.float32 if values.dtype == torch.uint8 else values.dtype
    layout = RaggedBatch(values.new_empty((1,), dtype=out_dtype).expand(num_out),
                         to_device(host_offsets, values.device), to_device(host_sizes, values.device), validate=False)
    layout._host_layout = (host_offsets, host_sizes)
    out = call_op(torch.ops.octopus.crop_resize_ragged, values, offsets, sizes, boxes, channels, layout.offsets,
                  layout.sizes, num_out, float(scale), mean_t, std_t, strategy, block_elems,
                  layout.metadata(strategy, block_elems), validate)
    return layout.with_values(out)


def resize(batch: RaggedLike, sizes: Sizes, *, scale: float = 1.0, mean: Optional[Sequence[float]] = None,
           std: Optional[Sequence[float]] = None, strategy: str = "auto",
           block_elems: Optional[int] = None) -> RaggedBatch:
    """Ragged -> ragged bilinear resize: image i of ``batch`` (``[C, H, W]`` items) to
    ``sizes[i] = (h, w)`` (a ``[M, 2]`` tensor or list), as ``F.interpolate(...,
    mode="bilinear", align_corners=False)`` of each image; ``scale``/``mean``/``std`` as in
    :func:`crop_resize`. One launch. Differentiable with respect to the values.

    ``batch`` is a ragged batch in any form (:data:`octopus.inputs.RaggedLike`); the result
    is a :class:`RaggedBatch` whatever the form (its items have new shapes)."""
    batch = as_ragged(batch, "batch").batch
    if batch.item_dim != 3:
        raise ValueError(f"items must be [C, H, W] images, got {batch.item_dim}-D items")
    host_sizes = batch.host_layout()[1]
    m = len(batch)
    boxes = torch.cat([torch.arange(m, dtype=torch.int64)[:, None], torch.zeros(m, 2, dtype=torch.int64),
                       host_sizes[:, 1:]], dim=1)
    hw = torch.as_tensor(sizes, dtype=torch.int64).reshape(-1, 2) if m else torch.zeros(0, 2, dtype=torch.int64)
    return crop_resize(batch, boxes, hw, scale=scale, mean=mean, std=std, strategy=strategy, block_elems=block_elems)


@register_fake("octopus::crop_resize")
def _crop_resize_fake(values, offsets, sizes, boxes, channels, out_h, out_w, scale=1.0, mean=None, std=None,
                      validate=True):
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 5, lambda: "boxes must be [K, 5]")
    return values.new_empty((boxes.shape[0], channels, out_h, out_w), dtype=out_dtype(values.dtype))


@register_fake("octopus::crop_resize_backward")
def _crop_resize_backward_fake(grad, values, offsets, sizes, boxes, scale=1.0, std=None):
    return torch.empty_like(values)


def _crop_resize_setup_context(ctx, inputs, output):
    values, offsets, sizes, boxes, channels, out_h, out_w, scale, mean, std, validate = inputs
    ctx.scale = scale
    ctx.save_for_backward(values, offsets, sizes, boxes, std)


def _crop_resize_backward(ctx, grad):
    values, offsets, sizes, boxes, std = ctx.saved_tensors
    grad_values = torch.ops.octopus.crop_resize_backward(grad.contiguous(), values, offsets, sizes, boxes, ctx.scale,
                                                         std)
    return grad_values, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("octopus::crop_resize", _crop_resize_backward, setup_context=_crop_resize_setup_context)


@register_fake("octopus::crop_resize_ragged")
def _crop_resize_ragged_fake(values, offsets, sizes, boxes, channels, out_offsets, out_sizes, num_out_values,
                             scale=1.0, mean=None, std=None, strategy="plan", block_elems=0, metadata=None,
                             validate=True):
    torch._check(out_offsets.shape[0] == boxes.shape[0] + 1, lambda: "out_offsets must have num_boxes + 1 entries")
    return values.new_empty((num_out_values,), dtype=out_dtype(values.dtype))


@register_fake("octopus::crop_resize_ragged_backward")
def _crop_resize_ragged_backward_fake(grad, values, offsets, sizes, boxes, channels, out_offsets, out_sizes,
                                      scale=1.0, std=None):
    return torch.empty_like(values)


def _crop_resize_ragged_setup_context(ctx, inputs, output):
    (values, offsets, sizes, boxes, channels, out_offsets, out_sizes, num_out_values, scale, mean, std, strategy,
     block_elems, metadata, validate) = inputs
    ctx.channels, ctx.scale = channels, scale
    ctx.save_for_backward(values, offsets, sizes, boxes, out_offsets, out_sizes, std)


def _crop_resize_ragged_backward(ctx, grad):
    values, offsets, sizes, boxes, out_offsets, out_sizes, std = ctx.saved_tensors
    grad_values = torch.ops.octopus.crop_resize_ragged_backward(grad.contiguous(), values, offsets, sizes, boxes,
                                                                ctx.channels, out_offsets, out_sizes, ctx.scale, std)
    return (grad_values,) + (None,) * 14


torch.library.register_autograd("octopus::crop_resize_ragged", _crop_resize_ragged_backward,
                                setup_context=_crop_resize_ragged_setup_context)

"""3x3 stencils on ragged batches of images: box and Gaussian blur, and depthwise 3x3
convolution, each item with its own borders, in one launch over the whole batch."""

from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union, overload

import torch

from . import tuning
from ._host_copies import as_device_tensor, constant, to_device
from ._registrations import call_op, item_sums, out_dtype, register_fake
from ._messages import describe, format_shape
from .inputs import PackedLike, RaggedLike, RaggedResult, as_ragged
from .ragged import RaggedBatch
from .strategies import check_strategy, resolve_block_elems

BORDERS = ("replicate", "zero")
_BOX = (1.0 / 9,) * 9
_GAUSSIAN = tuple(v / 16.0 for v in (1, 2, 1, 2, 4, 2, 1, 2, 1))

WeightLike = Union[torch.Tensor, Sequence[float]]


def _channels(batch: RaggedBatch) -> Optional[int]:
    """C of [C, H, W] items (every item must have the same), 1 for [H, W] items, None for
    an empty batch of [C, H, W] items (any C)."""
    if batch.item_dim == 2:
        return 1
    if batch.item_dim != 3:
        raise ValueError(f"items must be [H, W] or [C, H, W], got {batch.item_dim}-D items")
    sizes = batch.host_layout()[1]
    if len(batch) == 0:
        return None
    channels = int(sizes[0, 0])
    wrong = (sizes[:, 0] != channels).nonzero()
    if wrong.numel():
        i = int(wrong[0, 0])
        raise ValueError(f"every item must have the same number of channels: item 0 has {channels}, "
                         f"item {i} has {int(sizes[i, 0])}")
    return channels


def _kernels(weight: WeightLike, channels: Optional[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``weight`` as the op's contiguous ``[C, 9]`` kernels of ``dtype`` on ``device`` (numbers
    are copied there once and kept, a CPU tensor without waiting for the stream)."""
    if isinstance(weight, (tuple, list)) and len(weight) == 9 and all(isinstance(v, numbers.Real) for v in weight):
        # Nine numbers, as the blurs pass theirs: the [C, 9] kernels themselves are kept (per
        # numbers, channels, dtype and device), so a call only looks them up.
        channels = channels or 1
        return constant(tuple(weight) * channels, dtype, device).view(channels, 9)
    w = weight if isinstance(weight, torch.Tensor) else as_device_tensor(weight, dtype, device)
    if not w.is_floating_point():
        raise TypeError(f"weight must be floating point, got {describe(w)}")
    shape = tuple(w.shape)
    per_channel = (len(shape) == 3 and shape[1:] == (3, 3)) or (len(shape) == 4 and shape[1:] == (1, 3, 3))
    if shape == (3, 3) or shape == (9,):
        channels = channels or 1
        w = w.reshape(1, 9).expand(channels, 9)
    elif per_channel and channels in (None, shape[0]):
        w = w.reshape(shape[0], 9)
    else:
        raise ValueError(f"weight must be [3, 3], [C, 3, 3] or [C, 1, 3, 3] with C = {channels}, got shape "
                         f"{format_shape(shape)}")
    return to_device(w, device, dtype).contiguous()


@overload
def stencil3x3(batch: PackedLike, weight: WeightLike, *, border: str = "replicate", strategy: str = "auto",
               block_elems: Optional[int] = None) -> RaggedBatch: ...
@overload
def stencil3x3(batch: torch.Tensor, weight: WeightLike, *, border: str = "replicate", strategy: str = "auto",
               block_elems: Optional[int] = None) -> torch.Tensor: ...
def stencil3x3(batch: RaggedLike, weight: WeightLike, *, border: str = "replicate", strategy: str = "auto",
               block_elems: Optional[int] = None) -> RaggedResult:
    """``out[c, y, x] = sum(weight[c, dy + 1, dx + 1] * item[c, y + dy, x + dx])`` over
    dy, dx in {-1, 0, 1} for every item of ``batch`` (``[H, W]`` or ``[C, H, W]`` items
    of any sizes, same C), in one kernel launch. This is ``F.conv2d`` with ``groups=C`` on
    each item padded by one pixel: ``border="replicate"`` repeats the item's edge pixels,
    ``"zero"`` pads with 0. ``weight`` is ``[3, 3]`` (every channel), ``[C, 3, 3]`` or
    conv2d's depthwise ``[C, 1, 3, 3]``. Values float32, float64, float16, bfloat16 or
    uint8 (float32 out); arithmetic in float32 (float64 for float64). Differentiable with
    respect to the values and the weight.

    ``batch`` is a ragged batch in any form (:data:`octopus.inputs.RaggedLike`; an empty
    list stands for ``[H, W]`` items); the result has its layout: a :class:`RaggedBatch`,
    or a nested tensor of the input's layout for a nested input.
    """
    given = as_ragged(batch, "batch")
    batch = given.batch
    if border not in BORDERS:
        raise ValueError(f"border must be one of {BORDERS}, got {border!r}")
    check_strategy(strategy, allow_auto=True)
    strategy, block_elems = tuning.resolve(strategy, block_elems, batch.device, len(batch), batch.numel())
    block_elems = resolve_block_elems(block_elems)
    dtype = torch.float64 if batch.dtype == torch.float64 else torch.float32
    w = _kernels(weight, _channels(batch), dtype, batch.device)
    out = call_op(torch.ops.octopus.stencil3x3, batch.values, batch.offsets, batch.sizes, w, border, strategy,
                  block_elems, batch.metadata(strategy, block_elems), False)
    return given.result(batch.with_values(out))


@overload
def box_blur(batch: PackedLike, *, border: str = "replicate", strategy: str = "auto",
             block_elems: Optional[int] = None) -> RaggedBatch: ...
@overload
def box_blur(batch: torch.Tensor, *, border: str = "replicate", strategy: str = "auto",
             block_elems: Optional[int] = None) -> torch.Tensor: ...
def box_blur(batch: RaggedLike, *, border: str = "replicate", strategy: str = "auto",
             block_elems: Optional[int] = None) -> RaggedResult:
    """The mean of every pixel's 3x3 neighbourhood (see :func:`stencil3x3` for borders and
    the forms ``batch`` and the result take)."""
    return stencil3x3(batch, _BOX, border=border, strategy=strategy, block_elems=block_elems)


@overload
def gaussian_blur(batch: PackedLike, *, border: str = "replicate", strategy: str = "auto",
                  block_elems: Optional[int] = None) -> RaggedBatch: ...
@overload
def gaussian_blur(batch: torch.Tensor, *, border: str = "replicate", strategy: str = "auto",
                  block_elems: Optional[int] = None) -> torch.Tensor: ...
def gaussian_blur(batch: RaggedLike, *, border: str = "replicate", strategy: str = "auto",
                  block_elems: Optional[int] = None) -> RaggedResult:
    """3x3 Gaussian blur, the binomial kernel [1 2 1; 2 4 2; 1 2 1] / 16 (see
    :func:`stencil3x3` for borders and the forms ``batch`` and the result take)."""
    return stencil3x3(batch, _GAUSSIAN, border=border, strategy=strategy, block_elems=block_elems)


@overload
def depthwise_conv3x3(batch: PackedLike, weight: torch.Tensor, *, border: str = "zero", strategy: str = "auto",
                      block_elems: Optional[int] = None) -> RaggedBatch: ...
@overload
def depthwise_conv3x3(batch: torch.Tensor, weight: torch.Tensor, *, border: str = "zero", strategy: str = "auto",
                      block_elems: Optional[int] = None) -> torch.Tensor: ...
def depthwise_conv3x3(batch: RaggedLike, weight: torch.Tensor, *, border: str = "zero", strategy: str = "auto",
                      block_elems: Optional[int] = None) -> RaggedResult:
    """Depthwise 3x3 convolution, one kernel per channel (``weight`` ``[C, 3, 3]`` or
    ``[C, 1, 3, 3]``): ``F.conv2d(item, weight, padding=1, groups=C)`` per item with the
    default ``border="zero"``. Differentiable with respect to the values and the weight.
    ``batch`` and the result as for :func:`stencil3x3`."""
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (3, 4):
        raise ValueError(f"weight must be a [C, 3, 3] or [C, 1, 3, 3] tensor, got {describe(weight)}")
    return stencil3x3(batch, weight, border=border, strategy=strategy, block_elems=block_elems)


@register_fake("octopus::stencil3x3")
def _stencil3x3_fake(values, offsets, sizes, weight, border="replicate", strategy="plan", block_elems=0,
                     metadata=None, validate=True):
    torch._check(weight.dim() == 2 and weight.shape[1] == 9, lambda: "weight must be [channels, 9]")
    return values.new_empty(values.shape, dtype=out_dtype(values.dtype))


@register_fake("octopus::stencil3x3_backward")
def _stencil3x3_backward_fake(grad, offsets, sizes, weight, border="replicate", strategy="plan", block_elems=0,
                              metadata=None, validate=True):
    return torch.empty_like(grad)


def _stencil3x3_setup_context(ctx, inputs, output):
    values, offsets, sizes, weight, border, strategy, block_elems, metadata, validate = inputs
    ctx.border, ctx.strategy, ctx.block_elems = border, strategy, block_elems
    ctx.save_for_backward(values if ctx.needs_input_grad[3] else None, offsets, sizes, weight, metadata)


def _stencil3x3_backward(ctx, grad):
    """The values' gradient is the adjoint stencil (replicated borders send the gradient of
    every tap that read an edge pixel back to it). The weight's: tap t of channel c gathers
    sum(grad * input shifted by t) over that channel of every item — the forward op with a
    one-hot kernel, then per-(item, channel) sums."""
    values, offsets, sizes, weight, metadata = ctx.saved_tensors
    grad = grad.to(weight.dtype).contiguous()
    grad_values = grad_weight = None
    if ctx.needs_input_grad[0]:
        grad_values = torch.ops.octopus.stencil3x3_backward(grad, offsets, sizes, weight, ctx.border, ctx.strategy,
                                                            ctx.block_elems, metadata, False)
    if ctx.needs_input_grad[3]:
        channels = weight.shape[0]
        taps = []
        for t in range(9):
            one_hot = torch.zeros_like(weight)
            one_hot[:, t] = 1
            shifted = torch.ops.octopus.stencil3x3(values, offsets, sizes, one_hot, ctx.border, ctx.strategy,
                                                   ctx.block_elems, metadata, False)
            taps.append(item_sums(shifted.to(weight.dtype) * grad, offsets, channels).sum(0))
        grad_weight = torch.stack(taps, dim=1)
    return grad_values, None, None, grad_weight, None, None, None, None, None


torch.library.register_autograd("octopus::stencil3x3", _stencil3x3_backward, setup_context=_stencil3x3_setup_context)

"""Ragged <-> padded: ``to_padded`` and ``from_padded`` (octopus::to_padded,
octopus::from_padded), their fakes and autograd formulas (each is the other's gradient)."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from . import tuning
from ._host_copies import to_device
from ._messages import describe, format_shape
from ._registrations import call_op, register_fake
from .inputs import RaggedLike, as_ragged
from .ragged import RaggedBatch
from .strategies import check_strategy, resolve_block_elems


def to_padded(batch: RaggedLike, pad_value: float = 0.0, max_size: Optional[Sequence[int]] = None) -> torch.Tensor:
    """``[M, *max_shape]``: every item in the leading corner of its slot, ``pad_value``
    elsewhere, in one kernel. ``max_size`` (one extent per item dimension) fixes the slot
    shape and crops larger items; by default it is the largest extent of each dimension
    (read from the batch's host copy of its sizes: no device synchronization where the
    batch was built from host data). Differentiable with respect to the values.

    ``batch`` is a ragged batch in any form (:data:`octopus.inputs.RaggedLike`); the result
    is always a dense tensor."""
    return as_ragged(batch, "batch").batch.to_padded(pad_value, max_size)


def from_padded(padded: torch.Tensor, sizes: Union[RaggedBatch, torch.Tensor, Sequence[Sequence[int]]], *,
                strategy: str = "auto", block_elems: Optional[int] = None, validate: bool = True) -> RaggedBatch:
    """The items of a dense ``[M, *slot]`` tensor as a :class:`RaggedBatch`: item ``i`` is
    the leading ``sizes[i]`` corner of ``padded[i]``. ``sizes`` is an int64 ``[M, D]`` tensor
    (on any device), a list of shapes, or a :class:`RaggedBatch` on ``padded``'s device whose
    layout the result takes (its offsets, sizes and cached plans: nothing is computed on the
    host, the fast way back after ``to_padded(batch)``). Sizes on the host (a list, a CPU
    tensor) have their offsets summed there and go to the device without waiting for its
    queue; a sizes tensor on ``padded``'s device has its offsets summed there (one small read
    back) and, where it is a contiguous int64 tensor, becomes the result's ``sizes`` without
    a copy. With ``validate`` an item larger than its slot is an error (one check read back);
    without, its elements outside the slot read as 0. Differentiable."""
    if not isinstance(padded, torch.Tensor) or padded.is_nested:
        raise TypeError(f"padded must be a dense tensor [M, *slot], got {describe(padded)}")
    # (The slots' elements stand for the items' in the layout class: the sizes may be on the device.)
    strategy, block_elems = tuning.resolve(check_strategy(strategy, allow_auto=True), block_elems, padded.device,
                                           padded.shape[0] if padded.dim() else 0, padded.numel())
    block_elems = resolve_block_elems(block_elems)
    layout = _batch_layout(padded, sizes) if isinstance(sizes, RaggedBatch) else _sizes_layout(padded, sizes)
    values = call_op(torch.ops.octopus.from_padded, padded, layout.offsets, layout.sizes, layout.numel(), strategy,
                     block_elems, layout.metadata(strategy, block_elems), validate)
    return layout.with_values(values)  # the layout's cached plans too


def _batch_layout(padded: torch.Tensor, like: RaggedBatch) -> RaggedBatch:
    if padded.dim() - 1 != like.item_dim or padded.shape[0] != len(like):
        raise ValueError(f"sizes: the batch has {len(like)} items of {like.item_dim} dimensions, so padded must be "
                         f"[{len(like)}, *slot] with {like.item_dim} slot dimensions, got {format_shape(padded.shape)}")
    if padded.device != like.device:
        raise ValueError(f"sizes: the batch is on {like.device}, padded on {padded.device}")
    return like


def _sizes_layout(padded: torch.Tensor, sizes: Union[torch.Tensor, Sequence[Sequence[int]]]) -> RaggedBatch:
    """A layout of the given sizes on padded's device (its values a zero-stride placeholder)."""
    given = sizes if isinstance(sizes, torch.Tensor) else torch.as_tensor(sizes, dtype=torch.int64, device="cpu")
    if given.dtype != torch.int64:
        raise TypeError(f"sizes must be int64, got {given.dtype}")
    if given.dim() != 2 or given.shape[0] != padded.shape[0] or given.shape[1] != padded.dim() - 1:
        raise ValueError(f"sizes must have shape [M, D] = {format_shape((padded.shape[0], padded.dim() - 1))} for "
                         f"padded of shape {format_shape(padded.shape)}, got {format_shape(given.shape)}")
    if given.device.type == "cpu":
        # Sizes on the host: the layout is summed there and copied over without waiting for
        # the device's queue.
        if (given < 0).any():
            raise ValueError("sizes must be non-negative")
        host_sizes = given.contiguous()
        host_offsets = torch.zeros(given.shape[0] + 1, dtype=torch.int64)
        torch.cumsum(host_sizes.prod(dim=1), 0, out=host_offsets[1:])
        layout = RaggedBatch(padded.new_empty((1,)).expand(int(host_offsets[-1])),
                             to_device(host_offsets, padded.device), to_device(host_sizes, padded.device),
                             validate=False)
        layout._host_layout = (host_offsets, host_sizes)
        return layout
    # The offsets are summed where padded lives (on a GPU: no host pass over M items, no
    # offsets to copy); one small read gives the element count and the sign check.
    dev_sizes = given.to(padded.device).contiguous()
    dev_offsets = torch.zeros(given.shape[0] + 1, dtype=torch.int64, device=padded.device)
    torch.cumsum(dev_sizes.prod(dim=1), 0, out=dev_offsets[1:])
    num_values, negative = torch.stack((dev_offsets[-1], (dev_sizes < 0).sum())).tolist()
    if negative:
        raise ValueError("sizes must be non-negative")
    return RaggedBatch(padded.new_empty((1,)).expand(num_values), dev_offsets, dev_sizes, validate=False)


@register_fake("octopus::to_padded")
def _to_padded_fake(values, offsets, sizes, max_shape, pad_value=0.0, validate=True):
    torch._check(len(max_shape) == sizes.shape[1], lambda: "max_shape must have one extent per item dimension")
    return values.new_empty((offsets.shape[0] - 1, *max_shape))


@register_fake("octopus::from_padded")
def _from_padded_fake(padded, offsets, sizes, num_values, strategy="plan", block_elems=0, metadata=None,
                      validate=True):
    torch._check(padded.shape[0] == offsets.shape[0] - 1, lambda: "padded must have num_items rows")
    return padded.new_empty((num_values,))


def _to_padded_setup_context(ctx, inputs, output):
    values, offsets, sizes = inputs[:3]
    ctx.num_values = values.shape[0]
    ctx.save_for_backward(offsets, sizes)


def _to_padded_backward(ctx, grad):
    offsets, sizes = ctx.saved_tensors
    # Elements cropped away by max_shape get zero gradient (from_padded reads them as 0).
    grad_values = torch.ops.octopus.from_padded(grad.contiguous(), offsets, sizes, ctx.num_values, "block_search",
                                                0, None, False)
    return grad_values, None, None, None, None, None


torch.library.register_autograd("octopus::to_padded", _to_padded_backward, setup_context=_to_padded_setup_context)


def _from_padded_setup_context(ctx, inputs, output):
    padded, offsets, sizes = inputs[:3]
    ctx.slot = list(padded.shape[1:])
    ctx.save_for_backward(offsets, sizes)


def _from_padded_backward(ctx, grad):
    offsets, sizes = ctx.saved_tensors
    grad_padded = torch.ops.octopus.to_padded(grad.contiguous(), offsets, sizes, ctx.slot, 0.0, False)
    return grad_padded, None, None, None, None, None, None, None


torch.library.register_autograd("octopus::from_padded", _from_padded_backward,
                                setup_context=_from_padded_setup_context)

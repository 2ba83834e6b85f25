"""The Python face of the ops: take a ragged batch in any form (:mod:`octopus.inputs`),
or plain tensors, and call ``torch.ops.octopus.*`` with the batch's cached metadata."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union, overload

import torch

from . import _registrations, tuning  # noqa: F401
from ._messages import describe, format_shape
from .inputs import FORMS, PackedLike, RaggedLike, RaggedResult, as_ragged, one_of
from .ragged import RaggedBatch
from .strategies import check_strategy, resolve_block_elems

ParamLike = Union[torch.Tensor, float, int, None]


def _item_param(value: ParamLike, name: str, num_items: int, like: torch.Tensor, fill: float) -> torch.Tensor:
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    if value is None:
        value = fill
    if isinstance(value, (int, float)):
        return torch.full((num_items,), float(value), dtype=dtype, device=like.device)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, a number or None, got {describe(value)}")
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {value.dtype}")
    if value.device != like.device:
        raise ValueError(f"{name} must be on the device of values ({like.device}), got {value.device}")
    return value.to(dtype)


@overload
def affine(x: PackedLike, scale: ParamLike = None, bias: ParamLike = None, *, offsets: None = None,
           strategy: str = "auto", block_elems: Optional[int] = None) -> RaggedBatch: ...
@overload
def affine(x: torch.Tensor, scale: ParamLike = None, bias: ParamLike = None, *,
           offsets: Optional[torch.Tensor] = None, strategy: str = "auto",
           block_elems: Optional[int] = None) -> torch.Tensor: ...
def affine(x: Union[RaggedLike, torch.Tensor], scale: ParamLike = None, bias: ParamLike = None, *,
           offsets: Optional[torch.Tensor] = None, strategy: str = "auto",
           block_elems: Optional[int] = None) -> RaggedResult:
    """``x * scale[item] + bias[item]`` over a ragged batch, in one kernel launch.

    ``scale`` and ``bias`` are per item (``[M]``), per item and channel (``[M, C]``: each
    item is C equal contiguous planes, as a ``[C, H, W]`` image is), or numbers. Values
    may be float32, float64, float16, bfloat16 or uint8; uint8 gives float32, the others
    keep their dtype. Arithmetic is float32 (float64 for float64 values).

    ``x`` is a ragged batch in any form (:data:`octopus.inputs.RaggedLike`): a
    :class:`RaggedBatch` or a list or tuple of tensors gives a :class:`RaggedBatch` (sharing
    the input batch's cached plan), a ``torch.nested`` tensor a nested tensor of its layout.
    Or ``x`` is a 1-D values tensor with ``offsets``: that gives a tensor (the offsets are
    checked on every call). Differentiable with respect to values, scale and bias.

    ``strategy="auto"`` uses the strategy and block size :func:`octopus.autotune` chose for
    the device (the built-in default where it never ran); an explicit ``block_elems`` wins.
    """
    check_strategy(strategy, allow_auto=True)
    if isinstance(x, torch.Tensor) and not x.is_nested:
        return _affine_values(x, scale, bias, offsets, strategy, block_elems)
    if offsets is not None:
        raise ValueError("offsets is taken from the ragged batch x; pass it only with a 1-D values tensor")
    given = as_ragged(x, "x")
    batch = given.batch
    strategy, block_elems = tuning.resolve(strategy, block_elems, batch.device)
    block_elems = resolve_block_elems(block_elems)
    m = len(batch)
    s = _item_param(scale, "scale", m, batch.values, 1.0)
    b = _item_param(bias, "bias", m, batch.values, 0.0)
    out = torch.ops.octopus.affine(batch.values, batch.offsets, s, b, strategy, block_elems,
                                   batch.metadata(strategy, block_elems), False)
    return given.result(batch.with_values(out))


def _affine_values(values: torch.Tensor, scale: ParamLike, bias: ParamLike, offsets: Optional[torch.Tensor],
                   strategy: str, block_elems: Optional[int]) -> torch.Tensor:
    """affine of a 1-D values tensor cut into items by ``offsets`` (checked by the op)."""
    if offsets is None:
        raise TypeError(f"x must be {one_of(FORMS + ('a 1-D values tensor with offsets=',))}; got "
                        f"{describe(values)} and no offsets")
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(f"offsets must be an int64 tensor [num_items + 1], got {describe(offsets)}")
    strategy, block_elems = tuning.resolve(strategy, block_elems, values.device)
    block_elems = resolve_block_elems(block_elems)
    # The op names what is wrong with offsets that have no entry (or not one dimension).
    m = max(offsets.shape[0] - 1, 0) if offsets.dim() == 1 else 0
    s = _item_param(scale, "scale", m, values, 1.0)
    b = _item_param(bias, "bias", m, values, 0.0)
    out: torch.Tensor = torch.ops.octopus.affine(values, offsets, s, b, strategy, block_elems, None, True)
    return out


def _pointwise(x: RaggedLike, kind: str, a: ParamLike, b: ParamLike, a_name: str, b_name: str, b_fill: float,
               strategy: str, block_elems: Optional[int]) -> RaggedResult:
    given = as_ragged(x, "x")
    x = given.batch
    check_strategy(strategy, allow_auto=True)
    strategy, block_elems = tuning.resolve(strategy, block_elems, x.device)
    block_elems = resolve_block_elems(block_elems)
    m = len(x)
    pa = _item_param(a, a_name, m, x.values, 0.0)
    pb = _item_param(b, b_name, m, x.values, b_fill)
    for p, name in ((pa, a_name), (pb, b_name)):
        if p.dim() not in (1, 2) or p.shape[0] != m:
            raise ValueError(f"{name} must have shape [num_items] or [num_items, channels] with num_items = {m}, "
                             f"got {format_shape(p.shape)}")
    if pa.dim() != pb.dim():  # per item for one, per item and channel for the other
        c = (pa if pa.dim() == 2 else pb).shape[1]
        pa, pb = (p if p.dim() == 2 else p.view(m, 1).expand(m, c).contiguous() for p in (pa, pb))
    out = torch.ops.octopus.pointwise(x.values, x.offsets, kind, pa, pb, strategy, block_elems,
                                      x.metadata(strategy, block_elems), False)
    return given.result(x.with_values(out))


@overload
def clamp(x: PackedLike, lo: ParamLike, hi: ParamLike, *, strategy: str = "auto",
          block_elems: Optional[int] = None) -> RaggedBatch: ...
@overload
def clamp(x: torch.Tensor, lo: ParamLike, hi: ParamLike, *, strategy: str = "auto",
          block_elems: Optional[int] = None) -> torch.Tensor: ...
def clamp(x: RaggedLike, lo: ParamLike, hi: ParamLike, *, strategy: str = "auto",
          block_elems: Optional[int] = None) -> RaggedResult:
    """``min(max(x, lo[item]), hi[item])`` with bounds per item (``[M]``), per item and
    channel (``[M, C]``) or numbers; uint8 values give float32. Differentiable in the values.

    ``x`` is a ragged batch in any form (:data:`octopus.inputs.RaggedLike`); the result is a
    :class:`RaggedBatch`, or a nested tensor of the input's layout for a nested input."""
    return _pointwise(x, "clamp", lo, hi, "lo", "hi", 0.0, strategy, block_elems)


@overload
def threshold(x: PackedLike, thresholds: ParamLike, *, mode: str = "mask", value: ParamLike = 0.0,
              strategy: str = "auto", block_elems: Optional[int] = None) -> RaggedBatch: ...
@overload
def threshold(x: torch.Tensor, thresholds: ParamLike, *, mode: str = "mask", value: ParamLike = 0.0,
              strategy: str = "auto", block_elems: Optional[int] = None) -> torch.Tensor: ...
def threshold(x: RaggedLike, thresholds: ParamLike, *, mode: str = "mask", value: ParamLike = 0.0,
              strategy: str = "auto", block_elems: Optional[int] = None) -> RaggedResult:
    """Per-item thresholds: ``mode="mask"`` gives 1 where ``x > threshold[item]`` and 0
    elsewhere; ``mode="keep"`` keeps x there and puts ``value`` (per item, or a number)
    elsewhere. uint8 values give float32. "keep" is differentiable in the values.

    ``x`` and the result as for :func:`clamp`."""
    if mode not in ("mask", "keep"):
        raise ValueError(f"mode must be 'mask' or 'keep', got {mode!r}")
    return _pointwise(x, "threshold_" + mode, thresholds, value, "thresholds", "value", 0.0, strategy, block_elems)


@overload
def power(x: PackedLike, exponent: ParamLike, gain: ParamLike = 1.0, *, strategy: str = "auto",
          block_elems: Optional[int] = None) -> RaggedBatch: ...
@overload
def power(x: torch.Tensor, exponent: ParamLike, gain: ParamLike = 1.0, *, strategy: str = "auto",
          block_elems: Optional[int] = None) -> torch.Tensor: ...
def power(x: RaggedLike, exponent: ParamLike, gain: ParamLike = 1.0, *, strategy: str = "auto",
          block_elems: Optional[int] = None) -> RaggedResult:
    """``gain[item] * x ** exponent[item]`` (gamma correction of non-negative data; a
    negative x with a fractional exponent gives NaN, as ``torch.pow`` does). uint8 values
    give float32. Differentiable in the values. ``x`` and the result as for :func:`clamp`."""
    return _pointwise(x, "power", exponent, gain, "exponent", "gain", 1.0, strategy, block_elems)


def plan(batch: Union[RaggedLike, torch.Tensor], block_elems: Optional[int] = None,
         num_values: Optional[int] = None) -> torch.Tensor:
    """The block plan of a batch, built on its device (a scan and a fill kernel on CUDA:
    no host loop, no copy, no synchronization). Cached on a :class:`RaggedBatch`.

    ``batch`` is a ragged batch in any form (:data:`octopus.inputs.RaggedLike`), or an
    offsets tensor (int64 ``[M + 1]``) with ``num_values``.

    Format (int64 ``[capacity + 1, 2]``): row 0 is ``(count, block_elems)``; row ``1 + j``
    for ``j < count`` is ``(begin, item << 32 | length)``: block j covers packed elements
    ``[begin, begin + length)`` of ``item``. :func:`plan_blocks` decodes it.
    """
    if not isinstance(batch, torch.Tensor) or batch.is_nested:
        return as_ragged(batch, "batch").batch.plan(block_elems)
    if num_values is None:
        raise ValueError("num_values is required when batch is an offsets tensor")
    out: torch.Tensor = torch.ops.octopus.plan(batch, num_values, resolve_block_elems(block_elems))
    return out


def plan_blocks(plan_tensor: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decodes a plan into ``(item, begin, end)`` int64 tensors of its blocks (on the CPU)."""
    p = plan_tensor.cpu()
    count = int(p[0, 0])
    rows = p[1:1 + count]
    item = rows[:, 1] >> 32
    begin = rows[:, 0]
    end = begin + (rows[:, 1] & 0xFFFFFFFF)
    return item, begin, end


def to_padded(batch: RaggedLike, pad_value: float = 0.0, max_size: Optional[Sequence[int]] = None) -> torch.Tensor:
    """``[M, *max_shape]``: every item in the leading corner of its slot, ``pad_value``
    elsewhere, in one kernel. ``max_size`` (one extent per item dimension) fixes the slot
    shape and crops larger items; by default it is the largest extent of each dimension
    (read from the batch's host copy of its sizes: no device synchronization where the
    batch was built from host data). Differentiable with respect to the values.

    ``batch`` is a ragged batch in any form (:data:`octopus.inputs.RaggedLike`); the result
    is always a dense tensor."""
    batch = as_ragged(batch, "batch").batch
    d = batch.item_dim
    if max_size is None:
        sizes = batch.host_layout()[1]
        max_shape = sizes.amax(dim=0).tolist() if len(batch) else [0] * d
    else:
        max_shape = [int(s) for s in max_size]
        if len(max_shape) != d or any(s < 0 for s in max_shape):
            raise ValueError(f"max_size must have {d} non-negative extents, got {format_shape(max_shape)}")
    out: torch.Tensor = torch.ops.octopus.to_padded(batch.values, batch.offsets, batch.sizes, max_shape,
                                                     float(pad_value), False)
    return out


def from_padded(padded: torch.Tensor, sizes: Union[RaggedBatch, torch.Tensor, Sequence[Sequence[int]]], *,
                strategy: str = "auto", block_elems: Optional[int] = None, validate: bool = True) -> RaggedBatch:
    """The items of a dense ``[M, *slot]`` tensor as a :class:`RaggedBatch`: item ``i`` is
    the leading ``sizes[i]`` corner of ``padded[i]``. ``sizes`` is an int64 ``[M, D]`` tensor
    (on any device), a list of shapes, or a :class:`RaggedBatch` on ``padded``'s device whose
    layout the result takes (its offsets, sizes and cached plans: nothing is computed on the
    host, the fast way back after ``to_padded(batch)``). A sizes tensor has its offsets summed
    on ``padded``'s device (one small read back) and, where it is already a contiguous int64
    tensor there, becomes the result's ``sizes`` without a copy. With ``validate`` an item
    larger than its slot is an error (one check read back); without, its elements outside the
    slot read as 0. Differentiable."""
    if not isinstance(padded, torch.Tensor) or padded.is_nested:
        raise TypeError(f"padded must be a dense tensor [M, *slot], got {describe(padded)}")
    strategy, block_elems = tuning.resolve(check_strategy(strategy, allow_auto=True), block_elems, padded.device)
    block_elems = resolve_block_elems(block_elems)
    layout = _batch_layout(padded, sizes) if isinstance(sizes, RaggedBatch) else _sizes_layout(padded, sizes)
    values = torch.ops.octopus.from_padded(padded, layout.offsets, layout.sizes, layout.numel(), strategy, block_elems,
                                           layout.metadata(strategy, block_elems), validate)
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
    # The offsets are summed where padded lives (on a GPU: no host pass over M items, no
    # offsets to copy); one small read gives the element count and the sign check.
    dev_sizes = given.to(padded.device).contiguous()
    dev_offsets = torch.zeros(given.shape[0] + 1, dtype=torch.int64, device=padded.device)
    torch.cumsum(dev_sizes.prod(dim=1), 0, out=dev_offsets[1:])
    num_values, negative = torch.stack((dev_offsets[-1], (dev_sizes < 0).sum())).tolist()
    if negative:
        raise ValueError("sizes must be non-negative")
    return RaggedBatch(padded.new_empty((1,)).expand(num_values), dev_offsets, dev_sizes, validate=False)

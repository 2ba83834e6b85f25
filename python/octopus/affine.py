"""``affine``: ``x * scale[item] + bias[item]`` over a ragged batch (octopus::affine), its fake
and its autograd formula."""

from __future__ import annotations

from typing import Optional, Tuple, Union, overload

import torch

from . import tuning
from ._messages import describe
from ._registrations import call_op, item_sums, out_dtype, register_fake
from .inputs import FORMS, PackedLike, RaggedLike, RaggedResult, as_ragged, one_of
from .ragged import RaggedBatch
from .strategies import check_strategy, resolve_block_elems


ParamLike = Union[torch.Tensor, float, int, None]


def item_param(value: ParamLike, name: str, num_items: int, like: torch.Tensor, fill: float) -> torch.Tensor:
    """A per-item parameter as the ops take it: `value` (a number fills every item; None:
    `fill`) in float32 (float64 for float64 values), on the values' device."""
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
    return value if value.dtype == dtype else value.to(dtype)  # (no call into torch when it is ready)


def item_params(a: ParamLike, a_name: str, a_fill: float, b: ParamLike, b_name: str, b_fill: float, num_items: int,
                like: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Two per-item parameters (item_param), per item and channel ``[M, C]`` both where one
    is: the other, a number, None or an ``[M]`` tensor, then repeats over the channels.
    Other shapes are left to the op's checks, which name the argument."""
    pa, pb = item_param(a, a_name, num_items, like, a_fill), item_param(b, b_name, num_items, like, b_fill)
    shapes = {pa.dim(), pb.dim()}
    if shapes == {1, 2} and pa.shape[0] == pb.shape[0] == num_items:
        c = (pa if pa.dim() == 2 else pb).shape[1]
        pa, pb = (p if p.dim() == 2 else p.view(num_items, 1).expand(num_items, c).contiguous() for p in (pa, pb))
    return pa, pb


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
    the device and the batch's layout class (the built-in default where it never ran); an
    explicit ``block_elems`` wins.
    """
    check_strategy(strategy, allow_auto=True)
    if isinstance(x, torch.Tensor) and not x.is_nested:
        return _affine_values(x, scale, bias, offsets, strategy, block_elems)
    if offsets is not None:
        raise ValueError("offsets is taken from the ragged batch x; pass it only with a 1-D values tensor")
    given = as_ragged(x, "x")
    batch = given.batch
    strategy, block_elems = tuning.resolve(strategy, block_elems, batch.device, len(batch), batch.numel())
    block_elems = resolve_block_elems(block_elems)
    m = len(batch)
    s, b = item_params(scale, "scale", 1.0, bias, "bias", 0.0, m, batch.values)
    out = call_op(torch.ops.octopus.affine, batch.values, batch.offsets, s, b, strategy, block_elems,
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
    # The op names what is wrong with offsets that have no entry (or not one dimension).
    m = max(offsets.shape[0] - 1, 0) if offsets.dim() == 1 else 0
    strategy, block_elems = tuning.resolve(strategy, block_elems, values.device, m, values.numel())
    block_elems = resolve_block_elems(block_elems)
    s, b = item_params(scale, "scale", 1.0, bias, "bias", 0.0, m, values)
    out: torch.Tensor = call_op(torch.ops.octopus.affine, values, offsets, s, b, strategy, block_elems, None, True)
    return out


@register_fake("octopus::affine")
def _affine_fake(values, offsets, scale, bias, strategy="plan", block_elems=0, metadata=None, validate=True):
    torch._check(values.dim() == 1, lambda: "values must be 1-D")
    torch._check(scale.shape[0] == offsets.shape[0] - 1, lambda: "scale must have num_items rows")
    torch._check(bias.shape == scale.shape, lambda: "bias must have the same shape as scale")
    return values.new_empty(values.shape, dtype=out_dtype(values.dtype))


def _affine_setup_context(ctx, inputs, output):
    values, offsets, scale, bias, strategy, block_elems, metadata, validate = inputs
    ctx.strategy, ctx.block_elems = strategy, block_elems
    ctx.channels = scale.shape[1] if scale.dim() == 2 else 0
    ctx.save_for_backward(values if ctx.needs_input_grad[2] else None, offsets, scale, metadata)


def _affine_backward(ctx, grad):
    values, offsets, scale, metadata = ctx.saved_tensors
    grad_values = grad_scale = grad_bias = None
    if ctx.needs_input_grad[0]:
        # d(out)/d(values) is the item's scale: the same op with zero bias.
        grad_values = torch.ops.octopus.affine(grad.contiguous(), offsets, scale, torch.zeros_like(scale),
                                               ctx.strategy, ctx.block_elems, metadata, False)
    acc = scale.dtype
    if ctx.needs_input_grad[2]:
        grad_scale = item_sums(grad.to(acc) * values.to(acc), offsets, ctx.channels)
    if ctx.needs_input_grad[3]:
        grad_bias = item_sums(grad.to(acc), offsets, ctx.channels)
    return grad_values, None, grad_scale, grad_bias, None, None, None, None


torch.library.register_autograd("octopus::affine", _affine_backward, setup_context=_affine_setup_context)

"""Element-wise ops with two per-item parameters (octopus::pointwise): clamp, threshold,
power, and the center-and-scale step of normalize; their fake and autograd formulas."""

from __future__ import annotations

from typing import Optional, overload

import torch

from . import tuning
from ._messages import format_shape
from ._registrations import call_op, item_sums, out_dtype, register_fake
from .affine import ParamLike, item_params
from .inputs import PackedLike, RaggedLike, RaggedResult, as_ragged
from .ragged import RaggedBatch
from .strategies import check_strategy, resolve_block_elems


def run_pointwise(x: RaggedLike, kind: str, a: ParamLike, b: ParamLike, a_name: str, b_name: str, b_fill: float,
                  strategy: str, block_elems: Optional[int]) -> RaggedResult:
    """octopus::pointwise of ``kind`` over ``x`` with per-item (or per item and channel)
    parameters ``a`` and ``b``, named ``a_name`` and ``b_name`` in errors."""
    given = as_ragged(x, "x")
    x = given.batch
    check_strategy(strategy, allow_auto=True)
    strategy, block_elems = tuning.resolve(strategy, block_elems, x.device, len(x), x.numel())
    block_elems = resolve_block_elems(block_elems)
    m = len(x)
    pa, pb = item_params(a, a_name, 0.0, b, b_name, b_fill, m, x.values)
    for p, name in ((pa, a_name), (pb, b_name)):
        if p.dim() not in (1, 2) or p.shape[0] != m:
            raise ValueError(f"{name} must have shape [num_items] or [num_items, channels] with num_items = {m}, "
                             f"got {format_shape(p.shape)}")
    out = call_op(torch.ops.octopus.pointwise, x.values, x.offsets, kind, pa, pb, strategy, block_elems,
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
    return run_pointwise(x, "clamp", lo, hi, "lo", "hi", 0.0, strategy, block_elems)


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
    return run_pointwise(x, "threshold_" + mode, thresholds, value, "thresholds", "value", 0.0, strategy, block_elems)


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
    return run_pointwise(x, "power", exponent, gain, "exponent", "gain", 1.0, strategy, block_elems)


@register_fake("octopus::pointwise")
def _pointwise_fake(values, offsets, kind, a, b, strategy="plan", block_elems=0, metadata=None, validate=True):
    torch._check(values.dim() == 1, lambda: "values must be 1-D")
    torch._check(a.shape[0] == offsets.shape[0] - 1, lambda: "a must have num_items rows")
    torch._check(b.shape == a.shape, lambda: "b must have the same shape as a")
    return values.new_empty(values.shape, dtype=out_dtype(values.dtype))


def _pointwise_setup_context(ctx, inputs, output):
    values, offsets, kind, a, b, strategy, block_elems, metadata, validate = inputs
    ctx.kind, ctx.strategy, ctx.block_elems = kind, strategy, block_elems
    ctx.save_for_backward(values, offsets, a, b, metadata)


def _pointwise_backward(ctx, grad):
    """The values' gradient, from the same op: clamp passes it where lo <= x <= hi,
    threshold "keep" where x > t, power scales it by a * b * x^(a - 1); the masks have none.
    The parameters get no gradient, except center_scale's (normalization's mean and scale)."""
    values, offsets, a, b, metadata = ctx.saved_tensors
    if ctx.kind == "center_scale":
        return _center_scale_backward(ctx, grad, values, offsets, a, b, metadata)

    def same_op(kind, p, q):
        return torch.ops.octopus.pointwise(values, offsets, kind, p, q, ctx.strategy, ctx.block_elems, metadata, False)

    if ctx.kind == "clamp":
        local = same_op("inside", a, b)
    elif ctx.kind == "threshold_keep":
        local = same_op("threshold_mask", a, b)
    elif ctx.kind == "power":
        local = same_op("power", a - 1, a * b)
    else:
        local = torch.zeros_like(grad)
    return (grad * local).to(values.dtype), None, None, None, None, None, None, None, None


def _center_scale_backward(ctx, grad, values, offsets, a, b, metadata):
    """out = (x - a) * b with a and b constant over an item (or its channel): d/dx = b,
    d/da = -b * sum(grad), d/db = sum(grad * x) - a * sum(grad) over the item (channel)."""
    grad_values = grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_values = torch.ops.octopus.pointwise(grad.contiguous(), offsets, "center_scale", torch.zeros_like(a), b,
                                                  ctx.strategy, ctx.block_elems, metadata, False).to(values.dtype)
    if ctx.needs_input_grad[3] or ctx.needs_input_grad[4]:
        channels = a.shape[1] if a.dim() == 2 else 0
        acc = a.dtype
        sum_grad = item_sums(grad.to(acc), offsets, channels)
        if ctx.needs_input_grad[3]:
            grad_a = -b * sum_grad
        if ctx.needs_input_grad[4]:
            grad_b = item_sums(grad.to(acc) * values.to(acc), offsets, channels) - a * sum_grad
    return grad_values, None, None, grad_a, grad_b, None, None, None, None


torch.library.register_autograd("octopus::pointwise", _pointwise_backward, setup_context=_pointwise_setup_context)

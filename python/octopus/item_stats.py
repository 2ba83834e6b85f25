"""Per-item statistics and normalization of ragged batches."""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union, overload

import torch

from . import pointwise, tuning  # noqa: F401  (pointwise: octopus::normalize's second pass, its autograd)
from ._host_copies import as_device_tensor
from ._registrations import call_op, register_fake
from .inputs import PackedLike, RaggedLike, RaggedResult, as_ragged
from .ragged import RaggedBatch
from .strategies import resolve_block_elems


# Plan blocks of the statistics pass: each block ends in a warp reduction and four atomics,
# so larger blocks than the element-wise ops' pay (measured on an H100: 1.01 ms at 16384 vs
# 1.33 ms at 4096 for 10K items of 30K-80K fp32 elements).
STATS_BLOCK_ELEMS = 16384


class ItemStats(NamedTuple):
    """Statistics of every item (``[M]``) or item and channel (``[M, C]``), float64."""

    count: torch.Tensor  # type: ignore[assignment]  # (shadows tuple.count: the field's name says it best)
    sum: torch.Tensor
    mean: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor
    var: torch.Tensor
    std: torch.Tensor


def item_stats(batch: RaggedLike, channels: int = 0, *, correction: int = 1,
               block_elems: Optional[int] = None) -> ItemStats:
    """Sum, mean, min, max, variance and standard deviation of every item in one pass
    (``torch.ops.octopus.item_stats``: one kernel over the batch's block plan).

    ``channels=C`` computes them per item and channel (each item being C equal contiguous
    planes, as ``[C, H, W]`` images are): ``[M, C]`` results instead of ``[M]``. Results are
    float64, accumulated in float64 (see the op's note on numerics). ``correction`` is
    Bessel's correction of the variance (1: unbiased, as ``torch.var``; 0: population).
    Empty items: count and sum 0, the rest NaN; an item of n <= correction elements has NaN
    variance. sum, mean, var and std are differentiable with respect to the values.
    ``block_elems`` (default 16384) sizes the plan blocks of the pass.

    ``batch`` is a ragged batch in any form (:data:`octopus.inputs.RaggedLike`); the result
    is an :class:`ItemStats` of tensors whatever the form.
    """
    batch = as_ragged(batch, "batch").batch
    if correction < 0:
        raise ValueError(f"correction must be non-negative, got {correction}")
    _check_planes(batch, channels)
    block = resolve_block_elems(block_elems or STATS_BLOCK_ELEMS)
    plan = batch.plan(block) if batch.device.type == "cuda" else None
    raw = call_op(torch.ops.octopus.item_stats, batch.values, batch.offsets, channels, block, plan, False)
    planes = raw.shape[1]
    count = (batch.offsets.diff() // planes).to(torch.float64).unsqueeze(1).expand(-1, planes)
    total, m2, lo, hi = raw.unbind(2)
    mean = total / count
    var = m2 / (count - correction)
    nan = torch.full_like(var, float("nan"))
    var = torch.where(count > correction, var, nan)
    lo, hi = torch.where(count > 0, lo, nan), torch.where(count > 0, hi, nan)
    stats = ItemStats(count, total, mean, lo, hi, var, var.sqrt())
    if channels == 0:
        stats = ItemStats(*(s[:, 0] for s in stats))
    return stats


Constants = Union[Sequence[float], torch.Tensor, None]


@overload
def normalize(batch: PackedLike, channels: int = 0, *, mean: Constants = None, std: Constants = None,
              eps: float = 1e-5, correction: int = 0, block_elems: Optional[int] = None) -> RaggedBatch: ...
@overload
def normalize(batch: torch.Tensor, channels: int = 0, *, mean: Constants = None, std: Constants = None,
              eps: float = 1e-5, correction: int = 0, block_elems: Optional[int] = None) -> torch.Tensor: ...
def normalize(batch: RaggedLike, channels: int = 0, *, mean: Constants = None, std: Constants = None,
              eps: float = 1e-5, correction: int = 0, block_elems: Optional[int] = None) -> RaggedResult:
    """Normalizes every item (``channels=0``) or every item's channel, in two forms that
    follow torch's own:

    * **Each item's own statistics** (``mean`` and ``std`` not given): instance normalization
      as ``torch.nn.functional.instance_norm`` computes it, ``(x - mean) / sqrt(var + eps)``
      with the population variance (``correction=0``; :func:`item_stats` defaults to
      ``correction=1`` as ``torch.var`` does: pass ``correction`` to either to change it).
      :func:`item_stats`' kernel computes them, then the result is ``(x - mean) * (1 /
      sqrt(var + eps))`` — two passes over the data; an item or channel of constant values
      comes out exactly 0, an empty one stays empty.
    * **Fixed constants** (``mean`` and ``std``, one value per channel, e.g. ImageNet's):
      ``(x - mean) / std`` as ``torchvision.transforms.Normalize`` computes it (``eps`` is not
      used), for every item; only the second pass runs.

    uint8 values give float32. Differentiable with respect to the values. A call that needs
    no gradient goes from this one Python call to its kernels (statistics, each item's center
    and scale — ``torch.ops.octopus.normalize_constants`` — and the second pass) without
    returning to Python: little host time for an eager latency-critical caller.

    ``batch`` is a ragged batch in any form (:data:`octopus.inputs.RaggedLike`, packed once
    for both passes); the result is a :class:`RaggedBatch`, or a nested tensor of the
    input's layout for a nested input.
    """
    if (mean is None) != (std is None):
        raise ValueError("give both mean and std (fixed constants) or neither (each item's own statistics)")
    given = as_ragged(batch, "batch")
    batch = given.batch
    _check_planes(batch, channels)
    if mean is not None and std is not None and max(channels, 1) != len(mean):
        raise ValueError(f"mean and std must have one value per channel ({max(channels, 1)}), got {len(mean)} and "
                         f"{len(std)}")
    strategy, block = tuning.resolve("auto", block_elems, batch.device, len(batch), batch.numel())
    block = resolve_block_elems(block)
    stats_block = resolve_block_elems(block_elems or STATS_BLOCK_ELEMS)
    plan = batch.plan(stats_block) if batch.device.type == "cuda" and mean is None else None
    # One call: octopus::normalize runs the statistics, the per-item constants and the second
    # pass on the device (an eager caller hands the GIL over once, not a dozen times).
    out: torch.Tensor = torch.ops.octopus.normalize(
        batch.values, batch.offsets, channels, float(eps), int(correction), _constants(mean, batch.device),
        _constants(std, batch.device), stats_block, plan, strategy, block, batch.metadata(strategy, block))
    return given.result(batch.with_values(out))


def _check_planes(batch: RaggedBatch, channels: int) -> None:
    """``channels`` is 0 or splits every item of ``batch`` into equal planes (checked once
    per batch and count, on the host copy of its layout)."""
    if not isinstance(channels, int) or isinstance(channels, bool) or channels < 0:
        raise ValueError(f"channels must be 0 (per item) or a positive number of channels, got {channels!r}")
    if channels <= 1 or ("planes", channels) in batch._metadata:
        return
    lengths = batch.host_layout()[0].diff()
    bad = (lengths % channels).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"channels={channels}: item {i} has {int(lengths[i])} elements, which do not split into "
                         f"{channels} equal planes ({bad.shape[0]} items do not)")
    batch._metadata[("planes", channels)] = batch.offsets[:0]  # a marker: the check passed


def _constants(value: Constants, device: torch.device) -> Optional[torch.Tensor]:
    """Per-channel constants as a float64 tensor on ``device`` (a sequence of numbers is
    copied there once and kept, so that a loop over batches copies nothing)."""
    return None if value is None else as_device_tensor(value, torch.float64, device).reshape(-1)


@register_fake("octopus::item_stats")
def _item_stats_fake(values, offsets, channels=0, block_elems=0, plan=None, validate=True):
    return values.new_empty((offsets.shape[0] - 1, max(channels, 1), 4), dtype=torch.float64)


def _item_stats_setup_context(ctx, inputs, output):
    values, offsets, channels = inputs[:3]
    ctx.channels = channels
    ctx.save_for_backward(values, offsets, output)


def _item_stats_backward(ctx, grad):
    # d sum / dx = 1 and d M2 / dx = 2 (x - mean) within the element's (item, channel): the
    # gradient is x * (2 g_M2) + (g_sum - 2 g_M2 mean), an affine op. min and max have none.
    values, offsets, stats = ctx.saved_tensors
    planes = stats.shape[1]
    count = (offsets.diff() // planes).to(torch.float64).clamp_min(1).unsqueeze(1)
    g_sum, g_m2 = grad[..., 0], grad[..., 1]
    mean = stats[..., 0] / count
    acc = torch.float64 if values.dtype == torch.float64 else torch.float32
    scale = (2 * g_m2).to(acc)
    bias = torch.nan_to_num(g_sum - 2 * g_m2 * mean).to(acc)
    if ctx.channels == 0:
        scale, bias = scale[:, 0], bias[:, 0]
    grad_values = torch.ops.octopus.affine(values, offsets, scale.contiguous(), bias.contiguous(), "block_search", 0,
                                           None, False)
    return grad_values.to(values.dtype), None, None, None, None, None


torch.library.register_autograd("octopus::item_stats", _item_stats_backward, setup_context=_item_stats_setup_context)


@register_fake("octopus::normalize_constants")
def _normalize_constants_fake(stats, offsets, channels, eps, correction, dtype):
    shape = (stats.shape[0], stats.shape[1])
    return stats.new_empty(shape, dtype=dtype), stats.new_empty(shape, dtype=dtype)


def _normalize_constants_setup_context(ctx, inputs, output):
    stats, offsets, _, ctx.eps, ctx.correction, _ = inputs
    ctx.save_for_backward(stats, offsets)


def _normalize_constants_backward(ctx, grad_center, grad_scale):
    # center = sum / n and scale = (M2 / (n - correction) + eps) ** -0.5, each through
    # nan_to_num, whose gradient is 0 where its input is not finite.
    stats, offsets = ctx.saved_tensors
    n = (offsets.diff() // stats.shape[1]).to(torch.float64).unsqueeze(1)
    dof = n - ctx.correction
    center = stats[..., 0] / n
    scale = torch.where(dof > 0, (stats[..., 1] / dof + ctx.eps).rsqrt(), float("nan"))
    zero = stats.new_zeros(())
    grad = torch.zeros_like(stats)
    if grad_center is not None:
        grad[..., 0] = torch.where(center.isfinite(), grad_center.to(torch.float64) / n, zero)
    if grad_scale is not None:
        grad[..., 1] = torch.where(scale.isfinite(), grad_scale.to(torch.float64) * -0.5 * scale ** 3 / dof, zero)
    return grad, None, None, None, None, None


torch.library.register_autograd("octopus::normalize_constants", _normalize_constants_backward,
                                setup_context=_normalize_constants_setup_context)

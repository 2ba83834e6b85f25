"""What the op families' registrations share: the fake decorator that checks devices as the
kernels do, the call that skips autograd where nothing needs a gradient, the output dtype rule
and per-item sums for autograd formulas. Each family's module (affine.py, pointwise.py,
padding.py, item_stats.py, crop_resize.py, stencil.py, tile_stats.py, plan.py,
diffusion/rows.py) registers its own fakes and formulas."""

import functools
import inspect
from typing import Any

import torch

from . import _library  # noqa: F401  (the ops must exist before fakes are registered for them)


def register_fake(op):
    """``torch.library.register_fake(op)`` with the real kernels' device check in front: every
    tensor argument on the device of the first. A parameter on another device (a ``meta``
    ``scale`` beside a CPU batch, say) sends the call here, to the fake, which would otherwise
    return an uninitialized tensor on the batch's device."""
    def register(fake):
        signature = inspect.signature(fake)

        @functools.wraps(fake)
        def checked(*args, **kwargs):
            tensors = [(name, value) for name, value in signature.bind(*args, **kwargs).arguments.items()
                       if isinstance(value, torch.Tensor)]
            first_name, first = tensors[0]
            for name, value in tensors[1:]:
                if value.device != first.device:
                    raise ValueError(f"{name} must be on the device of {first_name} ({first.device}), "
                                     f"got {value.device}")
            return fake(*args, **kwargs)

        torch.library.register_fake(op)(checked)
        return fake
    return register


def call_op(op: Any, *args: Any) -> Any:
    """``op(*args)`` (an octopus operator), below autograd where no argument needs a gradient
    and ``torch.compile`` is not tracing: the ops' autograd formulas are registered from Python,
    so the autograd step would run Python on the way to the kernel even when nothing needs a
    gradient (host time an eager latency-critical caller pays on every call)."""
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args)):
        return op(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def out_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype == torch.uint8 else dtype


def item_sums(data: torch.Tensor, offsets: torch.Tensor, channels: int) -> torch.Tensor:
    """Sum of ``data`` over each item (``[M]``), or over each of an item's ``channels``
    equal contiguous planes (``[M, C]``)."""
    m = offsets.shape[0] - 1
    if channels == 0:
        return torch.segment_reduce(data, "sum", offsets=offsets, unsafe=True)
    plane = offsets.diff() // channels
    starts = offsets[:-1, None] + torch.arange(channels, device=offsets.device) * plane[:, None]
    plane_offsets = torch.cat([starts.reshape(-1), offsets[-1:]])
    return torch.segment_reduce(data, "sum", offsets=plane_offsets, unsafe=True).view(m, channels)

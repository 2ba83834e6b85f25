"""Small host tensors (weights, layouts, boxes, per-channel constants) onto the GPU without
waiting for its queue.

``tensor.to("cuda")`` from ordinary (pageable) host memory synchronizes the current stream:
the calling thread waits until everything queued on it before has run. An op that copies a
few numbers per call that way serializes its caller: a loop of small launches (a best-effort
job cut into slices, a frame loop) never has more than one launch in flight, and its host
time per call becomes the device time of everything queued ahead of it. The copies here go
through pinned memory instead, queued on the current stream like any launch."""

from __future__ import annotations

import collections
from typing import Any, Optional, Sequence, Tuple

import torch


def _must_copy_blocking(device: torch.device) -> bool:
    """Traced, or inside CUDA graph capture: copy as torch does (a staging buffer lives until
    its copy has run once, where a graph would read it at every replay; torch refuses a copy
    from pageable memory during capture, with a clear error)."""
    return torch.compiler.is_compiling() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def to_device(values: Any, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``values`` (a tensor, or a host array ``torch.as_tensor`` takes) as
    ``tensor.to(device=device, dtype=dtype)``; a CPU tensor bound for a GPU is staged in
    pinned memory and copied without a stream synchronization (torch's caching host
    allocator keeps the staging buffer until the copy has run)."""
    tensor = torch.as_tensor(values)
    if tensor.device.type != "cpu" or device.type != "cuda" or _must_copy_blocking(device):
        return tensor.to(device=device, dtype=dtype)
    # Contiguous first: torch would stage a strided tensor again, in pageable memory.
    staged = (tensor if dtype is None else tensor.to(dtype=dtype)).contiguous()
    return staged.pin_memory().to(device, non_blocking=True)


# (values, dtype, device) -> the tensor; the oldest entries go past _CONSTANTS_KEPT.
_constants: "collections.OrderedDict[Tuple[Tuple[float, ...], torch.dtype, torch.device], torch.Tensor]" = (
    collections.OrderedDict())
_CONSTANTS_KEPT = 256


def constant(values: Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 1-D tensor of ``values`` on ``device``, made once per (values, dtype, device) and
    kept: callers must not write it. Inside CUDA graph capture only a kept one can be used
    (making one copies from the host, which capture forbids): a call before capture makes it."""
    key = (tuple(float(v) for v in values), dtype, device)
    if torch.compiler.is_compiling():
        return torch.tensor(key[0], dtype=dtype, device=device)
    kept = _constants.get(key)
    if kept is not None:
        return kept
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"constants {list(key[0])} are not on {device} yet and cannot be copied there during CUDA "
                           f"graph capture: run the call once before capturing it")
    # Copied blocking, once, so that every stream may read it at once; an ordinary tensor even
    # when the first call comes in inference mode (autograd may save it later).
    with torch.inference_mode(False):
        kept = torch.tensor(key[0], dtype=dtype).to(device)
    _constants[key] = kept
    while len(_constants) > _CONSTANTS_KEPT:
        _constants.popitem(last=False)
    return kept


def as_device_tensor(value: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``value`` (a tensor, or numbers in anything ``torch.as_tensor`` takes) as a ``dtype``
    tensor of its shape on ``device``: numbers are copied once and kept (:func:`constant`),
    a tensor with :func:`to_device`."""
    if isinstance(value, torch.Tensor):
        return to_device(value, device, dtype)
    host = torch.as_tensor(value, dtype=dtype)
    return constant(host.reshape(-1).tolist(), dtype, device).view(host.shape)

"""The block plan and the per-element lookup table: what the strategies read to find an
element's item (octopus::plan, octopus::lookup_table, octopus::validate_layout)."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ._registrations import register_fake
from .inputs import RaggedLike, as_ragged
from .strategies import resolve_block_elems


def plan(batch: Union[RaggedLike, torch.Tensor], block_elems: Optional[int] = None,
         num_values: Optional[int] = None) -> torch.Tensor:
    """The block plan of a batch, built on its device (a scan and a fill kernel on CUDA:
    no host loop, no copy, no synchronization). Cached on a :class:`RaggedBatch`.

    ``batch`` is a ragged batch in any form (:data:`octopus.inputs.RaggedLike`), or an
    offsets tensor (int64 ``[M + 1]``) with ``num_values``.

    Format (int64 ``[capacity + 1, 2]``): row 0 is ``(count, block_elems)``; row ``1 + j``
    for ``j < count`` is ``(begin, item << 32 | run << 31 | length)``: block j covers packed
    elements ``[begin, begin + length)`` of ``item``, or, where ``run`` is set, of the
    consecutive small items from ``item`` on (at most 32 items of at most
    ``min(block_elems // 8, 256)`` elements each, within one window of 32 item indices).
    :func:`plan_blocks` decodes it.
    """
    if not isinstance(batch, torch.Tensor) or batch.is_nested:
        return as_ragged(batch, "batch").batch.plan(block_elems)
    if num_values is None:
        raise ValueError("num_values is required when batch is an offsets tensor")
    out: torch.Tensor = torch.ops.octopus.plan(batch, num_values, resolve_block_elems(block_elems))
    return out


def plan_blocks(plan_tensor: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decodes a plan into ``(item, begin, end, run)`` tensors of its blocks (on the CPU):
    int64 ``item``, ``begin`` and ``end``, and bool ``run``, set for a block that covers a run
    of whole small items from ``item`` on (each element then belongs to the last item that
    starts at or before it)."""
    p = plan_tensor.cpu()
    count = int(p[0, 0])
    rows = p[1:1 + count]
    item = rows[:, 1] >> 32
    begin = rows[:, 0]
    end = begin + (rows[:, 1] & 0x7FFFFFFF)
    run = (rows[:, 1] & 0x80000000) != 0
    return item, begin, end, run


@register_fake("octopus::plan")
def _plan_fake(offsets, num_values, block_elems):
    return offsets.new_empty((num_values // block_elems + offsets.shape[0], 2))


@register_fake("octopus::lookup_table")
def _lookup_table_fake(offsets, num_values):
    return offsets.new_empty((num_values,), dtype=torch.int32)


@register_fake("octopus::validate_layout")
def _validate_layout_fake(offsets, sizes, num_values):
    return None

"""Ragged all-to-all, all-gather and gather (TorchRec's pattern for jagged tensors).

Each call makes three collectives: the counts exchange (items and elements per pair of
ranks, with the agreement checks: :mod:`.agreement`), then one ``all_to_all_single`` of the
item shapes and one of the values, both at exact sizes (no padding). Items arrive grouped by
source rank, in their order on that rank.
"""

from __future__ import annotations

import operator
from typing import Any, List, Optional, Sequence, Tuple, Union, cast

import torch
import torch.distributed as dist

from ..ragged import RaggedBatch
from .agreement import Contribution, RankGroup, device_problem
from .packing import SendLayout, unpack

DestLike = Union[torch.Tensor, Sequence[int]]


def all_to_all(batch: RaggedBatch, dest: DestLike, group: Optional[dist.ProcessGroup] = None) -> RaggedBatch:
    """Sends item ``i`` of this rank's ``batch`` to rank ``dest[i]`` of ``group``; returns the
    items every rank sent here, grouped by source rank (rank 0's first), each source's items
    in their original order, with their shapes.

    ``dest``: one rank (in ``group``) per item, as an integer tensor (on any device; the
    grouping is computed on the batch's device) or a sequence of ints. Every rank calls
    this; a rank may send or receive nothing. Items already grouped by destination (``dest``
    non-decreasing) are sent from ``batch.values`` itself, otherwise they are copied once
    into a send buffer.

    Differentiable with respect to ``batch.values``: the backward pass is the reverse
    exchange, so every rank must run it (every rank's values require gradients, or none's).
    Bad input on any rank (``dest`` of the wrong length or type, ranks out of range, a batch
    on a device the group's backend does not exchange) and batches whose item dimensions,
    dtypes or device types differ between ranks raise the same error on every rank.
    """
    group_ = RankGroup(group, "all_to_all")
    mine = _contribution(group_, batch)
    layout: Optional[SendLayout] = None
    dest_tensor: Optional[torch.Tensor] = None
    if mine.problem is None:
        dest_tensor, mine.problem = _read_dest(dest, batch)
    if dest_tensor is not None:  # (None exactly where there is a problem)
        layout, out_of_range = SendLayout.by_destination(batch.offsets, dest_tensor, group_.size)
        if out_of_range:
            mine.problem = ("ValueError", out_of_range)
    zeros = [0] * group_.size
    items_from, elements_from = group_.agree(mine, layout.items_per_rank if layout else zeros,
                                             layout.elements_per_rank if layout else zeros)
    sent = cast(SendLayout, layout)  # agree() raised on every rank where any rank had a problem
    values, sizes = sent.pack(batch)
    return _exchange(group_, values, sizes, sent.items_per_rank, sent.elements_per_rank, items_from,
                     elements_from)


def all_gather(batch: RaggedBatch, group: Optional[dist.ProcessGroup] = None) -> RaggedBatch:
    """Every rank's items on every rank, rank 0's first: the original global order of a batch
    split by :func:`octopus.distributed.shard`.

    Differentiable with respect to ``batch.values``. Gradients follow the convention of
    ``torch.distributed.nn`` and DDP: each rank's gradient of the gathered batch is that
    rank's own contribution, so the backward pass sums, over ranks, the gradients of this
    rank's items (a ragged reduce-scatter). The send buffer holds the batch once per rank (a
    local copy the size of the output). Errors as :func:`all_to_all`.
    """
    group_ = RankGroup(group, "all_gather")
    mine = _contribution(group_, batch)
    count, numel = (len(batch), batch.numel()) if mine.problem is None else (0, 0)
    items_from, elements_from = group_.agree(mine, [count] * group_.size, [numel] * group_.size)
    values, sizes = batch.values, batch.sizes
    if group_.size > 1:  # repeat's backward sums the copies: the reduce-scatter
        values, sizes = values.repeat(group_.size), sizes.repeat(group_.size, 1)
    return _exchange(group_, values, sizes, [count] * group_.size, [numel] * group_.size, items_from,
                     elements_from)


def gather(batch: RaggedBatch, dst: int = 0, group: Optional[dist.ProcessGroup] = None) -> RaggedBatch:
    """Every rank's items on rank ``dst`` of ``group`` (rank 0's first: the original global
    order of a batch split by :func:`octopus.distributed.shard`); an empty batch (same item
    dimensions and dtype) on the other ranks.

    Differentiable with respect to ``batch.values``: each rank receives the gradient of its
    own items from ``dst``. The backward pass is a collective, so every rank must run it:
    on the other ranks, include their empty output in the loss (``loss + out.values.sum()``
    adds zero). Errors as :func:`all_to_all`; ``dst`` must be the same on every rank.
    """
    group_ = RankGroup(group, "gather")
    mine = _contribution(group_, batch)
    root = _read_rank(dst)
    if root is None or not 0 <= root < group_.size:
        mine.problem = mine.problem or ("ValueError", f"dst must be a rank of the group, 0 <= dst < "
                                                      f"{group_.size}, got {dst!r}")
    else:
        mine.root = root
    items_to, elements_to = [0] * group_.size, [0] * group_.size
    if mine.problem is None and root is not None:  # (root is None only where there is a problem)
        items_to[root], elements_to[root] = len(batch), batch.numel()
    items_from, elements_from = group_.agree(mine, items_to, elements_to)
    return _exchange(group_, batch.values, batch.sizes, items_to, elements_to, items_from, elements_from)


def _contribution(group: RankGroup, batch: object) -> Contribution:
    if not isinstance(batch, RaggedBatch):
        return Contribution(problem=("TypeError", f"batch must be an octopus.RaggedBatch, got {type(batch).__name__}"))
    problem = device_problem(group.backends, batch.device)
    return Contribution(problem=None if problem is None else ("ValueError", problem), item_dim=batch.item_dim,
                        dtype=batch.dtype, device_type=batch.device.type,
                        needs_grad=torch.is_grad_enabled() and batch.values.requires_grad)


def _read_rank(value: Any) -> Optional[int]:
    """An int (a Python, NumPy or 0-d tensor integer), or None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _read_dest(dest: DestLike, batch: RaggedBatch) -> Tuple[Optional[torch.Tensor], Optional[Tuple[str, str]]]:
    """``dest`` as an int64 tensor on the batch's device, or the problem with it (its ranks
    are checked with the layout, on the device)."""
    if not isinstance(dest, torch.Tensor):
        try:
            dest = torch.as_tensor(dest)
        except (TypeError, ValueError, RuntimeError):
            return None, ("TypeError", f"dest must be an integer tensor or a sequence of ints (one rank per item), "
                                       f"got {type(dest).__name__}")
        if dest.numel() == 0:  # [] has no integer dtype of its own
            dest = dest.to(torch.int64)
    if dest.dtype == torch.bool or dest.dtype.is_floating_point or dest.dtype.is_complex:
        return None, ("TypeError", f"dest must hold integer ranks, got dtype {dest.dtype}")
    if tuple(dest.shape) != (len(batch),):
        return None, ("ValueError", f"dest must have one rank per item of batch, shape ({len(batch)},), got shape "
                                    f"{tuple(dest.shape)}")
    return dest.to(batch.device, torch.int64), None


def _exchange(group: RankGroup, values: torch.Tensor, sizes: torch.Tensor, items_to: List[int],
              elements_to: List[int], items_from: List[int], elements_from: List[int]) -> RaggedBatch:
    """The two data collectives (the shapes asynchronously, then the values), at exact sizes."""
    received_sizes = sizes.new_empty((sum(items_from), sizes.shape[1]))
    shapes_done = dist.all_to_all_single(received_sizes, sizes.contiguous(), items_from, items_to,
                                         group=group.group, async_op=True)
    received_values = _AllToAllSingle.apply(values, elements_to, elements_from, group.group)
    cast(dist.Work, shapes_done).wait()  # async_op=True: a Work
    return unpack(received_values, received_sizes)


class _AllToAllSingle(torch.autograd.Function):
    """``all_to_all_single`` of a 1-D tensor; its backward pass is the reverse exchange."""

    @staticmethod
    def forward(ctx: Any, send: torch.Tensor, send_splits: List[int], recv_splits: List[int],
                group: Optional[dist.ProcessGroup]) -> torch.Tensor:
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        return _all_to_all_single(send, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None, None]:
        send_splits, recv_splits = ctx.splits
        return _all_to_all_single(grad, recv_splits, send_splits, ctx.group), None, None, None


def _all_to_all_single(send: torch.Tensor, send_splits: List[int], recv_splits: List[int],
                       group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    received = send.new_empty(sum(recv_splits))
    dist.all_to_all_single(received, send.contiguous(), recv_splits, send_splits, group=group)
    return received

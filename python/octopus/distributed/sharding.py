"""Element-balanced sharding: contiguous ranges of items, one per rank, each holding about
the same number of elements (the work of a memory-bound op is its elements, not its items)."""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist

from .._messages import describe
from ..ragged import RaggedBatch
from .agreement import group_rank_and_size


def shard_bounds(offsets: torch.Tensor, world_size: int) -> List[int]:
    """Item boundaries that split a batch into ``world_size`` contiguous ranges of about equal
    element counts: rank ``r`` holds items ``bounds[r]`` to ``bounds[r + 1] - 1``
    (``bounds[0] == 0``, ``bounds[world_size] == M``).

    ``offsets``: the batch's int64 ``[M + 1]`` offsets (on any device; read on the host).
    Boundary ``r`` is the item boundary nearest to element ``r * N / world_size`` (the lower
    one on a tie); so a rank holds at most the mean ``N / world_size`` plus half of each of
    the two items cut at its ends — never more than the mean plus one item. Among boundaries
    at the same element (empty items), the one nearest to item ``r * M / world_size`` is
    taken, so empty items are spread too.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if (not isinstance(offsets, torch.Tensor) or offsets.dtype != torch.int64 or offsets.dim() != 1
            or offsets.numel() == 0):
        raise TypeError(f"offsets must be a non-empty 1-D int64 tensor [M + 1], got {describe(offsets)}")
    offsets = offsets.cpu()
    if int(offsets[0]) != 0 or bool((offsets.diff() < 0).any()):
        raise ValueError("offsets must start at 0 and never decrease")
    num_items, numel = offsets.numel() - 1, int(offsets[-1])
    # Exact in Python ints: the first boundary at or past each target r * N / W, and the one before it.
    targets = [r * numel for r in range(world_size + 1)]  # W times the target element
    above = torch.searchsorted(offsets, torch.tensor([-(-t // world_size) for t in targets]))
    above_at = offsets[above].tolist()
    below_at = offsets[(above - 1).clamp(min=0)].tolist()
    nearest = [b if a > 0 and t - world_size * b <= world_size * o - t else o
               for t, a, o, b in zip(targets, above.tolist(), above_at, below_at)]
    nearest_t = torch.tensor(nearest, dtype=torch.int64)
    first = torch.searchsorted(offsets, nearest_t, side="left")
    last = torch.searchsorted(offsets, nearest_t, side="right") - 1
    by_count = torch.tensor([(2 * r * num_items + world_size) // (2 * world_size) for r in range(world_size + 1)])
    return torch.minimum(torch.maximum(by_count, first), last).tolist()


def shard(batch: RaggedBatch, group: Optional[dist.ProcessGroup] = None) -> RaggedBatch:
    """This rank's share of a batch that every rank of ``group`` holds: the contiguous range
    of items :func:`shard_bounds` gives it, balanced by elements. The values are a view of
    ``batch.values`` (no copy); :func:`all_gather` or :func:`gather` of the shards gives the
    items back in their original order.

    ``shard`` does not communicate (it cannot check that the ranks hold the same batch).
    Differentiable: the gradient of the shard lands in its items' place in the gradient of
    ``batch.values``, zeros elsewhere — this rank's own contribution, the convention of
    ``torch.distributed.nn`` and DDP: the gradient of the sum of all ranks' losses is the sum
    of the ranks' gradients (``torch.distributed.all_reduce`` gives it where it is needed,
    DDP does it for parameters).
    """
    rank, size = group_rank_and_size(group, "octopus.distributed.shard")
    if not isinstance(batch, RaggedBatch):
        raise TypeError(f"batch must be an octopus.RaggedBatch, got {type(batch).__name__}")
    bounds = shard_bounds(batch.host_layout()[0], size)
    return batch.narrow_items(bounds[rank], bounds[rank + 1])

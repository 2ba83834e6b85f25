"""Ragged batches across GPUs and hosts, on ``torch.distributed`` (docs/architecture.rst,
"Across GPUs").

- :func:`shard` / :func:`shard_bounds`: a batch every rank holds, split into contiguous item
  ranges balanced by elements (the largest holds at most the mean plus one item).
- :func:`all_to_all`: item ``i`` to rank ``dest[i]``; :func:`all_gather` and :func:`gather`:
  every rank's items, in rank order. Each makes one small counts exchange, then one
  ``all_to_all_single`` of the item shapes and one of the values at exact sizes (TorchRec's
  pattern for jagged tensors; no padding).

CPU batches are exchanged over gloo, CUDA batches over nccl (a group such as
``"cpu:gloo,cuda:nccl"`` takes both); other combinations raise an error naming the backend
and the device. The counts exchange carries every rank's header too, so bad input on one
rank, or ranks disagreeing on item dimensions, dtype or device type, raise the same error on
every rank instead of leaving some waiting in a collective.

Gradients: :func:`all_to_all` and :func:`gather` send each gradient back where its item
came from. A batch every rank holds (the input of :func:`shard`, the output of
:func:`all_gather`) gets, on each rank, the gradient of that rank's own loss — the
convention of ``torch.distributed.nn`` and DDP, where the gradient of the sum of all ranks'
losses is the sum over ranks. Backward passes are collectives: every rank must run them.
"""

from .exchange import all_gather, all_to_all, gather
from .sharding import shard, shard_bounds

__all__ = ["shard", "shard_bounds", "all_to_all", "all_gather", "gather"]

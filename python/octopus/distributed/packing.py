"""The local parts of an exchange, without communication: a rank's items grouped by
destination rank into one send buffer (packing), and received buffers made a batch again
(unpacking). Everything is computed on the batch's device; the host reads a few numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

from ..ragged import RaggedBatch

# Below this many elements per run of consecutive items on average, moving items gathers
# through a per-element index instead of copying each run as a slice: a slice costs host
# time per run, the index several passes over memory per element. On the CPU (20M fp32
# elements, 2 cores) slices cost about one copy up to 10^4 runs and matched the index at
# ~200 elements per run; on a GPU a slice's ~1-2 us of host time equals the index's memory
# traffic around 64K elements (an estimate: `octopus-bench distributed` times both there).
MIN_SLICED_RUN_ELEMENTS = {"cpu": 512, "cuda": 65536}


class ItemMove:
    """Moves whole items: output item ``k`` is input item ``order[k]`` of a batch with
    ``offsets``. Per output item (on the batch's device): where it starts in the input and in
    the output, and its length. ``runs`` counts the runs of consecutive items that stay
    consecutive (each one slice to copy); ``moves_elements`` and ``moves_items`` say whether
    anything moves at all (items already in order are not copied)."""

    def __init__(self, offsets: torch.Tensor, order: torch.Tensor):
        self.order = order
        self.total = offsets[-1:]
        self.lengths = offsets.diff()[order]
        self.src_starts = offsets[order]
        self.dst_starts = torch.zeros_like(self.lengths)
        torch.cumsum(self.lengths[:-1], 0, out=self.dst_starts[1:])
        self.new_run = torch.ones_like(order, dtype=torch.bool)
        self.new_run[1:] = order[1:] != order[:-1] + 1
        flags = torch.stack([self.new_run.sum(), ((self.src_starts != self.dst_starts) & (self.lengths > 0)).any(),
                             (order != torch.arange(order.shape[0], device=order.device)).any()])
        self.runs, moves_elements, moves_items = flags.tolist()
        self.moves_elements, self.moves_items = bool(moves_elements), bool(moves_items)

    def inverse(self) -> "ItemMove":
        return ItemMove(torch.cat([self.dst_starts, self.total]), torch.argsort(self.order))

    def move(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` with the items moved (a new tensor; ``values`` itself if none moves)."""
        if not self.moves_elements:
            return values
        numel = values.numel()
        if numel >= self.runs * MIN_SLICED_RUN_ELEMENTS.get(values.device.type, MIN_SLICED_RUN_ELEMENTS["cuda"]):
            first = self.new_run.nonzero().squeeze(1)
            run_ends = torch.cat([self.dst_starts[first[1:]], self.total])
            starts, lengths = torch.stack([self.src_starts[first], run_ends - self.dst_starts[first]]).tolist()
            return torch.cat([values[s:s + n] for s, n in zip(starts, lengths)])
        # index[p] = p + (where p's item starts in the input - where it starts in the output)
        index_dtype = torch.int32 if numel < 2**31 else torch.int64
        shift = (self.src_starts - self.dst_starts).to(index_dtype)
        index = torch.repeat_interleave(shift, self.lengths, output_size=numel)
        index += torch.arange(numel, device=values.device, dtype=index_dtype)
        return values.index_select(0, index)

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        """:meth:`move`, differentiable: the gradient moves back by the inverse permutation."""
        return _MoveItems.apply(values, self) if self.moves_elements else values


class _MoveItems(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, move: ItemMove) -> torch.Tensor:
        ctx.move = move
        return move.move(values)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
        return ctx.move.inverse().move(grad), None


@dataclass
class SendLayout:
    """Where a rank's items go: how many items and elements to each rank, and the move that
    puts them in one send buffer grouped by destination rank (stable: in their original
    order within a destination)."""

    items_per_rank: List[int]
    elements_per_rank: List[int]
    move: ItemMove

    @classmethod
    def by_destination(cls, offsets: torch.Tensor, dest: torch.Tensor,
                       world_size: int) -> Tuple[Optional["SendLayout"], Optional[str]]:
        """From a batch's ``offsets`` and int64 ``dest`` ``[M]`` on the same device: the
        layout, or (None, why not) where ``dest`` holds a rank outside ``[0, world_size)``."""
        bad = (dest < 0) | (dest >= world_size)
        safe = torch.where(bad, 0, dest)
        first_bad = torch.cat([bad, bad.new_ones(1)]).to(torch.int32).argmax()  # M where none is
        bad_value = torch.cat([dest, dest.new_zeros(1)])[first_bad]
        counts = torch.cat([torch.bincount(safe, minlength=world_size),
                            torch.zeros(world_size, dtype=torch.int64, device=dest.device).index_add_(
                                0, safe, offsets.diff()),
                            torch.stack([bad.sum(), first_bad, bad_value])])
        *per_rank, bad_count, first, value = counts.tolist()
        if bad_count:
            return None, (f"dest must hold ranks of the group, 0 <= dest[i] < {world_size}; dest[{first}] is {value} "
                          f"({bad_count} out of range)")
        move = ItemMove(offsets, torch.argsort(dest, stable=True))
        return cls(per_rank[:world_size], per_rank[world_size:], move), None

    def pack(self, batch: RaggedBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        """The send buffers ``(values, sizes)``: ``batch``'s own tensors where nothing moves.
        The values' gradient flows back to ``batch.values``."""
        values = self.move.apply(batch.values)
        sizes = batch.sizes.index_select(0, self.move.order) if self.move.moves_items else batch.sizes
        return values, sizes


def unpack(values: torch.Tensor, sizes: torch.Tensor) -> RaggedBatch:
    """A batch from received values and item shapes ``[M, D]`` (offsets rebuilt from the
    shapes on their device; nothing is copied)."""
    offsets = sizes.new_zeros(sizes.shape[0] + 1)
    torch.cumsum(sizes.prod(dim=1), 0, out=offsets[1:])
    return RaggedBatch(values, offsets, sizes, validate=False)

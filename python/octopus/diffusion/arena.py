"""The running samples' latents, packed.

All active samples' latents live back to back in one 1-D buffer, grouped by their group key
(latent shape and conditioning signature): group g is a dense ``[n_g, *shape]`` region, so
its model input is a view, and the fused step runs once over the whole buffer. The model's
outputs and the multistep state (DPM-Solver++ / UniPC history, ``[rows, N]``) have the
same layout. When samples join or leave, the arena is packed again: each group's survivors
are gathered from the old buffers in their old order (one copy, or one gather where someone
left from the middle), newcomers are appended with their initial noise and zeroed state.
That is one device copy of the active latents per change of membership, beside model calls
that cost far more.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Hashable, Sequence, cast

import numpy as np
import torch

from .._host_copies import to_device
from .rows import state_tensor


@dataclasses.dataclass(eq=False)
class Member:
    """What the arena knows of an active sample. ``position`` is its index in the layout (None
    until it is placed); ``pending_latents`` / ``pending_state`` what it brings when it joins
    (its initial latents, or what it had when it was parked)."""

    key: Hashable
    shape: tuple[int, ...]
    state_rows: int
    position: int | None = None
    pending_latents: torch.Tensor | None = None
    pending_state: torch.Tensor | None = None


@dataclasses.dataclass(eq=False)
class Group:
    """Samples of one key, members ``start`` .. ``start + len(members)`` of the layout, their
    latents at elements ``base`` .. ``base + len(members) * per``."""

    key: Hashable
    shape: tuple[int, ...]
    members: list[Member]
    start: int
    base: int

    @property
    def per(self) -> int:
        return math.prod(self.shape)

    @property
    def size(self) -> int:
        return len(self.members)

    def span(self) -> slice:
        return slice(self.base, self.base + self.size * self.per)


class LatentArena:
    """The packed latents, model outputs and multistep state of the active samples."""

    def __init__(self, device: torch.device, dtype: torch.dtype):
        self.device, self.dtype = device, dtype
        self.members: list[Member] = []
        self.groups: list[Group] = []
        self.latents = torch.empty(0, device=device, dtype=dtype)
        self.model_output = torch.empty(0, device=device, dtype=dtype)
        self.state: torch.Tensor | None = None
        self.offsets = torch.zeros(1, dtype=torch.int64, device=device)

    def __len__(self) -> int:
        return len(self.members)

    # -- views --------------------------------------------------------------------------

    def group_latents(self, group: Group) -> torch.Tensor:
        return self.latents[group.span()].view(group.size, *group.shape)

    def group_output(self, group: Group) -> torch.Tensor:
        return self.model_output[group.span()].view(group.size, *group.shape)

    def latents_of(self, member: Member) -> torch.Tensor:
        """A copy of one member's latents (its own ``shape``)."""
        group, j = self._locate(member)
        return self.group_latents(group)[j].clone()

    def state_of(self, member: Member) -> torch.Tensor | None:
        """A copy of one member's multistep state ``[rows, numel]`` (None where it has none)."""
        if self.state is None or member.state_rows == 0:
            return None
        group, j = self._locate(member)
        start = group.base + j * group.per
        return self.state[:member.state_rows, start:start + group.per].clone()

    def _locate(self, member: Member) -> tuple[Group, int]:
        position = cast(int, member.position)  # every member in the arena has one
        for group in self.groups:
            if group.start <= position < group.start + group.size:
                return group, position - group.start
        raise KeyError("the member is not in the arena")

    # -- layout -------------------------------------------------------------------------

    def rebuild(self, members: Sequence[Member]) -> None:
        """Packs ``members`` (survivors with a position, newcomers with pending latents) into
        new buffers; every member's position is updated."""
        old_groups = {g.key: g for g in self.groups}
        old_latents, old_state = self.latents, self.state
        by_key: dict[Hashable, list[Member]] = {}
        for m in members:
            by_key.setdefault(m.key, []).append(m)
        groups, start, base = [], 0, 0
        for key, group_members in by_key.items():
            survivors = sorted((m for m in group_members if m.position is not None),
                               key=lambda m: cast(int, m.position))
            newcomers = [m for m in group_members if m.position is None]
            ordered = survivors + newcomers
            groups.append(Group(key, ordered[0].shape, ordered, start, base))
            start += len(ordered)
            base += len(ordered) * math.prod(ordered[0].shape)
        latents = torch.empty(base, device=self.device, dtype=self.dtype)
        state_rows = max((m.state_rows for m in members), default=0)
        state = state_tensor(state_rows, base, latents) if state_rows else None
        for group in groups:
            per, view = group.per, latents[group.span()].view(group.size, group.per)
            survivors = [m for m in group.members if m.position is not None]
            if survivors:
                old = old_groups[group.key]
                source = [cast(int, m.position) - old.start for m in survivors]
                old_view = old_latents[old.span()].view(old.size, per)
                _gather_rows(view[:len(survivors)], old_view, source, self.device)
                if state is not None and old_state is not None:
                    rows = min(state.shape[0], old_state.shape[0])
                    new = state[:rows, group.base:group.base + len(survivors) * per].view(rows, len(survivors), per)
                    _gather_rows(new, old_state[:rows, old.span()].view(rows, old.size, per), source, self.device,
                                 dim=1)
            for j, m in enumerate(group.members[len(survivors):], start=len(survivors)):
                view[j].copy_(cast(torch.Tensor, m.pending_latents).reshape(-1), non_blocking=True)  # a newcomer's
                if m.pending_state is not None and state is not None:
                    at = group.base + j * per
                    state[:m.pending_state.shape[0], at:at + per].copy_(m.pending_state, non_blocking=True)
                m.pending_latents = m.pending_state = None
        for position, m in enumerate(m for g in groups for m in g.members):
            m.position = position
        self.members = [m for g in groups for m in g.members]
        self.groups, self.latents, self.state = groups, latents, state
        self.model_output = torch.empty_like(latents)
        sizes = np.repeat([g.per for g in groups], [g.size for g in groups]).astype(np.int64)
        self.offsets = to_device(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), self.device)


def _gather_rows(dst: torch.Tensor, src: torch.Tensor, rows: list[int], device: torch.device, dim: int = 0) -> None:
    """dst = src's ``rows`` along ``dim``: a plain copy when they are its first rows in order."""
    if rows == list(range(len(rows))):
        dst.copy_(src.narrow(dim, 0, len(rows)))
    else:
        dst.copy_(src.index_select(dim, to_device(np.asarray(rows, dtype=np.int64), device)))


"""Item-size layouts that autotune's probes and the benchmarks' distributions share: skews a
batch's mean item size does not show."""

from __future__ import annotations

import torch


def pareto_sizes(items: int, median: float, shape: float, g: torch.Generator) -> torch.Tensor:
    """``items`` sizes from a Pareto distribution of that ``shape`` and ``median``: its
    quantiles (i + 0.5) / items in random order, so that every draw has the same tail."""
    x_min = median / 2 ** (1 / shape)
    u = (torch.arange(items, dtype=torch.float64) + 0.5) / items
    sizes = (x_min * (1 - u) ** (-1 / shape)).round().long()
    return sizes[torch.randperm(items, generator=g)]


def dust_and_giant_sizes(items: int, dust_max: int, giant_per_dust_item: int, g: torch.Generator) -> torch.Tensor:
    """``items`` sizes of 0..dust_max (empty items included) and, at a random place, one more
    item of ``giant_per_dust_item`` x items."""
    dust = torch.randint(0, dust_max + 1, (items,), generator=g)
    at = int(torch.randint(0, items + 1, (1,), generator=g))
    return torch.cat([dust[:at], torch.tensor([giant_per_dust_item * items]), dust[at:]])

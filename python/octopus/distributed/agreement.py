"""What the ranks of a process group agree on before they exchange a ragged batch.

Every exchange starts with one small ``all_to_all_single``: each rank sends every other rank
the number of items and elements it will send it (TorchRec's counts exchange), and with them
the same short header — the operation, whether its input was bad, its items' number of
dimensions, dtype, device type, whether it needs gradients, and the root of a gather. Each
rank then holds every rank's header, so bad input on one rank and disagreements between
ranks raise the same error on every rank, before any data collective that would otherwise
leave the other ranks waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Type

import torch
import torch.distributed as dist

# The backend that exchanges tensors of each device type; other pairs are refused.
EXCHANGE_BACKENDS: Dict[str, str] = {"cpu": "gloo", "cuda": "nccl"}
OPERATIONS = ("all_to_all", "all_gather", "gather")
DEVICE_TYPES = tuple(EXCHANGE_BACKENDS)
# Every torch dtype, in an order that is the same in every process running this torch.
DTYPES = tuple(sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))
HEADER_FIELDS = ("operation", "problem", "item_dim", "dtype", "device_type", "needs_grad", "root")
_MAX_LISTED_RANKS = 8


@dataclass
class Contribution:
    """What one rank brings to an exchange: its header fields and, where its input is bad,
    the exception it would have raised alone (type and message)."""

    problem: Optional[Tuple[str, str]] = None
    item_dim: int = -1
    dtype: Optional[torch.dtype] = None
    device_type: Optional[str] = None
    needs_grad: bool = False
    root: int = -1

    def header(self, operation: str) -> List[int]:
        return [OPERATIONS.index(operation), int(self.problem is not None), self.item_dim,
                DTYPES.index(self.dtype) if self.dtype in DTYPES else -1,
                DEVICE_TYPES.index(self.device_type) if self.device_type in DEVICE_TYPES else -1,
                int(self.needs_grad), self.root]


def group_rank_and_size(group: Optional[dist.ProcessGroup], name: str) -> Tuple[int, int]:
    """This process's rank in ``group`` (the default group when None) and the group's size."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{name}: torch.distributed has no process group; call "
                           "torch.distributed.init_process_group first (e.g. under torchrun)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{name}: this process (global rank {dist.get_rank()}) is not a member of group")
    return rank, dist.get_world_size(group)


def backends_by_device(group: Optional[dist.ProcessGroup]) -> Dict[str, str]:
    """``{device type: backend}`` of a process group, e.g. ``{"cpu": "gloo", "cuda": "nccl"}``."""
    config = dist.get_backend_config(group)
    if ":" not in config:  # one backend for every device
        return {device: config for device in DEVICE_TYPES}
    return dict(part.split(":", 1) for part in config.split(","))


def device_problem(backends: Dict[str, str], device: torch.device) -> Optional[str]:
    """Why a batch on ``device`` cannot be exchanged over a group with these backends (None
    when it can): CPU tensors go over gloo and CUDA tensors over nccl, nothing else."""
    expected = EXCHANGE_BACKENDS.get(device.type)
    if expected is None:
        return (f"batch is on {device}; octopus.distributed exchanges CPU tensors over gloo and CUDA tensors "
                "over nccl")
    backend = backends.get(device.type)
    if backend == expected:
        return None
    hint = ("move the batch to this rank's GPU (batch.cuda()) or use a gloo group for CPU batches"
            if device.type == "cpu" else "use an nccl group for CUDA batches, or move the batch to the CPU")
    found = f"over {backend}" if backend else "over no backend"
    return (f"batch is on {device}, but the process group exchanges {device.type} tensors {found}; "
            f"octopus.distributed exchanges {device.type} tensors over {expected} only ({hint})")


class RankGroup:
    """A process group as one operation of ``octopus.distributed`` uses it: this rank, the
    group's size and backends, and the device its agreement exchange runs on (the CPU where
    the group has gloo, else this rank's current GPU under nccl). An unsupported backend is
    refused here, identically on every rank and before any collective."""

    def __init__(self, group: Optional[dist.ProcessGroup], operation: str):
        self.operation = operation
        self.name = f"octopus.distributed.{operation}"
        self.rank, self.size = group_rank_and_size(group, self.name)
        self.group = group
        self.backends = backends_by_device(group)
        if self.backends.get("cpu") == "gloo":
            self.agreement_device = torch.device("cpu")
        elif self.backends.get("cuda") == "nccl":
            self.agreement_device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"{self.name}: the process group's backend ({dist.get_backend_config(group)}) is not "
                             "supported; octopus.distributed exchanges CPU tensors over gloo and CUDA tensors over "
                             "nccl")

    def agree(self, mine: Contribution, items_to: Sequence[int],
              elements_to: Sequence[int]) -> Tuple[List[int], List[int]]:
        """The counts exchange: sends ``items_to[d]`` and ``elements_to[d]`` with this rank's
        header to each rank ``d``; returns the items and elements each rank will send here.
        Raises on every rank where any rank's input is bad or the ranks disagree."""
        header = mine.header(self.operation)
        send = torch.tensor([header + [items_to[d], elements_to[d]] for d in range(self.size)],
                            dtype=torch.int64, device=self.agreement_device)
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=self.group)
        rows = received.tolist()
        headers = [dict(zip(HEADER_FIELDS, row)) for row in rows]
        self._check(headers, mine)
        width = len(HEADER_FIELDS)
        return [row[width] for row in rows], [row[width + 1] for row in rows]

    def _check(self, headers: List[Dict[str, int]], mine: Contribution) -> None:
        where = f"(raised on every rank of the group; this is rank {self.rank})"
        operations = [OPERATIONS[h["operation"]] for h in headers]
        if len(set(operations)) > 1:
            raise RuntimeError(f"{self.name}: the ranks called different operations: {_by_value(operations)}; "
                               f"every rank must make the same calls in the same order {where}")
        if any(h["problem"] for h in headers):
            problems: List[Optional[Tuple[str, str]]] = [None] * self.size
            dist.all_gather_object(problems, mine.problem, group=self.group)
            bad = [(rank, p) for rank, p in enumerate(problems) if p is not None]
            error = TypeError if bad[0][1][0] == "TypeError" else ValueError
            raise error(f"{self.name}: bad input " + "; ".join(f"on rank {rank}: {msg}" for rank, (_, msg) in bad)
                        + f" {where}")
        checks: List[Tuple[str, Type[Exception], str, Callable[[int], str]]] = [
            ("item_dim", ValueError, "the items' numbers of dimensions", lambda v: f"{v}-D"),
            ("dtype", TypeError, "the batches' dtypes", lambda v: _name(DTYPES, v)),
            ("device_type", ValueError, "the batches' device types", lambda v: _name(DEVICE_TYPES, v)),
            ("needs_grad", ValueError, "whether the batches' values require gradients (the backward pass "
             "is a collective too: every rank runs it or none)", lambda v: "yes" if v else "no"),
            ("root", ValueError, "the destination rank (dst)", str)]
        for field, error_type, what, show in checks:
            values = [show(h[field]) for h in headers]
            if len(set(values)) > 1:
                raise error_type(f"{self.name}: the ranks differ in {what}: {_by_value(values)} {where}")


def _name(names: Sequence[object], code: int) -> str:
    return str(names[code]) if 0 <= code < len(names) else "unknown"


def _by_value(values: List[str]) -> str:
    """``"1-D on ranks 0, 2; 3-D on rank 1"``: each distinct value and the ranks holding it."""
    ranks: Dict[str, List[int]] = {}
    for rank, value in enumerate(values):
        ranks.setdefault(value, []).append(rank)
    parts = []
    for value, where in ranks.items():
        listed = ", ".join(map(str, where[:_MAX_LISTED_RANKS])) + (", ..." if len(where) > _MAX_LISTED_RANKS else "")
        parts.append(f"{value} on rank{'s' if len(where) > 1 else ''} {listed}")
    return "; ".join(parts)

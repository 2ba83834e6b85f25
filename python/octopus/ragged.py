"""``RaggedBatch``: M items of different shapes packed back to back (docs/architecture.rst,
"The packed layout")."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

import torch

from . import _library  # noqa: F401  (registers torch.ops.octopus)
from ._host_copies import to_device
from ._messages import describe, format_shape
from ._registrations import call_op
from .strategies import PLAN_STRATEGIES, TABLE_STRATEGIES, check_strategy, resolve_block_elems


class RaggedBatch:
    """A batch of ``M`` items of different shapes, packed back to back.

    ``values`` is 1-D and holds every item's elements, item after item, each item
    contiguous in row-major order. ``offsets`` (int64, ``[M + 1]``) gives where each item
    starts (``offsets[M] == values.numel()``); ``sizes`` (int64, ``[M, D]``) gives each
    item's own shape. All three live on one device.

    Building a batch from tensors you made yourself checks the layout (on CUDA that reads
    the offsets on the host once). Block plans and lookup tables are built on demand and
    cached per (device, block size); batches derived with :meth:`with_values` share them.
    """

    def __init__(self, values: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, *, validate: bool = True):
        if not isinstance(values, torch.Tensor) or values.dim() != 1:
            raise ValueError(f"values must be a 1-D tensor, got {describe(values)}")
        if not isinstance(offsets, torch.Tensor) or offsets.dtype != torch.int64 or offsets.dim() != 1:
            raise TypeError(f"offsets must be a 1-D int64 tensor, got {describe(offsets)}")
        if not isinstance(sizes, torch.Tensor) or sizes.dtype != torch.int64 or sizes.dim() != 2:
            raise TypeError(f"sizes must be a 2-D int64 tensor [num_items, D], got {describe(sizes)}")
        if offsets.numel() == 0:
            raise ValueError("offsets needs at least one entry: num_items + 1 of them, starting with 0 (an empty "
                             "batch has offsets [0]); got an empty tensor")
        if offsets.numel() != sizes.shape[0] + 1:
            raise ValueError(
                f"offsets must have num_items + 1 = {sizes.shape[0] + 1} entries (one more than sizes has rows), "
                f"got {offsets.numel()}")
        for name, t in (("offsets", offsets), ("sizes", sizes)):
            if t.device != values.device:
                raise ValueError(f"{name} must be on the values' device ({values.device}), got {t.device}")
        if validate:
            torch.ops.octopus.validate_layout(offsets, sizes, values.numel())
        self._values = values
        self._offsets = offsets
        self._sizes = sizes
        self._host_layout: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        self._metadata: Dict[Tuple[Any, ...], torch.Tensor] = {}

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_tensors(cls, tensors: Sequence[torch.Tensor], *, device: torch.device | str | int | None = None,
                     dtype: torch.dtype | None = None, item_dim: Optional[int] = None) -> "RaggedBatch":
        """Packs a list of tensors with the same number of dimensions (``[L]``,
        ``[H, W]``, ``[C, H, W]``, ...) and any extents, in one copy. Items on the host are
        whole on the device when this returns (the copy waits for the stream), for any
        stream; items already on the GPU are packed by a kernel queued on the current stream,
        as any torch op's output is.

        An empty list makes an empty batch only with ``item_dim`` (its items' number of
        dimensions), which nothing else could say; its dtype is then ``dtype`` (default
        ``torch.get_default_dtype()``) and its device ``device`` (default the CPU)."""
        return cls._from_tensors(tensors, "tensors", device=device, dtype=dtype, item_dim=item_dim)

    @classmethod
    def _from_tensors(cls, tensors: Sequence[torch.Tensor], name: str, *,
                      device: torch.device | str | int | None = None,
                      dtype: torch.dtype | None = None, item_dim: Optional[int] = None) -> "RaggedBatch":
        """:meth:`from_tensors`, naming the list ``name`` in error messages."""
        tensors = list(tensors)
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor) or t.is_nested:
                raise TypeError(f"{name}[{i}] must be a tensor (one item), got {describe(t)}")
            if t.dim() == 0:
                raise ValueError(f"{name}[{i}] is 0-d; items must have at least one dimension")
            if t.dim() != tensors[0].dim():
                raise ValueError(f"all items must have the same number of dimensions: {name}[0] has shape "
                                 f"{format_shape(tensors[0].shape)}, {name}[{i}] has shape {format_shape(t.shape)}")
            if t.dtype != tensors[0].dtype:
                raise TypeError(f"all items must have one dtype: {name}[0] is {tensors[0].dtype}, "
                                f"{name}[{i}] is {t.dtype}")
            if t.device != tensors[0].device:
                raise ValueError(f"all items must be on one device: {name}[0] is on {tensors[0].device}, "
                                 f"{name}[{i}] on {t.device}")
        if tensors:
            device = torch.device(device) if device is not None else tensors[0].device
            dtype = dtype or tensors[0].dtype
            d = tensors[0].dim()
            if item_dim is not None and item_dim != d:
                raise ValueError(f"item_dim={item_dim} but the items have {d} dimensions")
        else:
            if item_dim is None:
                raise ValueError(
                    f"{name} is empty, so nothing says its items' number of dimensions, dtype or device; make "
                    f"an empty batch with octopus.RaggedBatch.from_tensors([], item_dim=D, dtype=..., device=...)")
            if isinstance(item_dim, bool) or not isinstance(item_dim, int) or item_dim < 1:
                raise ValueError(f"item_dim must be a positive int, got {item_dim!r}")
            device = torch.device(device) if device is not None else torch.device("cpu")
            dtype = dtype or torch.get_default_dtype()
            d = item_dim
        host_sizes = torch.tensor([list(t.shape) for t in tensors], dtype=torch.int64).reshape(len(tensors), d)
        host_offsets = torch.zeros(len(tensors) + 1, dtype=torch.int64)
        torch.cumsum(host_sizes.prod(dim=1), 0, out=host_offsets[1:])
        if not tensors:
            batch = cls(torch.empty(0, device=device, dtype=dtype), host_offsets.to(device), host_sizes.to(device),
                        validate=False)
            batch._host_layout = (host_offsets, host_sizes)
            return batch
        # The layout is queued before the values: items copied from the host wait for the
        # stream (pageable memory), so the batch is whole on return, for any stream; items
        # already on the device are packed by a kernel on the current stream, after it.
        offsets, sizes = to_device(host_offsets, device), to_device(host_sizes, device)
        values = torch.cat([t.reshape(-1) for t in tensors]).to(device=device, dtype=dtype)
        batch = cls(values, offsets, sizes, validate=False)
        batch._host_layout = (host_offsets, host_sizes)
        return batch

    @classmethod
    def from_nested(cls, nt: torch.Tensor) -> "RaggedBatch":
        """From a ``torch.nested`` tensor. Jagged layout (items ``[L_i, *rest]``): the
        values are shared, not copied. Strided layout: its buffer is shared when it is
        contiguous; otherwise the items are copied."""
        if not isinstance(nt, torch.Tensor) or not nt.is_nested:
            raise TypeError(f"from_nested expects a nested tensor, got {describe(nt)}")
        if nt.layout == torch.jagged:
            # (_ragged_idx, _lengths and offsets() are the jagged NestedTensor's, not in Tensor's stubs.)
            if (nt._ragged_idx != 1 or nt._lengths is not None  # type: ignore[attr-defined]
                    or not nt.values().is_contiguous()):
                # Holes, or a ragged dimension other than the first: copy item by item.
                return cls.from_tensors(nt.unbind(), device=nt.device, dtype=nt.dtype, item_dim=nt.dim() - 1)
            rows = nt.values()
            rest = tuple(rows.shape[1:])
            inner = math.prod(rest)
            row_offsets = nt.offsets().to(torch.int64)  # type: ignore[attr-defined]
            if row_offsets[:1].ne(0).any():
                # A view into a larger buffer: rebase it.
                rows = rows[int(row_offsets[0]):]
                row_offsets = row_offsets - row_offsets[0]
            offsets = row_offsets if inner == 1 else row_offsets * inner
            lengths = row_offsets.diff().unsqueeze(1)
            sizes = torch.cat([lengths, to_device(torch.tensor(rest, dtype=torch.int64), nt.device).expand(
                lengths.shape[0], len(rest))], dim=1)
            return cls(rows.reshape(-1), offsets, sizes, validate=False)
        if not nt.is_contiguous():
            return cls.from_tensors(nt.unbind(), device=nt.device, dtype=nt.dtype)
        host_sizes = nt._nested_tensor_size().to(torch.int64)
        host_offsets = torch.zeros(host_sizes.shape[0] + 1, dtype=torch.int64)
        torch.cumsum(host_sizes.prod(dim=1), 0, out=host_offsets[1:])
        # Copied as torch copies (waiting for the stream): the nested tensor's values may be
        # whole already, and the batch must be too, for any stream.
        batch = cls(nt.values(), host_offsets.to(nt.device), host_sizes.to(nt.device), validate=False)
        batch._host_layout = (host_offsets, host_sizes)
        return batch

    # ------------------------------------------------------------------ accessors
    @property
    def values(self) -> torch.Tensor:
        return self._values

    @property
    def offsets(self) -> torch.Tensor:
        return self._offsets

    @property
    def sizes(self) -> torch.Tensor:
        return self._sizes

    @property
    def device(self) -> torch.device:
        return self._values.device

    @property
    def dtype(self) -> torch.dtype:
        return self._values.dtype

    @property
    def item_dim(self) -> int:
        """The number of dimensions of every item (D)."""
        return self._sizes.shape[1]

    def numel(self) -> int:
        return self._values.numel()

    def __len__(self) -> int:
        return self._sizes.shape[0]

    def __repr__(self) -> str:
        return (f"RaggedBatch(num_items={len(self)}, numel={self.numel()}, item_dim={self.item_dim}, "
                f"dtype={self.dtype}, device={self.device})")

    def host_layout(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(offsets, sizes) on the CPU; copied once from the device and cached."""
        if self._host_layout is None:
            self._host_layout = (self._offsets.cpu(), self._sizes.cpu())
        return self._host_layout

    def item_shapes(self) -> List[Tuple[int, ...]]:
        return [tuple(s) for s in self.host_layout()[1].tolist()]

    # ------------------------------------------------------------------ derived batches
    def with_values(self, values: torch.Tensor) -> "RaggedBatch":
        """A batch with this layout and new values (same element count); it shares this
        batch's cached plans and tables."""
        if not isinstance(values, torch.Tensor) or values.shape != self._values.shape:
            raise ValueError(f"values must have shape {format_shape(self._values.shape)}, got {describe(values)}")
        if values.device != self.device:
            raise ValueError(f"values must be on {self.device}, got {values.device}")
        # No constructor: the layout is this batch's, checked when it was made (its checks
        # are a fair share of an eager call's host time).
        out = RaggedBatch.__new__(RaggedBatch)
        out._values, out._offsets, out._sizes = values, self._offsets, self._sizes
        out._host_layout = self._host_layout
        out._metadata = self._metadata
        return out

    def narrow_items(self, start: int, stop: int) -> "RaggedBatch":
        """Items ``start`` to ``stop - 1`` as a batch of their own whose values are a view
        of this batch's (no copy of the elements; the offsets are rebased where they live).
        All of the items: this batch itself, with the plans it has cached."""
        m = len(self)
        if not (isinstance(start, int) and isinstance(stop, int)) or not 0 <= start <= stop <= m:
            raise ValueError(f"narrow_items needs 0 <= start <= stop <= {m} (num_items), got start={start!r}, "
                             f"stop={stop!r}")
        if start == 0 and stop == m:
            # (Rebasing copies the offsets on the host and on the device: 0.08 ms for a batch of
            # 77K items, which every whole slice of lease.item_slices paid.)
            return self
        offsets, sizes = self.host_layout()
        begin, end = int(offsets[start]), int(offsets[stop])
        host_offsets = offsets[start:stop + 1] - begin
        host_sizes = sizes[start:stop]
        # Rebased where the offsets live (no copy to the device, no wait for its queue).
        out = RaggedBatch(self._values[begin:end], self._offsets[start:stop + 1] - begin, self._sizes[start:stop],
                          validate=False)
        out._host_layout = (host_offsets, host_sizes)
        return out

    def to(self, device: torch.device | str | int | None = None, dtype: torch.dtype | None = None,
           non_blocking: bool = False) -> "RaggedBatch":
        device = torch.device(device) if device is not None else self.device
        values = self._values.to(device=device, dtype=dtype, non_blocking=non_blocking)
        if device == self.device:
            return self.with_values(values)
        out = RaggedBatch(values, self._offsets.to(device, non_blocking=non_blocking),
                          self._sizes.to(device, non_blocking=non_blocking), validate=False)
        out._host_layout = self._host_layout
        return out

    def cuda(self, device: torch.device | str | int | None = None) -> "RaggedBatch":
        return self.to(device if device is not None else "cuda")

    def cpu(self) -> "RaggedBatch":
        return self.to("cpu")

    # ------------------------------------------------------------------ metadata
    def metadata(self, strategy: str = "plan", block_elems: Optional[int] = None) -> Optional[torch.Tensor]:
        """What ``strategy`` reads to find items in this batch: a block plan (``plan``,
        ``plan_host``), the per-element item table (``lookup``), or None. Built once per
        (strategy kind, device, block size) and cached."""
        check_strategy(strategy)
        block_elems = resolve_block_elems(block_elems)
        if strategy in PLAN_STRATEGIES:
            key: Tuple[Any, ...] = ("plan", self.device, block_elems)
            if key not in self._metadata:
                offsets = self._offsets if strategy == "plan" else self.host_layout()[0]
                plan = torch.ops.octopus.plan(offsets, self.numel(), block_elems)
                self._metadata[key] = plan.to(self.device)
            return self._metadata[key]
        if strategy in TABLE_STRATEGIES:
            key = ("lookup", self.device)
            if key not in self._metadata:
                self._metadata[key] = torch.ops.octopus.lookup_table(self._offsets, self.numel())
            return self._metadata[key]
        return None

    def plan(self, block_elems: Optional[int] = None) -> torch.Tensor:
        """The block plan, built on this batch's device (see :func:`octopus.plan`)."""
        return cast(torch.Tensor, self.metadata("plan", block_elems))  # never None for "plan"

    # ------------------------------------------------------------------ conversions
    def unbind(self) -> List[torch.Tensor]:
        """The items as views of ``values``, each in its own shape."""
        offsets, sizes = self.host_layout()
        o = offsets.tolist()
        return [self._values[o[i]:o[i + 1]].view(s) for i, s in enumerate(sizes.tolist())]

    def to_padded(self, pad_value: float = 0.0, max_size: Optional[Sequence[int]] = None) -> torch.Tensor:
        """A dense ``[M, *max_shape]`` tensor, each item in the leading corner, the rest
        ``pad_value`` (one kernel: ``torch.ops.octopus.to_padded``; differentiable).
        ``max_size`` (one extent per item dimension) fixes the padded shape; items larger than
        it are cropped. Without it the shape is the largest extent of each dimension."""
        d = self.item_dim
        if max_size is None:
            sizes = self.host_layout()[1]
            max_shape = sizes.amax(dim=0).tolist() if len(self) else [0] * d
        else:
            max_shape = [int(s) for s in max_size]
            if len(max_shape) != d or any(s < 0 for s in max_shape):
                raise ValueError(f"max_size must have {d} non-negative extents, got {format_shape(max_shape)}")
        out: torch.Tensor = call_op(torch.ops.octopus.to_padded, self._values, self._offsets, self._sizes, max_shape,
                                    float(pad_value), False)
        return out

    def to_nested(self, layout: Optional[torch.layout] = None) -> torch.Tensor:
        """A ``torch.nested`` tensor. Jagged layout (the default where every item has the
        same extents past the first) shares the values; strided layout copies. Both keep
        the autograd history of the values."""
        shapes = self.item_shapes()
        rest = {s[1:] for s in shapes}
        jagged_ok = len(rest) <= 1
        if layout is None:
            layout = torch.jagged if jagged_ok and len(self) > 0 else torch.strided
        if layout == torch.jagged:
            if not jagged_ok:
                raise ValueError("layout=torch.jagged needs every item to have the same extents past the first; "
                                 "these items differ in more than one dimension (use layout=torch.strided)")
            tail = next(iter(rest)) if rest else ()
            inner = math.prod(tail)
            if inner == 0:  # rows of no elements: how many there are is in the first extents
                host_rows = torch.zeros(len(self) + 1, dtype=torch.int64)
                torch.cumsum(self.host_layout()[1][:, 0], 0, out=host_rows[1:])
                rows = self._values.new_empty((int(host_rows[-1]), *tail))
                row_offsets = host_rows.to(self.device)
            else:
                rows = self._values.view(-1, *tail)
                row_offsets = self._offsets if inner == 1 else self._offsets // inner
            return torch.nested.nested_tensor_from_jagged(rows, offsets=row_offsets)
        if layout == torch.strided:
            return torch.nested.as_nested_tensor(self.unbind(), layout=torch.strided)
        raise ValueError(f"layout must be torch.jagged or torch.strided, got {layout}")


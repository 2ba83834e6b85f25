"""What the ops take and give back. Every op's Python function takes a ragged batch in any
form users hold — a :class:`RaggedBatch`, a list or tuple of tensors, or a ``torch.nested``
tensor (jagged or strided) — turns it into one :class:`RaggedBatch` on the way in (a list is
packed once; a jagged nested tensor's values are shared, not copied), and gives a result of
the input's layout back in the form that fits:

* a :class:`RaggedBatch` or a list or tuple in: a :class:`RaggedBatch` out (``.unbind()``
  gives its items as a list of views);
* a nested tensor in: a nested tensor of the same layout out. Jagged: the result's values are
  viewed with the input's own offsets (no copy; it combines with the input, e.g.
  ``nt - out``), where the input's values were shared; strided: one copy, as
  ``torch.nested.as_nested_tensor`` makes it.

Results of another layout (statistics, padded tensors, crops) have one form whatever the
input's; each op's docstring says which.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import torch

from ._messages import describe
from .ragged import RaggedBatch

RaggedLike = Union[RaggedBatch, Sequence[torch.Tensor], torch.Tensor]
"""A ragged batch as the ops take it.

A :class:`RaggedBatch`, a list or tuple of tensors with the same number of dimensions, or a
``torch.nested`` tensor (jagged or strided)."""

RaggedResult = Union[RaggedBatch, torch.Tensor]
"""A result with its input's layout.

A :class:`RaggedBatch`, or a nested tensor for a nested input (:meth:`RaggedInput.result`)."""

PackedLike = Union[RaggedBatch, Sequence[torch.Tensor]]
"""The forms of :data:`RaggedLike` for which an op's result with the input's layout is a
:class:`RaggedBatch` (a nested tensor gives a nested tensor): what the ops' type overloads
tell apart."""

FORMS = ("a RaggedBatch", "a list or tuple of tensors", "a torch.nested tensor (jagged or strided)")


def one_of(forms: Sequence[str]) -> str:
    """``"a, b, or c"``: the forms an argument takes, for a TypeError."""
    return ", ".join(forms[:-1]) + ", or " + forms[-1]


ACCEPTED = one_of(FORMS)


class RaggedInput(NamedTuple):
    """A ragged argument as an op sees it: the packed ``batch``, and the nested tensor it
    came from (None for the other forms)."""

    batch: RaggedBatch
    nested: Optional[torch.Tensor] = None

    def result(self, out: RaggedBatch) -> RaggedResult:
        """``out``, a batch with this input's layout, in the form the input came in."""
        nt = self.nested
        if nt is None:
            return out
        if nt.layout == torch.jagged:
            rows = nt.values()
            if self.batch.values.data_ptr() == rows.data_ptr() and self.batch.numel() == rows.numel():
                # The batch views the input's values: view the result with its offsets.
                offsets = nt.offsets()  # type: ignore[attr-defined]
                return torch.nested.nested_tensor_from_jagged(out.values.view(rows.shape), offsets=offsets)
            return torch.nested.as_nested_tensor(out.unbind(), layout=torch.jagged)
        return torch.nested.as_nested_tensor(out.unbind(), layout=torch.strided)


def as_ragged(x: RaggedLike, name: str = "batch", *, also: Optional[str] = None) -> RaggedInput:
    """``x`` as a :class:`RaggedInput`. ``name`` is the argument's name in error messages,
    ``also`` what else the op takes there (handled by the caller, named in the TypeError).
    An empty list is refused (ValueError): it says neither dtype, device nor item shape."""
    if isinstance(x, RaggedBatch):
        return RaggedInput(x)
    if isinstance(x, (list, tuple)):
        return RaggedInput(RaggedBatch._from_tensors(x, name))
    if isinstance(x, torch.Tensor) and x.is_nested:
        return RaggedInput(RaggedBatch.from_nested(x), x)
    if also is not None:
        raise TypeError(f"{name} must be {one_of(FORMS + (also,))}; got {describe(x)}")
    hint = ""
    if isinstance(x, torch.Tensor):
        hint = (" (a dense tensor is not a batch of items: list(t) makes its first dimension the items, [t] makes it "
                "one item)")
    raise TypeError(f"{name} must be {ACCEPTED}; got {describe(x)}{hint}")

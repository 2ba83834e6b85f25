"""How error messages print shapes and the objects they were given: one form everywhere,
the same as the C++ checks' (``format_shape`` in ``csrc/octopus/core/checks.h``)."""

from __future__ import annotations

from typing import Any, Iterable

import torch


def format_shape(shape: Iterable[Any]) -> str:
    """A shape as Python writes a tuple, on one line: ``(3, 480, 640)``, ``(5,)``, ``()``.
    Symbolic extents (a jagged nested tensor's ``j1``) print as themselves."""
    extents = [str(s) for s in shape]
    return "(" + ", ".join(extents) + ("," if len(extents) == 1 else "") + ")"


def describe(x: Any) -> str:
    """What ``x`` is, for the "got ..." of a TypeError or ValueError."""
    if isinstance(x, torch.Tensor):
        if not x.is_nested:
            return f"a tensor of dtype {x.dtype} and shape {format_shape(x.shape)}"
        if x.layout == torch.jagged:
            return f"a jagged nested tensor of dtype {x.dtype} and shape {format_shape(x.shape)}"
        # A strided nested tensor has no shape to print; its items' shapes differ.
        return f"a strided nested tensor of dtype {x.dtype} with {x.size(0)} items of {x.dim() - 1} dimensions"
    if isinstance(x, (list, tuple)):
        kinds = ", ".join(sorted({type(v).__name__ for v in x})) or "empty"
        return f"a {type(x).__name__} of {len(x)} item{'' if len(x) == 1 else 's'} ({kinds})"
    if x is None:
        return "None"
    name = type(x).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"

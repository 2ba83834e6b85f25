"""Loads the native library, which registers ``torch.ops.octopus.*``."""

import torch  # noqa: F401  (libtorch must be loaded before the extension)

# Not "from . import _C": mypy cannot see a compiled module as an attribute of its package.
import octopus._C as _C  # registers the ops as it loads

__all__ = ["_C", "built_with_cuda"]  # _C for the modules that call the extension's classes

built_with_cuda: bool = _C.built_with_cuda

"""Loads the native library, which registers ``torch.ops.octopus.*``."""

import torch  # noqa: F401  (libtorch must be loaded before the extension)

from . import _C  # noqa: F401  (registers the ops as it loads)

built_with_cuda: bool = _C.built_with_cuda

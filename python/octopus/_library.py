"""Loads the native library, which registers ``torch.ops.octopus.*``, after checking that the
installed torch is the one it was compiled against (torch's C++ ABI changes between releases:
another torch would fail inside the loader with undefined symbols, or worse)."""

from __future__ import annotations

import torch  # libtorch must be loaded before the extension

REBUILD_COMMAND = "pip install --no-build-isolation --force-reinstall --no-deps ."


def _release(version: str) -> str:
    """'2.14.1+cu130' -> '2.14': the part of torch's version that its wheels' ABI follows."""
    return ".".join(version.split("+")[0].split(".")[:2])


def _describe(version: str, cuda: str | None) -> str:
    return f"torch {version} ({f'CUDA {cuda}' if cuda else 'CPU-only'})"


def check_torch(built_version: str, built_cuda: str | None,
                running_version: str, running_cuda: str | None) -> None:
    """Raises ImportError unless the running torch has the release (major.minor) and the CUDA
    major version (or lack of CUDA) of the torch that octopus was built against."""

    def cuda_major(cuda: str | None) -> str | None:
        return cuda.split(".")[0] if cuda else None

    same_release = _release(built_version) == _release(running_version)
    if same_release and cuda_major(built_cuda) == cuda_major(running_cuda):
        return
    raise ImportError(
        f"octopus was compiled against {_describe(built_version, built_cuda)}, but this Python has "
        f"{_describe(running_version, running_cuda)}, which cannot load it. Install the torch it was "
        f"built for (pip install \"torch=={_release(built_version)}.*\"), or rebuild octopus against this "
        f"torch from its source directory: {REBUILD_COMMAND}")


try:
    from ._build_info import TORCH_CUDA_VERSION, TORCH_VERSION
except ModuleNotFoundError:  # a source tree given a hand-copied _C (development): nothing to check
    pass
else:
    check_torch(TORCH_VERSION, TORCH_CUDA_VERSION, torch.__version__, torch.version.cuda)

# Not "from . import _C": mypy cannot see a compiled module as an attribute of its package.
import octopus._C as _C  # noqa: E402  (registers the ops as it loads)

__all__ = ["_C", "built_with_cuda", "check_torch"]  # _C for the modules that call the extension's classes

built_with_cuda: bool = _C.built_with_cuda

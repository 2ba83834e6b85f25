"""A scikit-build-core metadata provider (pyproject.toml's [[tool.dynamic-metadata]]): octopus's
wheel requires the torch release it is compiled against, whose C++ ABI it uses."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any, Mapping


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> dict[str, list[str]]:
    """``dependencies``: ``torch==X.Y.*`` for the torch installed where the wheel is built, then
    the ``requires`` setting's requirements."""
    release = ".".join(version("torch").split("+")[0].split(".")[:2])
    return {"dependencies": [f"torch=={release}.*", *settings.get("requires", [])]}


def dynamic_wheel(settings: Mapping[str, Any]) -> dict[str, bool]:
    """A wheel built from an sdist pins the torch present at that build, not at the sdist's."""
    return {"dependencies": True}

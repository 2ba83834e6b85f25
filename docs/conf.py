"""Sphinx configuration of octopus's API reference.

Build it from the repository root, with octopus importable (installed, or its source tree on
PYTHONPATH next to a built extension):

    python3 -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

project = "octopus"
author = "the octopus authors"
copyright = "the octopus authors, Apache-2.0"


def _version() -> str:
    """The installed distribution's version; from a source tree, pyproject.toml's (the same
    single source the wheel's metadata comes from). Read without tomllib: the docs build on
    Python 3.10 as the package does (Sphinx >= 8.1)."""
    try:
        return metadata.version("octopus")
    except metadata.PackageNotFoundError:
        text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
        match = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
        assert match, "pyproject.toml has no version"
        return match.group(1)


release = _version()
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the Google-style "Args:" sections of the docstrings
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Defaults as written in the source (a sentinel such as the scheduler's _DEFAULT, not its repr).
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = f"octopus {release}"
html_theme_options = {"description": "Ragged batches for PyTorch", "fixed_sidebar": True}

"""octopus's version: the installed distribution's metadata (pyproject.toml is its one source)."""

from importlib import metadata

try:
    __version__ = metadata.version("octopus")
except metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
    __version__ = "0+unknown"

"""How a GPU thread finds the item its elements belong to (docs/architecture.rst, "Locators"):
the strategies' names, the metadata each reads, and the block size's limits, all from the
C++ library (``_C.strategies``, ``_C.block_elems``), their one definition."""

from __future__ import annotations

from . import _library

STRATEGIES: tuple[str, ...] = tuple(name for name, _ in _library._C.strategies)
DEFAULT_STRATEGY = "plan"
# Elements per work block (plan) or per tile (the other strategies); 0 means this default.
DEFAULT_BLOCK_ELEMS: int = _library._C.block_elems["default"]
_MAX_BLOCK_ELEMS: int = _library._C.block_elems["max"]
_BLOCK_ELEMS_MULTIPLE: int = _library._C.block_elems["multiple"]

# The strategies whose kernels read a metadata tensor, and what it is.
PLAN_STRATEGIES = tuple(name for name, metadata in _library._C.strategies if metadata == "plan")
TABLE_STRATEGIES = tuple(name for name, metadata in _library._C.strategies if metadata == "lookup")


def check_strategy(strategy: str, allow_auto: bool = False) -> str:
    """``strategy`` if it names a strategy (or is ``"auto"`` where ``allow_auto``)."""
    if strategy == "auto" and allow_auto:
        return strategy
    if strategy not in STRATEGIES:
        names = (("auto",) if allow_auto else ()) + STRATEGIES
        raise ValueError(f"strategy must be one of {', '.join(repr(s) for s in names)}; got {strategy!r}")
    return strategy


def resolve_block_elems(block_elems: int | None) -> int:
    if block_elems is None or block_elems == 0:
        return DEFAULT_BLOCK_ELEMS
    if (not isinstance(block_elems, int) or block_elems <= 0 or block_elems % _BLOCK_ELEMS_MULTIPLE
            or block_elems > _MAX_BLOCK_ELEMS):
        raise ValueError(f"block_elems must be a positive multiple of {_BLOCK_ELEMS_MULTIPLE} and at most 2^30, got "
                         f"{block_elems!r}")
    return block_elems

"""How a GPU thread finds the item its elements belong to (DESIGN.md section 2)."""

from __future__ import annotations

STRATEGIES = ("plan", "plan_host", "block_search", "search", "lookup")
DEFAULT_STRATEGY = "plan"
# Elements per work block (plan) or per tile (the other strategies); 0 means this default.
DEFAULT_BLOCK_ELEMS = 4096

# The strategies whose kernels read a metadata tensor, and what it is.
PLAN_STRATEGIES = ("plan", "plan_host")
TABLE_STRATEGIES = ("lookup",)


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
    if not isinstance(block_elems, int) or block_elems <= 0 or block_elems % 16 or block_elems > 2**30:
        raise ValueError(f"block_elems must be a positive multiple of 16 and at most 2^30, got {block_elems!r}")
    return block_elems

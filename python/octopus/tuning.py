"""``octopus.autotune()``: pick the default strategy and block size for this device from
short probes, per class of batch layout, and remember the choices on disk.

Ops called with ``strategy="auto"`` (their default) use the choice made for their device and
their batch's layout class (its mean item size, which the host knows without reading the
device: :func:`layout_class`): in this process if :func:`autotune` ran, else from the on-disk
cache if an earlier process tuned this device with this build of octopus and this torch, else
the built-in default (:data:`octopus.DEFAULT_STRATEGY`, :data:`octopus.DEFAULT_BLOCK_ELEMS`).
Ops never probe on their own: a probe inside a user's loop, a CUDA-graph capture or a
``torch.compile`` trace would be a surprise. Call :func:`autotune` once, e.g. at start-up.

The cache is one JSON file (``$OCTOPUS_CACHE_DIR``, else ``$XDG_CACHE_HOME/octopus``, else
``~/.cache/octopus``; ``autotune.json``) mapping a key (device name, octopus version and a
digest of its compiled extension, torch version) to a choice: rebuilt kernels, even of the
same version, are probed afresh rather than given a choice measured on others. It is written
atomically (a temporary file renamed over it); a file that cannot be read or parsed is treated
as empty and replaced at the next save.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

import torch

from ._layouts import dust_and_giant_sizes, pareto_sizes
from ._timing import median_ms
from .strategies import DEFAULT_BLOCK_ELEMS, DEFAULT_STRATEGY, check_strategy

if TYPE_CHECKING:
    from .ragged import RaggedBatch

DeviceLike = Union[torch.device, str, int]

CACHE_FILE = "autotune.json"
# The candidates: plan_host is left out (its plan is built on the host and copied, with a
# synchronization: a comparison point, not a default).
CANDIDATE_STRATEGIES = ("plan", "block_search", "search", "lookup")
CANDIDATE_BLOCK_ELEMS = (2048, 4096, 8192, 16384)
SMALL_ITEMS_MEAN = 2048
LAYOUT_PROBES: Dict[str, Tuple[str, ...]] = {
    "small_items": ("location_bound", "dust_giant", "heavy_tail"),
    "large_items": ("memory_bound", "bimodal"),
}
"""Layout classes, by a batch's mean item size (elements over items, known on the host
without a synchronization; below ``SMALL_ITEMS_MEAN`` = 2048 a batch is ``small_items``), and
the probes of each: a regular layout and skewed ones of a like mean, so that a class's choice
is measured on the skews a batch of that mean may hide."""
# A class keeps plan (the safe default) unless another candidate's worst ratio to the fastest
# over the class's probes beats plan's by more than this; and plan keeps its default block
# size on the same terms. Probes are smaller than the batches they stand for, and block sizes
# that tie on them did not on larger skewed batches: on an H200, 16384-element blocks tied
# with 4096 on the small-item probes and were 8% slower on a 500K-item dust + giant batch.
PLAN_MARGIN = 0.03


def layout_class(items: int, elements: int) -> str:
    """The layout class of a batch of ``items`` items holding ``elements`` elements in all."""
    return "small_items" if elements < SMALL_ITEMS_MEAN * max(items, 1) else "large_items"


@dataclasses.dataclass(frozen=True)
class TunedChoice:
    """What :func:`autotune` picked for a device, and the probe times it picked from.

    ``strategy`` and ``block_elems``: the choice over every probe (what a batch whose layout
    is not known gets); ``by_class``: the choice per layout class (:data:`LAYOUT_PROBES`),
    ``(strategy, block_elems)``, over that class's probes.
    """

    strategy: str
    block_elems: int
    device_name: str
    key: str
    source: str  # "probe" (measured now), "cache" (read from disk) or "default"
    probe_ms: Dict[str, Dict[str, float]] = dataclasses.field(default_factory=dict)
    elapsed_s: float = 0.0
    by_class: Dict[str, Tuple[str, int]] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def for_layout(self, items: Optional[int] = None, elements: Optional[int] = None) -> Tuple[str, int]:
        """``(strategy, block_elems)`` for a batch of ``items`` items and ``elements``
        elements (the device-wide choice where either is unknown or the class was not probed)."""
        if items is not None and elements is not None:
            chosen = self.by_class.get(layout_class(items, elements))
            if chosen is not None:
                return chosen
        return self.strategy, self.block_elems


def pick(probe_ms: Dict[str, Dict[str, float]], probes: Optional[Tuple[str, ...]] = None) -> Tuple[str, int]:
    """The candidate (``"strategy:block"`` keys of each probe's times) whose worst time over
    ``probes`` (default: all), relative to each probe's fastest, is the lowest; plan instead
    where its worst is within :data:`PLAN_MARGIN` of that: at the default block size if that
    is, else at its best."""
    names = [p for p in (probes or tuple(probe_ms)) if probe_ms.get(p)]
    if not names:
        raise ValueError("no probe times to pick from")
    candidates = set.intersection(*(set(probe_ms[p]) for p in names))
    if not candidates:
        raise ValueError("no candidate was measured on every probe")
    worst = {c: max(probe_ms[p][c] / min(probe_ms[p].values()) for p in names) for c in candidates}
    winner = min(sorted(worst), key=lambda c: worst[c])
    plans = [c for c in sorted(worst) if c.startswith(f"{DEFAULT_STRATEGY}:")]
    if plans:
        default = f"{DEFAULT_STRATEGY}:{DEFAULT_BLOCK_ELEMS}"
        for plan in ([default] if default in worst else []) + [min(plans, key=lambda c: worst[c])]:
            if worst[plan] <= worst[winner] + PLAN_MARGIN:
                winner = plan
                break
    strategy, block = winner.split(":")
    return strategy, int(block)


# (device type, index) -> choice, for this process. Read without locking: a dict lookup,
# which torch.compile can trace.
_CHOICES: Dict[Tuple[str, int], TunedChoice] = {}


def cache_path() -> Path:
    root = os.environ.get("OCTOPUS_CACHE_DIR")
    if root is None:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "octopus")
    return Path(root) / CACHE_FILE


def _device_key(device: torch.device) -> Tuple[str, int]:
    if device.type == "cuda":
        return "cuda", device.index if device.index is not None else torch.cuda.current_device()
    return device.type, 0


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform
    return f"cpu:{platform.machine()}:{os.cpu_count()}cores"


@functools.lru_cache(maxsize=None)
def build_id() -> str:
    """A digest of the compiled extension's file: read once per process, at the first lookup of
    a choice (32-35 ms for the 26 MB CUDA extension on a 2-core build machine)."""
    from ._library import _C
    digest = hashlib.blake2b(digest_size=8)
    with open(_C.__file__, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_key(device: torch.device) -> str:
    from . import __version__
    return f"{device_name(device)}|octopus {__version__} build {build_id()}|torch {torch.__version__}"


def _read_cache(path: Path) -> Dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(path: Path, data: Dict[str, Any]) -> None:
    """Atomic: readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".autotune-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _from_entry(entry: Any, device: torch.device, key: str) -> Optional[TunedChoice]:
    """A cached entry, or None where it is malformed."""
    def checked(strategy: Any, block: Any) -> Tuple[str, int]:
        check_strategy(strategy)
        if int(block) <= 0 or int(block) % 16:
            raise ValueError(f"bad block size {block!r}")
        return strategy, int(block)

    try:
        strategy, block = checked(entry["strategy"], entry["block_elems"])
        by_class = {name: checked(*pair) for name, pair in entry.get("by_class", {}).items() if name in LAYOUT_PROBES}
        return TunedChoice(strategy, block, device_name(device), key, "cache", entry.get("probe_ms", {}),
                           float(entry.get("elapsed_s", 0.0)), by_class)
    except (KeyError, TypeError, ValueError):
        return None


def tuned_choice(device: DeviceLike) -> TunedChoice:
    """The choice ``strategy="auto"`` uses on ``device`` (never probes)."""
    device = torch.device(device)
    slot = _device_key(device)
    choice = _CHOICES.get(slot)
    if choice is None:
        key = cache_key(device)
        choice = _from_entry(_read_cache(cache_path()).get(key), device, key)
        if choice is None:
            choice = TunedChoice(DEFAULT_STRATEGY, DEFAULT_BLOCK_ELEMS, device_name(device), key, "default")
        _CHOICES[slot] = choice
    return choice


def resolve(strategy: str, block_elems: Optional[int], device: torch.device, items: Optional[int] = None,
            elements: Optional[int] = None) -> Tuple[str, Optional[int]]:
    """``("auto", None)`` -> this device's choice for a batch of ``items`` items and
    ``elements`` elements (its layout class's; the device-wide one where they are not given);
    an explicit block size is kept."""
    if strategy != "auto":
        return strategy, block_elems
    if torch.compiler.is_compiling():
        choice = _CHOICES.get((device.type, device.index or 0))
        if choice is None:
            return DEFAULT_STRATEGY, block_elems
    else:
        choice = tuned_choice(device)
    chosen, block = choice.for_layout(items, elements)
    return chosen, block_elems if block_elems else block


def forget() -> None:
    """Drops this process's remembered choices (the disk cache stays)."""
    _CHOICES.clear()


def _probe_sizes(name: str, elements: int, g: torch.Generator) -> torch.Tensor:
    """Item sizes of a probe of about ``elements`` elements in all."""
    if name == "memory_bound":  # regular, 3K-8K elements: the block size's effect on streaming
        return torch.randint(3_000, 8_001, (max(1, elements // 5_500),), generator=g)
    if name == "location_bound":  # regular, 16-256: finding the item costs as much as its bytes
        return torch.randint(16, 257, (max(1, elements // 136),), generator=g)
    if name == "bimodal":  # 90% of 300-800 elements, 10% of 30K-80K
        items = max(1, elements // 6_000)
        large = torch.rand(items, generator=g) < 0.1
        return torch.where(large, torch.randint(30_000, 80_001, (items,), generator=g),
                           torch.randint(300, 801, (items,), generator=g))
    if name == "heavy_tail":  # Pareto (shape 0.85, median 40): a few items hold most elements
        return pareto_sizes(max(1, elements // 1_100), 40, 0.85, g).clamp(max=elements // 2)
    if name == "dust_giant":  # 0-64 elements (empty ones included) and one item of 400 per dust item
        return dust_and_giant_sizes(max(1, elements // 432), 64, 400, g)
    raise ValueError(f"unknown probe {name!r}")


def _probe_batches(device: torch.device) -> Dict[str, RaggedBatch]:
    """The probes of :data:`LAYOUT_PROBES`, float32: the memory-bound one 16x the L2 on a GPU
    (large enough that the block size's effect on streaming shows), the others 4x."""
    from .ragged import RaggedBatch
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20) or (50 << 20)
        l2_elems = max(l2 // 4, 1 << 20)  # fp32 elements that fill the L2
    else:
        l2_elems = 1 << 16
    g = torch.Generator().manual_seed(0)
    values_g = torch.Generator(device=device).manual_seed(0)
    batches = {}
    for name in dict.fromkeys(p for probes in LAYOUT_PROBES.values() for p in probes):
        lengths = _probe_sizes(name, (16 if name == "memory_bound" else 4) * l2_elems, g)
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        offsets[1:] = lengths.cumsum(0)
        values = torch.randn(int(offsets[-1]), generator=values_g, device=device)
        batches[name] = RaggedBatch(values, offsets.to(device), lengths.view(-1, 1).to(device), validate=False)
    return batches


def autotune(device: Optional[DeviceLike] = None, *, force: bool = False, strategies: Optional[List[str]] = None,
             block_sizes: Optional[List[int]] = None, repeats: int = 9) -> TunedChoice:
    """Measures the strategies and block sizes on ``device`` (default: the current CUDA
    device, else the CPU) with short probes of each layout class (:data:`LAYOUT_PROBES`) and
    makes the choices of ``strategy="auto"``; they are saved to the on-disk cache. With a
    cached choice for this device and version and ``force=False``, returns it without probing.

    A candidate's time on a probe is building its metadata on a fresh batch plus one affine
    pass. Per class, the choice is the candidate whose worst time over the class's probes,
    relative to each probe's fastest, is the lowest (:func:`pick`; plan where it is within 3%
    of that): never badly wrong on the skew a mean item size can hide. The device-wide choice
    is the same over every probe.
    """
    if device is None:
        from ._library import built_with_cuda
        device = "cuda" if torch.cuda.is_available() and built_with_cuda else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = cache_key(device)
    path = cache_path()
    if not force:
        cached = _from_entry(_read_cache(path).get(key), device, key)
        if cached is not None:
            _CHOICES[_device_key(device)] = cached
            return cached
    strategies = list(strategies or CANDIDATE_STRATEGIES)
    for s in strategies:
        check_strategy(s)
    block_sizes = list(block_sizes or CANDIDATE_BLOCK_ELEMS)
    t0 = time.perf_counter()
    probe_ms: Dict[str, Dict[str, float]] = {}
    for probe, batch in _probe_batches(device).items():
        scale = torch.rand(len(batch), device=device) + 0.5
        bias = torch.randn(len(batch), device=device)
        probe_ms[probe] = {}
        for s in strategies:
            for b in block_sizes:
                def one_pass(s: str = s, b: int = b) -> torch.Tensor:
                    meta: Optional[torch.Tensor] = None
                    if s == "plan":
                        meta = torch.ops.octopus.plan(batch.offsets, batch.numel(), b)
                    elif s == "lookup":
                        meta = torch.ops.octopus.lookup_table(batch.offsets, batch.numel())
                    out: torch.Tensor = torch.ops.octopus.affine(batch.values, batch.offsets, scale, bias, s, b,
                                                                 meta, False)
                    return out
                probe_ms[probe][f"{s}:{b}"] = median_ms(one_pass, device, warmup=1, repeats=repeats)
    strategy, block = pick(probe_ms)
    by_class = {name: pick(probe_ms, probes) for name, probes in LAYOUT_PROBES.items()}
    choice = TunedChoice(strategy, block, device_name(device), key, "probe", probe_ms, time.perf_counter() - t0,
                         by_class)
    _CHOICES[_device_key(device)] = choice
    data = _read_cache(path)
    data[key] = dict(strategy=choice.strategy, block_elems=choice.block_elems, probe_ms=probe_ms,
                     by_class={name: list(pair) for name, pair in by_class.items()},
                     elapsed_s=choice.elapsed_s, tuned_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    try:
        _write_cache(path, data)
    except OSError as err:  # a read-only home still gets the choice for this process
        import warnings
        warnings.warn(f"octopus.autotune: could not write the cache {path}: {err}")
    return choice


def kernel_tuning(device: Optional[DeviceLike] = None) -> Dict[str, Any]:
    """The tuning constants of octopus's CUDA kernels on ``device`` (default: the current
    CUDA device), from each kernel family's per-architecture policy (``csrc/octopus/core/tuning.h``
    says where they live), by ``"family.value"``:

    - ``arch``: the architecture of the code the device runs, as ``__CUDA_ARCH__`` counts
      (900 on an H100; also 900 on a newer GPU that runs the sm_90 PTX the driver compiled);
    - ``launch``: the values the host launches kernels with (threads per block, blocks per
      multiprocessor, work per thread);
    - ``compiled``: the values in the device code (read back by a one-thread kernel).

    ``launch`` and ``compiled`` are equal by construction; a difference is a bug worth
    reporting. Raises RuntimeError where octopus was built without CUDA or no GPU is
    visible, ValueError for a device that is not a CUDA device.
    """
    from ._library import _C, built_with_cuda
    if not built_with_cuda:
        raise RuntimeError("octopus was built without CUDA kernels: it has no kernel tuning")
    if not torch.cuda.is_available():
        raise RuntimeError("kernel_tuning needs a CUDA device, and none is visible")
    resolved = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if resolved.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {resolved}")
    with torch.cuda.device(resolved):
        return dict(_C.kernel_tuning())

"""Item-size distributions of the benchmarks, item sizes read from a file, and the boxes of
VisDrone annotation files (which ``examples/drone_crops.py`` crops).

Each distribution gives ``[M, D]`` int64 item shapes and has a default item count (divided by
the CPU scale-down on a machine without a GPU):

=========  =======  ==========================================================================
name       items    item sizes
=========  =======  ==========================================================================
normal     10K      1-D, 30K-80K elements (uniform): mid-size images
small      100K     1-D, 3K-8K elements: crops
tiny       1M       1-D, 300-800 elements: small crops, tokens of a sequence batch
longtail   100K     2-D H x W, log-normal around 45 x 50 (sigma 0.6), clipped to 8..400
bimodal    100K     1-D, 90% of 300-800 and 10% of 30K-80K elements: tiny and large mixed
heavytail  200K     1-D, Pareto (shape 0.85) with median 40 elements: the distribution's
                    quantiles in random order, so every run has the same tail (at 200K items
                    the largest three hold 69M, 19M and 10M elements; 220M in all)
dustgiant  500K     1-D, 0-64 elements (uniform, empty items included) plus one item of 400
                    elements per dust item (200M at 500K items) at a random place
file       (file)   2-D H x W read from a file (see :func:`read_sizes_file`)
=========  =======  ==========================================================================
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch

from octopus._layouts import dust_and_giant_sizes, pareto_sizes

DISTRIBUTIONS: Dict[str, Tuple[int, str]] = {
    "normal": (10_000, "1-D items of 30K-80K elements"),
    "small": (100_000, "1-D items of 3K-8K elements"),
    "tiny": (1_000_000, "1-D items of 300-800 elements"),
    "longtail": (100_000, "2-D items, log-normal H, W around 45x50, clipped to 8..400"),
    "bimodal": (100_000, "1-D items: 90% of 300-800 and 10% of 30K-80K elements"),
    "heavytail": (200_000, "1-D items, Pareto sizes (shape 0.85, median 40 elements, the largest tens of millions)"),
    "dustgiant": (500_000, "1-D items of 0-64 elements (empty ones included) plus one giant item (400x the count)"),
}

PARETO_SHAPE = 0.85
PARETO_MEDIAN = 40
DUST_MAX = 64
GIANT_PER_DUST_ITEM = 400


class SizesFileError(ValueError):
    """A sizes file that cannot be read or holds no usable sizes."""


def make_sizes(name: str, items: int, g: torch.Generator) -> torch.Tensor:
    """``[items, D]`` int64 item shapes drawn from the named distribution."""
    if name == "longtail":
        h = torch.exp(torch.randn(items, generator=g) * 0.6 + math.log(45)).round().clamp(8, 400)
        w = torch.exp(torch.randn(items, generator=g) * 0.6 + math.log(50)).round().clamp(8, 400)
        return torch.stack([h, w], dim=1).long()
    if name == "bimodal":
        large = torch.rand(items, generator=g) < 0.1
        tiny = torch.randint(300, 801, (items,), generator=g)
        big = torch.randint(30_000, 80_001, (items,), generator=g)
        return torch.where(large, big, tiny).view(-1, 1)
    if name == "heavytail":
        return pareto_sizes(items, PARETO_MEDIAN, PARETO_SHAPE, g).view(-1, 1)
    if name == "dustgiant":
        return dust_and_giant_sizes(items, DUST_MAX, GIANT_PER_DUST_ITEM, g).view(-1, 1)
    ranges = {"normal": (30_000, 80_000), "small": (3_000, 8_000), "tiny": (300, 800)}
    if name not in ranges:
        raise ValueError(f"unknown distribution {name!r}; known: {', '.join(DISTRIBUTIONS)}")
    lo, hi = ranges[name]
    return torch.randint(lo, hi + 1, (items, 1), generator=g)


def read_sizes_file(path: str) -> torch.Tensor:
    """Item shapes ``[M, 2]`` (H, W) from a file:

    - a COCO-style annotation JSON (``{"annotations": [{"bbox": [x, y, w, h]}, ...]}``),
    - a VisDrone annotation text file, or a directory of them: VisDrone-DET's
      ``left,top,width,height[,score,category[,truncation,occlusion]]`` per line (4 to 8
      fields), or VisDrone-VID's and -MOT's
      ``frame,target,left,top,width,height,score,category,truncation,occlusion`` (10 fields),
    - plain text with one item per line: ``H W`` or ``H,W`` (or one number: a 1-D item).

    Box extents are rounded and at least 1. Raises :class:`SizesFileError` with the reason.
    """
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith(".txt"))
        if not names:
            raise SizesFileError(f"sizes directory {path!r} holds no .txt annotation files")
        return torch.cat([read_sizes_file(os.path.join(path, n)) for n in names])
    text = _read_text(path, "sizes file")
    stripped = text.lstrip()
    if stripped.startswith("{") or stripped.startswith("["):
        return _coco_sizes(path, text)
    return _text_sizes(path, text)


def _read_text(path: str, what: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise SizesFileError(f"cannot read {what} {path!r}: {err}") from None


def _coco_sizes(path: str, text: str) -> torch.Tensor:
    try:
        data = json.loads(text)
    except ValueError as err:
        raise SizesFileError(f"sizes file {path!r} is not valid JSON: {err}") from None
    anns = data.get("annotations") if isinstance(data, dict) else data
    if not isinstance(anns, list):
        raise SizesFileError(f"sizes file {path!r}: expected a COCO-style object with an 'annotations' list")
    rows = []
    for k, ann in enumerate(anns):
        box = ann.get("bbox") if isinstance(ann, dict) else None
        if not isinstance(box, (list, tuple)) or len(box) != 4:
            raise SizesFileError(f"sizes file {path!r}: annotation {k} has no [x, y, w, h] 'bbox'")
        w, h = box[2], box[3]
        if not all(isinstance(v, (int, float)) for v in (w, h)) or w < 0 or h < 0:
            raise SizesFileError(f"sizes file {path!r}: annotation {k} has a negative or non-numeric box {box}")
        rows.append((max(1, round(h)), max(1, round(w))))
    return _finish(path, rows, 2)


def _number_lines(path: str, text: str) -> Iterator[Tuple[int, str, List[float]]]:
    """(line number, line, its numbers) for every line of ``text`` that is not blank or a
    ``#`` comment; fields are separated by commas or white space."""
    for line_no, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [f for f in line.replace(",", " ").split() if f]
        try:
            yield line_no, line, [float(f) for f in fields]
        except ValueError:
            raise SizesFileError(f"file {path!r} line {line_no}: not numbers: {line[:60]!r}") from None


def _text_sizes(path: str, text: str) -> torch.Tensor:
    rows, width = [], None
    for line_no, line, nums in _number_lines(path, text):
        if 4 <= len(nums) <= 8:  # VisDrone-DET: left, top, width, height, score, category, ...
            shape: Tuple[float, ...] = (nums[3], nums[2])
        elif len(nums) == 10:  # VisDrone-VID and -MOT: frame, target, left, top, width, height, ...
            shape = (nums[5], nums[4])
        elif len(nums) in (1, 2):
            shape = tuple(nums)
        else:
            raise SizesFileError(f"sizes file {path!r} line {line_no}: expected 'H W', one number, a VisDrone-DET "
                                 f"box line (4 to 8 fields) or a VisDrone-VID/MOT one (10); got {len(nums)} fields")
        if any(v < 0 or not math.isfinite(v) for v in shape):
            raise SizesFileError(f"sizes file {path!r} line {line_no}: sizes must be non-negative, got {line[:60]!r}")
        if width is not None and len(shape) != width:
            raise SizesFileError(f"sizes file {path!r} line {line_no}: {len(shape)} extents after lines with {width}")
        width = len(shape)
        rows.append(tuple(max(1, round(v)) if len(nums) >= 4 else round(v) for v in shape))
    return _finish(path, rows, width or 2)


class VisDroneBoxes(NamedTuple):
    """The boxes of one VisDrone-DET annotation file, one row per line: ``boxes`` int64
    ``[M, 4]`` as ``(left, top, width, height)`` in pixels, ``score`` float64 ``[M]`` (1 or 0
    for an ignored region in ground truth, a confidence in detector output) and ``category``
    int64 ``[M]`` (VisDrone's object classes, 0 = ignored region)."""
    boxes: torch.Tensor
    score: torch.Tensor
    category: torch.Tensor


def read_visdrone_boxes(path: str) -> VisDroneBoxes:
    """The boxes of a VisDrone-DET annotation file: ``left,top,width,height,score,category``
    and optionally ``truncation,occlusion`` per line (the format :func:`read_sizes_file`
    reads sizes from). An empty file has no boxes. Raises :class:`SizesFileError` naming the
    file and line of anything else."""
    text = _read_text(path, "annotation file")
    rows = []
    for line_no, line, nums in _number_lines(path, text):
        if len(nums) not in (6, 8):
            raise SizesFileError(f"annotation file {path!r} line {line_no}: expected 6 or 8 fields "
                                 f"(left,top,width,height,score,category[,truncation,occlusion]), got {len(nums)}")
        if any(not math.isfinite(v) for v in nums) or nums[2] < 0 or nums[3] < 0:
            raise SizesFileError(f"annotation file {path!r} line {line_no}: width and height must be "
                                 f"non-negative and every field finite, got {line[:60]!r}")
        rows.append(nums[:6])
    table = torch.tensor(rows, dtype=torch.float64).view(-1, 6)
    return VisDroneBoxes(table[:, :4].round().long(), table[:, 4], table[:, 5].long())


def _finish(path: str, rows, width: int) -> torch.Tensor:
    if not rows:
        raise SizesFileError(f"sizes file {path!r} holds no item sizes")
    return torch.tensor(rows, dtype=torch.int64).view(-1, width)


def sample_sizes(name: str, items: Optional[int], scale_down: int, g: torch.Generator,
                 file_sizes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The shapes a benchmark runs: the distribution's default count (or ``items``) divided
    by ``scale_down``; for ``file``, the file's sizes (resampled with replacement to ``items``
    where given)."""
    if name == "file":
        if file_sizes is None:
            raise ValueError("the 'file' distribution needs --sizes-file")
        if items is None:
            return file_sizes
        pick = torch.randint(0, file_sizes.shape[0], (max(1, items // scale_down),), generator=g)
        return file_sizes[pick]
    count = items if items is not None else DISTRIBUTIONS[name][0]
    return make_sizes(name, max(1, count // scale_down), g)

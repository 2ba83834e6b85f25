"""The contention benchmark's workloads: families of latency-critical (LC) jobs, each arriving
on a fixed schedule, and best-effort (BE) jobs that loop for as long as they are let.

A job is built once on the device (inputs random, larger than L2 for the BE work). An LC
job's ``run()`` queues its work on the current stream; a BE job's ``product(slices)`` queues
one whole unit of its work (a product, a pass over a batch) in the slices ``slices`` gives.

Families:

* ``mlp`` (the project's first): LC a batch-1 MLP (24 layers of 1024x1024 fp32, 48 small
  kernels) replayed from a CUDA graph every 2 ms, and one ``octopus.affine`` over 256 small
  items, eager, every 2 ms; BE 8192^3 TF32 products (sliced by rows) and ``octopus.affine``
  over a 500M-element batch (sliced by items).
* ``convnet`` (unlike it): LC a batch-1 convolutional net (fp16, channels-last, 224x224)
  from a CUDA graph every 4 ms, and ``octopus.normalize`` of 64 small uint8 images, eager,
  every 3.2 ms; BE fp16 tensor-core GEMMs (sliced by rows) and ``octopus.clamp`` over a
  400M-element batch of Pareto-sized items (sliced by items).
* ``transformer`` (unlike both; not tuned on): LC two pre-norm transformer encoder blocks
  (bf16, batch 1, 256 tokens of width 512, torch's scaled_dot_product_attention) from a CUDA
  graph every 5 ms, and ``octopus.crop_resize`` of 32 boxes out of a 1080p uint8 frame to
  3x112x112, eager, every 2.5 ms; BE batched bf16 products (64 of 2048^3, sliced by batch
  entries) and ``octopus.gaussian_blur`` over a 400M-pixel batch of 55-90 px images (sliced by
  items).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

import octopus

@dataclass
class LCJob:
    """A latency-critical job: ``run()`` queues one job's work on the current stream;
    ``graph`` jobs are replayed from a CUDA graph captured once per stream priority."""

    name: str
    period_s: float
    run: Callable[[], object]
    graph: bool


@dataclass
class BEJob:
    """A best-effort job: ``units`` of work per product, ``launch(start, stop)`` queues the
    part [start, stop) of one product on the current stream. ``unit`` "rows": any range of
    rows; "items": ranges of whole items of ``batch`` (sliced by their elements)."""

    name: str
    units: int
    unit: str
    launch: Callable[[int, int], object]
    batch: octopus.RaggedBatch | None = None


def _mlp_jobs(device: torch.device, scale: float) -> Tuple[List[LCJob], List[BEJob]]:
    g = torch.Generator(device=device).manual_seed(0)
    weights = [torch.randn(1024, 1024, device=device, generator=g) / 32 for _ in range(24)]
    x0 = torch.randn(1, 1024, device=device, generator=g)

    def mlp() -> torch.Tensor:
        x = x0
        for w in weights:
            x = torch.relu(x @ w)
        return x

    cpu = torch.Generator().manual_seed(0)
    small = octopus.RaggedBatch.from_tensors(
        [torch.randn(int(k), generator=cpu) for k in torch.randint(512, 4097, (256,), generator=cpu)], device=device)
    small_scale = torch.rand(len(small), device=device, generator=g)
    small_bias = torch.randn(len(small), device=device, generator=g)
    n = max(256, int(8192 * scale ** 0.5) // 256 * 256)
    a = torch.randn(n, n, device=device, generator=g)
    b = torch.randn(n, n, device=device, generator=g)
    c = torch.empty_like(a)
    big = _ragged(device, max(1 << 20, int(500_000_000 * scale)), lambda m: torch.randint(50_000, 150_001, (m,),
                                                                                          generator=cpu), g)
    big_scale, big_bias = torch.rand(len(big), device=device, generator=g), torch.randn(len(big), device=device,
                                                                                         generator=g)
    lc = [LCJob("mlp", 2e-3, mlp, graph=True),
          LCJob("ragged", 2e-3, lambda: octopus.affine(small, small_scale, small_bias), graph=False)]
    be = [BEJob("matmul", n, "rows", lambda r0, r1: torch.mm(a[r0:r1], b, out=c[r0:r1])),
          BEJob("ragged", len(big), "items", _per_part(big, lambda part, i0, i1: octopus.affine(
              part, big_scale[i0:i1], big_bias[i0:i1])), batch=big)]
    return lc, be


class _ConvNet(torch.nn.Module):
    """A small image classifier: five 3x3 convolutions (stride 2 from the second), batch norm
    folded away, ReLU, global pooling and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        widths = [3, 32, 64, 96, 128, 192]
        self.convs = torch.nn.ModuleList(
            torch.nn.Conv2d(widths[i], widths[i + 1], 3, stride=1 if i == 0 else 2, padding=1) for i in range(5))
        self.head = torch.nn.Linear(widths[-1], 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.relu(conv(x))
        return self.head(x.mean(dim=(2, 3)))


def _convnet_jobs(device: torch.device, scale: float) -> Tuple[List[LCJob], List[BEJob]]:
    g = torch.Generator(device=device).manual_seed(1)
    cpu = torch.Generator().manual_seed(1)
    half = torch.float16 if device.type == "cuda" else torch.float32
    net = _ConvNet().to(device=device, dtype=half).to(memory_format=torch.channels_last).eval()
    image = torch.randn(1, 3, 224, 224, device=device, generator=g).to(half).to(memory_format=torch.channels_last)

    def convnet() -> torch.Tensor:
        with torch.no_grad():
            return net(image)

    images = octopus.RaggedBatch.from_tensors(
        [torch.randint(0, 256, (3, int(h), int(w)), generator=cpu, dtype=torch.uint8)
         for h, w in torch.randint(16, 65, (64, 2), generator=cpu)], device=device)
    n = max(256, int(8192 * scale ** 0.5) // 256 * 256)
    a = torch.randn(n, n, device=device, generator=g).to(half)
    b = torch.randn(n, n, device=device, generator=g).to(half)
    c = torch.empty_like(a)
    # Pareto-sized items (shape 1.1, at least 10K elements, at most 20M): a few giants among many.
    big = _ragged(device, max(1 << 20, int(400_000_000 * scale)),
                  lambda m: (1e4 * (1 - torch.rand(m, generator=cpu)) ** (-1 / 1.1)).clamp(max=2e7).long(), g)
    lo, hi = torch.full((len(big),), -1.0, device=device), torch.full((len(big),), 1.0, device=device)
    lc = [LCJob("convnet", 4e-3, convnet, graph=True),
          LCJob("normalize", 3.2e-3, lambda: octopus.normalize(images, 3), graph=False)]
    be = [BEJob("gemm16", n, "rows", lambda r0, r1: torch.mm(a[r0:r1], b, out=c[r0:r1])),
          BEJob("ragged400", len(big), "items",
                _per_part(big, lambda part, i0, i1: octopus.clamp(part, lo[i0:i1], hi[i0:i1])), batch=big)]
    return lc, be


class _EncoderBlock(torch.nn.Module):
    """A pre-norm transformer encoder block: multi-head self-attention through torch's
    scaled_dot_product_attention, then a 4x MLP with GELU, each with a residual."""

    def __init__(self, width: int = 512, heads: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, w))
        return x + self.mlp(self.norm2(x))


def _transformer_jobs(device: torch.device, scale: float) -> Tuple[List[LCJob], List[BEJob]]:
    g = torch.Generator(device=device).manual_seed(2)
    cpu = torch.Generator().manual_seed(2)
    half = torch.bfloat16 if device.type == "cuda" else torch.float32
    blocks = torch.nn.Sequential(_EncoderBlock(), _EncoderBlock()).to(device=device, dtype=half).eval()
    tokens = torch.randn(1, 256, 512, device=device, generator=g).to(half)

    def encoder() -> torch.Tensor:
        with torch.no_grad():
            return blocks(tokens)

    frame = torch.randint(0, 256, (1, 3, 1080, 1920), device=device, generator=g, dtype=torch.uint8)
    side = torch.randint(40, 301, (32, 2), generator=cpu)
    y0 = (torch.rand(32, generator=cpu) * (1080 - side[:, 0])).long()
    x0 = (torch.rand(32, generator=cpu) * (1920 - side[:, 1])).long()
    boxes = torch.stack([torch.zeros_like(y0), y0, x0, y0 + side[:, 0], x0 + side[:, 1]], 1).to(device)
    entries = max(4, int(64 * scale ** 0.5))
    n = max(64, int(2048 * scale ** 0.5) // 64 * 64)
    a = torch.randn(entries, n, n, device=device, generator=g).to(half)
    b = torch.randn(entries, n, n, device=device, generator=g).to(half)
    c = torch.empty_like(a)
    images = _images(device, max(1 << 20, int(400_000_000 * scale)), 55, 90, cpu, g)
    lc = [LCJob("encoder", 5e-3, encoder, graph=True),
          LCJob("crops", 2.5e-3, lambda: octopus.crop_resize(frame, boxes, 112, scale=1 / 255, validate=False),
                graph=False)]
    be = [BEJob("bmm16", entries, "rows", lambda r0, r1: torch.bmm(a[r0:r1], b[r0:r1], out=c[r0:r1])),
          BEJob("blur", len(images), "items",
                _per_part(images, lambda part, i0, i1: octopus.gaussian_blur(part)), batch=images)]
    return lc, be


def _images(device: torch.device, total: int, lo: int, hi: int, cpu: torch.Generator,
            g: torch.Generator) -> octopus.RaggedBatch:
    """A RaggedBatch of about ``total`` random pixels in ``[H, W]`` images of lo to hi pixels a side."""
    sizes = torch.randint(lo, hi + 1, (max(1, total // ((lo + hi) // 2) ** 2), 2), generator=cpu)
    offsets = torch.zeros(len(sizes) + 1, dtype=torch.int64)
    torch.cumsum(sizes.prod(1), 0, out=offsets[1:])
    values = torch.randn(int(offsets[-1]), device=device, generator=g)
    batch = octopus.RaggedBatch(values, offsets.to(device), sizes.to(device), validate=False)
    batch._host_layout = (offsets, sizes)
    return batch


def _ragged(device: torch.device, total: int, sizes_of: Callable[[int], torch.Tensor],
            g: torch.Generator) -> octopus.RaggedBatch:
    """A 1-D RaggedBatch of about ``total`` random elements in items of ``sizes_of(m)``."""
    sizes = sizes_of(max(1, total // 100_000))
    while int(sizes.sum()) < total:  # enough items for the total
        sizes = torch.cat([sizes, sizes_of(max(1, len(sizes) // 2))])
    sizes = sizes[:int((sizes.cumsum(0) <= total).sum()) or 1]
    offsets = torch.zeros(len(sizes) + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=offsets[1:])
    values = torch.randn(int(offsets[-1]), device=device, generator=g)
    batch = octopus.RaggedBatch(values, offsets.to(device), sizes.view(-1, 1).to(device), validate=False)
    batch._host_layout = (offsets, sizes.view(-1, 1))
    return batch


def _per_part(batch: octopus.RaggedBatch,
              op: Callable[[octopus.RaggedBatch, int, int], object]) -> Callable[[int, int], object]:
    """``launch(i0, i1)``: ``op`` over items [i0, i1) of ``batch``, each range cut once (a part
    keeps its plan from one product to the next, as a real job's fixed batch would)."""
    parts: Dict[Tuple[int, int], octopus.RaggedBatch] = {}

    def launch(i0: int, i1: int) -> object:
        part = parts.get((i0, i1))
        if part is None:
            part = parts[(i0, i1)] = batch.narrow_items(i0, i1)
        return op(part, i0, i1)
    return launch


FAMILIES: Dict[str, Callable[[torch.device, float], Tuple[List[LCJob], List[BEJob]]]] = {
    "mlp": _mlp_jobs, "convnet": _convnet_jobs, "transformer": _transformer_jobs}

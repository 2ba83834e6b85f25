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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import torch

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
    "mlp": _mlp_jobs, "convnet": _convnet_jobs}

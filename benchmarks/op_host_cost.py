"""Host time per eager call of the octopus ops the contention families run as latency-critical
or best-effort jobs, beside two torch ops, and where it goes (torch.profiler).

An experiment (not part of octopus-bench), CUDA only: each op is called back to back, 400
times after 50 of warm-up, with a synchronize every 50 calls so that the queue never fills; the
time is the host's, from the call to its return (a launch, not the kernel). Then 50 calls of
three of them under torch.profiler, by self CPU time.

    python benchmarks/op_host_cost.py
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

import octopus


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(2)
    cpu = torch.Generator().manual_seed(2)
    frame = torch.randint(0, 256, (1, 3, 1080, 1920), device=dev, generator=g, dtype=torch.uint8)
    side = torch.randint(40, 301, (32, 2), generator=cpu)
    y0 = (torch.rand(32, generator=cpu) * (1080 - side[:, 0])).long()
    x0 = (torch.rand(32, generator=cpu) * (1920 - side[:, 1])).long()
    boxes = torch.stack([torch.zeros_like(y0), y0, x0, y0 + side[:, 0], x0 + side[:, 1]], 1).to(dev)
    images = octopus.RaggedBatch.from_tensors(
        [torch.randint(0, 256, (3, int(h), int(w)), generator=cpu, dtype=torch.uint8)
         for h, w in torch.randint(16, 65, (64, 2), generator=cpu)], device=dev)
    small = octopus.RaggedBatch.from_tensors(
        [torch.randn(int(k), generator=cpu) for k in torch.randint(512, 4097, (256,), generator=cpu)], device=dev)
    small_scale, small_bias = torch.rand(len(small), device=dev), torch.randn(len(small), device=dev)
    gray = octopus.RaggedBatch.from_tensors(
        [torch.randn(int(h), int(w), generator=cpu) for h, w in torch.randint(55, 91, (64, 2), generator=cpu)],
        device=dev)
    a = torch.randn(8, 256, 256, device=dev, dtype=torch.bfloat16)
    calls = {
        "crop_resize": lambda: octopus.crop_resize(frame, boxes, 112, scale=1 / 255, validate=False),
        "normalize": lambda: octopus.normalize(images, 3),
        "affine": lambda: octopus.affine(small, small_scale, small_bias),
        "gaussian_blur": lambda: octopus.gaussian_blur(gray),
        "torch.bmm": lambda: torch.bmm(a, a),
        "torch.add": lambda: a + 1,
    }
    for name, call in calls.items():
        for _ in range(50):
            call()
        torch.cuda.synchronize()
        times = []
        for _ in range(400):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
            if len(times) % 50 == 0:
                torch.cuda.synchronize()
        times.sort()
        print(f"{name:14s} host per call p50 {times[200] * 1e6:7.1f} us  p90 {times[360] * 1e6:7.1f} us", flush=True)
    for name in ("crop_resize", "normalize", "gaussian_blur"):
        call = calls[name]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                call()
            torch.cuda.synchronize()
        print(f"==== {name} (50 calls)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))


if __name__ == "__main__":
    main()

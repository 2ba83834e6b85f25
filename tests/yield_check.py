"""Yielding launches for compute-sanitizer (benchmarks/gpu_check.sh): ops on a best-effort
lease of a scheduler with device yield, once with a latency-critical lease held (every link
but the last yields at once and its wait runs out), once with none (the first link does the
work, the others find nothing left), each against the op run plainly. Small batches with
small blocks, so that a launch has enough rounds of units to yield. CUDA only.

    compute-sanitizer --tool memcheck python3 tests/yield_check.py
"""

import sys

import torch

import octopus


def main() -> int:
    if not (torch.cuda.is_available() and octopus.built_with_cuda):
        print("needs a CUDA device and a CUDA build of octopus", file=sys.stderr)
        return 1
    g = torch.Generator().manual_seed(0)
    sizes = torch.randint(0, 3000, (1500,), generator=g)
    offsets = torch.zeros(len(sizes) + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=offsets[1:])
    flat = octopus.RaggedBatch(torch.randn(int(offsets[-1]), device="cuda"), offsets.cuda(), sizes.view(-1, 1).cuda())
    images = octopus.RaggedBatch.from_tensors(
        [torch.rand(3, int(h), int(w)) for h, w in torch.randint(5, 90, (300, 2), generator=g)], device="cuda")
    scale = torch.rand(len(flat), device="cuda")
    ops = {"affine": lambda: octopus.affine(flat, scale, block_elems=256).values,
           "clamp": lambda: octopus.clamp(flat, -0.3, 0.2, block_elems=256).values,
           "gaussian_blur": lambda: octopus.gaussian_blur(images, block_elems=256).values,
           "affine block_search": lambda: octopus.affine(flat, scale, strategy="block_search", block_elems=256).values}
    expected = {name: op() for name, op in ops.items()}
    sched = octopus.StreamScheduler(backend="cuda", device_yield=True, latency_control=False)
    try:
        for held in (True, False):
            lc = sched.acquire("lc", priority="high") if held else None
            with sched.acquire("be", best_effort=True) as be, torch.cuda.stream(be.stream):
                got = {name: op() for name, op in ops.items()}
                torch.cuda.current_stream().synchronize()
            if lc is not None:
                lc.release()
            for name, value in got.items():
                if not torch.equal(value, expected[name]):
                    print(f"{name}: the yielding launch differs (gate {'held' if held else 'open'})", file=sys.stderr)
                    return 1
        launches = sched.stats()["devices"][0]["yielding_launches"]
    finally:
        sched.close()
    if launches < 2 * len(ops):
        print(f"only {launches} launches yielded", file=sys.stderr)
        return 1
    print(f"yielding launches: {launches}, results equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())

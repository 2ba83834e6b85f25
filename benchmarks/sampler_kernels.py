"""Where a fused sampler step's time goes: each kernel of a step replayed from a CUDA graph.

An experiment (not part of octopus-bench), CUDA only. For DDIM, DPM-Solver++ 2M, DPM-Solver++
2M SDE and Euler ancestral (the last two drawing their noise with a generator), and one launch
mixing ten sampler kinds beside the same launch with every sample on its slowest kind's row
(octopus-bench's mixed rows), 64 x 4x128x128 float32 latents, every sample at its own step: 30 steps captured in one CUDA graph, the graph
replayed; per step, the median of 20 replays timed with CUDA events, then each kernel's
duration from CUPTI (``torch.profiler``; real clocks, warm caches) — the coefficient kernel,
the step kernel, torch's noise kernel — and the time between one kernel's end and the next
one's start (negative where they overlap: the step kernel begins while the coefficient
kernel runs, core/grid_dependency.h).

    python benchmarks/sampler_kernels.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
from typing import List, Optional

import torch
from torch.profiler import ProfilerActivity, profile

from octopus import diffusion as od

LOOP_STEPS = 30


def _median(values: list) -> float:
    return sorted(values)[len(values) // 2]


def _latents(shape):
    g = torch.Generator(device="cuda").manual_seed(0)
    return torch.randn(shape, device="cuda", generator=g), torch.randn(shape, device="cuda", generator=g)


def scheduler_step(make, draws_noise: bool, shape=(64, 4, 128, 128), steps: int = 50):
    """A batched scheduler's step, every sample at its own step; its generator or None."""
    x, m = _latents(shape)
    generator = torch.Generator(device="cuda").manual_seed(3) if draws_noise else None
    sched = make()
    sched.set_timesteps(steps, device="cuda")
    picks = torch.randint(0, steps, (shape[0],), generator=torch.Generator().manual_seed(1))
    if isinstance(sched, od.DPMSolverMultistepScheduler) and draws_noise:
        picks.zero_()  # the SDE's history must follow: every sample at its first step
    t = sched.timesteps[picks].to(device="cuda", dtype=torch.float64)
    kwargs = {"generator": generator} if draws_noise else {}
    return (lambda: sched.step(m, x, t, validate=False, **kwargs)), generator


def mixed_step(one_row: Optional[int], shape=(64, 4, 128, 128), steps: int = 50):
    """One launch whose samples cycle through ten sampler kinds (or all on row `one_row`), as
    octopus-bench's mixed rows; noise given."""
    x, m = _latents(shape)
    makers = [od.DDIMScheduler(clip_sample=False), od.EulerDiscreteScheduler(), od.FlowMatchEulerDiscreteScheduler(),
              od.DPMSolverMultistepScheduler(), od.UniPCMultistepScheduler(), od.EulerAncestralDiscreteScheduler(),
              od.DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++"), od.DDPMScheduler(clip_sample=False),
              od.DPMSolverMultistepScheduler(solver_order=3), od.UniPCMultistepScheduler(solver_order=3)]
    kinds = [s.sampler_row(steps) for s in makers]
    tables = od.rows.RowTables.build(kinds, "cuda")
    n = shape[0]
    rows = [one_row if one_row is not None else i % len(kinds) for i in range(n)]
    sample_rows = torch.tensor(rows, device="cuda")
    t = torch.tensor([kinds[r].keys[0] for r in rows], dtype=torch.float64, device="cuda")
    values, offsets = x.reshape(-1), torch.arange(n + 1, device="cuda") * x[0].numel()
    state = od.rows.state_tensor(3, values.numel(), values)
    z = torch.randn_like(x).reshape(-1)
    return (lambda: od.rows.fused_step(m.reshape(-1), values, offsets, t, tables, sample_rows=sample_rows, noise=z,
                                       state=state)), None


def measure(name: str, step, generator) -> dict:
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        for _ in range(LOOP_STEPS):
            step()
    for _ in range(5):
        graph.replay()
    per_step = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        per_step.append(a.elapsed_time(b) / LOOP_STEPS)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type.name == "CUDA" and e.device_time_total > 0)
    durations: dict = {}
    for start, end, kernel in kernels:
        key = ("coefficients" if "item_table" in kernel else "step" if "ragged_kernel" in kernel
               else "noise" if "distribution" in kernel else kernel[:60])
        durations.setdefault(key, []).append(end - start)
    gaps = [b[0] - a[1] for a, b in zip(kernels, kernels[1:])]
    return dict(sampler=name, per_step_ms=_median(per_step),
                kernels_us={k: dict(count=len(v), median=_median(v)) for k, v in durations.items()},
                between_kernels_us_median=_median(gaps) if gaps else None)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    cases = [("DDIM", lambda: scheduler_step(lambda: od.DDIMScheduler(clip_sample=False), False)),
             ("DPMSolverPP2M", lambda: scheduler_step(od.DPMSolverMultistepScheduler, False)),
             ("DPMSolverPP2MSDE, noise drawn", lambda: scheduler_step(
                 lambda: od.DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++"), True)),
             ("EulerAncestral, noise drawn", lambda: scheduler_step(od.EulerAncestralDiscreteScheduler, True)),
             ("ten kinds in one launch", lambda: mixed_step(None)),
             ("that launch, every sample on the UniPC order-3 row", lambda: mixed_step(9))]
    results = []
    for name, make in cases:
        results.append(measure(name, *make()))
        print(json.dumps(results[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

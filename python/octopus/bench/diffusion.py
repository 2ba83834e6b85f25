"""``python -m octopus.bench.diffusion``: one sampler step for a batch in which every sample
is at its own timestep.

Latents (random, float32): ``images`` 64 x 4x128x128, ``videos`` 16 x 16x4x60x104 (a sample
is a whole video). Samplers: DDIM (eta 0, epsilon, no clipping) and DPM-Solver++ 2M. Modes,
side by side in one run: diffusers' ``scheduler.step`` called per sample in a Python loop
(one scheduler per sample, where diffusers is installed), the same on 4 leased streams, and
grouped by timestep (``PerSampleStepper``'s three modes); a vectorized plain-PyTorch step
(coefficients gathered per sample and broadcast); octopus's fused step; the
same 30-step loop of the fused step captured as a CUDA graph (per step); and the memory
floor: the step's bytes (two latents read, one written; DPM also reads and writes its
history) at the device's measured copy bandwidth. CUDA events, medians after warm-up.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import octopus
from octopus import diffusion as od

from .__main__ import environment
from .timing import copy_bandwidth_gbs, median_ms

SHAPES = {"images": (64, 4, 128, 128), "videos": (16, 16, 4, 60, 104)}


def _ddim_vectorized(sched: od.DDIMScheduler, ac: torch.Tensor, ratio: int):
    """DDIM (eta 0, epsilon, no clipping) written with plain PyTorch ops over the batch."""

    def step(m, x, t):
        shape = (-1,) + (1,) * (x.dim() - 1)
        at = ac[t].view(shape)
        prev = t - ratio
        ap = torch.where(prev >= 0, ac[prev.clamp(min=0)], torch.ones_like(ac[0])).view(shape)
        x0 = (x - (1 - at).sqrt() * m) / at.sqrt()
        return ap.sqrt() * x0 + (1 - ap).sqrt() * m

    return step


def _dpm_vectorized(sigmas: torch.Tensor):
    """DPM-Solver++ 2M (epsilon, midpoint) written with plain PyTorch ops over the batch:
    per-sample coefficients gathered from the sigma table, then broadcast."""

    def alpha_sigma(s):
        alpha = 1 / (s * s + 1).sqrt()
        return alpha, s * alpha

    def step(m, x, k, history):
        shape = (-1,) + (1,) * (x.dim() - 1)
        a_s, s_s = alpha_sigma(sigmas[k])
        a_t, s_t = alpha_sigma(sigmas[k + 1])
        a_p, s_p = alpha_sigma(sigmas[(k - 1).clamp(min=0)])
        lam_s, lam_t, lam_p = a_s.log() - s_s.log(), a_t.log() - s_t.log(), a_p.log() - s_p.log()
        h = lam_t - lam_s
        phi = a_t * torch.expm1(-h)
        r0 = (lam_s - lam_p) / h
        second = (k > 0) & (k < sigmas.numel() - 2)  # the last step (to sigma 0) is first order
        q = torch.where(second, -phi * (1 + 0.5 / r0), -phi)
        u = torch.where(second, 0.5 * phi / r0, torch.zeros_like(phi))
        x0 = (x - s_s.view(shape) * m) / a_s.view(shape)
        prev = (s_t / s_s).view(shape) * x + q.view(shape) * x0 + u.view(shape) * history
        history.copy_(x0)
        return prev

    return step


def run(device: torch.device, shapes, steps: int, repeats: int) -> dict:
    copy_gbs = copy_bandwidth_gbs(device, 2 << 30)
    try:
        import diffusers
    except ImportError:
        diffusers = None
    rows = []
    for shape_name in shapes:
        shape = SHAPES[shape_name]
        n = shape[0]
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(shape, device=device, generator=g)
        m = torch.randn(shape, device=device, generator=g)
        nbytes = x.numel() * 4
        for sampler in ("DDIM", "DPMSolverPP2M"):
            config = dict(clip_sample=False) if sampler == "DDIM" else {}
            cls = od.DDIMScheduler if sampler == "DDIM" else od.DPMSolverMultistepScheduler
            sched = cls(**config)
            sched.set_timesteps(steps, device=device)
            # Every sample at its own step (DPM's history holds whatever the last call left).
            picks = torch.randint(0, steps, (n,), generator=torch.Generator().manual_seed(1))
            t = sched.timesteps[picks].to(device=device, dtype=torch.float64)
            moved = 3 * nbytes if sampler == "DDIM" else 5 * nbytes

            def row(mode, ms, note=""):
                rows.append(dict(shape=shape_name, sampler=sampler, mode=mode, ms=ms, samples=n,
                                 elements=x.numel(), gbs=moved / ms / 1e6 if ms else None,
                                 pct_copy=100 * moved / ms / 1e6 / copy_gbs if ms else None, note=note))

            row("memory floor", moved / copy_gbs / 1e6)
            fused = median_ms(lambda: sched.step(m, x, t, validate=False), device, warmup=5, repeats=repeats)
            row("octopus fused", fused)
            if sampler != "DDIM":
                vec = _dpm_vectorized(sched._table[0].float())
                ki = picks.to(device)
                hist = torch.zeros_like(x)
                row("vectorized PyTorch", median_ms(lambda: vec(m, x, ki, hist), device, warmup=5, repeats=repeats))
                start = torch.randn_like(x)
                sched._history, hist = start.clone(), start.clone()
                got, ref = sched.step(m, x, t, validate=False), vec(m, x, ki, hist)
                assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4), "fused DPM disagrees with the PyTorch version"
            if sampler == "DDIM":
                vec = _ddim_vectorized(sched, sched.alphas_cumprod.to(device).float(),
                                       sched.num_train_timesteps // steps)
                ti = t.long()
                row("vectorized PyTorch", median_ms(lambda: vec(m, x, ti), device, warmup=5, repeats=repeats))
                ref = vec(m, x, ti)
                got = sched.step(m, x, t, validate=False)
                assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4), "fused DDIM disagrees with the PyTorch version"
            if diffusers is not None:
                dcls = getattr(diffusers, "DDIMScheduler" if sampler == "DDIM" else "DPMSolverMultistepScheduler")
                t_list = t.tolist()
                for mode in ("loop", "streams", "grouped"):
                    stepper = od.PerSampleStepper(dcls(**config), n, mode=mode)
                    stepper.set_timesteps(steps)

                    def step_once():
                        if sampler != "DDIM":  # put every DPM scheduler back at its sample's step
                            for k, s in zip(picks.tolist(), stepper.schedulers):
                                s._step_index, s.lower_order_nums = k, min(k, 1)
                                s.model_outputs = [None, torch.zeros_like(x[:1])]
                        stepper.step(m, x, t_list)

                    label = {"loop": "diffusers per-sample loop", "streams": "diffusers per sample, 4 leased streams",
                             "grouped": "diffusers, samples grouped by timestep"}[mode]
                    try:
                        row(label, median_ms(step_once, device, warmup=2, repeats=max(3, repeats // 4)))
                    except Exception as error:  # report what diffusers refused rather than stop the run
                        row(label, None, f"failed: {type(error).__name__}: {str(error)[:80]}")
            else:
                row("diffusers per-sample loop", None, "diffusers is not installed")
            # A captured 30-step loop, every sample stepping along its own schedule.
            loop_steps = 30
            sched.set_timesteps(loop_steps, device=device)
            offsets = torch.randint(0, 8, (n,), generator=torch.Generator().manual_seed(2))
            if sampler != "DDIM":
                offsets.zero_()
            schedule = sched.timesteps.double()
            times = [torch.where(offsets + k < loop_steps, schedule[(offsets + k).clamp(max=loop_steps - 1)],
                                 torch.full((n,), -1.0, dtype=torch.float64)).to(device) for k in range(loop_steps)]
            sched.step(m, x, times[0], validate=False)  # allocates DPM's history outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = x
                for k in range(loop_steps):
                    y = sched.step(m, y, times[k], validate=False)
            per_step = median_ms(graph.replay, device, warmup=2, repeats=max(5, repeats // 4)) / loop_steps
            row("octopus fused, CUDA graph of 30 steps (per step)", per_step)
    return dict(environment=environment(device), copy_gbs=copy_gbs, steps=steps, rows=rows)


def format_table(result: dict) -> str:
    lines = [f"copy bandwidth {result['copy_gbs']:.0f} GB/s"]
    key = None
    for r in result["rows"]:
        if (r["shape"], r["sampler"]) != key:
            key = (r["shape"], r["sampler"])
            lines += ["", f"{r['sampler']} on {r['shape']} {SHAPES[r['shape']]} ({r['samples']} samples)",
                      "{:<52}{:>10}{:>9}".format("mode", "ms", "% copy")]
        if r["ms"] is None:
            lines.append("{:<52}  {}".format(r["mode"], r["note"]))
        else:
            lines.append("{:<52}{:>10.4f}{:>8.1f}%".format(r["mode"], r["ms"], r["pct_copy"]))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m octopus.bench.diffusion", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--steps", type=int, default=50, help="inference steps of the schedules")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not (torch.cuda.is_available() and octopus.built_with_cuda):
        print("octopus.bench.diffusion needs a CUDA device; nothing was measured", file=sys.stderr)
        return 1
    result = run(torch.device("cuda"), args.shapes, args.steps, args.repeats)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The diffusion workload of ``octopus-bench``: one sampler step for a batch in which every sample
is at its own timestep.

Latents (random, float32): ``images`` 64 x 4x128x128, ``videos`` 16 x 16x4x60x104 (a sample
is a whole video). Samplers: DDIM (eta 0, epsilon, no clipping) and DPM-Solver++ 2M, with the
peers below; then the stochastic ones (Euler ancestral, DPM-Solver++ 2M SDE, DDPM), each with
its noise given and with its noise drawn on the device (generation counted), and a batch that
mixes every sampler kind in one launch (on CUDA each also as 30 steps in a CUDA graph,
per step). Modes,
side by side in one run: diffusers' ``scheduler.step`` called per sample in a Python loop
(one scheduler per sample, where diffusers is installed), the same on 4 leased streams, and
grouped by timestep (``PerSampleStepper``'s three modes); a vectorized plain-PyTorch step
(coefficients gathered per sample and broadcast); octopus's fused step; the
same 30-step loop of the fused step captured as a CUDA graph (per step); and the memory
floor: the step's bytes (two latents read, one written; DPM also reads and writes its
history) at the device's measured copy bandwidth. CUDA events, medians after warm-up.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from octopus import diffusion as od

from .timing import Measurer

SHAPES = {"images": (64, 4, 128, 128), "videos": (16, 16, 4, 60, 104)}
# The same latents, smaller, for a run of the CPU kernels.
CPU_SHAPES = {"images": (16, 4, 32, 32), "videos": (4, 16, 4, 15, 26)}


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


def run(measurer: Measurer, shapes, steps: int, repeats: int, copy_gbs: float, scale_down: int = 1) -> list:
    """Rows (the benchmark's common row format) for DDIM and DPM-Solver++ 2M on each latent
    shape; on the CPU (``scale_down`` > 1) the latents are smaller and the GPU-only modes
    (leased streams, CUDA graph) are left out."""
    device = measurer.device
    try:
        import diffusers
    except ImportError:
        diffusers = None
    rows = []
    for shape_name in shapes:
        shape = SHAPES[shape_name] if scale_down == 1 else CPU_SHAPES[shape_name]
        n = shape[0]
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(shape, device=device, generator=g)
        m = torch.randn(shape, device=device, generator=g)
        nbytes = x.numel() * 4
        for sampler in ("DDIM", "DPMSolverPP2M"):
            config: dict[str, Any] = dict(clip_sample=False) if sampler == "DDIM" else {}
            cls = od.DDIMScheduler if sampler == "DDIM" else od.DPMSolverMultistepScheduler
            sched: Any = cls(**config)
            sched.set_timesteps(steps, device=device)
            # Every sample at its own step (DPM's history holds whatever the last call left).
            picks = torch.randint(0, steps, (n,), generator=torch.Generator().manual_seed(1))
            t = sched.timesteps[picks].to(device=device, dtype=torch.float64)
            moved = 3 * nbytes if sampler == "DDIM" else 5 * nbytes

            def row(mode, measured, note=""):
                ms = measured["kernel_ms"] if measured else None
                rows.append(dict(distribution=shape_name, items=n, elements=x.numel(), sampler=sampler,
                                 method=f"{sampler}: {mode}", mode=mode, strategy=None, block_elems=None,
                                 setup_ms=0.0, h2d_ms=0.0, metadata_mb=0.0, total_ms=ms,
                                 gbs=moved / ms / 1e6 if ms else None,
                                 pct_copy=100 * moved / ms / 1e6 / copy_gbs if ms else None, note=note,
                                 **(measured or dict(kernel_ms=None, peak_mb=None, energy_mj=None))))

            row("memory floor", dict(kernel_ms=moved / copy_gbs / 1e6, peak_mb=None, energy_mj=None),
                "the step's bytes at the measured copy bandwidth")
            row("octopus fused", measurer.measure(lambda: sched.step(m, x, t, validate=False), warmup=5,
                                                  repeats=repeats))
            if sampler != "DDIM":
                vec = _dpm_vectorized(torch.from_numpy(sched._rows[0].table).to(device=device, dtype=torch.float32))
                ki = picks.to(device)
                hist = torch.zeros_like(x)
                row("vectorized PyTorch", measurer.measure(lambda: vec(m, x, ki, hist), warmup=5, repeats=repeats))
                start = torch.randn_like(x)
                sched._state[0].copy_(start.reshape(-1))  # the same history for both
                hist = start.clone()
                got, ref = sched.step(m, x, t, validate=False), vec(m, x, ki, hist)
                assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4), "fused DPM disagrees with the PyTorch version"
            if sampler == "DDIM":
                vec = _ddim_vectorized(sched, sched.alphas_cumprod.to(device).float(),
                                       sched.num_train_timesteps // steps)
                ti = t.long()
                row("vectorized PyTorch", measurer.measure(lambda: vec(m, x, ti), warmup=5, repeats=repeats))
                ref = vec(m, x, ti)
                got = sched.step(m, x, t, validate=False)
                assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4), "fused DDIM disagrees with the PyTorch version"
            if diffusers is not None:
                dcls = getattr(diffusers, "DDIMScheduler" if sampler == "DDIM" else "DPMSolverMultistepScheduler")
                t_list = t.tolist()
                for mode in ("loop", "streams", "grouped") if device.type == "cuda" else ("loop", "grouped"):
                    stepper = od.PerSampleStepper(dcls(**config), n, mode=mode)
                    stepper.set_timesteps(steps)

                    def step_once():
                        if sampler != "DDIM":  # put every DPM scheduler back at its sample's step
                            for k, s in zip(picks.tolist(), stepper.schedulers):
                                s._step_index, s.lower_order_nums = k, min(k, 1)
                                s.model_outputs = [None, torch.zeros_like(x[:1])]
                        stepper.step(m, x, t_list)

                    label = {"loop": "diffusers per-sample loop", "streams": "diffusers, 4 leased streams",
                             "grouped": "diffusers grouped by timestep"}[mode]
                    try:
                        row(label, measurer.measure(step_once, warmup=2, repeats=max(3, repeats // 4)))
                    except Exception as error:  # report what diffusers refused rather than stop the run
                        row(label, None, f"failed: {type(error).__name__}: {str(error)[:80]}")
            else:
                row("diffusers per-sample loop", None, "diffusers is not installed")
            if device.type == "cuda":
                row("octopus fused, CUDA graph (per step)", _graph_per_step(sched, m, x, n, device,
                                                                                         measurer, repeats))
        rows += _stochastic_and_mixed(measurer, shape_name, m, x, steps, repeats, copy_gbs)
    return rows


# The stochastic samplers: (name, scheduler, latents the step moves besides the model output
# and the sample: noise read, history read and written).
_STOCHASTIC = (("EulerAncestral", lambda: od.EulerAncestralDiscreteScheduler(), 1),
               ("DPMSolverPP2MSDE", lambda: od.DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++"), 3),
               ("DDPM", lambda: od.DDPMScheduler(clip_sample=False), 1))


def _stochastic_and_mixed(measurer: Measurer, shape_name: str, m: torch.Tensor, x: torch.Tensor, steps: int,
                          repeats: int, copy_gbs: float) -> list:
    """The stochastic samplers' fused step, noise given and noise drawn; then one launch over a
    batch whose samples cycle through every sampler kind, beside its slowest kind alone."""
    device, n, nbytes = x.device, x.shape[0], x.numel() * x.element_size()
    rows: list = []

    def row(sampler, mode, measured, moved, note=""):
        if callable(measured):  # a graph row: a capture the step refuses is reported, not raised
            try:
                measured = measured()
            except Exception as error:  # noqa: BLE001
                measured, note = None, f"failed: {type(error).__name__}: {str(error)[:80]}"
        ms = measured["kernel_ms"] if measured else None
        rows.append(dict(distribution=shape_name, items=n, elements=x.numel(), sampler=sampler,
                         method=f"{sampler}: {mode}", mode=mode, strategy=None, block_elems=None, setup_ms=0.0,
                         h2d_ms=0.0, metadata_mb=0.0, total_ms=ms, gbs=moved / ms / 1e6 if ms else None,
                         pct_copy=100 * moved / ms / 1e6 / copy_gbs if ms else None, note=note,
                         **(measured or dict(kernel_ms=None, peak_mb=None, energy_mj=None))))

    z = torch.randn_like(x)
    generator = torch.Generator(device=device).manual_seed(3)
    picks = torch.randint(0, steps, (n,), generator=torch.Generator().manual_seed(1))
    for sampler, make, extra in _STOCHASTIC:
        sched = make()
        sched.set_timesteps(steps, device=device)
        if sampler == "DPMSolverPP2MSDE":
            picks_used = torch.zeros_like(picks)  # its history must follow: every sample at its first step
        else:
            picks_used = picks
        t = cast(torch.Tensor, sched.timesteps)[picks_used].to(device=device, dtype=torch.float64)
        moved = (3 + extra) * nbytes
        row(sampler, "memory floor", dict(kernel_ms=moved / copy_gbs / 1e6, peak_mb=None, energy_mj=None), moved,
            "the step's bytes at the measured copy bandwidth")
        row(sampler, "octopus fused, noise given",
            measurer.measure(lambda: sched.step(m, x, t, variance_noise=z, validate=False), warmup=5,
                             repeats=repeats), moved)
        row(sampler, "octopus fused, noise drawn",
            measurer.measure(lambda: sched.step(m, x, t, generator=generator, validate=False), warmup=5,
                             repeats=repeats), moved, "torch.randn of the batch's shape counted")
        if device.type == "cuda":
            row(sampler, "octopus fused, noise given, CUDA graph (per step)", lambda: _repeated_in_graph(
                lambda: sched.step(m, x, t, variance_noise=z, validate=False), measurer, repeats), moved)
            row(sampler, "octopus fused, noise drawn, CUDA graph (per step)", lambda: _repeated_in_graph(
                lambda: sched.step(m, x, t, generator=generator, validate=False), measurer, repeats, generator),
                moved, "torch.randn of the batch's shape counted")
    # Every kind in one launch: sample i reads row i % len(kinds) at its own step.
    makers = [od.DDIMScheduler(clip_sample=False), od.EulerDiscreteScheduler(), od.FlowMatchEulerDiscreteScheduler(),
              od.DPMSolverMultistepScheduler(), od.UniPCMultistepScheduler()] + [make() for _, make, _ in _STOCHASTIC] \
        + [od.DPMSolverMultistepScheduler(solver_order=3), od.UniPCMultistepScheduler(solver_order=3)]
    kinds = [s.sampler_row(steps) for s in makers]
    tables = od.rows.RowTables.build(kinds, device)
    sample_rows = (torch.arange(n) % len(kinds)).to(device)
    t = torch.tensor([kinds[i % len(kinds)].keys[0] for i in range(n)], dtype=torch.float64, device=device)
    values, offsets = x.reshape(-1), torch.arange(n + 1, device=device) * x[0].numel()
    state = od.rows.state_tensor(3, values.numel(), values)
    moved = 8 * nbytes  # model output, sample, noise, prev and UniPC's three state rows read and written (upper bound)
    row("mixed", "memory floor", dict(kernel_ms=moved / copy_gbs / 1e6, peak_mb=None, energy_mj=None), moved,
        "the heaviest kind's bytes at the measured copy bandwidth")
    mixed = lambda: od.rows.fused_step(m.reshape(-1), values, offsets, t, tables,  # noqa: E731
                                       sample_rows=sample_rows, noise=z.reshape(-1), state=state)
    row("mixed", f"octopus fused, {len(kinds)} kinds in one launch", measurer.measure(mixed, warmup=5, repeats=repeats),
        moved,
        "compare with each kind alone above")
    if device.type == "cuda":
        row("mixed", f"octopus fused, {len(kinds)} kinds in one launch, CUDA graph (per step)",
            lambda: _repeated_in_graph(mixed, measurer, repeats), moved)
        # The same launch with every sample on one kind's row: what "no more than its slowest
        # kind" compares with (the same inputs are passed, so the same kernel variant runs).
        names = [type(s).__name__.replace("Scheduler", "") for s in makers]
        for k, name in enumerate(names):
            one_rows = torch.full((n,), k, dtype=sample_rows.dtype, device=device)
            one_t = torch.full((n,), float(kinds[k].keys[0]), dtype=torch.float64, device=device)
            one = lambda r=one_rows, tt=one_t: od.rows.fused_step(  # noqa: E731
                m.reshape(-1), values, offsets, tt, tables, sample_rows=r, noise=z.reshape(-1), state=state)
            row("mixed", f"every sample on the {name} row ({k}), CUDA graph (per step)",
                lambda: _repeated_in_graph(one, measurer, repeats), moved)
    return rows


def _repeated_in_graph(step, measurer: Measurer, repeats: int, generator: torch.Generator | None = None,
                       loop_steps: int = 30) -> dict:
    """``step`` (the same step, over and over: its time does not depend on the values) captured
    ``loop_steps`` times in one CUDA graph; per step. A generator the step draws from is
    registered with the graph, so every replay draws new noise."""
    step()  # allocations and one-time work outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph):
        for _ in range(loop_steps):
            step()
    return _per_step(measurer.measure(graph.replay, warmup=2, repeats=max(5, repeats // 4)), loop_steps)


def _graph_per_step(sched, m, x, n, device, measurer: Measurer, repeats: int) -> dict:
    """A captured 30-step loop, every sample stepping along its own schedule; per step."""
    loop_steps = 30
    sched.set_timesteps(loop_steps, device=device)
    offsets = torch.randint(0, 8, (n,), generator=torch.Generator().manual_seed(2))
    if not isinstance(sched, od.DDIMScheduler):
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
    return _per_step(measurer.measure(graph.replay, warmup=2, repeats=max(5, repeats // 4)), loop_steps)


def _per_step(measured: dict, loop_steps: int) -> dict:
    """A measurement of a graph of ``loop_steps`` steps, per step."""
    per_step = lambda v: v / loop_steps if v is not None else None  # noqa: E731
    return dict(kernel_ms=per_step(measured["kernel_ms"]), times_ms=[v / loop_steps for v in measured["times_ms"]],
                peak_mb=measured["peak_mb"], energy_mj=per_step(measured["energy_mj"]))

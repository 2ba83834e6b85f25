"""octopus.diffusion: fused per-sample sampler steps against diffusers run separately per
sample, over whole sampling runs with random per-sample schedules and start steps."""

import sys

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import torch

import octopus
from conftest import HAS_CUDA
from octopus import diffusion as od

diffusers = pytest.importorskip("diffusers")

CASES = [
    ("DDIMScheduler", {}, {}),
    ("DDIMScheduler", dict(prediction_type="v_prediction", timestep_spacing="trailing", clip_sample=False), {}),
    ("DDIMScheduler", dict(prediction_type="sample", beta_schedule="scaled_linear", beta_start=0.00085,
                           beta_end=0.012, set_alpha_to_one=False, steps_offset=1), dict(use_clipped_model_output=True)),
    ("DDIMScheduler", dict(beta_schedule="squaredcos_cap_v2", timestep_spacing="linspace"), dict(eta=0.7)),
    ("EulerDiscreteScheduler", {}, {}),
    ("EulerDiscreteScheduler", dict(prediction_type="v_prediction", timestep_spacing="trailing",
                                    beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012), {}),
    ("EulerDiscreteScheduler", dict(timestep_spacing="leading", steps_offset=1, prediction_type="sample"), {}),
    ("FlowMatchEulerDiscreteScheduler", dict(shift=3.0), {}),
    ("FlowMatchEulerDiscreteScheduler", dict(use_dynamic_shifting=True), dict(mu=0.8)),
    ("DPMSolverMultistepScheduler", {}, {}),
    ("DPMSolverMultistepScheduler", dict(prediction_type="v_prediction", timestep_spacing="trailing"), {}),
    ("DPMSolverMultistepScheduler", dict(final_sigmas_type="sigma_min", lower_order_final=False,
                                         timestep_spacing="leading", steps_offset=1), {}),
    ("DPMSolverMultistepScheduler", dict(prediction_type="sample", beta_schedule="scaled_linear",
                                         beta_start=0.00085, beta_end=0.012), {}),
    ("UniPCMultistepScheduler", {}, {}),
    ("UniPCMultistepScheduler", dict(prediction_type="v_prediction", timestep_spacing="trailing",
                                     beta_schedule="squaredcos_cap_v2"), {}),
    ("UniPCMultistepScheduler", dict(prediction_type="sample", timestep_spacing="leading", steps_offset=1,
                                     beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012), {}),
    # Sigma schedules (Karras, exponential) and final sigmas.
    ("EulerDiscreteScheduler", dict(use_karras_sigmas=True, beta_schedule="scaled_linear", beta_start=0.00085,
                                    beta_end=0.012), {}),
    ("EulerDiscreteScheduler", dict(use_exponential_sigmas=True, final_sigmas_type="sigma_min",
                                    timestep_spacing="trailing"), {}),
    ("EulerDiscreteScheduler", dict(use_karras_sigmas=True, sigma_min=0.1, sigma_max=10.0,
                                    prediction_type="v_prediction"), {}),
    ("DPMSolverMultistepScheduler", dict(use_karras_sigmas=True, beta_schedule="scaled_linear",
                                         beta_start=0.00085, beta_end=0.012), {}),
    ("DPMSolverMultistepScheduler", dict(use_karras_sigmas=True, final_sigmas_type="sigma_min",
                                         euler_at_final=True), {}),
    ("DPMSolverMultistepScheduler", dict(use_exponential_sigmas=True, prediction_type="v_prediction"), {}),
    ("UniPCMultistepScheduler", dict(use_karras_sigmas=True, beta_schedule="scaled_linear", beta_start=0.00085,
                                     beta_end=0.012), {}),
    ("UniPCMultistepScheduler", dict(final_sigmas_type="sigma_min"), {}),
    ("UniPCMultistepScheduler", dict(use_exponential_sigmas=True, final_sigmas_type="sigma_min",
                                     prediction_type="v_prediction"), {}),
    # Beta sigmas (quantiles of Beta(0.6, 0.6), scipy's).
    ("EulerDiscreteScheduler", dict(use_beta_sigmas=True, sigma_min=0.05, final_sigmas_type="sigma_min"), {}),
    ("DPMSolverMultistepScheduler", dict(use_beta_sigmas=True, beta_schedule="scaled_linear", beta_start=0.00085,
                                         beta_end=0.012), {}),
    ("UniPCMultistepScheduler", dict(use_beta_sigmas=True, final_sigmas_type="sigma_min",
                                     timestep_spacing="trailing"), {}),
    # Zero terminal SNR (with v-prediction and trailing spacing, as its paper pairs them).
    ("DDIMScheduler", dict(rescale_betas_zero_snr=True, prediction_type="v_prediction", timestep_spacing="trailing",
                           beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012), dict(eta=0.3)),
    ("EulerDiscreteScheduler", dict(rescale_betas_zero_snr=True, prediction_type="v_prediction",
                                    timestep_spacing="trailing"), {}),
    ("DPMSolverMultistepScheduler", dict(rescale_betas_zero_snr=True, prediction_type="v_prediction",
                                         timestep_spacing="trailing", use_karras_sigmas=True), {}),
    ("UniPCMultistepScheduler", dict(rescale_betas_zero_snr=True, prediction_type="v_prediction",
                                     timestep_spacing="trailing"), {}),
    # DPM-Solver++ 3M: each sample's last two x0 kept; lower orders at its start and end.
    ("DPMSolverMultistepScheduler", dict(solver_order=3), {}),
    ("DPMSolverMultistepScheduler", dict(solver_order=3, final_sigmas_type="sigma_min", lower_order_final=False,
                                         prediction_type="v_prediction", beta_schedule="scaled_linear",
                                         beta_start=0.00085, beta_end=0.012), {}),
    # (A final sigma of 0 makes a run's result its last x0: sigma_min keeps the history in it. With
    # Karras sigmas too, diffusers' float32 DPM++ 3M divides by a zero step at the end: NaN.)
    ("DPMSolverMultistepScheduler", dict(solver_order=3, prediction_type="sample", final_sigmas_type="sigma_min",
                                         timestep_spacing="trailing"), {}),
    # UniPC of solver order 3: the corrector's third x0 rides on the kept corrected sample.
    ("UniPCMultistepScheduler", dict(solver_order=3), {}),
    ("UniPCMultistepScheduler", dict(solver_order=3, final_sigmas_type="sigma_min", lower_order_final=False,
                                     prediction_type="v_prediction", timestep_spacing="trailing"), {}),
    ("UniPCMultistepScheduler", dict(solver_order=3, use_karras_sigmas=True, prediction_type="sample",
                                     final_sigmas_type="sigma_min", beta_schedule="scaled_linear",
                                     beta_start=0.00085, beta_end=0.012), {}),
    # Stochastic samplers: each sample's noise at each step as diffusers draws it (from a
    # generator seeded per sample and step, or given).
    ("DDPMScheduler", {}, dict(noise=True)),
    ("DDPMScheduler", dict(prediction_type="v_prediction", timestep_spacing="trailing", clip_sample=False,
                           beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012), dict(noise=True)),
    ("DDPMScheduler", dict(prediction_type="sample", timestep_spacing="linspace", rescale_betas_zero_snr=True),
     dict(noise=True)),
    ("EulerAncestralDiscreteScheduler", {}, dict(noise=True)),
    ("EulerAncestralDiscreteScheduler", dict(prediction_type="v_prediction", timestep_spacing="trailing",
                                             beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012),
     dict(noise=True)),
    ("DPMSolverMultistepScheduler", dict(algorithm_type="sde-dpmsolver++"), dict(noise=True)),
    ("DPMSolverMultistepScheduler", dict(algorithm_type="sde-dpmsolver++", use_karras_sigmas=True,
                                         final_sigmas_type="sigma_min", prediction_type="v_prediction"),
     dict(noise=True)),
]
IDS = [f"{name}-{i}" for i, (name, _, _) in enumerate(CASES)]


def _seeded_noise(j, i, shape, dtype):
    """Sample i's step noise at iteration j, as diffusers draws it from a generator so seeded."""
    return torch.randn((1, *shape), generator=torch.Generator().manual_seed(1000 * j + i), dtype=dtype)


def _reference_run(name, config, options, steps, starts, latents, outputs, noises):
    """diffusers, one scheduler per sample, stepping sample i at global iteration j when
    starts[i] <= j < starts[i] + steps[i]."""
    results = []
    for i in range(len(steps)):
        sched = getattr(diffusers, name)(**config)
        kwargs = {"mu": options["mu"]} if "mu" in options else {}
        sched.set_timesteps(steps[i], **kwargs)
        x = latents[i:i + 1].clone()
        for k, t in enumerate(sched.timesteps):
            j = starts[i] + k
            step_kwargs = {}
            if "eta" in options:
                step_kwargs = dict(eta=options["eta"], variance_noise=noises[j][i:i + 1])
            if "use_clipped_model_output" in options:
                step_kwargs["use_clipped_model_output"] = True
            if options.get("noise"):
                if name == "DPMSolverMultistepScheduler":  # (it draws float32: given, it is cast so)
                    step_kwargs["variance_noise"] = _seeded_noise(j, i, x.shape[1:], x.dtype)
                else:
                    step_kwargs["generator"] = torch.Generator().manual_seed(1000 * j + i)
            x = sched.step(outputs[j][i:i + 1], t, x, **step_kwargs).prev_sample
        results.append(x)
    return torch.cat(results)


def _octopus_run(name, config, options, steps, starts, latents, outputs, noises, device, ragged=False):
    sched = getattr(od, name).from_config(getattr(diffusers, name)(**config).config)
    kwargs = {"mu": options["mu"]} if "mu" in options else {}
    sched.set_timesteps(steps, device=device, **kwargs)
    n = len(steps)
    x = latents.to(device)
    if ragged:
        x = octopus.RaggedBatch.from_tensors(list(x.unbind()), device=device)
    for j in range(len(outputs)):
        t = []
        for i in range(n):
            k = j - starts[i]
            t.append(float(sched.timesteps[i][k]) if 0 <= k < steps[i] else -1.0)
        m = outputs[j].to(device)
        if ragged:
            m = x.with_values(m.reshape(-1))
        step_kwargs = {}
        if "eta" in options:
            noise = noises[j].to(device)
            step_kwargs = dict(eta=options["eta"], variance_noise=x.with_values(noise.reshape(-1)) if ragged else noise)
        if "use_clipped_model_output" in options:
            step_kwargs["use_clipped_model_output"] = True
        if options.get("noise"):
            noise = torch.cat([_seeded_noise(j, i, latents.shape[1:], latents.dtype) for i in range(n)]).to(device)
            step_kwargs = dict(variance_noise=x.with_values(noise.reshape(-1)) if ragged else noise)
        x = sched.step(m, x, torch.tensor(t), **step_kwargs)
    if ragged:
        return x.values.view(latents.shape).cpu()
    return x.cpu()


def _problem(name, seed, dtype, n=5):
    g = torch.Generator().manual_seed(seed)
    steps = torch.randint(3, 16, (n,), generator=g).tolist()
    steps[0] = 1  # a one-step schedule: its first step is also its last
    starts = torch.randint(0, 6, (n,), generator=g).tolist()
    iterations = max(s + k for s, k in zip(starts, steps))
    latents = torch.randn(n, 4, 6, 10, generator=g, dtype=torch.float64).to(dtype)
    outputs = [torch.randn(latents.shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(iterations)]
    noises = [torch.randn(latents.shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(iterations)]
    return steps, starts, latents, outputs, noises


@pytest.mark.parametrize("name, config, options", CASES, ids=IDS)
def test_whole_runs_match_diffusers_per_sample_float64(name, config, options):
    problem = _problem(name, 1, torch.float64)
    expected = _reference_run(name, config, options, *problem)
    got = _octopus_run(name, config, options, *problem, device="cpu")
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())


# diffusers works DDPM's and DDIM's coefficients out in float32 (alphas_cumprod is a float32
# tensor), where 1 - alphas_cumprod[t] / alphas_cumprod[prev] cancels: worked out in double
# instead, a 100-step DDPM run ended 3e-5 away from diffusers' in float64, past the 1e-6 that
# runs of a few steps meet.
LONG_RUNS = [
    ("DDPMScheduler", {}, dict(noise=True)),
    ("DDPMScheduler", dict(prediction_type="v_prediction", clip_sample=False, beta_schedule="scaled_linear",
                           beta_start=0.00085, beta_end=0.012), dict(noise=True)),
    ("DDIMScheduler", dict(clip_sample=False), dict(eta=1.0)),
]


@pytest.mark.parametrize("name, config, options", LONG_RUNS, ids=[f"{r[0]}-{i}" for i, r in enumerate(LONG_RUNS)])
def test_runs_of_a_hundred_steps_match_diffusers_per_sample_float64(name, config, options):
    latents = torch.randn(3, 4, 6, 10, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    steps, starts = [100, 73, 1], [0, 20, 99]
    g = torch.Generator().manual_seed(8)
    outputs = [torch.randn(latents.shape, generator=g, dtype=torch.float64) for _ in range(100)]
    noises = [torch.randn(latents.shape, generator=g, dtype=torch.float64) for _ in range(100)]
    expected = _reference_run(name, config, options, steps, starts, latents, outputs, noises)
    got = _octopus_run(name, config, options, steps, starts, latents, outputs, noises, device="cpu")
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6 * expected.abs().max().item())


# DPM-Solver++ and UniPC with Karras sigmas round two sigmas to one timestep from ~45 steps on:
# each sample's history tells the two steps apart.
REPEATS = [
    ("DPMSolverMultistepScheduler", dict(use_karras_sigmas=True, beta_schedule="scaled_linear",
                                         beta_start=0.00085, beta_end=0.012), {}),
    ("UniPCMultistepScheduler", dict(use_karras_sigmas=True, beta_schedule="scaled_linear", beta_start=0.00085,
                                     beta_end=0.012, prediction_type="v_prediction"), {}),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")])])
@pytest.mark.parametrize("name, config, options", REPEATS, ids=[r[0] for r in REPEATS])
def test_repeated_timesteps_match_diffusers_per_sample(device, name, config, options):
    dtype = torch.float64 if device == "cpu" else torch.float32
    steps, starts, latents, outputs, noises = _problem(name, 3, dtype, n=3)
    steps, starts = [50, 61, 3], [0, 2, 40]
    g = torch.Generator().manual_seed(4)
    outputs = [torch.randn(latents.shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(63)]
    sched = getattr(diffusers, name)(**config)
    sched.set_timesteps(50)
    assert len(set(sched.timesteps.tolist())) < 50, "the case must repeat a timestep"
    expected = _reference_run(name, config, options, steps, starts, latents, outputs, noises)
    got = _octopus_run(name, config, options, steps, starts, latents, outputs, noises, device=device)
    # diffusers computes each step's coefficients from float32 sigmas in float32 (~6e-8 relative):
    # over 50-61 steps that drifts to ~2e-6 of the result, so 1e-5 even in float64.
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_repeated_timesteps_need_the_host_check():
    sched = od.DPMSolverMultistepScheduler(use_karras_sigmas=True, beta_schedule="scaled_linear",
                                           beta_start=0.00085, beta_end=0.012)
    sched.set_timesteps(50)
    x = torch.zeros(1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="repeats a timestep"):
        sched.step(x, x, sched.timesteps[:1], validate=False)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
@pytest.mark.parametrize("ragged", [False, True], ids=["dense", "ragged"])
@pytest.mark.parametrize("name, config, options", CASES, ids=IDS)
def test_whole_runs_match_diffusers_per_sample_float32_cuda(name, config, options, ragged):
    problem = _problem(name, 2, torch.float32)
    expected = _reference_run(name, config, options, *problem)
    got = _octopus_run(name, config, options, *problem, device="cuda", ragged=ragged)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_ragged_samples_of_different_sizes_match_dense_per_sample():
    sched = od.EulerDiscreteScheduler()
    sched.set_timesteps(10)
    g = torch.Generator().manual_seed(3)
    items = [torch.randn(4, h, w, generator=g, dtype=torch.float64) for h, w in [(8, 8), (1, 1), (16, 4), (0, 5)]]
    outs = [torch.randn(x.shape, generator=g, dtype=torch.float64) for x in items]
    batch = octopus.RaggedBatch.from_tensors(items)
    t = sched.timesteps[[0, 3, 9, 5]]
    got = sched.step(batch.with_values(torch.cat([o.reshape(-1) for o in outs])), batch, t).unbind()
    for i, (x, m) in enumerate(zip(items, outs)):
        ref = diffusers.EulerDiscreteScheduler()
        ref.set_timesteps(10)
        ref._step_index = [0, 3, 9, 5][i]
        torch.testing.assert_close(got[i], ref.step(m, t[i], x).prev_sample, rtol=1e-6, atol=1e-9)


def test_negative_timestep_leaves_the_sample_unchanged():
    sched = od.DDIMScheduler()
    sched.set_timesteps(20)
    x, m = torch.randn(3, 2, 4, 4, dtype=torch.float64), torch.randn(3, 2, 4, 4, dtype=torch.float64)
    out = sched.step(m, x, torch.tensor([-1.0, float(sched.timesteps[0]), -1.0]))
    assert torch.equal(out[0], x[0]) and torch.equal(out[2], x[2]) and not torch.equal(out[1], x[1])


def test_return_x0_and_half_precision():
    sched = od.DDIMScheduler(clip_sample=False)
    sched.set_timesteps(10)
    x, m = torch.randn(2, 3, 5, 5), torch.randn(2, 3, 5, 5)
    t = sched.timesteps[[2, 7]]
    prev, x0 = sched.step(m, x, t, return_x0=True)
    ac = sched.alphas_cumprod[t.long()].view(-1, 1, 1, 1).float()
    torch.testing.assert_close(x0, (x - (1 - ac).sqrt() * m) / ac.sqrt(), rtol=1e-5, atol=1e-5)
    for dtype in (torch.float16, torch.bfloat16):
        low = sched.step(m.to(dtype), x.to(dtype), t)
        assert low.dtype == dtype
        torch.testing.assert_close(low.float(), prev, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name, config", [
    ("DDIMScheduler", {}), ("EulerDiscreteScheduler", {}), ("FlowMatchEulerDiscreteScheduler", {}),
    ("DPMSolverMultistepScheduler", {}), ("UniPCMultistepScheduler", {}), ("DDPMScheduler", {}),
    ("EulerAncestralDiscreteScheduler", {}), ("DPMSolverMultistepScheduler", dict(algorithm_type="sde-dpmsolver++")),
    ("DPMSolverMultistepScheduler", dict(solver_order=3))])
def test_opcheck(device, name, config):
    sched = getattr(od, name)(**config)
    sched.set_timesteps(8, device=device)
    timesteps = sched.timesteps if isinstance(sched.timesteps, torch.Tensor) else sched.timesteps[0]
    x = torch.randn(3, 2, 4, 4, device=device)
    m = torch.randn_like(x)
    offsets = torch.arange(4, device=device) * 32
    t = timesteps[:3].double().to(device)
    args = (m.reshape(-1), x.reshape(-1), offsets, t, *sched._tables)
    kwargs = dict(return_x0=True)
    if sched._rows[0].stochastic:
        kwargs["noise"] = torch.randn_like(x).reshape(-1)
    if sched._rows[0].state_rows:
        kwargs["state"] = torch.randn(sched._rows[0].state_rows, 96, device=device)
    torch.library.opcheck(torch.ops.octopus.sampler_step.default, args, kwargs)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_a_captured_sampling_loop_replays_exactly():
    sched = od.DPMSolverMultistepScheduler()
    sched.set_timesteps(12, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    x0 = torch.randn(4, 4, 16, 16, device="cuda", generator=g)
    outs = [torch.randn(x0.shape, device="cuda", generator=g) for _ in range(12)]
    times = [torch.full((4,), float(t), dtype=torch.float64, device="cuda") for t in sched.timesteps]

    def loop(x):
        for k in range(12):
            x = sched.step(outs[k], x, times[k], validate=False)
        return x

    eager = loop(x0)
    sched.set_timesteps(12, device="cuda")
    sched.step(outs[0], x0, times[0], validate=False)  # allocate the history outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = loop(x0)
    graph.replay()
    assert torch.equal(captured, eager)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
@pytest.mark.parametrize("make", [lambda: od.DDIMScheduler(clip_sample=False), od.DPMSolverMultistepScheduler,
                                  od.UniPCMultistepScheduler])
def test_queued_steps_each_read_their_own_coefficients(make):
    # On sm_90 and later a step's kernel begins while the kernel computing its coefficients
    # still runs, and waits for them: steps queued back to back, each at other timesteps (every
    # step's coefficient table lands where the step before it had its own), equal float64 steps
    # on the CPU.
    n, steps = 48, 16
    gpu, cpu = make(), make()
    gpu.set_timesteps(steps, device="cuda")
    cpu.set_timesteps(steps)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, 24, 24, generator=g)
    outs = [torch.randn(x.shape, generator=g) for _ in range(steps // 2)]
    start = torch.randint(0, steps // 2, (n,), generator=g)
    times = [cpu.timesteps[start + k].double() for k in range(steps // 2)]
    outs_gpu, times_gpu = [o.cuda() for o in outs], [t.cuda() for t in times]
    y, ref = x.cuda(), x.double()
    torch.cuda.synchronize()
    for k in range(steps // 2):
        y = gpu.step(outs_gpu[k], y, times_gpu[k], validate=False)
        ref = cpu.step(outs[k].double(), ref, times[k], validate=False)
    # float32 against float64: 8e-5 at most on this data; a step with another's coefficients
    # is off by the latents' own size.
    torch.testing.assert_close(y.cpu().double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
@pytest.mark.parametrize("steps", [7, 32, 33, 128, 129, 300])
@pytest.mark.parametrize("make", [od.EulerDiscreteScheduler, lambda: od.DDPMScheduler(clip_sample=False)])
def test_any_timestep_finds_the_nearest_step_on_cuda_as_on_the_cpu(make, steps):
    # The CUDA coefficient kernel looks each timestep up in its schedule with a whole warp, 32
    # entries a round (lengths at and past 32 and 128 cross its rounds); the CPU binary-searches.
    gpu, cpu = make(), make()
    gpu.set_timesteps(steps, device="cuda")
    cpu.set_timesteps(steps)
    g = torch.Generator().manual_seed(steps)
    n = 64
    t = torch.rand(n, generator=g, dtype=torch.float64) * 1000.0  # between, on and past the entries
    t[:8] = cpu.timesteps[torch.randint(0, steps, (8,), generator=g)].double()
    t[8], t[9] = 0.0, 999.0
    x = torch.randn(n, 4, 8, 8, generator=g, dtype=torch.float64)
    m = torch.randn(x.shape, generator=g, dtype=torch.float64)
    z = torch.randn(x.shape, generator=g, dtype=torch.float64)
    kwargs = {} if isinstance(cpu, od.EulerDiscreteScheduler) else {"variance_noise": z}
    ref = cpu.step(m, x, t, validate=False, **kwargs)
    got = gpu.step(m.cuda(), x.cuda(), t.cuda(), validate=False,
                   **{k: v.cuda() for k, v in kwargs.items()})
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-12, atol=1e-12)


def test_beta_sigmas_without_scipy_say_so_at_construction(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    for cls in (od.EulerDiscreteScheduler, od.DPMSolverMultistepScheduler, od.UniPCMultistepScheduler):
        with pytest.raises(ImportError, match="use_beta_sigmas needs scipy"):
            cls(use_beta_sigmas=True)
    od.EulerDiscreteScheduler(use_karras_sigmas=True)  # the others do not need it


def test_bad_input_gets_clear_errors():
    sched = od.DDIMScheduler()
    x = torch.randn(2, 3, 4, 4)
    with pytest.raises(RuntimeError, match="set_timesteps"):
        sched.step(x, x, torch.tensor([1, 2]))
    sched.set_timesteps(10)
    t = sched.timesteps[:2]
    with pytest.raises(ValueError, match="not in sample 1's schedule"):
        sched.step(x, x, torch.tensor([float(t[0]), 7.0]))
    with pytest.raises(ValueError, match="one entry per sample"):
        sched.step(x, x, t[:1].repeat(3))
    with pytest.raises(ValueError, match="shape"):
        sched.step(x[:1], x, t)
    with pytest.raises(TypeError, match="dtype"):
        sched.step(x.double(), x, t)
    with pytest.raises(TypeError, match="float32, float64"):
        sched.step(x.to(torch.uint8), x.to(torch.uint8), t)
    with pytest.raises(ValueError, match="eta"):
        sched.step(x, x, t, eta=-1.0)
    with pytest.raises(ValueError, match="num_inference_steps"):
        sched.set_timesteps(0)
    with pytest.raises(ValueError, match="prediction_type"):
        od.EulerDiscreteScheduler(prediction_type="noise")
    with pytest.raises(NotImplementedError, match="use_lu_lambdas"):
        od.DPMSolverMultistepScheduler.from_config({"use_lu_lambdas": True})
    with pytest.raises(ValueError, match="exclusive"):
        od.DPMSolverMultistepScheduler(use_karras_sigmas=True, use_exponential_sigmas=True)
    with pytest.raises(ValueError, match="exclusive"):
        od.EulerDiscreteScheduler(use_beta_sigmas=True, use_karras_sigmas=True)
    with pytest.raises(NotImplementedError, match="solver_order"):
        od.DPMSolverMultistepScheduler.from_config({"solver_order": 1})
    with pytest.raises(NotImplementedError, match=r"solver_order=3 with algorithm_type='sde-dpmsolver\+\+'"):
        od.DPMSolverMultistepScheduler(solver_order=3, algorithm_type="sde-dpmsolver++")
    with pytest.raises(NotImplementedError, match="trained_betas"):
        od.DDIMScheduler.from_config({"trained_betas": [0.1, 0.2]})
    with pytest.raises(NotImplementedError, match="disable_corrector"):
        od.UniPCMultistepScheduler.from_config({"disable_corrector": [0]})
    for order in (1, 4):
        with pytest.raises(NotImplementedError, match=f"solver_order={order}.*supported: 2, 3"):
            od.UniPCMultistepScheduler(solver_order=order)
        with pytest.raises(NotImplementedError, match="solver_order"):
            od.UniPCMultistepScheduler.from_config({"solver_order": order})
    dpm = od.DPMSolverMultistepScheduler()
    dpm.set_timesteps(10)
    with pytest.raises(ValueError, match="history"):
        dpm.step(x, x, dpm.timesteps[[0, 3]])
    if HAS_CUDA:
        with pytest.raises(ValueError, match="device"):
            sched.step(x.cuda(), x.cuda(), t)


def test_scale_model_input_uses_each_samples_sigma():
    sched = od.EulerDiscreteScheduler()
    sched.set_timesteps(10)
    t = sched.timesteps[[0, 5]]
    sigma = sched.sigma_for(t)
    dense = torch.randn(2, 4, 3, 3)
    expected = dense / (sigma.float() ** 2 + 1).sqrt().view(-1, 1, 1, 1)
    torch.testing.assert_close(sched.scale_model_input(dense, t), expected)
    ref = diffusers.EulerDiscreteScheduler()
    ref.set_timesteps(10)
    ref._step_index = 5
    torch.testing.assert_close(expected[1:], ref.scale_model_input(dense[1:], t[1]))
    batch = octopus.RaggedBatch.from_tensors([torch.randn(4, 3, 3), torch.randn(4, 2, 5)])
    for got, x, s in zip(sched.scale_model_input(batch, t).unbind(), batch.unbind(), sigma.tolist()):
        torch.testing.assert_close(got, x / (s * s + 1) ** 0.5)


def _mixed_rows():
    """Rows of every fused sampler (several configurations, DDIM with eta) for one launch."""
    return [od.DDIMScheduler().sampler_row(10), od.DDIMScheduler(clip_sample=False).sampler_row(7, eta=0.8),
            od.DDIMScheduler(prediction_type="v_prediction").sampler_row(6, use_clipped_model_output=True),
            od.EulerDiscreteScheduler(prediction_type="sample").sampler_row(12),
            od.FlowMatchEulerDiscreteScheduler(shift=2.0).sampler_row(5),
            od.DPMSolverMultistepScheduler().sampler_row(9),
            od.DPMSolverMultistepScheduler(prediction_type="v_prediction").sampler_row(20),
            od.UniPCMultistepScheduler().sampler_row(8),
            od.DDPMScheduler(prediction_type="v_prediction").sampler_row(11),
            od.EulerAncestralDiscreteScheduler().sampler_row(9),
            od.DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++").sampler_row(7),
            od.DPMSolverMultistepScheduler(solver_order=3, prediction_type="v_prediction").sampler_row(16),
            od.UniPCMultistepScheduler(prediction_type="sample", lower_order_final=False).sampler_row(30),
            od.UniPCMultistepScheduler(solver_order=3, prediction_type="v_prediction",
                                       final_sigmas_type="sigma_min").sampler_row(13)]


def _launch(m, x, offsets, t, rows, sample_rows, noise, state, device):
    tables = od.rows.RowTables.build(rows, device)
    sample_rows = None if sample_rows is None else torch.tensor(sample_rows, device=device)
    return od.rows.fused_step(m, x, offsets, t.to(device), tables, sample_rows=sample_rows, noise=noise, state=state,
                              return_x0=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_launch_of_mixed_samplers_equals_each_sampler_alone(device, dtype):
    rows = _mixed_rows()
    g = torch.Generator().manual_seed(4)
    # Samples (ragged, one empty) in shuffled rows; two share a row; rows[12] is used by none.
    sample_rows = [3, 0, 7, 5, 1, 2, 4, 5, 6, 7, 1, 9, 8, 10, 9, 11, 13]
    sizes = [4 * int(torch.randint(0, 30, (1,), generator=g)) for _ in sample_rows]
    sizes[4] = 0
    offsets = torch.tensor([0] + sizes).cumsum(0).to(device)
    n = int(offsets[-1])
    state = od.rows.state_tensor(3, n, torch.empty(0, dtype=dtype, device=device))
    state.copy_(torch.randn(3, n, generator=g, dtype=torch.float64).to(dtype))
    for step in range(3):  # consecutive steps: the multistep state carries over
        x, m, z = (torch.randn(n, generator=g, dtype=torch.float64).to(device, dtype) for _ in range(3))
        t = torch.tensor([rows[r].timesteps[min(step + i % 3, rows[r].num_steps - 1)] for i, r in
                          enumerate(sample_rows)], dtype=torch.float64)
        t[2] = -1.0  # a sample that rides along
        expected_state = state.clone()
        got = _launch(m, x, offsets, t, rows, sample_rows, z, state, device)
        for i, r in enumerate(sample_rows):
            a, b = int(offsets[i]), int(offsets[i + 1])
            alone = expected_state[:, a:b].clone()
            one = _launch(m[a:b], x[a:b], torch.tensor([0, b - a], device=device), t[i:i + 1], [rows[r]], None,
                          z[a:b], alone[:rows[r].state_rows or 1] if rows[r].state_rows else None, device)
            for k in range(2):
                torch.testing.assert_close(got[k][a:b], one[k], rtol=1e-12 if dtype == torch.float64 else 1e-6,
                                           atol=1e-12 if dtype == torch.float64 else 1e-6)
            if rows[r].state_rows and t[i] >= 0:
                torch.testing.assert_close(state[:rows[r].state_rows, a:b], alone[:rows[r].state_rows])
            if t[i] < 0:
                assert torch.equal(got[0][a:b], x[a:b]) and torch.equal(state[:, a:b], expected_state[:, a:b])


def test_opcheck_mixed_samplers(device):
    rows = _mixed_rows()
    g = torch.Generator().manual_seed(5)
    sample_rows = torch.tensor([8, 0, 3, 5, 1, 4, 7], device=device)
    offsets = torch.arange(8, device=device) * 20
    x, m, z = (torch.randn(140, generator=g).to(device) for _ in range(3))
    t = torch.tensor([rows[r].timesteps[1] for r in sample_rows.tolist()], dtype=torch.float64, device=device)
    tables = od.rows.RowTables.build(rows, device)
    torch.library.opcheck(torch.ops.octopus.sampler_step.default, (m, x, offsets, t, *tables),
                          dict(sample_rows=sample_rows, noise=z, state=torch.randn(3, 140, device=device),
                               return_x0=True))


def test_bad_rows_get_clear_errors():
    rows = _mixed_rows()
    x = torch.randn(8, dtype=torch.float64)
    offsets = torch.tensor([0, 4, 8])
    t = torch.tensor([float(rows[0].timesteps[0]), float(rows[5].timesteps[1])], dtype=torch.float64)
    good = od.rows.RowTables.build(rows, "cpu")
    sample_rows = torch.tensor([0, 5])
    state = torch.zeros(1, 8, dtype=torch.float64)

    def call(tables=good, rows_=sample_rows, state_=state, timesteps=t):
        return od.rows.fused_step(x, x, offsets, timesteps, tables, sample_rows=rows_, state=state_)

    call()  # rows 7 and 8 (UniPC) need 3 state rows, but no sample reads them
    info = good.row_info.clone()
    info[1, 0] = len(od.SAMPLER_KINDS)  # one past the last kind
    with pytest.raises(ValueError, match=rf"row_info\[1\]: kind {len(od.SAMPLER_KINDS)}"):
        call(good._replace(row_info=info))
    info = good.row_info.clone()
    info[4, 1] = 0  # flow_euler predicting epsilon
    with pytest.raises(ValueError, match="predict 'flow'"):
        call(good._replace(row_info=info))
    info = good.row_info.clone()
    info[3, 2] = 40
    with pytest.raises(ValueError, match="length 40"):
        call(good._replace(row_info=info))
    with pytest.raises(ValueError, match="dpm_solver_pp_2m, which needs a state"):
        call(state_=None)
    with pytest.raises(ValueError, match="unipc, which needs a state of 3 rows"):
        call(rows_=torch.tensor([0, 7]))
    with pytest.raises(ValueError, match="unipc_3, which needs a state of 3 rows"):
        call(rows_=torch.tensor([0, 13]))
    with pytest.raises(ValueError, match=rf"sample_rows\[1\] = {len(rows)}"):
        call(rows_=torch.tensor([0, len(rows)]))
    with pytest.raises(ValueError, match="dpm_solver_pp_3m, which needs a state of 3 rows"):
        call(rows_=torch.tensor([0, 11]))
    with pytest.raises(ValueError, match="euler_ancestral, which adds noise at its steps: pass noise"):
        call(rows_=torch.tensor([0, 9]))
    with pytest.raises(ValueError, match="ddim with eta > 0, which adds noise"):
        call(rows_=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="one entry per sample"):
        call(rows_=torch.tensor([0]))
    with pytest.raises(ValueError, match="1 row or one per sample"):
        call(rows_=None)
    with pytest.raises(ValueError, match="tables must be"):
        call(good._replace(tables=good.tables[:, :1]))
    with pytest.raises(ValueError, match="row_scalars must be"):
        call(good._replace(row_scalars=good.row_scalars[:, :2]))
    with pytest.raises(ValueError, match="state must be"):
        call(state_=torch.zeros(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="16-byte aligned"):
        call(state_=torch.zeros(3, 9, dtype=torch.float64)[:, 1:])
    with pytest.raises(TypeError, match="row_info must be"):
        call(good._replace(row_info=good.row_info.double()))
    with pytest.raises(ValueError, match="kind must be one of"):
        od.SamplerRow("heun", "epsilon", rows[0].timesteps, rows[0].table)
    with pytest.raises(ValueError, match="eta is a ddim option"):
        od.SamplerRow("euler", "epsilon", rows[3].timesteps, rows[3].table, eta=0.5)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.lists(st.integers(0, 999), min_size=1, max_size=80))
def test_keys_give_every_step_its_own_nearest_key(values):
    timesteps = np.sort(np.array(values, dtype=np.float64))[::-1].copy()
    row = od.SamplerRow("euler", "epsilon", timesteps, np.zeros(len(timesteps) + 1))
    keys = row.keys
    assert np.all(np.diff(keys) < 0), "strictly descending"
    assert np.all((keys - timesteps >= 0) & (keys - timesteps < 0.25))
    assert np.array_equal(keys == timesteps, np.r_[timesteps[:-1] != timesteps[1:], True]), \
        "a timestep that does not repeat is its own key"
    for k in range(len(keys)):
        assert np.argmin(np.abs(keys - keys[k])) == k  # the fused step's nearest-key lookup
        # The host check finds step k from its timestep and the step before it.
        assert row.step_index(timesteps[k], after=k - 1) == k
    assert row.repeats_timesteps == (len(set(values)) < len(values))

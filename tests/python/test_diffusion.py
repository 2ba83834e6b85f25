"""octopus.diffusion: fused per-sample sampler steps against diffusers run separately per
sample, over whole sampling runs with random per-sample schedules and start steps."""

import copy

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
]
IDS = [f"{name}-{i}" for i, (name, _, _) in enumerate(CASES)]


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


@pytest.mark.parametrize("name", ["DDIMScheduler", "EulerDiscreteScheduler", "FlowMatchEulerDiscreteScheduler",
                                  "DPMSolverMultistepScheduler", "UniPCMultistepScheduler"])
def test_opcheck(device, name):
    sched = getattr(od, name)()
    sched.set_timesteps(8, device=device)
    timesteps = sched.timesteps if isinstance(sched.timesteps, torch.Tensor) else sched.timesteps[0]
    x = torch.randn(3, 2, 4, 4, device=device)
    m = torch.randn_like(x)
    offsets = torch.arange(4, device=device) * 32
    t = timesteps[:3].double().to(device)
    state = [torch.randn(96, device=device) for _ in range(3)]
    args = (m.reshape(-1), x.reshape(-1), offsets, t, sched._schedule, sched._table, sched._row_info, sched._kind,
            sched._prediction_code())
    kwargs = dict(return_x0=True)
    if sched._kind >= 3:
        kwargs["history"] = state[0]
    if sched._kind == 4:
        kwargs.update(history2=state[1], last_sample=state[2])
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
    with pytest.raises(NotImplementedError, match="use_karras_sigmas"):
        od.EulerDiscreteScheduler.from_config({"use_karras_sigmas": True})
    with pytest.raises(NotImplementedError, match="solver_order"):
        od.DPMSolverMultistepScheduler.from_config({"solver_order": 3})
    with pytest.raises(NotImplementedError, match="trained_betas"):
        od.DDIMScheduler.from_config({"trained_betas": [0.1, 0.2]})
    with pytest.raises(NotImplementedError, match="disable_corrector"):
        od.UniPCMultistepScheduler.from_config({"disable_corrector": [0]})
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

"""octopus.diffusion.ContinuousSampler: every request's final latents equal running it alone
with diffusers' own scheduler (same model, same noise), with requests of mixed shapes,
samplers, step counts, guidance and arrival times in one continuously refilled batch; and
admission (max_batch, memory budget, priority, deadlines, preemption), failure isolation and
close()."""

import math
import threading
import time

import pytest
import torch

import octopus
from conftest import HAS_CUDA
from octopus import diffusion as od

diffusers = pytest.importorskip("diffusers")

# (scheduler, config, options): every fused sampler, with a few of its configurations.
SAMPLERS = [
    ("DDIMScheduler", {}, {}),
    ("DDIMScheduler", dict(prediction_type="v_prediction", timestep_spacing="trailing", clip_sample=False), {}),
    ("DDIMScheduler", dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012), dict(eta=0.6)),
    ("EulerDiscreteScheduler", {}, {}),
    ("EulerDiscreteScheduler", dict(timestep_spacing="leading", steps_offset=1, prediction_type="v_prediction"), {}),
    ("FlowMatchEulerDiscreteScheduler", dict(shift=3.0), {}),
    ("FlowMatchEulerDiscreteScheduler", dict(use_dynamic_shifting=True), dict(mu=0.7)),
    ("DPMSolverMultistepScheduler", {}, {}),
    ("DPMSolverMultistepScheduler", dict(prediction_type="v_prediction", timestep_spacing="trailing"), {}),
    ("UniPCMultistepScheduler", {}, {}),
    ("UniPCMultistepScheduler", dict(prediction_type="sample", timestep_spacing="leading", steps_offset=1), {}),
]
SHAPES = [(4, 8, 8), (4, 8, 12), (4, 16, 8)]


def tiny_unet(dtype=torch.float64, device="cpu"):
    torch.manual_seed(0)
    model = diffusers.UNet2DModel(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16),
                                  layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                  up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4,
                                  attention_head_dim=8)
    return model.to(device=device, dtype=dtype).eval()


def tiny_conditional_unet(dtype=torch.float64, device="cpu"):
    torch.manual_seed(1)
    model = diffusers.UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16),
                                           layers_per_block=1, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                           up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=12,
                                           norm_num_groups=4, attention_head_dim=4)
    return model.to(device=device, dtype=dtype).eval()


def requests_for(seed, n, samplers=SAMPLERS, max_steps=9):
    """n requests: shapes, samplers and step counts drawn at random, each with its seed."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        name, config, options = samplers[int(torch.randint(len(samplers), (1,), generator=g))]
        shape = SHAPES[int(torch.randint(len(SHAPES), (1,), generator=g))]
        steps = 1 if i == 0 else int(torch.randint(2, max_steps + 1, (1,), generator=g))
        out.append(dict(shape=shape, scheduler=name, scheduler_config=config, num_inference_steps=steps,
                        seed=1000 + i, **options))
    return out


def rescale_noise_cfg(noise_cfg, noise_pred_text, guidance_rescale):
    """diffusers' pipelines' rescale_noise_cfg (pipeline_stable_diffusion.py), as written there
    (importing it needs transformers)."""
    std_text = noise_pred_text.std(dim=list(range(1, noise_pred_text.ndim)), keepdim=True)
    std_cfg = noise_cfg.std(dim=list(range(1, noise_cfg.ndim)), keepdim=True)
    noise_pred_rescaled = noise_cfg * (std_text / std_cfg)
    return guidance_rescale * noise_pred_rescaled + (1 - guidance_rescale) * noise_cfg


@torch.no_grad()
def diffusers_alone(model, request, dtype, device="cpu", cond=None, neg=None, scale=None):
    """What a user writes today: the request alone through diffusers' scheduler (a pipeline's
    loop: init_noise_sigma, scale_model_input, classifier-free guidance, step)."""
    sched = getattr(diffusers, request["scheduler"]).from_config(request["scheduler_config"])
    kwargs = {"mu": request["mu"]} if "mu" in request else {}
    sched.set_timesteps(request["num_inference_steps"], **kwargs)
    g = torch.Generator().manual_seed(request["seed"])
    x = torch.randn(request["shape"], generator=g, dtype=dtype)[None].to(device)
    x = x * getattr(sched, "init_noise_sigma", 1.0)
    step_kwargs = dict(eta=request["eta"], generator=g) if "eta" in request else {}
    if request["scheduler"] in ("DDPMScheduler", "EulerAncestralDiscreteScheduler") or \
            request["scheduler_config"].get("algorithm_type") == "sde-dpmsolver++":
        step_kwargs = dict(generator=g)  # the step noise continues the request's generator
    for t in sched.timesteps:
        inp = sched.scale_model_input(x, t) if hasattr(sched, "scale_model_input") else x
        if scale is None:
            out = model(inp, t, **({} if cond is None else {k: v[None] for k, v in cond.items()})).sample
        else:
            both = model(torch.cat([inp, inp]), t, **{k: torch.stack([cond[k], neg[k]]) for k in cond}).sample
            text, uncond = both.chunk(2)
            out = uncond + scale * (text - uncond)
            if request.get("guidance_rescale"):
                out = rescale_noise_cfg(out, text, guidance_rescale=request["guidance_rescale"])
        x = sched.step(out, t, x, **step_kwargs).prev_sample
    return x[0]


def assert_matches(got, expected, rtol):
    torch.testing.assert_close(got, expected, rtol=rtol, atol=rtol * expected.abs().max().item())


def submit_in_waves(sampler, requests, waves=3):
    """Submits the requests in waves, each once the sampler has run a few more iterations,
    so that later requests join a batch already in flight."""
    futures, per_wave = [], -(-len(requests) // waves)
    for w in range(waves):
        futures += [sampler.submit(**r) for r in requests[w * per_wave:(w + 1) * per_wave]]
        target = sampler.stats()["iterations"] + 2
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            stats = sampler.stats()  # (before its first iteration the wave is still waiting, not running)
            if stats["iterations"] >= target or not (stats["running"] or stats["waiting"]):
                break
            time.sleep(0.005)
    return futures


def test_codes_come_from_the_library():
    assert od.SAMPLER_KINDS == ("ddim", "euler", "flow_euler", "dpm_solver_pp_2m", "unipc", "euler_ancestral",
                                "dpm_solver_pp_2m_sde", "ddpm", "dpm_solver_pp_3m", "unipc_3")
    assert od.PREDICTION_TYPES == ("epsilon", "v_prediction", "sample", "flow")


def test_mixed_requests_match_diffusers_alone_float64():
    model = tiny_unet()
    requests = requests_for(0, 12)
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=4, record_iterations=True) as sampler:
        futures = submit_in_waves(sampler, requests)
        results = [f.result(timeout=300) for f in futures]
        timings = sampler.iteration_timings()
    assert max(t["samples"] for t in timings) == 4  # full batches, refilled
    assert max(t["groups"] for t in timings) >= 2    # of several shapes at once
    for request, result in zip(requests, results):
        assert result.latents.shape == request["shape"] and result.latents.dtype == torch.float64
        assert result.iterations == request["num_inference_steps"]
        assert_matches(result.latents, diffusers_alone(model, request, torch.float64), rtol=1e-6)


def test_sigma_schedules_mixed_in_one_running_batch_match_diffusers_alone_float64():
    """Karras, exponential and beta sigmas, final sigma_min, solver order 3 (DPM++ 3M, UniPC), and
    a 50-step DPM++ 2M Karras schedule whose timesteps repeat (its samples' steps told apart by
    their keys), in one batch."""
    sd = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)
    configs = [("DPMSolverMultistepScheduler", dict(use_karras_sigmas=True, **sd), 50),
               ("EulerDiscreteScheduler", dict(use_karras_sigmas=True, **sd), 7),
               ("UniPCMultistepScheduler", dict(use_exponential_sigmas=True, final_sigmas_type="sigma_min"), 9),
               ("DPMSolverMultistepScheduler", dict(use_karras_sigmas=True, final_sigmas_type="sigma_min"), 5),
               ("EulerDiscreteScheduler", dict(use_exponential_sigmas=True, timestep_spacing="trailing"), 6),
               ("DPMSolverMultistepScheduler", dict(solver_order=3, use_karras_sigmas=True, **sd), 18),
               ("DPMSolverMultistepScheduler", dict(solver_order=3), 6),
               ("UniPCMultistepScheduler", dict(use_beta_sigmas=True), 8),
               ("EulerDiscreteScheduler", dict(use_beta_sigmas=True, **sd), 11),
               ("UniPCMultistepScheduler", dict(solver_order=3, use_karras_sigmas=True, **sd), 12),
               ("UniPCMultistepScheduler", dict(solver_order=3, final_sigmas_type="sigma_min"), 7)]
    requests = [dict(shape=SHAPES[i % len(SHAPES)], scheduler=name, scheduler_config=config, num_inference_steps=steps,
                     seed=2000 + i) for i, (name, config, steps) in enumerate(configs)]
    model = tiny_unet()
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=4) as sampler:
        results = [f.result(timeout=300) for f in submit_in_waves(sampler, requests, waves=2)]
    for request, result in zip(requests, results):
        assert result.iterations == request["num_inference_steps"]
        # diffusers computes coefficients from float32 sigmas in float32: ~2e-6 drift over 50 steps.
        assert_matches(result.latents, diffusers_alone(model, request, torch.float64), rtol=1e-5)


def calculate_shift(image_seq_len, base_seq_len=256, max_seq_len=4096, base_shift=0.5, max_shift=1.15):
    """diffusers' Flux and SD3 pipelines' mu (pipeline_flux.py's calculate_shift, as written there)."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return image_seq_len * m + b


def test_flow_matching_requests_without_mu_get_their_resolutions_shift_float64():
    """use_dynamic_shifting without mu: each request's mu from its own latent size, as an SD3 or
    Flux pipeline computes it for that resolution (2x2 patches), in one running batch."""
    model = tiny_unet()
    config = dict(use_dynamic_shifting=True, base_image_seq_len=4, max_image_seq_len=64, base_shift=0.4,
                  max_shift=1.3)
    requests = [dict(shape=shape, scheduler="FlowMatchEulerDiscreteScheduler", scheduler_config=config,
                     num_inference_steps=steps, seed=4000 + i)
                for i, (shape, steps) in enumerate([((4, 8, 8), 5), ((4, 16, 8), 7), ((4, 8, 12), 4)])]
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=4) as sampler:
        results = [f.result(timeout=300) for f in submit_in_waves(sampler, requests, waves=1)]
    mus = set()
    for request, result in zip(requests, results):
        _, h, w = request["shape"]
        mu = calculate_shift((h // 2) * (w // 2), 4, 64, 0.4, 1.3)
        mus.add(round(mu, 6))
        assert_matches(result.latents, diffusers_alone(model, dict(request, mu=mu), torch.float64), rtol=1e-6)
    assert len(mus) == 3, "three resolutions, three shifts"


# The stochastic samplers, each request's noise drawn from its own generator.
STOCHASTIC = [
    ("DDPMScheduler", {}, {}),
    ("DDPMScheduler", dict(prediction_type="v_prediction", timestep_spacing="trailing", clip_sample=False), {}),
    ("EulerAncestralDiscreteScheduler", {}, {}),
    ("EulerAncestralDiscreteScheduler", dict(prediction_type="v_prediction", timestep_spacing="leading",
                                             steps_offset=1), {}),
    ("DPMSolverMultistepScheduler", dict(algorithm_type="sde-dpmsolver++"), {}),
    ("DDIMScheduler", {}, dict(eta=0.5)),
]


def test_stochastic_requests_mixed_with_deterministic_ones_match_diffusers_alone_float64():
    """Each stochastic request draws its step noise from its own generator, in diffusers'
    order (DDPM none at timestep 0; DPM-Solver++ SDE in float32), whatever shares its batch:
    its result equals diffusers run alone with the same seed."""
    model = tiny_unet()
    requests = requests_for(20, 12, samplers=STOCHASTIC + SAMPLERS[3:5] + SAMPLERS[7:8])
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=4) as sampler:
        results = [f.result(timeout=300) for f in submit_in_waves(sampler, requests)]
    assert any(r["scheduler"] == "DDPMScheduler" for r in requests)
    for request, result in zip(requests, results):
        assert_matches(result.latents, diffusers_alone(model, request, torch.float64), rtol=1e-6)


def test_priority_lane_iterates_high_priority_samples_apart_and_matches_diffusers_float64():
    model = tiny_unet()
    requests = [r | dict(priority="high") if i % 3 == 0 else r for i, r in enumerate(requests_for(2, 12))]
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=6, priority_lane=True,
                                               record_iterations=True) as sampler:
        futures = submit_in_waves(sampler, requests)
        results = [f.result(timeout=300) for f in futures]
        timings = sampler.iteration_timings()
    lanes = {t["lane"] for t in timings}
    assert lanes == {"normal", "priority"}
    # The lanes' iterations hold only their own samples: at most the high (or other) requests.
    assert max(t["samples"] for t in timings if t["lane"] == "priority") <= sum(i % 3 == 0 for i in range(12))
    assert sum(t["samples"] for t in timings) == sum(r["num_inference_steps"] for r in requests)
    for request, result in zip(requests, results):
        assert result.iterations == request["num_inference_steps"]
        assert_matches(result.latents, diffusers_alone(model, request, torch.float64), rtol=1e-6)


def test_lanes_with_preemption_and_a_batch_cap_keep_every_request_exact_float64():
    """Requests of three priorities arriving in waves, with the priority lane, preemption and a
    batch cap all on: samples are parked and resumed, move in and out of both lanes' arenas,
    and each still equals diffusers run alone."""
    model = tiny_unet()
    # The first wave low and normal only (they are running when the high-priority ones come).
    priorities = ["low", "normal"] * 3 + ["high", "low", "normal"] * 4
    requests = [r | dict(priority=p) for r, p in zip(requests_for(3, 18, max_steps=7), priorities)]
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=4, priority_lane=True, preempt=True,
                                               high_priority_batch=2, record_iterations=True) as sampler:
        futures = submit_in_waves(sampler, requests, waves=3)
        results = [f.result(timeout=300) for f in futures]
        stats = sampler.stats()
        timings = sampler.iteration_timings()
    assert stats["completed"] == len(requests) and stats["failed"] == stats["cancelled"] == 0
    assert stats["parked"] > 0 and {t["lane"] for t in timings} == {"normal", "priority"}
    assert stats["sample_steps"] == sum(r["num_inference_steps"] for r in requests)
    for request, result in zip(requests, results):
        assert_matches(result.latents, diffusers_alone(model, request, torch.float64), rtol=1e-6)


def test_a_high_priority_request_queued_behind_a_full_batch_joins_first_in_its_lane():
    """With the lanes sharing max_batch, a high-priority request queued behind a full normal
    lane still gets a place first (admission is by priority), and iterates in its lane."""
    with torch.no_grad():
        model, sampler, blocker = blocked_sampler(max_batch=2, priority_lane=True, record_iterations=True)
        normal = [sampler.submit(shape=(4, 8, 8), scheduler="DDIMScheduler", num_inference_steps=3, seed=10 + i)
                  for i in range(2)]
        high = sampler.submit(shape=(4, 8, 12), scheduler="EulerDiscreteScheduler", num_inference_steps=2, seed=20,
                              priority="high")
        model.release()
        for f in normal + [high, blocker]:
            f.result(timeout=120)
        timings = sampler.iteration_timings()
        sampler.close()
    assert high.result().queued_s <= min(f.result().queued_s for f in normal)
    assert sum(t["samples"] for t in timings if t["lane"] == "priority") == 2


def lane_sequence(normal_lane_pause):
    """Two normal requests running when a high-priority one of 4 steps joins; checks every
    result against diffusers alone and returns the lanes of the iterations in issue order and
    the stats."""
    model = tiny_unet()
    # (60 steps: the normal requests still run when the high one joins, however late a loaded
    # host lets this thread see their second iteration. Unclipped: with x0 clipped, the tiny
    # UNet carries the last-ulp differences of torch's float32 square roots in diffusers' DDIM
    # coefficients to 1e-6 of the result over 50 steps.)
    normal = [dict(shape=(4, 8, 8), scheduler="DDIMScheduler", scheduler_config={"clip_sample": False},
                   num_inference_steps=60, seed=30 + i) for i in range(2)]
    high = dict(shape=(4, 8, 12), scheduler="UniPCMultistepScheduler", scheduler_config={}, num_inference_steps=4,
                seed=40, priority="high")
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=4, priority_lane=True, record_iterations=True,
                                               normal_lane_pause=normal_lane_pause) as sampler:
        futures = submit_in_waves(sampler, normal, waves=1)  # returns once the normal lane has iterated twice
        futures.append(sampler.submit(**high))
        results = [f.result(timeout=300) for f in futures]
        timings, stats = sampler.iteration_timings(), sampler.stats()
    for request, result in zip(normal + [high], results):
        assert_matches(result.latents, diffusers_alone(model, request, torch.float64), rtol=1e-6)
    return [t["lane"] for t in timings], stats


def test_a_strict_normal_lane_pause_leaves_the_gpu_to_high_priority_requests():
    lanes, stats = lane_sequence(math.inf)
    first, last = lanes.index("priority"), len(lanes) - 1 - lanes[::-1].index("priority")
    assert lanes[first:last + 1] == ["priority"] * 4  # no normal iteration while it runs
    assert lanes[:first] == ["normal"] * first and first >= 2 and lanes[last + 1:] and set(lanes[last + 1:]) == {
        "normal"}
    assert stats["normal_lane_paused_s"] > 0


def test_a_bounded_normal_lane_pause_lets_one_normal_iteration_through_after_each_pause():
    lanes, stats = lane_sequence(1e-9)  # every pause ends by the next round
    first, last = lanes.index("priority"), len(lanes) - 1 - lanes[::-1].index("priority")
    assert lanes[first:last + 1].count("priority") == 4 and "normal" in lanes[first:last + 1]
    assert stats["normal_lane_paused_s"] > 0


def test_without_a_pause_the_lanes_iterate_side_by_side():
    lanes, stats = lane_sequence(0.0)
    first, last = lanes.index("priority"), len(lanes) - 1 - lanes[::-1].index("priority")
    assert lanes[first:last + 1].count("normal") >= 3  # one per round with the priority lane
    assert stats["normal_lane_paused_s"] == 0


@pytest.mark.parametrize("options, match", [
    (dict(normal_lane_pause=0.1), "needs priority_lane"),
    (dict(normal_lane_pause=-1.0, priority_lane=True), "normal_lane_pause"),
    (dict(normal_lane_pause=float("nan"), priority_lane=True), "normal_lane_pause"),
    (dict(normal_lane_pause="1", priority_lane=True), "normal_lane_pause"),
])
def test_bad_normal_lane_pause_is_refused(options, match):
    with pytest.raises(ValueError, match=match):
        od.ContinuousSampler(tiny_unet(), **options)


def test_classifier_free_guidance_per_request_float64():
    model = tiny_conditional_unet()
    g = torch.Generator().manual_seed(5)
    requests, conds = [], []
    for i, scale in enumerate([7.5, None, 2.0, 1.0, None, 4.0]):
        r = requests_for(10 + i, 1, samplers=SAMPLERS[:2] + SAMPLERS[7:])[0] | dict(num_inference_steps=3 + i % 3)
        cond = {"encoder_hidden_states": torch.randn(5, 12, generator=g, dtype=torch.float64)}
        neg = {"encoder_hidden_states": torch.randn(5, 12, generator=g, dtype=torch.float64)}
        conds.append((cond, neg if scale is not None else None, scale))
        requests.append(r | dict(conditioning=cond, guidance_scale=scale,
                                 negative_conditioning=neg if scale is not None else None))
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=4) as sampler:
        results = [f.result(timeout=300) for f in submit_in_waves(sampler, requests, waves=2)]
    for request, (cond, neg, scale), result in zip(requests, conds, results):
        expected = diffusers_alone(model, request, torch.float64, cond=cond, neg=neg, scale=scale)
        assert_matches(result.latents, expected, rtol=1e-6)


def test_guidance_rescale_per_request_on_zero_snr_schedules_float64():
    """guidance_rescale (diffusers' rescale_noise_cfg) per request, beside requests without it
    and unguided ones, on zero-terminal-SNR v-prediction schedules as its paper pairs them."""
    model = tiny_conditional_unet()
    g = torch.Generator().manual_seed(6)
    zero_snr = dict(rescale_betas_zero_snr=True, prediction_type="v_prediction", timestep_spacing="trailing")
    samplers = [("DDIMScheduler", zero_snr), ("EulerDiscreteScheduler", zero_snr),
                ("DPMSolverMultistepScheduler", zero_snr), ("UniPCMultistepScheduler", {})]
    requests, conds = [], []
    for i, (scale, rescale) in enumerate([(7.5, 0.7), (5.0, 0.0), (None, 0.0), (3.0, 1.0), (6.0, 0.3)]):
        name, config = samplers[i % len(samplers)]
        cond = {"encoder_hidden_states": torch.randn(5, 12, generator=g, dtype=torch.float64)}
        neg = {"encoder_hidden_states": torch.randn(5, 12, generator=g, dtype=torch.float64)}
        conds.append((cond, neg if scale is not None else None, scale))
        requests.append(dict(shape=SHAPES[i % len(SHAPES)], scheduler=name, scheduler_config=config,
                             num_inference_steps=4 + i, seed=3000 + i, conditioning=cond, guidance_scale=scale,
                             guidance_rescale=rescale, negative_conditioning=neg if scale is not None else None))
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=4) as sampler:
        results = [f.result(timeout=300) for f in submit_in_waves(sampler, requests, waves=2)]
    for request, (cond, neg, scale), result in zip(requests, conds, results):
        expected = diffusers_alone(model, request, torch.float64, cond=cond, neg=neg, scale=scale)
        # diffusers' Euler takes sigma_next - sigma in float32: from a zero-SNR start (sigma 4096,
        # latents ~4096) that is off by ~2e-4, ~3e-6 of the result; octopus's float64 is not.
        euler = request["scheduler"] == "EulerDiscreteScheduler"
        assert_matches(result.latents, expected, rtol=1e-5 if euler else 1e-6)


def float32_tolerance(request):
    """1e-5, except for DDIM's default configuration (epsilon prediction on the linear schedule,
    x0 clipped): x0 = (x - sqrt(1 - a) eps) / sqrt(a) with a = 4e-5 at t = 999 multiplies float32
    rounding by about 160. On the H100 diffusers' own float32 loop was 0.9-1.9e-5 away from the
    same loop with float64 scheduler arithmetic, and ours 2.0-2.3e-5; every other sampler
    configuration stayed within 1e-6."""
    default_ddim = request["scheduler"] == "DDIMScheduler" and not request["scheduler_config"]
    return 5e-5 if default_ddim else 1e-5


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
@pytest.mark.parametrize("dtype, graphs, lane", [(torch.float64, False, False), (torch.float32, False, False),
                                                 (torch.float32, True, False), (torch.float32, True, True)],
                         ids=["float64", "float32", "graphs", "graphs-priority-lane"])
def test_mixed_requests_match_diffusers_alone_cuda(dtype, graphs, lane):
    # TF32 and batch-size-dependent convolution algorithms would differ by far more than 1e-5.
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.enabled
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.enabled = False
    try:
        model = tiny_unet(dtype, "cuda")
        requests = requests_for(1, 16, max_steps=12)
        if lane:  # a third of them high priority: they iterate in the priority lane, beside the others
            requests = [r | dict(priority="high") if i % 3 == 1 else r for i, r in enumerate(requests)]
        streams = octopus.StreamScheduler(4)
        with torch.no_grad(), od.ContinuousSampler(model, max_batch=6, stream_scheduler=streams,
                                                   cuda_graphs=graphs, priority_lane=lane) as sampler:
            if graphs:  # every (shape, batch) call a graph from the start (others are captured on second use)
                lanes = 2 if lane else 1
                assert sampler.prepare_graphs(SHAPES, range(1, 7)) == lanes * len(SHAPES) * 6
            results = [f.result(timeout=300) for f in submit_in_waves(sampler, requests)]
            captured = sampler.stats()["graphs_captured"]
        assert streams.stats()["active"] == 0  # every lease came back
        assert (captured >= 18) == graphs
        for request, result in zip(requests, results):
            assert result.latents.device.type == "cuda"
            rtol = 1e-6 if dtype == torch.float64 else float32_tolerance(request)
            assert_matches(result.latents.cpu(), diffusers_alone(model, request, dtype, "cuda").cpu(), rtol=rtol)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.enabled = saved


class SlowModel(torch.nn.Module):
    """Each call keeps the GPU busy for about ``ms`` milliseconds (returning zeros) and records
    an event when it is done there, so tests can count the calls finished on the GPU."""

    def __init__(self, ms):
        super().__init__()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10**7)
        end.record()
        end.synchronize()
        self.cycles = int(10**7 * ms / start.elapsed_time(end))
        self.done: list[torch.cuda.Event] = []

    def forward(self, x, t, **kwargs):
        torch.cuda._sleep(self.cycles)
        self.done.append(torch.cuda.Event())
        self.done[-1].record()
        return torch.zeros_like(x)

    def finished(self):
        return sum(e.query() for e in list(self.done))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
@pytest.mark.parametrize("in_flight", [1, 3])
def test_the_host_runs_at_most_max_in_flight_iterations_ahead(in_flight):
    model, steps = SlowModel(20.0), 40
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=2, device="cuda", dtype=torch.float32,
                                               max_in_flight=in_flight) as sampler:
        sampler.submit(shape=(4, 8, 8), scheduler="DDIMScheduler", num_inference_steps=steps, seed=0)
        for _ in range(5):  # an unbounded host would have issued all 40 iterations at once
            time.sleep(0.02)
            issued = sampler.stats()["iterations"]
            finished = model.finished()  # read after: it only grows
            # An iteration is issued once one of the last max_in_flight has finished on the GPU.
            assert issued <= finished + in_flight + 1, (issued, finished)
    assert finished < steps - in_flight - 1  # the check above could fail


class GatedModel(torch.nn.Module):
    """A model that holds its calls number `pauses` (1: the first) until `release(call)`;
    records each call's batch size."""

    def __init__(self, model, pauses=(1,)):
        super().__init__()
        self.model, self.calls, self.batches = model, 0, []
        self.paused = {k: threading.Event() for k in pauses}
        self.gates = {k: threading.Event() for k in pauses}

    def forward(self, x, t, **kwargs):
        self.calls += 1
        if self.calls in self.gates:
            self.paused[self.calls].set()
            self.gates[self.calls].wait(timeout=60)
        self.batches.append(x.shape[0])
        return self.model(x, t, **kwargs)

    def wait_paused(self, call):
        assert self.paused[call].wait(timeout=60), f"the model never reached call {call}"

    def release(self, call=1):
        self.gates[call].set()


def blocked_sampler(max_batch=1, **options):
    """A sampler with one long request running and the model gated shut."""
    model = GatedModel(tiny_unet())
    sampler = od.ContinuousSampler(model, max_batch=max_batch, **options)
    blocker = sampler.submit(shape=(4, 8, 8), scheduler="DDIMScheduler", num_inference_steps=2, seed=0)
    model.wait_paused(1)
    return model, sampler, blocker


def finish_order(sampler, model, names_priorities_deadlines):
    order, futures = [], []
    for name, priority, deadline in names_priorities_deadlines:
        futures.append(sampler.submit(shape=(4, 8, 8), scheduler="EulerDiscreteScheduler", num_inference_steps=1,
                                      seed=1, priority=priority, deadline=deadline,
                                      callback=lambda latents, name=name: order.append(name)))
    model.release()  # every request is queued behind the blocker
    return order, futures


def test_priority_then_deadline_then_arrival():
    with torch.no_grad():
        model, sampler, blocker = blocked_sampler()
        order, futures = finish_order(sampler, model, [
            ("low", "low", None), ("normal-late", "normal", 60.0), ("normal-first", "normal", None),
            ("high", "high", None), ("normal-early", "normal", 30.0), ("urgent", 5, None)])
        for f in futures + [blocker]:
            f.result(timeout=120)
        sampler.close()
    assert order == ["urgent", "high", "normal-early", "normal-late", "normal-first", "low"]


def test_a_request_whose_deadline_passes_in_the_queue_fails_alone():
    with torch.no_grad():
        model, sampler, blocker = blocked_sampler()
        late = sampler.submit(shape=(4, 8, 8), scheduler="DDIMScheduler", num_inference_steps=1, seed=2, deadline=0.01)
        fine = sampler.submit(shape=(4, 8, 8), scheduler="DDIMScheduler", num_inference_steps=1, seed=3)
        time.sleep(0.1)
        model.release()
        with pytest.raises(octopus.DeadlineMissed, match="deadline"):
            late.result(timeout=120)
        assert fine.result(timeout=120).latents.shape == (4, 8, 8)
        assert sampler.stats()["expired"] == 1
        sampler.close()


@pytest.mark.parametrize("limit", ["max_batch", "memory_budget"])
def test_admission_respects_max_batch_and_memory_budget(limit):
    model = tiny_unet()
    one = 4 * 8 * 8 * 8 * 4  # float64 elements x (latents, model output, step output, one state row)
    options = dict(max_batch=2) if limit == "max_batch" else dict(max_batch=16, memory_budget=2 * one + 100)
    requests = [dict(shape=(4, 8, 8), scheduler="DPMSolverMultistepScheduler", num_inference_steps=2 + i % 3,
                     seed=i) for i in range(7)]
    with torch.no_grad(), od.ContinuousSampler(model, record_iterations=True, **options) as sampler:
        results = [f.result(timeout=300) for f in [sampler.submit(**r) for r in requests]]
        samples = [t["samples"] for t in sampler.iteration_timings()]
    assert max(samples) == 2
    for request, result in zip(requests, results):
        assert_matches(result.latents, diffusers_alone(model, request | dict(scheduler_config={}), torch.float64),
                       rtol=1e-6)


def test_a_request_larger_than_the_memory_budget_is_refused_at_submit():
    with od.ContinuousSampler(tiny_unet(), memory_budget=10_000) as sampler:
        with pytest.raises(ValueError, match="memory_budget"):
            sampler.submit(shape=(4, 64, 64), scheduler="DDIMScheduler", seed=0)


@pytest.mark.parametrize("lane", [False, True], ids=["one-lane", "priority-lane"])
def test_preemption_parks_a_low_priority_sample_and_resumes_it_exactly(lane):
    inner = tiny_unet()
    model = GatedModel(inner, pauses=(3,))  # holds the sampler in the low-priority request's third step
    low = dict(shape=(4, 8, 12), scheduler="UniPCMultistepScheduler", scheduler_config={}, num_inference_steps=8,
               seed=7)
    high = dict(shape=(4, 8, 8), scheduler="DPMSolverMultistepScheduler", scheduler_config={}, num_inference_steps=3,
                seed=8)
    order = []
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=1, preempt=True, priority_lane=lane) as sampler:
        low_future = sampler.submit(**low, priority="low", callback=lambda x: order.append("low"))
        model.wait_paused(3)
        high_future = sampler.submit(**high, priority="high", callback=lambda x: order.append("high"))
        model.release(3)
        low_result, high_result = low_future.result(timeout=300), high_future.result(timeout=300)
        assert sampler.stats()["parked"] >= 1
    assert order == ["high", "low"]
    assert_matches(low_result.latents, diffusers_alone(inner, low, torch.float64), rtol=1e-6)
    assert_matches(high_result.latents, diffusers_alone(inner, high, torch.float64), rtol=1e-6)


def test_high_priority_batch_caps_the_batch_while_high_priority_work_runs():
    model = GatedModel(tiny_unet(), pauses=(1, 2))
    with torch.no_grad(), od.ContinuousSampler(model, max_batch=4, high_priority_batch=1, preempt=True) as sampler:
        lows = [sampler.submit(shape=(4, 8, 8), scheduler="DDIMScheduler", num_inference_steps=12, seed=0,
                               priority="low")]
        model.wait_paused(1)  # the first low-priority request is in its first step
        lows += [sampler.submit(shape=(4, 8, 8), scheduler="DDIMScheduler", num_inference_steps=12, seed=i,
                                priority="low") for i in (1, 2)]
        model.release(1)
        model.wait_paused(2)  # all three in one step
        high = sampler.submit(shape=(4, 8, 8), scheduler="DDIMScheduler", num_inference_steps=3, seed=9,
                              priority="high")
        model.release(2)
        high.result(timeout=300)
        for f in lows:
            f.result(timeout=300)
        assert sampler.stats()["parked"] == 3
    assert model.batches[:2] == [1, 3]
    assert model.batches[2:5] == [1, 1, 1]  # the high-priority request's three steps ran alone
    assert model.batches[5] == 3  # then the parked ones went on together


class PickyModel(torch.nn.Module):
    """Fails any batch holding a sample whose conditioning is NaN."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, t, encoder_hidden_states):
        if torch.isnan(encoder_hidden_states).any():
            raise ValueError("bad conditioning")
        return self.model(x, t, encoder_hidden_states=encoder_hidden_states)


@pytest.mark.parametrize("lane", [False, True], ids=["one-lane", "priority-lane"])
def test_bad_conditioning_or_callback_fails_only_its_own_request(lane):
    inner = tiny_conditional_unet()
    g = torch.Generator().manual_seed(3)
    conds = [{"encoder_hidden_states": torch.randn(5, 12, generator=g, dtype=torch.float64)} for _ in range(4)]
    conds[1]["encoder_hidden_states"][2, 3] = float("nan")
    requests = [dict(shape=(4, 8, 8), scheduler="EulerDiscreteScheduler", scheduler_config={}, num_inference_steps=3,
                     seed=20 + i, conditioning=c) for i, c in enumerate(conds)]
    if lane:  # the failing request and a good one iterate in the priority lane
        requests[1]["priority"] = requests[2]["priority"] = "high"

    def broken(latents):
        raise RuntimeError("decoder exploded")

    with torch.no_grad(), od.ContinuousSampler(PickyModel(inner), max_batch=4, priority_lane=lane) as sampler:
        futures = [sampler.submit(**r, callback=broken if i == 3 else None) for i, r in enumerate(requests)]
        wrong_dtype = sampler.submit(shape=(4, 8, 8), scheduler="DDIMScheduler", seed=1, num_inference_steps=2,
                                     conditioning={"encoder_hidden_states": torch.zeros(5, 12, dtype=torch.complex64)})
        with pytest.raises(ValueError, match="bad conditioning"):
            futures[1].result(timeout=300)
        with pytest.raises(RuntimeError, match="decoder exploded"):
            futures[3].result(timeout=300)
        with pytest.raises(Exception):
            wrong_dtype.result(timeout=300)
        for i in (0, 2):
            expected = diffusers_alone(inner, requests[i], torch.float64, cond=conds[i])
            assert_matches(futures[i].result(timeout=300).latents, expected, rtol=1e-6)
        assert sampler.stats()["failed"] >= 2


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_each_family_of_graphs_is_captured_on_a_stream_of_its_own():
    """Graphs that may replay at once (different per-sample shapes) must not share a capture
    stream (its cuBLAS workspace); batch sizes of one family may; evicted families free theirs."""
    from octopus.diffusion.model_runner import CapturedCalls
    calls = CapturedCalls(lambda x, t: x @ x.transpose(-1, -2) + t.view(-1, 1, 1), max_graphs=4,
                          device=torch.device("cuda"), capture_priority=-1)
    for shape in [(1, 8, 8), (2, 8, 8), (1, 16, 16), (1, 4, 4)]:
        x = torch.randn(shape, device="cuda")
        t = torch.rand(shape[0], device="cuda")
        for _ in range(3):  # eager, captured, replayed
            torch.testing.assert_close(calls(x, t, {}), x @ x.transpose(-1, -2) + t.view(-1, 1, 1))
    streams = calls._capture_streams
    assert calls.captures == 4 and len(streams) == 3 and not calls.shared_workspaces
    assert len({s.cuda_stream for s in streams.values()}) == 3
    assert all(s.priority == torch.cuda.Stream(priority=-1).priority for s in streams.values())
    for shape in [(1, 5, 5), (1, 6, 6), (1, 7, 7)]:  # max_graphs 4: the first families are dropped
        x, t = torch.randn(shape, device="cuda"), torch.rand(1, device="cuda")
        for _ in range(2):
            calls(x, t, {})
    assert len(calls._graphs) == 4 and len(streams) == 4  # (1, 4, 4) and the three new ones
    # Another sampler's graphs (same shapes) get streams of their own too, while these live.
    other = CapturedCalls(lambda x, t: x + t.view(-1, 1, 1), max_graphs=4, device=torch.device("cuda"),
                          capture_priority=-1)
    for shape in [(1, 5, 5), (1, 6, 6), (1, 7, 7)]:
        x, t = torch.randn(shape, device="cuda"), torch.rand(1, device="cuda")
        for _ in range(2):
            other(x, t, {})
    mine = {s.cuda_stream for s in streams.values()}
    assert len(mine | {s.cuda_stream for s in other._capture_streams.values()}) == 7


def test_prepare_graphs_needs_cuda_graphs():
    with od.ContinuousSampler(tiny_unet()) as sampler:
        with pytest.raises(RuntimeError, match="cuda_graphs=True"):
            sampler.prepare_graphs([(4, 8, 8)], [1, 2])


def test_noise_alone_gives_the_shape():
    noise = torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), od.ContinuousSampler(tiny_unet(), scheduler="DDIMScheduler") as sampler:
        by_noise = sampler.submit(noise=noise, num_inference_steps=2).result(timeout=60)
        by_both = sampler.submit(noise=noise, shape=(4, 8, 8), num_inference_steps=2).result(timeout=60)
    assert by_noise.latents.shape == (4, 8, 8)
    assert torch.equal(by_noise.latents, by_both.latents)


def test_close_drains_and_leaves_no_thread():
    sampler = od.ContinuousSampler(tiny_unet(), max_batch=2, scheduler="DDIMScheduler")
    with torch.no_grad():
        futures = [sampler.submit(shape=(4, 8, 8), num_inference_steps=2, seed=i) for i in range(3)]
        sampler.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert not [t for t in threading.enumerate() if t.name.startswith("octopus-sampler")]
    with pytest.raises(RuntimeError, match="closed"):
        sampler.submit(shape=(4, 8, 8), seed=0)
    sampler.close()  # idempotent


@pytest.mark.parametrize("lane", [False, True], ids=["one-lane", "priority-lane"])
def test_close_with_cancel_cancels_queued_and_running_requests(lane):
    model, sampler, blocker = blocked_sampler(max_batch=1, priority_lane=lane)
    queued = [sampler.submit(shape=(4, 8, 8), scheduler="DDIMScheduler", num_inference_steps=3, seed=i,
                             priority="high" if i == 1 else "normal") for i in range(3)]
    threading.Timer(1.0, model.release).start()  # (close has long set its cancel flag by then)
    with torch.no_grad():
        sampler.close(cancel=True)
    for f in queued + [blocker]:
        with pytest.raises(Exception) as info:
            f.result(timeout=5)
        assert "Cancelled" in type(info.value).__name__
    assert sampler.stats()["cancelled"] == 4
    assert not [t for t in threading.enumerate() if t.name.startswith("octopus-sampler")]


def test_bad_requests_are_refused_at_submit():
    with od.ContinuousSampler(tiny_unet(), scheduler="DDIMScheduler") as sampler:
        cases = [
            (dict(shape=(4, 0, 8)), ValueError, "shape"),
            (dict(shape="448"), TypeError, "shape"),
            (dict(shape=(4, 8.5, 8)), TypeError, "shape"),
            (dict(shape=(4, 8, 8), num_inference_steps=0), ValueError, "num_inference_steps"),
            (dict(shape=(4, 8, 8), scheduler="HeunDiscreteScheduler"), ValueError, "not fused"),
            (dict(shape=(4, 8, 8), scheduler=3), TypeError, "scheduler"),
            (dict(shape=(4, 8, 8), scheduler="EulerDiscreteScheduler", eta=0.5), ValueError, "eta"),
            (dict(shape=(4, 8, 8), scheduler_config={"thresholding": True}), NotImplementedError, "thresholding"),
            (dict(shape=(4, 8, 8), noise=torch.zeros(4, 8, 9)), ValueError, r"noise must have the request's shape"),
            (dict(), ValueError, r"needs its latent's shape: shape=\(4, 64, 64\), say, or noise="),
            (dict(noise=[[1.0]]), TypeError, "noise must be a tensor"),
            (dict(shape=(4, 8, 8), guidance_scale=5.0), ValueError, "guidance_scale"),
            (dict(shape=(4, 8, 8), guidance_rescale=0.5), ValueError, "guidance_rescale needs guidance_scale"),
            (dict(shape=(4, 8, 8), conditioning={"c": torch.zeros(3)}, guidance_scale=5.0, guidance_rescale=1.5,
                  negative_conditioning={"c": torch.zeros(3)}), ValueError, r"guidance_rescale must be in \[0, 1\]"),
            (dict(shape=(4, 8, 8), conditioning={"c": torch.zeros(3)}, guidance_scale=5.0,
                  negative_conditioning={"c": torch.zeros(4)}), ValueError, "same keys and shapes"),
            (dict(shape=(4, 8, 8), conditioning={"c": [1, 2]}), TypeError, "conditioning"),
            (dict(shape=(4, 8, 8), priority="urgent"), ValueError, "priority"),
            (dict(shape=(4, 8, 8), deadline=-1), ValueError, "deadline"),
            (dict(shape=(4, 8, 8), callback=3), TypeError, "callback"),
            (dict(shape=(4, 8, 8), mu=0.5), ValueError, "mu"),
        ]
        for fields, error, match in cases:
            with pytest.raises(error, match=match):
                sampler.submit(**fields)
    with od.ContinuousSampler(tiny_unet()) as sampler:
        with pytest.raises(ValueError, match="no scheduler"):
            sampler.submit(shape=(4, 8, 8))
        # The request's own error first, not the missing default's.
        with pytest.raises(ValueError, match="num_inference_steps"):
            sampler.submit(shape=(4, 8, 8), num_inference_steps=0)
    for options, match in [(dict(max_batch=0), "max_batch"), (dict(memory_budget=0), "memory_budget"),
                           (dict(high_priority_batch=0), "high_priority_batch"), (dict(cuda_graphs=True), "CUDA"),
                           (dict(max_in_flight=0), "max_in_flight"), (dict(max_in_flight=1.5), "max_in_flight"),
                           (dict(dtype=torch.int32), "dtype")]:
        with pytest.raises((ValueError, TypeError), match=match):
            od.ContinuousSampler(tiny_unet(), **options).close()

"""``octopus-bench serving --pipeline NAME``: text-to-image serving end to end, prompts in and
images out, three servers on one request trace.

The pipeline: a diffusers ``StableDiffusionPipeline`` built from configs with random weights and
a CLIP tokenizer over a small vocabulary written at the start (nothing downloaded). ``sd``: the
shapes of Stable Diffusion 1.x (UNet of 320/640/1280/1280 channels with cross-attention to
768-wide text embeddings, a 12-layer CLIP text encoder, the 4-level VAE); ``tiny``: a few
million parameters, for a CPU smoke run. The run reports every component's parameter count.

Requests (seeded): a prompt of random words, 512 or 768 px square (``sd``; ``tiny``: 32 or 64),
``--steps`` steps, a sampler among DDIM, Euler, DPM-Solver++ 2M and UniPC, guidance 7.5,
``--high-share`` of them high priority, output as numpy images (post-processing counted).

Servers, by priority then arrival:

* ``pipeline``: the pipeline called once per request, its scheduler swapped for the request's
  (what a user writes today);
* ``step-level-graphs``: continuous batching at step level, as serving systems do it: a request's
  prompt is encoded when it joins, requests join and leave at any step, one classifier-free-
  guided UNet call per latent size and batch (in CUDA graphs per size and batch, captured before
  the run, on a GPU), one diffusers ``scheduler.step`` per request, and the requests that finish
  together decoded in one VAE call per size (the strongest plain server; eager on a CPU);
* ``octopus``: :class:`octopus.diffusion.PipelineServer` (on a GPU: CUDA graphs, and the
  high-priority requests in the sampler's priority lane with ``--normal-lane-pause``, strict
  priority by default; no prompt cache across batches, ``prompt_cache=0``: every run serves the
  same prompts, and the other servers encode every request's);
* ``octopus-priority`` (not run by default): the same server, with ``preempt`` and
  ``high_priority_batch=--priority-batch``: while a high-priority request waits or runs the
  batch is held to that many samples, lower-priority ones parked, so a high-priority request
  does not share every denoising call with a full batch.

Before anything is measured, the pipeline runs one short request per size (one-time costs: the
CUDA context's libraries, convolution algorithms), and both batching servers capture their
graphs for every size and batch.

Each server runs the trace at saturation (every request arriving at once: images/s) and at 60%
of octopus's saturated rate (latency p50 / p99, overall and high priority, from arrival to the
image). The high-priority p99 is also given over the p99 of the same requests served alone by
octopus (unloaded), and octopus's rows carry the device seconds of each stage (the text
encoder's and the VAE's calls, the sampler's iterations; post-processing on the host) and their
shares.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import torch

from octopus.diffusion.model_runner import CapturedCalls

from ..report import environment
from .measure import high_p99_over_unloaded, summarize
from .octopus_server import submit_at_arrivals, unloaded_latencies
from .peers import ArrivalLoop, finish, prepare_peer_graphs

PIPELINE_SAMPLERS: List[tuple[str, Dict[str, Any]]] = [
    ("DDIMScheduler", {}), ("EulerDiscreteScheduler", {}), ("DPMSolverMultistepScheduler", {}),
    ("UniPCMultistepScheduler", {})]
PIPELINE_SIZES = {"sd": (512, 768), "tiny": (32, 64)}
PIPELINE_MODES = ("pipeline", "step-level-graphs", "octopus", "octopus-priority")
DEFAULT_PIPELINE_MODES = PIPELINE_MODES[:3]
_WORDS = ("a photo of red blue green small large old new cat dog house tree river city night day mountain "
          "painting sketch portrait landscape bright dark").split()
GUIDANCE = 7.5


def _tokenizer(folder: str) -> Any:
    """A CLIP tokenizer over single characters and the workload's words (nothing downloaded)."""
    import transformers
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for token in [chr(c) for c in range(ord("a"), ord("z") + 1)] + list(_WORDS):
        vocab.setdefault(token, len(vocab))
        vocab.setdefault(token + "</w>", len(vocab))
    with open(os.path.join(folder, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(folder, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    return transformers.CLIPTokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"),
                                      model_max_length=77)


def make_pipeline(name: str, device: torch.device, dtype: torch.dtype) -> tuple[Any, Dict[str, int]]:
    """The pipeline of random weights, on ``device`` in ``dtype``, and its parameter counts."""
    import diffusers
    import transformers
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = _tokenizer(folder)
    torch.manual_seed(0)
    if name == "sd":
        text: Dict[str, Any] = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                    num_attention_heads=12)
        unet_config: Dict[str, Any] = dict(sample_size=64, cross_attention_dim=768, attention_head_dim=8)
        vae_config: Dict[str, Any] = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                                          down_block_types=("DownEncoderBlock2D",) * 4,
                                          up_block_types=("UpDecoderBlock2D",) * 4, sample_size=512)
    elif name == "tiny":
        text = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4)
        unet_config = dict(sample_size=8, block_out_channels=(16, 32), layers_per_block=1, norm_num_groups=8,
                           down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                           up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                           attention_head_dim=4)
        vae_config = dict(block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=4,
                          down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)
    else:
        raise ValueError(f"no pipeline {name!r}: 'sd' or 'tiny'")
    with torch.device(device):  # weights made where they run
        text_encoder = transformers.CLIPTextModel(transformers.CLIPTextConfig(
            vocab_size=len(tokenizer.get_vocab()), max_position_embeddings=77, **text))
        unet = diffusers.UNet2DConditionModel(in_channels=4, out_channels=4, **unet_config)
        vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, **vae_config)
    scheduler = diffusers.DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                                        clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    pipe = diffusers.StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                             scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                             requires_safety_checker=False)
    pipe = pipe.to(device=device, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    counts = {part: sum(p.numel() for p in getattr(pipe, part).parameters())
              for part in ("unet", "text_encoder", "vae")}
    return pipe, counts


def make_pipeline_workload(n: int, seed: int, high_share: float, sizes: tuple, steps: tuple) -> List[dict]:
    """n requests, all arriving at 0 (the runs scale the arrivals): prompt, size, sampler,
    steps, priority, seed; the gaps of a Poisson process of rate 1 in ``gap``."""
    g = torch.Generator().manual_seed(seed)
    gaps = torch.empty(n, dtype=torch.float64).exponential_(1.0, generator=g)
    arrivals = (torch.cumsum(gaps, 0) - gaps[0]).tolist()
    out = []
    for i in range(n):
        words = [_WORDS[int(j)] for j in torch.randint(len(_WORDS), (6,), generator=g)]
        name, config = PIPELINE_SAMPLERS[int(torch.randint(len(PIPELINE_SAMPLERS), (1,), generator=g))]
        size = sizes[int(torch.randint(len(sizes), (1,), generator=g))]
        out.append(dict(id=i, unit_arrival=arrivals[i], arrival=0.0, prompt=" ".join(words), size=size,
                        scheduler=name, config=config, seed=20_000 + i,
                        steps=int(torch.randint(steps[0], steps[1] + 1, (1,), generator=g)),
                        high=bool(torch.rand((), generator=g) < high_share)))
    return out


def at_rate(workload: List[dict], rate: float) -> List[dict]:
    """The trace with its Poisson arrivals at ``rate`` requests per second (inf: all at once)."""
    return [dict(r, arrival=0.0 if rate == float("inf") else r["unit_arrival"] / rate) for r in workload]


def _scheduler(pipe: Any, spec: dict) -> Any:
    import diffusers
    return getattr(diffusers, spec["scheduler"]).from_config(pipe.scheduler.config, **spec["config"])


@torch.no_grad()
def run_pipeline_alone(pipe: Any, workload: List[dict], device: torch.device, timeout: float) -> dict:
    """``pipeline``: one request at a time through the pipeline."""
    loop, base = ArrivalLoop(workload, timeout), pipe.scheduler
    completions: Dict[int, float] = {}
    try:
        while not loop.done() and not loop.expired():
            loop.idle_until_arrival()
            spec = loop.waiting.pop(0)
            pipe.scheduler = _scheduler(pipe, spec)
            pipe(spec["prompt"], height=spec["size"], width=spec["size"], num_inference_steps=spec["steps"],
                 guidance_scale=GUIDANCE, generator=torch.Generator().manual_seed(spec["seed"]), output_type="np")
            finish(completions, [spec["id"]], loop, device)
            loop.arrived()
    finally:
        pipe.scheduler = base
    return dict(completions=completions)


class GuidedRequest:
    """One request of the step-level server: its prompt encoded, its latents and scheduler as
    the pipeline prepares them."""

    def __init__(self, pipe: Any, spec: dict, device: torch.device):
        self.spec = spec
        self.scheduler = _scheduler(pipe, spec)
        self.scheduler.set_timesteps(spec["steps"], device=device)
        self.timesteps = list(self.scheduler.timesteps)
        embeds, negative = pipe.encode_prompt(spec["prompt"], device, 1, True)
        self.conditioning = torch.cat([negative, embeds])  # unconditional first, as the pipeline
        side = spec["size"] // pipe.vae_scale_factor
        g = torch.Generator().manual_seed(spec["seed"])
        x = torch.randn((1, pipe.unet.config.in_channels, side, side), generator=g, dtype=pipe.unet.dtype)
        self.x = x.to(device) * self.scheduler.init_noise_sigma
        self.k = 0

    @property
    def t(self) -> torch.Tensor:
        return self.timesteps[self.k]

    def model_input(self) -> torch.Tensor:
        return self.scheduler.scale_model_input(torch.cat([self.x, self.x]), self.t)

    def step(self, noise: torch.Tensor) -> bool:
        """Guidance and one scheduler step from the UNet's two outputs; True when done."""
        uncond, cond = noise.chunk(2)
        guided = uncond + GUIDANCE * (cond - uncond)
        self.x = self.scheduler.step(guided, self.t, self.x, return_dict=False)[0]
        self.k += 1
        return self.k == len(self.timesteps)


def _decode(pipe: Any, members: List[GuidedRequest]) -> Any:
    """One VAE call for requests of one size that finished together, post-processed as the
    pipeline does."""
    x = torch.cat([m.x for m in members]) / pipe.vae.config.scaling_factor
    image = pipe.vae.decode(x.to(pipe.vae.dtype), return_dict=False)[0]
    return pipe.image_processor.postprocess(image, output_type="np", do_denormalize=[True] * len(members))


@torch.no_grad()
def run_step_level(pipe: Any, workload: List[dict], device: torch.device, timeout: float, max_batch: int,
                   graphs: CapturedCalls | None, keep_images: bool = False) -> dict:
    """``step-level-graphs``: see the module's docstring. ``keep_images``: the result's
    ``images`` holds each request's image (to check the server against the pipeline)."""
    loop = ArrivalLoop(workload, timeout)
    completions: Dict[int, float] = {}
    images: Dict[int, Any] = {}
    active: List[GuidedRequest] = []
    model = graphs if graphs is not None else (lambda x, t, kwargs: pipe.unet(x, t, **kwargs).sample)
    while loop.admit(active, max_batch, lambda spec: GuidedRequest(pipe, spec, device)):
        groups: Dict[int, List[GuidedRequest]] = {}
        for m in active:
            groups.setdefault(m.spec["size"], []).append(m)
        finished: List[GuidedRequest] = []
        for members in groups.values():
            x = torch.cat([m.model_input() for m in members])
            t = torch.cat([torch.stack([m.t, m.t]) for m in members]).to(device=device, dtype=torch.float32)
            states = torch.cat([m.conditioning for m in members])
            noise = model(x, t, {"encoder_hidden_states": states})
            done = [m for j, m in enumerate(members) if m.step(noise[2 * j:2 * j + 2])]
            if done:
                decoded = _decode(pipe, done)
                if keep_images:
                    images.update((m.spec["id"], decoded[j]) for j, m in enumerate(done))
                finished += done
        if finished:
            finish(completions, [m.spec["id"] for m in finished], loop, device)
            active = [m for m in active if m not in finished]
        loop.arrived()
    return dict(completions=completions, images=images) if keep_images else dict(completions=completions)


def run_octopus(server: Any, workload: List[dict], timeout: float, high_priority_batch: int | None = None) -> dict:
    """``octopus``: each request submitted to the PipelineServer at its arrival; completed when
    its image is ready. Also the device seconds of each stage over the run (``stages``). With
    ``high_priority_batch`` (``octopus-priority``), the run preempts with that batch cap."""
    before = server.stats()
    server.sampler.iteration_timings()  # (those of earlier runs left out)
    sampler = server.sampler
    settings = sampler.preempt, sampler.high_priority_batch
    if high_priority_batch is not None:
        sampler.preempt, sampler.high_priority_batch = True, high_priority_batch
    futures: Dict[int, concurrent.futures.Future] = {}

    def submit(spec: dict) -> concurrent.futures.Future:
        futures[spec["id"]] = _submit(server, spec)
        return futures[spec["id"]]

    try:
        completions = submit_at_arrivals(workload, submit, timeout)
    finally:
        sampler.preempt, sampler.high_priority_batch = settings
    after = server.stats()
    stages = {stage: after[f"{stage}_s"] - before[f"{stage}_s"] for stage in ("encode", "decode", "postprocess")}
    stages["denoise"] = sum(t["iteration"] for t in server.sampler.iteration_timings()) / 1e3
    timings = {i: f.result().timing for i, f in futures.items() if i in completions}
    return dict(completions=completions, stages=stages, timings=timings)


def high_priority_timing(workload: List[dict], timings: Dict[int, Dict[str, float]]) -> Optional[dict]:
    """Where the high-priority requests' time went: the median of each part of their timing
    (``GeneratedImage.timing``) and the parts of the slowest one."""
    high = [timings[r["id"]] for r in workload if r["high"] and r["id"] in timings]
    if not high:
        return None
    return dict(median={k: statistics.median(t[k] for t in high) for k in high[0]},
                slowest=max(high, key=lambda t: t["total"]))


def _submit(server: Any, spec: dict) -> concurrent.futures.Future:
    return server.submit(spec["prompt"], guidance_scale=GUIDANCE, num_inference_steps=spec["steps"],
                         height=spec["size"], width=spec["size"], seed=spec["seed"], scheduler=spec["scheduler"],
                         scheduler_config=spec["config"] or None, priority="high" if spec["high"] else "normal",
                         output_type="np")


def run(args: Any) -> dict:
    """Every server at saturation, then at 60% of octopus's saturated rate."""
    from octopus.diffusion import PipelineServer
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    pipe, parameters = make_pipeline(args.pipeline, device, dtype)
    sizes = PIPELINE_SIZES[args.pipeline]
    trace = make_pipeline_workload(args.requests, args.seed, args.high_share, sizes, tuple(args.steps))
    # What both batching servers capture: every latent size at every guided batch (two rows a
    # sample), conditioned on one prompt's text embeddings.
    latent_shapes = [(pipe.unet.config.in_channels, s // pipe.vae_scale_factor, s // pipe.vae_scale_factor)
                     for s in sizes]
    guided_batches = [2 * n for n in range(1, args.max_batch + 1)]
    conditioning = {"encoder_hidden_states": torch.zeros(
        (pipe.tokenizer.model_max_length, pipe.text_encoder.config.hidden_size), device=device, dtype=dtype)}
    graphs = None
    if cuda and "step-level-graphs" in args.modes:
        print("warm-up: step-level-graphs (capturing CUDA graphs)", file=sys.stderr)
        graphs = CapturedCalls(pipe.unet, 2 * args.max_batch * len(sizes), device)  # (its .sample taken)
        prepare_peer_graphs(graphs, latent_shapes, guided_batches, device, pipe.unet.dtype, conditioning)
    print("warm-up: the pipeline, one short request per size", file=sys.stderr)
    for size in sizes:
        pipe("warm up", height=size, width=size, num_inference_steps=2, guidance_scale=GUIDANCE, output_type="np")
    lanes = dict(priority_lane=True, normal_lane_pause=args.normal_lane_pause) if cuda else {}
    server = (PipelineServer(pipe, max_batch=args.max_batch, cuda_graphs=cuda, prompt_cache=0, record_iterations=True,
                             **lanes)
              if {"octopus", "octopus-priority"} & set(args.modes) else None)
    runners = {"pipeline": lambda w: run_pipeline_alone(pipe, w, device, args.run_timeout),
               "step-level-graphs": lambda w: run_step_level(pipe, w, device, args.run_timeout, args.max_batch,
                                                             graphs),
               "octopus": lambda w: run_octopus(server, w, args.run_timeout),
               "octopus-priority": lambda w: run_octopus(server, w, args.run_timeout, args.priority_batch)}
    rows: List[dict] = []
    unloaded: Dict[int, float] = {}
    try:
        if server is not None:  # its graphs captured before it is measured, as the step-level server's
            print("warm-up: octopus" + (" (capturing CUDA graphs)" if cuda else ""), file=sys.stderr)
            if cuda:
                server.sampler.prepare_graphs(latent_shapes, guided_batches, conditioning=conditioning,
                                              priority_batch_sizes=guided_batches[:args.priority_batch])
            run_octopus(server, at_rate(trace[:min(len(trace), args.max_batch)], float("inf")), args.run_timeout)
            print("unloaded: each high-priority request alone through octopus", file=sys.stderr)
            unloaded = unloaded_latencies(functools.partial(_submit, server), trace)
        saturated: Dict[str, float] = {}
        for load, rate_of in (("saturation", lambda: float("inf")),
                              ("60% of octopus's saturated rate",
                               lambda: 0.6 * saturated.get("octopus", saturated.get("octopus-priority", 0.0)))):
            rate = rate_of()
            if not rate > 0:
                break
            workload = at_rate(trace, rate)
            for mode in args.modes:
                print(f"{load}: {mode}", file=sys.stderr)
                wall = time.perf_counter()
                raw = runners[mode](workload)
                row = summarize(workload, raw["completions"])
                row.update(mode=mode, load=load, rate=None if rate == float("inf") else rate,
                           wall_s=time.perf_counter() - wall, truncated=row["completed"] < len(workload),
                           high_p99_over_unloaded=high_p99_over_unloaded(row, unloaded))
                if "stages" in raw:
                    total = sum(raw["stages"].values())
                    row.update(stage_s=raw["stages"],
                               stage_share={k: v / total for k, v in raw["stages"].items()} if total else None,
                               high_timing=high_priority_timing(workload, raw["timings"]))
                if load == "saturation" and row["throughput"]:
                    saturated[mode] = row["throughput"]
                rows.append(row)
    finally:
        if server is not None:
            server.close()
    return dict(environment=environment(device), pipeline=dict(name=args.pipeline, parameters=parameters,
                                                               dtype=str(dtype), sizes=list(sizes)),
                settings={k: v for k, v in vars(args).items() if k != "out"}, rows=rows,
                unloaded_high_s={str(k): v for k, v in unloaded.items()})


def format_pipeline_table(result: dict) -> str:
    counts = ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in result["pipeline"]["parameters"].items())
    lines = [f"pipeline {result['pipeline']['name']} ({counts} parameters)",
             f"{'mode':<20} {'load':<32} {'images/s':>9} {'p50 s':>8} {'p99 s':>8} {'high p99':>9} "
             f"{'/unloaded':>9} {'done':>7}  encode/denoise/decode/post"]

    def fmt(value: Any, spec: str) -> str:
        width = int(spec.split(".")[0])
        return format(value, spec) if value is not None else "-".rjust(width)

    for r in result["rows"]:
        share = r.get("stage_share")
        shares = "/".join(f"{100 * share[k]:.0f}%" for k in ("encode", "denoise", "decode", "postprocess")) \
            if share else "-"
        lines.append(f"{r['mode']:<20} {r['load']:<32} {fmt(r['throughput'], '9.2f')} {fmt(r['p50_s'], '8.3f')} "
                     f"{fmt(r['p99_s'], '8.3f')} {fmt(r['high_p99_s'], '9.3f')} "
                     f"{fmt(r.get('high_p99_over_unloaded'), '9.2f')} {r['completed']:>3}/{r['requests']}  {shares}")
        if r.get("high_timing"):
            slowest = r["high_timing"]["slowest"]
            lines.append("    slowest high-priority request, s: " + ", ".join(
                f"{k.replace('_', ' ')} {v:.3f}" for k, v in slowest.items()))
    return "\n".join(lines)

#!/usr/bin/env python3
"""Text to image with continuous batching: prompts in, PNG files out, through
``octopus.diffusion.PipelineServer`` around a diffusers Stable Diffusion pipeline.

Clients: ``--clients`` threads submit ``--requests`` prompts arriving at ``--rate`` per second
overall (Poisson), each with its own size (``--sizes``), step count (``--steps``), sampler (the
pipeline's DDIM, Euler, Euler ancestral or DPM-Solver++), guidance scale, seed and priority
(``--high-share`` of them "high"). Server: one ``PipelineServer``: prompts encoded in batches
across requests, one continuously refilled denoising batch, the latents of requests that
finish together decoded in one VAE call; on a GPU the UNet's calls are CUDA graphs and the
decoding runs on a stream leased from an ``octopus.StreamScheduler``.

The pipeline: ``--model PATH`` loads one with ``StableDiffusionPipeline.from_pretrained`` (or
the SDXL one with ``--xl``; a local folder or a Hub id, which needs the network); without it,
a tiny Stable Diffusion pipeline built from configs with random weights and a tokenizer
written here (nothing is downloaded; ``--tiny`` keeps the run to seconds). Needs diffusers and
transformers.

Written to ``--out``: one PNG per request (``<id>_<priority>.png``) and, with ``--json``, the
latencies (p50/p99 overall and per priority, nearest rank, from submission to the image),
images/s over the run and every request's record. Checked and asserted: ``--check`` requests
(default 2) give the image the pipeline gives called alone with the same generator (8-bit
pixels equal to within 1, the rounding of float images).

    python3 examples/serve_text_to_image.py --tiny --device cpu
    python3 examples/serve_text_to_image.py --model ./stable-diffusion-v1-5 --requests 64 --rate 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import sys
import tempfile
import threading
import time

import torch

import octopus
from octopus import diffusion
from octopus._timing import percentile

SAMPLERS = (None, "EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler")
PROMPTS = ("a red boat on a lake", "a cat asleep on a mat", "mountains at dawn", "a city street in rain",
           "a bowl of fruit", "an owl in a tree")


def tiny_pipeline(device: torch.device, dtype: torch.dtype):
    """A Stable Diffusion pipeline of random weights built from configs (2.6M parameters)."""
    import diffusers
    import transformers
    folder = tempfile.mkdtemp()
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in string.ascii_lowercase + " ,.":
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    with open(os.path.join(folder, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(folder, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    torch.manual_seed(0)
    pipe = diffusers.StableDiffusionPipeline(
        tokenizer=transformers.CLIPTokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"),
                                             model_max_length=32),
        text_encoder=transformers.CLIPTextModel(transformers.CLIPTextConfig(
            vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2,
            max_position_embeddings=32, bos_token_id=0, eos_token_id=1, pad_token_id=1)),
        unet=diffusers.UNet2DConditionModel(
            sample_size=16, block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=64,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            norm_num_groups=8, attention_head_dim=8),
        vae=diffusers.AutoencoderKL(block_out_channels=(16, 32), down_block_types=("DownEncoderBlock2D",) * 2,
                                    up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=8, layers_per_block=1),
        scheduler=diffusers.DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                                          clip_sample=False, set_alpha_to_one=False, steps_offset=1),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device=device, dtype=dtype)


def load_pipeline(args, device: torch.device, dtype: torch.dtype):
    if args.model is None:
        return tiny_pipeline(device, dtype)
    import diffusers
    cls = diffusers.StableDiffusionXLPipeline if args.xl else diffusers.StableDiffusionPipeline
    pipe = cls.from_pretrained(args.model, torch_dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def workload(args, factor: int) -> list[dict]:
    """The requests, seeded: arrival time, prompt, size, steps, sampler, guidance, priority."""
    rng = random.Random(args.seed)
    t, out = 0.0, []
    for i in range(args.requests):
        t += rng.expovariate(args.rate)
        height, width = rng.choice(args.sizes)
        out.append(dict(id=i, arrival=t, prompt=rng.choice(PROMPTS), height=height * factor, width=width * factor,
                        num_inference_steps=rng.randint(*args.steps), scheduler=rng.choice(SAMPLERS),
                        guidance_scale=rng.choice((1.0, 5.0, 7.5)), seed=1000 + i,
                        priority="high" if rng.random() < args.high_share else "normal"))
    return out


def serve(server: diffusion.PipelineServer, requests: list[dict], clients: int) -> dict:
    """Each client thread submits its share at their arrival times; returns id -> (image, latency s)."""
    start, lock, done = time.perf_counter(), threading.Lock(), {}

    def client(mine):
        futures = []
        for r in mine:
            time.sleep(max(0.0, r["arrival"] - (time.perf_counter() - start)))
            submitted = time.perf_counter()
            kwargs = {k: v for k, v in r.items() if k not in ("id", "arrival") and v is not None}
            futures.append((r, submitted, server.submit(output_type="pil", **kwargs)))
        for r, submitted, future in futures:
            image = future.result()
            with lock:
                done[r["id"]] = (image, time.perf_counter() - submitted)

    threads = [threading.Thread(target=client, args=(requests[c::clients],)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done["wall_s"] = time.perf_counter() - start
    return done


def check(pipe, server_images: dict, requests: list[dict], count: int) -> int:
    """The largest 8-bit pixel difference between the server's images of the first `count`
    requests and the pipeline called alone with the same generator."""
    import numpy as np
    worst = 0
    for r in requests[:count]:
        base = pipe.scheduler
        if r["scheduler"] is not None:
            import diffusers
            pipe.scheduler = getattr(diffusers, r["scheduler"]).from_config(base.config)
        try:
            alone = pipe(r["prompt"], height=r["height"], width=r["width"], num_inference_steps=r["num_inference_steps"],
                         guidance_scale=r["guidance_scale"], generator=torch.Generator().manual_seed(r["seed"])).images[0]
        finally:
            pipe.scheduler = base
        got = np.asarray(server_images[r["id"]].images[0], dtype=np.int16)
        worst = max(worst, int(np.abs(got - np.asarray(alone, dtype=np.int16)).max()))
    return worst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a diffusers pipeline folder or Hub id (default: a tiny random one)")
    p.add_argument("--xl", action="store_true", help="--model is an SDXL pipeline")
    p.add_argument("--tiny", action="store_true", help="a short run: 12 requests, few steps")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rate", type=float, default=8.0, help="arrivals per second, all clients together")
    p.add_argument("--sizes", nargs="+", default=["16x16", "16x24", "24x16"], metavar="HxW",
                   help="latent sizes (the image is the VAE's scale factor larger)")
    p.add_argument("--steps", type=int, nargs=2, default=[8, 25], metavar=("MIN", "MAX"))
    p.add_argument("--high-share", type=float, default=0.2)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--check", type=int, default=2, help="requests checked against the pipeline called alone")
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="text_to_image_out")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.tiny:
        args.requests, args.steps, args.rate = 12, [3, 6], 40.0
    args.sizes = [tuple(int(v) for v in s.lower().split("x")) for s in args.sizes]
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and octopus.built_with_cuda else "cpu"))
    dtype = torch.float16 if device.type == "cuda" and args.model is not None else torch.float32
    pipe = load_pipeline(args, device, dtype)
    requests = workload(args, pipe.vae_scale_factor)
    streams = octopus.StreamScheduler(4) if device.type == "cuda" else None
    os.makedirs(args.out, exist_ok=True)
    with torch.no_grad(), diffusion.PipelineServer(pipe, max_batch=args.max_batch, stream_scheduler=streams,
                                                   cuda_graphs=device.type == "cuda") as server:
        done = serve(server, requests, args.clients)
        worst = check(pipe, {i: done[i][0] for i in range(args.requests)}, requests, args.check)
    wall = done.pop("wall_s")
    for r in requests:
        done[r["id"]][0].images[0].save(os.path.join(args.out, f"{r['id']:04d}_{r['priority']}.png"))
    latencies = {r["id"]: done[r["id"]][1] for r in requests}
    summary = dict(requests=len(requests), images_per_s=len(requests) / wall, wall_s=wall,
                   check_max_pixel_diff=worst, device=str(device), model=args.model or "tiny random")
    for name, ids in (("all", [r["id"] for r in requests]),
                      ("high", [r["id"] for r in requests if r["priority"] == "high"])):
        values = [latencies[i] for i in ids]
        summary[f"{name}_p50_s"] = percentile(values, 50) if values else None
        summary[f"{name}_p99_s"] = percentile(values, 99) if values else None
    print(json.dumps(summary, indent=1))
    print(f"{len(requests)} images in {args.out}/")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(summary=summary, requests=[dict(r, latency_s=latencies[r["id"]]) for r in requests]), f,
                      indent=1)
    assert worst <= 1, f"the server's images differ from the pipeline's alone by up to {worst} (8-bit)"
    return 0


if __name__ == "__main__":
    sys.exit(main())

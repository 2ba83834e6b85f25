"""octopus.diffusion.PipelineServer: a diffusers text-to-image pipeline served with continuous
batching. A tiny Stable Diffusion pipeline is built from configs with random weights and a
tokenizer made from a vocabulary file written here (nothing downloaded); every request's
image equals the pipeline called alone with the same generator."""

import json
import string
import time

import pytest
import torch

from octopus import diffusion as od

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")


def tiny_tokenizer(folder):
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in list(string.ascii_lowercase) + list("0123456789.,!?'"):
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = transformers.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=16)
    config = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=37, num_attention_heads=4,
                  num_hidden_layers=2, max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return tokenizer, config


def tiny_unet(cross_attention_dim, **added):
    return diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=cross_attention_dim, norm_num_groups=4, attention_head_dim=4, **added)


def tiny_vae():
    return diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"), block_out_channels=(8, 16), latent_channels=4,
        norm_num_groups=4, layers_per_block=1)


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    tokenizer, config = tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    torch.manual_seed(0)
    text_encoder = transformers.CLIPTextModel(transformers.CLIPTextConfig(**config))
    unet = tiny_unet(32)
    vae = tiny_vae()
    scheduler = diffusers.DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                                        clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    pipe = diffusers.StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                             scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                             requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def xl_pipe(tmp_path_factory):
    """A tiny SDXL pipeline: two text encoders (the second's pooled, projected embeddings and the
    time ids are the UNet's added conditioning)."""
    tokenizer, config = tiny_tokenizer(tmp_path_factory.mktemp("tokenizer_xl"))
    torch.manual_seed(1)
    pipe = diffusers.StableDiffusionXLPipeline(
        vae=tiny_vae(), text_encoder=transformers.CLIPTextModel(transformers.CLIPTextConfig(**config)),
        text_encoder_2=transformers.CLIPTextModelWithProjection(transformers.CLIPTextConfig(projection_dim=32, **config)),
        tokenizer=tokenizer, tokenizer_2=tokenizer,
        unet=tiny_unet(64, addition_embed_type="text_time", addition_time_embed_dim=8,
                       projection_class_embeddings_input_dim=6 * 8 + 32),
        scheduler=diffusers.EulerDiscreteScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                                                   steps_offset=1, timestep_spacing="leading"),
        add_watermarker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def sd3_pipe(tmp_path_factory):
    """A tiny Stable Diffusion 3 pipeline (two CLIP encoders with projections, no T5: the
    pipeline then uses zeros for it), its flow-matching scheduler with a per-resolution shift."""
    tokenizer, config = tiny_tokenizer(tmp_path_factory.mktemp("tokenizer_sd3"))
    torch.manual_seed(2)
    clip = [transformers.CLIPTextModelWithProjection(transformers.CLIPTextConfig(projection_dim=32, **config))
            for _ in range(2)]
    pipe = diffusers.StableDiffusion3Pipeline(
        transformer=diffusers.SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=4,
            joint_attention_dim=64, caption_projection_dim=32, pooled_projection_dim=64, out_channels=4),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_image_seq_len=8,
                                                            max_image_seq_len=64),
        vae=diffusers.AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                                    up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=4, layers_per_block=1,
                                    shift_factor=0.06, scaling_factor=1.5),
        text_encoder=clip[0], tokenizer=tokenizer, text_encoder_2=clip[1], tokenizer_2=tokenizer,
        text_encoder_3=None, tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pipeline_alone(pipe, request):
    """What a user writes today: the pipeline called for this prompt alone."""
    base = pipe.scheduler
    if "scheduler" in request:
        pipe.scheduler = getattr(diffusers, request["scheduler"]).from_config(base.config)
    try:
        kwargs = {k: v for k, v in request.items() if k not in ("seed", "scheduler")}
        return pipe(generator=torch.Generator().manual_seed(request["seed"]), **kwargs).images
    finally:
        pipe.scheduler = base


def assert_served_as_alone(pipe, requests):
    """The requests served together (a batch of 3) equal the pipeline called alone for each
    (tensor outputs: float32 to 1e-5 of the largest value)."""
    with torch.no_grad(), od.PipelineServer(pipe, max_batch=3) as server:
        results = [f.result(timeout=300) for f in [server.submit(**r) for r in requests]]
    for request, result in zip(requests, results):
        got, want = torch.as_tensor(result.images), torch.as_tensor(pipeline_alone(pipe, request))
        assert got.shape == want.shape, request
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_mixed_requests_equal_the_pipeline_called_alone(pipe):
    requests = [
        dict(prompt="a cat on a mat", num_inference_steps=4, seed=1, output_type="pt"),
        dict(prompt="a dog", negative_prompt="blurry", guidance_scale=3.0, guidance_rescale=0.7,
             num_inference_steps=6, height=16, width=24, seed=2, output_type="pt"),
        dict(prompt="a cat on a mat", guidance_scale=1.0, num_inference_steps=3, seed=3, output_type="np"),
        dict(prompt="red sky", scheduler="EulerDiscreteScheduler", num_inference_steps=5, seed=4, output_type="pt"),
        dict(prompt="red sky", scheduler="DPMSolverMultistepScheduler", num_inference_steps=5, height=24, width=16,
             seed=5, output_type="latent"),
        dict(prompt="a boat", scheduler="EulerAncestralDiscreteScheduler", num_inference_steps=4, seed=6,
             output_type="pil"),
    ]
    with torch.no_grad(), od.PipelineServer(pipe, max_batch=3) as server:
        futures = [server.submit(**r) for r in requests]
        results = [f.result(timeout=300) for f in futures]
    for request, result in zip(requests, results):
        expected = pipeline_alone(pipe, request)
        assert result.seed == request["seed"]
        if request["output_type"] == "pil":
            got = torch.tensor([list(p.getdata()) for p in result.images], dtype=torch.int16)
            want = torch.tensor([list(p.getdata()) for p in expected], dtype=torch.int16)
            assert (got - want).abs().max() <= 1  # uint8 rounding of float32 images
            continue
        got, want = torch.as_tensor(result.images), torch.as_tensor(expected)
        assert got.shape == want.shape, request
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_sdxl_requests_equal_the_pipeline_called_alone(xl_pipe):
    """SDXL: pooled embeddings and time ids per request (its own size), a missing negative
    prompt zeroed as the pipeline does, one with a negative prompt beside it."""
    requests = [
        dict(prompt="a cat", num_inference_steps=4, seed=1, output_type="pt"),
        dict(prompt="a dog", negative_prompt="blurry", guidance_scale=4.0, num_inference_steps=5, height=24,
             width=16, seed=2, output_type="pt"),
        dict(prompt="a cat", guidance_scale=1.0, num_inference_steps=3, width=24, seed=3, output_type="np"),
        dict(prompt="a boat", guidance_rescale=0.5, scheduler="DPMSolverMultistepScheduler", num_inference_steps=5,
             seed=4, output_type="pt"),
    ]
    assert_served_as_alone(xl_pipe, requests)


def test_a_vae_with_latent_statistics_decodes_as_the_pipeline_does(xl_pipe):
    """An SDXL VAE with latents_mean / latents_std: the latents are un-normalized with them
    before decoding, as the pipeline does (the statistics kept on the device)."""
    xl_pipe.vae.register_to_config(latents_mean=[0.1, -0.2, 0.3, 0.05], latents_std=[1.5, 0.5, 2.0, 1.1])
    try:
        assert_served_as_alone(xl_pipe, [dict(prompt="a cat", num_inference_steps=3, seed=1, output_type="pt"),
                                         dict(prompt="a dog", num_inference_steps=4, width=24, seed=2, output_type="pt")])
    finally:
        xl_pipe.vae.register_to_config(latents_mean=None, latents_std=None)


def test_sd3_requests_equal_the_pipeline_called_alone(sd3_pipe):
    """SD3: pooled projections, the flow-matching shift of each request's own resolution, the
    VAE's shift factor."""
    requests = [
        dict(prompt="a cat", num_inference_steps=4, seed=1, output_type="pt"),
        dict(prompt="a dog", negative_prompt="blurry", guidance_scale=4.0, num_inference_steps=5, height=24,
             width=16, seed=2, output_type="pt"),
        dict(prompt="a cat", guidance_scale=1.0, num_inference_steps=3, width=24, seed=3, output_type="latent"),
    ]
    assert_served_as_alone(sd3_pipe, requests)


def test_bad_requests_fail_their_own_future_and_the_others_finish(pipe):
    with torch.no_grad(), od.PipelineServer(pipe, max_batch=2) as server:
        good = server.submit("a cat", num_inference_steps=2, seed=1, output_type="pt")
        cases = [
            (server.submit("", num_inference_steps=2), ValueError, "prompt must be a non-empty string"),
            (server.submit("a cat", height=15), ValueError, "height must be a positive multiple of the VAE's scale"),
            (server.submit("a cat", output_type="png"), ValueError, "output_type"),
            (server.submit("a cat", scheduler_config={"thresholding": True}), NotImplementedError, "thresholding"),
            (server.submit("a cat", guidance_scale=1.0, guidance_rescale=0.5), ValueError, "guidance_rescale"),
            (server.submit("a cat", scheduler="HeunDiscreteScheduler"), ValueError, "not fused"),
        ]
        for future, error, match in cases:
            with pytest.raises(error, match=match):
                future.result(timeout=60)
        assert good.result(timeout=300).images.shape == (1, 3, 16, 16)


def test_pipelines_it_cannot_drive_are_refused(pipe):
    class Partial:
        tokenizer = pipe.tokenizer
        unet = pipe.unet
    with pytest.raises(TypeError, match="has no text_encoder, vae, scheduler, image_processor"):
        od.PipelineServer(Partial())

    class TwoEncoders(Partial):
        text_encoder = pipe.text_encoder
        text_encoder_2 = pipe.text_encoder
        vae = pipe.vae
        scheduler = pipe.scheduler
        image_processor = pipe.image_processor
    with pytest.raises(NotImplementedError, match="second text encoder with a UNet taking 'text_time'"):
        od.PipelineServer(TwoEncoders())


def test_prompts_are_encoded_once(pipe, monkeypatch):
    calls = []
    encode = pipe.encode_prompt

    def counting(prompts, *args, **kwargs):
        calls.append(list(prompts))
        return encode(prompts, *args, **kwargs)

    monkeypatch.setattr(pipe, "encode_prompt", counting)
    with torch.no_grad(), od.PipelineServer(pipe, max_batch=4) as server:
        first = [server.submit("a cat", num_inference_steps=2, seed=i, output_type="latent") for i in range(3)]
        [f.result(timeout=300) for f in first]
        server.submit("a cat", num_inference_steps=2, seed=9, output_type="latent").result(timeout=300)
    assert sum(p.count("a cat") for p in calls) == 1, calls


def test_stats_count_each_stage_and_time_it(pipe):
    with torch.no_grad(), od.PipelineServer(pipe, max_batch=4) as server:
        futures = [server.submit(prompt, num_inference_steps=2, seed=i, output_type="np")
                   for i, prompt in enumerate(["a cat", "a dog", "a cat"])]
        [f.result(timeout=300) for f in futures]
        stats = server.stats()
    assert stats["prompts_encoded"] == 2  # "a cat" once (the cache), "a dog" once
    assert stats["images_decoded"] == 3
    assert stats["sampler"]["completed"] == 3
    for stage in ("encode_s", "decode_s", "postprocess_s"):
        assert stats[stage] > 0, stage


def test_each_image_says_where_its_time_went(pipe):
    with torch.no_grad(), od.PipelineServer(pipe, max_batch=2) as server:
        started = time.perf_counter()
        futures = [server.submit(f"prompt {i}", num_inference_steps=3, seed=i, output_type="np") for i in range(4)]
        results = [f.result(timeout=300) for f in futures]
        waited = time.perf_counter() - started
    parts = ("encoding", "queued", "sampling", "decode_wait", "decoding")
    for result in results:
        timing = result.timing
        assert set(timing) == set(parts) | {"total"}
        assert all(timing[k] >= 0 for k in parts) and 0 < timing["total"] <= waited
        assert timing["queued"] == result.sampling.queued_s and timing["sampling"] == result.sampling.sampling_s
        # The parts follow each other: their sum is the total, but for the hand-offs between
        # the sampler's last step and its future's callback.
        assert sum(timing[k] for k in parts) <= timing["total"] + 1e-3
        assert sum(timing[k] for k in parts) >= 0.5 * timing["total"]
    assert max(r.timing["queued"] for r in results) > 0  # four requests, two at a time: some waited


def _request(priority, name):
    return od.pipeline_server._Request(name, None, 7.5, {}, (4, 8, 8), "latent", 0, None, priority)


def test_the_encoder_and_decoder_take_the_highest_priority_first():
    low, normal, high, high2 = _request(-1, "low"), _request(0, "n"), _request(1, "h"), _request(1, "h2")
    groups = od.pipeline_server._by_priority([normal, high, low, high2])
    assert [[r.prompt for r in g] for g in groups] == [["h", "h2"], ["n"], ["low"]]
    waiting = [(normal, "a"), (high, "b"), (low, "c"), (high2, "d"), (normal, "e")]
    turn, rest = od.pipeline_server._next_to_decode(waiting, limit=8)
    assert turn == [(high, "b"), (high2, "d")] and rest == [(normal, "a"), (low, "c"), (normal, "e")]
    turn, rest = od.pipeline_server._next_to_decode(rest, limit=1)  # at most `limit`, in finishing order
    assert turn == [(normal, "a")] and rest == [(low, "c"), (normal, "e")]


def test_decode_batch_must_be_a_positive_int(pipe):
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="decode_batch must be a positive int"):
            od.PipelineServer(pipe, decode_batch=bad)

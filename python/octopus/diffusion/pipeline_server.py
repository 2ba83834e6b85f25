"""A text-to-image server around a diffusers pipeline: prompts in, images out, with
continuous batching through encoding, denoising and decoding.

Three stages, each batched across requests:

* **encoding**: a thread drains the requests that arrived since its last turn and encodes
  their prompts (and negative prompts) in one call of the pipeline's own ``encode_prompt``,
  keeping the most recent embeddings in a small cache;
* **denoising**: a :class:`~octopus.diffusion.ContinuousSampler` over the pipeline's UNet, each
  request with its own size, sampler, step count, guidance and priority;
* **decoding**: a thread decodes the latents of the requests that finished together, one VAE
  call per latent size and at most ``decode_batch`` images (on a stream leased from the
  sampler's ``stream_scheduler`` where there is one, so decoding overlaps the sampler's next
  iterations), then post-processes them as the pipeline does (``output_type``).

Encoding and decoding follow the requests' priorities: the encoder encodes the highest
priority's prompts first, and the decoder takes the highest priority's finished requests
first, so a high-priority request waits behind at most one decode call of others.

Each request equals the pipeline called alone with the same seed: the same prompt encoding,
initial noise (``torch.randn`` of the latents' shape from ``torch.Generator().manual_seed(seed)``,
as a pipeline given that generator draws it), scheduler steps and step noise, guidance
(``guidance_rescale`` included), VAE decoding and post-processing.

Supported: pipelines with a CLIP-style ``tokenizer`` / ``text_encoder``, a ``vae`` and an
``image_processor``, and as denoiser either a ``UNet2DConditionModel`` ``unet`` (Stable
Diffusion 1.x and 2.x; SDXL: its second text encoder's pooled embeddings and the added time
ids, built per request from its size as the pipeline builds them) or an
``SD3Transformer2DModel`` ``transformer`` (Stable Diffusion 3: pooled projections, a
flow-matching scheduler whose dynamic shift, where configured, follows each request's
resolution). Others are refused with an error naming what is missing.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import inspect
import threading
import time
from typing import Any, Callable, Deque, Iterator, Sequence

import torch

from .._host_copies import constant
from ..scheduling import StreamScheduler
from ..scheduling.arguments import parse_priority
from .continuous import ContinuousSampler
from .requests import SampleResult, config_values

# What a pipeline needs for the server to drive it (and a unet or an SD3 transformer).
_COMPONENTS = ("tokenizer", "text_encoder", "vae", "scheduler", "image_processor")
_OUTPUT_TYPES = ("pil", "np", "pt", "latent")


@dataclasses.dataclass
class GeneratedImage:
    """What a request's future resolves to: ``images`` as the pipeline returns them for one
    prompt (``output_type``: a list of one PIL image, an ``[1, H, W, 3]`` array, a
    ``[1, 3, H, W]`` tensor, or the latents), the final ``latents``, the seed the request
    was sampled with, the sampler's account of it, and where its time went (``timing``,
    seconds on the host's clock: ``encoding`` from ``submit`` until its conditioning reached
    the sampler, ``queued`` and ``sampling`` as the sampler saw them, ``decode_wait`` from its
    last step until its VAE call began, ``decoding`` from then until its image was ready, and
    ``total``)."""

    images: Any
    latents: torch.Tensor
    seed: int
    sampling: SampleResult
    timing: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(eq=False)
class _Request:
    prompt: str
    negative_prompt: str | None
    guidance_scale: float
    fields: dict[str, Any]  # the rest of the ContinuousSampler request
    shape: tuple[int, ...]
    output_type: str
    seed: int
    future: concurrent.futures.Future[GeneratedImage]
    priority: int = 0  # the sampler's order (higher first): also the encoder's and the decoder's
    # perf_counter() when it was submitted, handed to the sampler, sampled, and its decoding began.
    times: dict[str, float] = dataclasses.field(default_factory=dict)

    def timing(self, result: SampleResult, done: float) -> dict[str, float]:
        t = self.times
        return dict(encoding=t["to_sampler"] - t["submitted"], queued=result.queued_s, sampling=result.sampling_s,
                    decode_wait=t["decoding"] - t["sampled"], decoding=done - t["decoding"],
                    total=done - t["submitted"])


class _StageClock:
    """Seconds spent in each stage's calls: device time between CUDA events recorded on the
    stage's stream around them on a GPU (added once the work is done there), the host clock
    on the CPU."""

    def __init__(self, device: torch.device):
        self._on_gpu = device.type == "cuda"
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = collections.defaultdict(float)
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        if self._on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            with self._lock:
                self._pending.append((stage, start, end))
                self._add_finished()  # (the list stays short however long the server runs)
            return
        began = time.perf_counter()
        yield
        self.add(stage, time.perf_counter() - began)

    def add(self, stage: str, seconds: float) -> None:
        """Host seconds spent in ``stage``."""
        with self._lock:
            self._seconds[stage] += seconds

    def seconds(self) -> dict[str, float]:
        """Every stage's seconds so far (waiting for the device's work measured until now)."""
        with self._lock:
            ends = [end for _, _, end in self._pending]
        for end in ends:  # outside the lock: the stages' threads go on meanwhile
            end.synchronize()
        with self._lock:
            self._add_finished()
            return dict(self._seconds)

    def _add_finished(self) -> None:
        """Adds the pairs whose work is done on the device (under the lock)."""
        unfinished = []
        for stage, start, end in self._pending:
            if end.query():
                self._seconds[stage] += start.elapsed_time(end) / 1e3
            else:
                unfinished.append((stage, start, end))
        self._pending = unfinished


def _by_priority(requests: list[_Request]) -> list[list[_Request]]:
    """The requests in groups of one priority, highest first, each in arrival order."""
    ranks = sorted({r.priority for r in requests}, reverse=True)
    return [[r for r in requests if r.priority == rank] for rank in ranks]


def _next_to_decode(waiting: list[tuple[_Request, SampleResult]], limit: int
                    ) -> tuple[list[tuple[_Request, SampleResult]], list[tuple[_Request, SampleResult]]]:
    """The decoder's next turn: of the finished requests waiting, the highest priority's
    first ``limit`` (in the order they finished); and the others, left for later turns."""
    top = max(r.priority for r, _ in waiting)
    chosen = [item for item in waiting if item[0].priority == top][:limit]
    taken = {id(item) for item in chosen}
    return chosen, [item for item in waiting if id(item) not in taken]


def _family(pipe: Any) -> str:
    """Which pipeline family the server drives: "sd", "sdxl" or "sd3" (TypeError /
    NotImplementedError naming what is missing or unsupported)."""
    missing = [name for name in _COMPONENTS if getattr(pipe, name, None) is None]
    if getattr(pipe, "unet", None) is None and getattr(pipe, "transformer", None) is None:
        missing.append("unet (or transformer)")
    if missing:
        raise TypeError(f"PipelineServer needs a pipeline with {', '.join(_COMPONENTS)} and a unet or an SD3 "
                        f"transformer; {type(pipe).__name__} has no {', '.join(missing)}")
    if getattr(pipe, "unet", None) is None:
        if type(pipe.transformer).__name__ != "SD3Transformer2DModel":
            raise NotImplementedError(f"the denoiser is a {type(pipe.transformer).__name__}: PipelineServer drives "
                                      "UNet2DConditionModel pipelines and SD3Transformer2DModel ones")
        if not hasattr(pipe, "encode_prompt"):
            raise TypeError(f"{type(pipe).__name__} has no encode_prompt")
        return "sd3"
    config = pipe.unet.config
    added = getattr(config, "addition_embed_type", None)
    if added not in (None, "text_time"):
        raise NotImplementedError(f"the UNet takes added conditioning {added!r}, which PipelineServer does not build "
                                  "(it builds SDXL's 'text_time')")
    if (added == "text_time") != (getattr(pipe, "text_encoder_2", None) is not None):
        raise NotImplementedError(f"{type(pipe).__name__}: PipelineServer drives a second text encoder with a UNet "
                                  "taking 'text_time' conditioning (SDXL) and neither otherwise")
    if getattr(config, "time_cond_proj_dim", None) is not None:
        raise NotImplementedError("the UNet takes a guidance embedding (time_cond_proj_dim, LCM): not supported")
    if not hasattr(pipe, "encode_prompt"):
        raise TypeError(f"{type(pipe).__name__} has no encode_prompt")
    return "sdxl" if added == "text_time" else "sd"


class _AddedConditionUNet(torch.nn.Module):
    """SDXL's UNet as the sampler calls models: its added conditioning (pooled text embeddings
    and time ids) as keyword tensors of their own."""

    def __init__(self, unet: torch.nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, x: torch.Tensor, t: torch.Tensor, encoder_hidden_states: torch.Tensor,
                text_embeds: torch.Tensor, time_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.unet(x, t, encoder_hidden_states=encoder_hidden_states,
                                      added_cond_kwargs={"text_embeds": text_embeds, "time_ids": time_ids}).sample
        return out


class _SD3Transformer(torch.nn.Module):
    """SD3's transformer as the sampler calls models: (latents, timesteps, **conditioning)."""

    def __init__(self, transformer: torch.nn.Module):
        super().__init__()
        self.transformer = transformer

    def forward(self, x: torch.Tensor, t: torch.Tensor, encoder_hidden_states: torch.Tensor,
                pooled_projections: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.transformer(hidden_states=x, timestep=t, encoder_hidden_states=encoder_hidden_states,
                                             pooled_projections=pooled_projections, return_dict=False)[0]
        return out


class PipelineServer:
    """Serves a diffusers text-to-image pipeline (Stable Diffusion 1.x / 2.x, SDXL, SD3) with
    continuous batching. ``max_batch``, ``stream_scheduler``, ``cuda_graphs`` and the other
    keyword arguments go to the :class:`~octopus.diffusion.ContinuousSampler` over the
    pipeline's UNet or transformer (whose default sampler is the pipeline's scheduler).
    ``prompt_cache``: how many encoded prompts to keep; ``decode_batch``: the most images one
    VAE call decodes (a high-priority request that finishes waits behind at most one such
    call). Use it as a context manager, or call :meth:`close`."""

    def __init__(self, pipe: Any, *, max_batch: int = 32, stream_scheduler: StreamScheduler | None = None,
                 prompt_cache: int = 256, decode_batch: int = 8, **sampler_options: Any):
        self._kind = _family(pipe)
        if isinstance(prompt_cache, bool) or not isinstance(prompt_cache, int) or prompt_cache < 0:
            raise ValueError(f"prompt_cache must be a non-negative int, got {prompt_cache!r}")
        if isinstance(decode_batch, bool) or not isinstance(decode_batch, int) or decode_batch < 1:
            raise ValueError(f"decode_batch must be a positive int, got {decode_batch!r}")
        self._decode_batch = decode_batch
        self.pipe = pipe
        self._call_parameters = inspect.signature(pipe.__call__).parameters
        self._denoiser = pipe.transformer if self._kind == "sd3" else pipe.unet
        self.device = self._denoiser.device
        self._streams = stream_scheduler
        model: Callable[..., Any] = self._denoiser
        if self._kind == "sdxl":
            model = _AddedConditionUNet(pipe.unet)
        elif self._kind == "sd3":
            model = _SD3Transformer(pipe.transformer)
        self.sampler = ContinuousSampler(model, max_batch=max_batch, scheduler=pipe.scheduler,
                                         stream_scheduler=stream_scheduler, device=self.device,
                                         dtype=self._denoiser.dtype, **sampler_options)
        # (prompt, negative prompt, guided) -> the conditioning tensors of the prompt and its negative
        self._cache: collections.OrderedDict[tuple[str, str | None, bool],
                                             tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]] = \
            collections.OrderedDict()
        self._cache_size = prompt_cache
        self._lock = threading.Condition()
        self._to_encode: Deque[_Request] = collections.deque()
        self._to_decode: list[tuple[_Request, SampleResult]] = []
        self._closing = False
        self._counts = dict(prompts_encoded=0, images_decoded=0)
        self._clock = _StageClock(self.device)
        self._sampled_all = False  # closing, and the sampler has finished every request
        self._encoder = threading.Thread(target=self._encode_loop, name="octopus-pipeline-encoder", daemon=True)
        self._decoder = threading.Thread(target=self._decode_loop, name="octopus-pipeline-decoder", daemon=True)
        self._encoder.start()
        self._decoder.start()

    # -- the API ----------------------------------------------------------------------

    @property
    def vae_scale_factor(self) -> int:
        return int(getattr(self.pipe, "vae_scale_factor", 2 ** (len(self.pipe.vae.config.block_out_channels) - 1)))

    def submit(self, prompt: str, negative_prompt: str | None = None, *, guidance_scale: float | None = None,
               guidance_rescale: float = 0.0, num_inference_steps: int | None = None, height: int | None = None,
               width: int | None = None, seed: int | None = None, scheduler: Any = None,
               scheduler_config: dict[str, Any] | None = None, eta: float = 0.0, priority: int | str = "normal",
               deadline: float | None = None, output_type: str = "pil") -> concurrent.futures.Future[GeneratedImage]:
        """One image for ``prompt``; returns a future of :class:`GeneratedImage`. The
        arguments are the pipeline's, with its defaults (``guidance_scale`` and
        ``num_inference_steps`` those of its ``__call__``; ``height`` and ``width`` the UNet's
        sample size times the VAE's scale factor; ``guidance_scale`` > 1 turns classifier-free
        guidance on, as in the pipeline), plus ``seed`` (the pipeline's ``generator`` would
        be ``torch.Generator().manual_seed(seed)``; None: a random one), a sampler other than
        the pipeline's (``scheduler``: a name or class, with the pipeline's scheduler config under
        ``scheduler_config``'s options), ``priority`` and ``deadline``
        (see :class:`~octopus.diffusion.ContinuousSampler`). A bad request fails its own
        future with an error naming the argument; the others go on."""
        future: concurrent.futures.Future[GeneratedImage] = concurrent.futures.Future()
        try:
            request = self._request(prompt, negative_prompt, guidance_scale, guidance_rescale, num_inference_steps,
                                    height, width, seed, scheduler, scheduler_config, eta, priority, deadline,
                                    output_type, future)
        except Exception as error:  # noqa: BLE001 (this request's own failure)
            future.set_exception(error)
            return future
        request.times["submitted"] = time.perf_counter()
        with self._lock:
            if self._closing:
                raise RuntimeError("the PipelineServer is closed")
            self._to_encode.append(request)
            self._lock.notify_all()
        return future

    def close(self) -> None:
        """Finishes the requests already submitted, then stops the threads and the sampler."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._encoder.join()
        self.sampler.close()
        with self._lock:
            self._sampled_all = True
            self._lock.notify_all()
        self._decoder.join()

    def stats(self) -> dict[str, Any]:
        """``prompts_encoded`` and ``images_decoded`` so far, ``encode_s`` and ``decode_s``: the
        seconds their calls took (device time on a GPU: the text encoder, the VAE; host time on
        the CPU), ``postprocess_s``: host time turning decoded images into the output type,
        and the sampler's :meth:`~octopus.diffusion.ContinuousSampler.stats` under ``sampler``."""
        seconds = self._clock.seconds()
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
        out.update({f"{stage}_s": seconds.get(stage, 0.0) for stage in ("encode", "decode", "postprocess")})
        out["sampler"] = self.sampler.stats()
        return out

    def __enter__(self) -> "PipelineServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests ---------------------------------------------------------------------

    def _request(self, prompt: Any, negative_prompt: Any, guidance_scale: float | None, guidance_rescale: float,
                 num_inference_steps: int | None, height: int | None, width: int | None, seed: int | None,
                 scheduler: Any, scheduler_config: dict[str, Any] | None, eta: float, priority: int | str,
                 deadline: float | None, output_type: str,
                 future: concurrent.futures.Future[GeneratedImage]) -> _Request:
        if guidance_scale is None:
            guidance_scale = self._call_default("guidance_scale", 7.5)
        if num_inference_steps is None:
            num_inference_steps = self._call_default("num_inference_steps", 50)
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
        if negative_prompt is not None and not isinstance(negative_prompt, str):
            raise TypeError(f"negative_prompt must be a string or None, got {type(negative_prompt).__name__}")
        if output_type not in _OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {_OUTPUT_TYPES}, got {output_type!r}")
        factor = self.vae_scale_factor
        default = int(self._denoiser.config.sample_size) * factor
        height, width = height or default, width or default
        for name, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % factor:
                raise ValueError(f"{name} must be a positive multiple of the VAE's scale factor {factor}, "
                                 f"got {value!r}")
        rank = parse_priority(priority)
        seed = int(torch.randint(0, 2 ** 62, ()).item()) if seed is None else int(seed)
        shape = (int(self._denoiser.config.in_channels), height // factor, width // factor)
        fields = dict(shape=shape, num_inference_steps=num_inference_steps, seed=seed, eta=eta, priority=priority,
                      deadline=deadline, guidance_rescale=guidance_rescale)
        if scheduler is not None or scheduler_config is not None:
            # Another sampler, or other options, over the pipeline's scheduler config (as
            # `OtherScheduler.from_config(pipe.scheduler.config)` would give it).
            base = config_values(self.pipe.scheduler.config)
            fields["scheduler"] = scheduler if scheduler is not None else type(self.pipe.scheduler).__name__
            fields["scheduler_config"] = dict(base, **(scheduler_config or {}))
        return _Request(prompt, negative_prompt, float(guidance_scale), fields, shape, output_type, seed, future,
                        rank)

    def _call_default(self, name: str, fallback: Any) -> Any:
        """The default of the pipeline's ``__call__`` argument ``name`` (SD: guidance 7.5, SDXL: 5.0)."""
        parameter = self._call_parameters.get(name)
        return fallback if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default

    # -- encoding ---------------------------------------------------------------------

    def _encode_loop(self) -> None:
        while True:
            with self._lock:
                while not self._to_encode and not self._closing:
                    self._lock.wait()
                if not self._to_encode and self._closing:
                    return
                batch = list(self._to_encode)
                self._to_encode.clear()
            for group in _by_priority(batch):
                self._encode_and_submit(group)

    def _encode_and_submit(self, batch: list[_Request]) -> None:
        """Encodes the batch's uncached prompts in one call per guidance mode (and, guided,
        per whether a negative prompt is given: SDXL zeroes a missing one), then hands each
        request to the sampler."""
        for guided, no_negative in ((True, True), (True, False), (False, True), (False, False)):
            members = [r for r in batch if (r.guidance_scale > 1) == guided and (r.negative_prompt is None) == no_negative]
            keys = list(dict.fromkeys((r.prompt, r.negative_prompt) for r in members if
                                      (r.prompt, r.negative_prompt, guided) not in self._cache))
            if keys:
                try:
                    self._encode(keys, guided)
                except Exception as error:  # noqa: BLE001 (those requests fail; the server goes on)
                    for r in members:
                        if (r.prompt, r.negative_prompt, guided) not in self._cache:
                            r.future.set_exception(error)
            for r in members:
                if r.future.done():
                    continue
                cond, negative = self._cache[(r.prompt, r.negative_prompt, guided)]
                self._cache.move_to_end((r.prompt, r.negative_prompt, guided))
                self._submit(r, cond, negative)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    @torch.no_grad()
    def _encode(self, keys: list[tuple[str, str | None]], guided: bool) -> None:
        """The pipeline's own encode_prompt over every key at once (their negative prompts all
        given, or all None)."""
        prompts = [p for p, _ in keys]
        negatives = None if keys[0][1] is None else [n for _, n in keys]
        with self._clock.measure("encode"):
            if self._kind == "sd":
                embeds, negative = self.pipe.encode_prompt(prompts, self.device, 1, guided, negative_prompt=negatives)
            else:
                extra = dict(prompt_2=None, prompt_3=None) if self._kind == "sd3" else {}
                embeds, negative, pooled, negative_pooled = self.pipe.encode_prompt(
                    prompts, device=self.device, num_images_per_prompt=1, do_classifier_free_guidance=guided,
                    negative_prompt=negatives, **extra)
        with self._lock:
            self._counts["prompts_encoded"] += len(keys)
        pooled_name = {"sdxl": "text_embeds", "sd3": "pooled_projections"}.get(self._kind)
        for i, (p, n) in enumerate(keys):
            cond = {"encoder_hidden_states": embeds[i]}
            uncond = {"encoder_hidden_states": negative[i]} if guided else None
            if pooled_name is not None:
                cond[pooled_name] = pooled[i]
                if uncond is not None:
                    uncond[pooled_name] = negative_pooled[i]
            self._cache[(p, n, guided)] = (cond, uncond)

    def _time_ids(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """SDXL's added time ids for an image of the request's size, as the pipeline builds them
        by default: original size = target size = (height, width), crop at (0, 0); kept on the
        device per size (a copy from the host at every request would wait for the stream)."""
        height, width = shape[1] * self.vae_scale_factor, shape[2] * self.vae_scale_factor
        return constant([height, width, 0, 0, height, width], dtype, self.device)

    def _submit(self, r: _Request, cond: dict[str, torch.Tensor], negative: dict[str, torch.Tensor] | None) -> None:
        if self._kind == "sdxl":
            time_ids = self._time_ids(r.shape, cond["encoder_hidden_states"].dtype)
            cond = dict(cond, time_ids=time_ids)
            negative = dict(negative, time_ids=time_ids) if negative is not None else None
        fields = dict(r.fields, conditioning=cond)
        if negative is not None:
            fields.update(negative_conditioning=negative, guidance_scale=r.guidance_scale)
        elif fields["guidance_rescale"]:
            r.future.set_exception(ValueError("guidance_rescale needs guidance_scale > 1 (classifier-free guidance)"))
            return
        r.times["to_sampler"] = time.perf_counter()
        try:
            sampled = self.sampler.submit(**fields)
        except Exception as error:  # noqa: BLE001 (this request's own failure)
            r.future.set_exception(error)
            return
        sampled.add_done_callback(self._sampled_callback(r))

    def _sampled_callback(self, r: _Request) -> Callable[[concurrent.futures.Future[SampleResult]], None]:
        def done(sampled: concurrent.futures.Future[SampleResult]) -> None:
            error = sampled.exception()
            if error is not None:
                r.future.set_exception(error)
                return
            r.times["sampled"] = time.perf_counter()
            with self._lock:
                self._to_decode.append((r, sampled.result()))
                self._lock.notify_all()
        return done

    # -- decoding ---------------------------------------------------------------------

    def _decode_loop(self) -> None:
        while True:
            with self._lock:
                while not self._to_decode and not self._sampled_all:
                    self._lock.wait()
                if not self._to_decode:
                    return
                batch, self._to_decode = _next_to_decode(self._to_decode, self._decode_batch)
            self._decode(batch)

    @torch.no_grad()
    def _decode(self, batch: list[tuple[_Request, SampleResult]]) -> None:
        """One VAE call per latent shape and output type for the requests that finished
        together, on a leased stream where the sampler has a scheduler."""
        groups: dict[tuple[tuple[int, ...], str], list[tuple[_Request, SampleResult]]] = {}
        for r, result in batch:
            groups.setdefault((r.shape, r.output_type), []).append((r, result))
        for (_, output_type), members in groups.items():
            began = time.perf_counter()
            for r, _ in members:
                r.times["decoding"] = began
            try:
                images = self._decode_group([result.latents for _, result in members], output_type)
            except Exception as error:  # noqa: BLE001 (those requests fail; the server goes on)
                for r, _ in members:
                    r.future.set_exception(error)
                continue
            with self._lock:
                self._counts["images_decoded"] += len(members)
            done = time.perf_counter()
            for (r, result), image in zip(members, images):
                r.future.set_result(GeneratedImage(image, result.latents, r.seed, result, r.timing(result, done)))

    def _decode_group(self, latents: Sequence[torch.Tensor], output_type: str) -> list[Any]:
        x = torch.stack(list(latents)).to(self.device, self.pipe.vae.dtype)
        if output_type == "latent":
            return [x[i:i + 1] for i in range(x.shape[0])]
        lease = None
        if self._streams is not None and self.device.type == "cuda":
            lease = self._streams.acquire("octopus.pipeline.decode", priority="normal", device=self.device)
        try:
            stream = lease.stream if lease is not None else None
            if stream is not None:
                consumer = torch.cuda.current_stream(self.device)
                stream.wait_stream(consumer)
                with torch.cuda.stream(stream), self._clock.measure("decode"):
                    image = self._vae_decode(x)
                consumer.wait_stream(stream)
                image.record_stream(consumer)  # made on the lease's stream, used on this one
            else:
                with self._clock.measure("decode"):
                    image = self._vae_decode(x)
        finally:
            if lease is not None:
                lease.release()
        if image.is_cuda and output_type in ("np", "pil"):  # (they copy to the host: wait there, untimed)
            torch.cuda.current_stream(image.device).synchronize()
        began = time.perf_counter()
        processed = self.pipe.image_processor.postprocess(image, output_type=output_type,
                                                          do_denormalize=[True] * image.shape[0])
        self._clock.add("postprocess", time.perf_counter() - began)
        if output_type == "pil":
            return [[p] for p in processed]
        return [processed[i:i + 1] for i in range(image.shape[0])]

    def _vae_decode(self, x: torch.Tensor) -> torch.Tensor:
        """The latents unscaled (SD3's VAE: and shifted; SDXL's: denormalized with its latents mean
        and std where its config has them) and decoded, in float32 where a float16 VAE asks for it
        (force_upcast), as the pipelines do; SDXL's watermark applied where the pipeline has one."""
        vae, config = self.pipe.vae, self.pipe.vae.config
        upcast = vae.dtype == torch.float16 and getattr(config, "force_upcast", False)
        if upcast:
            vae.to(dtype=torch.float32)
        try:
            x = x.to(next(iter(vae.post_quant_conv.parameters())).dtype) if upcast else x
            mean, std = getattr(config, "latents_mean", None), getattr(config, "latents_std", None)
            shift = getattr(config, "shift_factor", None)
            if shift is not None:  # SD3's VAE
                x = x / config.scaling_factor + shift
            elif mean is not None and std is not None:
                shape = (1, x.shape[1], 1, 1)
                # Kept on the device; through float32 as the pipelines round them.
                mean_t = constant(torch.tensor(mean).tolist(), x.dtype, x.device).view(shape)
                std_t = constant(torch.tensor(std).tolist(), x.dtype, x.device).view(shape)
                x = x * std_t / config.scaling_factor + mean_t
            else:
                x = x / config.scaling_factor
            image: torch.Tensor = vae.decode(x, return_dict=False)[0]
        finally:
            if upcast:
                vae.to(dtype=torch.float16)
        watermark = getattr(self.pipe, "watermark", None)
        return watermark.apply_watermark(image) if watermark is not None else image

"""What a caller asks the continuous sampler for, and what it gets back.

A :class:`SamplingRequest` is checked and resolved on the caller's thread when it is
submitted (its scheduler becomes a :class:`~octopus.diffusion.rows.SamplerRow`, its
initial noise is drawn), so that bad input raises at ``submit`` and the sampling loop only
ever sees requests it can run.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import time
from typing import Any, Callable, Mapping, Sequence

import torch

from ..scheduling.arguments import parse_priority
from . import schedulers
from .rows import SamplerRow

_SCHEDULERS = {cls.__name__: cls for cls in (schedulers.DDIMScheduler, schedulers.DDPMScheduler,
                                            schedulers.EulerDiscreteScheduler,
                                            schedulers.EulerAncestralDiscreteScheduler,
                                            schedulers.FlowMatchEulerDiscreteScheduler,
                                            schedulers.DPMSolverMultistepScheduler,
                                            schedulers.UniPCMultistepScheduler)}


@dataclasses.dataclass
class SamplingRequest:
    """One image (or any latent) to sample.

    Args:
        shape: the latent's shape, e.g. ``(4, 64, 64)``; requests of different shapes share
            the running batch (each shape is its own model call). None: the shape of
            ``noise`` (one of the two is needed).
        num_inference_steps: steps of its schedule.
        scheduler: its sampler: an ``octopus.diffusion`` scheduler (instance or class), a
            diffusers scheduler (instance or class) or either's class name; None: the
            sampler's default. Its configuration is ``scheduler_config`` (a diffusers config
            dict, as ``from_config`` takes it) over the scheduler's own.
        seed: seeds the initial noise, drawn on the CPU as ``torch.randn(shape,
            generator=torch.Generator().manual_seed(seed))``, and the step noise of stochastic
            samplers (DDPM, Euler ancestral, DPM-Solver++ SDE, DDIM with ``eta`` > 0) from the
            same generator, in the order and shape diffusers draws it; without a seed, a random
            one.
        noise: the initial noise itself (of ``shape``, where that is given), instead of a
            seed. Either is scaled by the scheduler's ``init_noise_sigma``.
        conditioning: keyword arguments of the model for this sample, tensors without the
            batch dimension (e.g. ``encoder_hidden_states`` of shape ``[77, 768]``).
        negative_conditioning: the unconditional counterpart, for classifier-free guidance.
        guidance_scale: classifier-free guidance ``uncond + scale * (cond - uncond)``, the
            model run on both halves in one batch; None: no guidance.
        guidance_rescale: diffusers' ``rescale_noise_cfg`` (Lin et al. 2023, for zero-SNR
            models) on the guided prediction: blended with itself rescaled to the standard
            deviation of the conditional prediction, by this factor in [0, 1] (0: off).
        eta: DDIM's stochasticity.
        mu: the time shift of a flow-matching scheduler with use_dynamic_shifting; without it,
            the sampler computes it from the latents' resolution as SD3 and Flux pipelines do
            (:meth:`~octopus.diffusion.FlowMatchEulerDiscreteScheduler.mu_for`, 2x2 patches).
        priority: ``"low"``, ``"normal"``, ``"high"`` or an int (higher first).
        deadline: seconds from submission by which the request must have started; later,
            it fails with :class:`octopus.DeadlineMissed`. Within a priority, earlier deadlines
            are admitted first.
        callback: called with the final latents (``shape``, on the sampler's device) on the
            sampler's finishing thread under ``torch.no_grad()``, e.g. to decode them; its
            return value is the result's ``output``. If it raises, the request's future gets
            the exception.
    """

    shape: Sequence[int] | None = None
    num_inference_steps: int = 50
    scheduler: Any = None
    scheduler_config: Mapping[str, Any] | None = None
    seed: int | None = None
    noise: torch.Tensor | None = None
    conditioning: Mapping[str, torch.Tensor] | None = None
    negative_conditioning: Mapping[str, torch.Tensor] | None = None
    guidance_scale: float | None = None
    guidance_rescale: float = 0.0
    eta: float = 0.0
    mu: float | None = None
    priority: int | str = "normal"
    deadline: float | None = None
    callback: Callable[[torch.Tensor], Any] | None = None


@dataclasses.dataclass
class SampleResult:
    """What a request's future resolves to: the final latents, the callback's output (None
    without a callback), and where the time went."""

    latents: torch.Tensor
    output: Any = None
    queued_s: float = 0.0     # from submission to the first step
    sampling_s: float = 0.0   # from the first step to the last one's completion
    iterations: int = 0       # sampler iterations the request took part in (its steps)


def config_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a diffusers scheduler config as ``from_config`` passes them on: without
    private keys, and without the ones its scheduler left at their defaults
    (``_use_default_values``: another class then uses its own defaults for them, as diffusers'
    ``OtherScheduler.from_config(config)`` does)."""
    defaults = set(config.get("_use_default_values", ()))
    return {k: v for k, v in dict(config).items() if not k.startswith("_") and k not in defaults}


def resolve_scheduler(spec: Any, config: Mapping[str, Any] | None,
                      cache: dict[tuple[type, str], schedulers._BatchedScheduler]) -> schedulers._BatchedScheduler:
    """The ``octopus.diffusion`` scheduler a request names (built once per class and config)."""
    if isinstance(spec, schedulers._BatchedScheduler):
        if config:
            raise ValueError("scheduler_config cannot be combined with a scheduler instance (pass its class)")
        return spec
    base: Mapping[str, Any] = {}
    if isinstance(spec, str):
        name = spec
    elif isinstance(spec, type):
        name = spec.__name__
    elif isinstance(spec, Mapping) and "_class_name" in spec:
        name, base = spec["_class_name"], spec
    elif hasattr(spec, "config"):  # a diffusers scheduler instance
        name, base = type(spec).__name__, spec.config
    else:
        raise TypeError(f"scheduler must be an octopus.diffusion or diffusers scheduler (instance or class), its "
                        f"name, or a diffusers config with _class_name; got {type(spec).__name__}")
    cls = _SCHEDULERS.get(name)
    if cls is None:
        raise ValueError(f"scheduler {name!r} is not fused by octopus; choose from {sorted(_SCHEDULERS)}")
    merged = config_values(base)
    merged.update(config or {})
    key = (cls, repr(sorted(merged.items())))
    if key not in cache:
        cache[key] = cls.from_config(merged)
    return cache[key]


def sampler_row(scheduler: schedulers._BatchedScheduler, request: SamplingRequest,
                shape: Sequence[int]) -> SamplerRow:
    """The request's sampler as one row of the fused step's tables (``shape``: its latents')."""
    steps = request.num_inference_steps
    options: dict[str, float] = {}
    if request.eta:
        if not isinstance(scheduler, schedulers.DDIMScheduler):
            raise ValueError(f"eta is a DDIM option; {type(scheduler).__name__} has none")
        if request.eta < 0:
            raise ValueError(f"eta must be non-negative, got {request.eta}")
        options["eta"] = float(request.eta)
    if request.mu is not None:
        if not isinstance(scheduler, schedulers.FlowMatchEulerDiscreteScheduler):
            raise ValueError(f"mu is a flow-matching option; {type(scheduler).__name__} has none")
        options["mu"] = float(request.mu)
    elif isinstance(scheduler, schedulers.FlowMatchEulerDiscreteScheduler) and scheduler.use_dynamic_shifting:
        options["mu"] = scheduler.mu_for(shape)  # per resolution, as SD3 and Flux pipelines compute it
    return scheduler.sampler_row(steps, **options)


def check_request(request: SamplingRequest) -> tuple[tuple[int, ...], int, float | None]:
    """The request's (shape, priority, absolute deadline); ValueError / TypeError naming the field."""
    if not isinstance(request, SamplingRequest):
        raise TypeError(f"request must be a SamplingRequest, got {type(request).__name__}")
    if request.noise is not None and not isinstance(request.noise, torch.Tensor):
        raise TypeError(f"noise must be a tensor, got {type(request.noise).__name__}")
    if request.shape is None:
        if request.noise is None:
            raise ValueError("a request needs its latent's shape: shape=(4, 64, 64), say, or noise= of that shape")
        given_shape: Any = tuple(request.noise.shape)
    else:
        given_shape = request.shape
    try:
        if isinstance(given_shape, (str, bytes)):
            raise TypeError
        shape = tuple(operator.index(s) for s in given_shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {request.shape!r}") from None
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"shape must be positive extents, e.g. (4, 64, 64), got {shape}")
    if request.noise is not None and tuple(request.noise.shape) != shape:
        raise ValueError(f"noise must have the request's shape {shape}, got {tuple(request.noise.shape)}")
    steps = request.num_inference_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"num_inference_steps must be a positive int, got {steps!r}")
    priority = parse_priority(request.priority)
    deadline = None
    if request.deadline is not None:
        finite = isinstance(request.deadline, (int, float)) and math.isfinite(request.deadline)
        if not finite or request.deadline <= 0:
            raise ValueError(f"deadline must be a positive number of seconds from now, got {request.deadline!r}")
        deadline = time.monotonic() + float(request.deadline)
    if request.callback is not None and not callable(request.callback):
        raise TypeError("callback must be callable")
    for name in ("conditioning", "negative_conditioning"):
        value = getattr(request, name)
        if value is None:
            continue
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                     for k, v in value.items()):
            raise TypeError(f"{name} must be a mapping of model keyword names to tensors")
    if request.guidance_scale is not None:
        cond, neg = request.conditioning or {}, request.negative_conditioning or {}
        if not cond or not neg:
            raise ValueError("guidance_scale needs conditioning and negative_conditioning")
        if {k: tuple(v.shape) for k, v in cond.items()} != {k: tuple(v.shape) for k, v in neg.items()}:
            raise ValueError("negative_conditioning must have the same keys and shapes as conditioning")
        if not math.isfinite(float(request.guidance_scale)):
            raise ValueError(f"guidance_scale must be finite, got {request.guidance_scale}")
    elif request.negative_conditioning is not None:
        raise ValueError("negative_conditioning without guidance_scale would be unused")
    if not 0.0 <= float(request.guidance_rescale) <= 1.0:
        raise ValueError(f"guidance_rescale must be in [0, 1], got {request.guidance_rescale}")
    if request.guidance_rescale and request.guidance_scale is None:
        raise ValueError("guidance_rescale needs guidance_scale (it rescales the guided prediction)")
    return shape, priority, deadline

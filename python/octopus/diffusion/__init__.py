"""Per-sample diffusion sampler steps, and the continuous sampler they enable.

- Batched versions of diffusers' schedulers (:class:`DDIMScheduler`, :class:`DDPMScheduler`,
  :class:`EulerDiscreteScheduler`, :class:`EulerAncestralDiscreteScheduler`,
  :class:`FlowMatchEulerDiscreteScheduler`, :class:`DPMSolverMultistepScheduler`,
  :class:`UniPCMultistepScheduler`): one fused launch steps a batch in which every sample is
  at its own timestep of its own schedule.
- :class:`ContinuousSampler`: requests of any latent shape, sampler, step count, guidance
  scale and priority join a running batch at any step and leave when done; one model call
  per latent shape and one fused step for all per iteration.
- :class:`PipelineServer`: a diffusers text-to-image pipeline served with continuous batching
  (prompts in, images out).
- :class:`PerSampleStepper`: any diffusers scheduler, one copy per sample.
- The fused step's tables (:mod:`octopus.diffusion.rows`): every sampler is one row
  (:class:`SamplerRow`), so samples of different samplers share one step kernel.
"""

from .per_sample_stepper import PerSampleStepper
from .continuous import ContinuousSampler
from .pipeline_server import GeneratedImage, PipelineServer
from .requests import SampleResult, SamplingRequest
from .rows import PREDICTION_TYPES, SAMPLER_KINDS, SamplerRow
from .schedulers import (DDIMScheduler, DDPMScheduler, DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler,
                         EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler)

__all__ = ["DDIMScheduler", "DDPMScheduler", "EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler",
           "FlowMatchEulerDiscreteScheduler", "PipelineServer", "GeneratedImage",
           "DPMSolverMultistepScheduler", "UniPCMultistepScheduler", "ContinuousSampler", "SamplingRequest",
           "SampleResult", "PerSampleStepper", "SamplerRow", "SAMPLER_KINDS",
           "PREDICTION_TYPES"]

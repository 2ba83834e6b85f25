"""Batched versions of diffusers' schedulers: one fused launch steps a whole batch in which
every sample has its own timestep (and, optionally, its own schedule).

Each scheduler mirrors the diffusers scheduler of the same name for the configurations
listed in its docstring, computes its tables (timesteps, sigmas or alphas_cumprod) the way
diffusers does as one :class:`~octopus.diffusion.rows.SamplerRow` per schedule, keeps them
on the device, and calls ``torch.ops.octopus.sampler_step``, which looks up each sample's
step from its timestep, computes that sample's coefficients (on CUDA into a small table, one
warp a sample) and updates its latents in one kernel whatever the mix of samplers. Latents are dense ``[N, ...]`` tensors or a :class:`~octopus.RaggedBatch`
(samples of different resolutions or frame counts).

A timestep < 0 leaves its sample unchanged, so samples that have finished, or have not
started yet, can ride along in the batch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence, Tuple, TypeVar, Union, cast

import numpy as np
import torch

from .._host_copies import to_device
from ..affine import affine
from ..ragged import RaggedBatch
from .rows import RowTables, SamplerRow, fused_step, state_tensor

# What a model trained for diffusion predicts (flow_euler's "flow" is its own).
_PREDICTIONS = ("epsilon", "v_prediction", "sample")

Latents = Union[torch.Tensor, RaggedBatch]
"""Latents as the schedulers take them, a dense ``[N, ...]`` tensor or a :class:`~octopus.RaggedBatch`."""
TimestepsLike = Union[torch.Tensor, Sequence[float], float]
"""One timestep per sample (a 1-D tensor or a sequence), or one for all (a negative one leaves its
sample as it is)."""
_Scheduler = TypeVar("_Scheduler", bound="_BatchedScheduler")


def _zero_terminal_snr(betas: torch.Tensor) -> torch.Tensor:
    """diffusers' ``rescale_zero_terminal_snr`` (Lin et al. 2023), in float32 as diffusers: the
    betas shifted and scaled so that the last timestep's signal is exactly zero."""
    alphas_bar_sqrt = torch.cumprod(1.0 - betas, dim=0).sqrt()
    first, last = alphas_bar_sqrt[0].clone(), alphas_bar_sqrt[-1].clone()
    alphas_bar_sqrt -= last
    alphas_bar_sqrt *= first / (first - last)
    alphas_bar = alphas_bar_sqrt ** 2
    alphas = torch.cat([alphas_bar[0:1], alphas_bar[1:] / alphas_bar[:-1]])
    return 1 - alphas


def _alphas_cumprod(num_train_timesteps: int, beta_schedule: str, beta_start: float, beta_end: float,
                    rescale_betas_zero_snr: bool = False) -> torch.Tensor:
    """diffusers' training schedule (computed in float32 as diffusers does), as float64; with
    ``rescale_betas_zero_snr``, rescaled to a zero terminal SNR (the last entry is then 0: the
    sigma schedulers put diffusers' 2**-24 there, so that the first sigma is finite)."""
    if beta_schedule == "linear":
        betas = torch.linspace(beta_start, beta_end, num_train_timesteps, dtype=torch.float32)
    elif beta_schedule == "scaled_linear":
        betas = torch.linspace(beta_start ** 0.5, beta_end ** 0.5, num_train_timesteps, dtype=torch.float32) ** 2
    elif beta_schedule == "squaredcos_cap_v2":
        def alpha_bar(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
        betas = torch.tensor([min(1 - alpha_bar((i + 1) / num_train_timesteps) / alpha_bar(i / num_train_timesteps), 0.999)
                              for i in range(num_train_timesteps)], dtype=torch.float32)
    else:
        raise NotImplementedError(f"beta_schedule {beta_schedule!r} is not supported "
                                  "(use 'linear', 'scaled_linear' or 'squaredcos_cap_v2')")
    if rescale_betas_zero_snr:
        betas = _zero_terminal_snr(betas)
    return torch.cumprod(1.0 - betas, dim=0).double()


def _sigma_alphas_cumprod(num_train_timesteps: int, beta_schedule: str, beta_start: float, beta_end: float,
                          rescale_betas_zero_snr: bool) -> torch.Tensor:
    """The float32 training schedule of the sigma schedulers: a zero-SNR one ends at 2**-24,
    as diffusers', not 0 (its first sigma would be infinite)."""
    ac = _alphas_cumprod(num_train_timesteps, beta_schedule, beta_start, beta_end, rescale_betas_zero_snr).float()
    if rescale_betas_zero_snr:
        ac[-1] = 2 ** -24
    return ac


def _spaced(num_train_timesteps: int, steps: int, spacing: str, steps_offset: int, integer: bool) -> np.ndarray:
    """Timesteps for `steps` inference steps, descending, as diffusers spaces them."""
    if spacing == "linspace":
        t: np.ndarray = np.linspace(0, num_train_timesteps - 1, steps)[::-1]
        return np.round(t) if integer else t.copy()
    if spacing == "leading":
        ratio = num_train_timesteps // steps
        leading: np.ndarray = (np.arange(0, steps) * ratio).round()[::-1] + steps_offset
        return leading
    if spacing == "trailing":
        return np.round(np.arange(num_train_timesteps, 0, -num_train_timesteps / steps)) - 1
    raise NotImplementedError(f"timestep_spacing {spacing!r} is not supported (use 'linspace', 'leading' or 'trailing')")


def _sigma_to_t(sigmas: np.ndarray, log_sigmas: np.ndarray) -> np.ndarray:
    """diffusers' ``_sigma_to_t`` for every sigma at once (the same arithmetic): each sigma's
    fractional training timestep, interpolated in log sigma."""
    log_sigma = np.log(np.maximum(sigmas, 1e-10))
    dists = log_sigma[np.newaxis, :] - log_sigmas[:, np.newaxis]
    low = np.cumsum(dists >= 0, axis=0).argmax(axis=0).clip(max=log_sigmas.shape[0] - 2)
    w = np.clip((log_sigmas[low] - log_sigma) / (log_sigmas[low] - log_sigmas[low + 1]), 0, 1)
    t: np.ndarray = (1 - w) * low + w * (low + 1)
    return t


def _karras_sigmas(in_sigmas: np.ndarray, steps: int, sigma_min: float | None, sigma_max: float | None) -> np.ndarray:
    """Karras et al.'s schedule (rho 7) from sigma_max down to sigma_min (default: the ends of
    ``in_sigmas``, descending), as diffusers' ``_convert_to_karras``."""
    lo = sigma_min if sigma_min is not None else in_sigmas[-1].item()
    hi = sigma_max if sigma_max is not None else in_sigmas[0].item()
    rho = 7.0
    ramp = np.linspace(0, 1, steps)
    sigmas: np.ndarray = (hi ** (1 / rho) + ramp * (lo ** (1 / rho) - hi ** (1 / rho))) ** rho
    return sigmas


def _exponential_sigmas(in_sigmas: np.ndarray, steps: int, sigma_min: float | None,
                        sigma_max: float | None) -> np.ndarray:
    """Sigmas evenly spaced in log sigma, as diffusers' ``_convert_to_exponential``."""
    lo = sigma_min if sigma_min is not None else in_sigmas[-1].item()
    hi = sigma_max if sigma_max is not None else in_sigmas[0].item()
    sigmas: np.ndarray = np.exp(np.linspace(math.log(hi), math.log(lo), steps))
    return sigmas


def _scipy_stats() -> Any:
    """scipy.stats, which beta sigmas need (as in diffusers), or ImportError saying so."""
    try:
        import scipy.stats
    except ImportError as error:
        raise ImportError("use_beta_sigmas needs scipy, as in diffusers: pip install scipy") from error
    return scipy.stats


def _beta_sigmas(in_sigmas: np.ndarray, steps: int, sigma_min: float | None, sigma_max: float | None) -> np.ndarray:
    """Sigmas at the quantiles of a Beta(0.6, 0.6) distribution between sigma_max and
    sigma_min, as diffusers' ``_convert_to_beta`` (which also needs scipy)."""
    scipy_stats = _scipy_stats()
    lo = sigma_min if sigma_min is not None else in_sigmas[-1].item()
    hi = sigma_max if sigma_max is not None else in_sigmas[0].item()
    ppf = np.array([scipy_stats.beta.ppf(q, 0.6, 0.6) for q in 1 - np.linspace(0, 1, steps)])
    sigmas: np.ndarray = lo + ppf * (hi - lo)
    return sigmas


# The sigma schedules a config may ask for instead of the training schedule's own sigmas.
_SIGMA_SCHEDULES = {"karras": _karras_sigmas, "exponential": _exponential_sigmas, "beta": _beta_sigmas}


def _sigma_schedule(use_karras_sigmas: bool | None, use_exponential_sigmas: bool | None,
                    use_beta_sigmas: bool | None) -> str | None:
    chosen = [name for name, on in (("karras", use_karras_sigmas), ("exponential", use_exponential_sigmas),
                                    ("beta", use_beta_sigmas)) if on]
    if len(chosen) > 1:
        raise ValueError("use_karras_sigmas, use_exponential_sigmas and use_beta_sigmas are exclusive: choose one")
    if chosen == ["beta"]:
        _scipy_stats()  # needed: said at construction, not at set_timesteps
    return chosen[0] if chosen else None


def _training_timesteps(num_train_timesteps: int, num_inference_steps: int, spacing: str,
                        steps_offset: int) -> tuple[int, np.ndarray]:
    """(steps, integer training timesteps as float64) of DDIM's and DDPM's schedules."""
    steps = int(num_inference_steps)
    if steps > num_train_timesteps:
        raise ValueError(f"num_inference_steps ({steps}) cannot exceed num_train_timesteps ({num_train_timesteps})")
    t = _spaced(num_train_timesteps, steps, spacing, steps_offset, integer=True)
    return steps, t.astype(np.int64).astype(np.float64)


def _reject(config: Mapping[str, Any], unsupported: Mapping[str, Any]) -> None:
    for key, allowed in unsupported.items():
        if key not in config:
            continue
        try:
            supported = config[key] in allowed
        except TypeError:  # an unhashable value (a list of betas, say) is never one of the defaults
            supported = False
        if not supported:
            raise NotImplementedError(f"{key}={config[key]!r} is not supported by octopus's fused step "
                                      f"(supported: {sorted(map(repr, allowed))})")


class _BatchedScheduler:
    """The shared part: per-row tables on the device, argument checks, and the step call."""

    _config_keys: Tuple[str, ...] = ()
    _unsupported: dict[str, Any] = {}  # config key -> the values octopus supports

    @classmethod
    def from_config(cls: type[_Scheduler], config: Any, **overrides: Any) -> _Scheduler:
        """Builds the scheduler from a diffusers scheduler config (a dict, a FrozenDict, or an
        object with ``.config``); diffusers itself is not needed. Options octopus does not
        fuse raise NotImplementedError."""
        config = dict(getattr(config, "config", config))
        config.update(overrides)
        _reject(config, cls._unsupported)
        return cls(**{k: config[k] for k in cls._config_keys if k in config})

    def __init__(self, num_train_timesteps: int, prediction_type: str):
        if prediction_type not in _PREDICTIONS:
            raise ValueError(f"prediction_type must be one of {sorted(_PREDICTIONS)}, got {prediction_type!r}")
        self.num_train_timesteps = int(num_train_timesteps)
        self.prediction_type = prediction_type
        self.timesteps: list[torch.Tensor] | torch.Tensor | None = None
        self._rows: list[SamplerRow] = []
        self._tables: RowTables | None = None
        self._device = torch.device("cpu")
        self._dense_offsets: dict[tuple[int, int, torch.device], torch.Tensor] = {}

    # -- schedules ----------------------------------------------------------------------

    def sampler_row(self, num_inference_steps: int) -> SamplerRow:
        """This scheduler with ``num_inference_steps`` steps as one row of the fused step's
        tables (what :meth:`set_timesteps` builds per schedule, and what
        :class:`~octopus.diffusion.ContinuousSampler` builds per request)."""
        raise NotImplementedError

    def set_timesteps(self, num_inference_steps: int | Sequence[int], device: torch.device | str | None = None) -> None:
        """One shared schedule (an int), or one schedule per sample (a sequence of ints).
        ``timesteps`` is then the shared 1-D tensor, or a list with each sample's."""
        # torch.empty(0, device=...).device names the index ("cuda" -> "cuda:0"), as tensors do.
        self._device = torch.empty(0, device=device).device if device is not None else torch.device("cpu")
        per_sample = not isinstance(num_inference_steps, int)
        counts = [num_inference_steps] if isinstance(num_inference_steps, int) else list(num_inference_steps)
        if not counts or any(int(s) < 1 for s in counts):
            raise ValueError(f"num_inference_steps must be positive, got {num_inference_steps}")
        self._rows = [self.sampler_row(int(s)) for s in counts]
        self._tables = RowTables.build(self._rows, self._device)
        shared = [torch.from_numpy(r.timesteps.copy()) for r in self._rows]
        self.timesteps = shared if per_sample else shared[0]
        self._reset_state()

    def _reset_state(self) -> None:
        pass

    # -- the step -----------------------------------------------------------------------

    def _latents(self, name: str, x: object, like: Latents | None = None) -> tuple[
            torch.Tensor, torch.Tensor, str, torch.Tensor | None, Callable[[torch.Tensor], Latents]]:
        """(values, offsets, strategy, metadata, rebuild) for dense [N, ...] or RaggedBatch latents."""
        if isinstance(x, RaggedBatch):
            if like is not None and not isinstance(like, RaggedBatch):
                raise TypeError(f"{name} is a RaggedBatch but sample is a dense tensor")
            if like is not None and (x.numel() != like.numel() or len(x) != len(like)):
                raise ValueError(f"{name} must have the sample's layout")
            return x.values, x.offsets, "plan", x.metadata("plan"), x.with_values
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor or a RaggedBatch, got {type(x).__name__}")
        if like is not None and isinstance(like, torch.Tensor) and x.shape != like.shape:
            raise ValueError(f"{name} must have the sample's shape {tuple(like.shape)}, got {tuple(x.shape)}")
        if x.dim() < 1:
            raise ValueError(f"{name} must be [num_samples, ...], got a 0-d tensor")
        n = x.shape[0]
        per = x[0].numel() if n > 0 else 0
        key = (n, per, x.device)
        offsets = self._dense_offsets.get(key)
        if offsets is None:
            offsets = self._dense_offsets[key] = torch.arange(n + 1, dtype=torch.int64, device=x.device) * per
        return x.reshape(-1), offsets, "block_search", None, lambda v: v.view(x.shape)

    def _timesteps(self, timesteps: TimestepsLike, num_samples: int, device: torch.device,
                   validate: bool) -> torch.Tensor:
        t = torch.as_tensor(timesteps)
        if t.dim() == 0:
            t = t.expand(num_samples)
        if t.dim() != 1 or t.numel() != num_samples:
            raise ValueError(f"timesteps must have one entry per sample ({num_samples}), got shape {tuple(t.shape)}")
        if t.is_floating_point() is False and t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"timesteps must be integer or floating point, got {t.dtype}")
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        repeats = any(r.repeats_timesteps for r in self._rows)
        if validate and not capturing:
            steps = self._check_timesteps(t.detach().cpu().double().numpy())
            if repeats:  # the fused step finds each sample's step by its key
                keys = [self._rows[i if len(self._rows) > 1 else 0].keys[k] if k >= 0 else -1.0
                        for i, k in enumerate(steps)]
                return to_device(torch.tensor(keys, dtype=torch.float64), device)
        elif repeats:
            raise ValueError("a schedule repeats a timestep (diffusers rounds two of its sigmas to one), so the step "
                             "of a sample at it is known only from its history on the host: step with validate=True "
                             "and outside a CUDA graph capture, or choose a step count whose timesteps do not repeat")
        # (Timesteps from the host do not make the step wait for the stream: the fused step
        # reads them on the same stream.)
        return to_device(t, device, torch.float64)

    def _check_timesteps(self, t: np.ndarray) -> np.ndarray:
        """Each timestep must be in its sample's schedule (or negative: skip). Returns the steps."""
        if self.timesteps is None:
            raise RuntimeError("call set_timesteps before step")
        if len(self._rows) > 1 and len(self._rows) != len(t):
            raise ValueError(f"the per-sample schedules are for {len(self._rows)} samples, the batch has {len(t)}")
        steps = np.full(len(t), -1)
        for i, ti in enumerate(t):
            if ti < 0:
                continue
            try:
                steps[i] = self._rows[i if len(self._rows) > 1 else 0].step_index(ti, self._step_before(i))
            except ValueError as error:
                raise ValueError(f"timesteps[{i}] = {ti:g} is not in sample {i}'s schedule: {error}") from None
        return steps

    @staticmethod
    def _step_noise(sample: Latents, generator: torch.Generator | None, noise: Latents | None,
                    dtype: torch.dtype | None = None) -> Latents:
        """The step's noise: ``noise`` as given, else drawn from ``generator`` in the sample's
        shape (in ``dtype`` where the sampler draws it so, as diffusers' DPM-Solver++ SDE
        draws float32), on its device."""
        if noise is not None and generator is not None:
            raise ValueError("pass either generator or variance_noise, not both")
        if noise is not None:
            return noise
        like = sample.values if isinstance(sample, RaggedBatch) else sample
        drawn = torch.randn(like.shape, generator=generator, device=like.device, dtype=dtype or like.dtype)
        drawn = drawn.to(like.dtype)
        return sample.with_values(drawn) if isinstance(sample, RaggedBatch) else drawn

    def _step_before(self, sample: int) -> int:
        """The step sample ``sample`` took last, where the scheduler keeps it (multistep
        samplers): a repeated timestep is then the step after it."""
        return -1

    def _step(self, model_output: Latents, sample: Latents, timesteps: TimestepsLike, *, noise: Latents | None = None,
              state: torch.Tensor | None = None, return_x0: bool = False, validate: bool = True,
              tables: RowTables | None = None) -> Any:
        values, offsets, strategy, meta, rebuild = self._latents("sample", sample)
        m_values = self._latents("model_output", model_output, like=sample)[0]
        n = offsets.numel() - 1
        if self._tables is None:
            raise RuntimeError("call set_timesteps before step")
        if self._device != values.device:
            raise ValueError(f"the schedule is on {self._device} but sample is on {values.device}; "
                             "pass device= to set_timesteps")
        t = self._timesteps(timesteps, n, values.device, validate)
        noise_values = None if noise is None else self._latents("noise", noise, like=sample)[0]
        prev, x0 = fused_step(m_values, values, offsets, t, tables or self._tables, noise=noise_values, state=state,
                              return_x0=return_x0, strategy=strategy, metadata=meta)
        out = rebuild(prev)
        return (out, rebuild(x0)) if return_x0 else out


class DDIMScheduler(_BatchedScheduler):
    """diffusers' ``DDIMScheduler.step`` for a batch with one timestep per sample.

    Supported: beta_schedule linear / scaled_linear / squaredcos_cap_v2; prediction_type
    epsilon / v_prediction / sample; timestep_spacing leading / trailing / linspace;
    clip_sample (+ clip_sample_range), set_alpha_to_one, steps_offset; eta >= 0 with a
    noise tensor or a generator; use_clipped_model_output; rescale_betas_zero_snr (with
    v_prediction and trailing spacing, as its paper pairs them). Not: thresholding.
    """

    _config_keys = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "prediction_type",
                    "clip_sample", "clip_sample_range", "set_alpha_to_one", "steps_offset", "timestep_spacing",
                    "rescale_betas_zero_snr")
    _unsupported = {"thresholding": {False}, "trained_betas": {None}}

    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", prediction_type: str = "epsilon", clip_sample: bool = True,
                 clip_sample_range: float = 1.0, set_alpha_to_one: bool = True, steps_offset: int = 0,
                 timestep_spacing: str = "leading", rescale_betas_zero_snr: bool = False):
        super().__init__(num_train_timesteps, prediction_type)
        self.alphas_cumprod = _alphas_cumprod(self.num_train_timesteps, beta_schedule, beta_start, beta_end,
                                              bool(rescale_betas_zero_snr))
        self.final_alpha_cumprod = 1.0 if set_alpha_to_one else float(self.alphas_cumprod[0])
        self.clip_sample, self.clip_sample_range = bool(clip_sample), float(clip_sample_range)
        self.steps_offset, self.timestep_spacing = int(steps_offset), timestep_spacing
        self._option_tables: dict[tuple[float, bool], RowTables] = {}  # (eta, use_clipped_model_output) -> tables

    def sampler_row(self, num_inference_steps: int, *, eta: float = 0.0,
                    use_clipped_model_output: bool = False) -> SamplerRow:
        """This scheduler with ``num_inference_steps`` steps, and the step options ``eta`` and
        ``use_clipped_model_output``, as one row of the fused step's tables."""
        steps, t = _training_timesteps(self.num_train_timesteps, num_inference_steps, self.timestep_spacing,
                                       self.steps_offset)
        return SamplerRow("ddim", self.prediction_type, t, self.alphas_cumprod.numpy(),
                          step_ratio=self.num_train_timesteps // steps,
                          final_alpha_cumprod=self.final_alpha_cumprod, eta=float(eta),
                          clip_range=self.clip_sample_range if self.clip_sample else 0.0,
                          clipped_model_output=bool(use_clipped_model_output))

    def _reset_state(self) -> None:
        self._option_tables = {}

    def _tables_with(self, eta: float, use_clipped_model_output: bool) -> RowTables:
        """The tables with the step's options in every row (built once per distinct options)."""
        key = (eta, use_clipped_model_output)
        if key == (0.0, False):
            return cast(RowTables, self._tables)  # (step calls this once set_timesteps built them)
        if key not in self._option_tables:
            rows = [dataclasses.replace(r, eta=eta, clipped_model_output=use_clipped_model_output) for r in self._rows]
            self._option_tables[key] = RowTables.build(rows, self._device)
        return self._option_tables[key]

    def step(self, model_output: Latents, sample: Latents, timesteps: TimestepsLike, *, eta: float = 0.0,
             use_clipped_model_output: bool = False, generator: torch.Generator | None = None,
             variance_noise: Latents | None = None, return_x0: bool = False, validate: bool = True) -> Any:
        """One DDIM step for every sample at its own timestep; returns prev_sample (and the
        predicted x0 with ``return_x0``), dense or ragged like ``sample``."""
        if eta < 0:
            raise ValueError(f"eta must be non-negative, got {eta}")
        noise = self._step_noise(sample, generator, variance_noise) if eta > 0 else None
        tables = None if self._tables is None else self._tables_with(float(eta), bool(use_clipped_model_output))
        return self._step(model_output, sample, timesteps, noise=noise, return_x0=return_x0, validate=validate,
                          tables=tables)


class DDPMScheduler(_BatchedScheduler):
    """diffusers' ``DDPMScheduler.step`` (ancestral sampling, Ho et al. 2020) for a batch with
    one timestep per sample: each step moves to the schedule's next timestep and adds noise,
    except at timestep 0.

    Supported: beta_schedule linear / scaled_linear / squaredcos_cap_v2; prediction_type
    epsilon / v_prediction / sample; timestep_spacing leading / linspace / trailing,
    steps_offset; clip_sample (+ clip_sample_range); variance_type fixed_small;
    rescale_betas_zero_snr; noise from a generator or given. Not: other variance types (the
    learned ones need the model's variance output), thresholding, custom timesteps.
    """

    _config_keys = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "prediction_type",
                    "clip_sample", "clip_sample_range", "steps_offset", "timestep_spacing", "rescale_betas_zero_snr")
    _unsupported = {"thresholding": {False}, "trained_betas": {None}, "variance_type": {"fixed_small", None}}

    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", prediction_type: str = "epsilon", clip_sample: bool = True,
                 clip_sample_range: float = 1.0, steps_offset: int = 0, timestep_spacing: str = "leading",
                 rescale_betas_zero_snr: bool = False):
        super().__init__(num_train_timesteps, prediction_type)
        self.alphas_cumprod = _alphas_cumprod(self.num_train_timesteps, beta_schedule, beta_start, beta_end,
                                              bool(rescale_betas_zero_snr))
        self.clip_sample, self.clip_sample_range = bool(clip_sample), float(clip_sample_range)
        self.steps_offset, self.timestep_spacing = int(steps_offset), timestep_spacing

    def sampler_row(self, num_inference_steps: int) -> SamplerRow:
        steps, t = _training_timesteps(self.num_train_timesteps, num_inference_steps, self.timestep_spacing,
                                       self.steps_offset)
        return SamplerRow("ddpm", self.prediction_type, t, self.alphas_cumprod.numpy(),
                          step_ratio=self.num_train_timesteps // steps,
                          clip_range=self.clip_sample_range if self.clip_sample else 0.0)

    def step(self, model_output: Latents, sample: Latents, timesteps: TimestepsLike, *,
             generator: torch.Generator | None = None, variance_noise: Latents | None = None,
             return_x0: bool = False, validate: bool = True) -> Any:
        """One DDPM step for every sample at its own timestep, its noise ``variance_noise`` or
        drawn from ``generator``; returns prev_sample (and the predicted x0 with
        ``return_x0``), dense or ragged like ``sample``."""
        noise = self._step_noise(sample, generator, variance_noise)
        return self._step(model_output, sample, timesteps, noise=noise, return_x0=return_x0, validate=validate)


class _SigmaScheduler(_BatchedScheduler):
    def step(self, model_output: Latents, sample: Latents, timesteps: TimestepsLike, *, return_x0: bool = False,
             validate: bool = True) -> Any:
        """One step for every sample at its own timestep; returns prev_sample (and the
        predicted x0 with ``return_x0``), dense or ragged like ``sample``."""
        return self._step(model_output, sample, timesteps, return_x0=return_x0, validate=validate)

    def sigma_for(self, timesteps: TimestepsLike) -> torch.Tensor:
        """Each sample's current sigma (float64, on the schedule's device)."""
        t = np.asarray(torch.as_tensor(timesteps).double().cpu())
        steps = self._check_timesteps(t)
        sig = [self._rows[i if len(self._rows) > 1 else 0].sigma(k) if k >= 0 else 0.0 for i, k in enumerate(steps)]
        return to_device(torch.tensor(sig, dtype=torch.float64), self._device)  # (no further wait for the stream)


class EulerDiscreteScheduler(_SigmaScheduler):
    """diffusers' ``EulerDiscreteScheduler.step`` for a batch with one timestep per sample.

    Supported: beta_schedule linear / scaled_linear / squaredcos_cap_v2; prediction_type
    epsilon / v_prediction / sample; timestep_spacing linspace / leading / trailing;
    interpolation_type linear; use_karras_sigmas, use_exponential_sigmas or use_beta_sigmas
    (with sigma_min / sigma_max; beta sigmas need scipy); final_sigmas_type zero / sigma_min;
    rescale_betas_zero_snr; s_churn = 0 (the default).
    """

    _config_keys: Tuple[str, ...] = (
        "num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "prediction_type", "timestep_spacing",
        "steps_offset", "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "sigma_min", "sigma_max",
        "final_sigmas_type", "rescale_betas_zero_snr")
    _unsupported = {"interpolation_type": {"linear"}, "trained_betas": {None}, "timestep_type": {"discrete"}}

    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", prediction_type: str = "epsilon", timestep_spacing: str = "linspace",
                 steps_offset: int = 0, use_karras_sigmas: bool | None = False,
                 use_exponential_sigmas: bool | None = False, use_beta_sigmas: bool | None = False,
                 sigma_min: float | None = None, sigma_max: float | None = None, final_sigmas_type: str = "zero",
                 rescale_betas_zero_snr: bool = False):
        super().__init__(num_train_timesteps, prediction_type)
        if final_sigmas_type not in ("zero", "sigma_min"):
            raise ValueError(f"final_sigmas_type must be 'zero' or 'sigma_min', got {final_sigmas_type!r}")
        ac = _sigma_alphas_cumprod(self.num_train_timesteps, beta_schedule, beta_start, beta_end,
                                   bool(rescale_betas_zero_snr))
        self._train_sigmas = (((1 - ac) / ac) ** 0.5).numpy()  # torch's float32 pow, as diffusers
        self.timestep_spacing, self.steps_offset = timestep_spacing, int(steps_offset)
        self.sigma_schedule = _sigma_schedule(use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas)
        self.sigma_min, self.sigma_max, self.final_sigmas_type = sigma_min, sigma_max, final_sigmas_type

    def sampler_row(self, num_inference_steps: int) -> SamplerRow:
        steps = int(num_inference_steps)
        t = _spaced(self.num_train_timesteps, steps, self.timestep_spacing, self.steps_offset, integer=False)
        t = t.astype(np.float32)
        sigmas = np.interp(t, np.arange(0, len(self._train_sigmas)), self._train_sigmas)
        if self.sigma_schedule is not None:
            sigmas = _SIGMA_SCHEDULES[self.sigma_schedule](sigmas, steps, self.sigma_min, self.sigma_max)
            t = _sigma_to_t(sigmas, np.log(self._train_sigmas)).astype(np.float32)
        last = self._train_sigmas[0] if self.final_sigmas_type == "sigma_min" else 0.0
        sigmas = np.concatenate([sigmas, [last]]).astype(np.float32).astype(np.float64)
        # diffusers: the largest sigma for linspace and trailing spacing, sqrt(sigma^2 + 1) for leading.
        top = torch.tensor(sigmas.max(), dtype=torch.float32)
        init = float(top if self.timestep_spacing in ("linspace", "trailing") else (top ** 2 + 1) ** 0.5)
        return SamplerRow("euler", self.prediction_type, t.astype(np.float64), sigmas, init_noise_sigma=init)

    def set_timesteps(self, num_inference_steps: int | Sequence[int], device: torch.device | str | None = None) -> None:
        super().set_timesteps(num_inference_steps, device)
        self.init_noise_sigma = max(r.init_noise_sigma for r in self._rows)

    def scale_model_input(self, sample: Latents, timesteps: TimestepsLike) -> Latents:
        """``sample / sqrt(sigma^2 + 1)`` with each sample's own sigma (as diffusers does before
        the model call)."""
        sigma = self.sigma_for(timesteps)
        scale = (1.0 / torch.sqrt(sigma * sigma + 1.0))
        if isinstance(sample, RaggedBatch):
            return affine(sample, scale.to(sample.values.dtype if sample.values.dtype == torch.float64
                                           else torch.float32), 0.0)
        shape = (-1,) + (1,) * (sample.dim() - 1)
        return (sample * scale.to(sample.dtype).view(shape)).to(sample.dtype)


class EulerAncestralDiscreteScheduler(EulerDiscreteScheduler):
    """diffusers' ``EulerAncestralDiscreteScheduler.step`` ("Euler a") for a batch with one
    timestep per sample: an Euler step down to sigma_down, then noise of sigma_up.

    Supported: beta_schedule linear / scaled_linear / squaredcos_cap_v2; prediction_type
    epsilon / v_prediction; timestep_spacing linspace / leading / trailing;
    rescale_betas_zero_snr; noise from a generator or given. Not: sample prediction (diffusers
    has none either).
    """

    _config_keys = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "prediction_type",
                    "timestep_spacing", "steps_offset", "rescale_betas_zero_snr")
    _unsupported = {"trained_betas": {None}, "prediction_type": {"epsilon", "v_prediction"}}

    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", prediction_type: str = "epsilon", timestep_spacing: str = "linspace",
                 steps_offset: int = 0, rescale_betas_zero_snr: bool = False):
        if prediction_type == "sample":
            raise NotImplementedError("prediction_type='sample' is not supported by EulerAncestralDiscreteScheduler "
                                      "(nor by diffusers'): use 'epsilon' or 'v_prediction'")
        super().__init__(num_train_timesteps, beta_start, beta_end, beta_schedule, prediction_type, timestep_spacing,
                         steps_offset, rescale_betas_zero_snr=rescale_betas_zero_snr)

    def sampler_row(self, num_inference_steps: int) -> SamplerRow:
        return dataclasses.replace(super().sampler_row(num_inference_steps), kind="euler_ancestral")

    def step(self, model_output: Latents, sample: Latents, timesteps: TimestepsLike, *,
             generator: torch.Generator | None = None, variance_noise: Latents | None = None,
             return_x0: bool = False, validate: bool = True) -> Any:
        """One ancestral Euler step for every sample at its own timestep, its noise
        ``variance_noise`` or drawn from ``generator``; returns prev_sample (and the predicted
        x0 with ``return_x0``), dense or ragged like ``sample``."""
        noise = self._step_noise(sample, generator, variance_noise)
        return self._step(model_output, sample, timesteps, noise=noise, return_x0=return_x0, validate=validate)


class FlowMatchEulerDiscreteScheduler(_SigmaScheduler):
    """diffusers' ``FlowMatchEulerDiscreteScheduler.step`` (SD3 / Flux / Wan-style
    rectified flow) for a batch with one timestep per sample: ``x + (sigma_next - sigma) * v``.

    Supported: shift (static), or use_dynamic_shifting with ``mu`` (exponential time shift)
    given to set_timesteps, or computed per resolution by :meth:`mu_for` as SD3 and Flux
    pipelines compute it. Not: shift_terminal, karras / exponential / beta sigmas,
    invert_sigmas, stochastic_sampling, per-token timesteps.
    """

    _config_keys = ("num_train_timesteps", "shift", "use_dynamic_shifting", "base_shift", "max_shift",
                    "base_image_seq_len", "max_image_seq_len")
    _unsupported = {"shift_terminal": {None}, "use_karras_sigmas": {False, None},
                    "use_exponential_sigmas": {False, None}, "use_beta_sigmas": {False, None},
                    "invert_sigmas": {False}, "stochastic_sampling": {False}, "time_shift_type": {"exponential"}}

    def __init__(self, num_train_timesteps: int = 1000, shift: float = 1.0, use_dynamic_shifting: bool = False,
                 base_shift: float | None = 0.5, max_shift: float | None = 1.15, base_image_seq_len: int = 256,
                 max_image_seq_len: int = 4096):
        super().__init__(num_train_timesteps, "epsilon")  # unused: flow_euler's model predicts a velocity
        self.shift, self.use_dynamic_shifting = float(shift), bool(use_dynamic_shifting)
        self.base_shift, self.max_shift = base_shift, max_shift
        self.base_image_seq_len, self.max_image_seq_len = int(base_image_seq_len), int(max_image_seq_len)
        t = np.linspace(1, num_train_timesteps, num_train_timesteps, dtype=np.float32)[::-1].copy()
        sigmas = torch.from_numpy(t) / num_train_timesteps
        if not use_dynamic_shifting:
            sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
        self._sigma_min, self._sigma_max = sigmas[-1].item(), sigmas[0].item()
        self._mu: float | None = None

    def mu_for(self, latent_shape: Sequence[int], patch_size: int = 2) -> float:
        """The time shift ``mu`` of use_dynamic_shifting for latents of ``latent_shape``
        (``(channels, height, width)``), as SD3 and Flux pipelines compute it: linear in the
        image's token count ``(height // patch_size) * (width // patch_size)`` between
        (base_image_seq_len, base_shift) and (max_image_seq_len, max_shift) of the config
        (diffusers' ``calculate_shift``)."""
        if len(latent_shape) != 3:
            raise ValueError(f"mu_for needs (channels, height, width) latents, got shape {tuple(latent_shape)}: "
                             "give mu for others")
        if self.base_shift is None or self.max_shift is None:
            raise ValueError("mu_for needs base_shift and max_shift in the scheduler's config")
        tokens = (int(latent_shape[1]) // patch_size) * (int(latent_shape[2]) // patch_size)
        slope = (self.max_shift - self.base_shift) / (self.max_image_seq_len - self.base_image_seq_len)
        return tokens * slope + self.base_shift - slope * self.base_image_seq_len

    def set_timesteps(self, num_inference_steps: int | Sequence[int], device: torch.device | str | None = None,
                      mu: float | None = None) -> None:
        if self.use_dynamic_shifting and mu is None:
            raise ValueError("use_dynamic_shifting needs mu")
        self._mu = mu
        super().set_timesteps(num_inference_steps, device)

    def sampler_row(self, num_inference_steps: int, *, mu: float | None = None) -> SamplerRow:
        """This scheduler with ``num_inference_steps`` steps as one row of the fused step's
        tables; ``mu`` (the exponential time shift) where use_dynamic_shifting is set
        (default: the one given to :meth:`set_timesteps`)."""
        mu = self._mu if mu is None else mu
        if self.use_dynamic_shifting and mu is None:
            raise ValueError("use_dynamic_shifting needs mu")
        t = np.linspace(self._sigma_max * self.num_train_timesteps, self._sigma_min * self.num_train_timesteps,
                        int(num_inference_steps))
        sigmas = t / self.num_train_timesteps
        if self.use_dynamic_shifting and mu is not None:  # (mu is set there: checked above)
            sigmas = math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1) ** 1.0)
        else:
            sigmas = self.shift * sigmas / (1 + (self.shift - 1) * sigmas)
        sigmas32 = torch.from_numpy(sigmas).to(torch.float32)
        timesteps = (sigmas32 * self.num_train_timesteps).double().numpy()
        full = torch.cat([sigmas32, torch.zeros(1)]).double().numpy()
        return SamplerRow("flow_euler", "flow", timesteps, full)


class DPMSolverMultistepScheduler(_SigmaScheduler):
    """diffusers' ``DPMSolverMultistepScheduler.step`` with algorithm_type "dpmsolver++" or
    "sde-dpmsolver++" ("DPM++ 2M SDE", its noise from a generator or given), solver_order 2,
    solver_type "midpoint" for a batch with one timestep per sample, the per-sample history
    (the previous step's x0) kept on the device.

    Supported: beta_schedule linear / scaled_linear / squaredcos_cap_v2; prediction_type
    epsilon / v_prediction / sample; timestep_spacing linspace / leading / trailing;
    lower_order_final, euler_at_final, final_sigmas_type zero / sigma_min; use_karras_sigmas
    ("DPM++ 2M Karras"), use_exponential_sigmas or use_beta_sigmas (scipy). A sample's first
    step is first order; its later steps need the history of its previous step (steps must
    follow each other: ``validate`` checks it, and tells a repeated timestep's steps apart by
    it); solver_order 3 ("DPM++ 3M", dpmsolver++ only: each sample's last two x0 kept). Not:
    lu / flow sigmas, thresholding, sde-dpmsolver (without ++), order 1, heun, custom
    timesteps.
    """

    _config_keys: Tuple[str, ...] = (
        "num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "prediction_type", "timestep_spacing",
        "steps_offset", "lower_order_final", "euler_at_final", "final_sigmas_type", "use_karras_sigmas",
        "use_exponential_sigmas", "use_beta_sigmas", "rescale_betas_zero_snr", "algorithm_type", "solver_order")
    _unsupported = {"algorithm_type": {"dpmsolver++", "sde-dpmsolver++"}, "solver_order": {2, 3},
                    "solver_type": {"midpoint"},
                    "thresholding": {False}, "use_lu_lambdas": {False, None},
                    "use_flow_sigmas": {False, None}, "variance_type": {None}, "trained_betas": {None},
                    "lambda_min_clipped": {-float("inf")}}

    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", prediction_type: str = "epsilon", timestep_spacing: str = "linspace",
                 steps_offset: int = 0, lower_order_final: bool = True, euler_at_final: bool = False,
                 final_sigmas_type: str = "zero", use_karras_sigmas: bool | None = False,
                 use_exponential_sigmas: bool | None = False, use_beta_sigmas: bool | None = False,
                 rescale_betas_zero_snr: bool = False, algorithm_type: str = "dpmsolver++", solver_order: int = 2):
        super().__init__(num_train_timesteps, prediction_type)
        if solver_order not in (2, 3) or (solver_order == 3 and algorithm_type != "dpmsolver++"):
            raise NotImplementedError(f"solver_order={solver_order!r} with algorithm_type={algorithm_type!r} is not "
                                      "supported by octopus's fused step (supported: order 2, and order 3 with "
                                      "'dpmsolver++')")
        self.solver_order = int(solver_order)
        if final_sigmas_type not in ("zero", "sigma_min"):
            raise ValueError(f"final_sigmas_type must be 'zero' or 'sigma_min', got {final_sigmas_type!r}")
        if algorithm_type not in ("dpmsolver++", "sde-dpmsolver++"):
            raise NotImplementedError(f"algorithm_type={algorithm_type!r} is not supported by octopus's fused step "
                                      "(supported: 'dpmsolver++', 'sde-dpmsolver++')")
        self.algorithm_type = algorithm_type
        self._ac = _sigma_alphas_cumprod(self.num_train_timesteps, beta_schedule, beta_start, beta_end,
                                         bool(rescale_betas_zero_snr))
        self.beta_schedule = beta_schedule
        self.sigma_schedule = _sigma_schedule(use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas)
        self.timestep_spacing, self.steps_offset = timestep_spacing, int(steps_offset)
        self.lower_order_final, self.euler_at_final = bool(lower_order_final), bool(euler_at_final)
        self.final_sigmas_type = final_sigmas_type
        self._state: torch.Tensor | None = None
        self._last_step: np.ndarray | None = None

    def sampler_row(self, num_inference_steps: int) -> SamplerRow:
        steps, T = int(num_inference_steps), self.num_train_timesteps
        if self.timestep_spacing == "linspace":
            t = np.linspace(0, T - 1, steps + 1).round()[::-1][:-1].copy().astype(np.int64)
        elif self.timestep_spacing == "leading":
            ratio = T // (steps + 1)
            t = (np.arange(0, steps + 1) * ratio).round()[::-1][:-1].copy().astype(np.int64) + self.steps_offset
        elif self.timestep_spacing == "trailing":
            t = np.arange(T, 0, -T / steps).round().copy().astype(np.int64) - 1
        else:
            raise NotImplementedError(f"timestep_spacing {self.timestep_spacing!r} is not supported")
        train_sigmas = (((1 - self._ac) / self._ac) ** 0.5).numpy()
        if self.sigma_schedule is None:
            sigmas = np.interp(t, np.arange(0, len(train_sigmas)), train_sigmas)
        else:
            sigmas = _SIGMA_SCHEDULES[self.sigma_schedule](np.flip(train_sigmas).copy(), steps, None, None)
            fractional = _sigma_to_t(sigmas, np.log(train_sigmas))
            # diffusers' integer timesteps: rounded where it rounds them, else truncated.
            t = (fractional.round() if self._rounds_sigma_timesteps() else fractional).astype(np.int64)
        sigmas = np.concatenate([sigmas, [self._last_sigma(sigmas, train_sigmas)]]).astype(np.float32).astype(np.float64)
        kind = "dpm_solver_pp_2m_sde" if self.algorithm_type == "sde-dpmsolver++" else "dpm_solver_pp_2m"
        if self.solver_order == 3:
            kind = "dpm_solver_pp_3m"
        return SamplerRow(kind, self.prediction_type, t.astype(np.float64), sigmas,
                          final_first_order=self._final_first_order(len(t)),
                          final_second_order=self.solver_order == 3 and self.lower_order_final and len(t) < 15)

    def _rounds_sigma_timesteps(self) -> bool:
        """Whether diffusers rounds the timesteps of a Karras or exponential schedule (DPM-Solver++:
        Karras sigmas, except for squaredcos_cap_v2)."""
        return self.sigma_schedule == "karras" and self.beta_schedule != "squaredcos_cap_v2"

    def _last_sigma(self, sigmas: np.ndarray, train_sigmas: np.ndarray) -> float:
        """The sigma after the last step: 0, or the training schedule's smallest."""
        return float(train_sigmas[0]) if self.final_sigmas_type == "sigma_min" else 0.0

    def _final_first_order(self, steps: int) -> bool:
        return self.euler_at_final or (self.lower_order_final and steps < 15) or self.final_sigmas_type == "zero"

    def _step_before(self, sample: int) -> int:
        return -1 if self._last_step is None else int(self._last_step[sample])

    def _reset_state(self) -> None:
        self._state = None
        self._last_step = None

    def _check_timesteps(self, t: np.ndarray) -> np.ndarray:
        if self._last_step is None or len(self._last_step) != len(t):
            self._last_step = np.full(len(t), -1)
        steps = super()._check_timesteps(t)
        for i, k in enumerate(steps):
            if k > 0 and self._last_step[i] != k - 1:
                raise ValueError(f"sample {i} is at step {k} of its schedule but its history holds step "
                                 f"{self._last_step[i]}: DPM-Solver++ steps must follow each other (start at step 0)")
        self._last_step = np.where(steps >= 0, steps, self._last_step)
        return steps

    def step(self, model_output: Latents, sample: Latents, timesteps: TimestepsLike, *,
             generator: torch.Generator | None = None, variance_noise: Latents | None = None,
             return_x0: bool = False, validate: bool = True) -> Any:
        """One step for every sample at its own timestep; returns prev_sample (and the
        predicted x0 with ``return_x0``), dense or ragged like ``sample``. The SDE variant's
        noise is ``variance_noise`` or drawn from ``generator`` (in float32, as diffusers)."""
        sde = any(r.stochastic for r in self._rows)
        if not sde and (generator is not None or variance_noise is not None):
            raise ValueError(f"{type(self).__name__} adds no noise here (algorithm_type "
                             f"{getattr(self, 'algorithm_type', None)!r}): generator and variance_noise are unused")
        noise = self._step_noise(sample, generator, variance_noise, torch.float32) if sde else None
        values = sample.values if isinstance(sample, RaggedBatch) else sample
        if self._state is None or self._state.shape[1] != values.numel() or self._state.dtype != values.dtype \
                or self._state.device != values.device:
            self._state = state_tensor(max(r.state_rows for r in self._rows), values.numel(), values)
        return self._step(model_output, sample, timesteps, noise=noise, state=self._state, return_x0=return_x0,
                          validate=validate)


class UniPCMultistepScheduler(DPMSolverMultistepScheduler):
    """diffusers' ``UniPCMultistepScheduler.step`` (solver_type "bh2", solver_order 2 or 3,
    predict_x0) for a batch with one timestep per sample: the UniC corrector of the previous
    step and the UniP predictor in one launch, with each sample's last two x0 predictions and
    its last corrected sample kept on the device (at order 3 the corrector's third x0 is
    folded into the kept sample one step ahead).

    Supported: beta_schedule linear / scaled_linear / squaredcos_cap_v2; prediction_type
    epsilon / v_prediction / sample; timestep_spacing linspace / leading / trailing;
    lower_order_final (without it, a final sigma of 0 makes the last order-2 step divide by
    zero, in diffusers too); final_sigmas_type zero / sigma_min; use_karras_sigmas,
    use_exponential_sigmas or use_beta_sigmas (scipy). Steps must follow each other from a
    sample's step 0. Not: bh1, orders other than 2 and 3, disable_corrector, solver_p, flow
    sigmas, thresholding.
    """

    _config_keys = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "prediction_type",
                    "timestep_spacing", "steps_offset", "lower_order_final", "final_sigmas_type", "use_karras_sigmas",
                    "use_exponential_sigmas", "use_beta_sigmas", "rescale_betas_zero_snr", "solver_order")
    _unsupported = {"solver_order": {2, 3}, "solver_type": {"bh2"}, "predict_x0": {True}, "disable_corrector": {()},
                    "solver_p": {None}, "thresholding": {False},
                    "use_flow_sigmas": {False, None}, "trained_betas": {None}, "use_dynamic_shifting": {False}}

    @classmethod
    def from_config(cls: type[_Scheduler], config: Any, **overrides: Any) -> _Scheduler:
        config = dict(getattr(config, "config", config))
        config["disable_corrector"] = tuple(config.get("disable_corrector", ()))  # a list is not hashable
        return super().from_config(config, **overrides)

    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.0001, beta_end: float = 0.02,
                 beta_schedule: str = "linear", prediction_type: str = "epsilon", timestep_spacing: str = "linspace",
                 steps_offset: int = 0, lower_order_final: bool = True, final_sigmas_type: str = "zero",
                 use_karras_sigmas: bool | None = False, use_exponential_sigmas: bool | None = False,
                 use_beta_sigmas: bool | None = False, rescale_betas_zero_snr: bool = False, solver_order: int = 2):
        if solver_order not in (2, 3):
            raise NotImplementedError(f"solver_order={solver_order!r} is not supported by the fused UniPC step "
                                      "(supported: 2, 3)")
        super().__init__(num_train_timesteps, beta_start, beta_end, beta_schedule, prediction_type, timestep_spacing,
                         steps_offset, lower_order_final=lower_order_final, final_sigmas_type=final_sigmas_type,
                         use_karras_sigmas=use_karras_sigmas, use_exponential_sigmas=use_exponential_sigmas,
                         use_beta_sigmas=use_beta_sigmas, rescale_betas_zero_snr=rescale_betas_zero_snr)
        self.solver_order = int(solver_order)

    def sampler_row(self, num_inference_steps: int) -> SamplerRow:
        row = super().sampler_row(num_inference_steps)
        return dataclasses.replace(row, kind="unipc_3" if self.solver_order == 3 else "unipc", final_second_order=False)

    def _final_first_order(self, steps: int) -> bool:
        return self.lower_order_final  # UniPC lowers its last orders with lower_order_final alone

    def _rounds_sigma_timesteps(self) -> bool:
        return self.sigma_schedule == "karras"  # whatever the beta schedule, in UniPC

    def _last_sigma(self, sigmas: np.ndarray, train_sigmas: np.ndarray) -> float:
        if self.final_sigmas_type == "sigma_min" and self.sigma_schedule is not None:
            return float(sigmas[-1])  # UniPC: the converted schedule's last sigma, repeated
        return super()._last_sigma(sigmas, train_sigmas)


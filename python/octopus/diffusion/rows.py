"""The fused step's tables: every sampler as one row.

``torch.ops.octopus.sampler_step`` steps samples that each read one row of a few per-row
tensors: the row's sampler kind and prediction type, its schedule (timesteps), its table
(``alphas_cumprod`` for DDIM, sigmas for the others) and its options. A :class:`SamplerRow`
is one such row on the host (the batched schedulers and the continuous sampler build them);
:class:`RowTables` is a list of rows on a device, the tensors the op reads. The kinds,
prediction types and column names come from the C++ library, their one definition. The op's
fake (for ``torch.compile``) is registered here.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from .. import _library
from .._host_copies import to_device
from .._registrations import register_fake

_LAYOUT = _library._C.sampler_step_layout
SAMPLER_KINDS: tuple[str, ...] = tuple(_LAYOUT["kinds"])
"""The fused samplers: ``ddim``, ``euler``, ``flow_euler``, ``dpm_solver_pp_2m``, ``unipc``,
``euler_ancestral``, ``dpm_solver_pp_2m_sde``, ``ddpm``, ``dpm_solver_pp_3m``, ``unipc_3`` (UniPC
of solver order 3)."""
PREDICTION_TYPES: tuple[str, ...] = tuple(_LAYOUT["predictions"])
"""What a model predicts: ``epsilon``, ``v_prediction``, ``sample``, or ``flow`` (flow_euler's velocity)."""
_KIND_CODE = {name: code for code, name in enumerate(SAMPLER_KINDS)}
_PREDICTION_CODE = {name: code for code, name in enumerate(PREDICTION_TYPES)}
_INFO_COLUMN = {name: column for column, name in enumerate(_LAYOUT["row_info"])}
_SCALAR_COLUMN = {name: column for column, name in enumerate(_LAYOUT["row_scalars"])}
# Multistep state rows each kind reads and writes (sampler_step's `state`).
_STATE_ROWS = {"dpm_solver_pp_2m": 1, "dpm_solver_pp_2m_sde": 1, "unipc": 3, "dpm_solver_pp_3m": 3, "unipc_3": 3}
# Kinds whose table is alphas_cumprod indexed by timestep (the others: sigmas, one per step and the last).
ALPHAS_KINDS = ("ddim", "ddpm")
# Kinds that add noise at every step (ddim adds it where eta > 0, ddpm at every timestep but 0).
_NOISY_KINDS = ("euler_ancestral", "dpm_solver_pp_2m_sde")
# Element counts of state rows are rounded up to this, so that every row starts 16-byte aligned.
STATE_ALIGNMENT = 8


@dataclasses.dataclass(frozen=True, eq=False)
class SamplerRow:
    """One sampler with one schedule, as the fused step reads it.

    ``timesteps``: the schedule (float64, descending; a timestep may repeat where diffusers'
    rounding gives two steps one, as DPM-Solver++ with Karras sigmas does from ~45 steps on: the
    fused step then finds steps by :attr:`keys`). ``table``: ``alphas_cumprod`` (ddim and ddpm,
    indexed by timestep) or the sigmas (one more than timesteps, the last the final sigma).
    ``step_ratio``: ddim's ``num_train_timesteps // num_inference_steps``.
    ``final_first_order``: DPM-Solver++'s last step is first order / UniPC's lower_order_final.
    ``final_second_order``: DPM-Solver++ 3M's second-to-last step is second order.
    ``init_noise_sigma``: the scale of a sample's initial noise (diffusers' attribute).
    The rest are ddim's options (``clip_range`` ddpm's too).
    """

    kind: str
    prediction: str
    timesteps: np.ndarray
    table: np.ndarray
    step_ratio: int = 0
    final_first_order: bool = False
    final_second_order: bool = False
    init_noise_sigma: float = 1.0
    final_alpha_cumprod: float = 1.0
    eta: float = 0.0
    clip_range: float = 0.0
    clipped_model_output: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KIND_CODE:
            raise ValueError(f"kind must be one of {SAMPLER_KINDS}, got {self.kind!r}")
        if self.prediction not in _PREDICTION_CODE:
            raise ValueError(f"prediction must be one of {PREDICTION_TYPES}, got {self.prediction!r}")
        if (self.kind == "flow_euler") != (self.prediction == "flow"):
            raise ValueError(f"a {self.kind} row cannot predict {self.prediction!r} "
                             "(flow_euler rows, and only they, predict 'flow')")
        if len(self.timesteps) < 1:
            raise ValueError("a row needs at least one timestep")
        if self.kind not in ALPHAS_KINDS and len(self.table) != len(self.timesteps) + 1:
            raise ValueError(f"a {self.kind} row needs one sigma more than timesteps, got {len(self.table)} "
                             f"for {len(self.timesteps)}")
        if self.eta < 0:
            raise ValueError(f"eta must be non-negative, got {self.eta}")
        if self.eta > 0 and self.kind != "ddim":
            raise ValueError(f"eta is a ddim option; a {self.kind} row has none")

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    @property
    def stochastic(self) -> bool:
        """Whether some step of the row adds noise (the sampler then draws it, per request)."""
        return self.kind in _NOISY_KINDS or self.kind == "ddpm" or (self.kind == "ddim" and self.eta > 0)

    def draws_noise(self, step: int) -> bool:
        """Whether ``step`` adds noise, so that diffusers draws it there (ddpm draws none at
        timestep 0; the others draw at every step, the last included)."""
        if self.kind == "ddpm":
            return bool(self.timesteps[step] > 0)
        return self.stochastic

    @property
    def state_rows(self) -> int:
        """Rows of multistep state the sampler keeps per sample (0, 1 or 3)."""
        return _STATE_ROWS.get(self.kind, 0)

    def step_index(self, timestep: float, after: int = -1) -> int:
        """The index of ``timestep`` in the schedule (ValueError where it is not one): the first
        after step ``after`` where the timestep repeats there, else the first."""
        k = np.flatnonzero(np.isclose(self.timesteps, timestep, rtol=0, atol=1e-4))
        if len(k) == 0:
            raise ValueError(f"{timestep:g} is not in the schedule ({self.timesteps[0]:g} ... "
                             f"{self.timesteps[-1]:g}, {len(self.timesteps)} steps)")
        later = k[k > after]
        return int(later[0] if len(later) else k[0])

    @functools.cached_property
    def keys(self) -> np.ndarray:
        """The schedule as the fused step finds a sample's step in it (the nearest key to the
        value it is given): the timesteps, each repeat of a timestep moved up by a fraction of
        a step so that every step has a key of its own (the first of n repeats highest)."""
        keys: np.ndarray = self.timesteps.astype(np.float64).copy()
        start = 0
        for k in range(1, len(keys) + 1):
            if k == len(keys) or self.timesteps[k] != self.timesteps[start]:
                run = k - start
                keys[start:k] += 0.25 / run * np.arange(run - 1, -1, -1)
                start = k
        return keys

    @functools.cached_property
    def repeats_timesteps(self) -> bool:
        """Whether a timestep repeats (the fused step must then be given :attr:`keys`; read at
        every sampler iteration, so worked out once)."""
        return len(np.unique(self.timesteps)) != len(self.timesteps)

    def sigma(self, step: int) -> float:
        """The sigma of a step (sigma-table kinds only)."""
        if self.kind in ALPHAS_KINDS:
            raise ValueError(f"a {self.kind} row has no sigmas")
        return float(self.table[step])

    def model_input_divisor(self, step: int) -> float:
        """What diffusers' ``scale_model_input`` divides a sample by at ``step``: euler's (and
        euler_ancestral's) ``sqrt(sigma^2 + 1)`` (computed in float32 as diffusers does), 1 for
        the others."""
        if self.kind not in ("euler", "euler_ancestral"):
            return 1.0
        sigma = torch.tensor(self.table[step], dtype=torch.float32)
        return float((sigma ** 2 + 1) ** 0.5)


class RowTables(NamedTuple):
    """Rows on a device: the four per-row tensors ``sampler_step`` reads."""

    schedules: torch.Tensor   # [R, S] float64, each row's timesteps (padded with -1)
    tables: torch.Tensor      # [R, W] float64, each row's alphas_cumprod or sigmas (padded with 0)
    row_info: torch.Tensor    # [R, len(row_info columns)] int64
    row_scalars: torch.Tensor  # [R, len(row_scalars columns)] float64

    @classmethod
    def build(cls, rows: Sequence[SamplerRow], device: torch.device | str, schedule_width: int = 0,
              table_width: int = 0) -> "RowTables":
        """The tables of ``rows`` on ``device`` (at least ``schedule_width`` / ``table_width`` wide)."""
        if not rows:
            raise ValueError("RowTables needs at least one row")
        width = max(schedule_width, max(r.num_steps for r in rows))
        table_width = max(table_width, 2, max(len(r.table) for r in rows))
        schedules = np.full((len(rows), width), -1.0)
        tables = np.zeros((len(rows), table_width))
        info = np.zeros((len(rows), len(_INFO_COLUMN)), dtype=np.int64)
        scalars = np.zeros((len(rows), len(_SCALAR_COLUMN)))
        for i, r in enumerate(rows):
            schedules[i, :r.num_steps] = r.keys
            tables[i, :len(r.table)] = r.table
            info[i] = _row_info(r)
            scalars[i] = _row_scalars(r)
        # Copies that finish before this returns: the tables may be read on any stream after.
        return cls(*(torch.from_numpy(a).to(device) for a in (schedules, tables, info, scalars)))

    def write(self, index: int, row: SamplerRow) -> None:
        """Puts ``row`` at ``index`` (it must fit the tables' widths), in order on the current
        stream (the host does not wait for it)."""
        if row.num_steps > self.schedules.shape[1] or len(row.table) > self.tables.shape[1]:
            raise ValueError(f"the row ({row.num_steps} steps, a table of {len(row.table)}) does not fit tables "
                             f"of widths {self.schedules.shape[1]} and {self.tables.shape[1]}")
        schedule = np.full(self.schedules.shape[1], -1.0)
        schedule[:row.num_steps] = row.keys
        table = np.zeros(self.tables.shape[1])
        table[:len(row.table)] = row.table
        for target, value in ((self.schedules, schedule), (self.tables, table), (self.row_info, _row_info(row)),
                              (self.row_scalars, _row_scalars(row))):
            target[index].copy_(to_device(value, target.device))

    def widened(self, schedule_width: int, table_width: int) -> "RowTables":
        """The same rows in tables at least this wide (a copy where they must grow)."""
        if schedule_width <= self.schedules.shape[1] and table_width <= self.tables.shape[1]:
            return self
        schedules = self.schedules.new_full((self.schedules.shape[0], max(schedule_width, self.schedules.shape[1])),
                                            -1.0)
        tables = self.tables.new_zeros((self.tables.shape[0], max(table_width, self.tables.shape[1])))
        schedules[:, :self.schedules.shape[1]] = self.schedules
        tables[:, :self.tables.shape[1]] = self.tables
        return RowTables(schedules, tables, self.row_info, self.row_scalars)


def _row_info(row: SamplerRow) -> np.ndarray:
    values = dict(kind=_KIND_CODE[row.kind], prediction=_PREDICTION_CODE[row.prediction], length=row.num_steps,
                  table_length=len(row.table), step_ratio=row.step_ratio,
                  final_first_order=int(row.final_first_order), clipped_model_output=int(row.clipped_model_output),
                  final_second_order=int(row.final_second_order))
    return _columns(values, _INFO_COLUMN, np.int64)


def _row_scalars(row: SamplerRow) -> np.ndarray:
    values = dict(final_alpha_cumprod=row.final_alpha_cumprod, eta=row.eta, clip_range=row.clip_range)
    return _columns(values, _SCALAR_COLUMN, np.float64)


def _columns(values: dict[str, Any], columns: dict[str, int], dtype: Any) -> np.ndarray:
    if set(values) != set(columns):  # the C++ layout changed: say how, rather than fill wrong columns
        raise RuntimeError(f"sampler_step's row columns are {sorted(columns)}, octopus.diffusion fills "
                           f"{sorted(values)}")
    out = np.zeros(len(columns), dtype=dtype)
    for name, value in values.items():
        out[columns[name]] = value
    return out


def state_tensor(rows: int, numel: int, like: torch.Tensor) -> torch.Tensor:
    """Zeroed multistep state for ``numel`` elements: ``[rows, numel]``, each row 16-byte aligned."""
    padded = -(-numel // STATE_ALIGNMENT) * STATE_ALIGNMENT
    return torch.zeros(rows, padded, dtype=like.dtype, device=like.device)[:, :numel]


def fused_step(model_output: torch.Tensor, sample: torch.Tensor, offsets: torch.Tensor, timesteps: torch.Tensor,
               rows: RowTables, *, sample_rows: torch.Tensor | None = None, noise: torch.Tensor | None = None,
               state: torch.Tensor | None = None, return_x0: bool = False, strategy: str = "block_search",
               metadata: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.octopus.sampler_step`` with the tables of ``rows``: (prev, x0) over the
    packed latents ``sample`` (1-D, items at ``offsets``)."""
    prev, x0 = torch.ops.octopus.sampler_step(model_output, sample, offsets, timesteps, rows.schedules, rows.tables,
                                              rows.row_info, rows.row_scalars, sample_rows, noise, state, return_x0,
                                              strategy, metadata)
    return prev, x0


@register_fake("octopus::sampler_step")
def _sampler_step_fake(model_output, sample, offsets, timesteps, schedules, tables, row_info, row_scalars,
                       sample_rows=None, noise=None, state=None, return_x0=False, strategy="block_search",
                       metadata=None):
    torch._check(model_output.shape == sample.shape, lambda: "model_output must have the sample's shape")
    torch._check(timesteps.shape[0] == offsets.shape[0] - 1, lambda: "timesteps must have one entry per sample")
    return torch.empty_like(sample), sample.new_empty((sample.shape[0] if return_x0 else 0,))

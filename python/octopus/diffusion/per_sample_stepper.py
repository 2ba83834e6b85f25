"""Running any diffusers-style scheduler per sample, for schedulers octopus does not fuse.

``PerSampleStepper`` keeps one copy of the scheduler per sample (each with its own schedule
and state) and steps a batch in which every sample is at its own timestep, in one of three
modes that give identical results:

- ``loop``: a Python loop, one ``scheduler.step`` per sample;
- ``streams``: the per-sample steps on leased CUDA streams (``StreamScheduler.map``);
- ``grouped``: samples at the same timestep and step of the same schedule are stacked and
  stepped together, their per-sample state (multistep history) stacked and split again.

Timesteps are matched by value, so schedules must not repeat a timestep (Heun's and KDPM2's
doubled schedules do; they are not supported).
"""

from __future__ import annotations

import copy
from typing import Any, Sequence, cast

import torch

from ..scheduling import StreamScheduler

MODES = ("loop", "streams", "grouped")
# Scheduler attributes that hold per-sample tensors (multistep history and the like) in
# diffusers' schedulers; the grouped mode stacks them along the batch dimension.
_BATCHED_STATE = ("model_outputs", "last_sample", "prev_derivative", "sample", "timestep_list")


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return torch.cat(values)
    if isinstance(first, list):
        return [_stack([v[j] for v in values]) for j in range(len(first))]
    return first  # None, a 0-d tensor or a value every member of the group shares


def _unstack(value: Any, k: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value[k:k + 1]
    if isinstance(value, list):
        return [_unstack(v, k) for v in value]
    return value


class PerSampleStepper:
    """Steps ``num_samples`` copies of ``scheduler``, each at its own timestep.

    Args:
        scheduler: a diffusers-style scheduler (``set_timesteps``, ``step`` returning an
            object with ``prev_sample`` or a tuple, ``timesteps``).
        num_samples: samples in the batch.
        mode: ``"loop"``, ``"streams"`` or ``"grouped"``.
        stream_scheduler: the :class:`StreamScheduler` for ``streams`` (default: 4 leases per
            device, or the simulated backend where there is no GPU).
    """

    def __init__(self, scheduler: Any, num_samples: int, mode: str = "loop",
                 stream_scheduler: StreamScheduler | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if num_samples < 1:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        for method in ("set_timesteps", "step"):
            if not callable(getattr(scheduler, method, None)):
                raise TypeError(f"scheduler must have a {method}() method (a diffusers-style scheduler)")
        self.mode = mode
        self.schedulers = [copy.deepcopy(scheduler) for _ in range(num_samples)]
        self._schedule_keys: list[tuple[float, ...]] | None = None
        self._streams = stream_scheduler
        if mode == "streams" and self._streams is None:
            self._streams = StreamScheduler(4) if torch.cuda.is_available() else StreamScheduler(4, backend="simulated")

    @property
    def timesteps(self) -> list[torch.Tensor]:
        """Each sample's schedule."""
        return [s.timesteps for s in self.schedulers]

    def set_timesteps(self, num_inference_steps: int | Sequence[int], device: torch.device | str | None = None,
                      **kwargs: Any) -> None:
        """One count for every sample, or one per sample."""
        counts = [num_inference_steps] * len(self.schedulers) if isinstance(num_inference_steps, int) \
            else list(num_inference_steps)
        if len(counts) != len(self.schedulers):
            raise ValueError(f"num_inference_steps has {len(counts)} entries for {len(self.schedulers)} samples")
        for s, count in zip(self.schedulers, counts):
            s.set_timesteps(count, device=device, **kwargs)
        # Which schedule each sample follows, read once rather than at every grouped step.
        self._schedule_keys = [tuple(s.timesteps.tolist()) for s in self.schedulers]

    def step(self, model_output: torch.Tensor, sample: torch.Tensor, timesteps: torch.Tensor | Sequence[float],
             **step_kwargs: Any) -> torch.Tensor:
        """``prev_sample`` of every sample; a negative timestep leaves its sample unchanged.
        ``step_kwargs`` go to each ``scheduler.step`` (tensors in them with one row per sample
        are split per sample)."""
        n = len(self.schedulers)
        if self._schedule_keys is None:
            raise RuntimeError("call set_timesteps before step")
        if sample.shape[0] != n or model_output.shape != sample.shape:
            raise ValueError(f"sample and model_output must be [{n}, ...] with the same shape, got "
                             f"{tuple(sample.shape)} and {tuple(model_output.shape)}")
        t = [float(v) for v in torch.as_tensor(timesteps).reshape(-1).tolist()]
        if len(t) != n:
            raise ValueError(f"timesteps must have one entry per sample ({n}), got {len(t)}")
        active = [i for i in range(n) if t[i] >= 0]
        out = sample.clone()
        if self.mode == "grouped":
            groups: dict[tuple[Any, ...], list[int]] = {}
            for i in active:
                groups.setdefault(self._group_key(i, t[i]), []).append(i)
            for members in groups.values():
                out[members] = self._grouped_step(members, model_output, sample, t[members[0]], step_kwargs)
            return out

        def run(i: int) -> torch.Tensor:
            return self._one(i, model_output, sample, t[i], step_kwargs)

        # (The streams mode always has a stream scheduler: __init__ makes one.)
        results = cast(StreamScheduler, self._streams).map(run, active, kind="per_sample_step") \
            if self.mode == "streams" else [run(i) for i in active]
        for i, r in zip(active, results):
            out[i:i + 1] = r
        return out

    # -- internals ----------------------------------------------------------------------

    def _timestep(self, i: int, t: float) -> torch.Tensor:
        """The schedule's own entry for t (diffusers compares timesteps by value and type)."""
        schedule: torch.Tensor = self.schedulers[i].timesteps
        matches = (schedule.double() - t).abs() < 1e-4
        if not bool(matches.any()):
            raise ValueError(f"timesteps[{i}] = {t:g} is not in sample {i}'s schedule")
        return schedule[int(matches.nonzero()[0])]

    def _one(self, i: int, model_output: torch.Tensor, sample: torch.Tensor, t: float,
             step_kwargs: dict[str, Any]) -> torch.Tensor:
        kwargs = {k: _row(v, [i], len(self.schedulers)) for k, v in step_kwargs.items()}
        return _prev(self.schedulers[i].step(model_output[i:i + 1], self._timestep(i, t), sample[i:i + 1], **kwargs))

    def _group_key(self, i: int, t: float) -> tuple[Any, ...]:
        s = self.schedulers[i]
        state = tuple((k, v) for k, v in sorted(vars(s).items())
                      if isinstance(v, (int, float, bool, type(None))) and k not in _BATCHED_STATE)
        schedule_keys = cast("list[tuple[float, ...]]", self._schedule_keys)  # step() checked they are set
        return (round(t, 4), schedule_keys[i], state)

    def _grouped_step(self, members: list[int], model_output: torch.Tensor, sample: torch.Tensor, t: float,
                      step_kwargs: dict[str, Any]) -> torch.Tensor:
        schedulers = [self.schedulers[i] for i in members]
        group = copy.copy(schedulers[0])
        for name in _BATCHED_STATE:
            if name in vars(group):
                setattr(group, name, _stack([getattr(s, name) for s in schedulers]))
        kwargs = {k: _row(v, members, len(self.schedulers)) for k, v in step_kwargs.items()}
        prev = _prev(group.step(model_output[members], self._timestep(members[0], t), sample[members], **kwargs))
        for k, s in enumerate(schedulers):
            for name, value in vars(group).items():
                if name in _BATCHED_STATE:
                    setattr(s, name, _unstack(value, k))
                elif isinstance(value, (int, float, bool, type(None))):
                    setattr(s, name, value)
        return prev


def _row(value: Any, rows: list[int], n: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
        return value[rows]
    return value


def _prev(result: Any) -> torch.Tensor:
    return cast(torch.Tensor, result.prev_sample if hasattr(result, "prev_sample") else result[0])

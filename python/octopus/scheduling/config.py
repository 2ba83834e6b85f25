"""``SchedulerConfig``: every option of a :class:`~octopus.StreamScheduler`, in the units and
with the defaults users give them; the one Python list of them. Each field maps to a field of
the C++ ``SchedulerConfig`` (bound once in csrc/octopus/bindings.cpp), a test checks that the
two agree field for field."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

from .. import _library


def _seconds_or_forever(value: float | None) -> float:
    """None (no limit) as the C++ side's negative seconds."""
    return -1.0 if value is None else float(value)


def _count_or_default(value: int | None) -> int:
    """None (the default) as the C++ side's -1."""
    return -1 if value is None else int(value)


def _option(default: Any, native: str | None = None, convert: Callable[[Any], Any] | None = None) -> Any:
    """A field whose C++ name is ``native`` (default: its own) and value ``convert(value)``."""
    return dataclasses.field(default=default, metadata={"native": native, "convert": convert})


@dataclasses.dataclass
class SchedulerConfig:
    """The options of a :class:`~octopus.StreamScheduler` (keyword arguments of its constructor).

    Attributes:
        max_leases_per_device: leases held at once on one device (the pool holds this many
            normal-, high-priority and best-effort streams per device).
        max_best_effort_leases: best-effort leases held at once on one device (None: one fewer
            than the lease limit, at least 1, so best-effort work never takes the last).
        max_occupancy: the sum of the held leases' estimated occupancy allowed per device
            (1.0 = the whole device). A lease is always granted on an idle device.
            Best-effort leases are admitted within everything in use; the others as if
            best-effort leases were not there (those yield at checkpoints instead).
        default_occupancy: the estimate for kinds nobody registered (0 counts only leases).
        memory_reserve: fraction of each device's memory that must stay free (0: no check).
        memory_poll_interval: seconds a free-memory sample (cudaMemGetInfo) is reused.
        timeout: default acquire timeout in seconds; None waits for ever.
        devices: device indices to schedule on (None: all visible devices).
        record_timeline: keep an acquire/release timeline for :meth:`StreamScheduler.dump_trace`.
        timeline_capacity: entries the timeline keeps at most.
        latency_control: hold best-effort work back as far as the latency-critical kinds'
            targets need, and no further (:meth:`StreamScheduler.set_target`; the guide's
            "Latency targets"). The controller sets the slice length the slicing helpers use,
            the in-flight bound, the SMs kept free of best-effort work and when best-effort
            holders pause, unless they are pinned below.
        latency_ratio: the target of a latency-critical kind without one of its own: p99
            within this multiple of its p99 measured with no best-effort work on the device.
        latency_error_budget: the most jobs over its target a kind may bank before the
            controller holds best-effort work back further (its error budget: over time 1% of
            its jobs may be over the target; a bigger budget absorbs longer bursts of them
            and reacts later to a lasting change).
        throttle: pins when best-effort holders pause at :meth:`Lease.checkpoint`: ``"held"``
            (while a latency-critical lease is held or waiting on the device), ``"waiting"``
            (only while one waits), ``"off"``. None: the controller's (``"held"`` without it).
        best_effort_in_flight: pins how many of a best-effort holder's slices may be queued or
            running on the device at once (0: no bound). None: the controller's (2 without it).
        best_effort_max_pause: the longest one pause lasts before the holder runs one more
            slice anyway, in seconds (None: no limit).
        reserved_sms: pins the SMs of each device kept free of best-effort work: best-effort
            streams then run on a green context of the other SMs (0: no partition); raises
            RuntimeError naming the reason where the driver cannot (CUDA 12.5+ needed). None:
            the controller's (partitions where the driver can make them; none without it).
        device_yield: pins whether octopus's ragged kernels launched on best-effort streams
            step aside on the device while a latency-critical lease is held there: they stop
            claiming work within a block of elements and continue once the lease's work is
            done (or after a bound: twice the recent latency-critical holds, 1 to 10 ms), with
            results bit for bit those of an ordinary launch (the guide's "Best-effort kernels
            that step aside"). None: the controller's (on at every step but its first, for the
            latency-critical kinds it finds need it; off without it). Pinned on, every
            latency-critical lease makes them step aside.
        infeasible_deadline: ``"reject"`` (raise :class:`DeadlineMissed` at once) or
            ``"promote"`` (make it latency-critical) for a request whose deadline cannot be
            met by the estimate from its kind's recent hold times.
        target_utilization: adapt each device's lease limit (between ``min_leases_per_device``
            and ``max_leases_per_device``) to keep its NVML utilization near this fraction,
            sampled every ``utilization_interval`` s. Without NVML the limit stays fixed.
        min_leases_per_device: the adaptive lease limit's floor.
        utilization_interval: seconds between utilization samples.
    """

    max_leases_per_device: int = 4
    max_best_effort_leases: int | None = _option(None, "max_best_effort_leases_per_device", _count_or_default)
    max_occupancy: float = 1.0
    default_occupancy: float = 0.0
    memory_reserve: float = 0.0
    memory_poll_interval: float = _option(0.002, "memory_poll_interval_s")
    timeout: float | None = _option(None, "timeout_s", _seconds_or_forever)
    devices: Sequence[int] | None = _option(None, convert=lambda v: [] if v is None else [int(d) for d in v])
    record_timeline: bool = False
    timeline_capacity: int = 1 << 20
    latency_control: bool = True
    latency_ratio: float = 1.5
    latency_error_budget: float = 2.0
    throttle: str | None = None
    best_effort_in_flight: int | None = None
    best_effort_max_pause: float | None = _option(0.25, "best_effort_max_pause_s", _seconds_or_forever)
    reserved_sms: int | None = None
    device_yield: bool | None = None
    infeasible_deadline: str = "reject"
    target_utilization: float | None = None
    min_leases_per_device: int = 1
    utilization_interval: float = _option(0.1, "utilization_interval_s")

    def __post_init__(self) -> None:
        if self.timeout is not None and (math.isnan(float(self.timeout)) or float(self.timeout) < 0):
            raise ValueError(f"timeout must be a non-negative number of seconds or None (wait for ever), "
                             f"got {self.timeout}")
        if self.best_effort_max_pause is not None and not float(self.best_effort_max_pause) >= 0:
            raise ValueError(f"best_effort_max_pause must be a non-negative number of seconds or None, "
                             f"got {self.best_effort_max_pause}")

    def native(self) -> Any:
        """The C++ SchedulerConfig of these options, validated (ValueError naming a bad one)."""
        out = _library._C.SchedulerConfig()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            convert = field.metadata.get("convert")
            try:
                setattr(out, field.metadata.get("native") or field.name, convert(value) if convert else value)
            except TypeError:
                raise TypeError(f"{field.name} must be {field.type}, got {value!r}") from None
        out.validate()
        return out

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

"""The ways of running a workload's LC and BE jobs side by side that the benchmark compares
(its peers): each LC job alone, each BE job alone, plain streams, priority streams, a sweep
of fixed lease configurations (the best of which is the oracle a user would find by hand),
and octopus's latency controller with no settings at two targets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence


@dataclass
class Mode:
    """How a workload's jobs run. ``lc`` / ``be``: "none" (not run), "normal" (a stream of
    their own), "high" (LC on a high-priority stream) or "lease" (leases of one
    StreamScheduler made with ``options``; BE slices of ``slice_budget_s`` device seconds
    each, or, with None, as the scheduler sizes them)."""

    name: str
    lc: str
    be: str
    options: Dict[str, Any] = field(default_factory=dict)
    slice_budget_s: Optional[float] = None
    kind: str = "peer"  # "alone", "peer", "sweep" or "controller"
    target_ratio: Optional[float] = None  # controller modes: latency_ratio


# Fixed lease configurations a user could pick (latency control off, every knob pinned):
# (name, reserved SMs, in-flight bound, throttle, BE slice length in seconds or None, whether
# octopus's BE kernels yield on the device while LC leases are held).
SWEEP = [
    ("leases", 0, 0, "off", None, False),
    ("slices 1 ms", 0, 2, "off", 1e-3, False),
    ("slices 0.5 ms, in-flight 1", 0, 1, "off", 0.5e-3, False),
    ("throttle + slices 1 ms", 0, 2, "held", 1e-3, False),
    ("throttle + slices 0.25 ms, in-flight 1", 0, 1, "held", 0.25e-3, False),
    ("partition 8", 8, 0, "off", None, False),
    ("partition 16", 16, 0, "off", None, False),
    ("partition 24 + slices 1 ms", 24, 2, "off", 1e-3, False),
    ("partition 16 + slices 0.5 ms, in-flight 1", 16, 1, "off", 0.5e-3, False),
    ("partition 24 + throttle + slices 0.5 ms, in-flight 1", 24, 1, "held", 0.5e-3, False),
    ("device yield", 0, 0, "off", None, True),
    ("partition 8 + device yield", 8, 0, "off", None, True),
    ("partition 16 + device yield", 16, 0, "off", None, True),
    # The latency controller's steps of larger partitions (its ladder, latency_controller.h).
    ("partition 24 + device yield", 24, 0, "off", None, True),
    ("partition 32 + device yield", 32, 0, "off", None, True),
    # Step 3's settings with BE holders also paused at their checkpoints while LC leases are
    # held, their work left whole: whether a BE thread kept off the GIL then shortens the LC
    # jobs' host time (benchmarks/README.md#contention, thirty-fourth session).
    ("partition 24 + device yield + throttle", 24, 0, "held", None, True),
]

TARGET_RATIOS = (1.5, 3.0)


def interference_modes(free_sms: Sequence[int]) -> List[Mode]:
    """Fixed SM partitions (BE on the rest, no slicing, no throttling), one per count of SMs
    kept free of BE work: run with one BE job at a time, they show which BE jobs a partition
    protects the LC jobs from (compute-bound ones) and which it cannot (a memory-bound job
    fills DRAM's bandwidth from a few SMs)."""
    return [Mode(f"partition {sms}", "lease", "lease", kind="interference",
                 options=dict(latency_control=False, reserved_sms=sms, best_effort_in_flight=0, throttle="off"))
            for sms in free_sms]


def modes(sweep: bool = True, error_budgets: Sequence[float] | None = None, pinned_yield: bool = False) -> List[Mode]:
    """Every mode of one workload, in the order they run; with ``error_budgets``, the
    controller at each target once per ``latency_error_budget`` (an A/B of the controller);
    with ``pinned_yield``, the controller at each target also with ``device_yield`` pinned on
    (every LC lease closes the yield gate: no kind's gate tried open)."""
    out = [Mode("LC alone", "normal", "none", kind="alone"),
           Mode("BE alone", "none", "normal", kind="alone"),
           Mode("plain streams", "normal", "normal"),
           Mode("priority streams", "high", "normal")]
    if sweep:
        out += [Mode(f"fixed: {name}", "lease", "lease", kind="sweep", slice_budget_s=budget,
                     options=dict(latency_control=False, reserved_sms=sms, best_effort_in_flight=in_flight,
                                  throttle=throttle, device_yield=device_yield))
                for name, sms, in_flight, throttle, budget, device_yield in SWEEP]
    if not error_budgets:
        out += [Mode(f"octopus latency control, target {r:g}x", "lease", "lease", kind="controller", target_ratio=r,
                     options=dict(latency_ratio=r)) for r in TARGET_RATIOS]
    else:
        out += [Mode(f"octopus latency control, target {r:g}x, error budget {b:g}", "lease", "lease",
                     kind="controller", target_ratio=r, options=dict(latency_ratio=r, latency_error_budget=b))
                for r in TARGET_RATIOS for b in error_budgets]
    if pinned_yield:
        out += [Mode(f"octopus latency control, target {r:g}x, yield pinned", "lease", "lease", kind="controller",
                     target_ratio=r, options=dict(latency_ratio=r, device_yield=True)) for r in TARGET_RATIOS]
    return out

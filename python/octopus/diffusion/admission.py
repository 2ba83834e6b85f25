"""The continuous sampler's admission policy, as a pure function from plain values to a plan.

At every iteration the sampler tells :func:`plan_admission` what runs, what waits, its budget
and the time, and carries out the :class:`AdmissionPlan` it gets back: which waiting requests
fail for a missed deadline, which running ones are parked (preempted), which waiting ones join.
No threads, tensors or clocks here, so the policy is tested on values alone
(tests/python/test_admission_planner.py).

The policy:

- Waiting requests are served by priority (higher first), then earliest deadline, then arrival;
  a request that has not started by its deadline fails.
- The head of the queue joins while it fits: fewer requests than the batch cap run, and its
  bytes fit the memory budget beside theirs. Admission stops at the first that does not fit, so
  no request overtakes one served before it.
- The batch cap is ``max_batch``, or ``high_priority_batch`` (where smaller) while a request of
  priority :data:`HIGH_PRIORITY` or more runs or heads the queue.
- With ``preempt``, before admitting, the lowest-priority running request (the latest arrived
  among equals) is parked, again and again, while the batch is above its cap (where that
  request's priority is below :data:`HIGH_PRIORITY`) or the head of the queue has a higher
  priority than it and does not fit. A parked request waits again at its old place (its
  arrival and deadline); having started, it no longer expires.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Sequence

HIGH_PRIORITY = 1  # "high" (StreamScheduler's scale): what high_priority_batch protects


@dataclasses.dataclass(frozen=True)
class Candidate:
    """What admission knows of a request, running or waiting."""

    arrival: int             # its number in arrival order (unique): names it in a plan
    priority: int            # higher first
    deadline: float | None   # when it must have started by (the clock of ``now``); None: never
    bytes: int               # its memory estimate
    started: bool = False    # it has run (a parked request, waiting again): it cannot expire


@dataclasses.dataclass(frozen=True)
class Budget:
    """What the running requests may take (the sampler's settings of the same names)."""

    max_batch: int
    high_priority_batch: int | None = None
    memory_budget: int | None = None
    preempt: bool = False


@dataclasses.dataclass(frozen=True)
class AdmissionPlan:
    """One iteration's decisions, as arrival numbers, each in the order to carry it out: the
    expired requests fail, then the parked ones leave the batch (and wait again), then the
    admitted ones join it (a request parked here may be admitted again)."""

    expired: tuple[int, ...]
    parked: tuple[int, ...]
    admitted: tuple[int, ...]
    batch_cap: int  # the batch cap in force once the plan is carried out


def service_order(candidate: Candidate) -> tuple[int, float, int]:
    """The key waiting requests are served in: priority, then deadline, then arrival."""
    deadline = math.inf if candidate.deadline is None else candidate.deadline
    return -candidate.priority, deadline, candidate.arrival


def plan_admission(running: Sequence[Candidate], waiting: Sequence[Candidate], budget: Budget,
                   now: float) -> AdmissionPlan:
    """This iteration's decisions for ``running`` (in any order) and ``waiting`` (in
    :func:`service_order`: the sampler keeps its queue so, and nothing is sorted here, an
    iteration's cost with a long queue), at time ``now``."""
    expired = [c for c in waiting if not c.started and c.deadline is not None and c.deadline < now]
    late = {c.arrival for c in expired}
    queue = [c for c in waiting if c.arrival not in late] if late else list(waiting)
    batch = list(running)
    parked: list[Candidate] = []
    while budget.preempt and batch:
        victim = min(batch, key=lambda c: (c.priority, -c.arrival))  # the latest arrived of the lowest
        head = queue[0] if queue else None
        over_cap = len(batch) > _batch_cap(budget, batch, head) and victim.priority < HIGH_PRIORITY
        blocked = head is not None and head.priority > victim.priority and not _fits(budget, batch, head)
        if not (over_cap or blocked):
            break
        batch.remove(victim)
        parked.append(victim)
        bisect.insort(queue, victim, key=service_order)
    admitted: list[Candidate] = []
    for head in queue:
        if not _fits(budget, batch, head):
            break
        batch.append(head)
        admitted.append(head)
    next_head = queue[len(admitted)] if len(queue) > len(admitted) else None
    return AdmissionPlan(expired=tuple(c.arrival for c in expired), parked=tuple(c.arrival for c in parked),
                         admitted=tuple(c.arrival for c in admitted), batch_cap=_batch_cap(budget, batch, next_head))


def _batch_cap(budget: Budget, batch: Sequence[Candidate], head: Candidate | None) -> int:
    urgent = any(c.priority >= HIGH_PRIORITY for c in batch) or (head is not None and head.priority >= HIGH_PRIORITY)
    if urgent and budget.high_priority_batch is not None:
        return min(budget.max_batch, budget.high_priority_batch)
    return budget.max_batch


def _fits(budget: Budget, batch: Sequence[Candidate], head: Candidate) -> bool:
    """Whether ``head`` (the head of the queue) may join ``batch``."""
    if len(batch) >= _batch_cap(budget, batch, head):
        return False
    return budget.memory_budget is None or sum(c.bytes for c in batch) + head.bytes <= budget.memory_budget

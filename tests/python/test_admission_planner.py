"""octopus.diffusion.admission: the continuous sampler's admission plans, from plain values
alone (no sampler, no threads, no clock). Each case states the facts and the plan expected of
them; the properties check random states against the policy's guarantees (the examples are
derandomized: the same on every run)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from octopus.diffusion.admission import AdmissionPlan, Budget, Candidate, plan_admission, service_order

LOW, NORMAL, HIGH = -1, 0, 1


def request(arrival, priority=NORMAL, deadline=None, bytes=1, started=False):
    return Candidate(arrival, priority, deadline, bytes, started)


def plan(running=(), waiting=(), now=0.0, **budget):
    """The plan for ``waiting`` in any order (the sampler keeps its queue in service order)."""
    return plan_admission(list(running), sorted(waiting, key=service_order), Budget(**budget), now)


def test_waiting_requests_join_by_priority_then_deadline_then_arrival():
    waiting = [request(0, LOW), request(1, NORMAL, deadline=60.0), request(2, NORMAL), request(3, HIGH),
               request(4, NORMAL, deadline=30.0), request(5, 5), request(6, NORMAL), request(7, NORMAL, deadline=30.0)]
    for listed in (waiting, waiting[::-1]):  # in whatever order they arrived
        assert plan(waiting=listed, max_batch=8).admitted == (5, 3, 4, 7, 1, 2, 6, 0)
        assert plan(waiting=listed, max_batch=3).admitted == (5, 3, 4)


def test_admission_stops_at_the_first_request_that_does_not_fit():
    # The high-priority request needs more memory than is free: the small one behind it waits too.
    waiting = [request(1, HIGH, bytes=8), request(2, NORMAL, bytes=1)]
    assert plan([request(0, bytes=5)], waiting, max_batch=4, memory_budget=10).admitted == ()


def test_the_memory_budget_admits_only_what_fits():
    waiting = [request(i, bytes=3) for i in (1, 2, 3)]
    assert plan([request(0, bytes=4)], waiting, max_batch=8, memory_budget=10).admitted == (1, 2)  # 4 + 3 + 3
    assert plan([request(0, bytes=4)], waiting, max_batch=8, memory_budget=9).admitted == (1,)
    assert plan([request(0, bytes=4)], waiting, max_batch=8).admitted == (1, 2, 3)


def test_max_batch_counts_the_running_requests():
    waiting = [request(i) for i in (3, 4, 5)]
    result = plan([request(0), request(1), request(2)], waiting, max_batch=4)
    assert result == AdmissionPlan(expired=(), parked=(), admitted=(3,), batch_cap=4)


def test_high_priority_batch_caps_the_batch_while_high_priority_work_waits_or_runs():
    normals = [request(i) for i in (1, 2, 3)]
    # Waiting: it joins first, and the batch stops at the cap.
    assert plan(waiting=[request(0, HIGH)] + normals, max_batch=4, high_priority_batch=2) == AdmissionPlan(
        expired=(), parked=(), admitted=(0, 1), batch_cap=2)
    # Running.
    assert plan([request(0, HIGH)], normals, max_batch=4, high_priority_batch=2) == AdmissionPlan(
        expired=(), parked=(), admitted=(1,), batch_cap=2)
    # Neither: the whole batch.
    assert plan([request(0)], normals, max_batch=4, high_priority_batch=2) == AdmissionPlan(
        expired=(), parked=(), admitted=(1, 2, 3), batch_cap=4)
    # A cap above max_batch changes nothing.
    assert plan([request(0, HIGH)], normals, max_batch=3, high_priority_batch=8).batch_cap == 3


def test_preemption_parks_the_lowest_priority_member_for_a_higher_priority_waiter():
    running = [request(0, NORMAL), request(1, LOW), request(2, LOW), request(3, NORMAL)]
    waiting = [request(4, HIGH)]
    # The latest of the lowest priority makes way.
    assert plan(running, waiting, max_batch=4, preempt=True) == AdmissionPlan(
        expired=(), parked=(2,), admitted=(4,), batch_cap=4)
    assert plan(running, waiting, max_batch=4, preempt=False) == AdmissionPlan(
        expired=(), parked=(), admitted=(), batch_cap=4)
    # Not for a waiter of the same priority as the lowest running.
    assert plan(running[:1] + running[3:], [request(4, NORMAL)], max_batch=2, preempt=True).parked == ()
    # As many as it takes to free the memory it needs.
    running = [request(0, LOW, bytes=2), request(1, LOW, bytes=2), request(2, NORMAL, bytes=2)]
    assert plan(running, [request(3, HIGH, bytes=5)], max_batch=8, memory_budget=8, preempt=True) == AdmissionPlan(
        expired=(), parked=(1, 0), admitted=(3,), batch_cap=8)


def test_a_parked_request_waits_at_its_place_and_may_rejoin_at_once():
    # Both low-priority requests make way (the later first) for 5 bytes; the earlier deadline
    # of the smaller one then puts it first in line, and it fits again beside the newcomer.
    running = [request(0, LOW, bytes=6), request(1, LOW, deadline=5.0, bytes=2)]
    assert plan(running, [request(2, HIGH, bytes=5)], max_batch=4, memory_budget=10, preempt=True) == AdmissionPlan(
        expired=(), parked=(1, 0), admitted=(2, 1), batch_cap=4)


def test_preemption_brings_the_batch_down_to_the_high_priority_cap():
    running = [request(0, LOW), request(1, LOW), request(2, LOW)]
    # The three low-priority requests are parked for one high-priority one with a cap of 1: two
    # for the cap, the last for a place.
    assert plan(running, [request(3, HIGH)], max_batch=4, high_priority_batch=1, preempt=True) == AdmissionPlan(
        expired=(), parked=(2, 1, 0), admitted=(3,), batch_cap=1)
    # Above the cap while a high-priority request runs, with nothing waiting: the lowest-priority
    # member is parked, down to the cap.
    running = [request(0, HIGH), request(1, NORMAL), request(2, LOW)]
    assert plan(running, [], max_batch=4, high_priority_batch=2, preempt=True) == AdmissionPlan(
        expired=(), parked=(2,), admitted=(), batch_cap=2)
    # High-priority requests are not parked to meet the cap.
    running = [request(0, HIGH), request(1, HIGH), request(2, HIGH)]
    assert plan(running, [], max_batch=4, high_priority_batch=1, preempt=True).parked == ()


def test_expired_deadlines_fail_only_their_own_request():
    waiting = [request(1, NORMAL, deadline=5.0), request(2, NORMAL, deadline=20.0), request(3, NORMAL),
               request(4, LOW, deadline=10.0),  # due now: not yet late
               request(5, NORMAL, deadline=4.0, started=True)]  # parked: it has started, so it cannot expire
    assert plan(waiting=waiting, now=10.0, max_batch=8) == AdmissionPlan(
        expired=(1,), parked=(), admitted=(5, 2, 3, 4), batch_cap=8)


def test_an_empty_queue_changes_nothing():
    running = [request(0, LOW, bytes=4), request(1, NORMAL, bytes=4), request(2, NORMAL, bytes=4)]
    assert plan(running, [], max_batch=4, high_priority_batch=2, memory_budget=12, preempt=True) == AdmissionPlan(
        expired=(), parked=(), admitted=(), batch_cap=4)
    assert plan(max_batch=1, preempt=True) == AdmissionPlan(expired=(), parked=(), admitted=(), batch_cap=1)


@st.composite
def states(draw):
    """A budget, running requests within max_batch, waiting ones, and the time (1.0): priorities
    low to above high, deadlines before and after now, some waiting requests parked."""
    max_batch = draw(st.integers(1, 6))
    budget = Budget(max_batch=max_batch, high_priority_batch=draw(st.none() | st.integers(1, max_batch + 1)),
                    memory_budget=draw(st.none() | st.integers(10, 40)), preempt=draw(st.booleans()))
    n_running, n_waiting = draw(st.integers(0, max_batch)), draw(st.integers(0, 10))
    arrivals = draw(st.permutations(range(n_running + n_waiting)))

    def candidate(arrival, started):
        return Candidate(arrival, draw(st.sampled_from([LOW, NORMAL, HIGH, 2])),
                         draw(st.none() | st.floats(0.0, 2.0)), draw(st.integers(1, 10)), started)

    running = [candidate(a, True) for a in arrivals[:n_running]]
    waiting = [candidate(a, draw(st.booleans())) for a in arrivals[n_running:]]
    return running, waiting, budget


@settings(max_examples=500, deadline=None, derandomize=True, database=None)
@given(states())
def test_plans_keep_to_the_budget_and_park_only_for_higher_priorities(state):
    running, waiting, budget = state
    result = plan_admission(running, sorted(waiting, key=service_order), budget, now=1.0)
    by_arrival = {c.arrival: c for c in running + waiting}
    assert set(result.expired) == {c.arrival for c in waiting
                                   if not c.started and c.deadline is not None and c.deadline < 1.0}
    assert set(result.parked) <= {c.arrival for c in running} and len(set(result.parked)) == len(result.parked)
    assert set(result.admitted) <= ({c.arrival for c in waiting} - set(result.expired)) | set(result.parked)
    batch = [c for c in running if c.arrival not in result.parked] + [by_arrival[a] for a in result.admitted]
    assert len(batch) <= budget.max_batch
    if result.admitted:
        assert len(batch) <= result.batch_cap
        assert budget.memory_budget is None or sum(c.bytes for c in batch) <= budget.memory_budget
    if not budget.preempt:
        assert result.parked == ()
    still_parked = set(result.parked) - set(result.admitted)
    for a in result.admitted:
        assert all(by_arrival[p].priority <= by_arrival[a].priority for p in still_parked)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(states(), st.randoms(use_true_random=False))
def test_plans_do_not_depend_on_the_order_running_requests_are_given_in(state, rng):
    running, waiting, budget = state
    result = plan_admission(running, sorted(waiting, key=service_order), budget, now=1.0)
    shuffled = plan_admission(rng.sample(running, len(running)), sorted(waiting, key=service_order), budget, now=1.0)
    assert (set(shuffled.expired), shuffled.parked, shuffled.admitted, shuffled.batch_cap) == (
        set(result.expired), result.parked, result.admitted, result.batch_cap)

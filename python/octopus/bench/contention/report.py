"""What the contention benchmark reports of its modes: each LC job's p50 and p99 over its own
alone p50 and p99 and the share of its jobs within a target (1.5x and 3x its alone p99),
every BE job's throughput over its alone throughput (the minimum, not only the mean), the SM
clock; whether each mode meets the targets, and which fixed configuration (the oracle) came
closest."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..._timing import percentile

# The targets' second half: LC p50 within this of the alone p50, every BE job at least this
# share of its alone throughput, at least this share of LC jobs within the latency target.
P50_RATIO = 2.0
BE_SHARE = 0.80
ATTAINMENT = 0.99


# What every ratio is taken against: each LC job's alone p50 and p99 (ms), each BE job's alone
# throughput (units per second).
Reference = Tuple[Dict[str, Dict[str, float]], Dict[str, float]]


def alone_reference(rows: List[Dict[str, Any]]) -> Reference:
    """Each LC job's alone p50 and p99, of the jobs of every "LC alone" row pooled (the
    command measures one before the other modes and one after them), and each BE job's
    throughput in the "BE alone" row."""
    alone_lc: Dict[str, List[float]] = {}
    for r in rows:
        if r["name"] == "LC alone" and "lc_ms" in r:
            for name, ms in r["lc_ms"].items():
                alone_lc.setdefault(name, []).extend(ms)
    alone_be = next((r for r in rows if r["name"] == "BE alone" and "be_per_s" in r), None)
    base = {name: dict(p50_ms=percentile(ms, 50), p99_ms=percentile(ms, 99)) for name, ms in alone_lc.items() if ms}
    return base, dict((alone_be or {}).get("be_per_s", {}))


def summarize(rows: List[Dict[str, Any]], target_ratios: tuple = (1.5, 3.0),
              reference: Optional[Reference] = None) -> Dict[str, Any]:
    """Adds ratios and verdicts to every row and returns the workload's summary: the alone
    figures and the oracle row's name. The ratios are against ``reference`` where given (runs
    of several calls judged alike: ``pooled.py``), else against the alone rows among ``rows``
    (``alone_reference``)."""
    base, be_base = reference if reference is not None else alone_reference(rows)
    for r in rows:
        if "error" in r:
            continue
        jobs = {}
        for name, ms in r.get("lc_ms", {}).items():
            if not ms or name not in base:
                continue
            job: Dict[str, Any] = dict(p50_ms=percentile(ms, 50), p99_ms=percentile(ms, 99), samples=len(ms))
            start = r.get("lc_start_ms", {}).get(name)
            if start:  # the host's part: arrival until the job's thread runs
                job.update(start_p50_ms=percentile(start, 50), start_p99_ms=percentile(start, 99))
            job["p50_over_alone_p50"] = job["p50_ms"] / base[name]["p50_ms"]
            job["p99_over_alone_p99"] = job["p99_ms"] / base[name]["p99_ms"]
            for t in target_ratios:
                limit = t * base[name]["p99_ms"]
                job[f"within_{t:g}x"] = sum(v <= limit for v in ms) / len(ms)
                if start and len(start) == len(ms):
                    # Of the jobs over the target, the share that were mostly the host's: their
                    # thread began over half their time late (no device setting helps those).
                    late = [s > v / 2 for v, s in zip(ms, start) if v > limit]
                    job[f"over_{t:g}x_host_share"] = sum(late) / len(late) if late else None
            jobs[name] = job
        r["lc"] = jobs
        shares = {name: rate / be_base[name] for name, rate in r.get("be_per_s", {}).items() if be_base.get(name)}
        r["be_share"] = shares
        r["be_share_min"] = min(shares.values()) if shares else None
        if jobs and shares:
            r["meets"] = {f"{t:g}x": all(j[f"within_{t:g}x"] >= ATTAINMENT and j["p50_over_alone_p50"] <= P50_RATIO
                                         for j in jobs.values()) and min(shares.values()) >= BE_SHARE
                          for t in target_ratios}
    sweep = [r for r in rows if r.get("kind") == "sweep" and "meets" in r]
    first = f"{target_ratios[0]:g}x"
    oracle: Optional[Dict[str, Any]] = None
    meeting = [r for r in sweep if r["meets"][first]]
    if meeting:
        oracle = max(meeting, key=lambda r: r["be_share_min"])
    elif sweep:  # none meets it: the one that comes closest on latency
        oracle = max(sweep, key=lambda r: min(j[f"within_{first}"] for j in r["lc"].values()))
    return dict(lc_alone=base, be_alone_per_s=be_base, oracle=oracle["name"] if oracle else None)


def format_table(rows: List[Dict[str, Any]], oracle: Optional[str] = None) -> str:
    """One line per mode: per LC job p50 and p99 over alone and the share within 1.5x (and of
    those over it, the share late on the host); BE's minimum and each job's share; the SM clock;
    the verdicts."""
    lines = []
    for r in rows:
        mark = " (oracle)" if r["name"] == oracle else ""
        if "error" in r:
            lines.append(f"{r['name'] + mark:<58} error: {r['error'][:120]}")
            continue
        lc = "  ".join(f"{name} {j['p50_over_alone_p50']:.2f}/{j['p99_over_alone_p99']:.2f}x "
                       f"{100 * j['within_1.5x']:.1f}%" + _host_share(j) for name, j in r.get("lc", {}).items())
        be = "  ".join(f"{name} {100 * s:.0f}%" for name, s in r.get("be_share", {}).items())
        minimum = f"min {100 * r['be_share_min']:.0f}%" if r.get("be_share_min") is not None else ""
        clock = f"{r['sm_clock_mhz']:.0f} MHz" if r.get("sm_clock_mhz") else ""
        meets = " ".join(f"{k}:{'yes' if v else 'no'}" for k, v in r.get("meets", {}).items())
        stalls = f" | {len(r['stalls'])} stalls" if r.get("stalls") else ""
        lines.append(f"{r['name'] + mark:<58} LC p50/p99 over alone, within 1.5x: {lc or '-'} | BE {minimum} {be} | "
                     f"{clock} {meets}".rstrip() + stalls + _controller_path(r.get("control"))
                     + _controller_steps(r.get("control"))
                     + _controller_window(r.get("control_window"))
                     + _controller_view(r.get("control"), r.get("lc_arrival", False))
                     + _be_slicing(r.get("be_slicing")))
    return "\n".join(lines)


def _host_share(job: Dict[str, Any]) -> str:
    """Of an LC job's jobs over 1.5x its alone p99, the share whose thread began late (where
    any are over)."""
    share = job.get("over_1.5x_host_share")
    return "" if share is None else f" (host {100 * share:.0f}%)"


def _controller_path(control: Optional[Dict[str, Any]]) -> str:
    """Where the latency controller spent the run: its final step, the share of the time at
    each step, its climbs (those for a median over its bound) and descents (those from a step
    over target whose step below was on record as no worse), the BE kinds it released and the
    LC kinds whose leases it left without the yield gate (where it tried any)."""
    if not control or not control.get("enabled") or "seconds_at_steps" not in control:
        return ""
    seconds = control["seconds_at_steps"]
    total = sum(seconds) or 1.0
    shares = " ".join(f"{100 * t / total:.0f}" for t in seconds)
    path = (f" | step {control['step']}/{control['steps'] - 1}, % of time per step [{shares}], "
            f"climbs {control['climbs']} ({control['median_climbs']} median), descents {control['descents']}")
    if control.get("unhelpful_descents"):  # from a step over target, the step below on record as no worse
        path += f" ({control['unhelpful_descents']} from steps over target)"
    released = control.get("best_effort_kinds") or {}
    if any(b["trials"] for b in released.values()):  # the BE kinds it tried releasing: tries, undone
        path += (" | released " + (", ".join(name for name, b in released.items() if b["released"]) or "none") +
                 " (tries/undone: " + ", ".join(f"{name} {b['trials']}/{b['failures']}" for name, b in released.items())
                 + ")")
    kinds = control.get("kinds") or {}
    if any(k.get("gate_trials") for k in kinds.values()):  # the LC kinds it tried without the gate
        opened = ", ".join(name for name, k in kinds.items() if not k["closes_gate"]) or "none"
        tries = ", ".join(f"{name} {k['gate_trials']}/{k['gate_failures']}" for name, k in kinds.items())
        path += f" | gate open for {opened} (tries/undone: {tries}{_gate_tails(kinds, control['step'])})"
    return path


def _gate_tails(kinds: Dict[str, Any], step: int) -> str:
    """Per LC kind, its share of jobs over target at ``step`` with the gate closed and open
    (where its stats have tails: builds before them have none)."""
    def share(tail: Any) -> str:
        return f"{100 * tail[1] / tail[0]:.1f}% of {tail[0]:.0f}" if tail[0] else "-"
    tails = [f"{name} {share(k['steps'][step]['closed_tail'])} / {share(k['steps'][step]['open_tail'])}"
             for name, k in kinds.items() if step < len(k.get("steps") or []) and "closed_tail" in k["steps"][step]]
    return f"; over target at the step, gate closed / open: {', '.join(tails)}" if tails else ""


def _over(value: Optional[float], alone: float) -> str:
    """A step's percentile over the alone one; "-" where the step has none (its jobs all ran
    with the yield gate left open, or before the step's own work was on the device)."""
    return "-" if value is None else f"{value / alone:.2f}"


def _controller_steps(control: Optional[Dict[str, Any]], min_jobs: int = 20) -> str:
    """A second line: per LC kind, what each step the controller held (for min_jobs of its jobs
    or more) bought it over the run: its p50 / p99 there over its own alone p50 / p99 (the
    controller's timing, request to completion on the device), and its jobs there."""
    if not control or not control.get("enabled"):
        return ""
    parts = []
    for name, k in control.get("kinds", {}).items():
        alone_p50, alone_p99 = k.get("alone_p50_s"), k.get("alone_p99_s")
        if not alone_p50 or not alone_p99:
            continue
        steps = [f"s{i} {_over(at['p50_s'], alone_p50)}/{_over(at['p99_s'], alone_p99)} ({at['jobs']})"
                 for i, at in enumerate(k.get("steps", [])) if at["jobs"] >= min_jobs]
        if steps:
            parts.append(f"{name} " + ", ".join(steps))
    return "\n    by step, p50/p99 over alone (jobs): " + "; ".join(parts) if parts else ""


def _controller_window(window: Optional[Dict[str, Any]]) -> str:
    """A line: the measured window's share of time at each step, and per LC kind its jobs over
    the target (the controller's count) at the step held longest and at the others: what the
    controller's moves cost beside what its resting step does."""
    if not window or not sum(window["seconds_at_steps"]):
        return ""
    seconds = window["seconds_at_steps"]
    rest = max(range(len(seconds)), key=lambda i: seconds[i])
    shares = " ".join(f"{100 * t / sum(seconds):.0f}" for t in seconds)

    def over(steps: List[Dict[str, int]]) -> str:
        jobs, late = sum(s["jobs"] for s in steps), sum(s["over"] for s in steps)
        return f"{late} of {jobs}" + (f" ({100 * late / jobs:.1f}%)" if jobs else "")

    kinds = "; ".join(f"{name} {over(steps[rest:rest + 1])} / {over(steps[:rest] + steps[rest + 1:])}"
                      for name, steps in window["kinds"].items())
    return (f"\n    in the window: % of time per step [{shares}]; over target at s{rest} / at the other steps: "
            + kinds)


def _controller_view(control: Optional[Dict[str, Any]], lc_arrival: bool = False) -> str:
    """A third line: per LC kind, the share of its jobs within its target by the controller's
    own count, the target and the alone p99 it came from. The controller times a job from its
    request (its arrival with ``lc_arrival``) to its completion on the device and takes its
    alone p99 from its probes; the table times arrival to the thread seeing completion against
    the LC-alone mode, so the two can disagree (a thread that starts late; probes at lowered
    clocks)."""
    if not control or not control.get("enabled"):
        return ""
    parts = [f"{name} {100 * k['within_target'] / k['judged']:.1f}% within {1e3 * k['target_s']:.3f} ms "
             f"(alone p99 {1e3 * k['alone_p99_s']:.3f})"
             for name, k in control.get("kinds", {}).items()
             if k.get("judged") and k.get("target_s") and k.get("alone_p99_s")]
    start = "arrival" if lc_arrival else "request"
    return f"\n    the controller's view ({start} to completion on the device): " + "; ".join(parts) if parts else ""


def _be_slicing(slicing: Optional[Dict[str, Any]]) -> str:
    """A line under a lease mode: each BE job's slices as the scheduler measured them, the
    host's time per slice (checkpoint to checkpoint: the launch and, in Python, GIL waits) and
    the device's per unit. A slice's budget is raised to twice that host time, so where it is
    large the slices hold little back."""
    parts = []
    for name, measured in (slicing or {}).items():
        host, per_unit = measured.get("host_seconds_per_slice"), measured.get("seconds_per_unit")
        if host is None and per_unit is None:
            continue
        parts.append(f"{name} " + ", ".join(([f"host {1e3 * host:.3f} ms a slice"] if host is not None else []) +
                                            ([f"device {per_unit:.3g} s a unit"] if per_unit is not None else [])))
    return "\n    BE slices, by the scheduler's measure: " + "; ".join(parts) if parts else ""


def met_counts(runs: List[Dict[str, Any]]) -> str:
    """In how many of ``runs`` (rows of one mode, with verdicts) each target was met."""
    return ", ".join(f"{t} in {sum(r['meets'][t] for r in runs)} of {len(runs)}" for t in runs[0]["meets"])


def format_repeats(rows: List[Dict[str, Any]]) -> str:
    """Per mode run more than once: in how many of its runs it met each target, and the range
    of its minimum BE share."""
    by_mode: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        if "meets" in r:
            by_mode.setdefault(r["name"], []).append(r)
    lines = []
    for name, runs in by_mode.items():
        if len(runs) < 2:
            continue
        shares = [r["be_share_min"] for r in runs]
        lines.append(f"{name:<58} met {met_counts(runs)} runs | BE min {100 * min(shares):.0f}-{100 * max(shares):.0f}%")
    return "\n".join(lines)

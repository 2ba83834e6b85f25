"""``octopus-bench contention --judge FILE ...``: the runs of several raw results (``--json``)
judged against one reference per workload family, the median over every alone row in those
files: each LC job's alone p50 and p99 (the median of the rows' p50s, of their p99s) and each
BE job's alone throughput. One call's own alone rows (two 15-s windows) move with the host's
bursts: over the ten transformer LC-alone rows of one session on an H200 the encoder's alone
p99 ran from 0.42 to 1.93 ms, 0.47 at the median. Runs of different calls, the halves of an
A/B above all, are compared against the same figures here.

Runs are grouped by their file's name less a trailing number (``ab_mlp_A1.json`` and
``ab_mlp_A2.json.gz`` make group ``ab_mlp_A``) and, within a group, by workload family and
mode."""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import statistics
from typing import Any, Dict, List, Tuple

from ..._timing import percentile
from . import report

# A run that spent more than this share of its measured window at the top step (everything
# held back) is counted apart: the controller stuck where best-effort work gets least.
TOP_STEP_SHARE = 0.5


def load(path: str) -> Dict[str, Any]:
    """One raw result of ``octopus-bench contention --json`` (gzipped or not)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            result = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot be read as JSON ({error})") from None
    if not isinstance(result, dict) or not isinstance(result.get("workloads"), list):
        raise ValueError(f"{path}: not a raw result of octopus-bench contention (no 'workloads' list)")
    return result


def group_of(path: str) -> str:
    """A file's group: its name without directories, suffixes and a trailing run number."""
    name = os.path.basename(path)
    name = re.sub(r"(\.json)?(\.gz)?$", "", name)
    return re.sub(r"\d+$", "", name) or name


def reference(results: List[Dict[str, Any]]) -> Dict[str, report.Reference]:
    """Per workload family, the median over every alone row of ``results``: each LC job's p50
    and p99 (ms), each BE job's throughput."""
    lc: Dict[str, Dict[str, List[Tuple[float, float]]]] = {}
    be: Dict[str, Dict[str, List[float]]] = {}
    for result in results:
        for workload in result["workloads"]:
            family = workload["workload"]
            for row in workload["modes"]:
                if row.get("name") == "LC alone":
                    for name, ms in row.get("lc_ms", {}).items():
                        if ms:
                            lc.setdefault(family, {}).setdefault(name, []).append((percentile(ms, 50),
                                                                                   percentile(ms, 99)))
                elif row.get("name") == "BE alone":
                    for name, rate in row.get("be_per_s", {}).items():
                        be.setdefault(family, {}).setdefault(name, []).append(rate)
    out: Dict[str, report.Reference] = {}
    for family in set(lc) | set(be):
        base = {name: dict(p50_ms=statistics.median(p50 for p50, _ in rows),
                           p99_ms=statistics.median(p99 for _, p99 in rows), rows=len(rows),
                           p99_lo_ms=min(p99 for _, p99 in rows), p99_hi_ms=max(p99 for _, p99 in rows))
                for name, rows in lc.get(family, {}).items()}
        out[family] = (base, {name: statistics.median(rates) for name, rates in be.get(family, {}).items()})
    return out


def judge(paths: List[str], target_ratios: tuple = (1.5, 3.0)) -> Dict[str, Any]:
    """Every run but the alone ones in ``paths``, with ratios and verdicts against the pooled
    reference (``report.summarize``): ``dict(reference=..., runs=[dict(group, file, workload,
    row), ...])``, the rows copies (the results are left as read)."""
    results = [load(path) for path in paths]
    ref = reference(results)
    runs = []
    for path, result in zip(paths, results):
        for workload in result["workloads"]:
            rows = copy.deepcopy(workload["modes"])
            report.summarize(rows, target_ratios, ref.get(workload["workload"], ({}, {})))
            runs += [dict(group=group_of(path), file=os.path.basename(path), workload=workload["workload"], row=row)
                     for row in rows if row.get("kind") != "alone" and "meets" in row]
    return dict(reference=ref, runs=runs)


def _window(row: Dict[str, Any]) -> Tuple[str, float]:
    """The measured window's resting step and share there, and its share at the top step."""
    seconds = (row.get("control_window") or {}).get("seconds_at_steps") or []
    total = sum(seconds)
    if not total:
        return "", 0.0
    rest = max(range(len(seconds)), key=lambda i: seconds[i])
    return f" | window: s{rest} {100 * seconds[rest] / total:.0f}%, top {100 * seconds[-1] / total:.0f}%", \
        seconds[-1] / total


def format_judgement(judged: Dict[str, Any]) -> str:
    """The reference per family, a line per run, then per group, family and mode: in how many
    runs each target was met, the range of the BE minimum, the runs mostly at the top step."""
    lines = []
    for family, (base, be_base) in sorted(judged["reference"].items()):
        lc = "; ".join(f"{name} p50 {b['p50_ms']:.3f} / p99 {b['p99_ms']:.3f} ms ({b['rows']} rows, p99 "
                       f"{b['p99_lo_ms']:.3f}-{b['p99_hi_ms']:.3f})" for name, b in base.items())
        be = ", ".join(f"{name} {rate:.4g}/s" for name, rate in be_base.items())
        lines.append(f"{family} reference, the median of the alone rows: {lc}; BE {be}")
    groups: Dict[Tuple[str, str, str], List[Tuple[Dict[str, Any], float]]] = {}
    for run in judged["runs"]:
        row = run["row"]
        lc = "  ".join(f"{name} {100 * j['within_1.5x']:.1f}% p50 {j['p50_over_alone_p50']:.2f}x"
                       for name, j in row["lc"].items())
        minimum = row.get("be_share_min")
        be = f"BE min {100 * minimum:.0f}%" if minimum is not None else "BE -"
        meets = " ".join(f"{t}:{'yes' if v else 'no'}" for t, v in row["meets"].items())
        window, top = _window(row)
        lines.append(f"{run['file']:<32} {run['workload']:<12} {row['name']:<36} {lc} | {be} | {meets}{window}")
        groups.setdefault((run["group"], run["workload"], row["name"]), []).append((row, top))
    for (group, family, mode), runs in groups.items():
        met = report.met_counts([r for r, _ in runs])
        shares = [r["be_share_min"] for r, _ in runs if r.get("be_share_min") is not None]
        spread = f"; BE min {100 * min(shares):.0f}-{100 * max(shares):.0f}%" if shares else ""
        stuck = sum(top > TOP_STEP_SHARE for _, top in runs)
        lines.append(f"{group} {family}, {mode}: met {met}{spread}; over half the window at the top step in "
                     f"{stuck} of {len(runs)}")
    return "\n".join(lines)

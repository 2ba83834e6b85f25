"""What the scheduler experiments in this folder share (``controller_yield_ab.py``,
``throttled_split.py``): the contention benchmark's runs of one mode, each printed as a table
line as it ends, its scheduler's timeline written where asked (gzipped Chrome-trace JSON, by
the benchmark's ``Runner``), and the raw rows written at the end."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from octopus.bench.contention import report
from octopus.bench.contention.modes import Mode
from octopus.bench.contention.runner import Runner
from octopus.bench.contention.workloads import FAMILIES


def require_jobs(names: Iterable[str], jobs: Sequence[Any], option: str) -> None:
    """Exits naming ``option`` where a name in ``names`` is no job's of ``jobs``."""
    unknown = set(names) - {job.name for job in jobs}
    if unknown:
        raise SystemExit(f"{option}: no best-effort job {sorted(unknown)} here "
                         f"(the jobs: {[job.name for job in jobs]})")


def start(workload: str, be_names: Optional[Sequence[str]] = None) -> Tuple[Runner, List[Dict[str, Any]]]:
    """The benchmark's runner for one workload family on the current CUDA device (with
    ``be_names``, only those of its BE jobs), its schedulers remembered, and the rows of its LC
    jobs alone and BE jobs alone. Every mode runs as ``octopus-bench contention`` runs it: TF32
    matmuls and a GIL switch interval of 0.2 ms. (Until the nineteenth session neither was set
    here: the ``mlp`` family's matmuls ran in full FP32, and the alone modes, the references of
    every share, at Python's 5 ms.)"""
    torch.backends.cuda.matmul.allow_tf32 = True
    sys.setswitchinterval(2e-4)
    device = torch.device("cuda")
    lc_jobs, be_jobs = FAMILIES[workload](device, 1.0)
    if be_names is not None:
        require_jobs(be_names, be_jobs, "--be-jobs")
        be_jobs = [job for job in be_jobs if job.name in be_names]
    runner = Runner(lc_jobs, be_jobs, device, 0.5, 3.0, 8.0, None)
    return runner, [runner.run(Mode("LC alone", "normal", "none", kind="alone")),
                    runner.run(Mode("BE alone", "none", "normal", kind="alone"))]


def run_and_report(runner: Runner, mode: Mode, rows: List[Dict[str, Any]], repeat: int,
                   trace_dir: Optional[str], trace_name: str) -> None:
    """Runs ``mode``, appends its row to ``rows`` and prints its table line; with
    ``trace_dir``, the run's scheduler timeline goes there as ``trace_name``.json.gz."""
    trace = None
    if trace_dir:
        os.makedirs(trace_dir, exist_ok=True)
        trace = os.path.join(trace_dir, f"{trace_name}.json.gz")
    row = runner.run(mode, trace)
    row.update(repeat=repeat)
    rows.append(row)
    print(report.format_table([row], report.summarize(rows)["oracle"]), flush=True)


def write_rows(path: Optional[str], workload: str, rows: List[Dict[str, Any]]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(dict(workload=workload, rows=rows), f)

"""Which best-effort (BE) job costs a latency-critical (LC) job its target, at which SM partition.

An experiment (not part of octopus-bench), on the contention benchmark's workloads and runner:
LC alone and BE alone, then one pinned configuration after another (latency control off), each
with a chosen subset of the BE jobs beside every LC job. Per LC job it prints the share of jobs
within 1.5x its alone p99 (the target of issue 34), its total latency (from the scheduled arrival),
its device span (a CUDA event before its work to one after: lc_decompose.py's measure) and how late
its thread began at p99 (the host's part); per BE job its rate over its alone rate, all BE jobs
running together (so a job running alone beside the LC jobs can pass 100%).

    python benchmarks/pinned_be_split.py --workload convnet --json OUT.json \\
        --config gemm16:16:yield --config gemm16,ragged400:32:yield --repeats 2

A configuration is BE_JOBS:SMS[:yield]: BE_JOBS comma-separated, SMS the SMs asked free of BE
work (the device keeps whole groups: on an H200, 16 asked keep 20 free, 32 keep 36). Every one
runs with whole slices and no in-flight bound or throttling, as the benchmark's fixed partitions do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lc_decompose import DecomposingRunner  # noqa: E402
from scheduler_runs import require_jobs  # noqa: E402

from octopus._timing import percentile  # noqa: E402
from octopus.bench.contention.modes import Mode  # noqa: E402
from octopus.bench.contention.workloads import FAMILIES  # noqa: E402


def parse_config(text: str) -> Tuple[List[str], int, bool]:
    """BE_JOBS:SMS[:yield] as (job names, SMs asked free, whether octopus's BE kernels yield)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "yield") or not parts[1].isdigit():
        raise argparse.ArgumentTypeError(f"--config wants BE_JOBS:SMS[:yield], got {text!r}")
    return parts[0].split(","), int(parts[1]), len(parts) == 3


def format_row(name: str, row: Dict[str, Any], spans: Dict[str, List[float]], alone_p99: Dict[str, float],
               be_alone: Dict[str, float]) -> str:
    out = f"{name:42s} clk {row['sm_clock_mhz']:.0f} |"
    for job, ms in row["lc_ms"].items():
        if not ms or not spans[job]:
            out += f" {job} no job in the window |"
            continue
        within = sum(v <= 1.5 * alone_p99[job] for v in ms) / len(ms)
        out += (f" {job} {100 * within:.1f}% total {percentile(ms, 50):.3f}/{percentile(ms, 99):.3f}"
                f" device {percentile(spans[job], 50):.3f}/{percentile(spans[job], 99):.3f}"
                f" start p99 {percentile(row['lc_start_ms'][job], 99):.3f} |")
    shares = (f"{job} {100 * rate / be_alone[job]:.0f}%" for job, rate in row["be_per_s"].items())
    return out + " BE " + " ".join(shares)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(FAMILIES), default="convnet")
    p.add_argument("--config", type=parse_config, action="append", required=True,
                   metavar="BE_JOBS:SMS[:yield]")
    p.add_argument("--repeats", type=int, default=1, help="rounds over every configuration, interleaved")
    p.add_argument("--measure", type=float, default=3.0, help="seconds each configuration is measured")
    p.add_argument("--json", help="write the raw rows (and each LC job's device spans, ms) here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("pinned_be_split.py needs a CUDA device", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = True  # as octopus-bench contention runs every mode
    sys.setswitchinterval(2e-4)
    device = torch.device("cuda")
    lc_jobs, be_jobs = FAMILIES[args.workload](device, 1.0)
    for names, _, _ in args.config:
        require_jobs(names, be_jobs, "--config")
    all_be_runner = DecomposingRunner(lc_jobs, be_jobs, device, 0.5, args.measure, 8.0)
    lc_alone = all_be_runner.run(Mode("LC alone", "normal", "none", kind="alone"))
    be_alone = all_be_runner.run(Mode("BE alone", "none", "normal", kind="alone"))
    alone_p99 = {job: percentile(ms, 99) for job, ms in lc_alone["lc_ms"].items()}
    print("LC alone p50/p99 (ms): " + ", ".join(f"{job} {percentile(ms, 50):.3f}/{alone_p99[job]:.3f}"
                                                for job, ms in lc_alone["lc_ms"].items()), flush=True)
    rows: List[Dict[str, Any]] = []
    for _ in range(args.repeats):
        for names, sms, yields in args.config:
            runner = DecomposingRunner(lc_jobs, [job for job in be_jobs if job.name in names], device, 1.5,
                                       args.measure, 8.0)
            name = f"{'+'.join(names)}, {sms} SMs asked free{', yield' if yields else ''}"
            row = runner.run(Mode(name, "lease", "lease", kind="sweep", options=dict(
                latency_control=False, reserved_sms=sms, best_effort_in_flight=0, throttle="off",
                device_yield=yields)))
            spans = {job: [1e3 * part[1] for part in runner.window_parts(job)] for job in row["lc_ms"]}
            print(format_row(name, row, spans, alone_p99, be_alone["be_per_s"]), flush=True)
            rows.append(dict(row, device_span_ms=spans))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(alone=[lc_alone, be_alone], rows=rows), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The latency controller on one contention workload, alone in its process, with the caching
allocator's device-wide events counted.

An experiment (not part of octopus-bench), on the contention benchmark's workloads and runner:
LC alone, BE alone, then the controller at one target ``--runs`` times, each after the modes
before it only (`octopus-bench contention` runs every sweep mode's scheduler first). After each
controller run it prints how many times the caching allocator retried an allocation, synchronized
every stream, allocated and freed device memory during it: a device-wide synchronization while
octopus's best-effort kernels wait for the yield gate stalls the device (benchmarks/README.md,
#contention, twelfth session).

    python benchmarks/controller_probe.py --workload mlp --ratio 3 --runs 2
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import torch

from octopus.bench.contention import report
from octopus.bench.contention.modes import Mode
from octopus.bench.contention.runner import Runner
from octopus.bench.contention.workloads import FAMILIES

ALLOCATOR_EVENTS = ["num_alloc_retries", "num_sync_all_streams", "num_device_alloc", "num_device_free"]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(FAMILIES), default="mlp")
    p.add_argument("--ratio", type=float, default=3.0, help="the controller's target: this x each LC job's alone p99")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--controller-warmup", type=float, default=8.0)
    p.add_argument("--measure", type=float, default=3.0)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 1
    sys.setswitchinterval(2e-4)  # as the contention benchmark runs every mode
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda")
    lc_jobs, be_jobs = FAMILIES[args.workload](device, 1.0)
    runner = Runner(lc_jobs, be_jobs, device, 0.5, args.measure, args.controller_warmup)
    rows = [runner.run(Mode("LC alone", "normal", "none", kind="alone")),
            runner.run(Mode("BE alone", "none", "normal", kind="alone"))]
    for i in range(args.runs):
        before = {k: torch.cuda.memory_stats().get(k, 0) for k in ALLOCATOR_EVENTS}
        rows.append(runner.run(Mode(f"controller {args.ratio:g}x run {i}", "lease", "lease", kind="controller",
                                    target_ratio=args.ratio, options=dict(latency_ratio=args.ratio))))
        after = {k: torch.cuda.memory_stats().get(k, 0) for k in ALLOCATOR_EVENTS}
        print(f"run {i}: allocator", {k: after[k] - before[k] for k in ALLOCATOR_EVENTS},
              f"reserved {torch.cuda.memory_reserved() / 2**30:.1f} GiB", flush=True)
        torch.cuda.empty_cache()
    report.summarize(rows)
    print(report.format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

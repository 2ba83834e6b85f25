"""Memory-bound best-effort work held back in SMs and in time, at fixed settings.

An experiment (not part of octopus-bench), on the contention benchmark's workloads and runner:
each workload's memory-bound BE job (`mlp`: the ragged `affine`; `convnet`: the ragged `clamp`)
runs alone beside both LC jobs under fixed lease settings: BE on few SMs (partitions keeping
100-124 of 132 SMs free), and paused while LC work is held or waits, with slices of 0.1-1 ms
and one or two in flight, and with octopus's BE kernels yielding on the device while LC leases
are held (device yield). It shows which fixed setting, if any, keeps the LC jobs within 1.5x
their alone p99 with the BE job at 80% (before device yield none did on the H100 or H200:
benchmarks/README.md, #contention, eleventh session; its raw files name the settings "if N" for
"N in flight").

    python benchmarks/mem_be_time.py --json OUT.json                       # every setting (CUDA)
    python benchmarks/mem_be_time.py --only "held, 0.25 ms, 1 in flight"   # some of them
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional

import torch

from octopus.bench.contention import report
from octopus.bench.contention.modes import Mode
from octopus.bench.contention.runner import Runner
from octopus.bench.contention.workloads import FAMILIES

MEMORY_BOUND = {"mlp": "ragged", "convnet": "ragged400"}


def _fixed(name: str, free_sms: int, in_flight: int, throttle: str, budget: Optional[float],
           device_yield: bool = False) -> Mode:
    return Mode(name, "lease", "lease", kind="sweep", slice_budget_s=budget,
                options=dict(latency_control=False, reserved_sms=free_sms, best_effort_in_flight=in_flight,
                             throttle=throttle, device_yield=device_yield))


SETTINGS = [
    _fixed("no partition, whole products", 0, 0, "off", None),
    _fixed("BE on 32 SMs", 100, 0, "off", None),
    _fixed("BE on 16 SMs", 116, 0, "off", None),
    _fixed("BE on 8 SMs", 124, 0, "off", None),
    _fixed("held, 1 ms, 2 in flight", 0, 2, "held", 1e-3),
    _fixed("held, 0.5 ms, 1 in flight", 0, 1, "held", 0.5e-3),
    _fixed("held, 0.25 ms, 1 in flight", 0, 1, "held", 0.25e-3),
    _fixed("held, 0.25 ms, 2 in flight", 0, 2, "held", 0.25e-3),
    _fixed("held, 0.1 ms, 2 in flight", 0, 2, "held", 0.1e-3),
    _fixed("held, 0.1 ms, 1 in flight", 0, 1, "held", 0.1e-3),
    _fixed("waiting, 0.25 ms, 2 in flight", 0, 2, "waiting", 0.25e-3),
    _fixed("BE on 32 SMs, held, 0.25 ms, 2 in flight", 100, 2, "held", 0.25e-3),
    _fixed("device yield, whole products", 0, 0, "off", None, True),
    _fixed("device yield, 4 ms, 2 in flight", 0, 2, "off", 4e-3, True),
    _fixed("device yield, held, 4 ms, 2 in flight", 0, 2, "held", 4e-3, True),
]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", choices=sorted(MEMORY_BOUND), default=sorted(MEMORY_BOUND))
    p.add_argument("--only", nargs="+", default=None, metavar="NAME", help="run only the settings named")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--measure", type=float, default=3.0)
    p.add_argument("--json", default=None, help="write every mode's raw measurements here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 1
    settings = [m for m in SETTINGS if not args.only or m.name in args.only]
    torch.backends.cuda.matmul.allow_tf32 = True
    sys.setswitchinterval(2e-4)  # as the contention benchmark runs every mode
    device = torch.device("cuda")
    out: Dict[str, List[Dict[str, Any]]] = {}
    for workload in args.workloads:
        lc_jobs, be_jobs = FAMILIES[workload](device, 1.0)
        runner = Runner(lc_jobs, [j for j in be_jobs if j.name == MEMORY_BOUND[workload]], device, args.warmup,
                        args.measure, 0.0)
        rows = []
        for mode in [Mode("LC alone", "normal", "none", kind="alone"),
                     Mode("BE alone", "none", "normal", kind="alone")] + settings:
            try:
                rows.append(runner.run(mode))
            except Exception as error:  # noqa: BLE001 (recorded: the other settings still run)
                rows.append(dict(name=mode.name, kind=mode.kind, error=f"{type(error).__name__}: {error}"))
        report.summarize(rows)
        print(f"== {workload}, {MEMORY_BOUND[workload]} the only BE job")
        print(report.format_table(rows))
        out[workload] = rows
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

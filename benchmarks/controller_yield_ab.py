"""The latency controller with device yield as it chooses against pinned off, on one workload
family of ``octopus-bench contention``, interleaved.

An experiment (not part of octopus-bench), CUDA only. It asks whether a best-effort job's
starvation under the controller comes from the device-yield gate: LC alone and BE alone once,
then ``--repeats`` rounds of the controller at ``--target`` with ``device_yield`` unset (the
controller's choice) and ``device_yield=False``, each mode measured as the benchmark measures
it (its ``Runner``), one table line per run.

    python benchmarks/controller_yield_ab.py --workload convnet --json OUT.json
"""

from __future__ import annotations

import argparse
import json
from typing import List, Optional

import torch

from octopus.bench.contention import report
from octopus.bench.contention.modes import Mode
from octopus.bench.contention.runner import Runner
from octopus.bench.contention.workloads import FAMILIES


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(FAMILIES), default="convnet")
    p.add_argument("--target", type=float, default=3.0, help="the controller's latency_ratio")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="write the raw rows here")
    args = p.parse_args(argv)
    device = torch.device("cuda")
    lc_jobs, be_jobs = FAMILIES[args.workload](device, 1.0)
    runner = Runner(lc_jobs, be_jobs, device, 0.5, 3.0, 8.0, None)
    rows = [runner.run(Mode("LC alone", "normal", "none", kind="alone")),
            runner.run(Mode("BE alone", "none", "normal", kind="alone"))]
    for repeat in range(args.repeats):
        for name, options in ((f"controller {args.target:g}x, yield auto", dict(latency_ratio=args.target)),
                              (f"controller {args.target:g}x, yield off",
                               dict(latency_ratio=args.target, device_yield=False))):
            row = runner.run(Mode(name, "lease", "lease", kind="controller", target_ratio=args.target,
                                  options=options))
            row.update(repeat=repeat)
            rows.append(row)
            print(report.format_table([row], report.summarize(rows)["oracle"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(workload=args.workload, rows=rows), f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

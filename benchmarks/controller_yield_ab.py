"""The latency controller with device yield as it chooses against pinned off, on one workload
family of ``octopus-bench contention``, interleaved.

An experiment (not part of octopus-bench), CUDA only. It asks whether a best-effort job's
starvation under the controller comes from the device-yield gate: LC alone and BE alone once,
then ``--repeats`` rounds of the controller at ``--target`` with ``device_yield`` unset (the
controller's choice) and ``device_yield=False``, each mode measured as the benchmark measures
it (its ``Runner``), one table line per run. ``--trace-dir`` also records each controller run's
scheduler timeline and writes it there as Chrome-trace JSON, gzipped:
per best-effort kind its leases (``name``), their streams (``tid``) and hold times (``dur``),
and the controller's steps (the "latency control" counter). ``--yield-off-only`` /
``--yield-auto-only`` run one of the two.

    python benchmarks/controller_yield_ab.py --workload convnet --json OUT.json
    python benchmarks/controller_yield_ab.py --repeats 4 --yield-auto-only --trace-dir traces/
"""

from __future__ import annotations

import argparse
from typing import List, Optional

from octopus.bench.contention.modes import Mode
from octopus.bench.contention.workloads import FAMILIES
from scheduler_runs import run_and_report, start, write_rows


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(FAMILIES), default="convnet")
    p.add_argument("--target", type=float, default=3.0, help="the controller's latency_ratio")
    p.add_argument("--repeats", type=int, default=3)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--yield-auto-only", action="store_true")
    which.add_argument("--yield-off-only", action="store_true")
    p.add_argument("--trace-dir", default=None, help="write each controller run's scheduler timeline here")
    p.add_argument("--json", default=None, help="write the raw rows here")
    args = p.parse_args(argv)
    runner, rows = start(args.workload)
    variants = [(f"controller {args.target:g}x, yield auto", dict(latency_ratio=args.target)),
                (f"controller {args.target:g}x, yield off", dict(latency_ratio=args.target, device_yield=False))]
    if args.yield_auto_only or args.yield_off_only:
        variants = variants[:1] if args.yield_auto_only else variants[1:]
    for repeat in range(args.repeats):
        for k, (name, options) in enumerate(variants):
            run_and_report(runner, Mode(name, "lease", "lease", kind="controller", target_ratio=args.target,
                                        options=options), rows, repeat, args.trace_dir, f"trace_{repeat}_{k}")
    write_rows(args.json, args.workload, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How best-effort kinds split the device at the latency controller's throttled steps, pinned.

An experiment (not part of octopus-bench), CUDA only. At the controller's top steps (slices of 1
ms, and of 0.25 ms until the ladder lost that step; one in flight, ``--in-flight`` for other
bounds; a quarter of the SMs kept free; best-effort work held back while latency-critical work
waits or runs; octopus's kernels yielding on the device) one best-effort kind has kept over 100%
of its alone throughput while the other fell to 0-50%, run to run. This runs those settings
pinned (latency control off), ``--repeats`` times, as the contention benchmark measures a mode
(its ``Runner``), one table line per run, and with ``--trace-dir`` writes each run's scheduler
timeline (per best-effort kind its leases and its "throttle" spans) as gzipped Chrome-trace
JSON. ``--budget-scale`` gives one kind longer or shorter slices than the others; ``--throttle``,
``--reserved-sms``, ``--slices-ms`` and ``--in-flight`` pin other steps of the ladder, and
``--be-jobs`` runs only some of the family's best-effort jobs.

    python benchmarks/throttled_split.py --workload convnet --reserved-sms 20 --slices-ms 20 --in-flight 2 \\
        --throttle off --be-jobs gemm16
    python benchmarks/throttled_split.py --workload mlp --repeats 3 --trace-dir traces/ --json rows.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from typing import Any, Dict, List, Optional, Tuple

import torch

from octopus.bench.contention.modes import Mode
from octopus.bench.contention.runner import Runner
from octopus.bench.contention.workloads import FAMILIES
from scheduler_runs import require_jobs, run_and_report, start, write_rows


def scale_budgets(runner: Runner, scales: Dict[str, float]) -> None:
    """Has ``runner``'s best-effort jobs named in ``scales`` slice their work to that multiple of
    each mode's budget."""
    require_jobs(scales, runner.be_jobs, "--budget-scale")
    product = runner._be_product

    def scaled(job: Any, mode: Mode, *rest: Any) -> Any:
        if job.name in scales and mode.slice_budget_s is not None:
            mode = dataclasses.replace(mode, slice_budget_s=mode.slice_budget_s * scales[job.name])
        return product(job, mode, *rest)
    runner._be_product = scaled  # type: ignore[method-assign]


def kind_scale(text: str) -> Tuple[str, float]:
    """``KIND=F`` as (KIND, F), F a positive finite number."""
    kind, _, factor = text.partition("=")
    try:
        value = float(factor)
    except ValueError:
        value = 0.0
    if not kind or not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected KIND=F with F a positive finite number, got {text!r}")
    return kind, value


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(FAMILIES), default="mlp")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--reserved-sms", type=int, default=None,
                   help="SMs kept free of BE work (default: a quarter of the device's, as the controller's "
                        "top steps)")
    p.add_argument("--slices-ms", type=float, nargs="+", default=[1.0])
    p.add_argument("--in-flight", type=int, nargs="+", default=[1],
                   help="best-effort slices in flight per holder (the controller's top steps: 1)")
    p.add_argument("--throttle", choices=("off", "waiting", "held"), default="held",
                   help="when best-effort holders pause at their checkpoints (the top steps: held)")
    p.add_argument("--be-jobs", nargs="+", default=None, metavar="NAME",
                   help="run only these of the family's best-effort jobs (default: all)")
    p.add_argument("--budget-scale", nargs="*", type=kind_scale, default=[], metavar="KIND=F",
                   help="best-effort kind KIND's slices sized to F times the budget")
    p.add_argument("--trace-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sms = args.reserved_sms
    if sms is None:
        sms = round(torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count / 4)
    runner, rows = start(args.workload, args.be_jobs)
    scales = dict(args.budget_scale)
    scale_budgets(runner, scales)
    for repeat in range(args.repeats):
        for ms, in_flight in itertools.product(args.slices_ms, args.in_flight):
            options = dict(latency_control=False, reserved_sms=sms, best_effort_in_flight=in_flight,
                           throttle=args.throttle, device_yield=True)
            name = (f"pinned: partition {sms} + throttle {args.throttle} + slices {ms:g} ms, "
                    f"in-flight {in_flight} + yield")
            name += "".join(f", {kind}={f:g}" for kind, f in scales.items())
            mode = Mode(name, "lease", "lease", kind="pinned", slice_budget_s=ms * 1e-3, options=options)
            trace = f"trace_{repeat}_{ms:g}ms_{in_flight}"
            run_and_report(runner, mode, rows, repeat, args.trace_dir, trace)
    write_rows(args.json, args.workload, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

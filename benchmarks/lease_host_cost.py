"""What a latency-critical (LC) job's lease costs on the host when its thread wakes to run it.

``octopus-bench contention`` reports acquire + release back to back (1-3 us). An LC thread in
a server sleeps between its jobs, and code that runs right after a sleep runs slower (cold
caches and predictors, a core leaving an idle state). This script measures, from Python:

* ``threads`` (CUDA): two LC threads (every 4 and 3.2 ms, a 256x256 matmul on the lease's stream,
  then a wait for the lease's release event) with or without two best-effort (BE) threads
  (fp16 GEMM slices through ``lease.slices``), with or without latency control: per LC job
  ``acquire`` and ``release`` (the calls, with the GIL never forced over: switch interval 1 s
  and the scheduler's lowering off, so what they wait for is the host and the scheduler, not
  another thread's Python), ``start`` (the thread's wake after its scheduled arrival), and
  a torch event's ``record`` and ``query`` on a stream of its own for comparison;
* ``sleep`` (simulated backend, no threads): acquire, then release right after it, back to
  back and with a 3 ms sleep before each acquire; a ``perf_counter`` pair and
  ``torch.empty(4)`` so too.

    python3 benchmarks/lease_host_cost.py threads --seconds 12 [--no-control] [--no-be]
    python3 benchmarks/lease_host_cost.py sleep
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Dict, List

import torch

import octopus
from octopus._timing import percentile


def _line(label: str, samples: Dict[str, List[float]]) -> str:
    return label + "  " + "  ".join(f"{k} p50 {percentile(v, 50) * 1e6:.1f} p99 {percentile(v, 99) * 1e6:.1f} us"
                                    for k, v in samples.items() if v)


def threads(seconds: float, control: bool, with_be: bool) -> str:
    sys.setswitchinterval(1.0)  # (the BE threads let go of the GIL in every torch call and checkpoint)
    sched = octopus.StreamScheduler(4, latency_control=control, gil_switch_interval=None)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b, c = torch.randn_like(a), torch.empty_like(a)
    x = torch.randn(256, 256, device="cuda")
    events = {n: torch.cuda.Event() for n in "ab"}
    side = {n: torch.cuda.Stream(priority=-1) for n in "ab"}
    stop = threading.Event()
    samples: Dict[str, List[float]] = {k: [] for k in ("acquire", "release", "start", "record", "query")}

    def lc(name: str, period: float) -> None:
        k, t0 = 0, time.perf_counter() + 0.01
        while not stop.is_set():
            arrival = t0 + k * period
            k += 1
            delay = arrival - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            s = time.perf_counter()
            lease = sched.acquire(name, priority="high")
            t1 = time.perf_counter()
            with torch.cuda.stream(lease.stream):
                x @ x
            t2 = time.perf_counter()
            lease.release()
            t3 = time.perf_counter()
            lease.release_event.synchronize()
            t4 = time.perf_counter()
            events[name].record(side[name])
            t5 = time.perf_counter()
            events[name].query()
            samples["record"].append(t5 - t4)
            samples["query"].append(time.perf_counter() - t5)
            samples["start"].append(s - arrival)
            samples["acquire"].append(t1 - s)
            samples["release"].append(t3 - t2)

    def be(name: str) -> None:
        while not stop.is_set():
            with sched.acquire(name, best_effort=True) as lease, torch.cuda.stream(lease.stream):
                for rows in lease.slices(8192):
                    torch.mm(a[rows.start:rows.stop], b, out=c[rows.start:rows.stop])

    workers = [threading.Thread(target=lc, args=("a", 4e-3)), threading.Thread(target=lc, args=("b", 3.2e-3))]
    if with_be:
        workers += [threading.Thread(target=be, args=(n,)) for n in ("x", "y")]
    for t in workers:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in workers:
        t.join()
    sched.close()
    skip = len(samples["start"]) // 4  # the first quarter: the controller and the caches settling
    return _line(f"cuda control={control} be={with_be}", {k: v[skip:] for k, v in samples.items()})


def sleep(rounds: int = 1500) -> List[str]:
    sched = octopus.StreamScheduler(4, backend="simulated", latency_control=False, gil_switch_interval=None)
    lines = []
    for label, pause in (("back to back", 0.0), ("each after a 3 ms sleep", 3e-3)):
        samples: Dict[str, List[float]] = {k: [] for k in ("acquire", "release", "perf_counter pair", "torch.empty(4)")}
        for i in range(rounds):
            if pause:
                time.sleep(pause)
            t0 = time.perf_counter()
            lease = sched.acquire("a", priority="high")
            t1 = time.perf_counter()
            lease.release()
            t2 = time.perf_counter()
            if pause:
                time.sleep(pause)
            t3 = time.perf_counter()
            t4 = time.perf_counter()
            if pause:
                time.sleep(pause)
            t5 = time.perf_counter()
            torch.empty(4)
            t6 = time.perf_counter()
            if i >= rounds // 10:
                for k, v in zip(samples, (t1 - t0, t2 - t1, t4 - t3, t6 - t5)):
                    samples[k].append(v)
        lines.append(_line(f"simulated, {label}", samples))  # (release: right after its acquire)
    sched.close()
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=("threads", "sleep"))
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--no-control", action="store_true", help="latency control off")
    p.add_argument("--no-be", action="store_true", help="the LC threads only")
    args = p.parse_args()
    if args.part == "sleep":
        print("\n".join(sleep()))
        return 0
    if not torch.cuda.is_available():
        print("lease_host_cost.py threads needs a CUDA device", file=sys.stderr)
        return 2
    print(threads(args.seconds, not args.no_control, not args.no_be))
    return 0


if __name__ == "__main__":
    sys.exit(main())

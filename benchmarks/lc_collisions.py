"""Whether two latency-critical jobs that meet cost each other on the device or on the host.

The contention benchmark's conv-net family runs two latency-critical (LC) jobs on fixed
schedules: a batch-1 conv net replayed from a CUDA graph every 4 ms and ``octopus.normalize``
of 64 small images, eager, every 3.2 ms. Their schedules meet in a fixed pattern (a quarter
of the conv net's jobs overlap a normalize job), and in its traces the jobs over the
controller's target are mostly those (benchmarks/JOURNAL.md, 2026-12-01). This script runs
the two jobs with no best-effort work, each in its own thread on its own high-priority
stream, no scheduler, in nine variants:

* ``eager``: as in the benchmark (normalize launched op by op from Python), both streams of
  the device's highest priority (as the scheduler gives latency-critical leases);
* ``eager, normalize's stream lower`` and ``eager, conv net's stream lower``: one of the two
  on a stream of the lowest priority, so that the other's blocks are dispatched first;
* ``eager, conv net holding the GIL``: the conv net's graph launched, and its events
  recorded, through the CUDA driver with the GIL held, so that ``normalize``'s thread cannot
  take the GIL between them;
* ``eager, conv net through octopus.replay_graph``: the same with torch's replay kept on the
  thread by :func:`octopus.replay_graph` (its random-number prologue included);
* ``eager, conv net through octopus.replay_graph, waited for holding the GIL``: the same,
  then the conv net's thread waits for its job's end through the driver with the GIL held
  (no other thread's Python runs while its job is on the device, and none delays its wake);
* ``eager, both waited for holding the GIL``: normalize's thread waits so too (in these two,
  a waiting job's ``issue`` part holds its wait, and its ``host`` part is what is left);
* ``graphed``: normalize replayed from a CUDA graph too (its host part is one call);
* ``conv net alone``: the conv net's thread only.

and reports, per job, latency (scheduled arrival to the thread seeing completion) for jobs
that overlapped a job of the other thread (launch to completion against launch to
completion: a job whose thread woke late behind the other's Python, that job done before the
launch, counts as not overlapping), split into those the other's job started beside
(``first``) and those started beside the other's (``second``), and for those that did not.
Run it at two switch intervals (``--switch-interval``) to see how much of a meeting's cost
the GIL's hand-over makes, and read each group's parts (wake, device, host): a meeting
that costs on the device lengthens ``device``, one that costs on the host ``wake`` or
``host``. (The split came after the 2026-12-01 runs of the twenty-ninth session: their files
have ``overlap`` and ``solo`` only, and no parts.) What the graphed variant takes
away of the overlap's cost is mostly the host's (the threads' Python and the GIL), though a
graph changes ``normalize``'s device work too.

Run on a GPU: ``python3 benchmarks/lc_collisions.py --seconds 8 --json out.json``.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import threading
import time
from typing import Callable, Dict, List, Tuple

import torch

import octopus
from octopus._timing import percentile
from octopus.bench.contention.runner import capture_graph
from octopus.bench.contention.workloads import _convnet_jobs


def _p(values: List[float], q: float) -> float | None:
    return percentile(values, q) if values else None


# name, arrival, launched, issued (its last launch returned), done (s), device time (ms)
Job = Tuple[str, float, float, float, float, float]


# Launches a job's work on a stream between two events (began, ended).
Issue = Callable[[torch.cuda.Stream, torch.cuda.Event, torch.cuda.Event], None]


def _issue(body: Callable[[], object]) -> Issue:
    """``body`` launched as the benchmark's jobs launch theirs: through torch, whose launches
    and event records hand the GIL to another thread while they run, and take it back after."""
    def issue(stream: torch.cuda.Stream, began: torch.cuda.Event, ended: torch.cuda.Event) -> None:
        with torch.cuda.stream(stream):
            began.record(stream)
            body()
            ended.record(stream)
    return issue


def _driver_call(names: Tuple[str, ...]) -> Callable[..., None]:
    """``call(name, *pointers)``: the CUDA driver's function ``name`` (one of ``names``) called
    with the GIL held (``ctypes.PyDLL``), a failure raised."""
    driver = ctypes.PyDLL("libcuda.so.1")
    functions = {name: getattr(driver, name) for name in names}

    def call(name: str, *pointers: int) -> None:
        status = functions[name](*(ctypes.c_void_p(p) for p in pointers))
        if status != 0:
            raise RuntimeError(f"{name} failed: CUresult {status}")
    return call


def _issue_holding_the_gil(graph: torch.cuda.CUDAGraph) -> Issue:
    """A graph replayed, and its events recorded, through the CUDA driver called with the GIL
    held: the thread keeps the GIL from its first launch to its last."""
    call = _driver_call(("cuEventRecord", "cuGraphLaunch"))
    graph_exec = graph.raw_cuda_graph_exec()

    def issue(stream: torch.cuda.Stream, began: torch.cuda.Event, ended: torch.cuda.Event) -> None:
        call("cuEventRecord", began.cuda_event, stream.cuda_stream)
        call("cuGraphLaunch", graph_exec, stream.cuda_stream)
        call("cuEventRecord", ended.cuda_event, stream.cuda_stream)
    return issue


def _issue_through_octopus(graph: torch.cuda.CUDAGraph) -> Issue:
    """A graph replayed with :func:`octopus.replay_graph` (torch's replay, the GIL kept), its
    events recorded through the driver with the GIL held as in :func:`_issue_holding_the_gil`."""
    call = _driver_call(("cuEventRecord",))

    def issue(stream: torch.cuda.Stream, began: torch.cuda.Event, ended: torch.cuda.Event) -> None:
        call("cuEventRecord", began.cuda_event, stream.cuda_stream)
        octopus.replay_graph(graph, stream)
        call("cuEventRecord", ended.cuda_event, stream.cuda_stream)
    return issue


def _waiting_holding_the_gil(issue: Issue) -> Issue:
    """``issue``, then a wait for its ``ended`` event through the driver with the GIL held: the
    thread keeps the GIL until its job has finished, so no other thread's Python runs between
    the job's completion and the thread seeing it (``_loop`` then skips its synchronize)."""
    call = _driver_call(("cuEventSynchronize",))

    def waiting(stream: torch.cuda.Stream, began: torch.cuda.Event, ended: torch.cuda.Event) -> None:
        issue(stream, began, ended)
        call("cuEventSynchronize", ended.cuda_event)
    waiting.waits = True  # type: ignore[attr-defined]
    return waiting


def _loop(name: str, issue: Issue, stream: torch.cuda.Stream, period_s: float, start: float,
          stop: float, jobs: List[Job]) -> None:
    """Runs a job (``issue``) at start + k * period_s until ``stop``; records (name, arrival,
    launched, issued, done, device ms): the device time between events recorded on the stream
    before and after the job's work (the second recorded once the thread holds the GIL again
    after the job's launches: a thread kept from the GIL there lengthens it)."""
    began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began.record(stream)  # torch makes its events on their first record, and the context current
    ended.record(stream)
    stream.synchronize()
    k = 0
    while True:
        arrival = start + k * period_s
        if arrival >= stop:
            return
        delay = arrival - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        launched = time.perf_counter()
        issue(stream, began, ended)
        issued = time.perf_counter()
        if not getattr(issue, "waits", False):
            stream.synchronize()
        done = time.perf_counter()
        jobs.append((name, arrival, launched, issued, done, began.elapsed_time(ended)))
        k += 1


def _summary(jobs: List[Job], warmup_s: float, start: float) -> Dict[str, dict]:
    """Per job name: p50 / p99 latency (ms) of jobs that overlapped the other thread's
    (``overlap``) and of those that did not (``solo``); the overlapping ones also as ``first``
    (the other's job launched while this one ran) and ``second`` (launched while the other's
    ran), as benchmarks/trace_overlaps.py splits a traced run's jobs. Each group's latency also
    in parts: ``wake`` (arrival to launch: the thread's sleep overshooting and its wait for the
    GIL), ``issue`` (the launches, the events' included, on the host: a thread that loses the
    GIL between them waits here), ``device`` (between the job's events on its stream: its
    kernels, any other work that shares the device with them, and the host's delays in
    recording the second event) and ``host`` (the rest: launching before the first event, and
    the thread's wake from the synchronize and its wait for the GIL to see it)."""
    out: Dict[str, dict] = {}
    names = sorted({j[0] for j in jobs})
    for name in names:
        mine = [j for j in jobs if j[0] == name and j[1] >= start + warmup_s]
        others = sorted((j[2], j[4]) for j in jobs if j[0] != name)
        groups: Dict[str, List[Tuple[float, ...]]] = {"overlap": [], "solo": [], "first": [], "second": []}
        for _, arrival, launched, issued, done, device_ms in mine:
            met = [s for s, e in others if s < done and e > launched]
            latency = 1e3 * (done - arrival)
            wake = 1e3 * (launched - arrival)
            parts = (latency, wake, 1e3 * (issued - launched), device_ms, latency - wake - device_ms)
            groups["overlap" if met else "solo"].append(parts)
            if met:
                groups["second" if any(s <= launched for s in met) else "first"].append(parts)
        groups["all"] = groups["overlap"] + groups["solo"]
        out[name] = {}
        for group, rows in groups.items():
            entry: dict = dict(jobs=len(rows))
            for i, part in enumerate(("", "wake_", "issue_", "device_", "host_")):
                values = [r[i] for r in rows]
                entry[f"{part}p50_ms"], entry[f"{part}p99_ms"] = _p(values, 50), _p(values, 99)
            out[name][group] = entry
    return out


def run(seconds: float, warmup_s: float, only: List[str] | None = None) -> dict:
    device = torch.device("cuda")
    lc, _ = _convnet_jobs(device, scale=1e-3)  # the best-effort jobs are not run: built small
    convnet, normalize = (next(j for j in lc if j.name == n) for n in ("convnet", "normalize"))
    high, low = torch.cuda.Stream.priority_range()[1], 0  # numerically lower is higher priority
    streams = {n: torch.cuda.Stream(device, priority=high) for n in ("convnet", "normalize")}
    lower = {n: torch.cuda.Stream(device, priority=low) for n in ("convnet", "normalize")}
    conv_graph = capture_graph(convnet.run, streams["convnet"])
    conv, norm = _issue(conv_graph.replay), _issue(normalize.run)
    # (name, issue, period, stream): each thread on its own stream, both of the highest
    # priority, unless a variant puts one at the lowest (the other's blocks then go first). A
    # graph replays on the given stream, whichever it was captured on.
    variants = {
        "eager": [("convnet", conv, convnet.period_s, streams["convnet"]),
                  ("normalize", norm, normalize.period_s, streams["normalize"])],
        "eager, normalize's stream lower": [("convnet", conv, convnet.period_s, streams["convnet"]),
                                            ("normalize", norm, normalize.period_s, lower["normalize"])],
        "eager, conv net's stream lower": [("convnet", conv, convnet.period_s, lower["convnet"]),
                                           ("normalize", norm, normalize.period_s, streams["normalize"])],
        "eager, conv net holding the GIL": [("convnet", _issue_holding_the_gil(conv_graph), convnet.period_s,
                                             streams["convnet"]),
                                            ("normalize", norm, normalize.period_s, streams["normalize"])],
        "eager, conv net through octopus.replay_graph": [
            ("convnet", _issue_through_octopus(conv_graph), convnet.period_s, streams["convnet"]),
            ("normalize", norm, normalize.period_s, streams["normalize"])],
        "eager, conv net through octopus.replay_graph, waited for holding the GIL": [
            ("convnet", _waiting_holding_the_gil(_issue_through_octopus(conv_graph)), convnet.period_s,
             streams["convnet"]),
            ("normalize", norm, normalize.period_s, streams["normalize"])],
        "eager, both waited for holding the GIL": [
            ("convnet", _waiting_holding_the_gil(_issue_through_octopus(conv_graph)), convnet.period_s,
             streams["convnet"]),
            ("normalize", _waiting_holding_the_gil(norm), normalize.period_s, streams["normalize"])],
        "graphed": [("convnet", conv, convnet.period_s, streams["convnet"]),
                    ("normalize", _issue(capture_graph(normalize.run, streams["normalize"]).replay),
                     normalize.period_s, streams["normalize"])],
        "conv net alone": [("convnet", conv, convnet.period_s, streams["convnet"])],
    }
    unknown = sorted(set(only or ()) - set(variants))
    if unknown:
        raise ValueError(f"--variants: no variant named {unknown}; there are {list(variants)}")
    results = {}
    for variant, loops in variants.items():
        if only and variant not in only:
            continue
        jobs: List[Job] = []
        start = time.perf_counter() + 0.05
        stop = start + warmup_s + seconds
        threads = [threading.Thread(target=_loop, args=(n, issue, stream, period, start, stop, jobs))
                   for n, issue, period, stream in loops]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results[variant] = _summary(jobs, warmup_s, start)
        print(variant, json.dumps(results[variant]), flush=True)
    return results


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per variant")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds per variant left out first")
    parser.add_argument("--switch-interval", type=float, default=2e-4,
                        help="sys.setswitchinterval, as octopus-bench contention sets it")
    parser.add_argument("--variants", nargs="+", metavar="NAME", help="run only these variants (default: all)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("lc_collisions.py needs a CUDA device", file=sys.stderr)
        return 2
    sys.setswitchinterval(args.switch_interval)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, seconds=args.seconds,
                  warmup_s=args.warmup, switch_interval_s=args.switch_interval,
                  variants=run(args.seconds, args.warmup, args.variants))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

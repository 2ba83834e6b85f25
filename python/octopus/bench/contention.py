"""``octopus-bench contention`` (also ``python -m octopus.bench.scheduler --contention``):
a latency-critical (LC) job sharing one GPU with best-effort (BE) work, every way of
running them side by side in one run.

LC jobs, issued every ``--period-ms`` (2 ms) from one thread, each timed from submission to
completion on the host (the lease's acquire and release included where there is one)::

  mlp     a batch-1 MLP of 24 layers of 1024x1024 fp32 (48 small kernels), one CUDA graph
  ragged  one octopus.affine over a small RaggedBatch (256 items of 512-4096 elements)

BE work, looped by another thread (TF32 matmuls, as the reference measurements)::

  matmul  8192x8192 @ 8192x8192 fp32 products (one ~3 ms kernel each, every SM busy)
  ragged  octopus.affine over a 500M-element RaggedBatch (a ~1.5 ms kernel)

Modes: each job alone; plain streams; priority streams (LC on a high-priority stream,
also with the BE work sliced); torch green contexts (LC on k SMs, BE on the rest, as the
reference did); and octopus leases (LC ``priority="high"``, BE ``best_effort=True``) with
each mechanism and its knobs: throttling at checkpoints, slicing (rows per slice, or
elements per slice of whole items), the in-flight bound, an SM partition (``reserved_sms``),
and their combinations. Reported: LC p50/p99 wall time, LC device time, BE throughput as
a share of its alone throughput (unsliced, whole GPU), the GPU's mean SM clock and power
while the LC job was timed (NVML), whether the target (LC p99 <= 1.5x alone with BE >= 80%)
is met; plus acquire/release and checkpoint cost from Python and
the Batcher's overhead per request. Raw JSON to ``--json``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

import octopus

from .._timing import percentile
from ..scheduling.slicing import SliceSizer, item_ranges
from .costs import batcher_overhead, checkpoint_cost, lease_overhead
from .energy import GpuSampler
from .report import environment

TARGET_P99_RATIO = 1.5
TARGET_BE_SHARE = 0.80


@dataclass
class Mode:
    """How the LC job and the BE work are run."""
    name: str
    lc: str                      # "mlp" | "ragged"
    be: str                      # "matmul" | "ragged"
    lc_stream: str = "normal"    # "normal" | "high" | "green" | "lease"
    be_stream: str = "normal"    # "normal" | "green" | "lease"
    slice: Optional[int] = None  # BE rows (matmul) or elements (ragged) per slice; None: unsliced
    throttle: str = "off"        # lease modes: the scheduler's throttle
    in_flight: int = 0           # lease modes: best_effort_in_flight
    reserved_sms: int = 0        # lease modes: SM partition; green modes: the LC's SMs
    options: dict = field(default_factory=dict)


class Workloads:
    """The LC and BE jobs' tensors, allocated once (inputs random, larger than L2)."""

    def __init__(self, device: torch.device, scale: float):
        g = torch.Generator(device=device).manual_seed(0)
        self.device = device
        self.weights = [torch.randn(1024, 1024, device=device, generator=g) / 32 for _ in range(24)]
        self.x0 = torch.randn(1, 1024, device=device, generator=g)
        self.n = max(256, int(8192 * scale ** 0.5) // 256 * 256)
        self.a = torch.randn(self.n, self.n, device=device, generator=g)
        self.b = torch.randn(self.n, self.n, device=device, generator=g)
        self.c = torch.empty_like(self.a)
        cpu = torch.Generator().manual_seed(0)
        small = torch.randint(512, 4097, (256,), generator=cpu)
        self.small = octopus.RaggedBatch.from_tensors([torch.randn(int(k), generator=cpu) for k in small], device=device)
        self.small_scale = torch.rand(len(self.small), device=device, generator=g)
        self.small_bias = torch.randn(len(self.small), device=device, generator=g)
        total = max(1 << 20, int(500_000_000 * scale))
        sizes = torch.randint(50_000, 150_001, (max(1, total // 100_000),), generator=cpu)
        offsets = torch.zeros(len(sizes) + 1, dtype=torch.int64)
        torch.cumsum(sizes, 0, out=offsets[1:])
        values = torch.randn(int(offsets[-1]), device=device, generator=g)
        self.big = octopus.RaggedBatch(values, offsets.to(device), sizes.view(-1, 1).to(device), validate=False)
        self.big._host_layout = (offsets, sizes.view(-1, 1))
        self.big_scale = torch.rand(len(self.big), device=device, generator=g)
        self.big_bias = torch.randn(len(self.big), device=device, generator=g)
        self._big_parts: Dict[Any, Any] = {}

    def mlp(self, x):
        for w in self.weights:
            x = torch.relu(x @ w)
        return x

    def mlp_graph(self, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            self.mlp(self.x0)
            stream.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                self.mlp(self.x0)
        stream.synchronize()
        return graph

    def small_affine(self):
        return octopus.affine(self.small, self.small_scale, self.small_bias)

    def big_parts(self, elements: Optional[int]):
        """The big batch cut into item ranges of at most ``elements`` (views, cut once so
        that the parts keep their plans), with their parameters."""
        if elements not in self._big_parts:
            sizer = SliceSizer(elements, None, lambda: None, self.big.numel())
            self._big_parts[elements] = [(self.big.narrow_items(start, stop), self.big_scale[start:stop],
                                          self.big_bias[start:stop])
                                         for start, stop, _ in item_ranges(self.big, sizer)]
        return self._big_parts[elements]


class Runner:
    """Runs the modes: BE work in a thread, the LC job timed from this one."""

    def __init__(self, w: Workloads, iterations: int, period_s: float, warmup_s: float, alone_s: float,
                 lc_wait: str = "sleep", lc_realtime: bool = False):
        self.w = w
        self.iterations = iterations
        self.period_s = period_s
        self.lc_wait = lc_wait
        self.lc_realtime = lc_realtime
        self.warmup_s = warmup_s
        self.alone_s = alone_s
        self.normal = torch.cuda.Stream()
        self.high = torch.cuda.Stream(priority=-1)
        self.graph = w.mlp_graph(torch.cuda.Stream())
        self.start_event = torch.cuda.Event(enable_timing=True)
        self.end_event = torch.cuda.Event(enable_timing=True)
        self.be_alone_rates: Dict[str, float] = {}

    # -- the LC job ---------------------------------------------------------------------

    def _lc_body(self, lc: str, graph: Optional[torch.cuda.CUDAGraph]) -> Callable[[], object]:
        if lc == "mlp":
            assert graph is not None, "the mlp job replays a graph"
            return graph.replay
        return self.w.small_affine

    def _lc_launcher(self, mode: Mode, sched, green) -> Callable[[], None]:
        start, end = self.start_event, self.end_event
        if mode.lc_stream == "lease":
            body = self._lc_body(mode.lc, self.graph)

            def launch_leased():
                with sched.acquire("lc", priority="high") as lease:
                    with torch.cuda.stream(lease.stream):
                        start.record()
                        body()
                        end.record()
                    end.synchronize()
            return launch_leased
        if mode.lc_stream == "green":
            stream = green[0]
            body = self._lc_body(mode.lc, self.w.mlp_graph(stream) if mode.lc == "mlp" else None)
        else:
            stream = self.high if mode.lc_stream == "high" else self.normal
            body = self._lc_body(mode.lc, self.graph)

        def launch():
            with torch.cuda.stream(stream):
                start.record()
                body()
                end.record()
            end.synchronize()
        return launch

    def measure_lc(self, launch: Callable[[], None]) -> dict:
        for _ in range(10):
            launch()
        wall, device = [], []
        next_issue = time.perf_counter()
        collecting = gc.isenabled()
        gc.disable()  # as timeit does: a collection inside a timed job is not the GPU's doing
        try:
            for _ in range(self.iterations):
                if self.lc_wait == "sleep":
                    time.sleep(max(0.0, next_issue - time.perf_counter()))
                else:
                    while time.perf_counter() < next_issue:
                        time.sleep(0)  # the core stays awake; the GIL is let go each turn
                next_issue = max(next_issue + self.period_s, time.perf_counter())
                t0 = time.perf_counter()
                launch()
                wall.append((time.perf_counter() - t0) * 1e3)
                device.append(self.start_event.elapsed_time(self.end_event))
        finally:
            if collecting:
                gc.enable()
        return dict(lc_p50_ms=percentile(wall, 50), lc_p99_ms=percentile(wall, 99), lc_max_ms=max(wall),
                    lc_mean_ms=statistics.fmean(wall), lc_device_p50_ms=percentile(device, 50),
                    lc_device_p99_ms=percentile(device, 99), lc_samples=len(wall))

    def _measure_lc_sampled(self, launch: Callable[[], None]) -> dict:
        """measure_lc, with the GPU's mean SM clock and power over it (NVML): a GPU at its
        power cap runs every kernel, the LC job's too, at a lower clock."""
        with GpuSampler(torch.device("cuda")) as gpu, realtime_thread(self.lc_realtime) as realtime:
            row = self.measure_lc(launch)
        return dict(row, sm_clock_mhz=gpu.mean("sm_clock_mhz"), power_w=gpu.mean("power_w"),
                    power_capped_share=gpu.mean("power_capped"), lc_realtime=realtime)

    # -- the BE work --------------------------------------------------------------------

    def _be_product(self, mode: Mode, sched, green) -> Callable[[], object]:
        """One unit of BE work (a whole product / a whole op), launched; returns what to
        synchronize on to know it finished."""
        w = self.w
        if mode.be == "matmul":
            rows = mode.slice or w.n
            cuts = [(w.a[r:r + rows], w.c[r:r + rows]) for r in range(0, w.n, rows)]

            def launch_slices(checkpoint):
                for a_rows, c_rows in cuts:
                    checkpoint(a_rows.shape[0])
                    torch.mm(a_rows, w.b, out=c_rows)
        else:
            parts = w.big_parts(mode.slice)

            def launch_slices(checkpoint):
                for part, scale, bias in parts:
                    checkpoint(part.numel())
                    octopus.affine(part, scale, bias)

        if mode.be_stream == "lease":
            def product_leased():
                lease = sched.acquire("be." + mode.be, best_effort=True)
                with lease, torch.cuda.stream(lease.stream):
                    launch_slices(lease.checkpoint)
                return lease.release_event
            return product_leased
        stream = green[1] if mode.be_stream == "green" else self.normal

        def product():
            with torch.cuda.stream(stream):
                launch_slices(lambda units: None)
                done = torch.cuda.Event()
                done.record()
            return done
        return product

    @staticmethod
    def _be_loop(product: Callable[[], object], stop: threading.Event, completions: List[float],
                 errors: List[BaseException]) -> None:
        pending: collections.deque[Any] = collections.deque()
        try:
            while not stop.is_set():
                pending.append(product())
                while len(pending) > 2:  # two units queued: the device never waits for the host
                    pending.popleft().synchronize()
                    completions.append(time.perf_counter())
            while pending:
                pending.popleft().synchronize()
        except BaseException as error:  # noqa: BLE001 (reported by the mode)
            errors.append(error)

    def _start_be(self, product):
        stop, completions, errors = threading.Event(), [], []
        thread = threading.Thread(target=self._be_loop, args=(product, stop, completions, errors), daemon=True)
        thread.start()
        return stop, completions, errors, thread

    def be_alone(self, be: str) -> float:
        """Units per second of the plain, unsliced BE work alone on the whole GPU."""
        if be not in self.be_alone_rates:
            product = self._be_product(Mode("alone", "mlp", be), None, None)
            stop, completions, errors, thread = self._start_be(product)
            time.sleep(self.warmup_s)
            t0 = time.perf_counter()
            time.sleep(self.alone_s)
            t1 = time.perf_counter()
            stop.set()
            thread.join()
            if errors:
                raise errors[0]
            self.be_alone_rates[be] = sum(t0 <= c <= t1 for c in completions) / (t1 - t0)
        return self.be_alone_rates[be]

    # -- one mode -----------------------------------------------------------------------

    def run(self, mode: Mode) -> dict:
        row = dict(asdict(mode))
        sched, green = None, None
        try:
            if "lease" in (mode.lc_stream, mode.be_stream):
                sched = octopus.StreamScheduler(4, throttle=mode.throttle, best_effort_in_flight=mode.in_flight,
                                                reserved_sms=mode.reserved_sms, **mode.options)
                row["partition_sms"] = sched.stats()["devices"][0]["partition_sms"]
            if "green" in (mode.lc_stream, mode.be_stream):
                green = _torch_green_streams(mode.reserved_sms)
            launch = self._lc_launcher(mode, sched, green)
            if mode.be_stream == "none":
                row.update(self._measure_lc_sampled(launch))
                return row
            product = self._be_product(mode, sched, green)
            stop, completions, errors, thread = self._start_be(product)
            try:
                time.sleep(self.warmup_s)
                t0 = time.perf_counter()
                row.update(self._measure_lc_sampled(launch))
                t1 = time.perf_counter()
            finally:
                stop.set()
                thread.join()
            if errors:
                raise errors[0]
            rate = sum(t0 <= c <= t1 for c in completions) / (t1 - t0)
            row.update(be_units_per_s=rate, be_share=rate / self.be_alone(mode.be))
            if sched is not None:
                classes = sched.stats()["classes"]
                row.update(be_throttled_s=classes["best_effort"]["throttled_s"],
                           be_pauses=classes["best_effort"]["pauses"],
                           lc_lease_wait_p99_s=classes["high"]["wait_p99_s"])
        except Exception as error:  # noqa: BLE001 (recorded: the other modes still run)
            row["error"] = f"{type(error).__name__}: {error}"
        finally:
            torch.cuda.synchronize()
        return row


@contextlib.contextmanager
def realtime_thread(wanted: bool) -> Iterator[bool]:
    """The calling thread at the lowest real-time priority (Linux SCHED_FIFO 1) inside the
    block, where asked and allowed (CAP_SYS_NICE); yields whether it is. Other threads and
    processes then no longer delay its wake-ups. With ``--lc-wait sleep`` it sleeps between
    jobs; with ``spin`` (and while CUDA spin-waits for its job) it holds its core, and a
    thread of normal priority on that core waits."""
    if not wanted or not hasattr(os, "sched_setscheduler"):
        yield False
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, policy, param)


def _torch_green_streams(lc_sms: int):
    """Streams of two torch green contexts: the LC's on ``lc_sms`` SMs, the BE's on the rest."""
    from torch.cuda.green_contexts import GreenContext

    def create(sms):
        try:
            return GreenContext.create(num_sms=sms, device_id=0)
        except TypeError:  # older torch: positional
            return GreenContext.create(sms, 0)

    total = torch.cuda.get_device_properties(0).multi_processor_count
    lc_ctx, be_ctx = create(lc_sms), create(total - lc_sms)
    _GREEN_CONTEXTS.extend([lc_ctx, be_ctx])  # streams die with their context
    return lc_ctx.Stream(), be_ctx.Stream()


_GREEN_CONTEXTS: List[Any] = []  # every green context made, kept for the life of the process


def _count_name(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 and n % (1 << 20) == 0 else str(n)


def modes(rows: List[int], in_flights: List[int], partitions: List[int], elements: List[int]) -> List[Mode]:
    """Every mode, LC mlp beside BE matmul first (the sweep), then the other pairs."""
    out = [Mode("mlp alone", "mlp", "matmul", be_stream="none"),
           Mode("mlp alone, lease", "mlp", "matmul", lc_stream="lease", be_stream="none"),
           Mode("ragged LC alone", "ragged", "matmul", be_stream="none"),
           Mode("ragged LC alone, lease", "ragged", "matmul", lc_stream="lease", be_stream="none")]
    lease: Dict[str, Any] = dict(lc_stream="lease", be_stream="lease")
    for lc, be, slices in (("mlp", "matmul", rows), ("ragged", "matmul", rows[:2]), ("mlp", "ragged", elements)):
        unit = "rows" if be == "matmul" else "elements"
        full = lc == "mlp" and be == "matmul"  # the full sweep; a few modes for the other pairs
        out += [Mode(f"{lc}+{be}: plain streams", lc, be),
                Mode(f"{lc}+{be}: priority streams", lc, be, lc_stream="high")]
        out += [Mode(f"{lc}+{be}: priority streams, {_count_name(s)} {unit}/slice", lc, be, lc_stream="high", slice=s) for s in slices]
        if full:
            out += [Mode(f"{lc}+{be}: torch green contexts, LC on {k} SMs", lc, be, lc_stream="green",
                         be_stream="green", reserved_sms=k) for k in partitions]
            out += [Mode(f"{lc}+{be}: leases", lc, be, **lease),
                    Mode(f"{lc}+{be}: leases + throttle", lc, be, throttle="held", in_flight=1, **lease)]
            out += [Mode(f"{lc}+{be}: leases + slicing {_count_name(s)}", lc, be, slice=s, **lease) for s in slices]
            out += [Mode(f"{lc}+{be}: leases + slicing {_count_name(s)} + in-flight {f}", lc, be, slice=s, in_flight=f, **lease)
                    for s in slices[1:] for f in in_flights]
            out += [Mode(f"{lc}+{be}: leases + partition {k}", lc, be, reserved_sms=k, **lease) for k in partitions]
        out += [Mode(f"{lc}+{be}: leases + throttle + slicing {_count_name(s)} + in-flight {f}", lc, be, slice=s, throttle="held",
                     in_flight=f, **lease) for s in slices for f in in_flights]
        combined = partitions if full else partitions[1:2]
        out += [Mode(f"{lc}+{be}: leases + partition {k} + slicing {_count_name(s)} + in-flight {f}", lc, be, slice=s,
                     in_flight=f, reserved_sms=k, **lease)
                for k in combined for s in (slices[1:] if full else slices[:1]) for f in in_flights]
        out += [Mode(f"{lc}+{be}: leases + partition {k} + throttle + slicing {_count_name(s)} + in-flight {f}", lc, be, slice=s,
                     throttle="held", in_flight=f, reserved_sms=k, **lease)
                for k in partitions[1:2] for s in slices[1:2] for f in in_flights[-1:]]
    return out


def summarize(rows: List[dict], alone_ms: dict, alone_p99_ms: Optional[dict] = None) -> List[dict]:
    """Adds each row's p99 over its LC job's alone time (its p50 alone: the target's measure)
    and over its p99 alone (like for like: the host's own jitter is in both), and whether it
    meets the target."""
    for r in rows:
        base = alone_ms.get(r["lc"])
        base_p99 = (alone_p99_ms or {}).get(r["lc"])
        if "lc_p99_ms" in r and base_p99:
            r["lc_p99_over_alone_p99"] = r["lc_p99_ms"] / base_p99
        if "lc_p99_ms" in r and base:
            r["lc_p99_over_alone"] = r["lc_p99_ms"] / base
            if "be_share" in r:
                r["meets_target"] = r["lc_p99_over_alone"] <= TARGET_P99_RATIO and r["be_share"] >= TARGET_BE_SHARE
    return rows


def format_table(rows: List[dict]) -> str:
    row = "{:<78}{:>9}{:>9}{:>11}{:>9}{:>15}{:>7}{:>8}{:>8}"
    lines = [row.format("mode", "p50 ms", "p99 ms", "p99/alone", "GPU p99", "p99/alone p99", "BE %", "SM MHz",
                        "target")]
    labels: Dict[Optional[bool], str] = {True: "yes", False: "no"}
    for r in rows:
        if "error" in r:
            lines.append(f"{r['name']:<78}  error: {r['error'][:120]}")
            continue
        share = f"{100 * r['be_share']:.0f}" if "be_share" in r else "-"
        clock = f"{r['sm_clock_mhz']:.0f}" if r.get("sm_clock_mhz") is not None else "-"
        target = labels.get(r.get("meets_target"), "-")
        lines.append(row.format(r["name"], f"{r['lc_p50_ms']:.3f}", f"{r['lc_p99_ms']:.3f}",
                                f"{r.get('lc_p99_over_alone', float('nan')):.2f}",
                                f"{r.get('lc_device_p99_ms', float('nan')):.3f}",
                                f"{r.get('lc_p99_over_alone_p99', float('nan')):.2f}", share, clock, target))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="octopus-bench contention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default=None, help="write the raw measurements here")
    parser.add_argument("--iterations", type=int, default=250, help="LC jobs timed per mode")
    parser.add_argument("--period-ms", type=float, default=2.0, help="time between LC submissions")
    parser.add_argument("--rows", type=int, nargs="+", default=[256, 512, 1024],
                        help="BE matmul rows per slice to sweep")
    parser.add_argument("--elements", type=int, nargs="+", default=[16 << 20, 64 << 20],
                        help="BE ragged elements per slice to sweep")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 2], help="best_effort_in_flight values")
    parser.add_argument("--reserved-sms", type=int, nargs="+", default=[8, 16, 32],
                        help="SMs kept from BE work (octopus partitions) / given to the LC (torch green contexts)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the BE work's size")
    parser.add_argument("--lc-wait", choices=("sleep", "spin"), default="sleep",
                        help="how the LC thread waits for its next submission: time.sleep, or a busy loop that "
                             "keeps its core awake (the timed part, submission to completion, is the same)")
    parser.add_argument("--lc-realtime", action="store_true",
                        help="run the LC thread at real-time priority (Linux SCHED_FIFO 1; needs CAP_SYS_NICE, "
                             "each row says whether it got it) while it is timed: the host's own scheduling "
                             "delays out of its tail")
    parser.add_argument("--switch-interval", type=float, default=1e-4,
                        help="sys.setswitchinterval while the modes run (s): how long the LC thread may wait for "
                             "the GIL before it asks the BE thread to drop it")
    parser.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                        help="run only the modes whose name contains one of these (and the alone modes)")
    args = parser.parse_args(argv)
    if args.iterations < 10 or args.period_ms <= 0 or args.scale <= 0 or args.switch_interval <= 0:
        parser.error("--iterations must be at least 10, --period-ms, --scale and --switch-interval positive")

    overhead = [lease_overhead("simulated")]
    checkpoints = [checkpoint_cost("simulated")]
    batching = [batcher_overhead("simulated")]
    rows: List[dict] = []
    has_cuda = torch.cuda.is_available() and octopus.built_with_cuda
    device = torch.device("cuda" if has_cuda else "cpu")
    alone_ms, alone_p99_ms = {}, {}
    switch_interval = sys.getswitchinterval()
    if has_cuda:
        overhead.insert(0, lease_overhead("cuda"))
        checkpoints.insert(0, checkpoint_cost("cuda"))
        batching.insert(0, batcher_overhead("cuda"))
        torch.backends.cuda.matmul.allow_tf32 = True
        # The LC thread must get the GIL back promptly when its synchronization returns.
        sys.setswitchinterval(args.switch_interval)
        try:
            runner = Runner(Workloads(device, args.scale), args.iterations, args.period_ms / 1e3, warmup_s=0.25,
                            alone_s=1.0, lc_wait=args.lc_wait, lc_realtime=args.lc_realtime)
            for mode in modes(args.rows, args.in_flight, args.reserved_sms, args.elements):
                if args.only and not any(text in mode.name for text in args.only) and "alone" not in mode.name:
                    continue
                t0 = time.perf_counter()
                row = runner.run(mode)
                row["seconds"] = time.perf_counter() - t0
                rows.append(row)
                if mode.be_stream == "none" and mode.lc_stream == "normal" and "lc_p99_ms" in row:
                    alone_ms[mode.lc], alone_p99_ms[mode.lc] = row["lc_p50_ms"], row["lc_p99_ms"]
                print(format_table(summarize([row], alone_ms, alone_p99_ms)).splitlines()[-1], flush=True)
            be_alone = runner.be_alone_rates
        finally:
            sys.setswitchinterval(switch_interval)
    else:
        be_alone = {}
        print("no CUDA device: only the lease, checkpoint and batcher overheads on the simulated backend are measured",
              file=sys.stderr)
    summarize(rows, alone_ms, alone_p99_ms)
    print(format_table(rows))
    for o in overhead:
        print(f"acquire + release ({o['backend']}): C++ {o['cpp_us']:.2f} us, Python {o['python_us']:.2f} us")
    for c in checkpoints:
        print(f"best-effort checkpoint ({c['backend']}): {c['checkpoint_us']:.2f} us")
    for b in batching:
        print(f"Batcher ({b['backend']}): {b['back_to_back_us_per_request']:.1f} us/request back to back, "
              f"{b['single_request_us_p50']:.1f} us for one request alone ({b['overhead_us_per_request']:.1f} us "
              f"over packing it directly)")
    if args.json:
        result = dict(environment=environment(device), target=dict(lc_p99_over_alone=TARGET_P99_RATIO,
                                                                   be_share=TARGET_BE_SHARE),
                      lc_alone_p50_ms=alone_ms, lc_alone_p99_ms=alone_p99_ms, be_alone_units_per_s=be_alone, period_ms=args.period_ms,
                      switch_interval_s=args.switch_interval, lc_wait=args.lc_wait, lc_realtime=args.lc_realtime,
                      iterations=args.iterations, modes=rows, lease_overhead=overhead, checkpoint=checkpoints,
                      batcher=batching)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"raw measurements: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The stream-lease scheduler: callers share GPUs through leased CUDA streams.

``StreamScheduler`` wraps the C++ ``octopus::scheduler::StreamScheduler``: a pool of
streams per device (normal, high-priority and best-effort, created once), leases granted
while the device has capacity (lease count, estimated occupancy, free-memory reserve),
waiting callers served by class (latency-critical, normal, best-effort), priority,
earliest deadline and arrival, with the GIL released while they wait. Best-effort holders
call :meth:`Lease.checkpoint` between slices of their work (:meth:`Lease.slices`,
:meth:`StreamScheduler.run_sliced`): it bounds their work in flight on the device and
pauses them while latency-critical work is held or waiting there. ``map`` and ``submit``
run Python callables on leased streams from a thread pool sized to the capacity, ordering
the streams and keeping tensors alive correctly.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import math
import warnings
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence, Tuple, cast

import torch

from .. import _library
from ..ragged import RaggedBatch
from .arguments import DEFAULT, parse_arrived, parse_deadline, parse_priority, parse_shape, parse_timeout, whole_number
from .config import SchedulerConfig
from .executor import LeaseExecutor
from .gil import check_interval, lower_switch_interval, restore_switch_interval
from .graphs import replay_graph
from .slicing import SliceSizer, count_slices, item_ranges
from .streams import current_stream_id, record_stream

_C = _library._C

LeaseTimeout = _C.LeaseTimeout
LeaseTimeout.__doc__ = "An acquire timed out; the message names the limit that kept it waiting."
LeaseTimeout.__module__ = __name__
DeadlineMissed = _C.DeadlineMissed
DeadlineMissed.__doc__ = ("A request's deadline cannot be met: on arrival (by the estimate from its kind's recent "
                          "hold times and the wait ahead of it), or because it passed while the request waited. "
                          "A subclass of LeaseTimeout.")
DeadlineMissed.__module__ = __name__

class ReleaseEvent:
    """The CUDA event a lease recorded on its stream when it was returned."""

    __slots__ = ("_event", "_device")

    def __init__(self, event: Any, device: torch.device | None):
        self._event = event
        self._device = device

    def done(self) -> bool:
        """True once all work the lease queued on its stream has finished."""
        return cast(bool, self._event.done())

    def synchronize(self) -> None:
        """Blocks (without the GIL) until the lease's work has finished."""
        self._event.synchronize()

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        """Makes later work on ``stream`` (default: the current stream of the lease's
        device) wait for the lease's work, without blocking the host."""
        if self._device is None:
            return
        if stream is None:
            stream = torch.cuda.current_stream(self._device)
        self._event.wait(stream.cuda_stream)


class Lease:
    """A leased stream; a context manager that returns the lease on exit.

    ``stream`` is a :class:`torch.cuda.Stream` (use it with ``torch.cuda.stream``), or
    None on the simulated backend. Work queued on it before the lease is returned runs
    before anything the next lease of the same stream queues. A best-effort lease's stream
    may change at a :meth:`checkpoint` (the latency controller moved best-effort work to
    another SM partition; the new stream runs after the old one's work): the slicing
    helpers follow it.
    """

    __slots__ = ("_lease", "_owner", "device")

    def __init__(self, lease: Any, owner: StreamScheduler, device: torch.device | None):
        self._lease = lease
        self._owner = owner
        self.device = device

    @property
    def stream(self) -> torch.cuda.Stream | None:
        """The leased stream (None on the simulated backend)."""
        return self._owner._stream(self._lease.stream_ptr, self.device) if self.device is not None else None

    device_index = property(lambda self: self._lease.device, doc="The leased stream's device index.")
    kind = property(lambda self: self._lease.kind)
    priority = property(lambda self: self._lease.priority)
    work_class = property(lambda self: self._lease.work_class,
                          doc="``'high'`` (latency-critical), ``'normal'`` or ``'best_effort'``.")
    promoted = property(lambda self: self._lease.promoted,
                        doc="Whether its deadline was infeasible and it was made latency-critical.")
    occupancy = property(lambda self: self._lease.occupancy, doc="The lease's occupancy estimate.")
    waited_s = property(lambda self: self._lease.waited_s, doc="Seconds it waited before its grant.")
    queued = property(lambda self: self._lease.queued, doc="Whether it had to wait for capacity.")
    active = property(lambda self: self._lease.active)

    @property
    def release_event(self) -> ReleaseEvent | None:
        """The event recorded when the lease was returned (None while it is held)."""
        event = self._lease.release_event
        return None if event is None else ReleaseEvent(event, self.device)

    def release(self) -> ReleaseEvent | None:
        """Records the release event on the stream and returns the stream to the pool.
        Returns that event (also kept as ``release_event``); a second call does nothing."""
        self._lease.release()
        return self.release_event

    def replay_graph(self, graph: torch.cuda.CUDAGraph) -> None:
        """Replays a captured ``graph`` on the leased stream without letting go of the GIL
        (:func:`octopus.replay_graph`): a latency-critical holder's launch is not kept
        waiting behind another thread's Python. ``ValueError`` on the simulated backend."""
        stream = self.stream
        if stream is None:
            raise ValueError("Lease.replay_graph: a lease of the simulated backend has no CUDA stream to replay on")
        replay_graph(graph, stream)

    def checkpoint(self, units: float = 0.0) -> float:
        """Call between slices of best-effort work, before launching the next slice.

        A best-effort holder blocks here (GIL released) until at most ``in_flight - 1`` of
        its earlier slices are unfinished on the device (events recorded at each
        checkpoint; the latency controller's bound, or the pinned ``best_effort_in_flight``),
        then while latency-critical work throttles it or a probe measures that work alone,
        at most ``best_effort_max_pause`` seconds at a time. Its :attr:`stream` may change
        here. ``units`` is the size of the coming slice, for the kind's measured device time
        per unit. Returns the seconds it was paused. Other classes return 0 at once. A
        best-effort holder that never calls it is never paused.
        """
        return cast(float, self._lease.checkpoint(float(units)))

    def end_slice(self) -> None:
        """Ends the slice the last :meth:`checkpoint` started: call it once the last slice is
        queued. The slice's device time and the host's time per slice are then measured like
        every other slice's (once it has finished, at a later checkpoint of any best-effort
        lease; nothing waits for it). A slice still open when the lease is returned is not
        measured (its holder may not have queued its work). The slicing helpers call it
        themselves; nothing happens on a lease that was returned or never reached a
        checkpoint."""
        self._lease.end_slice()

    def slices(self, total: int, size: int | None = None, *, budget: float | None = None) -> Iterator[slice]:
        """``slice(start, stop)`` objects covering ``range(total)``, with a :meth:`checkpoint`
        before each: ``for rows in lease.slices(8192, 512): torch.mm(a[rows], b, out=c[rows])``.

        Each slice has ``size`` units, or as many as the kind's measured device time per unit
        fits in ``budget`` seconds, or (neither given) in the latency controller's slice
        length for the device (re-read before every slice; while nothing is measured, probes
        growing from 1/64 of the work); all of them where there is no controller. Where the
        lease's stream is the current one, each slice runs with the lease's current stream as
        the current one.
        """
        total = whole_number(total, "total")
        sizer = SliceSizer(size, self._budget(size, budget), self._seconds_per_unit, total,
                           self._host_seconds)
        with self._following_stream() as follow:
            for part in count_slices(total, sizer):
                self._lease.checkpoint(float(part.stop - part.start))
                follow()
                yield part
            self._lease.end_slice()

    def item_slices(self, batch: RaggedBatch, max_elements: int | None = None, *,
                    budget: float | None = None) -> Iterator[Tuple[slice, RaggedBatch]]:
        """``(items, part)`` pairs covering ``batch`` in order, with a :meth:`checkpoint`
        before each: ``items`` a ``slice`` of item indices and ``part`` those items as a
        batch whose values are a view of ``batch``'s (:meth:`RaggedBatch.narrow_items`).

        Each part holds whole items of at most ``max_elements`` elements in all (an item
        larger than that is a part of its own), or as many elements as the kind's measured
        device time per element fits in ``budget`` seconds or (neither given) in the latency
        controller's slice length, or the whole batch where there is no controller. The
        current stream follows the lease's as in :meth:`slices`.
        """
        if not isinstance(batch, RaggedBatch):
            raise TypeError(f"batch must be a RaggedBatch, got {type(batch).__name__}")
        sizer = SliceSizer(max_elements, self._budget(max_elements, budget), self._seconds_per_unit,
                           batch.numel(), self._host_seconds)
        with self._following_stream() as follow:
            for start, stop, elements in item_ranges(batch, sizer):
                self._lease.checkpoint(float(elements))
                follow()
                yield slice(start, stop), batch.narrow_items(start, stop)
            self._lease.end_slice()

    def _seconds_per_unit(self) -> float | None:
        return cast("float | None", self._owner._impl.seconds_per_unit(self.kind))

    def _host_seconds(self) -> float | None:
        return cast("float | None", self._owner._impl.host_seconds_per_slice(self.kind))

    def _budget(self, size: int | None, budget: float | None) -> float | Callable[[], float | None] | None:
        """The budget slices are sized to: the one given, else the controller's slice length
        (read before every slice), where no size is given either."""
        if budget is not None or size is not None:
            return budget
        return lambda: cast("float | None", self._owner._impl.slice_budget_s(self._lease.device, self.kind))

    @contextlib.contextmanager
    def _following_stream(self) -> Iterator[Callable[[], None]]:
        """A ``follow()`` that, where the lease's stream was the current one when this began,
        makes the lease's stream of the moment the current one (it can change at a
        checkpoint); the stream current before comes back at the end."""
        stream = self.stream
        if stream is None or current_stream_id(stream.device_index) != stream.stream_id:
            yield lambda: None
            return
        index = stream.device_index

        def follow() -> None:
            now = cast(torch.cuda.Stream, self.stream)
            if current_stream_id(index) != now.stream_id:
                torch.cuda.set_stream(now)

        try:
            yield follow
        finally:
            torch.cuda.set_stream(stream)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self._lease.release()

    def __repr__(self) -> str:
        state = "active" if self.active else "released"
        return (f"Lease(kind={self.kind!r}, device={self.device_index}, stream_slot={self._lease.stream_slot}, "
                f"class={self.work_class!r}, priority={self.priority}, {state})")


class StreamScheduler:
    """Leases CUDA streams to many callers sharing one or more GPUs.

    Args:
        max_leases_per_device: leases held at once on one device (the pool holds this many
            normal-, high-priority and best-effort streams per device).
        backend: ``"cuda"``, or ``"simulated"`` (a CPU simulation with ``simulated_devices``
            devices and no real streams: for testing scheduling logic without a GPU).
        use_nvml: read GPU utilization from NVML (loaded at run time where libnvidia-ml
            exists): it breaks ties between equally loaded devices and drives
            ``target_utilization``.
        gil_switch_interval: with latency control on, the interpreter's GIL switch interval
            is kept at most this many seconds while the scheduler is open (None: left as it
            is). A latency-critical thread that wakes while a best-effort thread runs Python
            waits up to this long for the GIL; Python's own 5 ms would be its tail.
        config: a :class:`SchedulerConfig` of the other options; keyword ``options`` (its
            field names, e.g. ``timeout=1.0``, ``latency_ratio=2.0``) override its fields.

    With latency control on (the default), latency-critical leases (``priority="high"``) are
    timed from request (or the ``arrived`` time given to :meth:`acquire`) to completion on the
    device, per kind; best-effort work
    (``best_effort=True``, sliced with :meth:`Lease.slices`, :meth:`Lease.item_slices`,
    :meth:`run_sliced` or :meth:`Lease.checkpoint`) is held back as far as each kind's
    target (:meth:`set_target`; default: p99 within ``latency_ratio`` x its p99 alone) needs,
    and no further. :meth:`stats` shows the controller's state per device.

    Kinds ``"octopus.affine"`` (and octopus's other kernels) are registered with an
    occupancy estimate from ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``; register your
    own with :meth:`register_kind` or :meth:`register_kernel`.
    """

    def __init__(self, max_leases_per_device: int | None = None, *, backend: str = "cuda", simulated_devices: int = 1,
                 use_nvml: bool = True, gil_switch_interval: float | None = 2e-4,
                 config: SchedulerConfig | None = None, **options: Any):
        if backend == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("octopus.StreamScheduler: no CUDA device is available to this torch; "
                               "use backend='simulated' to run the scheduler without a GPU")
        unknown = sorted(set(options) - set(SchedulerConfig.option_names()))
        if unknown:
            raise TypeError(f"StreamScheduler got unknown option(s) {', '.join(map(repr, unknown))}; the options are "
                            f"backend, simulated_devices, use_nvml, gil_switch_interval, config and "
                            f"{', '.join(SchedulerConfig.option_names())}")
        if max_leases_per_device is not None:
            options["max_leases_per_device"] = max_leases_per_device
        if gil_switch_interval is not None:
            gil_switch_interval = check_interval(gil_switch_interval)
        self.config = dataclasses.replace(config or SchedulerConfig(), **options)
        self._impl = _C.StreamScheduler(self.config.native(), backend, int(simulated_devices), bool(use_nvml))
        self._cuda = backend == "cuda"
        self._streams: dict[int, torch.cuda.Stream] = {}  # by stream pointer
        # torch.device per index, made once: acquire + release is on latency-critical paths.
        self._torch_devices: dict[int, torch.device] = {}
        self._executor = LeaseExecutor(self)
        # Lowered last, so a constructor that raised leaves the interpreter as it was.
        self._gil: Callable[[], Any] | None = None
        if self.config.latency_control and gil_switch_interval is not None:
            token = lower_switch_interval(gil_switch_interval)
            self._gil = weakref.finalize(self, restore_switch_interval, token)

    # -- leases -------------------------------------------------------------------------

    def acquire(self, kind: str = "default", shape: Sequence[int] | None = None, *, priority: int | str = "normal",
                timeout: float | None = DEFAULT, device: int | torch.device | None = None, bytes: int = 0,
                deadline: float | None = None, best_effort: bool = False, arrived: float | None = None) -> Lease:
        """Leases a stream, waiting (GIL released) while the device is at capacity. A lease
        granted at once keeps the GIL throughout (giving it up would let a thread running
        Python take it, and this caller wait for it back).

        ``shape`` sizes the work for kinds registered with a kernel profile; ``priority``
        is ``"high"`` (latency-critical: a high-priority stream, and best-effort holders on
        the device pause at their checkpoints), ``"normal"``, ``"low"`` (best-effort, as is
        ``best_effort=True``) or an int (> 0 high, < 0 best-effort, higher first);
        ``timeout`` in seconds (None: wait for ever; default: the scheduler's); ``device``
        None picks the least-loaded device; ``bytes`` is memory the work will allocate, held
        against the free-memory reserve; ``deadline`` (seconds from now) orders waiters of
        one priority earliest-deadline-first; ``arrived`` (a :func:`time.perf_counter` reading)
        is when the work arrived, if before this call: a latency-critical kind's latency, which
        its target judges, then counts from there (a request's queueing in a server, a thread
        that woke late) rather than from this call; timeouts and deadlines still count from
        now. Raises :class:`LeaseTimeout` naming the limit that was hit,
        :class:`DeadlineMissed` where the deadline cannot be met.
        """
        arrived = None if arrived is None else parse_arrived(arrived)  # (no call on the common path)
        if (shape is None and timeout is DEFAULT and device is None and bytes == 0 and deadline is None
                and best_effort is False):
            # The common call (a kind and a priority) skips the other arguments' parsing: acquire +
            # release is on every latency-critical job's path, within a budget of a few microseconds.
            lease = self._impl.acquire_kind(kind, parse_priority(priority), arrived)
        else:
            lease = self._impl.acquire(kind, parse_shape(shape), parse_priority(priority), parse_timeout(timeout),
                                       self._device_index(device), bytes, parse_deadline(deadline), bool(best_effort),
                                       arrived)
        return self._wrap(lease)

    def try_acquire(self, kind: str = "default", shape: Sequence[int] | None = None, *,
                    priority: int | str = "normal", device: int | torch.device | None = None,
                    bytes: int = 0, deadline: float | None = None, best_effort: bool = False,
                    arrived: float | None = None) -> Lease | None:
        """A lease if one can be granted now (nobody served before it waiting for the
        device), else None. Never blocks; an infeasible deadline raises as in :meth:`acquire`;
        ``arrived`` as in :meth:`acquire`."""
        lease = self._impl.try_acquire(kind, parse_shape(shape), parse_priority(priority), self._device_index(device), bytes,
                                       parse_deadline(deadline), bool(best_effort), parse_arrived(arrived))
        return None if lease is None else self._wrap(lease)

    def run_sliced(self, fn: Callable[..., Any], work: int | RaggedBatch, size: int | None = None, *,
                   budget: float | None = None, kind: str = "sliced", shape: Sequence[int] | None = None,
                   priority: int | str = "low", best_effort: bool = False, timeout: float | None = DEFAULT,
                   device: int | torch.device | None = None, bytes: int = 0,
                   deadline: float | None = None) -> list[Any]:
        """Runs long work in slices under one lease (best-effort by default), on the calling
        thread, with a :meth:`Lease.checkpoint` before each slice; returns fn's results in order.

        ``work`` an int: ``fn(rows)`` for each ``rows = slice(start, stop)`` of ``range(work)``
        (:meth:`Lease.slices`), e.g. a row-blocked matmul. ``work`` a :class:`RaggedBatch`:
        ``fn(part, items)`` for each part of whole items (a view, no copy) and its ``slice``
        of item indices (:meth:`Lease.item_slices`), e.g.
        ``lambda part, items: octopus.affine(part, scale[items], bias[items])``. ``size`` is
        units (rows, elements) per slice, or ``budget`` seconds of device time per slice at
        the kind's measured rate. The lease's stream waits for the caller's current stream
        first; the caller's stream waits for the lease's work after, so results can be used
        at once. The other arguments go to :meth:`acquire`.
        """
        if not isinstance(work, RaggedBatch):
            work = whole_number(work, "work")
        lease = self.acquire(kind, shape, priority=priority, timeout=timeout, device=device, bytes=bytes,
                             deadline=deadline, best_effort=best_effort)
        with lease:
            parts: Iterator[tuple[Any, ...]]
            if isinstance(work, RaggedBatch):
                parts = ((part, items) for items, part in lease.item_slices(work, size, budget=budget))
            else:
                parts = ((rows,) for rows in lease.slices(work, size, budget=budget))
            if lease.stream is None:
                return [fn(*part) for part in parts]
            consumer = torch.cuda.current_stream(lease.device)
            first = lease.stream
            first.wait_stream(consumer)
            inputs = (work.values, work.offsets, work.sizes) if isinstance(work, RaggedBatch) else ()
            used = set()  # every stream the lease ran on reads the work's tensors
            results = []
            with torch.cuda.device(lease.device), torch.cuda.stream(first):
                for part in parts:
                    stream = torch.cuda.current_stream(lease.device)
                    if stream.cuda_stream not in used:
                        used.add(stream.cuda_stream)
                        record_stream(inputs, stream)
                    results.append(fn(*part))
            record_stream(results, consumer)
        cast(ReleaseEvent, lease.release_event).wait(consumer)  # set when the lease was returned
        return results

    def register_kind(self, kind: str, occupancy: float) -> None:
        """Every lease of ``kind`` is estimated to occupy ``occupancy`` (0, 1] of a device."""
        self._impl.register_kind(kind, float(occupancy))

    def register_kernel(self, kind: str, blocks_per_sm: int, elements_per_block: int) -> None:
        """Leases of ``kind`` occupy ceil(numel(shape) / elements_per_block) blocks of a
        kernel with ``blocks_per_sm`` resident blocks per multiprocessor (capped at 1)."""
        self._impl.register_kernel(kind, int(blocks_per_sm), int(elements_per_block))

    def estimate_occupancy(self, kind: str, shape: Sequence[int] | None = None, device: int | None = None) -> float:
        """The occupancy estimate a lease of ``kind`` and ``shape`` gets."""
        index = self._device_index(device)
        return cast(float, self._impl.estimate_occupancy(kind, parse_shape(shape), self.devices[0] if index < 0 else index))

    def seconds_per_unit(self, kind: str) -> float | None:
        """Device seconds per unit (row, element) of ``kind``'s sliced work: a low percentile
        of the recent slices' device time (from an event before each slice to one after it,
        recorded at best-effort checkpoints where ``best_effort_in_flight`` > 0; pauses between
        slices are not in it), or what :meth:`set_seconds_per_unit` set; None before either.
        Slices launched while the holder's previous one was still on the device count (where some
        came in the last 30 s); one launched onto an idle stream also counts its wait for SMs
        other streams' kernels hold, and only lowers the estimate; where only such slices
        stand, the estimate stays within 4x of its lowest since the others did or since one was
        set, a base that rises at most 4-fold every 30 s (a wait longer than the slices would
        otherwise shrink them without end). Slices with a ``budget`` use it."""
        return cast("float | None", self._impl.seconds_per_unit(kind))

    def host_seconds_per_slice(self, kind: str) -> float | None:
        """The host's seconds per slice of ``kind``'s sliced work (from a checkpoint to the
        next: launching the slice, and in a Python holder any wait for the GIL), the median of
        the recent slices'; None before any was measured. Slices sized from a budget are kept
        at least twice as long on the device."""
        return cast("float | None", self._impl.host_seconds_per_slice(kind))

    def set_seconds_per_unit(self, kind: str, seconds: float) -> None:
        """Sets ``kind``'s device seconds per unit (from an earlier measurement). Slices of its
        returned leases not measured yet are then left out; later slices move it as before."""
        self._impl.set_seconds_per_unit(kind, float(seconds))

    def set_target(self, kind: str, p99_ms: float | None = None, *, ratio: float | None = None) -> None:
        """The latency target of latency-critical leases of ``kind`` (``priority="high"``):
        their p99, from request (or ``arrived``) to completion on the device, within ``p99_ms`` milliseconds,
        or within ``ratio`` x their own p99 measured while the device ran no best-effort work
        (the default for kinds without a target: ``latency_ratio``, 1.5). The scheduler then
        holds best-effort work back as far as that needs and no further. A target that cannot
        be met (below the kind's p99 alone, or plainly missed with best-effort work held back
        as far as it goes and met at no step on record) is reported with a
        :class:`RuntimeWarning` (on a later ``acquire``) and in :meth:`stats`; the report is
        withdrawn from :meth:`stats` if the target it was judged against rises by over 10% (a
        relative target whose alone p99 is measured again) or the alone p99 falls 10% under an
        absolute target it was over, and a new warning comes if the new target is missed too. Needs
        ``latency_control`` (on by default)."""
        if p99_ms is not None and ratio is not None:
            raise ValueError("give p99_ms or ratio, not both")
        if p99_ms is not None and not (isinstance(p99_ms, (int, float)) and math.isfinite(p99_ms) and p99_ms > 0):
            raise ValueError(f"p99_ms must be a positive number of milliseconds, got {p99_ms!r}")
        if ratio is not None and not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio >= 1):
            raise ValueError(f"ratio must be a number of at least 1 (the kind's p99 alone), got {ratio!r}")
        if not self.config.latency_control:
            raise RuntimeError("set_target needs latency_control=True")
        self._impl.set_target(str(kind), None if p99_ms is None else p99_ms / 1e3,
                              None if ratio is None else float(ratio))

    def slice_budget(self, device: int | torch.device | None = None, kind: str = "") -> float | None:
        """Seconds of device time the slicing helpers give one best-effort slice of ``kind``
        on ``device`` now (the latency controller's: a kind it released may get longer ones;
        None without latency control)."""
        index = self._device_index(device)
        return cast("float | None", self._impl.slice_budget_s(self.devices[0] if index < 0 else index, str(kind)))

    def adapt_concurrency(self) -> None:
        """One step of adaptive concurrency now: samples utilization and moves each device's
        lease limit toward ``target_utilization`` (a background thread does this every
        ``utilization_interval`` s where a target is set)."""
        self._impl.adapt_concurrency()

    @property
    def simulated_backend(self) -> Any:
        """The simulated backend's test hooks (``backend="simulated"`` only):
        ``set_utilization(device, value)``, ``set_free_memory(device, bytes)``,
        ``set_manual_events(bool)`` with ``complete_events(device, count)`` and
        ``pending_events(device)``, ``set_partition_failure(reason)``."""
        return self._impl.simulated_backend

    # -- observability ------------------------------------------------------------------

    @property
    def devices(self) -> list[int]:
        return list(self._impl.devices)

    @property
    def backend(self) -> str:
        return cast(str, self._impl.backend)

    @property
    def capacity(self) -> int:
        """Leases that can be held at once over all devices."""
        return cast(int, self._impl.max_leases_per_device * len(self._impl.devices))

    def stats(self) -> dict[str, Any]:
        """Counters: granted, released, active, waited, timeouts, rejected (try_acquire),
        waiting (now), total_wait_s, max_wait_s, deadline_misses; under ``classes``, per
        class (``"high"``, ``"normal"``, ``"best_effort"``) wait and hold p50/p99 over its
        recent leases, deadlines rejected / expired / late / promoted, and best-effort
        time throttled and pauses; and per device active/peak leases (best-effort and
        latency-critical ones too), the lease limit, occupancy in use, granted, the last
        free-memory sample, the SMs best-effort work runs on (0: all), NVML utilization,
        device yield (``yield_gate``: whether the device has a gate; ``gate_closes``: the
        latency-critical leases that closed it; ``yielding_launches``: octopus kernels on
        best-effort streams launched to yield) and, under ``control``, the latency controller:
        its step of how many (``steps``), what that step means (``slice_budget_s``,
        ``in_flight``, ``reserved_sms``, ``throttle``, ``device_yield``),
        whether it probes, its climbs (``median_climbs`` of them for a median over its bound,
        the others for a spent error budget), descents (``unhelpful_descents`` of them from a
        step over target whose step below was on record as no worse) and probes, the seconds it spent at
        each step (``seconds_at_steps``), the best-effort units started, and
        per latency-critical kind its target, p99 alone (a lower 90% confidence bound of it:
        the guide's "Targets") and recently, samples and
        ``attainment`` (the share within target), whether its target is infeasible, whether
        its median is over its bound where no step lowers it (``median_unhelped``), and under
        ``steps``, per step of the ladder, its jobs while the controller held that step (best-
        effort work present), how many were over target, how many were left out of the step's
        record as ``unsettled`` (best-effort work an earlier step let in was still on the device),
        the recent settled jobs' p50 and p99, and their tails with the yield gate closed and
        left open (``closed_tail``, ``open_tail``: jobs and of them over the target, the older
        ones counting half past 800): what each step bought it on this workload; per best-effort kind (``best_effort_kinds``)
        whether the controller released it to ``released_settings`` (the last step that
        only keeps SMs free), whether that is a try still under way, its tries and how
        many were undone; and per latency-critical kind whether its leases close the yield
        gate (``closes_gate``: the controller leaves it open for kinds whose own record shows
        the gate does not help them), whether that is a try under way (``gate_on_trial``),
        its tries (``gate_trials``) and the closings again (``gate_failures``)."""
        if self._impl.has_reports:
            self._warn_reports()
        return cast("dict[str, Any]", self._impl.stats())

    def dump_trace(self, path: str) -> None:
        """Writes the recorded timeline (``record_timeline=True``) as Chrome-trace JSON,
        for chrome://tracing or https://ui.perfetto.dev: each lease on its stream's row
        (class, priority, deadline; for latency-critical ones ``closed_gate``, whether best-effort
        kernels stepped aside while it was held), waits, throttled pauses, timeouts and
        deadline misses; under latency control the controller's settings and each
        latency-critical job's latency (its target, and ``alone``: no best-effort work on the
        device) as counters; the per-class statistics under ``otherData``."""
        self._impl.write_trace(str(path))

    # -- executor -----------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, acquire_options: dict[str, Any] | None = None,
               **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Runs ``fn(*args, **kwargs)`` on a leased stream from the scheduler's thread pool.

        The lease's stream first waits for the work already queued on the caller's current
        stream; the result is safe to use on that stream once the future is done (the
        caller's stream waits for the lease's work, and tensors crossing streams are
        recorded with ``record_stream``). ``acquire_options`` go to :meth:`acquire`.
        """
        return self._executor.submit(fn, args, kwargs, dict(acquire_options or {}))

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], *, kind: str = "map",
            shape: Sequence[int] | None = None, priority: int | str = "normal", timeout: float | None = DEFAULT,
            device: int | torch.device | None = None) -> list[Any]:
        """``[fn(item) for item in items]``, each call on a leased stream, results in order.

        Stream ordering and tensor lifetimes are handled as in :meth:`submit`. If any call
        raises, the items not yet started are skipped, every lease is returned, and the
        exception of the earliest failing item is raised. ``fn`` must not call ``map`` or
        ``submit`` of the same scheduler (it would wait on its own pool).
        """
        return self._executor.map(fn, items, dict(kind=kind, shape=shape, priority=priority, timeout=timeout,
                                                  device=device))

    def close(self) -> None:
        """Waits for submitted work, stops the thread pool and gives the interpreter its GIL
        switch interval back."""
        self._executor.close()
        if self._gil is not None:
            self._gil()

    def __enter__(self) -> "StreamScheduler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"StreamScheduler(backend={self.backend!r}, devices={self.devices}, "
                f"max_leases_per_device={self._impl.max_leases_per_device})")

    # -- internals ----------------------------------------------------------------------

    def _device_index(self, device: int | torch.device | str | None) -> int:
        if device is None:
            return -1
        if isinstance(device, (str, torch.device)):
            device = torch.device(device)
            if device.type != "cuda":
                raise ValueError(f"device must be a CUDA device or index, got {device}")
            return torch.cuda.current_device() if device.index is None else device.index
        index = int(device)
        if index < 0:
            raise ValueError(f"device must be a non-negative index, got {index}")
        return index

    def _wrap(self, lease: Any) -> Lease:
        if self._impl.has_reports:
            self._warn_reports()
        if not self._cuda:
            return Lease(lease, self, None)
        index = lease.device
        device = self._torch_devices.get(index)
        if device is None:
            device = self._torch_devices[index] = torch.device("cuda", index)
        return Lease(lease, self, device)

    def _stream(self, ptr: int, device: torch.device) -> torch.cuda.Stream:
        """The torch stream of a pool stream (made once per stream)."""
        stream = self._streams.get(ptr)
        if stream is None:
            stream = self._streams[ptr] = torch.cuda.ExternalStream(ptr, device=device)
        return stream

    def _warn_reports(self) -> None:
        for report in self._impl.take_reports():
            warnings.warn(f"octopus.StreamScheduler: {report}", RuntimeWarning, stacklevel=3)

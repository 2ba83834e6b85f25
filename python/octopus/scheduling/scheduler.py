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
from typing import Any, Callable, Iterable, Iterator, Sequence, Tuple, cast

import torch

from .. import _library
from ..ragged import RaggedBatch
from .arguments import (DEFAULT, parse_deadline, parse_priority, parse_shape, parse_timeout,
                        whole_number)
from .executor import LeaseExecutor
from .slicing import SliceSizer, count_slices, item_ranges
from .streams import record_stream

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
    before anything the next lease of the same stream queues.
    """

    __slots__ = ("_lease", "_scheduler", "stream", "device")

    def __init__(self, lease: Any, scheduler: Any, stream: torch.cuda.Stream | None, device: torch.device | None):
        self._lease = lease
        self._scheduler = scheduler
        self.stream = stream
        self.device = device

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

    def checkpoint(self, units: float = 0.0) -> float:
        """Call between slices of best-effort work, before launching the next slice.

        A best-effort holder blocks here (GIL released) until at most
        ``best_effort_in_flight - 1`` of its earlier slices are unfinished on the device
        (events recorded at each checkpoint), then while latency-critical work is held or
        waiting on its device (``throttle``), at most ``best_effort_max_pause`` seconds at a
        time. ``units`` is the size of the coming slice, for the kind's measured device
        time per unit. Returns the seconds it was paused. Other classes return 0 at once.
        A best-effort holder that never calls it is never paused.
        """
        return cast(float, self._lease.checkpoint(float(units)))

    def slices(self, total: int, size: int | None = None, *, budget: float | None = None) -> Iterator[slice]:
        """``slice(start, stop)`` objects covering ``range(total)``, with a :meth:`checkpoint`
        before each: ``for rows in lease.slices(8192, 512): torch.mm(a[rows], b, out=c[rows])``.

        Each slice has ``size`` units, or as many as the kind's measured device time per unit
        fits in ``budget`` seconds (re-read before every slice; while nothing is measured,
        1/64 of the work), or all of them where neither is given.
        """
        total = whole_number(total, "total")
        sizer = SliceSizer(size, budget, lambda: self._scheduler.seconds_per_unit(self.kind), total)
        for part in count_slices(total, sizer):
            self._lease.checkpoint(float(part.stop - part.start))
            yield part

    def item_slices(self, batch: RaggedBatch, max_elements: int | None = None, *,
                    budget: float | None = None) -> Iterator[Tuple[slice, RaggedBatch]]:
        """``(items, part)`` pairs covering ``batch`` in order, with a :meth:`checkpoint`
        before each: ``items`` a ``slice`` of item indices and ``part`` those items as a
        batch whose values are a view of ``batch``'s (:meth:`RaggedBatch.narrow_items`).

        Each part holds whole items of at most ``max_elements`` elements in all (an item
        larger than that is a part of its own), or as many elements as the kind's measured
        device time per element fits in ``budget`` seconds, or the whole batch.
        """
        if not isinstance(batch, RaggedBatch):
            raise TypeError(f"batch must be a RaggedBatch, got {type(batch).__name__}")
        sizer = SliceSizer(max_elements, budget, lambda: self._scheduler.seconds_per_unit(self.kind), batch.numel())
        for start, stop, elements in item_ranges(batch, sizer):
            self._lease.checkpoint(float(elements))
            yield slice(start, stop), batch.narrow_items(start, stop)

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
        max_occupancy: the sum of the held leases' estimated occupancy allowed per device
            (1.0 = the whole device). A lease is always granted on an idle device.
            Best-effort leases are admitted within everything in use; the others as if
            best-effort leases were not there (those yield at checkpoints instead).
        default_occupancy: the estimate for kinds nobody registered (0 counts only leases).
        memory_reserve: fraction of each device's memory that must stay free (0: no check).
            Free memory is sampled with cudaMemGetInfo, at most every ``memory_poll_interval`` s.
        timeout: default acquire timeout in seconds; None waits for ever.
        devices: device indices to schedule on (default: all visible devices).
        record_timeline: keep an acquire/release timeline for :meth:`dump_trace`.
        backend: ``"cuda"``, or ``"simulated"`` (a CPU simulation with ``simulated_devices``
            devices and no real streams: for testing scheduling logic without a GPU).
        use_nvml: read GPU utilization from NVML (loaded at run time where libnvidia-ml
            exists): it breaks ties between equally loaded devices and drives
            ``target_utilization``.
        max_best_effort_leases: best-effort leases held at once on one device (default: one
            fewer than the lease limit, at least 1, so best-effort work never takes the last).
        throttle: when best-effort holders pause at :meth:`Lease.checkpoint`: ``"held"``
            (while a latency-critical lease is held or waiting on the device), ``"waiting"``
            (only while one waits), ``"off"``.
        best_effort_in_flight: at most this many of a best-effort holder's slices are queued
            or running on the device at once (0: no bound).
        best_effort_max_pause: the longest one pause lasts before the holder runs one more
            slice anyway, in seconds (None: no limit).
        reserved_sms: SMs of each device kept free of best-effort work: best-effort streams
            are made on a green context of the other SMs (0: no partition). Raises
            RuntimeError naming the reason where the driver cannot (CUDA 12.5+ needed).
        infeasible_deadline: ``"reject"`` (raise :class:`DeadlineMissed` at once) or
            ``"promote"`` (make it latency-critical) for a request whose deadline cannot be
            met by the estimate from its kind's recent hold times.
        target_utilization: adapt each device's lease limit (between ``min_leases_per_device``
            and ``max_leases_per_device``) to keep its NVML utilization near this fraction,
            sampled every ``utilization_interval`` s. Without NVML the limit stays fixed.

    Kinds ``"octopus.affine"`` (and octopus's other kernels) are registered with an
    occupancy estimate from ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``; register your
    own with :meth:`register_kind` or :meth:`register_kernel`.
    """

    def __init__(self, max_leases_per_device: int = 4, *, max_occupancy: float = 1.0, default_occupancy: float = 0.0,
                 memory_reserve: float = 0.0, memory_poll_interval: float = 0.002, timeout: float | None = None,
                 devices: Sequence[int] | None = None, record_timeline: bool = False,
                 timeline_capacity: int = 1 << 20, backend: str = "cuda", simulated_devices: int = 1,
                 use_nvml: bool = True, max_best_effort_leases: int | None = None, throttle: str = "held",
                 best_effort_in_flight: int = 2, best_effort_max_pause: float | None = 0.25, reserved_sms: int = 0,
                 infeasible_deadline: str = "reject", target_utilization: float | None = None,
                 min_leases_per_device: int = 1, utilization_interval: float = 0.1):
        if backend == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("octopus.StreamScheduler: no CUDA device is available to this torch; "
                               "use backend='simulated' to run the scheduler without a GPU")
        default_timeout = parse_timeout(timeout)
        max_pause = -1.0 if best_effort_max_pause is None else float(best_effort_max_pause)
        if max_pause < 0 and best_effort_max_pause is not None:
            raise ValueError(f"best_effort_max_pause must be a non-negative number of seconds or None, "
                             f"got {best_effort_max_pause}")
        self._impl = _C.StreamScheduler(
            max_leases_per_device=int(max_leases_per_device), max_occupancy=float(max_occupancy),
            default_occupancy=float(default_occupancy), memory_reserve=float(memory_reserve),
            memory_poll_interval=float(memory_poll_interval), timeout=default_timeout,
            devices=[int(d) for d in devices] if devices is not None else [], record_timeline=bool(record_timeline),
            timeline_capacity=int(timeline_capacity), backend=backend, simulated_devices=int(simulated_devices),
            use_nvml=bool(use_nvml),
            max_best_effort_leases=-1 if max_best_effort_leases is None else int(max_best_effort_leases),
            throttle=str(throttle), best_effort_in_flight=int(best_effort_in_flight), best_effort_max_pause=max_pause,
            reserved_sms=int(reserved_sms), infeasible_deadline=str(infeasible_deadline),
            target_utilization=None if target_utilization is None else float(target_utilization),
            min_leases_per_device=int(min_leases_per_device), utilization_interval=float(utilization_interval))
        self._cuda = backend == "cuda"
        self._streams: dict[int, tuple[torch.cuda.Stream, torch.device]] = {}  # by stream pointer
        self._executor = LeaseExecutor(self)

    # -- leases -------------------------------------------------------------------------

    def acquire(self, kind: str = "default", shape: Sequence[int] | None = None, *, priority: int | str = "normal",
                timeout: float | None = DEFAULT, device: int | torch.device | None = None, bytes: int = 0,
                deadline: float | None = None, best_effort: bool = False) -> Lease:
        """Leases a stream, waiting (GIL released) while the device is at capacity.

        ``shape`` sizes the work for kinds registered with a kernel profile; ``priority``
        is ``"high"`` (latency-critical: a high-priority stream, and best-effort holders on
        the device pause at their checkpoints), ``"normal"``, ``"low"`` (best-effort, as is
        ``best_effort=True``) or an int (> 0 high, < 0 best-effort, higher first);
        ``timeout`` in seconds (None: wait for ever; default: the scheduler's); ``device``
        None picks the least-loaded device; ``bytes`` is memory the work will allocate, held
        against the free-memory reserve; ``deadline`` (seconds from now) orders waiters of
        one priority earliest-deadline-first. Raises :class:`LeaseTimeout` naming the limit
        that was hit, :class:`DeadlineMissed` where the deadline cannot be met.
        """
        lease = self._impl.acquire(kind, parse_shape(shape), parse_priority(priority), parse_timeout(timeout),
                                   self._device_index(device), bytes, parse_deadline(deadline), bool(best_effort))
        return self._wrap(lease)

    def try_acquire(self, kind: str = "default", shape: Sequence[int] | None = None, *,
                    priority: int | str = "normal", device: int | torch.device | None = None,
                    bytes: int = 0, deadline: float | None = None, best_effort: bool = False) -> Lease | None:
        """A lease if one can be granted now (nobody served before it waiting for the
        device), else None. Never blocks; an infeasible deadline raises as in :meth:`acquire`."""
        lease = self._impl.try_acquire(kind, parse_shape(shape), parse_priority(priority), self._device_index(device), bytes,
                                       parse_deadline(deadline), bool(best_effort))
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
            lease.stream.wait_stream(consumer)
            if isinstance(work, RaggedBatch):
                record_stream((work.values, work.offsets, work.sizes), lease.stream)
            with torch.cuda.device(lease.device), torch.cuda.stream(lease.stream):
                results = [fn(*part) for part in parts]
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
        """Device seconds per unit (row, element) of ``kind``'s sliced work: a moving average
        measured at best-effort checkpoints (where ``best_effort_in_flight`` > 0), or what
        :meth:`set_seconds_per_unit` set; None before either. Slices with a ``budget`` use it."""
        return cast("float | None", self._impl.seconds_per_unit(kind))

    def set_seconds_per_unit(self, kind: str, seconds: float) -> None:
        """Sets ``kind``'s device seconds per unit (from an earlier measurement)."""
        self._impl.set_seconds_per_unit(kind, float(seconds))

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
        free-memory sample, the partition's SMs and NVML utilization."""
        return cast("dict[str, Any]", self._impl.stats())

    def dump_trace(self, path: str) -> None:
        """Writes the recorded timeline (``record_timeline=True``) as Chrome-trace JSON,
        for chrome://tracing or https://ui.perfetto.dev: each lease on its stream's row
        (class, priority, deadline), waits, throttled pauses, timeouts and deadline misses;
        the per-class statistics under ``otherData``."""
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
        """Waits for submitted work and stops the thread pool."""
        self._executor.close()

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
        if not self._cuda:
            return Lease(lease, self._impl, None, None)
        ptr = lease.stream_ptr
        known = self._streams.get(ptr)
        if known is None:
            device = torch.device("cuda", lease.device)
            known = self._streams[ptr] = (torch.cuda.ExternalStream(ptr, device=device), device)
        return Lease(lease, self._impl, *known)

"""The stream-lease scheduler: callers share GPUs through leased CUDA streams.

``StreamScheduler`` wraps the C++ ``octopus::scheduler::StreamScheduler``: a pool of
streams per device (normal and high priority, created once), leases granted while the
device has capacity (lease count, estimated occupancy, free-memory reserve), waiting
callers served by priority and then first come first served, with the GIL released while
they wait. ``map`` and ``submit`` run Python callables on leased streams from a thread
pool sized to the capacity, ordering the streams and keeping tensors alive correctly.
"""

from __future__ import annotations

import concurrent.futures
import math
import operator
import threading
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.utils._pytree as pytree

from . import _library

_C = _library._C

LeaseTimeout = _C.LeaseTimeout
LeaseTimeout.__doc__ = "An acquire timed out; the message names the limit that kept it waiting."
LeaseTimeout.__module__ = __name__

_PRIORITIES = {"low": -1, "normal": 0, "high": 1}
_DEFAULT = object()


def _priority(value: int | str) -> int:
    if value.__class__ is str and value in _PRIORITIES:
        return _PRIORITIES[value]
    if isinstance(value, bool):
        raise TypeError("priority must be 'low', 'normal', 'high' or an int, got a bool")
    if isinstance(value, int):
        return value
    raise ValueError(f"priority must be 'low', 'normal', 'high' or an int, got {value!r}")


def _shape(shape: Sequence[int] | torch.Size | None) -> list[int]:
    if shape is None:
        return []
    if isinstance(shape, int):
        return [shape]
    try:
        if isinstance(shape, (str, bytes)):
            raise TypeError
        return [operator.index(s) for s in shape]
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints or None, got {shape!r}") from None


def _timeout(timeout: float | None) -> float | None:
    if timeout is _DEFAULT:
        return None
    if timeout is None:
        return -1.0
    timeout = float(timeout)
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be a non-negative number of seconds or None (wait for ever), got {timeout}")
    return timeout


class ReleaseEvent:
    """The CUDA event a lease recorded on its stream when it was returned."""

    __slots__ = ("_event", "_device")

    def __init__(self, event, device: torch.device | None):
        self._event = event
        self._device = device

    def done(self) -> bool:
        """True once all work the lease queued on its stream has finished."""
        return self._event.done()

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

    __slots__ = ("_lease", "stream", "device")

    def __init__(self, lease, stream: torch.cuda.Stream | None, device: torch.device | None):
        self._lease = lease
        self.stream = stream
        self.device = device

    device_index = property(lambda self: self._lease.device, doc="The leased stream's device index.")
    kind = property(lambda self: self._lease.kind)
    priority = property(lambda self: self._lease.priority)
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

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self._lease.release()

    def __repr__(self) -> str:
        state = "active" if self.active else "released"
        return (f"Lease(kind={self.kind!r}, device={self.device_index}, stream_slot={self._lease.stream_slot}, "
                f"priority={self.priority}, {state})")


class StreamScheduler:
    """Leases CUDA streams to many callers sharing one or more GPUs.

    Args:
        max_leases_per_device: leases held at once on one device (the pool holds this many
            normal- and this many high-priority streams per device).
        max_occupancy: the sum of the held leases' estimated occupancy allowed per device
            (1.0 = the whole device). A lease is always granted on an idle device.
        default_occupancy: the estimate for kinds nobody registered (0 counts only leases).
        memory_reserve: fraction of each device's memory that must stay free (0: no check).
            Free memory is sampled with cudaMemGetInfo, at most every ``memory_poll_interval`` s.
        timeout: default acquire timeout in seconds; None waits for ever.
        devices: device indices to schedule on (default: all visible devices).
        record_timeline: keep an acquire/release timeline for :meth:`dump_trace`.
        backend: ``"cuda"``, or ``"simulated"`` (a CPU simulation with ``simulated_devices``
            devices and no real streams: for testing scheduling logic without a GPU).
        use_nvml: break ties between equally loaded devices by NVML's utilization, where
            libnvidia-ml can be loaded.

    Kinds ``"octopus.affine"`` (and octopus's other kernels) are registered with an
    occupancy estimate from ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``; register your
    own with :meth:`register_kind` or :meth:`register_kernel`.
    """

    def __init__(self, max_leases_per_device: int = 4, *, max_occupancy: float = 1.0, default_occupancy: float = 0.0,
                 memory_reserve: float = 0.0, memory_poll_interval: float = 0.002, timeout: float | None = None,
                 devices: Sequence[int] | None = None, record_timeline: bool = False,
                 timeline_capacity: int = 1 << 20, backend: str = "cuda", simulated_devices: int = 1,
                 use_nvml: bool = True):
        if backend == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("octopus.StreamScheduler: no CUDA device is available to this torch; "
                               "use backend='simulated' to run the scheduler without a GPU")
        default_timeout = _timeout(timeout)
        self._impl = _C.StreamScheduler(
            max_leases_per_device=int(max_leases_per_device), max_occupancy=float(max_occupancy),
            default_occupancy=float(default_occupancy), memory_reserve=float(memory_reserve),
            memory_poll_interval=float(memory_poll_interval), timeout=default_timeout,
            devices=[int(d) for d in devices] if devices is not None else [], record_timeline=bool(record_timeline),
            timeline_capacity=int(timeline_capacity), backend=backend, simulated_devices=int(simulated_devices),
            use_nvml=bool(use_nvml))
        self._cuda = backend == "cuda"
        self._streams: dict[int, tuple[torch.cuda.Stream, torch.device]] = {}  # by stream pointer
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # -- leases -------------------------------------------------------------------------

    def acquire(self, kind: str = "default", shape: Sequence[int] | None = None, *, priority: int | str = "normal",
                timeout: float | None = _DEFAULT, device: int | torch.device | None = None, bytes: int = 0) -> Lease:
        """Leases a stream, waiting (GIL released) while the device is at capacity.

        ``shape`` sizes the work for kinds registered with a kernel profile; ``priority``
        is ``"low"``, ``"normal"``, ``"high"`` (high leases get high-priority streams) or
        an int (higher first); ``timeout`` in seconds (None: wait for ever; default: the
        scheduler's); ``device`` None picks the least-loaded device; ``bytes`` is memory
        the work will allocate, held against the free-memory reserve. Raises
        :class:`LeaseTimeout` naming the limit that was hit.
        """
        lease = self._impl.acquire(kind, _shape(shape), _priority(priority), _timeout(timeout),
                                   self._device_index(device), bytes)
        return self._wrap(lease)

    def try_acquire(self, kind: str = "default", shape: Sequence[int] | None = None, *,
                    priority: int | str = "normal", device: int | torch.device | None = None,
                    bytes: int = 0) -> Lease | None:
        """A lease if one can be granted now (nobody earlier of the same or a higher
        priority waiting for the device), else None. Never blocks."""
        lease = self._impl.try_acquire(kind, _shape(shape), _priority(priority), self._device_index(device), bytes)
        return None if lease is None else self._wrap(lease)

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
        return self._impl.estimate_occupancy(kind, _shape(shape), self.devices[0] if index < 0 else index)

    # -- observability ------------------------------------------------------------------

    @property
    def devices(self) -> list[int]:
        return list(self._impl.devices)

    @property
    def backend(self) -> str:
        return self._impl.backend

    @property
    def capacity(self) -> int:
        """Leases that can be held at once over all devices."""
        return self._impl.max_leases_per_device * len(self._impl.devices)

    def stats(self) -> dict[str, Any]:
        """Counters: granted, released, active, waited, timeouts, rejected (try_acquire),
        waiting (now), total_wait_s, max_wait_s, and per device active/peak leases,
        occupancy in use, granted, the last free-memory sample and NVML utilization."""
        return self._impl.stats()

    def dump_trace(self, path: str) -> None:
        """Writes the recorded timeline (``record_timeline=True``) as Chrome-trace JSON,
        for chrome://tracing or https://ui.perfetto.dev."""
        self._impl.write_trace(str(path))

    # -- executor -----------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, acquire_options: dict | None = None,
               **kwargs: Any) -> concurrent.futures.Future:
        """Runs ``fn(*args, **kwargs)`` on a leased stream from the scheduler's thread pool.

        The lease's stream first waits for the work already queued on the caller's current
        stream; the result is safe to use on that stream once the future is done (the
        caller's stream waits for the lease's work, and tensors crossing streams are
        recorded with ``record_stream``). ``acquire_options`` go to :meth:`acquire`.
        """
        task = self._task(dict(acquire_options or {}))
        return self._executor().submit(task, fn, args, kwargs, None)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], *, kind: str = "map",
            shape: Sequence[int] | None = None, priority: int | str = "normal", timeout: float | None = _DEFAULT,
            device: int | torch.device | None = None) -> list[Any]:
        """``[fn(item) for item in items]``, each call on a leased stream, results in order.

        Stream ordering and tensor lifetimes are handled as in :meth:`submit`. If any call
        raises, the items not yet started are skipped, every lease is returned, and the
        exception of the earliest failing item is raised. ``fn`` must not call ``map`` or
        ``submit`` of the same scheduler (it would wait on its own pool).
        """
        items = list(items)
        if not items:
            return []
        cancelled = threading.Event()
        task = self._task(dict(kind=kind, shape=shape, priority=priority, timeout=timeout, device=device))
        pool = self._executor()
        futures = [pool.submit(task, fn, (item,), {}, cancelled) for item in items]
        results, failure = [], None
        for future in futures:
            try:
                results.append(future.result())
            except _Skipped:
                continue
            except BaseException as error:  # noqa: BLE001 (re-raised once every lease is back)
                cancelled.set()
                if failure is None:
                    failure = error
        if failure is not None:
            raise failure
        return results

    def close(self) -> None:
        """Waits for submitted work and stops the thread pool."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> "StreamScheduler":
        return self

    def __exit__(self, *exc) -> None:
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

    def _wrap(self, lease) -> Lease:
        if not self._cuda:
            return Lease(lease, None, None)
        ptr = lease.stream_ptr
        known = self._streams.get(ptr)
        if known is None:
            device = torch.device("cuda", lease.device)
            known = self._streams[ptr] = (torch.cuda.ExternalStream(ptr, device=device), device)
        return Lease(lease, *known)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.capacity,
                                                                   thread_name_prefix="octopus-lease")
            return self._pool

    def _task(self, options: dict) -> Callable:
        """A pool task bound to the caller's current streams (captured now, on the caller's
        thread): the lease waits for their queued work, and they wait for the lease's."""
        consumers: dict[int, torch.cuda.Stream] = {}
        ready: dict[int, torch.cuda.Event] = {}
        if self._cuda:
            for d in self.devices:
                consumers[d] = torch.cuda.current_stream(d)
                ready[d] = torch.cuda.Event()
                ready[d].record(consumers[d])

        def run(fn, args, kwargs, cancelled):
            if cancelled is not None and cancelled.is_set():
                raise _Skipped
            with self.acquire(**options) as lease:
                if lease.stream is None:
                    return fn(*args, **kwargs)
                consumer = consumers[lease.device_index]
                lease.stream.wait_event(ready[lease.device_index])
                _record_stream((args, kwargs), lease.stream)
                with torch.cuda.device(lease.device), torch.cuda.stream(lease.stream):
                    result = fn(*args, **kwargs)
                _record_stream(result, consumer)
            lease.release_event.wait(consumer)
            return result

        return run


class _Skipped(Exception):
    """A map item that was not started because an earlier item failed."""


def _record_stream(tree: Any, stream: torch.cuda.Stream) -> None:
    """Tells the caching allocator that the CUDA tensors in ``tree`` are used on ``stream``."""
    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and leaf.is_cuda:
            leaf.record_stream(stream)

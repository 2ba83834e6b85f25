"""``Batcher``: single requests grouped into one call under one lease.

Requests submitted one at a time (each with an optional priority and deadline) wait until
``max_batch`` of them (or ``max_elements`` elements) are pending, or until the first of
them is due: a request without a deadline after waiting ``max_delay``, one with a deadline
once its slack (deadline, less the batches' typical run time, less now) falls under
``max_delay``. Then the pending requests, in serving order (priority, earliest deadline,
arrival), run as one call of ``fn`` under one lease of the scheduler, placed on the
least-loaded device like :meth:`StreamScheduler.acquire` places any lease. While every
worker is busy, requests keep gathering, so calls grow with the load. Tensor
requests are packed into a :class:`RaggedBatch` (never padded); each request's future gets
its own slice of the result.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import torch

from .._messages import describe
from ..ragged import RaggedBatch
from .arguments import parse_deadline, parse_priority, whole_number
from .scheduler import ReleaseEvent, StreamScheduler
from .streams import current_streams, record_stream

# Weight of the newest batch in the typical run time.
_RUN_TIME_WEIGHT = 0.25


@dataclass(order=True)
class _Request:
    sort_key: Tuple[int, float, int]  # (-priority, absolute deadline or inf, arrival number)
    item: Any = field(compare=False)
    priority: int = field(compare=False)
    deadline: Optional[float] = field(compare=False)  # time.monotonic() seconds
    arrival: float = field(compare=False)
    elements: int = field(compare=False)
    future: concurrent.futures.Future[Any] = field(compare=False)
    # CUDA: the submitter's current streams (its result is used there) and, for a CUDA
    # tensor request, an event after the work queued to produce it.
    consumers: Dict[int, torch.cuda.Stream] = field(compare=False, default_factory=dict)
    ready: Optional[torch.cuda.Event] = field(compare=False, default=None)


class Batcher:
    """Groups single requests into batched calls of ``fn`` on leased streams.

    Args:
        fn: called with the batch: a :class:`RaggedBatch` of the requests where every
            request is a tensor with the same number of dimensions (packed on the lease's
            device, in the lease's stream), else the list of requests. It returns one result
            per request: a RaggedBatch (each request gets its item, a view), a tensor or a
            sequence indexed by request.
        max_batch: requests per call at most.
        max_delay: seconds a request without a deadline waits for company; requests with a
            deadline are held until their slack falls under it.
        scheduler: the :class:`StreamScheduler` whose leases the calls run under (default:
            a new one, simulated where there is no GPU).
        kind: the lease kind of the calls.
        max_elements: elements per call at most (tensor requests; a larger request runs alone).
        workers: calls in flight at once (default: the scheduler's capacity).
        timeout: acquire timeout of each call (None: wait for ever).

    A call's work waits for what the submitters' current streams had queued when they
    submitted (a CUDA tensor request may still be in the making), and its futures are
    resolved once its work on the device has finished; the results are safe to use, and to
    free, on the submitters' streams. If the call
    (or its acquire, e.g. a :class:`DeadlineMissed`) raises, exactly its requests' futures
    get the exception.
    """

    def __init__(self, fn: Callable[[Any], Any], *, max_batch: int = 32, max_delay: float = 0.005,
                 scheduler: Optional[StreamScheduler] = None, kind: str = "batch",
                 max_elements: Optional[int] = None, workers: Optional[int] = None,
                 timeout: Optional[float] = None):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        max_batch = whole_number(max_batch, "max_batch", 1)
        max_delay = float(max_delay)
        if not max_delay >= 0 or math.isinf(max_delay):
            raise ValueError(f"max_delay must be a non-negative number of seconds, got {max_delay}")
        if max_elements is not None:
            max_elements = whole_number(max_elements, "max_elements", 1)
        if scheduler is None:
            scheduler = StreamScheduler() if torch.cuda.is_available() else StreamScheduler(backend="simulated")
        if not isinstance(scheduler, StreamScheduler):
            raise TypeError(f"scheduler must be an octopus.StreamScheduler, got {type(scheduler).__name__}")
        workers = scheduler.capacity if workers is None else whole_number(workers, "workers", 1)
        self.fn = fn
        self.max_batch = max_batch
        self.max_delay = max_delay
        self.max_elements = max_elements
        self.scheduler = scheduler
        self.kind = kind
        self.timeout = timeout
        self._cuda = scheduler.backend == "cuda"
        self._pending: List[_Request] = []
        self._arrivals = itertools.count()
        self._run_time: Optional[float] = None  # typical seconds per call
        self._closed = False
        self._free_workers = workers  # a call is formed only when a worker can run it
        self._condition = threading.Condition()
        self._calls = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="octopus-batch")
        self._counts = {"requests": 0, "batches": 0, "failed_batches": 0}
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="octopus-batcher", daemon=True)
        self._dispatcher.start()

    def submit(self, request: Any, *, priority: int | str = "normal",
               deadline: Optional[float] = None) -> concurrent.futures.Future[Any]:
        """Queues one request; returns the future of its result. ``priority`` as in
        :meth:`StreamScheduler.acquire`; ``deadline`` in seconds from now."""
        value = parse_priority(priority)
        relative = parse_deadline(deadline)
        now = time.monotonic()
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        absolute = None if relative is None else now + relative
        elements = request.numel() if isinstance(request, torch.Tensor) else 1
        entry = _Request((-value, absolute if absolute is not None else math.inf, next(self._arrivals)), request, value,
                         absolute, now, elements, future)
        if self._cuda:
            entry.consumers = current_streams(self.scheduler.devices)
            if isinstance(request, torch.Tensor) and request.is_cuda:
                entry.ready = torch.cuda.Event()
                entry.ready.record(torch.cuda.current_stream(request.device))
        with self._condition:
            if self._closed:
                raise RuntimeError("this Batcher is closed")
            self._pending.append(entry)
            self._counts["requests"] += 1
            self._condition.notify()
        return future

    def stats(self) -> Dict[str, Any]:
        """Requests submitted, calls made (and failed), and the typical seconds per call."""
        with self._condition:
            return dict(self._counts, pending=len(self._pending), typical_call_s=self._run_time)

    def close(self, wait: bool = True) -> None:
        """Runs what is pending at once, then stops; with ``wait``, returns once every call is done."""
        with self._condition:
            self._closed = True
            self._condition.notify()
        self._dispatcher.join()
        self._calls.shutdown(wait=wait)

    def __enter__(self) -> "Batcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------

    def _due(self, r: _Request) -> float:
        """When ``r`` must be dispatched at the latest."""
        if r.deadline is None:
            return r.arrival + self.max_delay
        return r.deadline - (self._run_time or 0.0) - self.max_delay

    def _take_batch(self) -> List[_Request]:
        """The requests of the next call, in serving order (the lock is held)."""
        self._pending.sort()
        batch: List[_Request] = []
        elements = 0
        for r in self._pending:
            if len(batch) == self.max_batch:
                break
            if batch and self.max_elements is not None and elements + r.elements > self.max_elements:
                break
            batch.append(r)
            elements += r.elements
        del self._pending[:len(batch)]
        return batch

    def _ready(self, now: float) -> Optional[float]:
        """0 if a call should start now, else seconds until one is due (the lock is held)."""
        if len(self._pending) >= self.max_batch or self._closed:
            return 0.0
        if self.max_elements is not None and sum(r.elements for r in self._pending) >= self.max_elements:
            return 0.0
        return max(0.0, min(self._due(r) for r in self._pending) - now)

    def _dispatch_loop(self) -> None:
        while True:
            with self._condition:
                while True:
                    if not self._pending:
                        if self._closed:
                            return
                        self._condition.wait()
                        continue
                    # While every worker is busy, requests keep gathering (in serving order).
                    wait = self._ready(time.monotonic()) if self._free_workers > 0 else None
                    if wait is not None and wait <= 0.0:
                        break
                    self._condition.wait(wait)
                batch = self._take_batch()
                self._free_workers -= 1
            self._calls.submit(self._run, batch)

    def _run(self, batch: List[_Request]) -> None:
        try:
            self._call(batch)
        finally:
            with self._condition:
                self._free_workers += 1
                self._condition.notify()

    def _call(self, batch: List[_Request]) -> None:
        start = time.monotonic()
        deadlines = [r.deadline for r in batch if r.deadline is not None]
        try:
            lease = self.scheduler.acquire(self.kind, priority=max(r.priority for r in batch), timeout=self.timeout,
                                           deadline=min(deadlines) - start if deadlines else None)
            items = [r.item for r in batch]
            with lease:
                if lease.stream is None:
                    output = self.fn(_pack(items, None))
                else:
                    with torch.cuda.device(lease.device), torch.cuda.stream(lease.stream):
                        for r in batch:
                            if r.ready is not None:
                                lease.stream.wait_event(r.ready)
                        record_stream(items, lease.stream)  # read there
                        output = self.fn(_pack(items, lease.device))
            if lease.stream is not None:
                cast(ReleaseEvent, lease.release_event).synchronize()  # set when the lease was returned
            results = _split(output, len(batch))
            if lease.stream is not None:
                for r, result in zip(batch, results):  # used on the submitter's stream
                    record_stream(result, r.consumers[lease.device_index])
        except BaseException as error:  # noqa: BLE001 (handed to exactly this call's futures)
            with self._condition:
                self._counts["failed_batches"] += 1
            for r in batch:
                r.future.set_exception(error)
            return
        elapsed = time.monotonic() - start
        with self._condition:
            self._counts["batches"] += 1
            self._run_time = elapsed if self._run_time is None else (
                (1 - _RUN_TIME_WEIGHT) * self._run_time + _RUN_TIME_WEIGHT * elapsed)
        for r, result in zip(batch, results):
            r.future.set_result(result)


def _pack(items: List[Any], device: Optional[torch.device]) -> Any:
    """Tensor requests of one number of dimensions as a RaggedBatch; anything else as a list."""
    if items and all(isinstance(x, torch.Tensor) and x.dim() >= 1 for x in items) and \
            len({x.dim() for x in items}) == 1 and len({x.dtype for x in items}) == 1:
        return RaggedBatch.from_tensors(items, device=device if device is not None else items[0].device)
    return list(items)


def _split(output: Any, n: int) -> List[Any]:
    """One result per request from what ``fn`` returned."""
    if isinstance(output, RaggedBatch):
        parts = output.unbind()
    elif isinstance(output, torch.Tensor) and output.dim() >= 1:
        parts = list(output.unbind(0))
    elif isinstance(output, (list, tuple)):
        parts = list(output)
    else:
        raise TypeError(f"fn must return a RaggedBatch, a tensor (one row per request) or a sequence with one "
                        f"result per request, got {describe(output)}")
    if len(parts) != n:
        raise ValueError(f"fn returned {len(parts)} results for a batch of {n} requests")
    return parts

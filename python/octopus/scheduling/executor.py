"""``StreamScheduler.submit`` and ``map``: Python callables run on leased streams from a thread
pool sized to the scheduler's capacity, ordered after the caller's current stream and before
its later work, with tensors crossing streams recorded for the caching allocator."""

from __future__ import annotations

import concurrent.futures
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, cast

import torch

from .streams import current_streams, record_stream

if TYPE_CHECKING:
    from .scheduler import ReleaseEvent, StreamScheduler


class _Skipped(Exception):
    """A map item that was not started because an earlier item failed."""


class LeaseExecutor:
    """The thread pool of one scheduler, made on first use."""

    def __init__(self, scheduler: StreamScheduler):
        # Weak: the scheduler owns its executor, and a cycle would keep a scheduler dropped
        # without close() (its control thread, its GIL switch interval) until the cyclic GC.
        self._scheduler_ref = weakref.ref(scheduler)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               options: dict[str, Any]) -> concurrent.futures.Future[Any]:
        return self._executor().submit(self._task(options), fn, args, kwargs, None)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], options: dict[str, Any]) -> list[Any]:
        items = list(items)
        if not items:
            return []
        cancelled = threading.Event()
        task = self._task(options)
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
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _scheduler(self) -> StreamScheduler:
        scheduler = self._scheduler_ref()
        assert scheduler is not None, "the executor is reached through its scheduler"
        return scheduler

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=self._scheduler().capacity,
                                                                   thread_name_prefix="octopus-lease")
            return self._pool

    def _task(self, options: dict[str, Any]) -> Callable[..., Any]:
        """A pool task bound to the caller's current streams (captured now, on the caller's
        thread): the lease waits for their queued work, and they wait for the lease's."""
        scheduler = self._scheduler()
        consumers = current_streams(scheduler.devices) if scheduler.backend == "cuda" else {}
        ready: dict[int, torch.cuda.Event] = {}
        for d, stream in consumers.items():
            ready[d] = torch.cuda.Event()
            ready[d].record(stream)

        def run(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                cancelled: threading.Event | None) -> Any:
            if cancelled is not None and cancelled.is_set():
                raise _Skipped
            with scheduler.acquire(**options) as lease:
                if lease.stream is None:
                    return fn(*args, **kwargs)
                consumer = consumers[lease.device_index]
                lease.stream.wait_event(ready[lease.device_index])
                record_stream((args, kwargs), lease.stream)
                with torch.cuda.device(lease.device), torch.cuda.stream(lease.stream):
                    result = fn(*args, **kwargs)
                record_stream(result, consumer)
            cast("ReleaseEvent", lease.release_event).wait(consumer)  # set when the lease was returned
            return result

        return run

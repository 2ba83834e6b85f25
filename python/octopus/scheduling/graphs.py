"""Replaying a captured CUDA graph from a latency-critical thread without letting go of the GIL.

``torch.cuda.CUDAGraph.replay`` lets go of the GIL for its launch. In a process where other
threads run Python (another job's eager ops, best-effort holders), a thread that replays a
graph then waits for whichever of them took the GIL to let go of it again: on an H200, a batch-1
conv net's graph beside an eager ``octopus.normalize`` job in another thread took 0.32-0.33 ms
at the median from its launch to the record of an event after it when that job started
meanwhile, 0.07 ms through :func:`replay_graph` with the events recorded with the GIL held too
(benchmarks/JOURNAL.md, 2026-12-01, thirtieth session). :func:`replay_graph` is the same replay,
kept on the calling thread.
"""

from __future__ import annotations

import torch


def replay_graph(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream | None = None) -> None:
    """Replays ``graph`` on ``stream`` (default: the current stream) as ``graph.replay()``
    does — the same launch, random-number offsets advanced as torch advances them — without
    letting go of the GIL, so that no other thread's Python runs between the launch and the
    caller's next line. The replay holds the GIL for as long as torch's takes on the host: 20
    us at the median back to back, 96 us after a 3 ms sleep, on an H200 host (longer where the
    stream's queue is full: keep it for latency-critical work, whose queues are short).
    ``stream`` must be on the device the graph was captured on. The first call in a process
    imports the module that replays (its file reads let go of the GIL once): make it before the
    latency-critical loop, as its warm-up.

    Raises ``TypeError`` for anything but a :class:`torch.cuda.CUDAGraph` or
    :class:`torch.cuda.Stream`, and torch's own ``RuntimeError`` for a graph not captured.
    """
    if not isinstance(graph, torch.cuda.CUDAGraph):
        raise TypeError(f"replay_graph: graph must be a torch.cuda.CUDAGraph, got {type(graph).__name__}")
    if stream is None:
        stream = torch.cuda.current_stream()
    elif not isinstance(stream, torch.cuda.Stream):
        raise TypeError(f"replay_graph: stream must be a torch.cuda.Stream or None, got {type(stream).__name__}")
    # A module of its own, compiled against torch's pybind11 (CMakeLists.txt); imported here, so
    # that `import octopus` does not depend on it.
    import octopus._graph_replay as _graph_replay

    _graph_replay.replay_graph(graph, stream.cuda_stream, stream.device.index)

"""Sharing GPUs: the stream-lease scheduler (:class:`StreamScheduler`), the slicing helpers
of long best-effort work, :class:`Batcher` (single requests grouped under one lease) and the
executor behind ``submit`` and ``map``, and :func:`replay_graph` (a CUDA graph replayed
without letting go of the GIL). The public names are also ``octopus.StreamScheduler``
and so on."""

from .batcher import Batcher
from .config import SchedulerConfig
from .graphs import replay_graph
from .scheduler import DeadlineMissed, Lease, LeaseTimeout, ReleaseEvent, StreamScheduler

__all__ = ["Batcher", "DeadlineMissed", "Lease", "LeaseTimeout", "ReleaseEvent", "SchedulerConfig", "StreamScheduler",
           "replay_graph"]

"""Sharing GPUs: the stream-lease scheduler (:class:`StreamScheduler`), the slicing helpers
of long best-effort work, :class:`Batcher` (single requests grouped under one lease) and the
executor behind ``submit`` and ``map``. The public names are also ``octopus.StreamScheduler``
and so on."""

from .batcher import Batcher
from .config import SchedulerConfig
from .scheduler import DeadlineMissed, Lease, LeaseTimeout, ReleaseEvent, StreamScheduler

__all__ = ["Batcher", "DeadlineMissed", "Lease", "LeaseTimeout", "ReleaseEvent", "SchedulerConfig", "StreamScheduler"]

"""octopus: ragged batches for PyTorch — many variable-size items packed back to back and
processed by one kernel launch, each CUDA block finding its item from a small plan.

Ops live under ``torch.ops.octopus``; this package adds :class:`RaggedBatch` and Python
wrappers that pass a batch's cached plan to them, :class:`StreamScheduler`, which
leases CUDA streams to many callers sharing GPUs (latency-critical work first), and
:class:`Batcher`, which groups single requests into one call under one lease.
"""

from . import _registrations  # noqa: F401  (fake + autograd registrations)
from ._library import built_with_cuda
from .tuning import TunedChoice, autotune, kernel_tuning
from .filters import box_blur, depthwise_conv3x3, gaussian_blur, stencil3x3
from .geometry import crop_resize, resize
from .ops import affine, clamp, from_padded, plan, plan_blocks, power, threshold, to_padded
from .ragged import RaggedBatch
from .stats import ItemStats, item_stats, normalize
from .tiles import TileFilter, tile_filter
from .scheduler import DeadlineMissed, Lease, LeaseTimeout, ReleaseEvent, StreamScheduler
from .batcher import Batcher
from . import distributed  # noqa: F401  (octopus.distributed: across GPUs and hosts)
from .strategies import DEFAULT_BLOCK_ELEMS, DEFAULT_STRATEGY, STRATEGIES

__version__ = "0.1.0"

__all__ = [
    "RaggedBatch", "affine", "crop_resize", "resize", "tile_filter", "TileFilter", "stencil3x3", "box_blur", "gaussian_blur", "depthwise_conv3x3", "clamp", "threshold", "power", "item_stats", "ItemStats", "normalize", "to_padded", "from_padded", "plan", "plan_blocks", "built_with_cuda", "autotune", "TunedChoice", "kernel_tuning",
    "StreamScheduler", "Lease", "LeaseTimeout", "DeadlineMissed", "ReleaseEvent", "Batcher",
    "STRATEGIES", "DEFAULT_STRATEGY", "DEFAULT_BLOCK_ELEMS", "__version__",
]

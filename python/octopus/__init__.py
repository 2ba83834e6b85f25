"""octopus: ragged batches for PyTorch — many variable-size items packed back to back and
processed by one kernel launch, each CUDA block finding its item from a small plan.

Ops live under ``torch.ops.octopus``; this package adds :class:`RaggedBatch` and Python
wrappers that pass a batch's cached plan to them, :class:`StreamScheduler`, which
leases CUDA streams to many callers sharing GPUs (latency-critical work first), and
:class:`Batcher`, which groups single requests into one call under one lease.
"""

from ._library import built_with_cuda
from ._version import __version__
from .ragged import RaggedBatch
from .strategies import DEFAULT_BLOCK_ELEMS, DEFAULT_STRATEGY, STRATEGIES
from .tuning import TunedChoice, autotune, kernel_tuning
# One module per family of native ops, each registering its ops' fakes and autograd formulas.
from .plan import plan, plan_blocks
from .affine import affine
from .pointwise import clamp, power, threshold
from .padding import from_padded, to_padded
from .item_stats import ItemStats, item_stats, normalize
from .crop_resize import crop_resize, resize
from .stencil import box_blur, depthwise_conv3x3, gaussian_blur, stencil3x3
from .tile_stats import TileFilter, tile_filter
from .scheduling import (Batcher, DeadlineMissed, Lease, LeaseTimeout, ReleaseEvent, SchedulerConfig, StreamScheduler,
                         replay_graph)
from . import diffusion  # noqa: F401  (octopus.diffusion; registers sampler_step's fake)
from . import distributed  # noqa: F401  (octopus.distributed: across GPUs and hosts)

__all__ = [
    "RaggedBatch", "affine", "crop_resize", "resize", "tile_filter", "TileFilter", "stencil3x3", "box_blur", "gaussian_blur", "depthwise_conv3x3", "clamp", "threshold", "power", "item_stats", "ItemStats", "normalize", "to_padded", "from_padded", "plan", "plan_blocks", "built_with_cuda", "autotune", "TunedChoice", "kernel_tuning",
    "StreamScheduler", "SchedulerConfig", "Lease", "LeaseTimeout", "DeadlineMissed", "ReleaseEvent", "Batcher", "replay_graph",
    "STRATEGIES", "DEFAULT_STRATEGY", "DEFAULT_BLOCK_ELEMS", "__version__",
]

import os

import pytest
import torch

import octopus

# Under pytest-xdist (`-n N`) every worker would run CPU kernels on all the machine's cores, N
# workers oversubscribing them N-fold (on the 16-core H100 machine with -n 8, three CPU-heavy tests
# that take 52 s together alone each ran past 60 s). Share the cores out, also with the examples
# and tools the tests start as subprocesses.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_threads)
    os.environ["OMP_NUM_THREADS"] = str(_threads)

HAS_CUDA = torch.cuda.is_available() and octopus.built_with_cuda

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not HAS_CUDA, reason="needs a CUDA device and a CUDA build of octopus")])]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def random_batch(sizes, device, dtype=torch.float32, channels=None, seed=0, item_dim=None):
    """A RaggedBatch of random items; `sizes` are item shapes (`item_dim` says their number of
    dimensions where `sizes` may be empty)."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for shape in sizes:
        if dtype == torch.uint8:
            items.append(torch.randint(0, 256, shape, generator=g, dtype=torch.uint8))
        else:
            items.append(torch.randn(shape, generator=g, dtype=torch.float64).to(dtype))
    return octopus.RaggedBatch.from_tensors(items, device=device, dtype=dtype, item_dim=item_dim or (len(sizes[0]) if sizes else 1))

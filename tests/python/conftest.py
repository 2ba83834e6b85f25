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


def reference_plan_rows(offsets, block_elems):
    """The rows of a batch's block plan as plan.h defines them, built item by item in Python:
    ``(begin, item, length, run)`` per block. Small items (at most min(block_elems // 8, 256)
    elements, empty ones included) that share a window of 32 item indices form runs; every
    other item is cut at the multiples of block_elems."""
    off = [int(x) for x in offsets]
    small_max = min(block_elems // 8, 256)
    small = [off[i + 1] - off[i] <= small_max for i in range(len(off) - 1)]
    rows, i = [], 0
    while i < len(small):
        if small[i]:
            e = i + 1
            while e < len(small) and e % 32 != 0 and small[e]:
                e += 1
            if off[e] > off[i]:
                rows.append((off[i], i, off[e] - off[i], True))
            i = e
            continue
        begin = off[i]
        while begin < off[i + 1]:
            end = min(off[i + 1], (begin // block_elems + 1) * block_elems)
            rows.append((begin, i, end - begin, False))
            begin = end
        i += 1
    return rows


def dust_offsets(m, seed, max_small=64, big_every=97, big=(3000, 9000)):
    """Offsets of a batch dominated by small items (0..max_small elements, empty ones
    included) with a larger item every ~big_every items: runs, run boundaries at windows and
    large items, and blocks of one item side by side."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_small + 1, (m,), generator=g)
    lengths[torch.rand(m, generator=g) < 0.15] = 0
    bigs = torch.rand(m, generator=g) < 1.0 / big_every
    lengths[bigs] = torch.randint(big[0], big[1], (int(bigs.sum()),), generator=g)
    offsets = torch.zeros(m + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    return offsets

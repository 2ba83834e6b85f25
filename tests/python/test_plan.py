"""Block plans: CPU builder vs device builder, coverage, caching."""

import pytest
import torch

import octopus
from conftest import HAS_CUDA, random_batch


def random_offsets(m, seed, max_len=5000):
    g = torch.Generator().manual_seed(seed)
    kinds = torch.randint(0, 3, (m,), generator=g)
    lengths = torch.where(kinds == 0, 0, torch.randint(0, max_len, (m,), generator=g))
    offsets = torch.zeros(m + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    return offsets


@pytest.mark.parametrize("block_elems", [16, 256, 4096])
def test_plan_covers_every_element_once(device, block_elems):
    offsets = random_offsets(500, seed=block_elems).to(device)
    n = int(offsets[-1])
    plan = octopus.plan(offsets, block_elems, num_values=n)
    assert plan.device == offsets.device
    assert plan.shape == (n // block_elems + 500 + 1, 2)
    item, begin, end = octopus.plan_blocks(plan)
    assert torch.all(end - begin <= block_elems) and torch.all(end > begin)
    off = offsets.cpu()
    assert torch.all(begin >= off[item]) and torch.all(end <= off[item + 1])  # never crosses an item
    covered = torch.zeros(n, dtype=torch.int32)
    for b, e in zip(begin.tolist(), end.tolist()):
        covered[b:e] += 1
    assert torch.all(covered == 1)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("m", [0, 1, 7, 10_000, 11_264, 11_265, 300_000])
def test_device_plan_equals_host_plan(m):
    offsets = random_offsets(m, seed=m, max_len=3000)
    n = int(offsets[-1])
    host = torch.ops.octopus.plan(offsets, n, 512)
    dev = torch.ops.octopus.plan(offsets.cuda(), n, 512)
    assert torch.equal(dev.cpu(), host)


def test_batch_caches_plans_per_block_size(device):
    batch = random_batch([(3, 4), (5, 6)], device)
    p1 = batch.plan(64)
    assert batch.plan(64) is p1
    assert batch.plan(128) is not p1
    derived = octopus.affine(batch, 2.0)
    assert derived.plan(64) is p1  # same layout, shared cache
    assert batch.metadata("plan_host", 64) is p1  # same plan, whichever side built it
    assert batch.metadata("search") is None
    table = batch.metadata("lookup")
    assert table.dtype == torch.int32 and table.tolist() == [0] * 12 + [1] * 30


def test_plan_on_cpu_validates_offsets():
    with pytest.raises(ValueError, match="non-decreasing"):
        torch.ops.octopus.plan(torch.tensor([0, 5, 3]), 3, 16)
    with pytest.raises(ValueError, match="block_elems"):
        torch.ops.octopus.plan(torch.tensor([0, 5]), 5, 10)

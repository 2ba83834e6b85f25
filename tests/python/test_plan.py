"""Block plans: CPU builder vs device builder, coverage, caching."""

import pytest
import torch

import octopus
from conftest import HAS_CUDA, dust_offsets, random_batch, reference_plan_rows


def random_offsets(m, seed, max_len=5000):
    g = torch.Generator().manual_seed(seed)
    kinds = torch.randint(0, 3, (m,), generator=g)
    lengths = torch.where(kinds == 0, 0, torch.randint(0, max_len, (m,), generator=g))
    offsets = torch.zeros(m + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    return offsets


def giant_offsets(m, seed):
    # Dust around one item of 3M elements: 733 to 5860 plan rows of one item (at 4096- to
    # 512-element blocks).
    offsets = dust_offsets(m, seed=seed)
    lengths = offsets.diff()
    if m:
        lengths[m // 2] = 3_000_000
    offsets[1:] = lengths.cumsum(0)
    return offsets


def decoded(plan):
    item, begin, end, run = octopus.plan_blocks(plan)
    return list(zip(begin.tolist(), item.tolist(), (end - begin).tolist(), run.tolist()))


@pytest.mark.parametrize("block_elems", [16, 256, 2048, 4096, 16384])
@pytest.mark.parametrize("layout", ["mixed", "dust"])
def test_plan_equals_the_reference_and_covers_every_element_once(device, block_elems, layout):
    offsets = (random_offsets(500, seed=block_elems) if layout == "mixed" else dust_offsets(3000, seed=block_elems))
    n = int(offsets[-1])
    plan = octopus.plan(offsets.to(device), block_elems, num_values=n)
    assert plan.device.type == device.type
    assert plan.shape == (n // block_elems + offsets.numel(), 2)
    rows = decoded(plan)
    assert rows == reference_plan_rows(offsets, block_elems)
    off = offsets.tolist()
    small_max = min(block_elems // 8, 256)
    has_small = any(0 < off[i + 1] - off[i] <= small_max for i in range(len(off) - 1))
    assert has_small == any(run for *_, run in rows), "small items form runs where a run can hold them"
    covered = torch.zeros(n, dtype=torch.int32)
    for begin, item, length, run in rows:
        if run:  # whole small items of one window of 32, at most 32 of them
            last = next(i for i in range(item, len(off) - 1) if off[i + 1] >= begin + length)
            assert off[item] == begin and off[last + 1] == begin + length and last // 32 == item // 32
            assert all(off[i + 1] - off[i] <= small_max for i in range(item, last + 1))
            assert 0 < length <= min(4 * block_elems, 8192)
        else:  # never crosses an item
            assert 0 < length <= block_elems
            assert off[item] <= begin and begin + length <= off[item + 1]
        covered[begin:begin + length] += 1
    assert torch.all(covered == 1)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("m", [0, 1, 7, 10_000, 11_264, 11_265, 300_000])
@pytest.mark.parametrize("layout", ["mixed", "dust", "giant"])
def test_device_plan_equals_host_plan(m, layout):
    # Up to 11,264 items one kernel builds the plan, above it a scan and a fill (a thread per
    # row searching the scanned counts): items of a few rows and empty ones (mixed), runs of
    # small items (dust), and hundreds to thousands of rows of one item among them (giant).
    offsets = {"mixed": lambda: random_offsets(m, seed=m, max_len=3000), "dust": lambda: dust_offsets(m, seed=m),
               "giant": lambda: giant_offsets(m, seed=m)}[layout]()
    n = int(offsets[-1])
    for block_elems in (512, 4096):
        host = torch.ops.octopus.plan(offsets, n, block_elems)
        dev = torch.ops.octopus.plan(offsets.cuda(), n, block_elems)
        assert torch.equal(dev.cpu(), host)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("m", [5_000, 11_265, 300_000])
def test_device_plan_of_unvalidated_offsets_stays_in_bounds(m):
    # Offsets past the end, negative and decreasing (the CUDA op does not validate them: that
    # would synchronize): wrong blocks, never blocks outside the values or the items.
    offsets = dust_offsets(m, seed=m)
    n = int(offsets[-1])
    offsets[m // 2] = n + 1000
    offsets[m // 3] = -5
    offsets[m // 4: m // 4 + 100] = offsets[m // 4: m // 4 + 100].flip(0)
    for block_elems in (512, 4096):
        dev = torch.ops.octopus.plan(offsets.cuda(), n, block_elems)
        count = int(dev[0, 0])
        assert 0 <= count <= dev.shape[0] - 1
        item, begin, end, _ = octopus.plan_blocks(dev.cpu())
        assert bool((begin >= 0).all() and (end <= n).all() and (begin <= end).all())
        assert bool((item >= 0).all() and (item < m).all())


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


def dust_batch(device, dtype, seed, item_dim=1):
    """A batch of mostly small items (runs in the plan) with a larger one now and then:
    1-D items, 2-D ones of 8 columns, or 3-D ones of 3 channels."""
    offsets = dust_offsets(4000, seed=seed, big=(300, 3000))
    lengths = offsets.diff().tolist()
    if item_dim == 1:
        shapes = [(n,) for n in lengths]
    elif item_dim == 2:
        shapes = [(n // 8, 8) for n in lengths]
    else:
        shapes = [(3, n // 24, 8) for n in lengths]
    return random_batch(shapes, device, dtype, seed=seed, item_dim=item_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.uint8])
@pytest.mark.parametrize("block_elems", [2048, 4096])
@pytest.mark.parametrize("per_channel", [False, True])
def test_affine_over_runs_matches_float64(device, dtype, block_elems, per_channel):
    batch = dust_batch(device, dtype, seed=block_elems, item_dim=3 if per_channel else 1)
    assert int(octopus.plan_blocks(batch.plan(block_elems))[3].sum()) > 20, "the plan has runs"
    m, c = len(batch), 3 if per_channel else 1
    g = torch.Generator().manual_seed(1)
    param = torch.float64 if dtype == torch.float64 else torch.float32
    scale = torch.randn((m, c) if per_channel else (m,), generator=g, dtype=torch.float64).to(param)
    bias = torch.randn(scale.shape, generator=g, dtype=torch.float64).to(param)
    expected = [t.double() * s.double().view(-1, 1, 1) + b.double().view(-1, 1, 1) if per_channel
                else t.double() * s.double() + b.double()
                for t, s, b in zip(batch.cpu().unbind(), scale, bias)]
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-4)
    reference = None
    for strategy in ("plan", "plan_host", "search"):
        out = octopus.affine(batch, scale.to(device), bias.to(device), strategy=strategy, block_elems=block_elems)
        for a, b in zip(out.cpu().unbind(), expected):
            torch.testing.assert_close(a.double(), b, **tol)
        if reference is None:
            reference = out.values
        else:  # every locator puts every element in the same item
            assert torch.equal(out.values, reference)


@pytest.mark.parametrize("block_elems", [2048, 4096])
def test_item_stats_and_stencils_over_runs(device, block_elems):
    batch = dust_batch(device, torch.float32, seed=7 + block_elems)
    stats = octopus.item_stats(batch, block_elems=block_elems)
    for k, t in enumerate(batch.cpu().unbind()):
        t = t.double()
        if t.numel() == 0:
            continue
        assert abs(float(stats.mean[k]) - float(t.mean())) <= 1e-5 * (1 + abs(float(t.mean())))
        assert float(stats.min[k]) == float(t.min()) and float(stats.max[k]) == float(t.max())
    # A functor whose elements read their neighbours takes a run's items one at a time.
    images = dust_batch(device, torch.float32, seed=11, item_dim=2)
    assert octopus.plan_blocks(images.plan(block_elems))[3].any()
    blurred = octopus.box_blur(images, strategy="plan", block_elems=block_elems)
    for a, t in zip(blurred.cpu().unbind(), images.cpu().unbind()):
        if t.numel() == 0:
            continue
        padded = torch.nn.functional.pad(t.double()[None, None], (1, 1, 1, 1), mode="replicate")
        torch.testing.assert_close(a.double(), torch.nn.functional.avg_pool2d(padded, 3, stride=1)[0, 0],
                                   rtol=1e-5, atol=1e-5)

"""octopus.distributed in one process: element-balanced bounds, the packing of send buffers
and the unpacking of received ones (no communication), the backend/device rules, and the
collectives at world size 1 (gloo on the CPU; NCCL on a GPU). Across processes:
test_distributed_multiprocess.py."""

import contextlib

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import octopus
import octopus.distributed as odist
from octopus.distributed import agreement, packing
from conftest import HAS_CUDA, random_batch

needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of octopus")


@contextlib.contextmanager
def process_group(backend: str, rank: int = 0, world_size: int = 1):
    """A default process group in this process for the duration of a test (fake: FakeStore)."""
    if dist.is_initialized():
        pytest.fail("a process group was left initialized by an earlier test")
    store = FakeStore() if backend == "fake" else dist.HashStore()
    kwargs = dict(device_id=torch.device("cuda", torch.cuda.current_device())) if backend == "nccl" else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, **kwargs)
    try:
        yield
    finally:
        dist.destroy_process_group()


def random_offsets(g: torch.Generator, num_items: int, max_len: int, empty_share: float = 0.2) -> torch.Tensor:
    lengths = torch.randint(0, max_len + 1, (num_items,), generator=g)
    lengths[torch.rand(num_items, generator=g) < empty_share] = 0
    return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])


# ---------------------------------------------------------------- shard_bounds

@pytest.mark.parametrize("seed", range(40))
def test_shard_bounds_are_the_nearest_boundaries_and_within_one_item_of_the_mean(seed):
    g = torch.Generator().manual_seed(seed)
    num_items = int(torch.randint(0, 60, (1,), generator=g))
    offsets = random_offsets(g, num_items, [3, 50, 5000][seed % 3])
    if seed % 5 == 0 and num_items:  # a long tail: one huge item
        offsets[1 + seed % num_items:] += 100_000
    world = int(torch.randint(1, 9, (1,), generator=g))
    bounds = odist.shard_bounds(offsets, world)
    o = offsets.tolist()
    n, m = o[-1], num_items
    assert len(bounds) == world + 1 and bounds[0] == 0 and bounds[-1] == m
    assert all(a <= b for a, b in zip(bounds, bounds[1:]))
    largest = max((b - a for a, b in zip(o, o[1:])), default=0)
    for r in range(world):
        elements = o[bounds[r + 1]] - o[bounds[r]]
        assert world * elements <= n + world * largest  # at most the mean plus one item
    for r in range(world + 1):  # each boundary is an item boundary nearest to r * N / W
        best = min(abs(world * x - r * n) for x in o)
        assert abs(world * o[bounds[r]] - r * n) == best
        # ...and among boundaries at that element, the one nearest to item r * M / W.
        same = [i for i, x in enumerate(o) if x == o[bounds[r]]]
        assert abs(world * bounds[r] - r * m) <= min(abs(world * i - r * m) for i in same) + world


def test_shard_bounds_spread_empty_items_and_take_the_lower_boundary_on_ties():
    assert odist.shard_bounds(torch.zeros(9, dtype=torch.int64), 4) == [0, 2, 4, 6, 8]
    assert odist.shard_bounds(torch.tensor([0]), 3) == [0, 0, 0, 0]
    # Items of 4, 4: the middle (element 4) is a boundary; with items 2, 4, 2 it lies at 4 too.
    assert odist.shard_bounds(torch.tensor([0, 4, 8]), 2) == [0, 1, 2]
    assert odist.shard_bounds(torch.tensor([0, 2, 6, 8]), 2) == [0, 1, 3]  # 4 is 2 from 2 and 6: the lower
    assert odist.shard_bounds(torch.tensor([0, 10, 11, 12, 13]), 1) == [0, 4]


def test_shard_bounds_on_a_sorted_long_tail_beat_item_counts():
    # Items sorted by size (as a bucketing loader gives them): equal item counts are far from equal work.
    sizes = torch.exp(torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 1.2 + 6).long().sort().values
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
    world, n = 4, int(offsets[-1])
    balanced = odist.shard_bounds(offsets, world)
    by_count = [r * 1000 // world for r in range(world + 1)]
    work = [int(offsets[b] - offsets[a]) for a, b in zip(balanced, balanced[1:])]
    naive = [int(offsets[b] - offsets[a]) for a, b in zip(by_count, by_count[1:])]
    assert max(work) <= n / world + int(sizes.max())
    assert max(naive) > 2 * max(work)


@pytest.mark.parametrize("offsets,world,error,match", [
    (torch.tensor([0, 3, 5]), 0, ValueError, "world_size"),
    (torch.tensor([0, 3, 5]), 2.0, ValueError, "world_size"),
    (torch.tensor([0, 3, 5]), True, ValueError, "world_size"),
    (torch.tensor([0.0, 3.0]), 2, TypeError, "int64"),
    (torch.zeros(0, dtype=torch.int64), 2, TypeError, "non-empty"),
    ([0, 3, 5], 2, TypeError, "offsets"),
    (torch.tensor([1, 3, 5]), 2, ValueError, "start at 0"),
    (torch.tensor([0, 5, 3]), 2, ValueError, "never decrease"),
])
def test_shard_bounds_rejects_bad_input(offsets, world, error, match):
    with pytest.raises(error, match=match):
        odist.shard_bounds(offsets, world)


def test_shard_takes_this_ranks_range_without_communicating():
    # The fake backend does nothing: shard needs only the rank and the world size.
    batch = random_batch([(3, h, w) for h, w in [(4, 5), (0, 2), (9, 9), (1, 1), (6, 3), (2, 2)]], "cpu")
    bounds = odist.shard_bounds(batch.offsets, 3)
    for rank in range(3):
        with process_group("fake", rank=rank, world_size=3):
            part = odist.shard(batch)
        assert part.item_shapes() == batch.item_shapes()[bounds[rank]:bounds[rank + 1]]
        if part.numel():
            assert part.values.data_ptr() == batch.values[int(batch.offsets[bounds[rank]]):].data_ptr()


def test_shard_needs_a_process_group_and_a_batch():
    batch = random_batch([(3,)], "cpu")
    if dist.is_initialized():
        pytest.fail("a process group was left initialized by an earlier test")
    with pytest.raises(RuntimeError, match="init_process_group"):
        odist.shard(batch)
    with pytest.raises(RuntimeError, match="init_process_group"):
        odist.all_to_all(batch, [0])
    with process_group("gloo"):
        with pytest.raises(TypeError, match="RaggedBatch"):
            odist.shard(batch.values)


# ---------------------------------------------------------------- packing and unpacking (local)

def grouped_reference(batch, dest):
    """Items grouped by destination, original order within one: (shapes, values)."""
    order = sorted(range(len(batch)), key=lambda i: dest[i])
    items = batch.unbind()
    values = [items[i].reshape(-1) for i in order]
    return [batch.item_shapes()[i] for i in order], torch.cat(values) if values else batch.values[:0]


@pytest.fixture(params=["slices", "index"])
def run_path(request, monkeypatch):
    """Forces one of the two ways of moving runs."""
    limit = 0 if request.param == "slices" else 1 << 62
    monkeypatch.setattr(packing, "MIN_SLICED_RUN_ELEMENTS", {"cpu": limit, "cuda": limit})
    return request.param


@pytest.mark.parametrize("seed", range(12))
def test_pack_groups_items_by_destination_with_gradients(device, run_path, seed):
    g = torch.Generator().manual_seed(seed)
    world = 1 + seed % 4
    count = int(torch.randint(0, 30, (1,), generator=g))
    shapes = [tuple(s) for s in torch.randint(0, 5, (count, 1 + seed % 3), generator=g).tolist()]
    batch = random_batch(shapes, device, dtype=torch.float64, seed=seed, item_dim=1 + seed % 3)
    dest = torch.randint(0, world, (count,), generator=g)
    layout, problem = packing.SendLayout.by_destination(batch.offsets, dest.to(device), world)
    assert problem is None and layout.items_per_rank == torch.bincount(dest, minlength=world).tolist()
    lengths = batch.host_layout()[0].diff()
    assert layout.elements_per_rank == [int(lengths[dest == r].sum()) for r in range(world)]
    x = batch.values.clone().requires_grad_()
    values, sizes = layout.pack(batch.with_values(x))
    want_shapes, want_values = grouped_reference(batch, dest.tolist())
    assert [tuple(s) for s in sizes.tolist()] == want_shapes
    assert torch.equal(values.detach(), want_values)
    w = torch.randn(values.shape, generator=g, dtype=torch.float64).to(device)
    (values * w).sum().backward()
    leaf = batch.values.clone().requires_grad_()
    ref_items = [leaf[int(a):int(b)] for a, b in zip(batch.offsets.tolist(), batch.offsets.tolist()[1:])]
    order = sorted(range(count), key=lambda i: dest[i])
    (torch.cat([ref_items[i] for i in order] + [leaf[:0]]) * w).sum().backward()
    assert torch.equal(x.grad, leaf.grad)
    back = packing.unpack(values.detach(), sizes)
    torch.ops.octopus.validate_layout(back.offsets, back.sizes, back.numel())
    assert back.item_shapes() == want_shapes and torch.equal(back.values, want_values)


def test_items_already_grouped_are_sent_without_a_copy(device, run_path):
    batch = random_batch([(4,), (0,), (3,), (5,)], device)
    layout, _ = packing.SendLayout.by_destination(batch.offsets, torch.tensor([0, 0, 2, 2], device=device), 3)
    values, sizes = layout.pack(batch)
    assert values is batch.values and sizes is batch.sizes and not layout.move.moves_items
    assert layout.items_per_rank == [2, 0, 2] and layout.elements_per_rank == [4, 0, 8]


def test_empty_items_moving_alone_reorder_only_the_shapes(device):
    batch = random_batch([(0, 2), (3, 1), (0, 5)], device)
    layout, _ = packing.SendLayout.by_destination(batch.offsets, torch.tensor([1, 0, 1], device=device), 2)
    values, sizes = layout.pack(batch)
    assert values is batch.values  # no element moves
    assert sizes.tolist() == [[3, 1], [0, 2], [0, 5]]


def test_item_move_counts_runs_of_consecutive_items_and_inverts(device, run_path):
    offsets = torch.tensor([0, 2, 5, 5, 9, 10], device=device)
    move = packing.ItemMove(offsets, torch.tensor([3, 4, 0, 1, 2], device=device))
    assert move.runs == 2 and move.moves_elements and move.moves_items
    x = torch.arange(10.0, device=device)
    moved = move.move(x)
    assert moved.tolist() == [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
    assert torch.equal(move.inverse().move(moved), x)
    same = packing.ItemMove(offsets, torch.arange(5, device=device))
    assert same.runs == 1 and not same.moves_elements and same.move(x) is x


def test_out_of_range_destinations_are_reported_not_packed(device):
    batch = random_batch([(2,), (3,), (1,)], device)
    layout, problem = packing.SendLayout.by_destination(batch.offsets, torch.tensor([0, 5, -1], device=device), 2)
    assert layout is None
    assert problem == "dest must hold ranks of the group, 0 <= dest[i] < 2; dest[1] is 5 (2 out of range)"


def test_unpack_rebuilds_offsets_from_shapes(device):
    sizes = torch.tensor([[2, 3], [0, 4], [1, 1]], device=device)
    batch = packing.unpack(torch.arange(7.0, device=device), sizes)
    assert batch.offsets.tolist() == [0, 6, 6, 7] and batch.offsets.device == sizes.device
    empty = packing.unpack(torch.zeros(0, device=device), sizes[:0])
    assert len(empty) == 0 and empty.offsets.tolist() == [0] and empty.item_dim == 2


# ---------------------------------------------------------------- backends and devices

def test_backends_by_device_and_device_rules():
    with process_group("gloo"):
        assert agreement.backends_by_device(None) == {"cpu": "gloo", "cuda": "gloo"}
    rules = agreement.device_problem
    assert rules({"cpu": "gloo"}, torch.device("cpu")) is None
    assert rules({"cuda": "nccl"}, torch.device("cuda", 1)) is None
    message = rules({"cuda": "nccl"}, torch.device("cpu"))
    assert "batch is on cpu" in message and "no backend" in message and "gloo" in message
    message = rules({"cpu": "gloo", "cuda": "gloo"}, torch.device("cuda", 0))
    assert "cuda:0" in message and "over gloo" in message and "nccl" in message
    assert "meta" in rules({"cpu": "gloo"}, torch.device("meta"))


def test_unsupported_backend_is_refused_before_any_collective():
    batch = random_batch([(3,)], "cpu")
    with process_group("fake", world_size=2):
        with pytest.raises(ValueError, match="backend .*fake.* is not supported.*gloo.*nccl"):
            odist.all_gather(batch)


# ---------------------------------------------------------------- world size 1

def collectives_at_world_size_one(device):
    """all_to_all, all_gather and gather at world size 1 are copies; gradients go through."""
    batch = random_batch([(2, 3, 4), (2, 0, 1), (2, 5, 5)], device, dtype=torch.float64)
    x = batch.values.clone().requires_grad_()
    b = batch.with_values(x)
    outs = [odist.all_to_all(b, torch.zeros(3, dtype=torch.int32, device=device)), odist.all_gather(b),
            odist.gather(b, 0), odist.shard(b)]
    for out in outs:
        assert out.device == batch.device and out.item_shapes() == batch.item_shapes()
        assert torch.equal(out.values, batch.values) and out.offsets.tolist() == batch.offsets.tolist()
    sum((out.values * (k + 1)).sum() for k, out in enumerate(outs)).backward()
    assert torch.equal(x.grad, torch.full_like(x, 10.0))
    empty = octopus.RaggedBatch.from_tensors([], device=device, item_dim=2)
    assert len(odist.all_to_all(empty, [])) == 0 and odist.all_gather(empty).item_dim == 2
    with pytest.raises(ValueError, match="on rank 0: dest must hold ranks of the group, 0 <= dest.i. < 1; dest.2. is"):
        odist.all_to_all(batch, [0, 0, 1])
    with pytest.raises(ValueError, match="dest must have one rank per item of batch, shape .3,., got shape .2,."):
        odist.all_to_all(batch, [0, 0])
    with pytest.raises(TypeError, match="dest must be an integer tensor or a sequence of ints"):
        odist.all_to_all(batch, object())
    with pytest.raises(ValueError, match="dst must be a rank of the group"):
        odist.gather(batch, 1)
    with pytest.raises(ValueError, match="dst must be a rank of the group"):
        odist.gather(batch, True)


def test_collectives_at_world_size_one_over_gloo():
    with process_group("gloo"):
        collectives_at_world_size_one(torch.device("cpu"))


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl"])
def test_collectives_at_world_size_one_over_nccl(backend):
    with process_group(backend):
        collectives_at_world_size_one(torch.device("cuda", torch.cuda.current_device()))
        if backend != "nccl":  # the same group exchanges CPU batches over gloo
            collectives_at_world_size_one(torch.device("cpu"))


@pytest.mark.cuda
@needs_cuda
def test_mixed_backend_and_device_are_refused_naming_both():
    cpu_batch = random_batch([(3,), (4,)], "cpu")
    with process_group("nccl"):
        with pytest.raises(ValueError, match="batch is on cpu.*no backend.*gloo"):
            odist.all_to_all(cpu_batch, [0, 0])
    with process_group("gloo"):
        with pytest.raises(ValueError, match="batch is on cuda:.*over gloo.*nccl"):
            odist.all_gather(cpu_batch.cuda())


def test_readme_style_pipeline_over_gloo():
    """shard -> normalize -> all_gather at world size 1 equals normalize on the whole batch."""
    batch = random_batch([(3, 9, 7), (3, 2, 2), (3, 31, 5)], "cpu")
    with process_group("gloo"):
        out = odist.all_gather(octopus.normalize(odist.shard(batch), channels=3))
    want = octopus.normalize(batch, channels=3)
    assert out.item_shapes() == batch.item_shapes()
    assert torch.allclose(out.values, want.values, atol=1e-6)

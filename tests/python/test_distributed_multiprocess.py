"""octopus.distributed across processes: gloo on the CPU with 2 and 4 ranks, and NCCL with
CUDA batches on 2 GPUs where there are two.

Each world size is started once (processes forked from a server that imported torch once)
and runs every case of its list, each case in a process group of its own and the ranks
meeting at a barrier after each, so a case that fails (even by timing out) cannot
desynchronize the next. Every rank derives all ranks' inputs from the case's seed and checks
its result against a single-process reference: plain slicing and ``cat`` for the values,
plain autograd through the same slicing for the gradients. A hung collective fails its case
after ``CASE_TIMEOUT``; a hung or dead process fails every case it did not report, after
``SPAWN_TIMEOUT_S`` at most.
"""

import datetime
import json
import os
import re
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import octopus
import octopus.distributed as odist
from conftest import HAS_CUDA

CASE_TIMEOUT = datetime.timedelta(seconds=30)  # a collective that waits this long fails its case
SHORT_TIMEOUT = datetime.timedelta(seconds=4)  # the case that is meant to time out
BETWEEN_CASES_TIMEOUT = 3 * CASE_TIMEOUT  # the barrier after each case waits for ranks stuck in it
SPAWN_TIMEOUT_S = 600
# Where a worker's batches live: the CPU under gloo, the rank's GPU under nccl (set by _worker).
DEVICE = torch.device("cpu")
BACKEND = "gloo"


# ---------------------------------------------------------------- inputs and references

def rank_batch(seed: int, rank: int, item_dim: int, dtype=torch.float64, max_items: int = 6,
               max_extent: int = 4) -> octopus.RaggedBatch:
    """Rank ``rank``'s batch of a case: 0..max_items items, extents 0..max_extent (empty items)."""
    g = torch.Generator().manual_seed(seed * 101 + rank)
    count = int(torch.randint(0, max_items + 1, (1,), generator=g))
    shapes = torch.randint(0, max_extent + 1, (count, item_dim), generator=g).tolist()
    items = [(torch.randn(s, generator=g, dtype=torch.float64) * 50).to(dtype) for s in shapes]
    return octopus.RaggedBatch.from_tensors(items, dtype=dtype, item_dim=item_dim)


def random_dest(seed: int, rank: int, count: int, ranks) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 103 + rank)
    ranks = torch.tensor(list(ranks), dtype=torch.int64)
    return ranks[torch.randint(0, len(ranks), (count,), generator=g)]


def weights(seed: int, rank: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed * 107 + rank), dtype=torch.float64)


def items_of(values: torch.Tensor, batch: octopus.RaggedBatch):
    o = batch.offsets.tolist()
    return [values[o[i]:o[i + 1]] for i in range(len(batch))]


def flat(parts, like):
    return torch.cat(parts) if parts else like.new_zeros(0)


def here(batch: octopus.RaggedBatch) -> octopus.RaggedBatch:
    """A batch built on the CPU, on this worker's device."""
    return batch.to(DEVICE)


def leaf_here(batch: octopus.RaggedBatch) -> torch.Tensor:
    """A copy of the batch's values on this worker's device, requiring gradients."""
    return batch.values.clone().to(DEVICE).requires_grad_()


def check_batch(got: octopus.RaggedBatch, shapes, values: torch.Tensor):
    assert got.device == DEVICE, got.device
    got = got.cpu()
    assert got.item_shapes() == [tuple(s) for s in shapes], (got.item_shapes(), shapes)
    torch.ops.octopus.validate_layout(got.offsets, got.sizes, got.numel())
    assert torch.equal(got.values, values), (got.values, values)


def all_to_all_reference(batches, dests, leaves=None):
    """What each rank receives (shapes, values): the items sent to it, by source then order."""
    world = len(batches)
    leaves = leaves or [b.values for b in batches]
    out = []
    for q in range(world):
        shapes, parts = [], []
        for s in range(world):
            for i, (part, d) in enumerate(zip(items_of(leaves[s], batches[s]), dests[s].tolist())):
                if d == q:
                    shapes.append(batches[s].item_shapes()[i])
                    parts.append(part)
        out.append((shapes, flat(parts, leaves[0])))
    return out


def leaves_of(batches):
    return [b.values.detach().clone().requires_grad_() for b in batches]


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float = 1e-12) -> None:
    # Not torch.testing.assert_close: with a process group it imports DTensor (seconds per process).
    got = got.cpu()
    assert got.shape == want.shape and torch.allclose(got, want, rtol=tol, atol=tol), (
        f"shape {tuple(got.shape)} vs {tuple(want.shape)}, max difference "
        f"{(got - want).abs().max().item() if got.shape == want.shape and got.numel() else '-'}")


def reference_backward(losses, leaves) -> None:
    """Backward of the sum of the reference losses (every leaf gets a gradient, zeros where unused)."""
    (sum(losses) + sum(0 * leaf.sum() for leaf in leaves)).backward()


def loss_of(seed: int, rank: int, values: torch.Tensor) -> torch.Tensor:
    return (values * weights(seed, rank, values.numel()).to(values.device, values.dtype)).sum()


# ---------------------------------------------------------------- cases (run on every rank)

def check_all_to_all_with_grads(rank, world, group, seed, batches):
    """Random destinations: values against the reference, gradients against its autograd."""
    dests = [random_dest(seed, r, len(batches[r]), range(world)) for r in range(world)]
    x = leaf_here(batches[rank])
    out = odist.all_to_all(here(batches[rank]).with_values(x), dests[rank], group)
    check_batch(out, *all_to_all_reference(batches, dests)[rank])
    loss_of(seed, rank, out.values).backward()
    leaves = leaves_of(batches)
    reference_backward([loss_of(seed, q, v) for q, (_, v) in enumerate(all_to_all_reference(batches, dests, leaves))],
                       leaves)
    assert_close(x.grad, leaves[rank].grad)


def case_all_to_all_1d_with_grads(rank, world, group):
    check_all_to_all_with_grads(rank, world, group, 1, [rank_batch(1, r, 1) for r in range(world)])


def case_all_to_all_3d_with_grads(rank, world, group):
    check_all_to_all_with_grads(rank, world, group, 2, [rank_batch(2, r, 3) for r in range(world)])


def case_all_to_all_many_layouts(rank, world, group):
    """Random layouts; a rank that sends nothing, one that receives nothing, all to one rank."""
    for seed in range(10, 30):
        item_dim = 1 + seed % 3
        batches = [rank_batch(seed, r, item_dim, max_items=8) for r in range(world)]
        silent, chosen = seed % world, (seed + 1) % world
        batches[silent] = octopus.RaggedBatch.from_tensors([], dtype=torch.float64, item_dim=item_dim)
        # Every rank but `chosen` receives (it receives nothing), or only `chosen` does.
        targets = [q for q in range(world) if q != chosen] if seed % 4 else [chosen]
        dests = [random_dest(seed, r, len(batches[r]), targets) for r in range(world)]
        out = odist.all_to_all(here(batches[rank]), dests[rank].tolist() if seed % 2 else dests[rank].int(), group)
        check_batch(out, *all_to_all_reference(batches, dests)[rank])


def case_all_to_all_dtypes_and_grouped_dest(rank, world, group, seed=4):
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.uint8, torch.int64, torch.bool):
        batches = [rank_batch(seed, r, 2, dtype=dtype) for r in range(world)]
        dests = [random_dest(seed, r, len(batches[r]), range(world)) for r in range(world)]
        for d in (dests, [t.sort().values for t in dests]):  # random, then already grouped (sent without a copy)
            check_batch(odist.all_to_all(here(batches[rank]), d[rank], group), *all_to_all_reference(batches, d)[rank])


def case_all_to_all_large_items_with_grads(rank, world, group, seed=5):
    """Items of 20K-60K elements: runs are sliced, not gathered by index (packing's other path)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [torch.randint(20_000, 60_000, (5, 1), generator=g).tolist() for _ in range(world)]
    batches = [octopus.RaggedBatch.from_tensors([torch.randn(s, generator=g, dtype=torch.float64) for s in sh])
               for sh in shapes]
    check_all_to_all_with_grads(rank, world, group, seed, batches)


def case_all_gather_with_grads(rank, world, group, seed=6):
    for item_dim in (1, 3):
        batches = [rank_batch(seed + item_dim, r, item_dim) for r in range(world)]
        x = leaf_here(batches[rank])
        out = odist.all_gather(here(batches[rank]).with_values(x), group)
        check_batch(out, [s for b in batches for s in b.item_shapes()], torch.cat([b.values for b in batches]))
        loss_of(seed, rank, out.values).backward()
        # Reference: every rank's loss on the gathered batch; this rank's items get the sum over ranks.
        leaves = leaves_of(batches)
        reference_backward([loss_of(seed, q, torch.cat(leaves)) for q in range(world)], leaves)
        assert_close(x.grad, leaves[rank].grad)


def case_gather_with_grads(rank, world, group, seed=7):
    for dst in range(world):
        batches = [rank_batch(seed + dst, r, 3) for r in range(world)]
        x = leaf_here(batches[rank])
        out = odist.gather(here(batches[rank]).with_values(x), dst, group)
        if rank == dst:
            check_batch(out, [s for b in batches for s in b.item_shapes()], torch.cat([b.values for b in batches]))
        else:
            assert len(out) == 0 and out.item_dim == 3 and out.dtype == torch.float64
        loss_of(seed, rank, out.values).backward()  # an empty output adds zero, and takes part in the backward
        leaves = leaves_of(batches)
        reference_backward([loss_of(seed, dst, torch.cat(leaves))], leaves)
        assert_close(x.grad, leaves[rank].grad)


def case_shard_pipeline_with_grads(rank, world, group, seed=8):
    """shard -> affine -> all_gather equals affine on the whole batch; the ranks' gradients
    of the whole batch sum to the gradient of the sum of their losses."""
    g = torch.Generator().manual_seed(seed)  # the same batch on every rank
    whole = octopus.RaggedBatch.from_tensors([torch.randn(s, generator=g, dtype=torch.float64) for s in
                                              torch.randint(0, 10, (30, 2), generator=g).tolist()])
    x = leaf_here(whole)
    mine = odist.shard(here(whole).with_values(x), group)
    bounds = odist.shard_bounds(whole.offsets, world)
    assert mine.item_shapes() == whole.item_shapes()[bounds[rank]:bounds[rank + 1]]
    scale = torch.linspace(0.5, 2.0, len(whole), dtype=torch.float64)
    out = odist.all_gather(octopus.affine(mine, scale[bounds[rank]:bounds[rank + 1]].to(DEVICE), 0.25), group)
    ref = whole.values.clone().requires_grad_()
    expected = octopus.affine(whole.with_values(ref), scale, 0.25)  # on the CPU
    # The same kernel on the CPU; on a GPU affine's float32 arithmetic may round differently.
    tol = 1e-12 if DEVICE.type == "cpu" else 1e-5
    assert out.item_shapes() == whole.item_shapes()
    assert_close(out.values, expected.values.detach(), tol)
    loss_of(seed, rank, out.values).backward()
    outside = torch.ones(whole.numel(), dtype=torch.bool)
    outside[int(whole.offsets[bounds[rank]]):int(whole.offsets[bounds[rank + 1]])] = False
    assert x.grad.cpu()[outside].eq(0).all()  # this rank's contribution only
    summed = x.grad.clone()
    dist.all_reduce(summed, group=group)
    sum(loss_of(seed, q, expected.values) for q in range(world)).backward()
    assert_close(summed, ref.grad, tol)


def expect_error(error, *needles):
    """``pytest.raises(error)`` whose message holds the needles in this order."""
    return pytest.raises(error, match=".*".join(map(re.escape, needles)))


def case_bad_input_raises_on_every_rank(rank, world, group):
    batch = here(octopus.RaggedBatch.from_tensors([torch.randn(k, dtype=torch.float64) for k in (2, 0, 3)]))
    last = world - 1
    with expect_error(ValueError, "all_to_all", f"on rank {last}", "dest must have one rank per item"):
        odist.all_to_all(batch, [0] * (4 if rank == last else 3), group)
    with expect_error(ValueError, "on rank 0", f"dest[0] is {world}"):
        odist.all_to_all(batch, [world if rank == 0 else 0, 0, 0], group)
    with expect_error(TypeError, f"on rank {last}", "dest must hold integer ranks"):
        odist.all_to_all(batch, torch.zeros(3) if rank == last else torch.zeros(3, dtype=torch.int64), group)
    with expect_error(TypeError, "all_gather", f"on rank {last}", "must be an octopus.RaggedBatch"):
        odist.all_gather(batch.values if rank == last else batch, group)
    with expect_error(ValueError, "numbers of dimensions", "1-D on rank", f"3-D on rank {last}"):
        odist.all_gather(here(rank_batch(9, rank, 3 if rank == last else 1)), group)
    with expect_error(TypeError, "dtypes", "torch.float32 on rank 0", "torch.float64 on rank"):
        odist.all_to_all(batch.to(dtype=torch.float32) if rank == 0 else batch, [0, 0, 0], group)
    with expect_error(ValueError, "require gradients", "yes on rank 0"):
        odist.gather(batch.with_values(batch.values.clone().requires_grad_(rank == 0)), 0, group)
    with expect_error(ValueError, "gather", "destination rank (dst)"):
        odist.gather(batch, rank % 2, group)
    with expect_error(ValueError, "gather", f"on rank {last}", "dst must be a rank of the group"):
        odist.gather(batch, world if rank == last else 0, group)
    with expect_error(RuntimeError, "different operations", "all_gather on rank 0"):
        if rank == 0:
            odist.all_gather(batch, group)
        else:
            odist.gather(batch, 0, group)
    # The group is still in step: a good exchange after all of that.
    batches = [rank_batch(9, r, 1) for r in range(world)]
    dests = [random_dest(9, r, len(batches[r]), range(world)) for r in range(world)]
    check_batch(odist.all_to_all(here(batches[rank]), dests[rank], group), *all_to_all_reference(batches, dests)[rank])


def case_one_rank_failing_fails_the_case(rank, world, group):
    """Meant to fail (the harness test expects it to): the last rank raises before the
    exchange, the others wait in it until the group's short timeout."""
    if rank == world - 1:
        raise RuntimeError("deliberate failure on the last rank")
    odist.all_gather(here(rank_batch(0, rank, 1)), group)


def case_subgroup(rank, world, group):
    """A group of the odd ranks: ranks inside it are its own (dest and dst count in it)."""
    members = list(range(1, world, 2))
    sub = dist.new_group(members, timeout=CASE_TIMEOUT, backend=BACKEND)
    if rank not in members:
        with pytest.raises(ValueError, match="not a member of group"):
            odist.all_gather(here(rank_batch(0, rank, 1)), sub)
        return
    me, size = members.index(rank), len(members)
    batches = [rank_batch(12, r, 2) for r in range(size)]
    dests = [random_dest(12, r, len(batches[r]), range(size)) for r in range(size)]
    check_batch(odist.all_to_all(here(batches[me]), dests[me], sub), *all_to_all_reference(batches, dests)[me])
    out = odist.gather(here(batches[me]), size - 1, sub)
    assert len(out) == (sum(map(len, batches)) if me == size - 1 else 0)
    whole = rank_batch(13, 0, 1, max_items=20)
    bounds = odist.shard_bounds(whole.offsets, size)
    assert odist.shard(here(whole), sub).item_shapes() == whole.item_shapes()[bounds[me]:bounds[me + 1]]


CASES_TWO = ["case_all_to_all_1d_with_grads", "case_one_rank_failing_fails_the_case", "case_all_to_all_3d_with_grads",
             "case_all_to_all_many_layouts", "case_all_to_all_dtypes_and_grouped_dest",
             "case_all_to_all_large_items_with_grads", "case_all_gather_with_grads", "case_gather_with_grads",
             "case_shard_pipeline_with_grads", "case_bad_input_raises_on_every_rank"]
CASES_FOUR = ["case_all_to_all_1d_with_grads", "case_all_to_all_3d_with_grads", "case_all_to_all_many_layouts",
              "case_all_gather_with_grads", "case_gather_with_grads", "case_shard_pipeline_with_grads",
              "case_bad_input_raises_on_every_rank", "case_subgroup"]
MEANT_TO_FAIL = {"case_one_rank_failing_fails_the_case"}
# CUDA batches over NCCL, one GPU per rank (2 GPUs). Not the case meant to time out: NCCL's
# watchdog tears a timed-out process down.
CASES_NCCL = [c for c in CASES_TWO if c not in MEANT_TO_FAIL]


# ---------------------------------------------------------------- the harness

def _worker(rank: int, world: int, backend: str, store: str, cases, results: str) -> None:
    global DEVICE, BACKEND
    BACKEND = backend
    torch.set_num_threads(1)
    bound = {}
    if backend == "nccl":
        DEVICE = torch.device("cuda", rank)
        torch.cuda.set_device(DEVICE)
        bound = dict(device_id=DEVICE)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=BETWEEN_CASES_TIMEOUT, **bound)
    # Every case's group made up front, while the ranks are in step.
    groups = [dist.new_group(timeout=SHORT_TIMEOUT if name in MEANT_TO_FAIL else CASE_TIMEOUT, backend=backend)
              for name in cases]
    try:
        with open(os.path.join(results, f"rank{rank}.jsonl"), "w") as out:
            for name, group in zip(cases, groups):
                start = time.perf_counter()
                try:
                    globals()[name](rank, world, group)
                    error = None
                except BaseException:
                    error = traceback.format_exc()
                out.write(json.dumps(dict(case=name, error=error, seconds=time.perf_counter() - start)) + "\n")
                out.flush()
                dist.barrier()  # a rank that failed early waits here for the others to time out
    finally:
        dist.destroy_process_group()


def run_world(world: int, backend: str, cases, tmp_path) -> dict:
    """Starts ``world`` ranks over ``backend`` (gloo: CPU batches; nccl: rank r's batches on
    GPU r) that run ``cases``; returns ``{case: {rank: error or None}}`` (a rank that never
    reported a case has an error saying so)."""
    results = tmp_path / "results"
    results.mkdir()
    # Forked from a server that imported torch once: spawning would import it in every rank.
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed", "octopus.distributed"])
    context = mp.start_processes(_worker, args=(world, backend, str(tmp_path / "store"), cases, str(results)),
                                 nprocs=world, join=False, start_method="forkserver")
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    crash = None
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                crash = f"the ranks did not finish within {SPAWN_TIMEOUT_S} s"
                break
    except Exception as err:  # a rank died outside a case
        crash = f"a rank failed outside the cases: {err}"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    outcome = {name: {r: crash or f"rank {r} did not report this case" for r in range(world)} for name in cases}
    for r in range(world):
        path = results / f"rank{r}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                outcome[row["case"]][r] = row["error"]
    return outcome


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_world(2, "gloo", CASES_TWO, tmp_path_factory.mktemp("two_ranks"))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return run_world(4, "gloo", CASES_FOUR, tmp_path_factory.mktemp("four_ranks"))


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    if not HAS_CUDA or torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs and a CUDA build of octopus")
    return run_world(2, "nccl", CASES_NCCL, tmp_path_factory.mktemp("two_gpus"))


def _assert_passed(outcome, case):
    failures = {r: e for r, e in outcome[case].items() if e}
    assert not failures, "\n".join(f"--- rank {r}:\n{e}" for r, e in failures.items())


@pytest.mark.parametrize("case", [c for c in CASES_TWO if c not in MEANT_TO_FAIL])
def test_two_ranks(two_ranks, case):
    _assert_passed(two_ranks, case)


@pytest.mark.parametrize("case", CASES_FOUR)
def test_four_ranks(four_ranks, case):
    _assert_passed(four_ranks, case)


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES_NCCL)
def test_two_gpus_over_nccl(two_gpus, case):
    _assert_passed(two_gpus, case)


def test_a_failure_on_one_rank_fails_every_rank_without_hanging(two_ranks):
    """The last rank raised before the exchange; rank 0 timed out in it instead of hanging.
    The cases after it pass (test_two_ranks): each case has a group of its own."""
    errors = two_ranks["case_one_rank_failing_fails_the_case"]
    assert "deliberate failure" in errors[1]
    assert errors[0] and "deliberate failure" not in errors[0]

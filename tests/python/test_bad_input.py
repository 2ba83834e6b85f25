"""Bad input found while trying octopus as a new user (issue 16): unvalidated offsets never
reach memory out of bounds (on CUDA: the context survives and later ops are right), and an
empty offsets tensor is named as such by every op that takes offsets."""

import pytest
import torch

import octopus
from conftest import HAS_CUDA

I64 = torch.int64
EMPTY_OFFSETS = r"^offsets needs at least one entry: num_items \+ 1 of them, starting with 0 \(an empty batch has " \
                r"offsets \[0\]\); got an empty tensor$"

# (offsets, number of values): every way offsets can be wrong. The overlapping ones cover
# more blocks than a plan of the batch can hold.
BAD_OFFSETS = {
    "decreasing": ([0, 40, 10, 64], 64),
    "negative": ([0, -20, 30, 64], 64),
    "past the end": ([0, 10, 500, 64], 64),
    "first not zero": ([7, 20, 40, 64], 64),
    "last not the count": ([0, 20, 40, 50], 64),
    "last past the count": ([0, 20, 40, 90], 64),
    "overlapping": ([0, 64, 0, 64, 0, 64], 64),
    "huge": ([0, 2**62, -2**62, 64], 64),
}


def lookup_reference(offsets, n):
    """The item of every element: the last item whose clamped start is at or before it."""
    starts = [min(max(o, 0), n) for o in offsets[:-1]]
    return [max([0] + [i for i in range(1, len(starts)) if starts[i] <= g]) for g in range(n)]


def test_lookup_table_of_valid_offsets(device):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 40, (300,), generator=g)
    lengths[::7] = 0  # empty items, also first and last
    lengths[-1] = 0
    offsets = torch.cat([torch.zeros(1, dtype=I64), lengths.cumsum(0)])
    n = int(offsets[-1])
    table = torch.ops.octopus.lookup_table(offsets.to(device), n)
    want = torch.repeat_interleave(torch.arange(300, dtype=torch.int32), lengths)
    assert table.dtype == torch.int32 and torch.equal(table.cpu(), want)


@pytest.mark.parametrize("case", sorted(BAD_OFFSETS))
def test_lookup_table_of_bad_offsets_holds_item_indices(case, device):
    offsets, n = BAD_OFFSETS[case]
    table = torch.ops.octopus.lookup_table(torch.tensor(offsets, device=device), n)
    assert table.shape == (n,) and table.dtype == torch.int32
    assert table.cpu().tolist() == lookup_reference(offsets, n)  # every entry an item index in [0, M)


@pytest.mark.parametrize("case", sorted(BAD_OFFSETS))
def test_device_plan_of_bad_offsets_stays_in_bounds(case, device):
    """The plan op checks no contents on CUDA (a plan is built inside graphs); its blocks must
    still lie in the values and fit the plan's rows."""
    offsets, n = BAD_OFFSETS[case]
    m = len(offsets) - 1
    if device.type == "cpu":  # the CPU plan op validates
        with pytest.raises(ValueError, match="offsets"):
            torch.ops.octopus.plan(torch.tensor(offsets), n, 16)
        return
    plan = torch.ops.octopus.plan(torch.tensor(offsets, device=device), n, 16).cpu()
    assert_plan_in_bounds(plan, m, n)


def assert_plan_in_bounds(plan, m, n):
    count = int(plan[0, 0])
    assert 0 <= count <= plan.shape[0] - 1
    for begin, packed in plan[1:1 + count].tolist():
        item, length = packed >> 32, packed & 0xFFFFFFFF
        assert 0 <= item < m and 0 <= begin and begin + length <= n


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_device_plan_of_many_overlapping_items_stays_in_bounds():
    """More items than the one-launch plan build takes: the scan + fill path."""
    m = 20001
    offsets = torch.tensor([0 if i % 2 == 0 else 64 for i in range(m)] + [64], device="cuda")
    plan = torch.ops.octopus.plan(offsets, 64, 16).cpu()
    assert plan.shape[0] == 64 // 16 + m + 1
    assert_plan_in_bounds(plan, m, 64)


@pytest.mark.parametrize("strategy", octopus.STRATEGIES)
def test_cpu_checks_offsets_even_without_validate(strategy):
    offsets, n = BAD_OFFSETS["decreasing"]
    with pytest.raises(ValueError, match="non-decreasing"):
        torch.ops.octopus.affine(torch.ones(n), torch.tensor(offsets), torch.ones(3), torch.zeros(3), strategy, 0,
                                 None, False)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("strategy", octopus.STRATEGIES)
def test_unvalidated_bad_offsets_leave_the_cuda_context_working(strategy):
    """README: with validate=False bad offsets give wrong values, never an out-of-bounds
    access. The lookup table build once hit a device-side assert (repeat_interleave) that
    killed the context; each op below must return, and a correct op must still be correct."""
    for case, (offsets, n) in sorted(BAD_OFFSETS.items()):
        m = len(offsets) - 1
        values = torch.rand(n, device="cuda")
        o = torch.tensor(offsets, device="cuda")
        scale, bias = torch.rand(m, device="cuda") + 1, torch.rand(m, device="cuda")
        out = torch.ops.octopus.affine(values, o, scale, bias, strategy, 16, None, False)
        clamped = torch.ops.octopus.pointwise(values, o, "clamp", bias, scale, strategy, 16, None, False)
        torch.cuda.synchronize()  # a device-side assert or a fault surfaces here
        assert out.shape == (n,) and clamped.shape == (n,), case
        if strategy in ("search", "lookup"):
            # Per-element locators: every element took some item's parameters.
            candidates = values[:, None] * scale[None, :] + bias[None, :]
            assert ((out[:, None] - candidates).abs() <= 1e-6 * candidates.abs().clamp(min=1)).any(1).all(), case
    # The context still works and gives right answers.
    batch = octopus.RaggedBatch.from_tensors([torch.rand(50), torch.rand(0), torch.rand(7000)], device="cuda")
    got = octopus.affine(batch, torch.tensor([2.0, 3.0, 4.0], device="cuda"), 1.0, strategy=strategy)
    want = [t * s + 1 for t, s in zip(batch.unbind(), (2.0, 3.0, 4.0))]
    for g, w in zip(got.unbind(), want):
        torch.testing.assert_close(g, w)


def hand_made_plan_claiming_item_1(device):
    """63 values: item 0 holds 3 planes of 20, item 1 3 planes of 1; the plan's one block puts
    all 63 elements in item 1 (a plan passed in is only shape-checked on the GPU)."""
    offsets = torch.tensor([0, 60, 63], device=device)
    plan = torch.tensor([[1, 4096], [0, (1 << 32) | 63], [0, 0]], device=device)
    return torch.rand(63, device=device), offsets, plan


def test_cpu_refuses_a_plan_that_misplaces_elements():
    values, offsets, plan = hand_made_plan_claiming_item_1("cpu")
    scale = torch.rand(2, 3) + 1
    with pytest.raises(ValueError, match=r"metadata: plan block 0 puts elements \[0, 63\) in item 1, which holds "
                                         r"\[60, 63\)"):
        torch.ops.octopus.affine(values, offsets, scale, scale, "plan", 4096, plan, True)
    # The stencils index pixels from the item's start: this once crashed the process.
    sizes = torch.tensor([[3, 4, 5], [3, 1, 1]])
    with pytest.raises(ValueError, match="metadata: plan block 0"):
        torch.ops.octopus.stencil3x3(values, offsets, sizes, torch.ones(3, 9) / 9, "replicate", "plan", 4096, plan,
                                     True)
    bad_count = plan.clone()
    bad_count[0, 0] = 5
    with pytest.raises(ValueError, match="row 0 says 5 blocks, and it has room for 2"):
        torch.ops.octopus.affine(values, offsets, scale, scale, "plan", 4096, bad_count, True)
    table = torch.ops.octopus.lookup_table(offsets, 63)
    table[7] = 1
    with pytest.raises(ValueError, match=r"the lookup table puts element 7 in item 1, which holds \[60, 63\)"):
        torch.ops.octopus.affine(values, offsets, scale, scale, "lookup", 0, table, True)
    table[7] = 9
    with pytest.raises(ValueError, match="item 9, which is not one of the batch's 2 items"):
        torch.ops.octopus.affine(values, offsets, scale, scale, "lookup", 0, table, True)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_plan_that_misplaces_elements_stays_in_bounds():
    """On the GPU a plan passed in is checked for its shape only (its contents would need a
    synchronization): elements it misplaces get wrong values, never parameters read from
    outside the scale and bias tensors."""
    values, offsets, plan = hand_made_plan_claiming_item_1("cuda")
    scale = torch.rand(2, 3, device="cuda") + 1
    bias = torch.rand(2, 3, device="cuda")
    out = torch.ops.octopus.affine(values, offsets, scale, bias, "plan", 4096, plan, True)
    candidates = values[:, None] * scale.reshape(1, -1) + bias.reshape(1, -1)  # every (item, channel)
    assert ((out[:, None] - candidates).abs() <= 1e-6 * candidates.abs()).any(1).all()


def test_misaligned_plan_is_refused(device):
    batch = octopus.RaggedBatch.from_tensors([torch.rand(40), torch.rand(8)], device=device)
    plan = batch.plan(16)
    storage = torch.zeros(plan.numel() + 1, dtype=torch.int64, device=device)
    shifted = storage[1:].view(plan.shape)  # contiguous, 8 bytes off a 16-byte boundary
    shifted.copy_(plan)
    s = torch.ones(2, device=device)
    with pytest.raises(ValueError, match="metadata for strategy 'plan' must start on a 16-byte boundary"):
        torch.ops.octopus.affine(batch.values, batch.offsets, s, s, "plan", 16, shifted)
    torch.testing.assert_close(torch.ops.octopus.affine(batch.values, batch.offsets, s, s, "plan", 16,
                                                        shifted.clone()), batch.values + 1)


def empty_offsets_calls(device):
    """Every op that takes offsets, called with an empty offsets tensor (and otherwise sane
    arguments): the name of the offsets argument."""
    e = torch.zeros(0, dtype=I64, device=device)
    v = torch.zeros(0, device=device)
    none = torch.zeros(0, device=device)
    sizes2, sizes3 = torch.zeros(0, 2, dtype=I64, device=device), torch.zeros(0, 3, dtype=I64, device=device)
    boxes = torch.zeros(0, 5, dtype=I64, device=device)
    good = torch.zeros(1, dtype=I64, device=device)
    ops = torch.ops.octopus
    return {
        "affine": lambda: ops.affine(v, e, none, none),
        "pointwise": lambda: ops.pointwise(v, e, "clamp", none, none),
        "plan": lambda: ops.plan(e, 0, 4096),
        "lookup_table": lambda: ops.lookup_table(e, 0),
        "validate_layout": lambda: ops.validate_layout(e, None, 0),
        "item_stats": lambda: ops.item_stats(v, e, 0, 4096, None, True),
        "to_padded": lambda: ops.to_padded(v, e, sizes2, [2, 2], 0.0, True),
        "from_padded": lambda: ops.from_padded(torch.zeros(0, 2, 2, device=device), e, sizes2, 0),
        "stencil3x3": lambda: ops.stencil3x3(v, e, sizes2, torch.ones(1, 9, device=device)),
        "stencil3x3_backward": lambda: ops.stencil3x3_backward(v, e, sizes2, torch.ones(1, 9, device=device)),
        "crop_resize": lambda: ops.crop_resize(v, e, sizes3, boxes, 1, 2, 2),
        "crop_resize_backward": lambda: ops.crop_resize_backward(torch.zeros(0, 1, 2, 2, device=device), v, e, sizes3,
                                                                 boxes),
        "crop_resize_ragged": lambda: ops.crop_resize_ragged(v, e, sizes3, boxes, 1, good, sizes3, 0),
        "crop_resize_ragged out_offsets": lambda: ops.crop_resize_ragged(v, good, sizes3, boxes, 1, e, sizes3, 0),
        "crop_resize_ragged_backward": lambda: ops.crop_resize_ragged_backward(v, v, e, sizes3, boxes, 1, good,
                                                                               sizes3),
        "octopus.affine": lambda: octopus.affine(v, 2.0, offsets=e),
        "octopus.plan": lambda: octopus.plan(e, num_values=0),
        "RaggedBatch": lambda: octopus.RaggedBatch(v, e, sizes2),
    }


def test_empty_offsets_are_named(device):
    for name, call in empty_offsets_calls(device).items():
        with pytest.raises(ValueError) as info:
            call()
        expected = EMPTY_OFFSETS.replace("offsets", "out_offsets") if "out_offsets" in name else EMPTY_OFFSETS
        assert info.match(expected), f"{name}: {info.value}"


def test_a_parameter_on_the_meta_device_is_refused_naming_it():
    """A meta tensor among CPU ones sends the call to the fake implementation, which used to
    return an uninitialized CPU tensor (errors up to 4.6e11): it checks devices as the kernels do."""
    batch = octopus.RaggedBatch.from_tensors([torch.rand(3, 4, 5), torch.rand(3, 2, 2)])
    meta2, meta3 = torch.ones(2, device="meta"), torch.ones(3, device="meta")
    calls = {
        "scale": lambda: octopus.affine(batch, meta2),
        "bias": lambda: octopus.affine(batch, 2.0, meta2),
        "lo": lambda: octopus.clamp(batch, meta2, 1.0),
        "weight": lambda: torch.ops.octopus.stencil3x3(batch.values, batch.offsets, batch.sizes,
                                                       torch.ones(3, 9, device="meta"), "replicate", "plan", 0, None,
                                                       True),
        "mean": lambda: torch.ops.octopus.crop_resize(batch.values, batch.offsets, batch.sizes,
                                                      torch.tensor([[0, 0, 0, 2, 2]]), 3, 4, 4, 1.0, meta3, None, True),
        "offsets": lambda: torch.ops.octopus.affine(batch.values, batch.offsets.to("meta"), torch.ones(2),
                                                    torch.zeros(2), "plan", 0, None, True),
    }
    for name, call in calls.items():
        with pytest.raises(ValueError, match=rf"^{name} must be on the device of values \(cpu\), got meta$"):
            call()

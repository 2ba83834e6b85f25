"""RaggedBatch: construction, conversions, layout validation."""

import pytest
import torch

import octopus
from conftest import random_batch


def test_from_tensors_layout(device):
    items = [torch.randn(3, 4, 5), torch.randn(3, 2, 7), torch.randn(3, 0, 1)]
    batch = octopus.RaggedBatch.from_tensors(items, device=device)
    assert batch.offsets.tolist() == [0, 60, 102, 102]
    assert batch.sizes.tolist() == [[3, 4, 5], [3, 2, 7], [3, 0, 1]]
    assert batch.offsets.dtype == torch.int64 and batch.sizes.dtype == torch.int64
    assert batch.values.device.type == device.type
    for got, want in zip(batch.unbind(), items):
        torch.testing.assert_close(got.cpu(), want)
    assert len(batch) == 3 and batch.item_dim == 3


def test_one_d_items_and_empty_list(device):
    batch = octopus.RaggedBatch.from_tensors([torch.arange(3.0), torch.arange(0.0), torch.arange(2.0)], device=device)
    assert batch.sizes.tolist() == [[3], [0], [2]]
    empty = octopus.RaggedBatch.from_tensors([], device=device, dtype=torch.float16, item_dim=2)
    assert len(empty) == 0 and empty.sizes.shape == (0, 2) and empty.unbind() == []
    assert empty.to_padded().shape == (0, 0, 0)


def test_to_padded(device):
    items = [torch.randn(2, 3), torch.randn(4, 1), torch.randn(0, 5)]
    batch = octopus.RaggedBatch.from_tensors(items, device=device)
    padded = batch.to_padded(pad_value=-1.0)
    assert padded.shape == (3, 4, 5)
    ref = torch.full((3, 4, 5), -1.0)
    for i, t in enumerate(items):
        ref[i, :t.shape[0], :t.shape[1]] = t
    torch.testing.assert_close(padded.cpu(), ref)
    cropped = batch.to_padded(max_size=(3, 2))
    torch.testing.assert_close(cropped.cpu(), ref[:, :3, :2].masked_fill(ref[:, :3, :2] == -1, 0))


def test_nested_jagged_round_trip_is_zero_copy(device):
    nt = torch.nested.nested_tensor([torch.randn(3, 4), torch.randn(5, 4), torch.randn(0, 4)],
                                    layout=torch.jagged, device=device)
    batch = octopus.RaggedBatch.from_nested(nt)
    assert batch.values.data_ptr() == nt.values().data_ptr()
    assert batch.sizes.tolist() == [[3, 4], [5, 4], [0, 4]]
    assert batch.offsets.tolist() == [0, 12, 32, 32]
    back = batch.to_nested()
    assert back.layout == torch.jagged and back.values().data_ptr() == batch.values.data_ptr()
    for a, b in zip(back.unbind(), nt.unbind()):
        torch.testing.assert_close(a, b)


def test_nested_jagged_items_of_zero_width(device):
    # Rows of no elements: the jagged tensor still has 5 + 2 rows (it once failed to view 0 values as [-1, 0]).
    batch = octopus.RaggedBatch.from_tensors([torch.zeros(5, 0), torch.zeros(2, 0)], device=device)
    nt = batch.to_nested()
    assert nt.layout == torch.jagged and [tuple(t.shape) for t in nt.unbind()] == [(5, 0), (2, 0)]
    back = octopus.RaggedBatch.from_nested(nt)
    assert back.item_shapes() == [(5, 0), (2, 0)] and back.offsets.tolist() == [0, 0, 0]


def test_nested_strided(device):
    items = [torch.randn(2, 3, 4), torch.randn(2, 5, 6)]
    nt = torch.nested.nested_tensor(items, layout=torch.strided, device=device)
    batch = octopus.RaggedBatch.from_nested(nt)
    assert batch.sizes.tolist() == [[2, 3, 4], [2, 5, 6]]
    for got, want in zip(batch.unbind(), items):
        torch.testing.assert_close(got.cpu(), want)
    back = batch.to_nested()  # images differ in two dimensions: strided
    assert back.layout == torch.strided
    for got, want in zip(back.unbind(), items):
        torch.testing.assert_close(got.cpu(), want)
    with pytest.raises(ValueError, match="jagged"):
        batch.to_nested(layout=torch.jagged)


def test_offsets_past_2_pow_31_are_representable():
    # Layout only: a batch whose offsets exceed int32, checked without allocating the data.
    n = (1 << 31) + 10
    offsets = torch.tensor([0, 10, n])
    torch.ops.octopus.validate_layout(offsets, torch.tensor([[10], [1 << 31]]), n)
    plan = torch.ops.octopus.plan(offsets, n, 1 << 20)
    item, begin, end, run = octopus.plan_blocks(plan)
    assert int(end[-1]) == n and int(item[-1]) == 1
    assert run.tolist()[0] and not run[1:].any()  # the 10-element item is a run of its own


class TestBadInput:
    def test_offsets_dtype_and_shape(self):
        v = torch.randn(5)
        with pytest.raises(TypeError, match="offsets must be .*int64"):
            octopus.RaggedBatch(v, torch.tensor([0, 5], dtype=torch.int32), torch.tensor([[5]]))
        with pytest.raises(TypeError, match="offsets must be a 1-D int64"):
            octopus.RaggedBatch(v, torch.tensor([[0, 5]]), torch.tensor([[5]]))
        with pytest.raises(TypeError, match="offsets must be int64"):
            torch.ops.octopus.affine(v, torch.tensor([0, 5], dtype=torch.int32), torch.ones(1), torch.ones(1))
        with pytest.raises(ValueError, match="offsets must be 1-D"):
            torch.ops.octopus.affine(v, torch.tensor([[0, 5]]), torch.ones(1), torch.ones(1))

    @pytest.mark.parametrize("offsets, match", [
        ([1, 5], r"offsets\[0\] must be 0"),
        ([0, 4, 2, 5], "non-decreasing"),
        ([0, 4], r"number of values \(5\)"),
    ])
    def test_offsets_contents(self, device, offsets, match):
        v = torch.randn(5, device=device)
        o = torch.tensor(offsets, device=device)
        m = len(offsets) - 1
        with pytest.raises(ValueError, match=match):
            octopus.RaggedBatch(v, o, torch.ones(m, 1, dtype=torch.int64, device=device))
        with pytest.raises(ValueError, match=match):
            octopus.affine(v, torch.ones(m, device=device), offsets=o)

    def test_sizes_disagree_with_offsets(self, device):
        with pytest.raises(ValueError, match=r"sizes\[1\] = \(2, 3\) has 6 elements"):
            octopus.RaggedBatch(torch.randn(9, device=device), torch.tensor([0, 4, 9], device=device),
                                torch.tensor([[2, 2], [2, 3]], device=device))
        with pytest.raises(ValueError, match="negative"):
            octopus.RaggedBatch(torch.randn(4, device=device), torch.tensor([0, 4], device=device),
                                torch.tensor([[-2, -2]], device=device))
        with pytest.raises(ValueError, match="num_items"):
            octopus.RaggedBatch(torch.randn(4, device=device), torch.tensor([0, 4], device=device),
                                torch.tensor([[4], [0]], device=device))

    def test_scale_bias_wrong_shape_dtype(self, device):
        batch = random_batch([(4,), (6,)], device)
        with pytest.raises(ValueError, match="scale must have shape"):
            torch.ops.octopus.affine(batch.values, batch.offsets, torch.ones(3, device=device), torch.ones(3, device=device))
        with pytest.raises(ValueError, match="bias must have shape"):
            torch.ops.octopus.affine(batch.values, batch.offsets, torch.ones(2, device=device), torch.ones(5, device=device))
        with pytest.raises(ValueError, match="bias must have the same shape as scale"):
            torch.ops.octopus.affine(batch.values, batch.offsets, torch.ones(2, 2, device=device), torch.ones(2, device=device))
        with pytest.raises(TypeError, match="scale must be Float"):
            torch.ops.octopus.affine(batch.values, batch.offsets, torch.ones(2, device=device, dtype=torch.float64),
                                     torch.ones(2, device=device))
        with pytest.raises(ValueError, match="item 1 has 6 elements, which is not a multiple of 4"):
            torch.ops.octopus.affine(torch.randn(10, device=device), torch.tensor([0, 4, 10], device=device),
                                     torch.ones(2, 4, device=device), torch.ones(2, 4, device=device))
        with pytest.raises(TypeError, match="scale must be a floating-point"):
            octopus.affine(batch, torch.ones(2, dtype=torch.int64, device=device))

    def test_values_dtype_and_rank(self):
        with pytest.raises(TypeError, match="values must be float32, float64, float16, bfloat16 or uint8"):
            torch.ops.octopus.affine(torch.ones(4, dtype=torch.int32), torch.tensor([0, 4]), torch.ones(1), torch.ones(1))
        with pytest.raises(ValueError, match="values must be 1-D"):
            torch.ops.octopus.affine(torch.ones(2, 2), torch.tensor([0, 4]), torch.ones(1), torch.ones(1))

    def test_unknown_strategy_and_bad_block_size(self):
        batch = random_batch([(4,)], "cpu")
        with pytest.raises(ValueError, match="strategy must be one of"):
            octopus.affine(batch, 1.0, strategy="magic")
        with pytest.raises(ValueError, match="strategy must be one of"):
            torch.ops.octopus.affine(batch.values, batch.offsets, torch.ones(1), torch.ones(1), "magic")
        with pytest.raises(ValueError, match="block_elems"):
            torch.ops.octopus.affine(batch.values, batch.offsets, torch.ones(1), torch.ones(1), "plan", 100)

    def test_wrong_metadata(self):
        batch = random_batch([(40,), (8,)], "cpu")
        s = torch.ones(2)
        with pytest.raises(ValueError, match="metadata for strategy 'plan'"):
            torch.ops.octopus.affine(batch.values, batch.offsets, s, s, "plan", 16, batch.plan(32))
        with pytest.raises(ValueError, match="uses no metadata"):
            torch.ops.octopus.affine(batch.values, batch.offsets, s, s, "search", 16, batch.plan(16))

    def test_from_tensors_mixed(self):
        with pytest.raises(ValueError, match="same number of dimensions"):
            octopus.RaggedBatch.from_tensors([torch.ones(2), torch.ones(2, 2)])
        with pytest.raises(TypeError, match="one dtype"):
            octopus.RaggedBatch.from_tensors([torch.ones(2), torch.ones(2, dtype=torch.float64)])
        with pytest.raises(ValueError, match="0-d"):
            octopus.RaggedBatch.from_tensors([torch.tensor(1.0)])


def test_mixed_devices_rejected():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA for a second device")
    batch = random_batch([(4,)], "cuda")
    with pytest.raises(ValueError, match="offsets must be on the same device"):
        torch.ops.octopus.affine(batch.values, batch.offsets.cpu(), torch.ones(1, device="cuda"),
                                 torch.ones(1, device="cuda"))
    with pytest.raises(ValueError, match="scale must be on the values' device"):
        torch.ops.octopus.affine(batch.values, batch.offsets, torch.ones(1), torch.ones(1, device="cuda"))
    with pytest.raises(ValueError, match="offsets must be on the values' device"):
        octopus.RaggedBatch(batch.values, batch.offsets.cpu(), batch.sizes)


@pytest.mark.parametrize("start,stop", [(0, 0), (0, 5), (2, 4), (4, 5), (5, 5), (1, 3)])
def test_narrow_items_is_a_view_of_the_items(device, start, stop):
    items = [torch.rand(2, h, w, device=device) for h, w in [(3, 4), (0, 5), (1, 1), (7, 2), (2, 9)]]
    batch = octopus.RaggedBatch.from_tensors(items)
    part = batch.narrow_items(start, stop)
    assert len(part) == stop - start
    for got, want in zip(part.unbind(), items[start:stop]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert part.offsets.device == batch.device and int(part.offsets[0]) == 0
    torch.ops.octopus.validate_layout(part.offsets, part.sizes, part.numel())
    if part.numel():
        part.values.fill_(-1.0)  # a view: the batch sees it
        assert batch.values[int(batch.offsets[start]):int(batch.offsets[stop])].eq(-1).all()


def test_narrow_items_of_every_item_is_the_batch_itself(device):
    batch = octopus.RaggedBatch.from_tensors([torch.rand(3, device=device), torch.rand(0, device=device)])
    plan = batch.plan()
    assert batch.narrow_items(0, 2) is batch and batch.narrow_items(0, 2).plan() is plan
    assert batch.narrow_items(0, 1) is not batch and batch.narrow_items(0, 1).numel() == 3


@pytest.mark.parametrize("start,stop", [(-1, 2), (3, 2), (0, 6), (0.0, 1)])
def test_narrow_items_rejects_bad_ranges(start, stop):
    batch = octopus.RaggedBatch.from_tensors([torch.rand(3)] * 5)
    with pytest.raises(ValueError, match="narrow_items"):
        batch.narrow_items(start, stop)

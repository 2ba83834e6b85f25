"""to_padded / from_padded against per-item references built from unbind()."""

import pytest
import torch

import octopus
from conftest import HAS_CUDA, random_batch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int32, torch.int64,
          torch.bool]


def make(shapes, device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    items = []
    for s in shapes:
        if dtype == torch.bool:
            items.append(torch.rand(s, generator=g) > 0.5)
        elif dtype.is_floating_point:
            items.append(torch.randn(s, generator=g, dtype=torch.float64).to(dtype))
        else:
            items.append(torch.randint(0, 200, s, generator=g).to(dtype))
    return octopus.RaggedBatch.from_tensors(items, device=device, dtype=dtype, item_dim=len(shapes[0]))


def padded_reference(batch, pad, max_shape):
    out = torch.full((len(batch), *max_shape), pad, dtype=batch.dtype)
    for i, item in enumerate(batch.cpu().unbind()):
        crop = tuple(slice(0, min(e, m)) for e, m in zip(item.shape, max_shape))
        out[i][crop] = item[crop]
    return out


def random_shapes(count, dims, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(lo, hi, (dims,), generator=g).tolist()) for _ in range(count)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_to_padded_and_back(device, dtype, dims):
    shapes = random_shapes(17, dims, 0, {1: 3000, 2: 60, 3: 14}[dims], seed=dims)
    batch = make(shapes, device, dtype)
    pad = 7 if dtype != torch.bool else 1
    dense = batch.to_padded(pad)
    max_shape = [max(s[k] for s in shapes) for k in range(dims)]
    assert dense.shape == (17, *max_shape) and dense.dtype == dtype and dense.device == batch.device
    assert torch.equal(dense.cpu(), padded_reference(batch, pad, max_shape))
    for strategy in octopus.STRATEGIES:
        back = octopus.from_padded(dense, batch.sizes, strategy=strategy, block_elems=64)
        assert torch.equal(back.values, batch.values), strategy
        assert torch.equal(back.offsets, batch.offsets) and torch.equal(back.sizes, batch.sizes)
        # The batch itself as the layout: the same result, the batch's layout and cached plans.
        like = octopus.from_padded(dense, batch, strategy=strategy, block_elems=64)
        assert torch.equal(like.values, batch.values), strategy
        assert like.offsets is batch.offsets and like.sizes is batch.sizes
        assert like.metadata(strategy, 64) is batch.metadata(strategy, 64)


def test_from_padded_like_a_batch_crops_gathers_and_differentiates(device):
    batch = make([(3, 4), (0, 2), (5, 1), (2, 6)], device, torch.float64)
    dense = torch.randn(4, 5, 6, dtype=torch.float64, device=device, requires_grad=True)
    back = octopus.from_padded(dense, batch)
    for item, (h, w), slot in zip(back.unbind(), batch.item_shapes(), dense):
        assert torch.equal(item, slot[:h, :w])
    back.values.sum().backward()
    mask = torch.zeros(4, 5, 6, dtype=torch.float64)
    for i, (h, w) in enumerate(batch.item_shapes()):
        mask[i, :h, :w] = 1
    assert torch.equal(dense.grad.cpu(), mask)
    # Items larger than the slot: an error with validate, zeros outside the slot without.
    with pytest.raises(ValueError, match="does not fit padded's slot"):
        octopus.from_padded(torch.zeros(4, 4, 6, dtype=torch.float64, device=device), batch)
    cropped = octopus.from_padded(torch.ones(4, 4, 6, dtype=torch.float64, device=device), batch, validate=False)
    assert torch.equal(cropped.unbind()[2].cpu(), torch.tensor([[1.0], [1.0], [1.0], [1.0], [0.0]], dtype=torch.float64))


def test_from_padded_of_many_tiny_and_empty_items(device):
    """20K items of 0-64 elements with runs of empty ones: tiles of hundreds of items, found
    by the warp's search in several rounds, then walked item by item by the gather."""
    g = torch.Generator().manual_seed(4)
    lengths = torch.randint(0, 65, (20_000,), generator=g)
    lengths[3000:3400] = 0
    lengths[torch.randint(0, 20_000, (300,), generator=g)] = 0
    batch = make([(n,) for n in lengths.tolist()], device)
    dense = batch.to_padded(0.0)
    assert torch.equal(dense.cpu(), padded_reference(batch, 0.0, [int(lengths.max())]))
    for strategy in octopus.STRATEGIES:
        for block_elems in (16, 256, 4096):
            back = octopus.from_padded(dense, batch.sizes, strategy=strategy, block_elems=block_elems)
            assert torch.equal(back.values, batch.values), (strategy, block_elems)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
@pytest.mark.parametrize("shapes", [
    [(90, 77), (1, 1), (0, 9), (45, 50), (89, 3)],  # slots of several 4096-element chunks, odd widths
    [(3, 40, 37), (1, 2, 35), (2, 39, 1)],
    [(10_001,), (4097,), (1,), (0,)],
    [(7, 1024), (3, 1023), (1, 1025)],  # rows around the vector and chunk sizes
])
def test_to_padded_wide_and_odd_slots(device, dtype, shapes):
    batch = make(shapes, device, dtype, seed=3)
    max_shape = [max(s[k] for s in shapes) for k in range(len(shapes[0]))]
    assert torch.equal(batch.to_padded(5).cpu(), padded_reference(batch, 5, max_shape))
    cropped = [max(1, e - 3) for e in max_shape]  # larger items cropped to a smaller slot
    assert torch.equal(octopus.to_padded(batch, 5, cropped).cpu(), padded_reference(batch, 5, cropped))


def test_to_padded_of_a_view(device):
    # Values that start one element into their storage: no item starts on a 16-byte boundary.
    batch = make([(5, 13), (6, 6), (2, 17)], device)
    storage = torch.empty(batch.numel() + 1, device=device)
    values = storage[1:]
    values.copy_(batch.values)
    dense = torch.ops.octopus.to_padded(values, batch.offsets, batch.sizes, [6, 17], -2.0, True)
    assert torch.equal(dense.cpu(), padded_reference(batch, -2.0, [6, 17]))


@pytest.mark.parametrize("max_size", [(5, 9), (0, 4), (100, 1), (1, 1)])
def test_to_padded_crops_to_max_size(device, max_size):
    batch = make([(3, 12), (0, 5), (20, 2), (7, 7)], device)
    dense = octopus.to_padded(batch, -1.5, max_size)
    assert torch.equal(dense.cpu(), padded_reference(batch, -1.5, list(max_size)))


def test_empty_batch_one_item_huge_item(device):
    empty = octopus.RaggedBatch.from_tensors([], device=device, item_dim=2)
    assert octopus.to_padded(empty).shape == (0, 0, 0)
    all_empty = make([(0, 3), (4, 0)], device)
    assert torch.equal(all_empty.to_padded(2.0).cpu(), torch.full((2, 4, 3), 2.0))
    one = make([(1, 1)], device)
    assert torch.equal(one.to_padded().cpu(), one.values.cpu().view(1, 1, 1))
    huge = make([(3,), (1_500_007,), (0,)], device)
    dense = huge.to_padded(0.5)
    assert torch.equal(dense.cpu(), padded_reference(huge, 0.5, [1_500_007]))
    assert torch.equal(octopus.from_padded(dense, huge.sizes).values, huge.values)


def cropped_reference(padded, shapes):
    """Item i of `shapes` read from padded[i]: its corner inside the slot, 0 outside."""
    items = []
    for i, shape in enumerate(shapes):
        item = torch.zeros(shape, dtype=padded.dtype)
        crop = tuple(slice(0, min(e, m)) for e, m in zip(shape, padded.shape[1:]))
        item[crop] = padded[i].cpu()[crop]
        items.append(item.reshape(-1))
    return torch.cat(items) if items else torch.zeros(0, dtype=padded.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
@pytest.mark.parametrize("shapes, slot", [
    ([(90, 77), (1, 1), (0, 9), (45, 50), (89, 3), (7, 300)], (40, 60)),  # rows and columns past the slot
    ([(3, 40, 37), (5, 2, 35), (2, 39, 1), (1, 1, 70)], (2, 30, 36)),  # every dimension past it somewhere
    ([(10_001,), (4097,), (1,), (0,), (33,)], (5000,)),
    ([(2, 3, 4, 5), (3, 1, 6, 2)], (2, 2, 5, 5)),  # four dimensions: carries through three outer ones
])
def test_from_padded_gathers_and_crops(device, dtype, shapes, slot):
    # Without validation, every strategy (plan and block_search: the GPU's per-run cursor) reads
    # each item's corner inside its slot and 0 outside; runs of 64 elements start anywhere.
    g = torch.Generator().manual_seed(5)
    padded = (torch.randn(len(shapes), *slot, generator=g) * 50).to(dtype).to(device)
    sizes = torch.tensor(shapes, dtype=torch.int64).reshape(len(shapes), len(slot))
    offsets = torch.zeros(len(shapes) + 1, dtype=torch.int64)
    offsets[1:] = sizes.prod(1).cumsum(0)
    expected = cropped_reference(padded, shapes)
    for strategy in octopus.STRATEGIES:
        for block in (64, 4096):
            meta = octopus.RaggedBatch(torch.empty(int(offsets[-1]), device=device, dtype=dtype), offsets.to(device),
                                       sizes.to(device)).metadata(strategy, block)
            out = torch.ops.octopus.from_padded(padded, offsets.to(device), sizes.to(device), int(offsets[-1]),
                                                strategy, block, meta, False)
            assert torch.equal(out.cpu(), expected), (strategy, block)


def test_from_padded_of_a_user_tensor(device):
    dense = torch.arange(2 * 4 * 5, dtype=torch.float32, device=device).view(2, 4, 5)
    sizes = [[2, 3], [4, 5]]
    batch = octopus.from_padded(dense, sizes)
    items = batch.unbind()
    assert torch.equal(items[0], dense[0, :2, :3]) and torch.equal(items[1], dense[1])


def test_gradients(device):
    batch = make([(3, 4), (0, 2), (5, 1), (2, 6)], device, torch.float64)
    values = batch.values.clone().requires_grad_()
    args = (batch.offsets, batch.sizes)
    torch.autograd.gradcheck(lambda v: torch.ops.octopus.to_padded(v, *args, [4, 5], 0.5, True), (values,))
    dense = torch.randn(4, 5, 6, dtype=torch.float64, device=device, requires_grad=True)
    torch.autograd.gradcheck(
        lambda p: torch.ops.octopus.from_padded(p, *args, batch.numel(), "plan", 0, None, True), (dense,))


@pytest.mark.parametrize("op", ["to_padded", "from_padded"])
def test_opcheck(device, op):
    batch = make([(3, 4), (0, 2), (5, 1)], device)
    if op == "to_padded":
        args = (batch.values, batch.offsets, batch.sizes, [5, 4], 1.0, True)
    else:
        args = (torch.randn(3, 6, 4, device=device), batch.offsets, batch.sizes, batch.numel(), "block_search", 0,
                None, True)
    torch.library.opcheck(getattr(torch.ops.octopus, op).default, args)


def test_torch_compile(device):
    batch = make([(3, 4), (0, 2), (5, 1)], device)

    @torch.compile(fullgraph=True, backend="aot_eager" if device.type == "cpu" else "inductor")
    def f(values, offsets, sizes):
        dense = torch.ops.octopus.to_padded(values, offsets, sizes, [5, 4], 0.0, False)
        return torch.ops.octopus.from_padded(dense * 2, offsets, sizes, 17, "block_search", 0, None, False)

    torch.testing.assert_close(f(batch.values, batch.offsets, batch.sizes), batch.values * 2)


def test_bad_input(device):
    batch = make([(3, 4), (2, 2)], device)
    v, o, s = batch.values, batch.offsets, batch.sizes
    with pytest.raises(ValueError, match="max_shape must have one extent per item dimension"):
        torch.ops.octopus.to_padded(v, o, s, [4], 0.0, True)
    with pytest.raises(ValueError, match="max_shape must be non-negative"):
        torch.ops.octopus.to_padded(v, o, s, [4, -1], 0.0, True)
    with pytest.raises(ValueError, match="sizes must have shape"):
        torch.ops.octopus.to_padded(v, o, s[:1], [4, 4], 0.0, True)
    with pytest.raises(ValueError, match="sizes"):
        torch.ops.octopus.to_padded(v, o, torch.tensor([[3, 4], [2, 3]], device=device), [4, 4], 0.0, True)
    with pytest.raises(TypeError, match="values must be"):
        torch.ops.octopus.to_padded(v.to(torch.complex64), o, s, [4, 4], 0.0, True)
    with pytest.raises(ValueError, match="does not fit padded's slot"):
        octopus.from_padded(torch.zeros(2, 2, 4, device=device), s)
    with pytest.raises(ValueError, match="padded must have shape"):
        torch.ops.octopus.from_padded(torch.zeros(3, 3, 4, device=device), o, s, 16, "plan", 0, None, True)
    with pytest.raises(ValueError, match="sizes must have shape"):
        octopus.from_padded(torch.zeros(2, 3, 4, device=device), [[1, 1]])
    with pytest.raises(ValueError, match="non-negative"):
        octopus.from_padded(torch.zeros(2, 3, 4, device=device), [[1, 1], [-1, 2]])
    with pytest.raises(ValueError, match="strategy must be one of"):
        octopus.from_padded(torch.zeros(2, 4, 4, device=device), s, strategy="walk")
    with pytest.raises(ValueError, match=r"sizes: the batch has 2 items of 2 dimensions, so padded must be \[2, \*slot\]"):
        octopus.from_padded(torch.zeros(3, 3, 4, device=device), batch)
    with pytest.raises(ValueError, match="sizes: the batch has 2 items of 2 dimensions"):
        octopus.from_padded(torch.zeros(2, 12, device=device), batch)
    if device.type == "cuda":
        with pytest.raises(ValueError, match="sizes: the batch is on cpu, padded on cuda"):
            octopus.from_padded(torch.zeros(2, 3, 4, device=device), batch.cpu())
    # Without validation an item larger than its slot reads 0 outside it (what to_padded's
    # gradient needs when max_size cropped).
    out = torch.ops.octopus.from_padded(torch.ones(2, 2, 4, device=device), o, s, 16, "search", 0, None, False)
    expected = torch.ones(16)
    expected[8:12] = 0  # item 0's last row
    assert torch.equal(out.cpu(), expected)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_graph_capture():
    batch = random_batch([(3, 40), (0, 2), (50, 10)], "cuda")
    static = batch.values.clone()
    torch.ops.octopus.to_padded(static, batch.offsets, batch.sizes, [50, 40], 0.0, True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dense = torch.ops.octopus.to_padded(static, batch.offsets, batch.sizes, [50, 40], 0.0, True)
        back = torch.ops.octopus.from_padded(dense, batch.offsets, batch.sizes, static.numel(), "block_search", 0,
                                             None, True)
    static.copy_(batch.values * 3)
    graph.replay()
    torch.testing.assert_close(back, batch.values * 3)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_to_padded_unvalidated_layout_never_reads_past_the_values():
    # Item 1 claims 3x3 values from offset 8 of 10: without validation the CUDA kernel reads
    # the two that exist and pads the rest (never an out-of-bounds read).
    values = torch.arange(10, dtype=torch.float32, device="cuda")
    offsets = torch.tensor([0, 8, 10], device="cuda")
    sizes = torch.tensor([[2, 4], [3, 3]], device="cuda")
    dense = torch.ops.octopus.to_padded(values, offsets, sizes, [3, 3], -1.0, False).cpu()
    expected = torch.full((2, 3, 3), -1.0)
    expected[0, :2] = torch.tensor([[0.0, 1, 2], [4, 5, 6]])
    expected[1, 0, :2] = torch.tensor([8.0, 9])
    assert torch.equal(dense, expected)

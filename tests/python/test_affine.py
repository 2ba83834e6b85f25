"""octopus.affine against a float64 per-item reference, every strategy x dtype x form."""

import pytest
import torch

import octopus
from conftest import HAS_CUDA, random_batch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8]
TOL = {torch.float32: 1e-6, torch.float64: 1e-12, torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.uint8: 1e-6}


def reference(batch, scale, bias):
    """float64, item by item, with the planes convention for [M, C] parameters."""
    outs = []
    for i, item in enumerate(batch.unbind()):
        x = item.reshape(-1).double().cpu()
        s, b = scale[i].double().cpu(), bias[i].double().cpu()
        if scale.dim() == 2:
            c = scale.shape[1]
            x = x.view(c, -1)
            outs.append((x * s[:, None] + b[:, None]).reshape(-1))
        else:
            outs.append(x * s + b)
    return torch.cat(outs) if outs else torch.zeros(0, dtype=torch.float64)


def check(batch, scale, bias, strategy, block_elems=None):
    out = octopus.affine(batch, scale, bias, strategy=strategy, block_elems=block_elems)
    expected_dtype = torch.float32 if batch.dtype == torch.uint8 else batch.dtype
    assert out.values.dtype == expected_dtype
    assert out.values.shape == batch.values.shape
    ref = reference(batch, scale, bias)
    got = out.values.double().cpu()
    tol = TOL[batch.dtype]
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol * (1 + ref.abs().max().item() if ref.numel() else 1))
    return out


def params(m, channels, device, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    shape = (m,) if channels is None else (m, channels)
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    return (torch.randn(shape, generator=g, dtype=pdtype).to(device),
            torch.randn(shape, generator=g, dtype=pdtype).to(device))


def mixed_images(m, seed, channels=3):
    g = torch.Generator().manual_seed(seed)
    shapes = []
    for i in range(m):
        h, w = torch.randint(0, 40, (2,), generator=g).tolist()
        if i % 7 == 3:
            h = 0  # empty item
        shapes.append((channels, h, w))
    return shapes


@pytest.mark.parametrize("strategy", octopus.STRATEGIES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_channel", [False, True])
def test_strategies_dtypes_forms(device, strategy, dtype, per_channel):
    shapes = mixed_images(37, seed=3)
    batch = random_batch(shapes, device, dtype)
    scale, bias = params(len(batch), 3 if per_channel else None, device, dtype)
    check(batch, scale, bias, strategy, block_elems=64)


@pytest.mark.parametrize("strategy", octopus.STRATEGIES)
def test_one_d_items_random_lengths_and_block_sizes(device, strategy):
    g = torch.Generator().manual_seed(5)
    lengths = torch.randint(0, 3000, (200,), generator=g).tolist()
    batch = random_batch([(n,) for n in lengths], device)
    scale, bias = params(len(batch), None, device, torch.float32)
    for block_elems in (16, 48, 4096):
        check(batch, scale, bias, strategy, block_elems)


@pytest.mark.parametrize("strategy", octopus.STRATEGIES)
def test_empty_batch_and_all_empty_items(device, strategy):
    empty = octopus.RaggedBatch.from_tensors([], device=device, item_dim=1)
    out = octopus.affine(empty, torch.zeros(0, device=device), torch.zeros(0, device=device), strategy=strategy)
    assert out.values.numel() == 0
    hollow = random_batch([(0,), (0,), (0,)], device)
    check(hollow, *params(3, None, device, torch.float32), strategy)


@pytest.mark.parametrize("strategy", octopus.STRATEGIES)
def test_one_item_and_one_huge_item(device, strategy):
    check(random_batch([(5, 7)], device), *params(1, None, device, torch.float32), strategy)
    n = 3_000_000 if device.type == "cpu" else 40_000_000
    huge = random_batch([(3,), (n,), (11,)], device, seed=2)
    check(huge, *params(3, None, device, torch.float32), strategy)


def one_d_batch_and_reference(lengths, g, device):
    """A 1-D batch of random float32 items of these lengths, per-item parameters, and the
    float64 reference of affine over it."""
    values = torch.randn(int(lengths.sum()), generator=g)
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    batch = octopus.RaggedBatch(values.to(device), offsets.to(device), lengths[:, None].to(device))
    scale, bias = params(len(batch), None, device, torch.float32)
    ids = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    return batch, scale, bias, values.double() * scale.cpu().double()[ids] + bias.cpu().double()[ids]


@pytest.mark.parametrize("strategy", octopus.STRATEGIES)
def test_many_tiny_items(device, strategy):
    g = torch.Generator().manual_seed(9)
    lengths = torch.randint(0, 12, (100_000,), generator=g)
    batch, scale, bias, ref = one_d_batch_and_reference(lengths, g, device)
    out = octopus.affine(batch, scale, bias, strategy=strategy)
    torch.testing.assert_close(out.values.cpu().double(), ref, rtol=1e-6, atol=1e-6)


def dust_giant_tail_lengths(seed, giant):
    """Item lengths of the hard layouts: dust of 0-64 elements with runs of empty items,
    medium items of 300-3000, a few heavy-tailed ones, and one giant item at a random place,
    so tiles hold one item, a few, or hundreds (and the warp's 32-way search takes rounds)."""
    g = torch.Generator().manual_seed(seed)
    dust = torch.randint(0, 65, (20_000,), generator=g)
    dust[torch.randint(0, 20_000, (200,), generator=g)] = 0
    dust[5000:5300] = 0
    medium = torch.randint(300, 3001, (500,), generator=g)
    tail = (40 * (1 - torch.rand(50, generator=g)) ** (-1 / 0.85)).long().clamp(max=giant // 4)
    lengths = torch.cat([dust, medium, tail, torch.tensor([giant])])
    return lengths[torch.randperm(len(lengths), generator=g)]


@pytest.mark.parametrize("strategy", octopus.STRATEGIES)
def test_dust_giant_and_heavy_tail_layouts(device, strategy):
    lengths = dust_giant_tail_lengths(11, 500_000 if device.type == "cpu" else 5_000_000)
    batch, scale, bias, ref = one_d_batch_and_reference(lengths, torch.Generator().manual_seed(12), device)
    for block_elems in (16, 256, 4096, 65536):
        out = octopus.affine(batch, scale, bias, strategy=strategy, block_elems=block_elems)
        torch.testing.assert_close(out.values.cpu().double(), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("strategy", octopus.STRATEGIES)
def test_launches_with_many_units_per_warp(device, strategy):
    # 64-element units over 16M elements on CUDA: more units than the launch has warps (about 5
    # per warp on 132 SMs, more on smaller GPUs), each warp taking its units in turn, items cut
    # across units and a few long ones among the short. A skipped unit shows here: the block
    # the output gets from the caching allocator held NaNs just before (not the previous
    # call's right answer).
    g = torch.Generator().manual_seed(21)
    n = 1_000_000 if device.type == "cpu" else 16_000_000
    lengths = torch.randint(0, 400, (2 * n // 400,), generator=g)
    lengths[torch.randint(0, len(lengths), (10,), generator=g)] = 200_000
    lengths = lengths[:int((lengths.cumsum(0) <= n).sum())]
    batch, scale, bias, ref = one_d_batch_and_reference(lengths, g, device)
    for block_elems in (64, 4096):
        poison = torch.full_like(batch.values, float("nan"))
        del poison  # its block goes back to the caching allocator, for the output to take
        out = octopus.affine(batch, scale, bias, strategy=strategy, block_elems=block_elems)
        torch.testing.assert_close(out.values.cpu().double(), ref, rtol=1e-6, atol=1e-6)


def test_plain_tensor_api_and_defaults(device):
    batch = random_batch([(4,), (6,)], device)
    out = octopus.affine(batch.values, torch.tensor([2.0, 3.0], device=device), offsets=batch.offsets)
    ref = torch.cat([batch.values[:4] * 2, batch.values[4:] * 3])
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(octopus.affine(batch, bias=1.5).values, batch.values + 1.5)


def test_per_channel_parameter_beside_a_default_or_per_item_one(device):
    batch = random_batch(mixed_images(9, seed=4), device)
    scale, bias = params(len(batch), 3, device, torch.float32)
    per_item = torch.randn(len(batch), device=device)
    zeros, ones = torch.zeros_like(scale), torch.ones_like(scale)
    # A number, None or an [M] tensor beside an [M, C] one repeats over the channels.
    for s, b, s_full, b_full in ((scale, None, scale, zeros), (None, bias, ones, bias), (2.0, bias, 2 * ones, bias),
                                 (scale, per_item, scale, per_item[:, None].expand_as(scale))):
        out = octopus.affine(batch, s, b)
        torch.testing.assert_close(out.values.double().cpu(), reference(batch, s_full, b_full), rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="bias"):
        octopus.affine(batch, scale, torch.randn(len(batch), 2, device=device))


def test_non_contiguous_and_misaligned_values(device):
    base = torch.randn(2001, device=device)
    strided = base[::2]  # 1001 elements, stride 2
    offsets = torch.tensor([0, 400, 1001], device=device)
    scale, bias = torch.tensor([2.0, -1.0], device=device), torch.tensor([0.5, 0.25], device=device)
    ids = torch.tensor([0] * 400 + [1] * 601, device=device)
    ref = strided * scale[ids] + bias[ids]
    for strategy in octopus.STRATEGIES:
        torch.testing.assert_close(
            torch.ops.octopus.affine(strided, offsets, scale, bias, strategy), ref)
        misaligned = base[1:1002]  # contiguous, 4 bytes past an aligned address
        torch.testing.assert_close(
            torch.ops.octopus.affine(misaligned, offsets, scale, bias, strategy),
            misaligned * scale[ids] + bias[ids])


def test_opcheck(device):
    batch = random_batch(mixed_images(9, seed=4), device)
    for channels in (None, 3):
        scale, bias = params(len(batch), channels, device, torch.float32)
        for strategy in ("plan", "search"):
            torch.library.opcheck(torch.ops.octopus.affine.default,
                                  (batch.values, batch.offsets, scale, bias, strategy, 0, None, True))
        torch.library.opcheck(torch.ops.octopus.affine.default,
                              (batch.values, batch.offsets, scale, bias, "plan", 4096, batch.plan(), False))
    torch.library.opcheck(torch.ops.octopus.plan.default, (batch.offsets, batch.numel(), 64))
    torch.library.opcheck(torch.ops.octopus.lookup_table.default, (batch.offsets, batch.numel()))


@pytest.mark.parametrize("channels", [None, 2])
def test_gradcheck(device, channels):
    batch = random_batch([(2, 3, 2), (2, 0, 4), (2, 2, 5)], device, torch.float64)
    values = batch.values.clone().requires_grad_()
    scale, bias = params(len(batch), channels, device, torch.float64)
    scale.requires_grad_()
    bias.requires_grad_()
    for strategy in ("plan", "block_search", "lookup"):
        assert torch.autograd.gradcheck(
            lambda v, s, b: torch.ops.octopus.affine(v, batch.offsets, s, b, strategy), (values, scale, bias))


def test_backward_half_precision(device):
    batch = random_batch([(50,), (70,)], device, torch.float16)
    values = batch.values.clone().requires_grad_()
    scale = torch.rand(2, device=device, requires_grad=True)
    bias = torch.rand(2, device=device, requires_grad=True)
    out = torch.ops.octopus.affine(values, batch.offsets, scale, bias)
    out.float().sum().backward()
    assert values.grad.dtype == torch.float16
    torch.testing.assert_close(values.grad[:50].float(), scale[0].detach().expand(50).half().float())
    torch.testing.assert_close(scale.grad, torch.stack([values[:50].float().sum(), values[50:].float().sum()]).detach(),
                               rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(bias.grad, torch.tensor([50.0, 70.0], device=device))


def test_torch_compile_fullgraph(device):
    batch = random_batch(mixed_images(6, seed=8), device)
    scale, bias = params(len(batch), 3, device, torch.float32)

    @torch.compile(fullgraph=True, backend="aot_eager" if device.type == "cpu" else "inductor")
    def f(values, offsets, s, b):
        return torch.ops.octopus.affine(values, offsets, s, b, "plan", 0, None, False).relu() * 2

    got = f(batch.values, batch.offsets, scale, bias)
    ref = torch.ops.octopus.affine(batch.values, batch.offsets, scale, bias).relu() * 2
    torch.testing.assert_close(got, ref)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("strategy", octopus.STRATEGIES)
def test_cuda_graph_capture_and_replay(strategy):
    batch = random_batch(mixed_images(50, seed=11), torch.device("cuda"))
    scale, bias = params(len(batch), None, "cuda", torch.float32)
    values = batch.values.clone()
    meta = batch.metadata(strategy)  # built before capture: a host-built plan cannot be captured
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up outside capture
        torch.ops.octopus.affine(values, batch.offsets, scale, bias, strategy, 0, meta, True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.octopus.affine(values, batch.offsets, scale, bias, strategy, 0, meta, True)
    for seed in range(3):
        values.copy_(torch.randn(values.shape, generator=torch.Generator().manual_seed(seed)).cuda())
        graph.replay()
        torch.cuda.synchronize()
        ids = torch.repeat_interleave(torch.arange(len(batch), device="cuda"), batch.offsets.diff())
        torch.testing.assert_close(out, values * scale[ids] + bias[ids])


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_graph_captures_device_plan_build():
    batch = random_batch(mixed_images(30, seed=12), torch.device("cuda"))
    scale, bias = params(len(batch), None, "cuda", torch.float32)
    torch.ops.octopus.affine(batch.values, batch.offsets, scale, bias)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.octopus.affine(batch.values, batch.offsets, scale, bias)  # plan built inside
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.ops.octopus.affine(batch.values, batch.offsets, scale, bias, "search"))


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_more_than_2_pow_31_elements():
    n = (1 << 31) + 4099
    values = torch.empty(n, dtype=torch.uint8, device="cuda")
    values.random_(0, 256)
    cut = (1 << 31) - 5
    offsets = torch.tensor([0, 17, cut, n], device="cuda")
    scale = torch.tensor([1.0, 2.0, 3.0], device="cuda")
    bias = torch.tensor([0.0, 0.5, -1.0], device="cuda")
    for strategy in ("plan", "block_search", "search"):
        out = torch.ops.octopus.affine(values, offsets, scale, bias, strategy)
        for lo, hi, i in ((0, 17, 0), (cut - 1000, cut, 1), (cut, cut + 1000, 2), (n - 1000, n, 2)):
            torch.testing.assert_close(out[lo:hi], values[lo:hi].float() * scale[i] + bias[i])
        del out

"""3x3 stencils against F.conv2d (groups=C) of each item padded by one pixel, in float64."""

import pytest
import torch
import torch.nn.functional as F

import octopus
from conftest import random_batch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8]
# 1x1, single rows and columns, 2x2, odd widths (vectors that straddle rows), items larger
# than one plan block, and an empty item.
SHAPES_2D = [(1, 1), (1, 7), (9, 1), (2, 2), (5, 3), (0, 4), (37, 41), (130, 97), (3, 6)]


def reference(batch, weight, border):
    """weight [C, 9] float64; every item through conv2d, in float64 on the CPU."""
    outs = []
    for item in batch.cpu().unbind():
        img = item.double() if item.dim() == 3 else item.double()[None]
        if img.numel() == 0:
            outs.append(torch.zeros(item.shape, dtype=torch.float64))
            continue
        c = img.shape[0]
        mode = "replicate" if border == "replicate" else "constant"
        padded = F.pad(img[None], (1, 1, 1, 1), mode=mode)
        out = F.conv2d(padded, weight.double().cpu().view(c, 1, 3, 3), groups=c)[0]
        outs.append(out.view(item.shape))
    return torch.cat([o.reshape(-1) for o in outs]) if outs else torch.zeros(0, dtype=torch.float64)


def tolerance(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return dict(rtol=2e-2, atol=3e-2)
    if dtype == torch.uint8:
        return dict(rtol=1e-5, atol=1e-3)
    return dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("border", ["replicate", "zero"])
def test_blurs_every_dtype_and_strategy(device, dtype, border):
    batch = random_batch(SHAPES_2D, device, dtype)
    for name, fn, w in [("box", octopus.box_blur, torch.full((1, 9), 1 / 9)),
                        ("gaussian", octopus.gaussian_blur, torch.tensor([[1, 2, 1, 2, 4, 2, 1, 2, 1]]) / 16)]:
        want = reference(batch, w, border)
        for strategy in octopus.STRATEGIES:
            got = fn(batch, border=border, strategy=strategy, block_elems=1024)
            assert got.dtype == (torch.float32 if dtype == torch.uint8 else dtype)
            assert got.item_shapes() == batch.item_shapes()
            torch.testing.assert_close(got.values.cpu().double(), want, **tolerance(dtype),
                                       msg=lambda m: f"{name} {strategy}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
@pytest.mark.parametrize("border", ["replicate", "zero"])
def test_depthwise_per_channel(device, dtype, border):
    shapes = [(3, h, w) for h, w in [(1, 1), (8, 13), (0, 5), (64, 70), (2, 9), (17, 1)]]
    batch = random_batch(shapes, device, dtype, seed=3)
    weight = torch.randn(3, 1, 3, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    want = reference(batch, weight.view(3, 9), border)
    for strategy in ("plan", "block_search", "search"):
        got = octopus.depthwise_conv3x3(batch, weight.to(device), border=border, strategy=strategy)
        torch.testing.assert_close(got.values.cpu().double(), want, **tolerance(dtype))


def test_matches_conv2d_default_zero_padding(device):
    """depthwise_conv3x3's default is conv2d's padding=1."""
    items = [torch.randn(2, 11, 7, dtype=torch.float64), torch.randn(2, 4, 30, dtype=torch.float64)]
    batch = octopus.RaggedBatch.from_tensors(items, device=device)
    weight = torch.randn(2, 1, 3, 3, dtype=torch.float64)
    got = octopus.depthwise_conv3x3(batch, weight.to(device)).cpu().unbind()
    for g, item in zip(got, items):
        torch.testing.assert_close(g, F.conv2d(item[None], weight, padding=1, groups=2)[0])


def test_one_huge_item_and_many_tiny(device):
    huge = random_batch([(1500, 1333)], device, seed=5)
    torch.testing.assert_close(octopus.box_blur(huge).values.cpu().double(),
                               reference(huge, torch.full((1, 9), 1 / 9), "replicate"), rtol=1e-5, atol=1e-5)
    g = torch.Generator().manual_seed(6)
    tiny = random_batch([tuple(torch.randint(1, 5, (2,), generator=g).tolist()) for _ in range(20000)], device)
    w = torch.randn(1, 9, generator=g)
    torch.testing.assert_close(octopus.stencil3x3(tiny, w.view(3, 3), border="zero").values.cpu().double(),
                               reference(tiny, w, "zero"), rtol=1e-5, atol=1e-5)


def test_empty_batch(device):
    batch = octopus.RaggedBatch.from_tensors([], device=device, item_dim=2)
    assert octopus.box_blur(batch).numel() == 0
    # No items say how many channels there are: any per-channel weight goes (and gets a zero gradient).
    images = octopus.RaggedBatch.from_tensors([], device=device, item_dim=3)
    weight = torch.randn(4, 1, 3, 3, device=device, requires_grad=True)
    out = octopus.depthwise_conv3x3(images, weight)
    assert out.numel() == 0 and len(out) == 0
    out.values.sum().backward()
    assert weight.grad.shape == weight.shape and not weight.grad.any()


@pytest.mark.parametrize("border", ["replicate", "zero"])
def test_gradients(device, border):
    batch = random_batch([(3, 5, 4), (3, 1, 1), (3, 2, 7)], device, torch.float64, seed=7)
    weight = torch.randn(3, 9, dtype=torch.float64, device=device)
    values = batch.values.clone().requires_grad_()
    weight.requires_grad_()
    torch.autograd.gradcheck(
        lambda v, w: torch.ops.octopus.stencil3x3(v, batch.offsets, batch.sizes, w, border, "plan", 0, None, True),
        (values, weight))
    torch.autograd.gradcheck(
        lambda v, w: torch.ops.octopus.stencil3x3(v, batch.offsets, batch.sizes, w, border, "search", 0, None, True),
        (values, weight))


def test_gradient_through_the_python_api(device):
    batch = random_batch([(6, 5), (2, 3)], device, torch.float32, seed=8)
    values = batch.values.clone().requires_grad_()
    out = octopus.gaussian_blur(batch.with_values(values))
    out.values.square().sum().backward()
    ref_values = batch.values.detach().cpu().double().requires_grad_()
    ref = reference(batch.with_values(values.detach()).cpu(), torch.tensor([[1, 2, 1, 2, 4, 2, 1, 2, 1]]) / 16,
                    "replicate")
    assert values.grad is not None and values.grad.shape == values.shape
    # The gradient of sum(out^2) is 2 * adjoint(out): check it against autograd through conv2d.
    outs = []
    for item in octopus.RaggedBatch(ref_values, batch.offsets.cpu(), batch.sizes.cpu()).unbind():
        padded = F.pad(item[None, None], (1, 1, 1, 1), mode="replicate")
        w = (torch.tensor([1, 2, 1, 2, 4, 2, 1, 2, 1], dtype=torch.float64) / 16).view(1, 1, 3, 3)
        outs.append(F.conv2d(padded, w).reshape(-1))
    torch.cat(outs).square().sum().backward()
    torch.testing.assert_close(torch.cat(outs).detach(), ref)
    torch.testing.assert_close(values.grad.cpu().double(), ref_values.grad, rtol=1e-5, atol=1e-5)


def test_opcheck(device):
    batch = random_batch([(2, 3, 4), (2, 0, 2), (2, 5, 1)], device)
    weight = torch.randn(2, 9, device=device)
    for border in ("replicate", "zero"):
        torch.library.opcheck(torch.ops.octopus.stencil3x3.default,
                              (batch.values, batch.offsets, batch.sizes, weight, border, "plan", 0, None, True))
        torch.library.opcheck(torch.ops.octopus.stencil3x3_backward.default,
                              (batch.values, batch.offsets, batch.sizes, weight, border, "block_search", 0, None,
                               True))


def test_bad_input(device):
    batch = random_batch([(3, 4), (5, 1)], device)
    w = torch.ones(1, 9, device=device)
    with pytest.raises(ValueError, match="border must be"):
        octopus.box_blur(batch, border="reflect")
    with pytest.raises(ValueError, match="border must be 'replicate' or 'zero'"):
        torch.ops.octopus.stencil3x3(batch.values, batch.offsets, batch.sizes, w, "wrap", "plan", 0, None, True)
    with pytest.raises(ValueError, match=r"weight must be \[3, 3\], \[C, 3, 3\]"):
        octopus.stencil3x3(batch, torch.ones(2, 3, 3))
    with pytest.raises(ValueError, match=r"weight must be \[channels, 9\]"):
        torch.ops.octopus.stencil3x3(batch.values, batch.offsets, batch.sizes, torch.ones(1, 3, device=device),
                                     "zero", "plan", 0, None, True)
    with pytest.raises(TypeError, match="weight must be Float for these values, got Double"):
        torch.ops.octopus.stencil3x3(batch.values, batch.offsets, batch.sizes, w.double(), "zero", "plan", 0, None,
                                     True)
    with pytest.raises(ValueError, match="items must be"):
        octopus.box_blur(random_batch([(4,), (5,)], device))
    mixed = random_batch([(3, 4, 4), (2, 4, 4)], device)
    with pytest.raises(ValueError, match="same number of channels"):
        octopus.box_blur(mixed)
    with pytest.raises(ValueError, match="item 1 has 2 channels but weight has 3"):
        torch.ops.octopus.stencil3x3(mixed.values, mixed.offsets, mixed.sizes, torch.ones(3, 9, device=device),
                                     "zero", "plan", 0, None, True)
    with pytest.raises(ValueError, match="sizes must be"):
        torch.ops.octopus.stencil3x3(batch.values, batch.offsets, batch.sizes[:, :1], w, "zero", "plan", 0, None,
                                     True)
    bad_sizes = batch.sizes.clone()
    bad_sizes[0, 0] = 2
    with pytest.raises(ValueError, match="sizes"):
        torch.ops.octopus.stencil3x3(batch.values, batch.offsets, bad_sizes, w, "zero", "plan", 0, None, True)
    with pytest.raises(ValueError, match="strategy"):
        octopus.box_blur(batch, strategy="fastest")


@pytest.mark.parametrize("shapes", [[(5, 7), (1, 1), (0, 3)], [(3, 6, 4), (3, 2, 9)]])
def test_weight_as_numbers_equals_weight_as_a_tensor(device, shapes):
    """Nine numbers (a flat list or tuple: the blurs' fast path), a nested 3x3 list and a
    [3, 3] tensor give the same result, also with the numbers kept from an earlier call."""
    batch = random_batch(shapes, device, torch.float32, seed=21)
    flat = [0.25, -0.5, 1.0, 0.125, 2.0, -1.0, 0.0, 0.75, -0.25]
    want = octopus.stencil3x3(batch, torch.tensor(flat).view(3, 3).to(device)).values
    for weight in (flat, tuple(flat), [flat[0:3], flat[3:6], flat[6:9]], flat):
        torch.testing.assert_close(octopus.stencil3x3(batch, weight).values, want, rtol=0, atol=0)

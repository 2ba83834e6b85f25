"""item_stats and normalize against float64 per-item references computed from unbind()."""

import math

import pytest
import torch

import octopus
from conftest import HAS_CUDA

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8]


def make(shapes, device, dtype=torch.float32, seed=0, loc=0.0):
    g = torch.Generator().manual_seed(seed)
    items = []
    for s in shapes:
        if dtype == torch.uint8:
            items.append(torch.randint(0, 256, s, generator=g, dtype=torch.uint8))
        else:
            items.append((torch.randn(s, generator=g, dtype=torch.float64) * 3 + loc).to(dtype))
    return octopus.RaggedBatch.from_tensors(items, device=device, dtype=dtype, item_dim=len(shapes[0]))


def reference(batch, channels, correction):
    rows = []
    for item in batch.cpu().unbind():
        x = item.double().reshape(max(channels, 1), -1)
        n = x.shape[1]
        if n == 0:
            nan = torch.full((x.shape[0],), math.nan, dtype=torch.float64)
            rows.append(dict(sum=torch.zeros(x.shape[0], dtype=torch.float64), mean=nan, min=nan, max=nan, var=nan))
            continue
        var = x.var(dim=1, correction=correction) if n > correction else torch.full((x.shape[0],), math.nan,
                                                                                    dtype=torch.float64)
        rows.append(dict(sum=x.sum(1), mean=x.mean(1), min=x.amin(1), max=x.amax(1), var=var))
    out = {k: torch.stack([r[k] for r in rows]) if rows else torch.zeros(0, max(channels, 1), dtype=torch.float64)
           for k in ("sum", "mean", "min", "max", "var")}
    if channels == 0:
        out = {k: v[:, 0] for k, v in out.items()}
    return out


def check(stats, ref, rtol=1e-10):
    for name, want in ref.items():
        got = getattr(stats, name).cpu()
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=rtol, atol=1e-9, equal_nan=True, msg=name)
    torch.testing.assert_close(stats.std.cpu(), ref["var"].sqrt(), rtol=rtol, atol=1e-9, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("correction", [0, 1])
def test_per_item_random_lengths(device, dtype, correction):
    g = torch.Generator().manual_seed(1)
    shapes = [(int(n),) for n in torch.randint(0, 9000, (40,), generator=g)] + [(0,), (1,), (2,)]
    batch = make(shapes, device, dtype)
    check(octopus.item_stats(batch, correction=correction, block_elems=512), reference(batch, 0, correction))


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_item_and_channel_images(device, dtype):
    g = torch.Generator().manual_seed(2)
    shapes = [(3, int(h), int(w)) for h, w in torch.randint(0, 70, (25, 2), generator=g)] + [(3, 1, 1), (3, 0, 5)]
    batch = make(shapes, device, dtype)
    for block in (16, 256, 4096):
        check(octopus.item_stats(batch, 3, block_elems=block), reference(batch, 3, 1))


def test_empty_batch_one_item_and_nan(device):
    empty = octopus.RaggedBatch.from_tensors([], device=device, item_dim=1)
    assert octopus.item_stats(empty).sum.shape == (0,)
    one = make([(5,)], device)
    check(octopus.item_stats(one), reference(one, 0, 1))
    x = torch.tensor([1.0, float("nan"), 3.0, 4.0, 5.0], device=device)
    batch = octopus.RaggedBatch.from_tensors([x[:2], x[2:]])
    s = octopus.item_stats(batch)
    assert s.mean[0].isnan() and s.min[0].isnan() and s.max[0].isnan() and s.var[0].isnan()
    assert s.mean[1].item() == 4.0 and s.min[1].item() == 3.0 and s.max[1].item() == 5.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_nan_anywhere_in_an_item_and_infinities(device, dtype):
    """A NaN as an item's first value, in its 16-byte vectors, or among its last single values
    makes its min and max NaN (whichever path reads it); +-inf without NaN are its min and max."""
    n = 203  # items packed back to back: heads and tails of single values at every alignment
    items = []
    for where in (0, 1, 50, 101, n - 2, n - 1):
        x = torch.arange(n, dtype=torch.float64)
        x[where] = math.nan
        items.append(x)
    items.append(torch.cat([torch.tensor([math.inf, -math.inf]), torch.arange(n - 2, dtype=torch.float64)]))
    items.append(torch.arange(n, dtype=torch.float64))
    batch = octopus.RaggedBatch.from_tensors([x.to(dtype) for x in items], device=device)
    for block in (64, 4096):
        s = octopus.item_stats(batch, block_elems=block)
        assert s.min[:6].isnan().all() and s.max[:6].isnan().all() and s.mean[:6].isnan().all()
        assert s.min[6].item() == -math.inf and s.max[6].item() == math.inf
        assert s.min[7].item() == 0 and s.max[7].item() == n - 1


def test_huge_item_far_from_zero(device):
    # 3M float32 elements around 1e4 with unit spread: a naive float32 sum of squares
    # would lose the variance entirely.
    batch = make([(3_000_000,), (17,)], device, torch.float32, loc=1e4)
    check(octopus.item_stats(batch), reference(batch, 0, 1), rtol=1e-9)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_10_pow_8_elements():
    g = torch.Generator(device="cuda").manual_seed(0)
    values = torch.randn(100_000_000, device="cuda", generator=g) * 2 + 100
    offsets = torch.tensor([0, 60_000_000, 100_000_000], device="cuda")
    batch = octopus.RaggedBatch(values, offsets, offsets.diff().view(-1, 1))
    s = octopus.item_stats(batch)
    for i, (a, b) in enumerate([(0, 60_000_000), (60_000_000, 100_000_000)]):
        ref = values[a:b].double()
        torch.testing.assert_close(s.mean[i], ref.mean(), rtol=1e-12, atol=0)
        torch.testing.assert_close(s.var[i], ref.var(), rtol=1e-9, atol=0)
        assert s.min[i] == ref.min() and s.max[i] == ref.max()


def test_gradients(device):
    batch = make([(3, 4, 5), (3, 0, 2), (3, 2, 1)], device, torch.float64)
    v = batch.values.clone().requires_grad_()

    def f(values, channels, which):
        b = batch.with_values(values)
        s = octopus.item_stats(b, channels)
        return getattr(s, which)

    for channels in (0, 3):
        for which in ("sum", "mean", "var", "std"):
            torch.autograd.gradcheck(lambda x: torch.nan_to_num(f(x, channels, which)), (v,))
    torch.autograd.gradcheck(lambda x: octopus.normalize(batch.with_values(x), 3).values, (v,))


def test_opcheck(device):
    batch = make([(3, 4), (0, 2), (5, 1)], device)
    torch.library.opcheck(torch.ops.octopus.item_stats.default, (batch.values, batch.offsets, 0, 0, None, True))
    images = make([(2, 3, 4), (2, 0, 2), (2, 5, 1)], device)
    torch.library.opcheck(torch.ops.octopus.item_stats.default, (images.values, images.offsets, 2, 16, None, True))
    # normalize: a composite of item_stats and pointwise, one call from Python.
    torch.library.opcheck(torch.ops.octopus.normalize.default,
                          (images.values, images.offsets, 2, 1e-5, 0, None, None, 16, None, "block_search", 16, None))
    constants = torch.tensor([0.5, 0.25], dtype=torch.float64, device=device)
    torch.library.opcheck(torch.ops.octopus.normalize.default,
                          (images.values, images.offsets, 2, 1e-5, 0, constants, constants, 16, None, "block_search",
                           16, None))


def _constants_by_torch_ops(stats, offsets, eps, correction, dtype):
    """What normalize computed with torch ops before normalize_constants: its reference."""
    count = (offsets.diff() // stats.shape[1]).to(torch.float64).unsqueeze(1)
    var = torch.where(count > correction, stats[..., 1] / (count - correction), float("nan"))
    return (torch.nan_to_num(stats[..., 0] / count).to(dtype),
            torch.nan_to_num((var + eps).rsqrt()).to(dtype))


def _awkward_batch(device, dtype=torch.float32):
    """Empty items, one-element items, constant ones, a NaN, an infinity, huge and tiny values."""
    g = torch.Generator().manual_seed(11)
    items = [torch.randn(2, int(n), generator=g) * 10 ** float(e) for n, e in zip(
        torch.randint(0, 40, (40,), generator=g), torch.randint(-30, 30, (40,), generator=g))]
    items += [torch.zeros(2, 0), torch.ones(2, 1), torch.full((2, 7), 3.0), torch.tensor([[1.0, math.nan], [2.0, 3.0]]),
              torch.tensor([[1.0, math.inf], [-math.inf, 2.0]]), torch.tensor([[1e30, -1e30, 3e30], [1e-30, 0, 1]])]
    return octopus.RaggedBatch.from_tensors([t.to(dtype) for t in items], device=device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_normalize_constants_equal_the_torch_ops_bit_for_bit(device, dtype, correction):
    batch = _awkward_batch(device, torch.float64)
    for channels in (0, 2):
        stats = torch.ops.octopus.item_stats(batch.values, batch.offsets, channels, 0, None, True)
        for eps in (1e-5, 0.0, 3.0):
            got = torch.ops.octopus.normalize_constants(stats, batch.offsets, channels, eps, correction, dtype)
            want = _constants_by_torch_ops(stats, batch.offsets, eps, correction, dtype)
            for g, w in zip(got, want):
                assert g.dtype == dtype and g.shape == (len(batch), max(channels, 1))
                assert torch.equal(g, w), (g - w).abs().max()
    empty = torch.ops.octopus.normalize_constants(stats[:0], batch.offsets[:1], 2, 1e-5, correction, dtype)
    assert [t.shape for t in empty] == [(0, 2), (0, 2)]


def test_normalize_constants_gradients_and_opcheck(device):
    batch = _awkward_batch(device, torch.float64)  # less empty items (sum / 0) and infinities: not differentiable
    keep = [i for i, t in enumerate(batch.cpu().unbind()) if t.numel() and t.isfinite().all() and (t.abs() < 1e6).all()]
    batch = octopus.RaggedBatch.from_tensors([batch.cpu().unbind()[i] for i in keep], device=device)
    for channels, correction in ((0, 1), (2, 0), (2, 2)):
        stats = torch.ops.octopus.item_stats(batch.values, batch.offsets, channels, 0, None, True)
        stats = stats.requires_grad_()
        args = (batch.offsets, channels, 0.5, correction, torch.float64)
        torch.autograd.gradcheck(lambda s: torch.ops.octopus.normalize_constants(s, *args), (stats,))
        torch.library.opcheck(torch.ops.octopus.normalize_constants.default, (stats, *args))
        torch.library.opcheck(torch.ops.octopus.normalize_constants.default, (stats.detach(), *args[:-1], torch.float32))


def test_normalize_constants_bad_input(device):
    batch = make([(3, 4), (2, 2)], device)
    stats = torch.ops.octopus.item_stats(batch.values, batch.offsets, 0, 0, None, True)
    op = torch.ops.octopus.normalize_constants
    with pytest.raises(ValueError, match="stats must be item_stats' output"):
        op(stats.float(), batch.offsets, 0, 1e-5, 0, torch.float32)
    with pytest.raises(ValueError, match="stats must be item_stats' output"):
        op(stats[..., :2], batch.offsets, 0, 1e-5, 0, torch.float32)
    with pytest.raises(ValueError, match="one more entry"):
        op(stats, batch.offsets[:-1], 0, 1e-5, 0, torch.float32)
    with pytest.raises(ValueError, match="offsets must be 1-D int64"):
        op(stats, batch.offsets.int(), 0, 1e-5, 0, torch.float32)
    with pytest.raises(ValueError, match="channels"):
        op(stats, batch.offsets, 3, 1e-5, 0, torch.float32)
    with pytest.raises(ValueError, match="correction"):
        op(stats, batch.offsets, 0, 1e-5, -1, torch.float32)
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        op(stats, batch.offsets, 0, 1e-5, 0, torch.float16)
    if device.type == "cuda":
        with pytest.raises(ValueError, match="offsets must be on the device of stats"):
            op(stats, batch.offsets.cpu(), 0, 1e-5, 0, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
def test_normalize_without_and_with_autograd_agree_bit_for_bit(device, dtype):
    """A call that needs no gradient runs below autograd (no Python on its way to the kernels);
    one that does goes through the ops' autograd formulas: the same values either way."""
    batch = _awkward_batch(device) if dtype != torch.uint8 else make([(3, 5, 4), (3, 0, 2), (3, 1, 1)], device, dtype)
    if dtype == torch.float64:
        batch = batch.with_values(batch.values.double())
    for channels in (0, 2 if dtype != torch.uint8 else 3):
        plain = octopus.normalize(batch, channels).values
        with torch.no_grad():
            torch.testing.assert_close(octopus.normalize(batch, channels).values, plain, rtol=0, atol=0, equal_nan=True)
        if dtype != torch.uint8:
            tracked = octopus.normalize(batch.with_values(batch.values.clone().requires_grad_()), channels).values
            assert tracked.requires_grad
            torch.testing.assert_close(tracked.detach(), plain, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_normalize_matches_reference(device, dtype):
    g = torch.Generator().manual_seed(3)
    shapes = [(3, int(h), int(w)) for h, w in torch.randint(1, 50, (12, 2), generator=g)] + [(3, 0, 4)]
    batch = make(shapes, device, dtype)
    out_dtype = torch.float32 if dtype == torch.uint8 else dtype
    tol = dict(rtol=2e-2, atol=2e-2) if dtype in (torch.float16, torch.bfloat16) else dict(rtol=1e-5, atol=1e-5)
    for channels in (0, 3):
        got = octopus.normalize(batch, channels, eps=1e-3)
        assert got.dtype == out_dtype
        for item, out in zip(batch.cpu().unbind(), got.cpu().unbind()):
            x = item.double().reshape(max(channels, 1), -1)
            if x.shape[1] == 0:
                continue
            want = (x - x.mean(1, keepdim=True)) / (x.var(1, correction=0, keepdim=True) + 1e-3).sqrt()
            torch.testing.assert_close(out.double().reshape(want.shape), want, **tol)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    got = octopus.normalize(batch, 3, mean=mean, std=std, eps=0.5)  # eps is for own statistics only
    for item, out in zip(batch.cpu().unbind(), got.cpu().unbind()):
        want = (item.double() - torch.tensor(mean).double().view(3, 1, 1)) / torch.tensor(std).double().view(3, 1, 1)
        torch.testing.assert_close(out.double(), want, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
def test_normalize_of_constant_items_is_exactly_zero(device, dtype):
    """Zero variance makes the scale 1 / sqrt(eps) ~ 316: the result must still be x - mean = 0
    (computed as x * scale + shift it would be off by the shift's rounding times the scale; with
    the earlier 1 / (std + eps) = 1e5 that was 2e-4 to 2e-3 on CUDA, where the multiply-add is
    fused)."""
    g = torch.Generator().manual_seed(8)
    items = [torch.randn(3, 1, 1, generator=g) * 100, torch.full((3, 4, 5), 77.7), torch.randn(3, 6, 2, generator=g)]
    if dtype == torch.uint8:
        items = [(t.abs() % 256).to(torch.uint8) for t in items]
    batch = octopus.RaggedBatch.from_tensors([t.to(dtype) for t in items], device=device)
    for channels in (0, 3):
        out = octopus.normalize(batch, channels).cpu().unbind()
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        if channels == 3:
            assert torch.equal(out[0], torch.zeros_like(out[0]))
        x = items[2].double().reshape(max(channels, 1), -1)
        want = (x - x.mean(1, keepdim=True)) / (x.var(1, correction=0, keepdim=True) + 1e-5).sqrt()
        torch.testing.assert_close(out[2].double().reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_bad_input(device):
    batch = make([(3, 4), (2, 2)], device)
    with pytest.raises(ValueError, match="channels"):
        octopus.item_stats(batch, 5)  # 12 and 4 elements do not split into 5 planes
    with pytest.raises(ValueError, match="channels"):
        torch.ops.octopus.item_stats(batch.values, batch.offsets, -1, 0, None, True)
    with pytest.raises(ValueError, match="channels must be 0"):
        octopus.item_stats(batch, -2)
    with pytest.raises(ValueError, match="correction"):
        octopus.item_stats(batch, correction=-1)
    with pytest.raises(ValueError, match="both mean and std"):
        octopus.normalize(batch, mean=[0.5])
    with pytest.raises(ValueError, match="one value per channel"):
        octopus.normalize(batch, 2, mean=[0.5], std=[0.2])
    with pytest.raises(TypeError, match="values must be"):
        torch.ops.octopus.item_stats(batch.values.int(), batch.offsets, 0, 0, None, True)
    with pytest.raises(ValueError, match="offsets"):
        torch.ops.octopus.item_stats(batch.values, torch.tensor([0, 5, 3], device=device), 0, 0, None, True)

"""clamp / threshold / power with per-item parameters against float64 references."""

import pytest
import torch

import octopus
from conftest import random_batch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8]
SHAPES = [(3, 5, 7), (3, 0, 4), (3, 40, 33), (3, 1, 1), (3, 9, 130)]


def params(m, channels, device, lo, hi, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (m, channels) if channels else (m,)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).float().to(device)


def reference(batch, fn, a, b, channels):
    outs = []
    for i, item in enumerate(batch.cpu().unbind()):
        x = item.double()
        if channels:
            shape = (channels,) + (1,) * (x.dim() - 1)
            ai, bi = a[i].cpu().double().view(shape), b[i].cpu().double().view(shape)
        else:
            ai, bi = a[i].cpu().double(), b[i].cpu().double()
        outs.append(fn(x, ai, bi).reshape(-1))
    return torch.cat(outs) if outs else torch.zeros(0, dtype=torch.float64)


KINDS = {
    "clamp": (lambda b, a, c, s: octopus.clamp(b, a, c, strategy=s), lambda x, a, c: torch.minimum(torch.maximum(x, a), c)),
    "mask": (lambda b, a, c, s: octopus.threshold(b, a, strategy=s), lambda x, a, c: (x > a).double()),
    "keep": (lambda b, a, c, s: octopus.threshold(b, a, mode="keep", value=c, strategy=s),
             lambda x, a, c: torch.where(x > a, x, c)),
    "power": (lambda b, a, c, s: octopus.power(b, a, c, strategy=s), lambda x, a, c: c * x.abs() ** a),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", [0, 3])
def test_kinds_dtypes_forms_strategies(device, kind, dtype, channels):
    batch = random_batch(SHAPES, device, dtype)
    if kind == "power":  # non-negative data
        batch = batch.with_values(batch.values.abs() if dtype != torch.uint8 else batch.values)
    scale = 255.0 if dtype == torch.uint8 else 1.0
    a = params(len(batch), channels, device, -0.5 * scale, 0.5 * scale) if kind != "power" else \
        params(len(batch), channels, device, 0.4, 2.2)
    c = a + scale * 0.7 if kind == "clamp" else params(len(batch), channels, device, 0.5, 2.0, seed=1)
    if dtype == torch.float64:
        a, c = a.double(), c.double()
    run, fn = KINDS[kind]
    want = reference(batch, fn, a, c, channels)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype in (torch.float16, torch.bfloat16) else dict(rtol=1e-5, atol=1e-5)
    for strategy in octopus.STRATEGIES:
        got = run(batch, a, c, strategy)
        assert got.dtype == (torch.float32 if dtype == torch.uint8 else dtype)
        torch.testing.assert_close(got.values.cpu().double(), want, **tol, msg=f"{kind} {strategy}")


def test_numbers_and_mixed_forms(device):
    batch = random_batch([(3, 4, 4), (3, 2, 5)], device)
    lo = torch.tensor([[-0.1, -0.2, -0.3], [0.0, 0.1, 0.2]], device=device)
    got = octopus.clamp(batch, lo, 0.5)
    want = reference(batch, lambda x, a, c: torch.minimum(torch.maximum(x, a), c), lo, torch.full((2, 3), 0.5), 3)
    torch.testing.assert_close(got.values.cpu().double(), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(octopus.threshold(batch, 0.0).values, (batch.values > 0).float())


def test_gradients(device):
    batch = random_batch([(3, 4), (0, 2), (5, 1)], device, torch.float64)
    v = batch.values.abs().add(0.1).clone().requires_grad_()
    m = len(batch)
    a = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64, device=device)
    b = torch.tensor([0.9, 1.0, 1.5], dtype=torch.float64, device=device)
    for kind, (p, q) in {"clamp": (a, b), "threshold_keep": (a, b - 1), "power": (a + 1, b),
                         "threshold_mask": (a, b), "center_scale": (a, b)}.items():
        torch.autograd.gradcheck(
            lambda x: torch.ops.octopus.pointwise(x, batch.offsets, kind, p, q, "plan", 0, None, True), (v,))
    assert m == 3


@pytest.mark.parametrize("channels", [0, 3])
def test_center_scale_gradients_reach_its_parameters(device, channels):
    # normalize's (x - mean) * scale: mean and scale come from the item's statistics, so
    # their gradients carry the values' gradient through them.
    batch = random_batch([(3, 4, 2), (3, 0, 2), (3, 1, 5)], device, torch.float64)
    g = torch.Generator().manual_seed(2)
    shape = (3, channels) if channels else (3,)
    a = torch.randn(shape, generator=g, dtype=torch.float64).to(device).requires_grad_()
    b = torch.randn(shape, generator=g, dtype=torch.float64).to(device).requires_grad_()
    v = batch.values.clone().requires_grad_()
    torch.autograd.gradcheck(
        lambda x, p, q: torch.ops.octopus.pointwise(x, batch.offsets, "center_scale", p, q, "plan", 0, None, True),
        (v, a, b))


def test_opcheck(device):
    batch = random_batch([(3, 4), (0, 2), (5, 1)], device)
    a = torch.full((3,), 0.1, device=device)
    b = torch.full((3,), 0.9, device=device)
    for kind in ("clamp", "threshold_keep", "power", "threshold_mask", "center_scale"):
        torch.library.opcheck(torch.ops.octopus.pointwise.default,
                              (batch.values.abs(), batch.offsets, kind, a, b, "block_search", 0, None, True))


def test_bad_input(device):
    batch = random_batch([(3, 4), (5, 1)], device)
    a = torch.zeros(2, device=device)
    with pytest.raises(ValueError, match="kind must be one of"):
        torch.ops.octopus.pointwise(batch.values, batch.offsets, "sigmoid", a, a, "plan", 0, None, True)
    with pytest.raises(ValueError, match="mode must be"):
        octopus.threshold(batch, 0.5, mode="clip")
    with pytest.raises(ValueError, match="lo must have shape"):
        octopus.clamp(batch, torch.zeros(3, device=device), 1.0)
    with pytest.raises(TypeError, match="exponent must be a floating-point tensor"):
        octopus.power(batch, torch.ones(2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="b must have the same shape as a"):
        torch.ops.octopus.pointwise(batch.values, batch.offsets, "clamp", a, torch.zeros(2, 1, device=device),
                                    "plan", 0, None, True)

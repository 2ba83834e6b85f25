"""Property-based tests (hypothesis): random ragged layouts — empty items, one item, items
much larger than a block, blocks smaller than an item, rows that straddle blocks — run
through every strategy and block size of the ragged ops, each checked against a float64
reference computed item by item in plain PyTorch; and the slicing of best-effort work (counts
and item ranges, from a size, a latency budget or neither) against what it promises.

The "ci" profile (the default) is derandomized: the same examples on every run, so a red
run is reproducible. ``HYPOTHESIS_PROFILE=thorough`` draws 1000 per test, at random.
"""

import math
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import octopus
from conftest import random_batch, reference_plan_rows
from octopus.scheduling.slicing import HOST_FACTOR, SliceSizer, count_slices, item_ranges, size_on_grid

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Small blocks make even these small items span several blocks and several items share one.
BLOCKS = st.sampled_from([16, 32, 48, 64, 256, 4096])
STRATEGY = st.sampled_from(octopus.STRATEGIES)


@st.composite
def item_shapes(draw, dims, max_items=10, channels=None):
    """Shapes of 0..max_items items: [L] (up to 700 elements, 0 allowed), [H, W] or
    [C, H, W] (H, W up to 40, 0 allowed; C fixed per batch)."""
    m = draw(st.integers(0, max_items))
    if dims == 1:
        return [(draw(st.integers(0, 700)),) for _ in range(m)]
    side = st.integers(0, 40)
    shapes = [(draw(side), draw(side)) for _ in range(m)]
    if dims == 3:
        c = channels or draw(st.integers(1, 3))
        shapes = [(c, h, w) for h, w in shapes]
    return shapes


def items64(batch):
    return [t.double() for t in batch.cpu().unbind()]


def packed(tensors):
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0, dtype=torch.float64)


@given(dims=st.sampled_from([1, 2, 3]), data=st.data(), block=BLOCKS, seed=st.integers(0, 2**16))
def test_plan_covers_every_element_once_within_items(device, dims, data, block, seed):
    shapes = data.draw(item_shapes(dims))
    batch = random_batch(shapes, device, seed=seed, item_dim=dims)
    plan = octopus.plan(batch, block)
    item, begin, end, run = octopus.plan_blocks(plan)
    offsets = batch.host_layout()[0]
    assert [(b, i, e - b, r) for b, i, e, r in zip(begin.tolist(), item.tolist(), end.tolist(), run.tolist())] == \
        reference_plan_rows(offsets, block)
    assert bool(((end - begin) > 0).all()) and bool(((end - begin) <= block).all())
    single = ~run  # blocks of one item never cross it
    assert bool((begin[single] >= offsets[item[single]]).all()) and bool((end[single] <= offsets[item[single] + 1]).all())
    covered = torch.zeros(batch.numel(), dtype=torch.int64)
    for b, e in zip(begin.tolist(), end.tolist()):
        covered[b:e] += 1
    assert bool((covered == 1).all())


@given(dims=st.sampled_from([1, 2, 3]), data=st.data(), block=BLOCKS, strategy=STRATEGY,
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.uint8]),
       per_channel=st.booleans(), seed=st.integers(0, 2**16))
def test_affine_matches_float64_reference(device, dims, data, block, strategy, dtype, per_channel, seed):
    per_channel = per_channel and dims == 3
    shapes = data.draw(item_shapes(dims))
    batch = random_batch(shapes, device, dtype, seed=seed, item_dim=dims)
    m, c = len(shapes), shapes[0][0] if per_channel and shapes else 1
    g = torch.Generator().manual_seed(seed + 1)
    scale = torch.randn((m, c) if per_channel else (m,), generator=g, dtype=torch.float64)
    bias = torch.randn(scale.shape, generator=g, dtype=torch.float64)
    param = torch.float64 if dtype == torch.float64 else torch.float32
    got = octopus.affine(batch, scale.to(device, param), bias.to(device, param), strategy=strategy, block_elems=block)
    want = []
    for i, t in enumerate(items64(batch)):
        if per_channel:
            want.append(t * scale[i].view(c, 1, 1) + bias[i].view(c, 1, 1))
        else:
            want.append(t * scale[i] + bias[i])
    assert got.dtype == (torch.float32 if dtype == torch.uint8 else dtype)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got.values.cpu().double(), packed(want), **tol)


@given(data=st.data(), block=BLOCKS, strategy=STRATEGY, seed=st.integers(0, 2**16),
       kind=st.sampled_from(["clamp", "mask", "keep", "power"]))
def test_pointwise_matches_reference(device, data, block, strategy, seed, kind):
    shapes = data.draw(item_shapes(2))
    batch = random_batch(shapes, device, seed=seed, item_dim=2)
    m = len(shapes)
    g = torch.Generator().manual_seed(seed + 2)
    a, b = torch.randn(m, generator=g, dtype=torch.float64), torch.randn(m, generator=g, dtype=torch.float64)
    a32, b32 = a.float(), b.float()
    if kind == "clamp":
        lo, hi = torch.minimum(a32, b32), torch.maximum(a32, b32)
        got = octopus.clamp(batch, lo.to(device), hi.to(device), strategy=strategy, block_elems=block)
        want = [t.clamp(float(lo[i]), float(hi[i])) for i, t in enumerate(items64(batch))]
    elif kind == "mask":
        got = octopus.threshold(batch, a32.to(device), strategy=strategy, block_elems=block)
        want = [(t > float(a32[i])).double() for i, t in enumerate(items64(batch))]
    elif kind == "keep":
        got = octopus.threshold(batch, a32.to(device), mode="keep", value=b32.to(device), strategy=strategy,
                                block_elems=block)
        want = [torch.where(t > float(a32[i]), t, float(b32[i])) for i, t in enumerate(items64(batch))]
    else:
        exponent, gain = a32.abs() + 0.25, b32
        got = octopus.power(octopus.affine(batch, 0.0, 0.0).with_values(batch.values.abs()), exponent.to(device),
                            gain.to(device), strategy=strategy, block_elems=block)
        want = [float(gain[i]) * t.abs() ** float(exponent[i]) for i, t in enumerate(items64(batch))]
    torch.testing.assert_close(got.values.cpu().double(), packed(want), rtol=1e-5, atol=1e-5)


@given(dims=st.sampled_from([1, 2, 3]), data=st.data(), block=BLOCKS, strategy=STRATEGY,
       crop=st.booleans(), seed=st.integers(0, 2**16))
def test_padding_round_trip(device, dims, data, block, strategy, crop, seed):
    shapes = data.draw(item_shapes(dims))
    batch = random_batch(shapes, device, seed=seed, item_dim=dims)
    largest = [max((s[k] for s in shapes), default=0) for k in range(dims)]
    slot = [data.draw(st.integers(0, e)) for e in largest] if crop else largest
    dense = octopus.to_padded(batch, -7.0, slot if crop else None)
    want = torch.full((len(shapes), *slot), -7.0, dtype=torch.float64)
    kept = []
    for i, t in enumerate(items64(batch)):
        corner = tuple(slice(0, min(e, s)) for e, s in zip(t.shape, slot))
        want[i][corner] = t[corner]
        kept.append(t[corner])
    torch.testing.assert_close(dense.cpu().double(), want, rtol=0, atol=0)
    sizes = torch.tensor([list(k.shape) for k in kept], dtype=torch.int64).reshape(len(kept), dims)
    back = octopus.from_padded(dense, sizes, strategy=strategy, block_elems=block)
    assert back.item_shapes() == [tuple(k.shape) for k in kept]
    torch.testing.assert_close(back.values.cpu().double(), packed(kept), rtol=0, atol=0)


@given(dims=st.sampled_from([1, 2, 3]), data=st.data(), per_channel=st.booleans(), seed=st.integers(0, 2**16),
       block=st.sampled_from([256, 1024, 16384]))
def test_item_stats_match_float64_reference(device, dims, data, per_channel, seed, block):
    per_channel = per_channel and dims == 3
    shapes = data.draw(item_shapes(dims))
    batch = random_batch(shapes, device, seed=seed, item_dim=dims)
    c = shapes[0][0] if per_channel and shapes else 0
    got = octopus.item_stats(batch, c, block_elems=block)
    for i, t in enumerate(items64(batch)):
        groups = t.reshape(c, -1) if c else t.reshape(1, -1)
        for k, x in enumerate(groups):
            at = (i, k) if c else i
            assert float(got.count[at]) == x.numel()
            torch.testing.assert_close(got.sum[at].cpu(), x.sum(), rtol=1e-9, atol=1e-9)
            if x.numel():
                torch.testing.assert_close(got.mean[at].cpu(), x.mean(), rtol=1e-9, atol=1e-9)
                assert float(got.min[at]) == float(x.min()) and float(got.max[at]) == float(x.max())
            if x.numel() > 1:
                torch.testing.assert_close(got.var[at].cpu(), x.var(), rtol=1e-7, atol=1e-9)
            else:
                assert bool(got.var[at].isnan())


@given(data=st.data(), block=BLOCKS, strategy=STRATEGY, border=st.sampled_from(["replicate", "zero"]),
       channels=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_stencil_matches_conv2d(device, data, block, strategy, border, channels, seed):
    shapes = data.draw(item_shapes(3, channels=channels))
    batch = random_batch(shapes, device, seed=seed, item_dim=3)
    weight = torch.randn(channels, 1, 3, 3, generator=torch.Generator().manual_seed(seed + 3), dtype=torch.float64)
    got = octopus.depthwise_conv3x3(batch, weight.float().to(device), border=border, strategy=strategy,
                                    block_elems=block)
    want = []
    for t in items64(batch):
        if t.numel() == 0:
            want.append(t)
            continue
        padded = F.pad(t[None], (1, 1, 1, 1), mode="replicate" if border == "replicate" else "constant")
        want.append(F.conv2d(padded, weight, groups=channels)[0])
    assert got.item_shapes() == batch.item_shapes()
    torch.testing.assert_close(got.values.cpu().double(), packed(want), rtol=1e-5, atol=1e-5)


@st.composite
def boxes_in(draw, image_sizes, max_boxes=8):
    """int64 [K, 5] boxes (image, y0, x0, y1, x1), each inside its image and non-empty."""
    rows = []
    candidates = [i for i, (h, w) in enumerate(image_sizes) if h > 0 and w > 0]
    for _ in range(draw(st.integers(0, max_boxes)) if candidates else 0):
        i = draw(st.sampled_from(candidates))
        h, w = image_sizes[i]
        y0, x0 = draw(st.integers(0, h - 1)), draw(st.integers(0, w - 1))
        rows.append([i, y0, x0, draw(st.integers(y0 + 1, h)), draw(st.integers(x0 + 1, w))])
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 5)


def connected(params):
    """0 times the parameters' sum: added to a loss, it depends on them even for an empty batch."""
    return sum(0 * p.sum() for p in params)


def interpolated(crop, size):
    return F.interpolate(crop[None], size, mode="bilinear", align_corners=False)[0]


# The criterion: each crop equals torch's own F.interpolate of it (float32, on the CPU)
# to within 1e-5. Frames up to 300 pixels a side: sampling coordinates that large show a
# coordinate rounded differently from torch's.
@given(data=st.data(), channels=st.integers(1, 3), ragged_source=st.booleans(), seed=st.integers(0, 2**16),
       size=st.tuples(st.integers(1, 48), st.integers(1, 48)))
def test_crop_resize_matches_interpolate(device, data, channels, ragged_source, seed, size):
    g = torch.Generator().manual_seed(seed)
    if ragged_source:
        shapes = data.draw(item_shapes(3, max_items=4, channels=channels))
        source = random_batch(shapes, device, seed=seed, item_dim=3)
        images = source.cpu().unbind()
    else:
        n, h, w = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 300)), data.draw(st.integers(1, 300))
        source = torch.randn(n, channels, h, w, generator=g).to(device)
        images = list(source.cpu())
    boxes = data.draw(boxes_in([tuple(t.shape[1:]) for t in images]))
    if not images:  # no images, no boxes: nothing says C of the result
        with pytest.raises(ValueError, match="source has no images"):
            octopus.crop_resize(source, boxes, size)
        return
    got = octopus.crop_resize(source, boxes, size)
    assert got.shape == (boxes.shape[0], channels, *size)
    want = [interpolated(images[i][:, y0:y1, x0:x1], size) for i, y0, x0, y1, x1 in boxes.tolist()]
    torch.testing.assert_close(got.cpu(), torch.stack(want) if want else got.cpu(), rtol=1e-5, atol=1e-5)


@given(data=st.data(), channels=st.integers(1, 3), strategy=STRATEGY, block=BLOCKS, seed=st.integers(0, 2**16))
def test_resize_ragged_to_ragged_matches_interpolate(device, data, channels, strategy, block, seed):
    shapes = [s for s in data.draw(item_shapes(3, max_items=5, channels=channels)) if s[1] and s[2]]
    batch = random_batch(shapes, device, seed=seed, item_dim=3)
    targets = [(data.draw(st.integers(1, 30)), data.draw(st.integers(1, 30))) for _ in shapes]
    got = octopus.resize(batch, targets, strategy=strategy, block_elems=block)
    assert got.item_shapes() == [(channels, h, w) for h, w in targets]
    want = [interpolated(t, hw) for t, hw in zip(batch.cpu().unbind(), targets)]
    torch.testing.assert_close(got.values.cpu(), packed(want).float(), rtol=1e-5, atol=1e-5)


@given(data=st.data(), channels=st.integers(1, 2), seed=st.integers(0, 2**16),
       threshold=st.floats(-1.0, 1.0), max_fraction=st.floats(0.0, 1.0))
def test_tile_filter_matches_per_tile_loop(device, data, channels, seed, threshold, max_fraction):
    h, w = data.draw(st.integers(1, 48)), data.draw(st.integers(1, 48))
    image = torch.randn(channels, h, w, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    tiles = data.draw(boxes_in([(h, w)], max_boxes=12))[:, 1:]
    got = octopus.tile_filter(image.float().to(device), tiles, threshold, max_fraction=max_fraction, gather=True)
    kept = []
    for t, (y0, x0, y1, x1) in enumerate(tiles.tolist()):
        tile = image.float().double()[:, y0:y1, x0:x1]
        fraction = float((tile > threshold).double().mean())
        torch.testing.assert_close(float(got.mean[t]), float(tile.mean()), rtol=1e-9, atol=1e-9)
        assert float(got.fraction[t]) == fraction
        assert bool(got.keep[t]) == (fraction <= max_fraction)
        if fraction <= max_fraction:
            kept.append(tile)
    assert got.kept_index.tolist() == got.keep.nonzero().squeeze(1).tolist()
    torch.testing.assert_close(got.kept.values.cpu().double(), packed(kept), rtol=0, atol=0)


@given(dims=st.sampled_from([1, 3]), data=st.data(), block=BLOCKS, strategy=STRATEGY, seed=st.integers(0, 2**16))
def test_gradients_match_float64_autograd(device, dims, data, block, strategy, seed):
    """affine's gradients for values, scale and bias, and the padding round trip's for the
    values, against autograd through the per-item reference."""
    shapes = data.draw(item_shapes(dims))
    batch = random_batch(shapes, device, torch.float64, seed=seed, item_dim=dims)
    m = len(shapes)
    g = torch.Generator().manual_seed(seed + 4)
    scale, bias = (torch.randn(m, generator=g, dtype=torch.float64).to(device).requires_grad_() for _ in range(2))
    values = batch.values.clone().requires_grad_()
    out = octopus.affine(batch.with_values(values), scale, bias, strategy=strategy, block_elems=block)
    weights = torch.randn(out.numel(), generator=g, dtype=torch.float64).to(device)
    got = torch.autograd.grad((out.values * weights).sum() + connected((values, scale, bias)), (values, scale, bias))

    ref = [p.detach().cpu().requires_grad_() for p in (values, scale, bias)]
    offsets = batch.host_layout()[0].tolist()
    pieces = [ref[0][offsets[i]:offsets[i + 1]] * ref[1][i] + ref[2][i] for i in range(m)]
    want = torch.autograd.grad((packed(pieces) * weights.cpu()).sum() + connected(ref), ref)
    for name, a, b in zip(("values", "scale", "bias"), got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-9, atol=1e-9, msg=lambda msg: f"grad of {name}: {msg}")

    padded = octopus.to_padded(batch.with_values(values), 0.0)
    back = octopus.from_padded(padded, batch.host_layout()[1], strategy=strategy, block_elems=block)
    (grad,) = torch.autograd.grad((back.values * weights).sum() + padded.sum() + connected([values]), values)
    torch.testing.assert_close(grad.cpu(), weights.cpu() + 1, rtol=0, atol=1e-12)


@given(dims=st.sampled_from([1, 2, 3]), data=st.data(), per_channel=st.booleans(), seed=st.integers(0, 2**16))
def test_normalize_matches_instance_norm(device, dims, data, per_channel, seed):
    per_channel = per_channel and dims == 3
    shapes = data.draw(item_shapes(dims))
    batch = random_batch(shapes, device, torch.float64, seed=seed, item_dim=dims)
    c = shapes[0][0] if per_channel and shapes else 0
    got = octopus.normalize(batch, c, eps=1e-3)
    want = []
    for t in items64(batch):
        groups = t.reshape(c, -1) if c else t.reshape(1, -1)
        mean = groups.mean(1, keepdim=True)
        var = groups.var(1, correction=0, keepdim=True)
        want.append(((groups - mean) / (var + 1e-3).sqrt()).reshape(t.shape))
    torch.testing.assert_close(got.values.cpu(), packed(want), rtol=1e-9, atol=1e-9)


@given(dims=st.sampled_from([1, 2, 3]), data=st.data(), same_tail=st.booleans(), seed=st.integers(0, 2**16))
def test_nested_round_trips(device, dims, data, same_tail, seed):
    """RaggedBatch -> torch.nested (jagged where the items share their extents past the
    first, strided always) -> RaggedBatch keeps every item; unbind gives the items back."""
    shapes = data.draw(item_shapes(dims))
    if same_tail and dims > 1 and shapes:
        shapes = [(s[0], *shapes[0][1:]) for s in shapes]
    batch = random_batch(shapes, device, seed=seed, item_dim=dims)
    assert [tuple(t.shape) for t in batch.unbind()] == [tuple(s) for s in shapes]
    layouts = [torch.strided] if len(shapes) else []
    if len({s[1:] for s in shapes}) == 1:
        layouts.append(torch.jagged)
    for layout in layouts:
        nt = batch.to_nested(layout)
        assert nt.layout == layout
        back = octopus.RaggedBatch.from_nested(nt)
        assert back.item_shapes() == batch.item_shapes(), layout
        assert torch.equal(back.values, batch.values) and torch.equal(back.offsets, batch.offsets)


@given(data=st.data(), strategy=STRATEGY, n=st.integers(0, 60))
def test_arbitrary_offsets_work_or_raise_naming_them(device, data, strategy, n):
    """Offsets drawn with no regard for validity (any start, decreasing, negative, past the
    values): every checked entry point either gives the reference answer or raises a
    ValueError that names the offsets — never a crash, a hang or a silent wrong answer."""
    if data.draw(st.booleans()):  # half of the draws valid, so that both answers are checked
        cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=7)))
        offsets = [0, *cuts, n]
    else:
        offsets = data.draw(st.lists(st.integers(-5, 70), min_size=1, max_size=8))
    valid = offsets[0] == 0 and offsets[-1] == n and all(a <= b for a, b in zip(offsets, offsets[1:]))
    values = torch.randn(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64).to(device)
    o = torch.tensor(offsets, dtype=torch.int64, device=device)
    m = len(offsets) - 1
    scale = torch.arange(1, m + 1, dtype=torch.float64, device=device)
    lengths = [max(b - a, 0) for a, b in zip(offsets, offsets[1:])]
    sizes = torch.tensor(lengths, dtype=torch.int64, device=device).reshape(m, 1)
    calls = {
        "affine": lambda: octopus.affine(values, scale, 1.0, offsets=o, strategy=strategy),
        "RaggedBatch": lambda: octopus.RaggedBatch(values, o, sizes).values,
    }
    for name, call in calls.items():
        if valid:
            got = call()
            want = values.clone()
            if name == "affine":
                for i in range(m):
                    want[offsets[i]:offsets[i + 1]] = want[offsets[i]:offsets[i + 1]] * (i + 1) + 1
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        else:
            with pytest.raises(ValueError, match="offsets"):
                call()


@st.composite
def slice_sizers(draw, total, exact=()):
    """A SliceSizer as the slicing helpers make one: a fixed size (half the time one of `exact`,
    where given: sizes some ranges fill exactly); a budget with a measured time per unit (and
    perhaps the host's time per slice); a budget with nothing measured (probes); or neither
    (everything at once). Returns it and the size each slice should have."""
    how = draw(st.sampled_from(["size", "budget", "probe", "whole"]))
    if how == "size":
        sizes = st.integers(1, 5000)
        size = draw(st.one_of(st.sampled_from(sorted(exact)), sizes) if exact else sizes)
        return SliceSizer(size, None, lambda: None, total), lambda i: size
    if how == "whole":
        return SliceSizer(None, None, lambda: None, total), lambda i: None
    budget = draw(st.floats(1e-6, 1e-1))
    if how == "probe":
        first = max(1, int(total / 64))
        return SliceSizer(None, budget, lambda: None, total), lambda i: first * 2 ** i
    rate = draw(st.floats(1e-12, 1e-3))
    host = draw(st.one_of(st.none(), st.floats(1e-6, 1e-2)))
    want = size_on_grid(max(1, int(budget / rate)))  # the budget's, rounded down
    if host is not None:  # no fewer than the host's floor, rounded up
        want = max(want, size_on_grid(max(1, math.ceil(HOST_FACTOR * host / rate)), up=True))
    return SliceSizer(None, budget, lambda: rate, total, lambda: host), lambda i: want


@given(units=st.integers(1, 2**62), more=st.integers(0, 2**40))
def test_sizes_on_the_grid_are_few_an_octave_and_under_a_fifth_below(units, more):
    size = size_on_grid(units)
    assert 1 <= size <= units and 5 * size > 4 * units  # rounded down, by less than 20%
    assert size < 8 or size >> (size.bit_length() - 3) << (size.bit_length() - 3) == size  # 3 significant bits
    assert size_on_grid(size) == size and size_on_grid(units + more) >= size  # on it; monotonic
    above = size_on_grid(units, up=True)  # rounded up, by less than 25%, onto the same grid
    assert units <= above and 4 * above < 5 * units + 4 and size_on_grid(above) == above
    assert above == size or above == size_on_grid(size + size // 4 if size >= 8 else size + 1)
    octave = 1 << (units.bit_length() - 1)  # [octave, 2 * octave) holds units
    assert len({size_on_grid(u) for u in range(octave, 2 * octave)} if octave <= 4096 else
               {size_on_grid(octave * k // 8) for k in range(8, 16)}) == min(octave, 4)


@given(total=st.integers(0, 10**6), data=st.data())
def test_count_slices_cover_the_work_once_in_order_each_as_big_as_asked(total, data):
    sizer, size_of = data.draw(slice_sizers(total))
    parts = list(count_slices(total, sizer))
    bounds = [0] + [p.stop for p in parts]
    assert [p.start for p in parts] == bounds[:-1] and bounds[-1] == total  # contiguous, in order, all
    for i, p in enumerate(parts):
        want = size_of(i)
        size = p.stop - p.start
        assert size >= 1
        assert size == (total - p.start if want is None else min(want, total - p.start))


@given(sizes=st.lists(st.one_of(st.integers(0, 16), st.integers(0, 5000)), max_size=40), data=st.data())
def test_item_ranges_cover_every_item_once_in_order_and_fill_each_range(sizes, data):
    """Each range holds whole items, as many as fit in the size asked (at least one: an item
    larger than that is a range of its own), empty items included."""
    batch = random_batch([(k,) for k in sizes], "cpu", seed=len(sizes))
    offsets = [0]
    for k in sizes:
        offsets.append(offsets[-1] + k)
    runs = {b - a for i, a in enumerate(offsets) for b in offsets[i + 1:] if b > a}  # consecutive items' sums
    sizer, size_of = data.draw(slice_sizers(batch.numel(), runs))
    ranges = list(item_ranges(batch, sizer))
    bounds = [0] + [r[1] for r in ranges]
    assert [r[0] for r in ranges] == bounds[:-1] and bounds[-1] == len(sizes)
    for i, (start, stop, elements) in enumerate(ranges):
        assert stop > start
        assert elements == offsets[stop] - offsets[start]
        limit = size_of(i)
        if limit is None:
            assert stop == len(sizes)
            continue
        assert elements <= limit or stop - start == 1
        if stop < len(sizes):  # the next item would not have fit
            assert offsets[stop + 1] - offsets[start] > limit


@pytest.mark.parametrize("limit", [7, 2**62, 2**63, 2**70])
def test_item_ranges_with_a_limit_past_the_last_offset_take_the_rest_in_one_range(limit):
    """A limit as large as the whole batch or larger (past what an int64 holds too, as a huge
    budget over a tiny measured rate gives) is one range, as no limit is."""
    batch = random_batch([(3,), (0,), (4,)], "cpu", seed=0)
    sizer = SliceSizer(limit, None, lambda: None, batch.numel())
    assert list(item_ranges(batch, sizer)) == [(0, 3, 7)]

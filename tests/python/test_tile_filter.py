"""tile_filter against per-tile torch statistics in float64."""

import math

import pytest
import torch

import octopus
from octopus.bench.filters import grid_tiles as bench_grid_tiles

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8]


def grid_tiles(h, w, lo, hi, seed=0):
    return bench_grid_tiles(h, w, lo, hi, torch.Generator().manual_seed(seed))


def reference(image, tiles, threshold):
    img = image.double() if image.dim() == 3 else image.double()[None]
    means, fractions = [], []
    for y0, x0, y1, x1 in tiles.tolist():
        t = img[:, y0:y1, x0:x1]
        means.append(t.mean())
        fractions.append((t > threshold).double().mean())
    return torch.tensor(means, dtype=torch.float64), torch.tensor(fractions, dtype=torch.float64)


def random_image(shape, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    return torch.rand(shape, generator=g, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", [None, 3])
@pytest.mark.parametrize("width", [263, 272])  # rows of single values; rows of whole 16-byte vectors
def test_stats_and_keep(device, dtype, channels, width):
    shape = (197, width) if channels is None else (channels, 197, width)
    image = random_image(shape, dtype)
    # Tiles start at every alignment and are 1 to 70 wide (heads and tails of single values).
    tiles = torch.cat([grid_tiles(197, width, 8, 70), torch.tensor([[0, 0, 1, 1], [196, width - 1, 197, width],
                                                                    [0, 0, 197, width], [10, 10, 60, 200],
                                                                    [3, 5, 9, 6], [3, 7, 90, 25], [0, 1, 5, 17]])])
    threshold = 128.0 if dtype == torch.uint8 else 0.5
    res = octopus.tile_filter(image.to(device), tiles.to(device), threshold, min_mean=threshold * 0.95,
                              max_fraction=0.55)
    mean, fraction = reference(image, tiles, threshold)
    torch.testing.assert_close(res.mean.cpu(), mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.fraction.cpu(), fraction, rtol=0, atol=1e-15)
    assert torch.equal(res.keep.cpu(), (mean >= threshold * 0.95) & (fraction <= 0.55))
    assert res.kept is None and res.kept_index is None
    assert 0 < int(res.keep.sum()) < len(tiles)


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_image_not_on_a_vector_boundary(device, dtype):
    """A contiguous view starting one element into its storage: every row's vectors start after
    a head of single values."""
    flat = random_image((1 + 3 * 64 * 128,), dtype, seed=6).to(device)
    image = flat[1:].view(3, 64, 128)
    tiles = grid_tiles(64, 128, 5, 40, seed=7).to(device)
    res = octopus.tile_filter(image, tiles, 0.5 if dtype != torch.uint8 else 100.0)
    mean, fraction = reference(image.cpu(), tiles.cpu(), 0.5 if dtype != torch.uint8 else 100.0)
    torch.testing.assert_close(res.mean.cpu(), mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.fraction.cpu(), fraction, rtol=0, atol=1e-15)


def test_gather_kept_tiles(device):
    image = random_image((2, 300, 410), torch.float32, seed=3)
    tiles = grid_tiles(300, 410, 16, 90, seed=4)
    res = octopus.tile_filter(image.to(device), tiles.to(device), 0.5, min_fraction=0.5, gather=True)
    _, fraction = reference(image, tiles, 0.5)
    keep = fraction >= 0.5
    assert torch.equal(res.keep.cpu(), keep)
    assert torch.equal(res.kept_index.cpu(), keep.nonzero().squeeze(1))
    crops = res.kept.cpu().unbind()
    assert len(crops) == int(keep.sum()) > 0
    for crop, i in zip(crops, res.kept_index.tolist()):
        y0, x0, y1, x1 = tiles[i].tolist()
        assert torch.equal(crop, image[:, y0:y1, x0:x1])


def test_nothing_kept_and_no_tiles(device):
    image = random_image((50, 60), torch.float32).to(device)
    tiles = grid_tiles(50, 60, 10, 20).to(device)
    res = octopus.tile_filter(image, tiles, 0.5, min_mean=2.0, gather=True)
    assert not res.keep.any() and len(res.kept) == 0 and res.kept.item_dim == 3
    none = octopus.tile_filter(image, torch.zeros(0, 4, dtype=torch.int64, device=device), 0.5, gather=True)
    assert none.mean.shape == (0,) and len(none.kept) == 0


def test_large_tile_precision(device):
    """One 4096 x 4096 tile of values near 1e4: float64 sums keep the mean exact to 1e-12."""
    image = (1e4 + torch.rand(4096, 4096, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    res = octopus.tile_filter(image.to(device), torch.tensor([[0, 0, 4096, 4096]], device=device), 1e4 + 0.5)
    torch.testing.assert_close(res.mean.cpu()[0], image.mean(), rtol=1e-12, atol=0)


def test_overlapping_tiles(device):
    image = random_image((64, 64), torch.float64).to(device)
    tiles = torch.tensor([[0, 0, 64, 64], [0, 0, 32, 32], [16, 16, 48, 48], [16, 16, 48, 48]], device=device)
    res = octopus.tile_filter(image, tiles, 0.3)
    mean, fraction = reference(image.cpu(), tiles.cpu(), 0.3)
    torch.testing.assert_close(res.mean.cpu(), mean)
    torch.testing.assert_close(res.fraction.cpu(), fraction)


def test_many_tiles_of_very_different_sizes(device):
    """Thousands of tiles from 1 px to the whole image, overlapping: the parts a large tile is cut
    into and the planning scan's rounds of tiles (more than one block's threads) add up."""
    image = random_image((2, 300, 700), torch.float32, seed=8)
    tiles = torch.cat([grid_tiles(300, 700, 1, 12, seed=9), torch.tensor([[0, 0, 300, 700], [0, 0, 150, 700],
                                                                          [5, 3, 300, 11], [299, 0, 300, 700]])])
    assert len(tiles) > 2048
    res = octopus.tile_filter(image.to(device), tiles.to(device), 0.5, max_fraction=0.5)
    mean, fraction = reference(image, tiles, 0.5)
    torch.testing.assert_close(res.mean.cpu(), mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(res.fraction.cpu(), fraction, rtol=0, atol=1e-15)
    assert torch.equal(res.keep.cpu(), fraction <= 0.5)


def neighbours(dtype, t):
    """The value of `dtype` nearest t (t > 0) and its two neighbours in that dtype."""
    if dtype == torch.uint8:
        c = min(max(round(t), 1), 254)
        return torch.tensor([c - 1, c, c + 1], dtype=torch.uint8)
    v = torch.tensor([t], dtype=torch.float64).to(dtype)
    bits = v.view(torch.int32 if dtype == torch.float32 else torch.int16)
    return torch.cat([(bits - 1).view(dtype), v, (bits + 1).view(dtype)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("threshold", [0.1, 0.5, 100.3, 1e39, -1e39, math.inf, -math.inf, math.nan])
def test_threshold_between_representable_values(device, dtype, threshold):
    """`value > threshold` as float64 compares it, for thresholds between two values of the
    image's dtype, exactly on one, and beyond its range."""
    values = torch.cat([neighbours(dtype, t) for t in (0.1, 0.5, 100.3)])
    if dtype != torch.uint8:
        big = torch.finfo(dtype).max
        values = torch.cat([values, torch.tensor([big, -big, math.inf, -math.inf], dtype=dtype)])
    image = values.repeat(8, 1)
    tiles = torch.tensor([[0, 0, 8, len(values)], [1, 2, 3, 9]])
    res = octopus.tile_filter(image.to(device), tiles.to(device), threshold)
    _, fraction = reference(image, tiles, threshold)
    torch.testing.assert_close(res.fraction.cpu(), fraction, rtol=0, atol=0)


def test_opcheck(device):
    image = random_image((2, 40, 50), torch.float32).to(device)
    tiles = grid_tiles(40, 50, 8, 20).to(device)
    torch.library.opcheck(torch.ops.octopus.tile_stats.default,
                          (image, tiles, 0.5, -math.inf, math.inf, 0.1, 0.9, True))


@pytest.mark.parametrize("tile, message", [
    ([0, 0, 0, 5], "empty tiles are rejected"),
    ([0, 0, 51, 5], "must satisfy"),
    ([-1, 0, 3, 5], "must satisfy"),
    ([0, 3, 5, 2], "must satisfy"),
])
def test_bad_tiles(device, tile, message):
    image = random_image((50, 60), torch.float32).to(device)
    with pytest.raises(ValueError, match=message):
        octopus.tile_filter(image, torch.tensor([tile], device=device), 0.5)


def test_bad_arguments(device):
    image = random_image((50, 60), torch.float32).to(device)
    tiles = torch.tensor([[0, 0, 5, 5]], device=device)
    with pytest.raises(TypeError, match="tiles must be an int64"):
        octopus.tile_filter(image, tiles.float(), 0.5)
    with pytest.raises(ValueError, match=r"tiles must be \[T, 4\]"):
        octopus.tile_filter(image, tiles[:, :3], 0.5)
    with pytest.raises(ValueError, match=r"image must be \[H, W\] or \[C, H, W\]"):
        octopus.tile_filter(image[0], tiles, 0.5)
    with pytest.raises(TypeError, match="values must be float32"):
        octopus.tile_filter(image.to(torch.int32), tiles, 0.5)
    with pytest.raises(ValueError, match="keep bounds are empty"):
        octopus.tile_filter(image, tiles, 0.5, min_mean=1.0, max_mean=0.0)
    with pytest.raises(ValueError, match="image is empty"):
        octopus.tile_filter(image[:0], tiles, 0.5)

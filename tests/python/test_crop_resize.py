"""crop_resize against F.interpolate of each crop (bilinear, align_corners=False)."""

import importlib

import pytest
import torch
import torch.nn.functional as F

import octopus

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8]


def frames(n, c, h, w, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.uint8).to(device)
    return torch.randn(n, c, h, w, generator=g, dtype=torch.float64).to(dtype).to(device)


def random_boxes(shapes, k, seed=1):
    """[K, 5] boxes inside images of the given (H, W), including border-touching and 1-pixel ones."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for j in range(k):
        i = int(torch.randint(0, len(shapes), (1,), generator=g))
        h, w = shapes[i]
        y0 = int(torch.randint(0, h, (1,), generator=g))
        x0 = int(torch.randint(0, w, (1,), generator=g))
        y1 = int(torch.randint(y0 + 1, h + 1, (1,), generator=g))
        x1 = int(torch.randint(x0 + 1, w + 1, (1,), generator=g))
        rows.append([i, y0, x0, y1, x1])
    (h0, w0), (h1, w1) = shapes[0], shapes[-1]
    rows += [[0, 0, 0, h0, w0], [0, 0, 0, 1, 1], [len(shapes) - 1, h1 - 1, max(w1 - 2, 0), h1, w1]]
    return torch.tensor(rows, dtype=torch.int64)


def reference(images, boxes, size, scale=1.0, mean=None, std=None):
    outs = []
    for i, y0, x0, y1, x1 in boxes.tolist():
        # float32 sampling coordinates, as torch computes them for float32 images (the op's
        # convention for every dtype; for float64 images torch's own are float64)
        crop = images[i][:, y0:y1, x0:x1].float()
        r = F.interpolate(crop[None], size=size, mode="bilinear", align_corners=False)[0].double() * scale
        if mean is not None:
            r = (r - torch.tensor(mean, dtype=torch.float64).view(-1, 1, 1)) / torch.tensor(std, dtype=torch.float64).view(-1, 1, 1)
        outs.append(r)
    return torch.stack(outs) if outs else torch.zeros(0, images[0].shape[0], *size, dtype=torch.float64)


@pytest.mark.parametrize("dtype", DTYPES)
# (224, 224): whole 16-byte quads and several row bands; (3, 1100): more column groups than threads
@pytest.mark.parametrize("size", [(7, 5), (24, 31), (1, 1), (224, 224), (3, 1100)])
def test_dense_frames(device, dtype, size):
    src = frames(3, 3, 37, 53, device, dtype)
    boxes = random_boxes([(37, 53)] * 3, 40).to(device)
    got = octopus.crop_resize(src, boxes, size)
    assert got.shape == (43, 3, *size) and got.dtype == (torch.float32 if dtype == torch.uint8 else dtype)
    want = reference([s.cpu() for s in src], boxes.cpu(), size)
    tol = dict(rtol=1e-2, atol=2e-2) if dtype in (torch.float16, torch.bfloat16) else dict(rtol=1e-5, atol=1e-5)
    if dtype == torch.uint8:
        tol = dict(rtol=1e-5, atol=2e-4)
    torch.testing.assert_close(got.cpu().double(), want, **tol)


def test_ragged_images_with_normalization(device):
    shapes = [(30, 41), (5, 3), (64, 20), (1, 1)]
    images = [torch.randint(0, 256, (3, h, w), generator=torch.Generator().manual_seed(i), dtype=torch.uint8)
              for i, (h, w) in enumerate(shapes)]
    batch = octopus.RaggedBatch.from_tensors(images, device=device)
    boxes = random_boxes(shapes, 30)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    got = octopus.crop_resize(batch, boxes.to(device), 16, scale=1 / 255, mean=mean, std=std)
    want = reference(images, boxes, (16, 16), 1 / 255, mean, std)
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-4)


def test_no_boxes(device):
    src = frames(1, 2, 8, 8, device, torch.float32)
    assert octopus.crop_resize(src, torch.zeros(0, 5, dtype=torch.int64), 4).shape == (0, 2, 4, 4)


def test_gradient(device):
    src = frames(2, 2, 9, 11, device, torch.float64).requires_grad_()
    boxes = torch.tensor([[0, 1, 2, 8, 10], [1, 0, 0, 9, 11], [0, 1, 2, 4, 5], [1, 3, 3, 4, 4]], device=device)
    torch.autograd.gradcheck(lambda s: octopus.crop_resize(s, boxes, (5, 13), scale=0.5, mean=[0.1, 0.2],
                                                           std=[2.0, 0.5]), (src,))


def test_dense_layout_cache_across_modes(device):
    # A dense source's offsets and sizes are cached per shape; a call in inference mode must not
    # leave inference tensors behind for a later differentiable call (autograd saves them).
    src = frames(2, 2, 9, 11, device, torch.float64)
    boxes = torch.tensor([[0, 1, 2, 8, 10], [1, 0, 0, 9, 11]], device=device)
    # (octopus.crop_resize is the function; its module keeps the layouts.)
    importlib.import_module("octopus.crop_resize")._dense_layout.cache_clear()  # made in inference mode below
    with torch.inference_mode():
        first = octopus.crop_resize(src, boxes, (5, 6))
    grad_src = src.clone().requires_grad_()
    second = octopus.crop_resize(grad_src, boxes, (5, 6), std=[1.0, 2.0])
    second.sum().backward()
    assert grad_src.grad is not None and torch.equal(first[:, 0], second.detach()[:, 0])
    assert torch.equal(octopus.crop_resize(src, boxes, (5, 6)), first)  # from the cache


def two_frames(device):
    """values, offsets, sizes and two boxes of a packed batch of two 2 x 9 x 11 frames."""
    values = frames(2, 2, 9, 11, device, torch.float32).reshape(-1)
    offsets = torch.tensor([0, 198, 396], device=device)
    sizes = torch.tensor([[2, 9, 11], [2, 9, 11]], device=device)
    boxes = torch.tensor([[0, 1, 2, 8, 10], [1, 0, 0, 9, 11]], device=device)
    return values, offsets, sizes, boxes


def test_opcheck(device):
    values, offsets, sizes, boxes = two_frames(device)
    torch.library.opcheck(torch.ops.octopus.crop_resize.default,
                          (values, offsets, sizes, boxes, 2, 5, 7, 1.0, None, torch.ones(2, device=device), True))


@pytest.mark.parametrize("box, message", [
    ([0, 3, 3, 3, 6], "zero-size"),
    ([0, 0, 0, 10, 5], "must satisfy"),
    ([0, -1, 0, 3, 5], "must satisfy"),
    ([2, 0, 0, 3, 3], "refers to image 2"),
])
def test_bad_boxes(device, box, message):
    src = frames(2, 1, 9, 11, device, torch.float32)
    with pytest.raises(ValueError, match=message):
        octopus.crop_resize(src, torch.tensor([box], device=device), 4)


def test_bad_arguments(device):
    src = frames(2, 1, 9, 11, device, torch.float32)
    good = torch.tensor([[0, 0, 0, 3, 3]], device=device)
    with pytest.raises(TypeError, match="boxes must be an int64"):
        octopus.crop_resize(src, good.float(), 4)
    with pytest.raises(ValueError, match=r"boxes must be \[K, 5\]"):
        octopus.crop_resize(src, good[:, :4], 4)
    with pytest.raises(ValueError, match="output size must be positive"):
        octopus.crop_resize(src, good, (0, 4))
    with pytest.raises(ValueError, match="mean must have one value per channel"):
        octopus.crop_resize(src, good, 4, mean=[0.1, 0.2], std=[1.0, 1.0])
    with pytest.raises(ValueError, match=r"\[N, C, H, W\]"):
        octopus.crop_resize(src[0], good, 4)
    mixed = octopus.RaggedBatch.from_tensors([torch.zeros(3, 4, 4), torch.zeros(1, 4, 4)], device=device)
    with pytest.raises(ValueError, match="image 1 has 1 channels, expected 3"):
        octopus.crop_resize(mixed, good, 4)

"""crop_resize to per-box sizes / own sizes (ragged output) and ragged -> ragged resize,
against F.interpolate of each crop in float64."""

import pytest
import torch

import octopus
from test_crop_resize import DTYPES, frames, random_boxes, reference, two_frames


def per_box_reference(images, boxes, sizes, scale=1.0, mean=None, std=None):
    outs = [reference(images, boxes[k:k + 1], tuple(sizes[k]), scale, mean, std)[0] for k in range(len(boxes))]
    return torch.cat([o.reshape(-1) for o in outs]) if outs else torch.zeros(0, dtype=torch.float64)


def tolerance(dtype):
    if dtype in (torch.float16, torch.bfloat16):
        return dict(rtol=1e-2, atol=2e-2)
    # uint8 values reach 255: float32 sampling positions (as torch computes them for float32)
    # move results by up to ~2e-6 of the value range.
    return dict(rtol=1e-5, atol=1e-3 if dtype == torch.uint8 else 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_box_sizes_every_strategy(device, dtype):
    src = frames(2, 3, 41, 29, device, dtype)
    boxes = random_boxes([(41, 29)] * 2, 25)
    g = torch.Generator().manual_seed(2)
    sizes = torch.randint(1, 40, (len(boxes), 2), generator=g)
    sizes[0] = torch.tensor([1, 1])
    want = per_box_reference([s.cpu() for s in src], boxes, sizes.tolist())
    for strategy in octopus.STRATEGIES:
        got = octopus.crop_resize(src, boxes.to(device), sizes, strategy=strategy, block_elems=512)
        assert isinstance(got, octopus.RaggedBatch)
        assert got.item_shapes() == [(3, h, w) for h, w in sizes.tolist()]
        assert got.dtype == (torch.float32 if dtype == torch.uint8 else dtype)
        torch.testing.assert_close(got.values.cpu().double(), want, **tolerance(dtype))


def test_own_size_is_an_exact_copy(device):
    shapes = [(30, 41), (5, 3), (64, 20), (1, 1)]
    images = [torch.randn(2, h, w, dtype=torch.float64) for h, w in shapes]
    batch = octopus.RaggedBatch.from_tensors(images, device=device)
    boxes = random_boxes(shapes, 20)
    got = octopus.crop_resize(batch, boxes.to(device), None).cpu().unbind()
    for crop, (i, y0, x0, y1, x1) in zip(got, boxes.tolist()):
        assert torch.equal(crop, images[i][:, y0:y1, x0:x1])


def test_ragged_resize_with_normalization(device):
    shapes = [(30, 41), (5, 3), (64, 20), (1, 1), (7, 90)]
    images = [torch.randint(0, 256, (3, h, w), generator=torch.Generator().manual_seed(i), dtype=torch.uint8)
              for i, (h, w) in enumerate(shapes)]
    batch = octopus.RaggedBatch.from_tensors(images, device=device)
    targets = [(15, 20), (10, 6), (32, 10), (3, 2), (7, 90)]
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    got = octopus.resize(batch, targets, scale=1 / 255, mean=mean, std=std)
    boxes = torch.tensor([[i, 0, 0, h, w] for i, (h, w) in enumerate(shapes)])
    want = per_box_reference(images, boxes, targets, 1 / 255, mean, std)
    torch.testing.assert_close(got.values.cpu().double(), want, rtol=1e-5, atol=1e-4)


def test_empty(device):
    src = frames(1, 2, 8, 8, device, torch.float32)
    got = octopus.crop_resize(src, torch.zeros(0, 5, dtype=torch.int64), None)
    assert len(got) == 0 and got.numel() == 0


def test_gradient(device):
    src = frames(2, 2, 9, 11, device, torch.float64)
    boxes = torch.tensor([[0, 1, 2, 8, 10], [1, 0, 0, 9, 11], [0, 1, 2, 4, 5], [1, 3, 3, 4, 4]], device=device)
    sizes = [(5, 13), (9, 11), (1, 2), (3, 3)]
    values = src.reshape(-1).clone().requires_grad_()
    offsets = torch.tensor([0, 198, 396], device=device)
    layout = torch.tensor([[2, 9, 11], [2, 9, 11]], device=device)
    out_sizes = torch.tensor([[2, h, w] for h, w in sizes], device=device)
    out_offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), out_sizes.prod(1).cumsum(0)])
    n = int(out_offsets[-1])
    std = torch.tensor([2.0, 0.5], dtype=torch.float64, device=device)
    for strategy in ("plan", "search"):
        torch.autograd.gradcheck(
            lambda v: torch.ops.octopus.crop_resize_ragged(v, offsets, layout, boxes, 2, out_offsets, out_sizes, n,
                                                           0.5, None, std, strategy, 0, None, True), (values,))
    # Through the Python API: same gradient as the dense form when every size is the same.
    a = src.clone().requires_grad_()
    octopus.crop_resize(a, boxes, [(4, 6)] * 4).values.square().sum().backward()
    b = src.clone().requires_grad_()
    octopus.crop_resize(b, boxes, (4, 6)).square().sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_opcheck(device):
    values, offsets, sizes, boxes = two_frames(device)
    out_sizes = torch.tensor([[2, 3, 4], [2, 9, 11]], device=device)
    out_offsets = torch.tensor([0, 24, 222], device=device)
    torch.library.opcheck(torch.ops.octopus.crop_resize_ragged.default,
                          (values, offsets, sizes, boxes, 2, out_offsets, out_sizes, 222, 1.0, None, None, "plan", 0,
                           None, True))


def test_bad_arguments(device):
    src = frames(2, 1, 9, 11, device, torch.float32)
    good = torch.tensor([[0, 0, 0, 3, 3]], device=device)
    with pytest.raises(ValueError, match=r"per-box sizes must be \[K, 2\]"):
        octopus.crop_resize(src, good, [(3, 3), (4, 4)])
    with pytest.raises(ValueError, match="per-box sizes must be positive"):
        octopus.crop_resize(src, good, [(0, 3)])
    with pytest.raises(ValueError, match="is empty"):
        octopus.crop_resize(src, torch.tensor([[0, 3, 3, 3, 6]], device=device), None)
    with pytest.raises(ValueError, match="must satisfy"):
        octopus.crop_resize(src, torch.tensor([[0, 0, 0, 10, 5]], device=device), None)
    batch = octopus.RaggedBatch.from_tensors([torch.zeros(1, 4, 4), torch.zeros(1, 2, 5)], device=device)
    with pytest.raises(ValueError, match=r"per-box sizes must be \[K, 2\]"):
        octopus.resize(batch, [(3, 3)])
    with pytest.raises(ValueError, match=r"\[C, H, W\]"):
        octopus.resize(octopus.RaggedBatch.from_tensors([torch.zeros(4, 4)], device=device), [(2, 2)])
    values = src.reshape(-1)
    offsets = torch.tensor([0, 99, 198], device=device)
    sizes = torch.tensor([[1, 9, 11], [1, 9, 11]], device=device)
    with pytest.raises(ValueError, match="out_offsets must be"):
        torch.ops.octopus.crop_resize_ragged(values, offsets, sizes, good, 1, torch.tensor([0], device=device),
                                             torch.tensor([[1, 3, 3]], device=device), 9)
    with pytest.raises(ValueError, match="must have the source's 1 channels"):
        torch.ops.octopus.crop_resize_ragged(values, offsets, sizes, good, 1, torch.tensor([0, 18], device=device),
                                             torch.tensor([[2, 3, 3]], device=device), 18)
    with pytest.raises(ValueError, match="offsets"):
        torch.ops.octopus.crop_resize_ragged(values, offsets, sizes, good, 1, torch.tensor([0, 10], device=device),
                                             torch.tensor([[1, 3, 3]], device=device), 10)

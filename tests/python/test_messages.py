"""Error messages print shapes and sizes one way everywhere: as Python tuples, on one line
(the C++ checks through format_shape in core/checks.h, Python through octopus._messages)."""

import re

import pytest
import torch

import octopus
from octopus._messages import describe, format_shape

I64 = torch.int64


def test_format_shape():
    assert format_shape((3, 480, 640)) == "(3, 480, 640)"
    assert format_shape(torch.Size([5])) == "(5,)"
    assert format_shape([]) == "()"
    nt = torch.nested.nested_tensor([torch.zeros(2, 4), torch.zeros(3, 4)], layout=torch.jagged)
    assert re.fullmatch(r"\(2, j\d+, 4\)", format_shape(nt.shape))


def test_describe():
    assert describe(torch.zeros(2, 3, dtype=torch.float16)) == "a tensor of dtype torch.float16 and shape (2, 3)"
    assert describe([torch.zeros(1), 2]) == "a list of 2 items (Tensor, int)"
    assert describe(()) == "a tuple of 0 items (empty)"
    assert describe(7) == "an int" and describe("x") == "a str" and describe(None) == "None"
    strided = torch.nested.nested_tensor([torch.zeros(2, 4), torch.zeros(3, 5)], layout=torch.strided)
    assert describe(strided) == "a strided nested tensor of dtype torch.float32 with 2 items of 2 dimensions"


def test_from_padded_sizes_larger_than_the_slot(device):
    """Issue 16's case: the size row printed over several lines as a tensor."""
    with pytest.raises(ValueError) as info:
        octopus.from_padded(torch.zeros(2, 4, 4, device=device), torch.tensor([[5, 4], [2, 2]], device=device))
    assert str(info.value) == "item 0 of shape (5, 4) does not fit padded's slot (4, 4) (1 item does not)"
    offsets = torch.tensor([0, 4, 40], device=device)
    with pytest.raises(ValueError) as info:
        torch.ops.octopus.from_padded(torch.zeros(2, 5, 6, device=device), offsets,
                                      torch.tensor([[2, 2], [4, 9]], device=device), 40, "plan", 0, None, True)
    assert str(info.value) == "item 1 of shape (4, 9) does not fit padded's slot (5, 6) (1 item does not)"


def raw_cases(device):
    """(what, call, the message's expected text) for the C++ checks."""
    def t(*values, dtype=torch.float32):
        return torch.tensor(values, dtype=dtype, device=device)

    v5, o2 = torch.zeros(5, device=device), t(0, 2, 5, dtype=I64)
    ones = torch.ones(2, device=device)
    affine = torch.ops.octopus.affine
    return [
        ("values 2-D", lambda: affine(torch.zeros(2, 3, device=device), o2, ones, ones),
         "values must be 1-D (the items' elements back to back), got shape (2, 3)"),
        ("offsets 2-D", lambda: affine(v5, o2.view(3, 1), ones, ones),
         "offsets must be 1-D [num_items + 1], got shape (3, 1)"),
        ("scale shape", lambda: affine(v5, o2, torch.ones(3, device=device), torch.ones(3, device=device)),
         "scale must have shape [num_items] or [num_items, channels] with num_items = 2, got (3,)"),
        ("bias shape", lambda: affine(v5, o2, ones, torch.ones(2, 1, device=device)),
         "bias must have the same shape as scale (2,), got (2, 1)"),
        ("sizes against offsets", lambda: torch.ops.octopus.validate_layout(o2, t(1, 2, 1, 4, dtype=I64).view(2, 2), 5),
         "sizes[1] = (1, 4) has 4 elements but offsets give item 1 3 (offsets[2] - offsets[1])"),
        ("sizes shape", lambda: torch.ops.octopus.validate_layout(o2, t(2, 3, dtype=I64).view(1, 2), 5),
         "sizes must have shape [num_items, D] = (2, D), got (1, 2)"),
        ("max_shape length", lambda: torch.ops.octopus.to_padded(v5, o2, t(2, 3, dtype=I64).view(2, 1), [4, 4]),
         "max_shape must have one extent per item dimension (1), got (4, 4)"),
        ("metadata shape", lambda: affine(v5, o2, ones, ones, "plan", 0, torch.zeros(7, 2, dtype=I64, device=device)),
         "must be the plan of this batch built with block_elems=4096 (int64 of shape (3, 2), from octopus.plan); "
         "got Long of shape (7, 2)"),
        ("stencil weight", lambda: torch.ops.octopus.stencil3x3(v5, o2, t(1, 2, 1, 3, dtype=I64).view(2, 2),
                                                                torch.zeros(1, 8, device=device)),
         "weight must be [channels, 9] (one 3x3 kernel per channel, row-major), got shape (1, 8)"),
        ("crop boxes", lambda: torch.ops.octopus.crop_resize(v5, t(0, 5, dtype=I64), t(1, 1, 5, dtype=I64).view(1, 3),
                                                             torch.zeros(1, 4, dtype=I64, device=device), 1, 2, 2),
         "boxes must be [K, 5] (image, y0, x0, y1, x1), got shape (1, 4)"),
        ("crop output size", lambda: torch.ops.octopus.crop_resize(v5, t(0, 5, dtype=I64), t(1, 1, 5, dtype=I64).view(1, 3),
                                                                   torch.zeros(0, 5, dtype=I64, device=device), 1, 0, 4),
         "the output size must be positive, got (0, 4)"),
        ("tile image", lambda: torch.ops.octopus.tile_stats(torch.zeros(1, 1, 2, 2, device=device),
                                                            torch.zeros(0, 4, dtype=I64, device=device),
                                                            0.5, 0.0, 1.0, 0.0, 1.0),
         "image must be [H, W] or [C, H, W], got shape (1, 1, 2, 2)"),
        ("tiles shape", lambda: torch.ops.octopus.tile_stats(torch.zeros(2, 2, device=device),
                                                             torch.zeros(1, 3, dtype=I64, device=device),
                                                             0.5, 0.0, 1.0, 0.0, 1.0),
         "tiles must be [T, 4] (y0, x0, y1, x1), got shape (1, 3)"),
    ]


def python_cases(device):
    batch = octopus.RaggedBatch.from_tensors([torch.zeros(2, 3), torch.zeros(1, 4)], device=device)
    frames = torch.zeros(2, 3, 8, 8, device=device)
    boxes = torch.tensor([[0, 0, 0, 2, 2], [1, 0, 0, 0, 3]], device=device)
    return [
        ("pointwise parameter", lambda: octopus.clamp(batch, torch.zeros(3, device=device), 1.0),
         "lo must have shape [num_items] or [num_items, channels] with num_items = 2, got (3,)"),
        ("max_size", lambda: octopus.to_padded(batch, 0.0, max_size=(4,)),
         "max_size must have 2 non-negative extents, got (4,)"),
        ("from_padded sizes", lambda: octopus.from_padded(torch.zeros(2, 4, 4, device=device), [[1, 1]]),
         "sizes must have shape [M, D] = (2, 2) for padded of shape (2, 4, 4), got (1, 2)"),
        ("stencil weight", lambda: octopus.stencil3x3(batch, torch.zeros(2, 2)),
         "weight must be [3, 3], [C, 3, 3] or [C, 1, 3, 3] with C = 1, got shape (2, 2)"),
        ("per-box sizes", lambda: octopus.crop_resize(frames, boxes, [[3, 3]]),
         "per-box sizes must be [K, 2] = (2, 2), got shape (1, 2)"),
        ("empty box", lambda: octopus.crop_resize(frames, boxes, None),
         "boxes[1] = (1, 0, 0, 0, 3) is empty"),
        ("dense source", lambda: octopus.crop_resize(frames[0], boxes, 4),
         "a dense source must be [N, C, H, W] frames, got shape (3, 8, 8)"),
        ("boxes shape", lambda: octopus.crop_resize(frames, boxes[:, :4], 4),
         "boxes must be [K, 5] (image, y0, x0, y1, x1), got shape (2, 4)"),
        ("with_values", lambda: batch.with_values(torch.zeros(4, device=device)),
         "values must have shape (10,), got a tensor of dtype torch.float32 and shape (4,)"),
    ]


@pytest.mark.parametrize("origin", ["C++", "Python"])
def test_shapes_print_as_tuples_on_one_line(origin, device):
    cases = raw_cases(device) if origin == "C++" else python_cases(device)
    for what, call, expected in cases:
        with pytest.raises((ValueError, TypeError)) as info:
            call()
        message = str(info.value)
        assert expected in message, f"{what}: {message!r}"
        assert "\n" not in message and "Type{" not in message and "[ " not in message, f"{what}: {message!r}"

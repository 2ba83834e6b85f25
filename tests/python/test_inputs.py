"""Every op takes what users hold: a RaggedBatch, a list or tuple of tensors, or a torch.nested
tensor (jagged or strided). Each op and each input form against the op on a RaggedBatch, plus
the form of the result, packing once, sharing a jagged tensor's values, autograd through the
forms, and the TypeError of anything else."""

import pytest
import torch

import octopus
from octopus.inputs import as_ragged

FORMS = ["batch", "list", "tuple", "jagged", "strided"]


def random_items(shapes, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def in_form(items, form, device):
    items = [t.to(device) for t in items]
    if form == "batch":
        return octopus.RaggedBatch.from_tensors(items, device=device)
    if form == "list":
        return items
    if form == "tuple":
        return tuple(items)
    layout = torch.jagged if form == "jagged" else torch.strided
    return torch.nested.as_nested_tensor(items, layout=layout)


def items_of(result):
    """A result's items (on the CPU), checking its form is a RaggedBatch or a nested tensor."""
    if isinstance(result, octopus.RaggedBatch):
        return [t.cpu() for t in result.unbind()]
    assert isinstance(result, torch.Tensor) and result.is_nested
    return [t.cpu() for t in result.unbind()]


def expected_form(result, form):
    if form in ("jagged", "strided"):
        layout = torch.jagged if form == "jagged" else torch.strided
        return isinstance(result, torch.Tensor) and result.is_nested and result.layout == layout
    return isinstance(result, octopus.RaggedBatch)


def assert_items_equal(got, want, exact=True):
    """Bit for bit on the CPU; to float32 rounding on CUDA (its statistics add with atomics,
    and a packed copy may be aligned differently from the input it came from)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        tolerance = {"rtol": 0, "atol": 0} if exact else {}
        torch.testing.assert_close(g, w, equal_nan=True, **tolerance)


# Item shapes: [L_i, 4] (jagged in its first dimension: the zero-copy path) and [3, H_i, 5]
# (jagged in the second: copied item by item), each with an empty item.
ROWS = [(5, 4), (0, 4), (9, 4), (1, 4)]
IMAGES = [(3, 6, 5), (3, 0, 5), (3, 11, 5), (3, 2, 5)]
PLANES = [(6, 5), (0, 5), (11, 5), (2, 5)]  # [H, W] items for the stencils


def per_item(m, device, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    return (lo + (hi - lo) * torch.rand(m, generator=g)).to(device)


LAYOUT_OPS = {
    "affine": lambda x, d: octopus.affine(x, per_item(len(ROWS), d, -2, 2, 1), 0.25),
    "affine_per_channel": lambda x, d: octopus.affine(x, per_item(12, d, 0.5, 2, 2).view(4, 3),
                                                      per_item(12, d, -1, 1, 3).view(4, 3)),
    "clamp": lambda x, d: octopus.clamp(x, -0.5, per_item(4, d, 0, 1, 4)),
    "threshold": lambda x, d: octopus.threshold(x, per_item(4, d, -0.5, 0.5, 5)),
    "threshold_keep": lambda x, d: octopus.threshold(x, per_item(4, d, -0.5, 0.5, 6), mode="keep", value=-3.0),
    "power": lambda x, d: octopus.power(x, torch.tensor([2.0, 1.0, 3.0, 2.0], device=d), 0.5),
    "normalize": lambda x, d: octopus.normalize(x),
    "normalize_fixed": lambda x, d: octopus.normalize(x, mean=[0.1], std=[2.0]),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("op", sorted(LAYOUT_OPS))
@pytest.mark.parametrize("shapes", [ROWS, IMAGES], ids=["rows", "images"])
def test_layout_preserving_ops_take_every_form(op, form, shapes, device):
    if op == "affine_per_channel" and shapes is ROWS:
        pytest.skip("per-channel parameters need [C, ...] items")
    items = random_items(shapes)
    want = items_of(LAYOUT_OPS[op](octopus.RaggedBatch.from_tensors(items, device=device), device))
    got = LAYOUT_OPS[op](in_form(items, form, device), device)
    assert expected_form(got, form), type(got)
    assert_items_equal(items_of(got), want, exact=device.type == "cpu")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("op", ["gaussian_blur", "box_blur", "stencil3x3", "depthwise_conv3x3"])
@pytest.mark.parametrize("shapes", [PLANES, IMAGES], ids=["planes", "images"])
def test_stencils_take_every_form(op, form, shapes, device):
    items = random_items(shapes, seed=7)
    channels = shapes[0][0] if len(shapes[0]) == 3 else 1
    weight = torch.randn(channels, 3, 3, generator=torch.Generator().manual_seed(8)).to(device)
    run = {
        "gaussian_blur": lambda x: octopus.gaussian_blur(x),
        "box_blur": lambda x: octopus.box_blur(x, border="zero"),
        "stencil3x3": lambda x: octopus.stencil3x3(x, weight[0], border="replicate"),
        "depthwise_conv3x3": lambda x: octopus.depthwise_conv3x3(x, weight),
    }[op]
    want = items_of(run(octopus.RaggedBatch.from_tensors(items, device=device)))
    got = run(in_form(items, form, device))
    assert expected_form(got, form)
    assert_items_equal(items_of(got), want, exact=device.type == "cpu")


@pytest.mark.parametrize("form", FORMS)
def test_item_stats_takes_every_form(form, device):
    items = random_items(IMAGES, seed=9)
    for channels in (0, 3):
        want = octopus.item_stats(octopus.RaggedBatch.from_tensors(items, device=device), channels)
        got = octopus.item_stats(in_form(items, form, device), channels)
        assert isinstance(got, octopus.ItemStats)
        for g, w in zip(got, want):
            exact = {"rtol": 0, "atol": 0} if device.type == "cpu" else {}  # CUDA adds with atomics
            torch.testing.assert_close(g, w, equal_nan=True, **exact)


@pytest.mark.parametrize("form", FORMS)
def test_to_padded_and_plan_take_every_form(form, device):
    items = random_items(ROWS, seed=10)
    batch = octopus.RaggedBatch.from_tensors(items, device=device)
    got = octopus.to_padded(in_form(items, form, device), -1.0)
    assert not got.is_nested
    assert torch.equal(got, octopus.to_padded(batch, -1.0))
    cropped = octopus.to_padded(in_form(items, form, device), 0.0, max_size=(3, 2))
    assert torch.equal(cropped, octopus.to_padded(batch, 0.0, max_size=(3, 2)))
    assert torch.equal(octopus.plan(in_form(items, form, device), 64), batch.plan(64))


@pytest.mark.parametrize("form", FORMS)
def test_crop_resize_and_resize_take_every_form(form, device):
    items = random_items(IMAGES[:1] + IMAGES[2:], seed=11)  # no empty image: boxes need pixels
    batch = octopus.RaggedBatch.from_tensors(items, device=device)
    boxes = torch.tensor([[0, 1, 0, 5, 4], [2, 0, 1, 2, 5], [1, 3, 2, 11, 5]], device=device)
    source = in_form(items, form, device)
    exact = device.type == "cpu"
    fixed = octopus.crop_resize(source, boxes, (4, 6))
    assert not fixed.is_nested
    assert_items_equal([fixed.cpu()], [octopus.crop_resize(batch, boxes, (4, 6)).cpu()], exact)
    for size in ([(3, 3), (2, 7), (5, 1)], None):
        got = octopus.crop_resize(in_form(items, form, device), boxes, size)
        assert isinstance(got, octopus.RaggedBatch)  # the crops are not the source's items
        assert_items_equal(items_of(got), items_of(octopus.crop_resize(batch, boxes, size)), exact)
    sizes = [(2, 3), (7, 7), (1, 4)]
    got = octopus.resize(in_form(items, form, device), sizes)
    assert isinstance(got, octopus.RaggedBatch)
    assert_items_equal(items_of(got), items_of(octopus.resize(batch, sizes)), exact)


def test_jagged_input_shares_values_and_result_shares_offsets(device):
    nt = torch.nested.nested_tensor(random_items(ROWS, seed=12), layout=torch.jagged, device=device)
    assert as_ragged(nt).batch.values.data_ptr() == nt.values().data_ptr()
    out = octopus.affine(nt, 2.0, 1.0)
    assert out.offsets() is nt.offsets()  # the same ragged structure: torch combines them
    torch.testing.assert_close((out - 2 * nt).values(), torch.ones_like(nt.values()))
    assert out.values().data_ptr() != nt.values().data_ptr()  # out of place


def test_a_list_is_packed_once(monkeypatch, device):
    calls = []
    pack = octopus.RaggedBatch._from_tensors.__func__

    def counting(cls, *args, **kwargs):
        calls.append(args[1] if len(args) > 1 else kwargs.get("name"))
        return pack(cls, *args, **kwargs)

    monkeypatch.setattr(octopus.RaggedBatch, "_from_tensors", classmethod(counting))
    items = [t.to(device) for t in random_items(IMAGES, seed=13)]
    octopus.normalize(items, 3)  # item_stats and affine inside: one packing
    assert calls == ["batch"]
    calls.clear()
    octopus.resize(items[:1] + items[2:], [(2, 2)] * 3)  # crop_resize inside (no empty image to resize)
    assert calls == ["batch"]


def test_empty_lists_are_refused_naming_the_argument(device):
    """An empty list says neither dtype, device nor item shape: no op invents them."""
    no_boxes = torch.zeros(0, 5, dtype=torch.int64, device=device)
    for name, call in [("x", lambda: octopus.affine([], 2.0)), ("batch", lambda: octopus.gaussian_blur([])),
                       ("batch", lambda: octopus.to_padded([])), ("batch", lambda: octopus.item_stats([])),
                       ("batch", lambda: octopus.normalize([])), ("source", lambda: octopus.crop_resize([], no_boxes, 4)),
                       ("tensors", lambda: octopus.RaggedBatch.from_tensors([]))]:
        with pytest.raises(ValueError, match=rf"^{name} is empty, .*from_tensors\(\[\], item_dim=D"):
            call()


def test_empty_batches_give_empty_results_of_their_shape(device):
    empty = {d: octopus.RaggedBatch.from_tensors([], item_dim=d, dtype=torch.float64, device=device) for d in (1, 2, 3)}
    assert len(octopus.affine(empty[1], 2.0)) == 0 and octopus.affine(empty[1], 2.0).dtype == torch.float64
    assert octopus.gaussian_blur(empty[2]).item_dim == 2
    assert octopus.to_padded(empty[2]).shape == (0, 0, 0)
    assert octopus.item_stats(empty[1]).mean.shape == (0,)
    assert octopus.item_stats(empty[3], 3).mean.shape == (0, 3)
    assert octopus.normalize(empty[3], 3).item_dim == 3
    no_boxes = torch.zeros(0, 5, dtype=torch.int64, device=device)
    assert octopus.crop_resize(torch.zeros(0, 3, 8, 8, device=device), no_boxes, 4).shape == (0, 3, 4, 4)
    assert len(octopus.crop_resize(empty[3], no_boxes, torch.zeros(0, 2, dtype=torch.int64))) == 0
    with pytest.raises(ValueError, match=r"^source has no images, so nothing says C"):
        octopus.crop_resize(empty[3], no_boxes, 4)
    assert octopus.RaggedBatch.from_tensors([], item_dim=2).dtype == torch.get_default_dtype()
    with pytest.raises(ValueError, match="item_dim must be a positive int"):
        octopus.RaggedBatch.from_tensors([], item_dim=0)


@pytest.mark.parametrize("form", ["list", "jagged", "strided"])
def test_gradients_flow_through_every_form(form, device):
    items = [t.to(device).requires_grad_() for t in random_items(ROWS, seed=14)]
    x = in_form(items, form, device) if form != "list" else items
    scale = torch.tensor([1.0, 2.0, 3.0, 4.0], device=device)
    out = octopus.affine(x, scale, 0.5)
    values = out.values if isinstance(out, octopus.RaggedBatch) else torch.cat([t.reshape(-1) for t in out.unbind()])
    values.sum().backward()
    for t, s in zip(items, scale.tolist()):
        torch.testing.assert_close(t.grad, torch.full_like(t, s))


BAD_INPUTS = {
    "dense tensor": (torch.zeros(2, 3, 4), "a tensor of dtype torch.float32 and shape (2, 3, 4)"),
    "int": (3, "an int"),
    "dict": ({"a": 1}, "a dict"),
    "None": (None, "None"),
}
ACCEPTED = "a RaggedBatch, a list or tuple of tensors, or a torch.nested tensor (jagged or strided)"
OPS_BY_ARGUMENT = {
    "clamp": ("x", lambda x: octopus.clamp(x, 0.0, 1.0)),
    "threshold": ("x", lambda x: octopus.threshold(x, 0.5)),
    "power": ("x", lambda x: octopus.power(x, 2.0)),
    "normalize": ("batch", lambda x: octopus.normalize(x)),
    "item_stats": ("batch", lambda x: octopus.item_stats(x)),
    "to_padded": ("batch", lambda x: octopus.to_padded(x)),
    "gaussian_blur": ("batch", lambda x: octopus.gaussian_blur(x)),
    "stencil3x3": ("batch", lambda x: octopus.stencil3x3(x, [0.0] * 9)),
    "resize": ("batch", lambda x: octopus.resize(x, [(2, 2)])),
}


@pytest.mark.parametrize("bad", sorted(BAD_INPUTS))
@pytest.mark.parametrize("op", sorted(OPS_BY_ARGUMENT))
def test_type_errors_name_what_was_given_and_what_is_accepted(op, bad):
    name, run = OPS_BY_ARGUMENT[op]
    value, described = BAD_INPUTS[bad]
    with pytest.raises(TypeError) as info:
        run(value)
    message = str(info.value)
    assert message.startswith(f"{name} must be {ACCEPTED}; got {described}"), message
    assert "\n" not in message


def test_type_errors_of_ops_that_take_more():
    with pytest.raises(TypeError, match=r"^x must be a RaggedBatch, a list or tuple of tensors, a torch.nested tensor "
                                        r"\(jagged or strided\), or a 1-D values tensor with offsets=; got a tensor "
                                        r"of dtype torch.float32 and shape \(2, 3\) and no offsets$"):
        octopus.affine(torch.zeros(2, 3), 2.0)
    with pytest.raises(TypeError, match=r"^source must be a RaggedBatch, a list or tuple of tensors, a torch.nested "
                                        r"tensor \(jagged or strided\), or a dense \[N, C, H, W\] tensor; got a str$"):
        octopus.crop_resize("frames", torch.zeros(0, 5, dtype=torch.int64), 4)
    with pytest.raises(TypeError, match=r"^batch\[1\] must be a tensor \(one item\), got a str$"):
        octopus.normalize([torch.zeros(2), "x"])
    with pytest.raises(TypeError, match=r"^x\[0\] must be a tensor \(one item\), got a list of 2 items \(float\)$"):
        octopus.clamp([[1.0, 2.0]], 0.0, 1.0)
    with pytest.raises(ValueError, match=r"^all items must have the same number of dimensions: batch\[0\] has shape "
                                         r"\(2,\), batch\[1\] has shape \(2, 2\)$"):
        octopus.item_stats([torch.zeros(2), torch.zeros(2, 2)])

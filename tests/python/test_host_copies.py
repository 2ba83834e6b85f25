"""Small host arguments (weights, boxes, sizes, constants, layouts) reach the GPU without a
stream synchronization, in order, and intact: an eager loop of small launches keeps more than
one in flight (a copy from pageable memory would make each call wait for the queue)."""

import importlib

import numpy as np
import pytest
import torch

import octopus
from octopus import _host_copies
from conftest import HAS_CUDA, random_batch


def test_to_device_on_the_host_is_tensor_to():
    t = torch.arange(6, dtype=torch.int64).view(2, 3)
    same = _host_copies.to_device(t, torch.device("cpu"))
    assert same is t
    as_float = _host_copies.to_device(t, torch.device("cpu"), torch.float64)
    assert as_float.dtype == torch.float64 and torch.equal(as_float, t.double())
    from_numpy = _host_copies.to_device(np.array([1.5, -2.0]), torch.device("cpu"))
    assert torch.equal(from_numpy, torch.tensor([1.5, -2.0], dtype=torch.float64))


def test_constant_is_made_once_per_values_dtype_and_device():
    cpu = torch.device("cpu")
    a = _host_copies.constant([1, 2, 3.5], torch.float32, cpu)
    assert torch.equal(a, torch.tensor([1.0, 2.0, 3.5]))
    assert _host_copies.constant((1.0, 2.0, 3.5), torch.float32, cpu) is a
    assert _host_copies.constant([1, 2, 3.5], torch.float64, cpu) is not a
    assert _host_copies.constant([1, 2, 3.25], torch.float32, cpu) is not a


def test_constant_first_made_in_inference_mode_can_be_saved_for_backward():
    weight = [0.5, -1.0, 0.25, 2.0, 1.0, 0.75, -0.5, 0.125, 3.0]  # values no other test uses
    with torch.inference_mode():
        kept = _host_copies.constant(weight, torch.float64, torch.device("cpu"))
    assert not kept.is_inference()
    batch = random_batch([(5, 6), (3, 4)], "cpu", torch.float64)
    values = batch.values.clone().requires_grad_()
    out = octopus.stencil3x3(batch.with_values(values), [weight[0:3], weight[3:6], weight[6:9]])
    out.values.sum().backward()
    assert values.grad is not None and values.grad.shape == values.shape


def test_as_device_tensor_keeps_the_shape_of_nested_numbers():
    got = _host_copies.as_device_tensor([[1, 2, 1], [2, 4, 2], [1, 2, 1]], torch.float32, torch.device("cpu"))
    assert got.shape == (3, 3) and torch.equal(got, torch.tensor([[1.0, 2, 1], [2, 4, 2], [1, 2, 1]]))


# ---------------------------------------------------------------------------------------- CUDA
cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of octopus")


def _host_argument_calls(device):
    """(name, the call with host arguments, the same call with them already on the device)."""
    g = torch.Generator().manual_seed(5)
    images = random_batch([(3, 40, 50), (3, 7, 9), (3, 64, 33)], device, torch.float32, seed=6)
    gray = random_batch([(40, 50), (1, 1), (0, 3), (90, 70)], device, torch.float32, seed=7)
    weight = torch.randn(3, 3, generator=g)
    frame = torch.randint(0, 256, (2, 3, 60, 80), generator=g, dtype=torch.uint8).to(device)
    boxes = torch.tensor([[0, 3, 4, 40, 70], [1, 0, 0, 60, 80], [0, 10, 20, 11, 23]])
    per_box = [[16, 12], [5, 9], [1, 1]]
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    padded = torch.randn(3, 6, 7, generator=g).to(device)
    sizes = [[6, 7], [0, 3], [2, 5]]
    image = torch.rand(3, 64, 64, generator=g).to(device)
    tiles = torch.tensor([[0, 0, 32, 32], [16, 16, 64, 64], [5, 7, 9, 60]])
    items = [torch.randn(4, 5, generator=g).to(device), torch.randn(0, 5).to(device)]
    return [
        ("gaussian_blur", lambda: octopus.gaussian_blur(gray).values,
         lambda: octopus.stencil3x3(gray, torch.tensor([1.0, 2, 1, 2, 4, 2, 1, 2, 1], device=device) / 16).values),
        ("box_blur", lambda: octopus.box_blur(images).values,
         lambda: octopus.stencil3x3(images, torch.full((3, 3), 1 / 9, device=device)).values),
        ("stencil3x3 host weight", lambda: octopus.stencil3x3(gray, weight).values,
         lambda: octopus.stencil3x3(gray, weight.to(device)).values),
        ("crop_resize host boxes, mean and std",
         lambda: octopus.crop_resize(frame, boxes, 24, scale=1 / 255, mean=mean, std=std, validate=False),
         lambda: octopus.crop_resize(frame, boxes.to(device), 24, scale=1 / 255, mean=torch.tensor(mean).to(device),
                                     std=torch.tensor(std).to(device), validate=False)),
        ("crop_resize per-box sizes",
         lambda: octopus.crop_resize(frame, boxes, per_box, validate=False).values,
         lambda: octopus.crop_resize(frame, boxes.to(device), per_box, validate=False).values),
        ("normalize host constants", lambda: octopus.normalize(images, 3, mean=mean, std=std).values,
         lambda: octopus.normalize(images, 3, mean=torch.tensor(mean, dtype=torch.float64).to(device),
                                   std=torch.tensor(std, dtype=torch.float64).to(device)).values),
        ("from_padded host sizes", lambda: octopus.from_padded(padded, sizes, validate=False).values,
         lambda: octopus.from_padded(padded, torch.tensor(sizes).to(device), validate=False).values),
        ("tile_filter host tiles", lambda: octopus.tile_filter(image, tiles, 0.5, validate=False).mean,
         lambda: octopus.tile_filter(image, tiles.to(device), 0.5, validate=False).mean),
        ("from_tensors", lambda: octopus.RaggedBatch.from_tensors(items).offsets,
         lambda: torch.tensor([0, 20, 20]).to(device)),
    ]


@cuda
@pytest.mark.cuda
def test_host_arguments_are_copied_without_a_stream_sync_and_in_order():
    device = torch.device("cuda")
    calls = _host_argument_calls(device)
    for _, host_call, _ in calls:  # warm-up: cached kernels, layouts, constants, staging blocks
        host_call()
    torch.cuda.synchronize()
    results = {}
    torch.cuda.set_sync_debug_mode("error")  # a stream or device synchronization raises
    try:
        torch.cuda._sleep(50_000_000)  # work queued ahead: a copy out of order would read stale data
        for name, host_call, _ in calls:
            results[name] = host_call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for name, _, device_call in calls:
        torch.testing.assert_close(results[name], device_call(), rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


@cuda
@pytest.mark.cuda
def test_staging_buffers_outlive_their_queued_copies():
    """Many calls with different host weights queued behind a long kernel: each result is its
    own weight's (a staging buffer reused before its copy ran would give another's)."""
    device = torch.device("cuda")
    batch = random_batch([(33, 47), (8, 8), (120, 3)], device, torch.float32, seed=8)
    g = torch.Generator().manual_seed(9)
    weights = [torch.randn(3, 3, generator=g) for _ in range(64)]
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    queued = [octopus.stencil3x3(batch, w).values for w in weights]
    for w, got in zip(weights, queued):
        torch.testing.assert_close(got, octopus.stencil3x3(batch, w.to(device)).values, rtol=0, atol=0)


@cuda
@pytest.mark.cuda
def test_host_weight_requiring_grad_gets_its_gradient():
    device = torch.device("cuda")
    batch = random_batch([(9, 11), (4, 4)], device, torch.float64, seed=10)
    weight = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(11), requires_grad=True)
    on_device = weight.detach().to(device).requires_grad_()
    octopus.stencil3x3(batch, weight).values.sum().backward()
    octopus.stencil3x3(batch, on_device).values.sum().backward()
    assert weight.grad is not None and weight.grad.device.type == "cpu"
    torch.testing.assert_close(weight.grad, on_device.grad.cpu())


@cuda
@pytest.mark.cuda
def test_inside_cuda_graph_capture_the_blur_still_captures():
    """Capture takes the plain path (a staging buffer must not be baked into a graph); the
    blur's kernel, cached before capture, replays to the eager result."""
    device = torch.device("cuda")
    batch = random_batch([(30, 40), (5, 5)], device, torch.float32, seed=12)
    strategy = "plan"
    batch.metadata(strategy)
    want = octopus.gaussian_blur(batch, strategy=strategy).values
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = octopus.gaussian_blur(batch, strategy=strategy).values
    graph.replay()
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@cuda
@pytest.mark.cuda
def test_constants_first_needed_inside_capture_raise_a_clear_error():
    device = torch.device("cuda")
    batch = random_batch([(6, 7)], device, torch.float32, seed=13)
    fresh = [[0.0, 0.5, 0.0], [0.5, -1.0, 0.5], [0.0, 0.5, 0.125]]  # values no other test uses
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="run the call once before capturing it"):
        with torch.cuda.graph(graph, stream=stream):
            octopus.stencil3x3(batch, fresh, strategy="plan")


@cuda
@pytest.mark.cuda
def test_batches_built_from_host_data_are_whole_for_any_stream():
    """A batch built from host items, or from a nested tensor, on a busy stream can be read at
    once on another stream (its layout is not left queued behind the busy stream's work)."""
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(14)
    items = [torch.randn(5, 3, generator=g), torch.randn(0, 3), torch.randn(7, 3, generator=g)]
    want_offsets, want_sizes = torch.tensor([0, 15, 15, 36]), torch.tensor([[5, 3], [0, 3], [7, 3]])
    nested = torch.nested.as_nested_tensor([torch.randn(4, 2, generator=g), torch.randn(2, 3, generator=g)],
                                           layout=torch.strided, device=device)
    side = torch.cuda.Stream()
    for build, offsets, sizes in [
            (lambda: octopus.RaggedBatch.from_tensors(items, device=device), want_offsets, want_sizes),
            (lambda: octopus.RaggedBatch.from_nested(nested), torch.tensor([0, 8, 14]), torch.tensor([[4, 2], [2, 3]]))]:
        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)  # the current stream is busy for a while
        batch = build()
        with torch.cuda.stream(side):  # no wait for the current stream
            got_offsets, got_sizes = batch.offsets.clone(), batch.sizes.clone()
        side.synchronize()
        assert torch.equal(got_offsets.cpu(), offsets) and torch.equal(got_sizes.cpu(), sizes)


@cuda
@pytest.mark.cuda
def test_a_scheduler_step_with_host_timesteps_does_not_wait_for_the_stream():
    from octopus import diffusion as od
    sched = od.DDIMScheduler(clip_sample=False)
    sched.set_timesteps(10, device="cuda")
    g = torch.Generator().manual_seed(15)
    x, out = torch.randn(3, 4, 8, 8, generator=g).cuda(), torch.randn(3, 4, 8, 8, generator=g).cuda()
    host_t = sched.timesteps.cpu()[[0, 3, 7]]
    want = sched.step(out, x, host_t.cuda())
    sched.step(out, x, host_t)  # warm-up: staging blocks, tables
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.cuda._sleep(50_000_000)
        got = sched.step(out, x, host_t)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@cuda
@pytest.mark.cuda
def test_a_kept_dense_layout_is_whole_for_another_stream():
    """crop_resize keeps a dense source's layout per shape: made on a busy stream, it is whole
    before a call on another stream reads it."""
    crop_module = importlib.import_module("octopus.crop_resize")  # (octopus.crop_resize is the function)
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(16)
    frame = torch.rand(3, 2, 33, 47, generator=g).to(device)
    boxes = torch.tensor([[2, 0, 0, 33, 47], [1, 5, 6, 20, 30]], device=device)
    want = octopus.crop_resize(frame.clone(), boxes, 9, validate=False)  # (its own shape's layout)
    torch.cuda.synchronize()
    crop_module._dense_layout.cache_clear()
    torch.cuda._sleep(50_000_000)  # the current stream is busy for a while
    octopus.crop_resize(frame, boxes, 9, validate=False)  # makes and keeps the layout
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # no wait for the current stream
        got = octopus.crop_resize(frame, boxes, 9, validate=False)
    side.synchronize()
    torch.testing.assert_close(got, want, rtol=0, atol=0)

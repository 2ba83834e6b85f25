"""Smoke test of an installed octopus: the package and its extension load, the wheel requires the
torch it was built against, and every ``torch.ops.octopus`` op and the public Python API run
once on tiny inputs and agree with plain PyTorch.

    python tests/smoke_wheel.py            # on the CPU: CI runs it in a fresh virtual environment
    python tests/smoke_wheel.py --device cuda   # every CUDA kernel once (benchmarks/gpu_check.sh
                                                # runs it under compute-sanitizer)
"""

import argparse
import importlib.metadata
import os
import sys
import tempfile

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the op recorder's profiler: errors only

import torch  # noqa: E402
import torch.nn.functional as F

import octopus
from octopus import _build_info
from octopus.diffusion import DDIMScheduler


def octopus_ops_seen(profile: torch.profiler.profile) -> set:
    """Every octopus op that ran, however it was called (Python API, autograd). The profiler
    records each op where the dispatcher enters it, so a CompositeImplicitAutograd op
    (octopus::normalize) counts as well as the ops it runs; a TorchDispatchMode would see only
    the latter."""
    return {e.name for e in profile.events() if e.name.startswith("octopus::")}


def close(actual, expected, tol=1e-5):
    actual, expected = torch.as_tensor(actual).cpu().double(), torch.as_tensor(expected).cpu().double()
    assert actual.shape == expected.shape, (tuple(actual.shape), tuple(expected.shape))
    assert torch.allclose(actual, expected, rtol=tol, atol=tol, equal_nan=True), \
        (actual - expected).abs().max()


def equal(actual, expected):
    return torch.equal(actual.cpu(), expected.cpu())


def check_install():
    assert octopus.__file__.startswith(sys.prefix), \
        f"octopus imported from {octopus.__file__}, not from {sys.prefix}"
    release = ".".join(_build_info.TORCH_VERSION.split("+")[0].split(".")[:2])
    assert torch.__version__.startswith(release + "."), (torch.__version__, _build_info.TORCH_VERSION)
    requires = importlib.metadata.requires("octopus")
    assert f"torch=={release}.*" in requires, requires


def check_ragged_and_pointwise(g, device):
    items = [torch.randn(3, h, w, generator=g) for h, w in [(4, 5), (1, 1), (6, 2)]]
    batch = octopus.RaggedBatch.from_tensors(items, device=device)
    assert all(equal(a, b) for a, b in zip(batch.unbind(), items))
    assert equal(batch.offsets, torch.tensor([0, 60, 63, 99]))
    torch.ops.octopus.validate_layout(batch.offsets, batch.sizes, batch.numel())

    item, begin, end, run = octopus.plan_blocks(octopus.plan(batch, block_elems=16))  # too small for runs
    ids = torch.repeat_interleave(torch.arange(3), torch.tensor([60, 3, 36]))
    assert not run.any()
    assert equal(item, ids[begin]) and equal(torch.cat([torch.arange(b, e) for b, e in zip(begin, end)]),
                                             torch.arange(99))
    assert equal(torch.ops.octopus.lookup_table(batch.offsets, batch.numel()).long(), ids)

    x = batch.values.cpu()
    scale, bias = torch.tensor([1.0, 2.0, 0.5]), torch.tensor([0.1, -1.0, 3.0])
    for strategy in octopus.STRATEGIES:
        close(octopus.affine(batch, scale.to(device), bias.to(device), strategy=strategy).values,
              x * scale[ids] + bias[ids])
    lo, hi = torch.tensor([-0.5, 0.0, -1.0]), torch.tensor([0.5, 1.0, 0.0])
    close(octopus.clamp(batch, lo.to(device), hi.to(device)).values,
          torch.maximum(torch.minimum(x, hi[ids]), lo[ids]))
    close(octopus.threshold(batch, lo.to(device)).values, (x > lo[ids]).float())
    positive = batch.with_values(batch.values.abs())
    close(octopus.power(positive, scale.to(device), bias.to(device)).values,
          bias[ids] * x.abs() ** scale[ids])

    stats = octopus.item_stats(batch)
    close(stats.mean, torch.stack([x.double().mean() for x in items]), 1e-12)
    close(stats.std, torch.stack([x.double().std() for x in items]), 1e-12)
    for x, y in zip(items, octopus.normalize(batch, 3).unbind()):
        x = x.double()
        std = x.std((1, 2), correction=0, keepdim=True)
        close(y, (x - x.mean((1, 2), keepdim=True)) / (std + 1e-5), 1e-4)

    dense = octopus.to_padded(batch, -1.0)
    assert dense.shape == (3, 3, 6, 5) and equal(dense[2, :, :, 2:], torch.full((3, 6, 3), -1.0))
    assert equal(octopus.from_padded(dense, batch.sizes).values, batch.values)
    rows = [torch.arange(3.0), torch.arange(5.0)]
    # Jagged: the items differ in their first dimension only.
    nested = octopus.RaggedBatch.from_tensors(rows, device=device).to_nested()
    assert nested.layout == torch.jagged and all(equal(a, b) for a, b in zip(nested.unbind(), rows))


def check_geometry(g, device):
    frames = torch.rand(2, 3, 20, 30, generator=g)
    boxes = torch.tensor([[0, 2, 3, 12, 20], [1, 0, 0, 20, 30]])
    source = frames.to(device).requires_grad_()
    crops = octopus.crop_resize(source, boxes.to(device), (8, 6), mean=[0.5, 0.4, 0.3], std=[0.2, 0.3, 0.4])
    mean, std = torch.tensor([0.5, 0.4, 0.3]).view(3, 1, 1), torch.tensor([0.2, 0.3, 0.4]).view(3, 1, 1)
    frames.requires_grad_()
    reference = torch.cat([F.interpolate(frames[f, :, y0:y1, x0:x1][None], (8, 6), mode="bilinear",
                                         align_corners=False) for f, y0, x0, y1, x1 in boxes.tolist()])
    reference = (reference - mean) / std
    close(crops, reference)
    weights = torch.rand(crops.shape, generator=g)
    grad, = torch.autograd.grad((crops * weights.to(device)).sum(), source)  # crop_resize_backward
    expected, = torch.autograd.grad((reference * weights).sum(), frames)
    close(grad, expected)
    frames = frames.detach()

    sizes = torch.tensor([[4, 7], [10, 10]])
    ragged = octopus.crop_resize(source, boxes.to(device), sizes)
    for (f, y0, x0, y1, x1), (h, w), y in zip(boxes.tolist(), sizes.tolist(), ragged.unbind()):
        crop = frames[f, :, y0:y1, x0:x1][None]
        close(y, F.interpolate(crop, (h, w), mode="bilinear", align_corners=False)[0])
    ragged.values.sum().backward()  # crop_resize_ragged_backward

    images = octopus.RaggedBatch.from_tensors([frames[0, :, :7, :9], frames[1, :, :5, :4]], device=device)
    resized = octopus.resize(images, [(3, 4), (10, 8)])
    for x, y in zip(images.unbind(), resized.unbind()):
        close(y, F.interpolate(x.cpu()[None], y.shape[1:], mode="bilinear", align_corners=False)[0])


def check_filters(g, device):
    items = [torch.rand(2, h, w, generator=g) for h, w in [(5, 7), (1, 1), (3, 2)]]
    batch = octopus.RaggedBatch.from_tensors(items, device=device)
    weight = torch.randn(2, 1, 3, 3, generator=g)

    def reference(x, w, border):
        padded = F.pad(x[None], (1, 1, 1, 1), mode="replicate" if border == "replicate" else "constant")
        return F.conv2d(padded, w, groups=2)[0]

    values = batch.values.clone().requires_grad_()
    out = octopus.stencil3x3(batch.with_values(values), weight.to(device), border="replicate")
    for x, y in zip(items, out.unbind()):
        close(y, reference(x, weight, "replicate"))
    out.values.sum().backward()  # stencil3x3_backward
    xs = [x.clone().requires_grad_() for x in items]
    sum(reference(x, weight, "replicate").sum() for x in xs).backward()
    close(values.grad, torch.cat([x.grad.flatten() for x in xs]))

    for y, x in zip(octopus.depthwise_conv3x3(batch, weight.to(device)).unbind(), items):
        close(y, reference(x, weight, "zero"))
    box = torch.full((2, 1, 3, 3), 1 / 9)
    for y, x in zip(octopus.box_blur(batch).unbind(), items):
        close(y, reference(x, box, "replicate"))
    gauss = (torch.tensor([1.0, 2.0, 1.0])[:, None] * torch.tensor([1.0, 2.0, 1.0]) / 16).expand(2, 1, 3, 3)
    for y, x in zip(octopus.gaussian_blur(batch).unbind(), items):
        close(y, reference(x, gauss, "replicate"))

    image = torch.rand(2, 16, 16, generator=g)
    tiles = torch.tensor([[0, 0, 8, 8], [4, 4, 16, 10], [0, 0, 16, 16]])
    res = octopus.tile_filter(image.to(device), tiles.to(device), 0.5, max_fraction=0.6, gather=True)
    crops = [image[:, y0:y1, x0:x1].double() for y0, x0, y1, x1 in tiles.tolist()]
    close(res.mean, torch.stack([c.mean() for c in crops]), 1e-12)
    fraction = torch.stack([(c > 0.5).double().mean() for c in crops])
    close(res.fraction, fraction, 1e-12)
    assert equal(res.keep, fraction <= 0.6)
    assert all(equal(y, image[:, y0:y1, x0:x1])
               for y, (y0, x0, y1, x1) in zip(res.kept.unbind(), tiles[res.kept_index.cpu()].tolist()))


def check_diffusion(g, device):
    sched = DDIMScheduler(clip_sample=False)
    sched.set_timesteps(10, device=device)
    timesteps = sched.timesteps[[0, 4, 9]].long()
    sample, eps = torch.randn(3, 4, 8, 8, generator=g), torch.randn(3, 4, 8, 8, generator=g)
    prev = sched.step(eps.to(device), sample.to(device), timesteps.to(device))
    a = sched.alphas_cumprod.double().cpu()
    a_t = a[timesteps].view(3, 1, 1, 1)
    prev_t = timesteps - 1000 // 10
    final = torch.tensor(1.0, dtype=torch.float64)  # set_alpha_to_one
    a_prev = torch.where(prev_t >= 0, a[prev_t.clamp(min=0)], final).view(3, 1, 1, 1)
    x0 = (sample.double() - (1 - a_t).sqrt() * eps) / a_t.sqrt()
    close(prev, a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps, 1e-4)


def check_scheduler_and_autotune():
    with octopus.StreamScheduler(2, backend="simulated") as sched:
        assert sched.map(lambda x: x * x, range(10)) == [x * x for x in range(10)]
        with sched.acquire("smoke", priority="high") as lease:
            assert lease.active
    with tempfile.TemporaryDirectory() as cache:
        os.environ["OCTOPUS_CACHE_DIR"] = cache
        choice = octopus.autotune("cpu", force=True, strategies=["plan", "search"], block_sizes=[2048],
                                  repeats=1)
        assert choice.strategy in ("plan", "search") and os.listdir(cache)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    device = torch.device(parser.parse_args().device)
    if device.type == "cuda" and not (torch.cuda.is_available() and octopus.built_with_cuda):
        sys.exit("--device cuda needs a CUDA device and a CUDA build of octopus")
    check_install()
    g = torch.Generator().manual_seed(0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        check_ragged_and_pointwise(g, device)
        check_geometry(g, device)
        check_filters(g, device)
        check_diffusion(g, device)
        check_scheduler_and_autotune()
    registered = {s.name for s in torch._C._jit_get_all_schemas() if s.name.startswith("octopus::")}
    missed = registered - octopus_ops_seen(profile)
    assert not missed, f"ops the smoke test never ran: {sorted(missed)}"
    print(f"octopus {octopus.__version__} on {device.type} (torch {torch.__version__}, built against "
          f"{_build_info.TORCH_VERSION}, CUDA kernels: {octopus.built_with_cuda}): {len(registered)} ops "
          "and the Python API agree with PyTorch")


if __name__ == "__main__":
    main()

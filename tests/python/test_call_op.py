"""The ops' Python API calls its operators below autograd where nothing needs a gradient
(``_registrations.call_op``): no Python of torch.library's autograd step runs on the way to
the kernel, the results are the same bits, and where a gradient is needed it still flows."""

import sys

import pytest
import torch

import octopus


def images(device, dtype=torch.float32):
    g = torch.Generator().manual_seed(4)
    items = [torch.randn(3, int(h), int(w), generator=g) for h, w in torch.randint(1, 9, (5, 2), generator=g)]
    return octopus.RaggedBatch.from_tensors([t.to(dtype) for t in items], device=device)


CALLS = {
    "affine": lambda b: octopus.affine(b, 2.0, 0.5).values,
    "affine, values and offsets": lambda b: octopus.affine(b.values, 2.0, 0.5, offsets=b.offsets),
    "clamp": lambda b: octopus.clamp(b, -0.5, 0.5).values,
    "item_stats": lambda b: octopus.item_stats(b, 3).var,
    "normalize": lambda b: octopus.normalize(b, 3).values,
    "to_padded": lambda b: b.to_padded(),
    "from_padded": lambda b: octopus.from_padded(b.to_padded(), b).values,
    "box_blur": lambda b: octopus.box_blur(b).values,
    "crop_resize": lambda b: octopus.crop_resize(b, torch.tensor([[0, 0, 0, 1, 1], [4, 0, 0, 1, 1]],
                                                                 device=b.device), 4),
}


def runs_autograd_python(fn) -> bool:
    """Whether a Python function of torch.library's autograd step (torch/_library/autograd.py)
    ran during fn()."""
    seen = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code.co_filename.replace("\\", "/"))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return any(name.endswith("torch/_library/autograd.py") for name in seen)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_no_python_autograd_step_without_gradients_and_the_same_bits(device, name):
    batch = images(device)
    call = CALLS[name]
    call(batch)  # warm: first calls build plans and caches
    assert not runs_autograd_python(lambda: call(batch))
    with torch.no_grad():
        assert not runs_autograd_python(lambda: call(batch.with_values(batch.values.clone().requires_grad_())))
    plain = call(batch)
    tracked_values = batch.values.clone().requires_grad_()
    tracked = []
    # The positive control: with a gradient needed the autograd step runs (the check can fail).
    assert runs_autograd_python(lambda: tracked.append(call(batch.with_values(tracked_values))))
    assert tracked[0].requires_grad
    torch.testing.assert_close(tracked[0].detach(), plain, rtol=0, atol=0, equal_nan=True)
    tracked[0].float().sum().backward()
    assert tracked_values.grad is not None and tracked_values.grad.isfinite().all()

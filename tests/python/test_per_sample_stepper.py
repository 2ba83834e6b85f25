"""octopus.diffusion.PerSampleStepper: the loop, streams and grouped modes run any
diffusers scheduler per sample and agree with diffusers run separately per sample."""

import pytest
import torch

from conftest import HAS_CUDA
from octopus.diffusion import PerSampleStepper
from test_diffusion import _problem, _reference_run

diffusers = pytest.importorskip("diffusers")

CASES = [("DDIMScheduler", {}), ("EulerDiscreteScheduler", dict(prediction_type="v_prediction")),
         ("DPMSolverMultistepScheduler", {}), ("UniPCMultistepScheduler", {})]
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")])]


def _stepper_run(name, config, mode, steps, starts, latents, outputs, device):
    stepper = PerSampleStepper(getattr(diffusers, name)(**config), len(steps), mode=mode)
    stepper.set_timesteps(steps)
    x = latents.to(device)
    for j in range(len(outputs)):
        t = [float(stepper.timesteps[i][j - starts[i]]) if 0 <= j - starts[i] < len(stepper.timesteps[i]) else -1.0
             for i in range(len(steps))]
        x = stepper.step(outputs[j].to(device), x, torch.tensor(t))
    return x.cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["loop", "streams", "grouped"])
@pytest.mark.parametrize("name, config", CASES, ids=[c[0] for c in CASES])
def test_modes_match_diffusers_per_sample(name, config, mode, device):
    steps, starts, latents, outputs, noises = _problem(name, 4, torch.float64 if device == "cpu" else torch.float32)
    # Samples sharing a schedule and start, so that the grouped mode has groups to form.
    steps[1], starts[1] = steps[2], starts[2]
    expected = _reference_run(name, config, {}, steps, starts, latents, outputs, noises)
    got = _stepper_run(name, config, mode, steps, starts, latents, outputs, device)
    if device == "cpu":
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    else:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_bad_input():
    sched = diffusers.DDIMScheduler()
    with pytest.raises(ValueError, match="mode"):
        PerSampleStepper(sched, 2, mode="threads")
    with pytest.raises(TypeError, match="set_timesteps"):
        PerSampleStepper(object(), 2)
    stepper = PerSampleStepper(sched, 2)
    with pytest.raises(RuntimeError, match="set_timesteps"):
        stepper.step(torch.zeros(2, 1), torch.zeros(2, 1), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="entries"):
        stepper.set_timesteps([10, 20, 30])
    stepper.set_timesteps(10)
    x = torch.randn(2, 3, 4, 4)
    with pytest.raises(ValueError, match="one entry per sample"):
        stepper.step(x, x, torch.tensor([1]))
    with pytest.raises(ValueError, match="not in sample 1's schedule"):
        stepper.step(x, x, torch.tensor([float(stepper.timesteps[0][0]), 3.0]))
    with pytest.raises(ValueError, match="same shape"):
        stepper.step(x[:1], x, torch.tensor([1, 2]))

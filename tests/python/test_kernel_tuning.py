"""octopus.kernel_tuning: every kernel family's per-architecture policy (core/tuning.h) as
the host launches with it and as the device code was compiled."""

import pytest
import torch

import octopus

from conftest import HAS_CUDA


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA build with a visible GPU has a tuning")
def test_without_a_cuda_build_or_device_it_says_so():
    with pytest.raises(RuntimeError, match="CUDA"):
        octopus.kernel_tuning()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_the_host_launches_with_the_values_the_device_code_was_compiled_with():
    tuning = octopus.kernel_tuning()
    assert tuning["launch"] == tuning["compiled"]
    major, minor = torch.cuda.get_device_capability()
    assert 750 <= tuning["arch"] <= 100 * major + 10 * minor  # the device runs code of its own or an older arch
    values = tuning["launch"]
    assert len(values) == 40 and all(isinstance(v, int) and v > 0 for v in values.values())
    assert values["driver.plan_min_blocks_per_sm"] <= values["driver.min_blocks_per_sm"]
    assert values["driver.grid_waves"] >= 1
    assert {name.split(".")[0] for name in values} == {
        "driver", "plan", "item_param", "padding", "stencil", "crop_resize", "sampler_step", "item_stats",
        "tile_stats"}, "every family registers its policy once"
    assert values["driver.threads"] % 32 == 0 and values["driver.threads"] <= 1024
    assert octopus.kernel_tuning(torch.cuda.current_device()) == tuning
    assert octopus.kernel_tuning(f"cuda:{torch.cuda.current_device()}") == tuning


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build")
def test_a_device_that_is_not_cuda_is_refused():
    with pytest.raises(ValueError, match="must be a CUDA device, got cpu"):
        octopus.kernel_tuning("cpu")

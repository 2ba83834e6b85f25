"""The serving benchmark's workload: latent shapes, samplers, the UNet, and seeded requests
with Poisson arrivals."""

from __future__ import annotations

import torch

SHAPES = [(4, 32, 32), (4, 64, 64), (4, 96, 96)]
SAMPLERS = [("DDIMScheduler", {}), ("EulerDiscreteScheduler", {}), ("FlowMatchEulerDiscreteScheduler", {"shift": 3.0}),
            ("DPMSolverMultistepScheduler", {}), ("UniPCMultistepScheduler", {})]
MODELS = {
    "realistic": dict(block_out_channels=(64, 128, 256, 256), layers_per_block=2,
                      down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                      up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D")),
    "tiny": dict(block_out_channels=(8, 16), layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                 up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4, attention_head_dim=8),
}
MODES = ("serial", "static", "step-level", "step-level-graphs", "octopus", "octopus-graphs", "octopus-priority",
         "octopus-lane", "octopus-lane-priority", "octopus-lane-yield")


def make_model(name: str, device: torch.device, dtype: torch.dtype):
    import diffusers
    torch.manual_seed(0)
    model = diffusers.UNet2DModel(sample_size=64, in_channels=4, out_channels=4, **MODELS[name])
    return model.to(device=device, dtype=dtype).eval()


def make_workload(n: int, rate: float, seed: int, high_share: float, shapes=SHAPES, samplers=SAMPLERS,
                  steps=(10, 50)) -> list[dict]:
    """n requests with Poisson arrivals at `rate` per second (the same draws at every rate,
    scaled), each with its shape, sampler, step count, priority and seed."""
    g = torch.Generator().manual_seed(seed)
    gaps = torch.empty(n, dtype=torch.float64).exponential_(1.0, generator=g) / rate
    arrivals = (torch.cumsum(gaps, 0) - gaps[0]).tolist()
    out = []
    for i in range(n):
        name, config = samplers[int(torch.randint(len(samplers), (1,), generator=g))]
        out.append(dict(id=i, arrival=arrivals[i], shape=shapes[int(torch.randint(len(shapes), (1,), generator=g))],
                        steps=int(torch.randint(steps[0], steps[1] + 1, (1,), generator=g)), scheduler=name,
                        config=config, high=bool(torch.rand((), generator=g) < high_share), seed=10_000 + i))
    return out

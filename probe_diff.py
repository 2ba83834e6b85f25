import torch
from torch.profiler import profile, ProfilerActivity
from octopus import diffusion as od
for shape in [(64, 4, 128, 128), (16, 16, 4, 60, 104)]:
    for cls, kw in [(od.DDIMScheduler, dict(clip_sample=False)), (od.DPMSolverMultistepScheduler, {})]:
        s = cls(**kw); s.set_timesteps(50, device="cuda")
        x = torch.randn(shape, device="cuda"); m = torch.randn_like(x)
        t = s.timesteps[torch.randint(0, 50, (shape[0],))].double().cuda()
        for _ in range(5): s.step(m, x, t, validate=False)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(50): s.step(m, x, t, validate=False)
            torch.cuda.synchronize()
        ks = [e for e in prof.key_averages() if e.device_time_total > 0 and "ragged_kernel" in e.key]
        per = sum(e.device_time_total for e in ks) / 50
        print(f"{cls.__name__} {shape}: fused kernel {per:.1f} us per step ({[e.count for e in ks]} launches)")

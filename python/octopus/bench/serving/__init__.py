"""``python -m octopus.bench.serving`` (also ``octopus-bench serving``): diffusion requests
arriving over time, served four ways.

Workload (seeded): ``--requests`` requests (default 256) with Poisson arrivals at each of
``--rates`` (requests/s); latents 4x32x32, 4x64x64 and 4x96x96 in equal shares; 10-50 steps;
samplers DDIM, Euler, flow-matching Euler (shift 3), DPM-Solver++ 2M and UniPC in equal shares;
``--high-share`` of them (default 10%) with priority "high". Every mode serves requests by
priority, then arrival, and uses the same model: a diffusers ``UNet2DModel`` with random
weights (``--model realistic``: 25.3M parameters, blocks of 64/128/256/256 channels, two layers
each, attention at the third level, float16 on the GPU; ``--model tiny`` for a CPU smoke run).

Modes, side by side in one run::

  (a) serial       one request at a time through diffusers' scheduler (what a user writes today);
                   run once at the lowest rate; at the others its latencies are computed from
                   the measured service times with the FIFO recurrence of one server
                   (marked ``derived``)
  (b) static       static batching: up to ``--max-batch`` waiting requests of one shape (after
                   waiting at most ``--static-wait`` s for the batch to fill) run to completion
                   together, one diffusers ``scheduler.step`` per request per iteration
  (c) step-level   continuous batching at step level, as serving systems do it: requests join
                   and leave at any step, one batched model call per shape, one diffusers
                   ``scheduler.step`` per request per iteration; ``step-level-graphs``: the
                   same with the model's calls in CUDA graphs per shape and batch size,
                   captured before the run (the strongest plain server; GPU only)
  (d) octopus      ``octopus.diffusion.ContinuousSampler``: one model call per shape on leased
                   streams, one fused step for all; eagerly, with CUDA graphs
                   (``octopus-graphs``), and with graphs and a latency policy for high-priority
                   requests (``octopus-priority``: ``preempt=True``,
                   ``high_priority_batch=--priority-batch``); with graphs (on a GPU) and
                   high-priority requests in a lane of their own (``octopus-lane``:
                   ``priority_lane=True``), that with the latency policy too
                   (``octopus-lane-priority``), and the lane with the other samples pausing
                   while it has samples (``octopus-lane-yield``: ``normal_lane_pause=``
                   ``--normal-lane-pause``, strict priority by default, and ``preempt=True``)

Reported per mode and rate: throughput (images/s), latency p50/p99 (overall and high
priority; wall time from arrival to completion), the share of iteration time spent in the
scheduler step (CUDA events around the step(s) and the iteration), mean batch, GPU
utilization and SM clock (NVML, sampled every 50 ms). Also: each high-priority request's
latency alone (unloaded); with ``octopus-lane-yield``, at each rate, the high-priority
requests by themselves at their arrival times (``high-priority only``: what they cost one
another in their lane, whatever happens to the rest); and one scenario where continuous
batching has little to win (``single``: a quarter as many requests, every one of the largest
shape, DDIM, the most steps). Raw JSON
and a latency-vs-throughput plot go to ``--out``. With the defaults the run takes about 6
minutes on an H100.

``--pipeline sd`` (or ``tiny``) runs text-to-image serving end to end instead, prompts in and
images out, through a Stable Diffusion pipeline of random weights: see
:mod:`octopus.bench.serving.pipeline`.
"""

from .cli import main
from .peers import DiffusersRequest, derived_serial
from .workload import MODELS, MODES, SAMPLERS, SHAPES, make_model, make_workload

__all__ = ["main", "DiffusersRequest", "derived_serial", "MODELS", "MODES", "SAMPLERS", "SHAPES", "make_model",
           "make_workload"]

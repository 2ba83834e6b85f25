"""The model calls of one continuous-sampler iteration: one batched call per group.

Each group's call scales its inputs where the sampler needs it (Euler's
``scale_model_input``), doubles the samples that use classifier-free guidance (their
unconditional halves appended), runs the model, combines ``uncond + scale * (cond - uncond)``
per sample with its own scale, and writes the result into the arena's model-output region.
On CUDA the groups run concurrently on streams leased from a :class:`~octopus.StreamScheduler`
(higher-priority groups first, on high-priority streams), eagerly or as CUDA graphs captured
per (input shape, batch) (see :class:`CapturedCalls`); on the CPU they run one after another.

A call that raises is retried one sample at a time, so that one request's bad conditioning
fails only that request.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import weakref
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, cast

import torch

from .._host_copies import to_device
from ..scheduling import Lease, ReleaseEvent, StreamScheduler
from .arena import Group, LatentArena

LEASE_KIND = "octopus.diffusion.model"
# A captured call: (graph, static input, static timesteps, static keyword tensors, static output).
_Captured = Tuple["torch.cuda.CUDAGraph", torch.Tensor, torch.Tensor, Dict[str, torch.Tensor], torch.Tensor]
# A sample whose model call failed, and the exception.
_Failure = Tuple[Any, BaseException]


@dataclasses.dataclass(eq=False)
class GroupCall:
    """What a group's call needs beyond its latents, built once per arena layout."""

    group: Group
    priority: int
    cond: dict[str, torch.Tensor]  # keyword -> [n, ...] every member's conditioning
    neg: dict[str, torch.Tensor]   # keyword -> [c, ...] the guided members' unconditional conditioning
    guided: torch.Tensor | None   # local indices of the guided members (None: none is)
    all_guided: bool
    scales: torch.Tensor | None   # [c, 1, ...] their guidance scales (latent dtype)
    rescales: torch.Tensor | None = None  # [c, 1, ...] their guidance_rescale (None: all 0)


def model_output_of(result: Any) -> torch.Tensor:
    """The prediction in what a model returned (a tensor, diffusers' output object, a tuple)."""
    if isinstance(result, torch.Tensor):
        return result
    sample = getattr(result, "sample", None)
    if isinstance(sample, torch.Tensor):
        return sample
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], torch.Tensor):
        return result[0]
    raise TypeError(f"the model returned {type(result).__name__}; expected a tensor, an object with .sample, "
                    "or a tuple whose first entry is the prediction")


class CapturedCalls:
    """CUDA graphs of a model, one per (input shapes, dtypes): a key's first call runs eagerly
    (its warm-up), its second is captured, later ones replay. At most ``max_graphs`` are
    kept (the least recently used is dropped); a key whose capture fails runs eagerly.

    A graph bakes in the cuBLAS workspace of the stream it was captured on, so two graphs
    captured on one stream must never replay at the same time (two such replays corrupted
    each other's split-K state and hung float32 models on an H100, torch 2.11). The groups of
    one iteration replay concurrently and have different per-sample shapes, so each family
    of keys (the key without its batch sizes) is captured on a stream of its own, of
    ``capture_priority`` (kernel nodes keep the priority of the stream they were captured
    on), one that no live family of any sampler in the process uses. ``shared_workspaces``
    turns True if torch's stream pool (32 streams per priority) ran out of such streams: then
    replays must not overlap.

    The graphs of a family share one memory pool (a graph's intermediates are reused by the
    others, as ``make_graphed_callables`` and serving systems do): with a pool each, every
    graph's intermediates stay reserved, and a large model captured at many batch sizes
    needs the sum of them. Sharing is safe because a family's replays are ordered on the
    device (an iteration's replay waits for the previous iteration's step, which waits for
    its model calls) and each replay's output is consumed on its stream before the next."""

    def __init__(self, model: Callable[..., Any], max_graphs: int, device: torch.device, capture_priority: int = 0):
        self.model, self.max_graphs, self.device, self.capture_priority = model, max_graphs, device, capture_priority
        self._graphs: collections.OrderedDict[Tuple[Any, ...], _Captured] = collections.OrderedDict()
        self._seen: set[Tuple[Any, ...]] = set()
        self._eager_only: set[Tuple[Any, ...]] = set()
        self._capture_streams: Dict[Tuple[Any, ...], torch.cuda.Stream] = {}
        self._pools: Dict[Tuple[Any, ...], Any] = {}  # family -> its graphs' memory pool
        self.shared_workspaces = False
        self.captures = 0
        weakref.finalize(self, _give_back_capture_streams, self._capture_streams)

    def __call__(self, x: torch.Tensor, t: torch.Tensor, kwargs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        key = (tuple(x.shape), x.dtype, tuple(t.shape),
               tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(kwargs.items())))
        entry = self._graphs.get(key)
        if entry is None:
            if key in self._eager_only or key not in self._seen:
                self._seen.add(key)
                return model_output_of(self.model(x, t, **kwargs))
            entry = self._capture(key, x, t, kwargs)
            if entry is None:
                return model_output_of(self.model(x, t, **kwargs))
        self._graphs.move_to_end(key)
        graph, static_x, static_t, static_kwargs, static_out = entry
        static_x.copy_(x)
        static_t.copy_(t)
        for k, v in kwargs.items():
            static_kwargs[k].copy_(v)
        graph.replay()
        return static_out

    def _capture(self, key: Tuple[Any, ...], x: torch.Tensor, t: torch.Tensor,
                 kwargs: Mapping[str, torch.Tensor]) -> Optional[_Captured]:
        static_x, static_t = x.clone(), t.clone()
        static_kwargs = {k: v.clone() for k, v in kwargs.items()}
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the sampler's finishing thread may use CUDA meanwhile.
            family = _family(key)
            pool = self._pools.setdefault(family, torch.cuda.graph_pool_handle())
            with torch.cuda.graph(graph, pool=pool, stream=self._capture_stream(family),
                                  capture_error_mode="thread_local"):
                static_out = model_output_of(self.model(static_x, static_t, **static_kwargs))
        except Exception:  # noqa: BLE001 (a model that cannot be captured runs eagerly)
            self._eager_only.add(key)
            return None
        self.captures += 1
        self._graphs[key] = (graph, static_x, static_t, static_kwargs, static_out)
        while len(self._graphs) > self.max_graphs:
            dropped, _ = self._graphs.popitem(last=False)
            family = _family(dropped)
            if not any(_family(k) == family for k in self._graphs):
                _give_back_capture_streams({family: self._capture_streams.pop(family)})
                del self._pools[family]
        return self._graphs[key]

    def _capture_stream(self, family: Tuple[Any, ...]) -> torch.cuda.Stream:
        """The family's capture stream: one of torch's pool that no other live family uses."""
        if family not in self._capture_streams:
            with _CAPTURE_STREAMS_LOCK:
                for _ in range(33):  # the pool hands its 32 streams round-robin
                    stream = torch.cuda.Stream(self.device, priority=self.capture_priority)
                    if not _CAPTURE_STREAMS_TAKEN[stream.cuda_stream]:
                        break
                else:
                    self.shared_workspaces = True
                _CAPTURE_STREAMS_TAKEN[stream.cuda_stream] += 1
            self._capture_streams[family] = stream
        return self._capture_streams[family]


# Capture streams in use by live graph families, of every CapturedCalls in the process (two
# samplers sampling at once must not share one either): stream handle -> families.
_CAPTURE_STREAMS_TAKEN: collections.Counter[int] = collections.Counter()
_CAPTURE_STREAMS_LOCK = threading.Lock()


def _give_back_capture_streams(streams: Mapping[Any, torch.cuda.Stream]) -> None:
    with _CAPTURE_STREAMS_LOCK:
        for stream in streams.values():
            _CAPTURE_STREAMS_TAKEN[stream.cuda_stream] -= 1


def _family(key: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """A CapturedCalls key without its batch sizes: (per-sample input shape, dtype, keyword
    names, per-sample shapes and dtypes)."""
    x_shape, dtype, _, kwargs = key
    return (x_shape[1:], dtype, tuple((k, shape[1:], kind) for k, shape, kind in kwargs))


def _rescaled(guided: torch.Tensor, text: torch.Tensor, rescales: torch.Tensor) -> torch.Tensor:
    """diffusers' ``rescale_noise_cfg`` per sample: the guided prediction blended, by each
    sample's factor, with itself rescaled to the conditional prediction's standard deviation."""
    dims = list(range(1, guided.dim()))
    matched = guided * (text.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True))
    return rescales * matched + (1 - rescales) * guided


class ModelRunner:
    """Runs the model for every group of an arena and fills its model-output buffer."""

    def __init__(self, model: Callable[..., Any], device: torch.device,
                 stream_scheduler: Optional[StreamScheduler] = None, cuda_graphs: bool = False, max_graphs: int = 64,
                 capture_priority: int = 0):
        if cuda_graphs and device.type != "cuda":
            raise ValueError("cuda_graphs needs a CUDA device")
        self.device = device
        self.model = model
        self.streams = stream_scheduler if device.type == "cuda" else None
        self.graphs = CapturedCalls(model, max_graphs, device, capture_priority) if cuda_graphs else None

    def plans(self, arena: LatentArena, conditioning: Callable[[Any], Tuple[Any, ...]]) -> list[GroupCall]:
        """Each group's call plan; ``conditioning(member)`` gives (priority, cond, neg, scale,
        rescale)."""
        plans: list[GroupCall] = []
        for group in arena.groups:
            infos = [conditioning(m) for m in group.members]
            guided = [j for j, info in enumerate(infos) if info[3] is not None]
            cond = {k: torch.stack([info[1][k] for info in infos]) for k in infos[0][1]}
            neg = {k: torch.stack([infos[j][2][k] for j in guided]) for k in infos[0][1]} if guided else {}
            scales: torch.Tensor | None = None
            rescales: torch.Tensor | None = None
            guided_rows: torch.Tensor | None = None
            if guided:
                per_sample = (-1, *(1,) * len(group.shape))
                scales = to_device(torch.tensor([float(infos[j][3]) for j in guided], dtype=arena.dtype), self.device)
                scales = scales.view(per_sample)
                if any(infos[j][4] for j in guided):
                    rescales = to_device(torch.tensor([float(infos[j][4]) for j in guided], dtype=arena.dtype),
                                         self.device).view(per_sample)
                guided_rows = to_device(torch.tensor(guided, dtype=torch.int64), self.device)
            plans.append(GroupCall(group, max(info[0] for info in infos), cond, neg, guided_rows,
                                   len(guided) == group.size, scales, rescales))
        return plans

    def run(self, arena: LatentArena, plans: Sequence[GroupCall], timesteps: torch.Tensor,
            divisors: torch.Tensor | None) -> list[_Failure]:
        """Fills ``arena.model_output``; returns (member, exception) for the samples whose call
        failed (their output region is left as it was)."""
        ordered = sorted(plans, key=lambda p: -p.priority)
        streams = self.streams
        if streams is None:
            return [f for p in ordered for f in self._run_group(arena, p, timesteps, divisors)]
        engine = torch.cuda.current_stream(self.device)
        ready = torch.cuda.Event()
        ready.record(engine)
        leases: list[Lease] = []
        failures: list[_Failure] = []
        try:
            for p in ordered:
                stream = self._leased_stream(streams, p, leases)
                stream.wait_event(ready)
                with torch.cuda.stream(stream):
                    failures += self._run_group(arena, p, timesteps, divisors)
        finally:
            for lease in leases:
                cast(ReleaseEvent, lease.release()).wait(engine)  # a CUDA lease's release gives its event
        return failures

    def _leased_stream(self, streams: StreamScheduler, plan: GroupCall, leases: list[Lease]) -> torch.cuda.Stream:
        """A stream of its own for the group where the scheduler has one; else the first
        group's (holding every lease until all groups are issued keeps their streams apart).
        Graphs whose capture streams could not be kept apart all replay on the first group's
        stream (see :class:`CapturedCalls`). (The leases are CUDA leases: their streams are
        never None.)"""
        shape = (plan.group.size, *plan.group.shape)
        if not leases:
            leases.append(streams.acquire(LEASE_KIND, shape, priority=plan.priority, device=self.device,
                                          timeout=None))
            return cast(torch.cuda.Stream, leases[0].stream)
        if self.graphs is not None and self.graphs.shared_workspaces:
            return cast(torch.cuda.Stream, leases[0].stream)
        lease = streams.try_acquire(LEASE_KIND, shape, priority=plan.priority, device=self.device)
        if lease is None:
            return cast(torch.cuda.Stream, leases[0].stream)
        leases.append(lease)
        return cast(torch.cuda.Stream, lease.stream)

    def _run_group(self, arena: LatentArena, plan: GroupCall, timesteps: torch.Tensor,
                   divisors: torch.Tensor | None) -> list[_Failure]:
        group = plan.group
        rows = slice(group.start, group.start + group.size)
        x = arena.group_latents(group)
        if divisors is not None:
            x = x / divisors[rows].view(-1, *(1,) * len(group.shape))
        out = arena.group_output(group)
        try:
            self._guided_call(x, timesteps[rows], plan.cond, plan.neg, plan.guided, plan.all_guided, plan.scales,
                              plan.rescales, out)
            return []
        except Exception as error:  # noqa: BLE001 (isolated below)
            if group.size == 1:
                return [(group.members[0], error)]
        failures: list[_Failure] = []
        guided = plan.guided.tolist() if plan.guided is not None else []
        for j, member in enumerate(group.members):
            one = slice(j, j + 1)
            g = guided.index(j) if j in guided else None
            scales = plan.scales[g:g + 1] if g is not None and plan.scales is not None else None
            rescales = plan.rescales[g:g + 1] if g is not None and plan.rescales is not None else None
            try:
                self._guided_call(x[one], timesteps[rows][one], {k: v[one] for k, v in plan.cond.items()},
                                  {k: v[g:g + 1] for k, v in plan.neg.items()} if g is not None else {},
                                  None, g is not None, scales, rescales, out[one])
            except Exception as error:  # noqa: BLE001 (this sample's own failure)
                failures.append((member, error))
        return failures

    def _guided_call(self, x: torch.Tensor, t: torch.Tensor, cond: Mapping[str, torch.Tensor],
                     neg: Mapping[str, torch.Tensor], guided: torch.Tensor | None, all_guided: bool,
                     scales: torch.Tensor | None, rescales: torch.Tensor | None, out: torch.Tensor) -> None:
        n = x.shape[0]
        if scales is None:
            out.copy_(self._call(x, t, cond))
            return
        kwargs = {k: torch.cat([v, neg[k]]) for k, v in cond.items()}  # the unconditional halves after
        if all_guided:
            both = self._call(torch.cat([x, x]), torch.cat([t, t]), kwargs)
            text, uncond = both[:n], both[n:]
            if rescales is None:
                torch.add(uncond, scales * (text - uncond), out=out)  # diffusers' formula, per sample
            else:
                out.copy_(_rescaled(uncond + scales * (text - uncond), text, rescales))
            return
        rows = cast(torch.Tensor, guided)  # some members, not all, are guided: these
        x_g, t_g = x.index_select(0, rows), t.index_select(0, rows)
        both = self._call(torch.cat([x, x_g]), torch.cat([t, t_g]), kwargs)
        out.copy_(both[:n])
        text, uncond = both[:n].index_select(0, rows), both[n:]
        guided_out = uncond + scales * (text - uncond)
        out.index_copy_(0, rows, guided_out if rescales is None else _rescaled(guided_out, text, rescales))

    def _call(self, x: torch.Tensor, t: torch.Tensor, kwargs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        result = self.graphs(x, t, kwargs) if self.graphs is not None else model_output_of(self.model(x, t, **kwargs))
        if result.shape != x.shape:
            raise ValueError(f"the model returned shape {tuple(result.shape)} for input {tuple(x.shape)}")
        return result

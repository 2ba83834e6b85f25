"""Random, often wrong, arguments to every raw ragged op on the CPU (where the layout is always
checked): each call returns or raises ValueError / TypeError. A crash fails the run; a plan
passed in once crashed stencil3x3 this way. Seeded: the same calls on every run."""

import random

import pytest
import torch

import octopus  # noqa: F401  (loads the ops)

STRATEGIES = ["plan", "plan_host", "block_search", "search", "lookup", "bogus"]


class Draw:
    def __init__(self, seed):
        self.rng = random.Random(seed)

    def int(self, lo, hi):
        return self.rng.randint(lo, hi)

    def chance(self, p):
        return self.rng.random() < p

    def choice(self, options):
        return self.rng.choice(options)

    def maybe_wrong(self, v):
        """v most of the time, otherwise a value next to it or far from it."""
        return v if self.chance(0.7) else self.choice([0, -1, -7, 1, 2**31, 2**40, v + 1, v - 1, 3 * v])

    def layout(self, dims):
        """offsets, sizes [M, dims], element count, M: mostly consistent, sometimes not."""
        m = self.int(0, 5)
        shapes = [[self.int(0, 6) for _ in range(dims)] for _ in range(m)]
        offsets = [0]
        for s in shapes:
            offsets.append(offsets[-1] + int(torch.tensor(s).prod()))
        n = offsets[-1]
        if self.chance(0.3):
            offsets = [self.maybe_wrong(o) for o in offsets]
        if self.chance(0.3):
            shapes = [[self.maybe_wrong(x) for x in s] for s in shapes]
        return torch.tensor(offsets), torch.tensor(shapes, dtype=torch.int64).reshape(m, dims), n, m

    def values(self, n):
        dtype = self.choice([torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8])
        count = n if self.chance(0.85) else max(0, self.maybe_wrong(n))
        return (torch.rand(min(count, 10_000)) * 10).to(dtype)

    def metadata(self, strategy, n, m, block):
        """None mostly; else a random tensor of about the right shape for the strategy."""
        if self.chance(0.6):
            return None
        if strategy in ("plan", "plan_host"):
            rows = min(n // block + m + 1, 10_000)
            plan = torch.randint(-5, n + 5, (rows, 2))
            plan[:, 1] = torch.randint(-1, m + 1, (rows,)) << 32 | torch.randint(0, 100, (rows,))  # item, length
            plan[0] = torch.tensor([self.int(0, rows), block])  # (count, block_elems)
            return plan
        if strategy == "lookup":
            return torch.randint(-2, 8, (min(n, 10_000),), dtype=torch.int32)
        return torch.zeros(3, 2, dtype=torch.int64)

    def boxes(self, m):
        k = self.int(0, 4)
        y0, x0 = torch.randint(-1, 4, (k,)), torch.randint(-1, 4, (k,))
        boxes = torch.stack([torch.randint(-1, max(m, 1) + 1, (k,)), y0, x0, y0 + torch.randint(0, 5, (k,)),
                             x0 + torch.randint(0, 5, (k,))], dim=1)
        if k and self.chance(0.2):
            boxes[0, self.int(0, 4)] = self.choice([2**40, -2**40, 2**31])
        return boxes.float() if self.chance(0.1) else boxes


def calls(d):
    """One round of calls: (op name, thunk)."""
    ops = torch.ops.octopus
    dims = d.int(1, 3)
    offsets, sizes, n, m = d.layout(dims)
    v = d.values(n)
    strategy, block = d.choice(STRATEGIES), d.choice([0, 16, 32, 4096, 17, -16])
    meta = d.metadata(strategy, n, m, block if block > 0 else 4096)
    validate = d.chance(0.7)
    shape = d.choice([(m,), (m, d.int(1, 3)), (max(m + d.choice([-1, 1]), 0),), (m, 0)])
    a, b = torch.rand(shape), torch.rand(shape)
    weight = torch.rand(d.choice([1, 2, 3]), d.choice([9, 9, 4]))
    slot = [d.int(-1, 7) for _ in range(dims)] if d.chance(0.9) else [1] * (dims + 1)
    dense = torch.rand([m] + [d.int(0, 7) for _ in range(dims)])
    kind, border, channels = d.choice(["clamp", "threshold", "power", "x"]), d.choice(["replicate", "zero", "x"]), \
        d.int(0, 3)
    out = [
        ("affine", lambda: ops.affine(v, offsets, a, b, strategy, block, meta, validate)),
        ("pointwise", lambda: ops.pointwise(v, offsets, kind, a, b, strategy, block, meta, validate)),
        ("item_stats", lambda: ops.item_stats(v, offsets, channels, block, meta if strategy == "plan" else None,
                                              validate)),
        ("stencil3x3", lambda: ops.stencil3x3(v, offsets, sizes, weight, border, strategy, block, meta, validate)),
        ("to_padded", lambda: ops.to_padded(v, offsets, sizes, slot, 0.0, validate)),
        ("from_padded", lambda: ops.from_padded(dense, offsets, sizes, d.maybe_wrong(n), strategy, block, meta,
                                                validate)),
    ]
    if dims >= 2:
        boxes = d.boxes(m)
        k, oh, ow = boxes.shape[0], d.int(0, 4), d.int(0, 4)
        out_sizes = torch.tensor([[channels, oh, ow] if dims == 3 else [oh, ow]] * k, dtype=torch.int64).reshape(k, dims)
        out_offsets = torch.arange(k + 1) * (max(channels, 1) * oh * ow if dims == 3 else oh * ow)
        if d.chance(0.3):
            out_offsets = torch.tensor([d.maybe_wrong(int(x)) for x in out_offsets])
        out += [
            ("crop_resize", lambda: ops.crop_resize(v, offsets, sizes, boxes, channels, d.int(-1, 5), d.int(-1, 5),
                                                    1.0, None, None, validate)),
            ("crop_resize_ragged", lambda: ops.crop_resize_ragged(
                v, offsets, sizes, boxes, channels, out_offsets, out_sizes, d.maybe_wrong(int(out_offsets[-1])), 1.0,
                None, None, strategy, block, meta, validate)),
        ]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_random_bad_arguments_raise_clear_errors(seed):
    d = Draw(seed)
    succeeded = set()
    for _ in range(400):
        for name, call in calls(d):
            try:
                call()
                succeeded.add(name)
            except (ValueError, TypeError):
                pass
    # The draws are not all rejected up front: every op also ran on some of them.
    assert succeeded >= {"affine", "pointwise", "item_stats", "stencil3x3", "to_padded", "from_padded"}

"""One percentile rule for every octopus statistic (benchmarks, examples, the scheduler's C++
windows): nearest rank, the smallest value with at least q% of the values at or below it."""

import math
import random

import numpy as np
import pytest

from octopus._timing import percentile


def nearest_rank(values, q):
    ordered = sorted(values)
    return next(v for k, v in enumerate(ordered, 1) if k / len(ordered) >= q / 100 - 1e-12)


def test_known_values():
    hundred = list(range(1, 101))
    assert percentile(hundred, 99) == 99 and percentile(hundred, 50) == 50 and percentile(hundred, 100) == 100
    assert percentile([4, 1, 3, 2], 50) == 2 and percentile([4, 1, 3, 2], 51) == 3
    assert percentile([7.5], 1) == 7.5 and percentile([7.5], 100) == 7.5
    # Ten samples: p99 is the largest (not an interpolation between the two largest).
    assert percentile([1.0] * 9 + [10.0], 99) == 10.0


def test_matches_the_definition_on_random_samples():
    rng = random.Random(0)
    for _ in range(500):
        values = [rng.random() for _ in range(rng.randint(1, 40))]
        q = rng.choice([1, 10, 25, 50, 75, 90, 95, 99, 99.9, 100, rng.uniform(0.1, 100)])
        assert percentile(values, q) == nearest_rank(values, q)
        assert percentile(values, q) == np.percentile(values, q, method="inverted_cdf")  # numpy's name for it
        assert percentile(values, q) in values


@pytest.mark.parametrize("q", [0, -1, 100.5, math.nan])
def test_bad_q_is_refused(q):
    with pytest.raises(ValueError, match="q must be in"):
        percentile([1.0], q)


def test_no_values_is_refused():
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)

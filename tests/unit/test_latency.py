"""Latency models: every form parses, samples are seeded and never negative."""

from __future__ import annotations

import random

import pytest

from executors.scenarios import parse_latency


@pytest.mark.parametrize(
    "spec",
    [3, 2.5, {"dist": "constant", "value": 1}, {"dist": "uniform", "low": 1, "high": 3},
     {"dist": "exponential", "mean": 2}, {"dist": "normal", "mean": 1, "stddev": 5},
     {"dist": "lognormal", "median": 4, "sigma": 0.5}, {"dist": "exponential", "mean": 0}],
)
def test_samples_are_seeded_and_non_negative(spec):
    lat = parse_latency(spec)
    a = [lat.sample(random.Random(7)) for _ in range(50)]
    b = [lat.sample(random.Random(7)) for _ in range(50)]
    assert a == b and min(a) >= 0


def test_uniform_stays_in_range():
    lat = parse_latency({"dist": "uniform", "low": 1, "high": 3})
    rng = random.Random(1)
    xs = [lat.sample(rng) for _ in range(500)]
    assert 1 <= min(xs) < 1.1 and 2.9 < max(xs) <= 3


@pytest.mark.parametrize(
    "spec, match",
    [(-1, ">= 0"), (True, "number of seconds"), ("fast", "number of seconds"),
     ({"dist": "gamma"}, "unknown dist 'gamma'"), ({"dist": "uniform", "low": 1}, "needs 'high'"),
     ({"dist": "uniform", "low": 3, "high": 1}, "low <= high"), ({"dist": "exponential", "mean": -2}, ">= 0"),
     ({"dist": "constant", "value": 1, "extra": 2}, "unexpected extra"),
     # keys YAML gives as other scalars (``-.inf: lognormal``, the wire fuzz's find: a TypeError)
     ({float("-inf"): "lognormal", "median": 0.2, "sigma": 0.4, 3: 1, None: 2},
      r"constant takes value; unexpected -inf, 3, None, median, sigma")],
)
def test_bad_latency_is_named(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_latency(spec)

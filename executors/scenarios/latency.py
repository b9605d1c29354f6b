"""Latency models: constant or seeded distributions, in virtual seconds."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import attrs

__all__ = ["Latency", "parse_latency", "DISTRIBUTIONS"]

DISTRIBUTIONS = {
    "constant": ("value",),
    "uniform": ("low", "high"),
    "exponential": ("mean",),
    "normal": ("mean", "stddev"),
    "lognormal": ("median", "sigma"),
}


@attrs.frozen
class Latency:
    """A latency distribution; ``sample`` never returns a negative value."""

    dist: str
    params: tuple[float, ...]

    def sample(self, rng: random.Random) -> float:
        p = self.params
        if self.dist == "constant":
            return p[0]
        if self.dist == "uniform":
            return rng.uniform(p[0], p[1])
        if self.dist == "exponential":
            return rng.expovariate(1.0 / p[0]) if p[0] > 0 else 0.0
        if self.dist == "normal":
            return max(0.0, rng.gauss(p[0], p[1]))
        return p[0] * math.exp(rng.gauss(0.0, p[1]))  # lognormal around its median

    def quantile(self, q: float) -> float:
        """The value below which a fraction ``q`` of samples fall (0 < q < 1)."""
        p = self.params
        if self.dist == "constant":
            return p[0]
        if self.dist == "uniform":
            return p[0] + q * (p[1] - p[0])
        if self.dist == "exponential":
            return -p[0] * math.log(1.0 - q)
        z = statistics.NormalDist().inv_cdf(q)
        if self.dist == "normal":
            return max(0.0, p[0] + z * p[1])
        return p[0] * math.exp(z * p[1])

    def describe(self) -> str:
        names = DISTRIBUTIONS[self.dist]
        if self.dist == "constant":
            return f"{self.params[0]:g} s"
        return f"{self.dist}(" + ", ".join(f"{n}={v:g}" for n, v in zip(names, self.params)) + ")"


def parse_latency(value: Any) -> Latency:
    """``2.5`` (constant) or ``{dist: uniform, low: 1, high: 3}``.

    Raises ValueError with a message naming what is wrong.
    """
    if isinstance(value, bool):
        raise ValueError(f"a latency must be a number of seconds or a mapping, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0 or math.isnan(value):
            raise ValueError(f"a latency must be >= 0 seconds, got {value!r}")
        return Latency("constant", (float(value),))
    if not isinstance(value, dict):
        raise ValueError(f"a latency must be a number of seconds or a mapping, got {value!r}")
    dist = value.get("dist", "constant")
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown dist {dist!r} (one of: {', '.join(DISTRIBUTIONS)})")
    names = DISTRIBUTIONS[dist]
    extra = set(value) - {"dist", *names}
    if extra:
        raise ValueError(f"{dist} takes {', '.join(names)}; unexpected {', '.join(sorted(extra))}")
    params = []
    for n in names:
        if n not in value:
            raise ValueError(f"{dist} needs '{n}'")
        v = value[n]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ValueError(f"'{n}' must be a number >= 0, got {v!r}")
        params.append(float(v))
    if dist == "uniform" and params[0] > params[1]:
        raise ValueError(f"uniform needs low <= high, got low={params[0]:g} high={params[1]:g}")
    return Latency(dist, tuple(params))

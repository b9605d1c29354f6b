"""Latency models: constant or seeded distributions, in virtual seconds."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import attrs

__all__ = ["Latency", "parse_latency", "DISTRIBUTIONS", "Transfer", "parse_bandwidth", "TRANSFER_KEYS",
           "DEFAULT_BANDWIDTH_GBPS"]

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


#: the largest number a latency, a bandwidth or a scenario's other numbers may be: a float holds it and
#: its sums stay finite (nan, infinities and ints no float holds are above it); nothing a count or a time
#: needs is near it
MAX_NUMBER = 1e300
#: a lognormal's largest sigma: its samples are ``median * exp(z * sigma)``, which overflows a float past
#: e^709 (z of a sample is within +-14 short of 1 in 10^40); 50 is already a spread of e^+-50 around the median
LOGNORMAL_MAX_SIGMA = 50.0


def parse_latency(value: Any) -> Latency:
    """``2.5`` (constant) or ``{dist: uniform, low: 1, high: 3}``.

    Raises ValueError with a message naming what is wrong.
    """
    if isinstance(value, bool):
        raise ValueError(f"a latency must be a number of seconds or a mapping, got {value!r}")
    if isinstance(value, (int, float)):
        if not 0 <= value < MAX_NUMBER:  # (nan, infinities, an int no float holds)
            raise ValueError(f"a latency must be >= 0 seconds (a finite number), got {value!r:.40}")
        return Latency("constant", (float(value),))
    if not isinstance(value, dict):
        raise ValueError(f"a latency must be a number of seconds or a mapping, got {value!r:.60}")
    dist = value.get("dist", "constant")
    if not isinstance(dist, str) or dist not in DISTRIBUTIONS:
        raise ValueError(f"unknown dist {dist!r} (one of: {', '.join(DISTRIBUTIONS)})")
    names = DISTRIBUTIONS[dist]
    extra = set(value) - {"dist", *names}
    if extra:
        # (a YAML key may be any scalar: ``-.inf``, ``1``, ``null``; shown as written, sorted as text)
        raise ValueError(f"{dist} takes {', '.join(names)}; unexpected {', '.join(sorted(map(str, extra)))}")
    params = []
    for n in names:
        if n not in value:
            raise ValueError(f"{dist} needs '{n}'")
        v = value[n]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < MAX_NUMBER:
            raise ValueError(f"'{n}' must be a number >= 0 (finite), got {v!r:.40}")
        params.append(float(v))
    if dist == "uniform" and params[0] > params[1]:
        raise ValueError(f"uniform needs low <= high, got low={params[0]:g} high={params[1]:g}")
    if dist == "lognormal" and params[1] > LOGNORMAL_MAX_SIGMA:  # (exp(z * sigma) overflows a float past ~e^709)
        raise ValueError(f"lognormal's sigma must be <= {LOGNORMAL_MAX_SIGMA:g}, got {params[1]:g}")
    return Latency(dist, tuple(params))


# ------------------------------------------------------------------ weight transfers
#: the moves of a replica's weights (issue 21; docs/tiers.md) and the link each takes: ``load``
#: (``LoadReplica``, or a placement from the node's WARM copy: CPU memory -> GPU), ``offload``
#: (``OffloadReplica``: GPU -> CPU memory), ``update`` (``UpdateWeights``: new weights into
#: wherever they are), ``disk`` (a placement from COLD: disk -> GPU)
TRANSFER_KEYS = ("load", "offload", "update", "disk")
#: their default bandwidths in GB/s (1e9 bytes per second): issue 21's pinned host-to-device copy
#: measured on a lent H100 (54.8 GB/s); device-to-host and updates assumed the same (not measured);
#: disk: the Ray executor's COLD -> HOT of 1 GiB on a lent H100, from a warm page cache (14.5 GB/s,
#: docs/benchmarks.md; a file not in the page cache comes at the disk's own speed: set it)
DEFAULT_BANDWIDTH_GBPS = {"load": 54.8, "offload": 54.8, "update": 54.8, "disk": 14.5}


@attrs.frozen
class Transfer:
    """How long moving a model's weights takes: ``nbytes / bandwidth``, deterministic
    (the link's speed is what was measured; the latencies above carry the noise)."""

    gbps: float  # 1e9 bytes per second; > 0

    def seconds(self, nbytes: float) -> float:
        return nbytes / (self.gbps * 1e9) if nbytes > 0 else 0.0

    def describe(self) -> str:
        return f"{self.gbps:g} GB/s"


def parse_bandwidth(value: Any) -> Transfer:
    """A bandwidth in GB/s, a number > 0. Raises ValueError naming what is wrong."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < MAX_NUMBER:
        raise ValueError(f"a bandwidth must be a number of GB/s > 0, got {value!r:.40}")
    return Transfer(float(value))

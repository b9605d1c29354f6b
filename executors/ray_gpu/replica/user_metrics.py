"""The user's own metrics in a deployment: Ray Serve's ``serve.metrics`` (``Counter``, ``Gauge``,
``Histogram``), with its signatures and its tags.

Made inside a replica, a metric gets the replica's tags as Serve adds them: ``deployment``,
``replica`` and ``application`` first (given by the user, they are refused: Serve reserves them), then
the user's ``tag_keys``; a ``route`` tag the call does not give is the route of the request being
answered (``_get_serve_request_context().route``). The values are kept in this process's registry
(prometheus-client, named as Ray exports them: ``ray_`` + the name, a counter's ``_total``), which
the replica's ``metrics_families`` hands to the ingress's ``/metrics`` with Serve's own metrics.

Where rankcore differs: Serve's go through Ray's metrics agent, so a metric made in any Ray task or
actor is exported too. rankcore's ``/metrics`` gathers the replicas' only; a metric recorded outside a
replica is kept in that process and exported nowhere (docs/metrics.md, "Your own metrics").

Bad input is refused as Ray's ``ray.util.metrics`` refuses it: an empty name, ``tag_keys`` that are not
a tuple of strings, a ``Histogram`` without ascending positive ``boundaries``, a tag the metric does
not have or one it needs missing, a counter's increment that is not positive; and, as Ray, a name
made again with another kind or other tag keys.
"""

from __future__ import annotations

import itertools
import re
import threading
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as _PCounter
from prometheus_client import Gauge as _PGauge
from prometheus_client import Histogram as _PHistogram
from prometheus_client.metrics_core import Metric

from ..base import context

__all__ = ["Counter", "Gauge", "Histogram", "families"]

#: the tags a metric made in a replica gets first (Serve's ``DEPLOYMENT_TAG``, ``REPLICA_TAG``, ``APPLICATION_TAG``)
SERVE_TAGS = ("deployment", "replica", "application")
ROUTE_TAG = "route"
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")

_lock = threading.Lock()
_registry = CollectorRegistry(auto_describe=True)
#: name -> (kind, label names, prometheus-client metric): one per name in this process
_made: dict[str, tuple[str, tuple[str, ...], Any]] = {}


def families() -> list[Metric]:
    """This process's user metrics (what a replica's ``metrics_families`` adds to its own)."""
    return list(_registry.collect())


def _in_replica() -> context.ReplicaContext | None:
    try:
        return context.get_replica_context()
    except RuntimeError:
        return None


class _Metric:
    """What the three share: the tag keys with the replica's in front, the default tags, the labels of
    one record, and the prometheus-client metric of its name (made on first use, in the process that
    records: a metric pickled into a Ray task records there)."""

    _kind = ""

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("Empty name is not allowed. Please provide a metric name.")
        if not _NAME.match(name):
            raise ValueError(f"metric name {name!r} is not a Prometheus name (letters, digits, '_' and ':', "
                             f"not starting with a digit)")
        if tag_keys is None:
            tag_keys = ()
        if not isinstance(tag_keys, tuple):
            raise TypeError(f"tag_keys should be a tuple type, got: {type(tag_keys)}")
        for key in tag_keys:
            if not isinstance(key, str):
                raise TypeError(f"Tag keys must be str, got {type(key)}.")
        self._name, self._description = name, description
        self._user_keys = tag_keys
        replica = _in_replica()
        if replica is not None:
            for key in SERVE_TAGS:
                if key in tag_keys:
                    raise ValueError(f"'{key}' tag is reserved for Ray Serve metrics")
            self._tag_keys = SERVE_TAGS + tag_keys
            # (its application is asked at each record: ``appnames`` may name it after the constructor ran)
            self._serve_tags = {"deployment": replica.deployment, "replica": replica.replica_id}
        else:
            self._tag_keys, self._serve_tags = tag_keys, {}
        self._default_tags: dict[str, str] = dict(self._serve_tags)

    @property
    def info(self) -> dict[str, Any]:
        """Its name, description, tag keys and default tags (Ray's ``Metric.info``)."""
        return {"name": self._name, "description": self._description, "tag_keys": self._tag_keys,
                "default_tags": dict(self._default_tags)}

    def set_default_tags(self, default_tags: dict[str, str]) -> None:
        """Tags every record gets unless it gives its own (Ray's; the replica's stay)."""
        for key, value in default_tags.items():
            if self._serve_tags and key in SERVE_TAGS:
                raise ValueError(f"'{key}' tag is reserved for Ray Serve metrics")
            if key not in self._tag_keys:
                raise ValueError(f"Unrecognized tag key {key!r}: {self._name} has tag keys {self._tag_keys}")
            if not isinstance(value, str):
                raise TypeError(f"Tag values must be str, got {type(value)} for {key!r}.")
        self._default_tags = {**default_tags, **self._serve_tags}

    def _labels(self, tags: dict[str, str] | None) -> dict[str, str]:
        got = {**self._default_tags, **(tags or {})}
        if self._serve_tags:
            got.update(self._serve_tags, application=context._app(self._serve_tags["deployment"]))
        if ROUTE_TAG in self._tag_keys and ROUTE_TAG not in got:
            got[ROUTE_TAG] = context._get_serve_request_context().route
        unknown = sorted(set(got) - set(self._tag_keys))
        if unknown:
            raise ValueError(f"Unrecognized tag keys {unknown}: {self._name} has tag keys {self._tag_keys}")
        missing = [k for k in self._tag_keys if k not in got]
        if missing:
            raise ValueError(f"Missing value for tag key(s): {', '.join(missing)}.")
        for key, value in got.items():
            if not isinstance(value, str):
                raise TypeError(f"Tag values must be str, got {type(value)} for {key!r}.")
        return got

    def _make(self, full: str, labels: tuple[str, ...]) -> Any:
        raise NotImplementedError

    def _metric(self, labels: dict[str, str]) -> Any:
        names = tuple(self._tag_keys)
        with _lock:
            made = _made.get(self._name)
            if made is None:
                made = _made[self._name] = (self._kind, names, self._make("ray_" + self._name, names))
        kind, keys, metric = made
        if kind != self._kind or set(keys) != set(names):
            raise ValueError(f"metric {self._name!r} was made in this process as a {kind} with tag keys {keys}; "
                             f"a {self._kind} with tag keys {names} cannot share its name")
        return metric.labels(**labels) if keys else metric

    def __reduce__(self) -> tuple:
        """Pickled (into a Ray task or actor) as what the user gave: the replica's tags are the process's
        where it is rebuilt."""
        return _rebuild, (type(self), self._args(), {k: v for k, v in self._default_tags.items()
                                                      if k not in self._serve_tags})

    def _args(self) -> tuple:
        return (self._name, self._description, self._user_keys)


def _rebuild(cls: type[_Metric], args: tuple, default_tags: dict[str, str]) -> _Metric:
    metric = cls(*args)
    metric.set_default_tags(default_tags)
    return metric


class Counter(_Metric):
    """A count that only goes up (Serve's ``serve.metrics.Counter``; exported ``ray_<name>_total``)."""

    _kind = "counter"

    def _make(self, full: str, labels: tuple[str, ...]) -> Any:
        return _PCounter(full, self._description or full, labelnames=labels, registry=_registry)

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeError(f"value must be int or float, got {type(value)}.")
        if value <= 0:
            raise ValueError(f"value must be >0, got {value}")
        self._metric(self._labels(tags)).inc(value)


class Gauge(_Metric):
    """A value set as it is now (Serve's ``serve.metrics.Gauge``)."""

    _kind = "gauge"

    def _make(self, full: str, labels: tuple[str, ...]) -> Any:
        return _PGauge(full, self._description or full, labelnames=labels, registry=_registry)

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeError(f"value must be int or float, got {type(value)}.")
        self._metric(self._labels(tags)).set(value)


class Histogram(_Metric):
    """Observations counted in ``boundaries``' buckets (Serve's ``serve.metrics.Histogram``)."""

    _kind = "histogram"

    def __init__(self, name: str, description: str = "", boundaries: list[float] | None = None,
                 tag_keys: tuple[str, ...] | None = None) -> None:
        if not boundaries:
            raise ValueError("boundaries must be a non-empty list of positive numbers, in ascending order")
        bounds = list(boundaries)
        for i, b in enumerate(bounds):
            if not isinstance(b, int | float) or isinstance(b, bool) or b <= 0:
                raise ValueError(f"Invalid `boundaries` argument at index {i}, {b!r}: boundaries must be "
                                 f"positive numbers")
        if any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"boundaries must be in ascending order, got {bounds}")
        self.boundaries = bounds
        super().__init__(name, description, tag_keys)

    def _args(self) -> tuple:
        return (self._name, self._description, self.boundaries, self._user_keys)

    def _make(self, full: str, labels: tuple[str, ...]) -> Any:
        return _PHistogram(full, self._description or full, labelnames=labels, registry=_registry,
                           buckets=[float(b) for b in self.boundaries])

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise TypeError(f"value must be int or float, got {type(value)}.")
        self._metric(self._labels(tags)).observe(value)

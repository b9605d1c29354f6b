"""``serve.metrics`` (``replica.user_metrics``): Serve's ``Counter``, ``Gauge`` and ``Histogram`` with its
signatures; made in a replica they get its ``deployment``, ``replica`` and ``application`` tags and the
answered request's ``route``; bad input is refused as Ray's ``ray.util.metrics`` refuses it. No Ray: the
replica context is set as the replica sets it (``context._set``); test_serve_metrics.py's
``test_customer_metrics_with_context`` reads them through a real ingress's ``/metrics``."""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

import rankcore as rc
from executors.ray_gpu import serve
from executors.ray_gpu.base import context
from executors.ray_gpu.base.metrics import merged
from executors.ray_gpu.replica import user_metrics


def _name() -> str:
    """A metric name no other test of this process made (the registry is the process's)."""
    return f"m_{uuid.uuid4().hex[:10]}"


def _samples(name: str) -> dict[str, list[tuple[dict, float]]]:
    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(merged(user_metrics.families()).decode()):
        for s in fam.samples:
            if s.name.startswith("ray_" + name):
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@pytest.fixture(autouse=True)
def _no_replica() -> Iterator[None]:
    """This process is no replica while a test runs (another test of the process may have made one in it)."""
    before = context._current
    context._current = None
    try:
        yield
    finally:
        context._current = before


@pytest.fixture
def in_replica() -> Iterator[None]:
    """This process is replica ``d#3`` of deployment ``d`` while the test runs."""
    context._set(context.ReplicaContext(deployment="d", replica_id="d#3",
                                        rank=rc.ReplicaRank(rank=0, node_rank=0, local_rank=0), world_size=1))
    yield


def test_serve_metrics_is_the_module_under_both_serve_names():
    from executors.ray_gpu.serve.metrics import Counter  # type: ignore[import-not-found]  # (Serve's import form)
    assert serve.metrics is user_metrics and Counter is user_metrics.Counter


def test_outside_a_replica_the_tags_are_the_users_and_the_names_are_rays():
    c, g, h = _name(), _name(), _name()
    counter = user_metrics.Counter(c, description="mine", tag_keys=("my_static_tag", "my_runtime_tag"))
    counter.set_default_tags({"my_static_tag": "static_value"})
    counter.inc(tags={"my_runtime_tag": "100"})
    counter.inc(2.5, tags={"my_runtime_tag": "100"})
    user_metrics.Gauge(g, tag_keys=("k",)).set(300, tags={"k": "v"})
    hist = user_metrics.Histogram(h, boundaries=[10, 100, 1000], tag_keys=("k",))
    hist.observe(200, tags={"k": "v"})
    hist.observe(5, tags={"k": "v"})
    assert _samples(c)[f"ray_{c}_total"] == [({"my_static_tag": "static_value", "my_runtime_tag": "100"}, 3.5)]
    assert _samples(g)[f"ray_{g}"] == [({"k": "v"}, 300.0)]
    got = _samples(h)
    assert got[f"ray_{h}_sum"] == [({"k": "v"}, 205.0)] and got[f"ray_{h}_count"] == [({"k": "v"}, 2.0)]
    assert [(ls["le"], v) for ls, v in got[f"ray_{h}_bucket"]] == [("10.0", 1.0), ("100.0", 1.0), ("1000.0", 2.0),
                                                                    ("+Inf", 2.0)]


def test_in_a_replica_its_tags_come_first_and_route_is_the_requests(in_replica):
    name = _name()
    counter = user_metrics.Counter(name, tag_keys=("my_runtime_tag", "route"))
    assert counter.info["tag_keys"] == ("deployment", "replica", "application", "my_runtime_tag", "route")
    token = context._serve_request_context.set(context.RequestContext(route="/app", request_id="r1"))
    try:
        counter.inc(tags={"my_runtime_tag": "100"})
    finally:
        context._serve_request_context.reset(token)
    counter.inc(tags={"my_runtime_tag": "100", "route": "/given"})  # (a route given is kept)
    counter.inc(tags={"my_runtime_tag": "100"})  # (outside a request: Serve's empty route)
    got = {ls["route"]: (ls["deployment"], ls["replica"], ls["application"], v)
           for ls, v in _samples(name)[f"ray_{name}_total"]}
    assert got == {"/app": ("d", "d#3", "d", 1.0), "/given": ("d", "d#3", "d", 1.0), "": ("d", "d#3", "d", 1.0)}


@pytest.mark.parametrize("tag", ["deployment", "replica", "application"])
def test_in_a_replica_its_own_tags_are_reserved(in_replica, tag):
    with pytest.raises(ValueError, match=f"'{tag}' tag is reserved for Ray Serve metrics"):
        user_metrics.Gauge(_name(), tag_keys=(tag,))
    g = user_metrics.Gauge(_name(), tag_keys=("k",))
    with pytest.raises(ValueError, match=f"'{tag}' tag is reserved"):
        g.set_default_tags({tag: "x"})


def test_outside_a_replica_serves_tag_names_are_plain_tags():
    name = _name()
    user_metrics.Gauge(name, tag_keys=("deployment",)).set(1, tags={"deployment": "mine"})
    assert _samples(name)[f"ray_{name}"] == [({"deployment": "mine"}, 1.0)]


@pytest.mark.parametrize("make, error, match", [
    (lambda: user_metrics.Counter(""), ValueError, "Empty name is not allowed"),
    (lambda: user_metrics.Counter("has space"), ValueError, "not a Prometheus name"),
    (lambda: user_metrics.Counter(_name(), tag_keys=["a"]), TypeError, "tag_keys should be a tuple type"),
    (lambda: user_metrics.Counter(_name(), tag_keys=(1,)), TypeError, "Tag keys must be str"),
    (lambda: user_metrics.Histogram(_name()), ValueError, "boundaries must be a non-empty list"),
    (lambda: user_metrics.Histogram(_name(), boundaries=[1, 0.5]), ValueError, "ascending order"),
    (lambda: user_metrics.Histogram(_name(), boundaries=[1, -2]), ValueError, "index 1, -2"),
])
def test_a_metric_made_wrong_is_refused_naming_what(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_record_made_wrong_is_refused_and_nothing_is_counted():
    name = _name()
    c = user_metrics.Counter(name, tag_keys=("k",))
    with pytest.raises(ValueError, match=r"Missing value for tag key\(s\): k"):
        c.inc()
    with pytest.raises(ValueError, match=r"Unrecognized tag keys \['other'\]"):
        c.inc(tags={"k": "v", "other": "x"})
    with pytest.raises(ValueError, match="value must be >0, got 0"):
        c.inc(0, tags={"k": "v"})
    with pytest.raises(TypeError, match="Tag values must be str"):
        c.inc(tags={"k": 3})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="Unrecognized tag key 'nope'"):
        c.set_default_tags({"nope": "x"})
    assert _samples(name) == {}
    c.inc(tags={"k": "v"})
    assert _samples(name)[f"ray_{name}_total"] == [({"k": "v"}, 1.0)]


def test_a_name_made_again_with_another_kind_or_other_tags_is_refused():
    name = _name()
    user_metrics.Counter(name, tag_keys=("k",)).inc(tags={"k": "v"})
    with pytest.raises(ValueError, match=f"'{name}' was made in this process as a counter"):
        user_metrics.Gauge(name, tag_keys=("k",)).set(1, tags={"k": "v"})
    with pytest.raises(ValueError, match="cannot share its name"):
        user_metrics.Counter(name, tag_keys=("j",)).inc(tags={"j": "v"})
    user_metrics.Counter(name, tag_keys=("k",)).inc(tags={"k": "v"})  # (the same again: one series)
    assert _samples(name)[f"ray_{name}_total"] == [({"k": "v"}, 2.0)]


def test_pickled_into_another_process_it_keeps_what_the_user_gave(in_replica):
    """A metric made in a replica and sent to a Ray task records there without the replica's tags
    (that process is no replica): what is pickled is the user's name, keys, boundaries and defaults."""
    h = user_metrics.Histogram(_name(), boundaries=[1.0, 2.0], tag_keys=("k", "s"))
    h.set_default_tags({"s": "static"})
    data = pickle.dumps(h)
    context._current = None  # (the other process)
    copy = pickle.loads(data)
    assert copy.info["tag_keys"] == ("k", "s") and copy.info["default_tags"] == {"s": "static"}
    assert copy.boundaries == [1.0, 2.0]

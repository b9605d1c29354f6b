"""The metrics' declarations (issue 37) and what is pure around them: Serve's names checked
against Ray Serve's own source, a registry per process, the controller's counts from real core
steps, request-id validation, and the Grafana dashboard naming only metrics we export."""

from __future__ import annotations

import ast
import json
import pathlib
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

import rankcore as rc
from executors.ray_gpu.base.access import REQUEST_ID_MAX, AccessLog, check_enable_access_log, request_id_of
from executors.ray_gpu.base.metrics import (
    ALL_METRICS,
    CONTROLLER_METRICS,
    INGRESS_METRICS,
    LATENCY_BUCKETS_MS,
    REPLICA_METRICS,
    ControllerMetrics,
    IngressMetrics,
    ReplicaMetrics,
    build,
    exported_names,
    merged,
)
from tests.helpers import Driver

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "rankcore-dashboard.json"


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text.decode()) for s in fam.samples}


# ------------------------------------------------------------------ declarations
def test_names_unique_and_prefixed():
    names = [s.name for s in ALL_METRICS]
    assert len(names) == len(set(names))
    for s in ALL_METRICS:
        assert s.name.startswith("ray_serve_" if s.serve else "rankcore_"), s
        assert not s.name.endswith("_total"), s  # (a counter's samples add it)


def test_serve_names_are_ray_serves_own():
    """Every metric that claims Serve's name is declared in Ray Serve's source (Ray adds ``ray_``)."""
    ray = pytest.importorskip("ray")
    src = "".join(p.read_text() for p in (pathlib.Path(ray.__file__).parent / "serve").rglob("*.py"))
    for s in ALL_METRICS:
        if s.serve:
            bare = s.serve.removeprefix("ray_")
            # (Serve builds the HTTP and gRPC ones per protocol: ``request_ingress_metrics.py``)
            templated = bare.replace("_http_", "_{protocol_name}_").replace("_grpc_", "_{protocol_name}_")
            assert re.search(rf"[\"']{re.escape(bare)}[\"']", src) or f'"{templated}"' in src, s


def test_each_process_has_a_registry_of_its_own():
    a, b = IngressMetrics(), IngressMetrics()
    a.request(route="/x", method="GET", deployment="x", status=200, latency_ms=3.0)
    assert samples(a.exposition())[("ray_serve_num_http_requests_total",
                                    (("application", "x"), ("method", "GET"), ("route", "/x"),
                                     ("status_code", "200")))] == 1
    assert not any(n == "ray_serve_num_http_requests_total" for n, _ in samples(b.exposition()))
    r1, _ = build(CONTROLLER_METRICS)
    r2, _ = build(CONTROLLER_METRICS)  # (the global registry would refuse the second: "Duplicated timeseries")
    assert r1 is not r2


def tot(s: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in s.items() if n == name and labels.items() <= dict(ls).items())


def test_ingress_counts_errors_by_status():
    m = IngressMetrics("node", "1.2.3.4")
    m.request(route="/d", method="POST", deployment="d", status=500, latency_ms=7.0)
    m.request(route="", method="GET", deployment="", status=404, latency_ms=0.5)
    m.request(route="/d", method="POST", deployment="d", status=200, latency_ms=1500.0)
    s = samples(m.exposition())
    assert tot(s, "ray_serve_num_http_error_requests_total") == 2
    assert tot(s, "ray_serve_num_http_error_requests_total", error_code="404", route="") == 1
    assert tot(s, "ray_serve_http_request_latency_ms_bucket", status_code="200", le="1000.0") == 0
    assert tot(s, "ray_serve_http_request_latency_ms_bucket", status_code="200", le="2000.0") == 1
    # the replica counts its calls (ReplicaMetrics): the ingress does not, so nothing is counted twice
    assert not any(n.startswith("ray_serve_deployment_") and "http" not in n for n, _ in s)


def test_replica_counts_as_serve_2_60_does():
    """Serve's ``record_request_metrics``: an answered call in the request counter, a failed one in
    the error counter only (by exception type), both in the latency histogram (Serve's buckets);
    the in-flight gauge follows began/ended."""
    m = ReplicaMetrics("d", "d#1")
    m.began()
    m.began()
    s = samples(merged(m.families()))
    assert s[("ray_serve_replica_processing_queries", (("application", "d"), ("deployment", "d"),
                                                        ("replica", "d#1")))] == 2
    m.answered("/d", 3.0)
    m.ended()
    m.answered("", 1500.0, "ValueError")
    m.ended()
    s = samples(merged(m.families()))
    assert tot(s, "ray_serve_replica_processing_queries") == 0
    assert tot(s, "ray_serve_deployment_request_counter_total", replica="d#1", route="/d") == 1
    assert tot(s, "ray_serve_deployment_request_counter_total", route="") == 0
    assert tot(s, "ray_serve_deployment_error_counter_total", route="", exception_type="ValueError") == 1
    assert tot(s, "ray_serve_deployment_processing_latency_ms_count") == 2
    assert tot(s, "ray_serve_deployment_processing_latency_ms_sum") == 1503.0
    assert tot(s, "ray_serve_deployment_processing_latency_ms_bucket", le="5.0") == 1
    les = {float(dict(ls)["le"]) for (n, ls), _ in s.items() if n == "ray_serve_deployment_processing_latency_ms_bucket"}
    assert les == {*map(float, LATENCY_BUCKETS_MS), float("inf")}


def test_replica_buckets_are_serves():
    """Read from Serve's source, not imported: ``ray.serve`` needs pydantic (``ray[serve]``, the
    benchmarks' extra), which the test extra does not install."""
    ray = pytest.importorskip("ray")
    src = (pathlib.Path(ray.__file__).parent / "serve" / "_private" / "constants.py").read_text()
    found = [n.value for n in ast.parse(src).body if isinstance(n, ast.AnnAssign | ast.Assign)
             and "DEFAULT_LATENCY_BUCKET_MS" in [t.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                                                  if isinstance(t, ast.Name)]]
    assert len(found) == 1, ray.__version__
    assert list(LATENCY_BUCKETS_MS) == ast.literal_eval(found[0]), ray.__version__


def test_merged_puts_each_family_once():
    """Two replicas export the same families: one scrape holds each family once (Prometheus refuses
    a second ``# TYPE`` line for a family, which concatenated expositions would have), every sample kept."""
    a, b = ReplicaMetrics("d", "d#1"), ReplicaMetrics("d", "d#2")
    a.answered("/d", 2.0)
    b.answered("/d", 2.0)
    b.answered("/d", 4.0, "KeyError")
    text = merged(a.families() + b.families())
    types = [line for line in text.decode().splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)) and "# TYPE ray_serve_deployment_request_counter_total counter" in types
    s = samples(text)
    assert tot(s, "ray_serve_deployment_request_counter_total", replica="d#1") == 1
    assert tot(s, "ray_serve_deployment_request_counter_total", replica="d#2") == 1
    assert tot(s, "ray_serve_deployment_processing_latency_ms_count") == 3
    assert tot(s, "ray_serve_deployment_error_counter_total", replica="d#2", exception_type="KeyError") == 1


# ------------------------------------------------------------------ the controller's, from core steps
class _Observed(Driver):
    def __init__(self, metrics: ControllerMetrics, **kw) -> None:
        super().__init__(**kw)
        self.metrics = metrics

    def step(self, event: object) -> rc.Step:
        before = self.state
        result = super().step(event)
        self.metrics.observe(0.0, event, before, result)
        return result


def test_controller_counts_reconfigures_compactions_and_reassignments():
    m = ControllerMetrics("actor")
    d = _Observed(m, nodes=["n0"])
    first = d.run(rc.DeploymentApplied(name="app", num_replicas=6, user_config={"v": 1}, has_reconfigure=True,
                                       reconfigure_takes_rank=True))
    assert not any(isinstance(c, rc.ReconfigureReplica) for c in first)  # (a start's config: InitializeReplica)
    change = d.run(rc.DeploymentApplied(name="app", num_replicas=6, user_config={"v": 2}, has_reconfigure=True,
                                        reconfigure_takes_rank=True))
    victims = (d.by_rank()[0], d.by_rank()[2], d.by_rank()[4])
    cmds = d.run(rc.ScaleRequested(deployment="app", num_replicas=3, victims=victims))
    rank_recs = [c for c in cmds if isinstance(c, rc.ReconfigureReplica) and c.reason == "rank"]
    s = samples(m.exposition(d.state, rejected=0))

    def tot(name, **labels):
        return sum(v for (n, ls), v in s.items() if n == name and labels.items() <= dict(ls).items())

    assert tot("rankcore_reconfigures_total", reason="rank") == len(rank_recs) == 2
    assert tot("rankcore_reconfigures_total", reason="user_config") == 6 == sum(
        isinstance(c, rc.ReconfigureReplica) and c.reason == "user_config" for c in change)
    assert tot("rankcore_compactions_total", deployment="app") == 1
    assert tot("rankcore_rank_reassignments_total", level="rank") == 2  # ranks 3, 5 -> 0, 2
    assert tot("ray_serve_autoscaling_target_replicas", deployment="app") == 3
    assert tot("ray_serve_deployment_replica_healthy") == 3
    assert tot("rankcore_deployment_replicas", phase="running") == 3
    assert tot("rankcore_core_steps_total") > 0


def test_controller_counts_tier_moves_and_bytes():
    m = ControllerMetrics()
    m.observe(0.0, rc.Tick(now=1.0), rc.State(), rc.Step(state=rc.State(), commands=(
        rc.OffloadReplica(replica_id="a#0", deployment="a"), rc.LoadReplica(replica_id="a#0", deployment="a"),
        rc.EvictReplica(replica_id="a#1", deployment="a", node_id="n", to="warm", for_replica="b#0"),
        rc.UpdateWeights(replica_id="a#0", deployment="a", version=2))))
    m.transferred("a", "offload", 1000)
    m.transferred("a", "offload", 24)
    s = samples(m.exposition(rc.State()))
    moves = {dict(ls)["move"]: v for (n, ls), v in s.items() if n == "rankcore_tier_moves_total"}
    assert moves == {"offload": 1, "load": 1, "evict_warm": 1}
    assert s[("rankcore_tier_bytes_total", (("application", "a"), ("deployment", "a"), ("move", "offload")))] == 1024
    assert s[("rankcore_weight_updates_total", (("application", "a"), ("deployment", "a")))] == 1


# ------------------------------------------------------------------ access records
def test_request_id_kept_when_safe_else_replaced():
    assert request_id_of("abc-123_x.y:z@q/w+e=") == "abc-123_x.y:z@q/w+e="
    assert request_id_of("a" * REQUEST_ID_MAX) == "a" * REQUEST_ID_MAX
    for bad in (None, "", "a" * (REQUEST_ID_MAX + 1), "has space", "new\nline", "<script>", "é"):
        new = request_id_of(bad)
        assert re.fullmatch(r"[0-9a-f]{32}", new), bad
    assert request_id_of(None) != request_id_of(None)


def test_access_log_flag_and_file(tmp_path):
    with pytest.raises(rc.InvalidConfig, match="enable_access_log"):
        check_enable_access_log("yes")
    log = AccessLog(True, str(tmp_path))
    log.write({"request_id": "r1", "status": 200})
    log.enabled = False
    log.write({"request_id": "r2", "status": 200})
    assert [r["request_id"] for r in log.last()] == ["r1"]
    for h in log.log.handlers:
        h.flush()
    lines = (tmp_path / "access.jsonl").read_text().splitlines()
    assert [json.loads(x)["request_id"] for x in lines] == ["r1"]


# ------------------------------------------------------------------ the Grafana dashboard
def test_dashboard_names_only_metrics_we_export():
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert exprs, "no queries"
    known = exported_names()
    named = set()
    for e in exprs:
        for word in re.findall(r"\b(?:ray_serve|rankcore)_[a-z_]+\b", e):
            named.add(word)
            assert word in known, f"{word!r} in {e!r} is not a metric we export"
    spec_names = {s.name for s in INGRESS_METRICS + REPLICA_METRICS + CONTROLLER_METRICS}
    covered = {n for n in spec_names if any(n in w for w in named)}
    assert len(covered) >= len(spec_names) // 2, sorted(spec_names - covered)


def test_router_families_count_each_router_by_route_under_serves_names():
    """What a process's routers routed (``base.router.routed``) as Serve's two router counters: the
    router counter labelled with the router's id (or the ingress's ``http``) and the process's actor, the
    handle counter with Serve's ``application#deployment#handle``; merged with a replica's families."""
    from executors.ray_gpu.base.metrics import ReplicaMetrics, router_families

    routed = [("f", "/f", "app1", "ab", 3), ("f", "", "app1", "ab", 1), ("g", "/g", "g", "cd", 2)]
    text = merged(ReplicaMetrics("f", "f#0", application="f").families()
                  + router_families(routed, "actor1")).decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(text) for s in fam.samples}
    router = {(dict(k)["deployment"], dict(k)["route"], dict(k)["handle"], dict(k)["actor_id"]): v
              for (n, k), v in got.items() if n == "ray_serve_num_router_requests_total"}
    assert router == {("f", "/f", "ab", "actor1"): 3, ("f", "", "ab", "actor1"): 1, ("g", "/g", "cd", "actor1"): 2}
    handle = {(dict(k)["handle"], dict(k)["route"]): v for (n, k), v in got.items()
              if n == "ray_serve_handle_request_counter_total"}
    assert handle == {("app1#f#ab", "/f"): 3, ("app1#f#ab", ""): 1, ("g#g#cd", "/g"): 2}  # (the app counted)
    assert any(n == "ray_serve_deployment_replica_starts_total" for n, _ in got)  # (the replica's own, kept)
    ingress = router_families(routed, "proxy", handle="http")
    assert {s.labels["handle"] for fam in ingress for s in fam.samples} == {"http", "app1#f#http", "g#g#http"}


def test_http_requests_counted_by_several_processes_are_summed_into_one_series():
    """The direct data plane: the ingress and each replica's own server count HTTP requests under the
    same names and labels; a scrape shows each series once, the sum (a counter's and a histogram's)."""
    from executors.ray_gpu.base.metrics import IngressMetrics, ReplicaMetrics

    ingress, a, b = IngressMetrics(), ReplicaMetrics("d", "d#0", application="d"), ReplicaMetrics("d", "d#1",
                                                                                                  application="d")
    ingress.request(route="/d", method="POST", deployment="d", status=200, latency_ms=2.0)
    a.http_request(route="/d", method="POST", status=200, latency_ms=1.0)
    b.http_request(route="/d", method="POST", status=200, latency_ms=1.0)
    b.http_request(route="/d", method="POST", status=500, latency_ms=1.0)
    text = merged(list(ingress.registry.collect()) + a.families() + b.families()).decode()
    series = [(s.name, tuple(sorted(s.labels.items()))) for fam in text_string_to_metric_families(text)
              for s in fam.samples]
    assert len(series) == len(set(series))  # (each series once)
    got = {(s.name, s.labels.get("status_code")): s.value for fam in text_string_to_metric_families(text)
           for s in fam.samples if s.name in ("ray_serve_num_http_requests_total", "ray_serve_http_request_latency_ms_count")}
    assert got == {("ray_serve_num_http_requests_total", "200"): 3, ("ray_serve_num_http_requests_total", "500"): 1,
                   ("ray_serve_http_request_latency_ms_count", "200"): 3,
                   ("ray_serve_http_request_latency_ms_count", "500"): 1}


def test_a_replica_that_leaves_keeps_its_share_of_a_summed_counter():
    """``Departed``: the sum over replicas never falls when one goes (Prometheus would read a reset),
    nor when one misses a scrape; what each counted is added once."""
    from executors.ray_gpu.base.metrics import HTTP_REQUEST_METRICS, Departed, ReplicaMetrics

    def counted(fams: list) -> float:
        text = merged(fams).decode()
        return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == "ray_serve_num_http_requests_total")

    a, b = ReplicaMetrics("d", "d#0", application="d"), ReplicaMetrics("d", "d#1", application="d")
    for _ in range(3):
        a.http_request(route="/d", method="POST", status=200, latency_ms=1.0)
    b.http_request(route="/d", method="POST", status=200, latency_ms=1.0)
    shares = Departed(s.name for s in HTTP_REQUEST_METRICS)
    assert counted(shares.fold({"a": a.families(), "b": b.families()})) == 4
    assert counted(shares.fold({"a": None, "b": b.families()})) == 4  # (a missed this scrape)
    b.http_request(route="/d", method="POST", status=200, latency_ms=1.0)
    assert counted(shares.fold({"b": b.families()})) == 5  # (a left: its 3 stay)
    assert counted(shares.fold({"b": b.families()})) == 5  # (and are added once)
    assert counted(shares.fold({})) == 5

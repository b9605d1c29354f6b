"""The Serve metrics issue 64 added to what the controller and the replicas export, counted from real
core steps where the controller's (no Ray): a replica's start, reconfigure and stop timed from the step
that ordered it to the step its answer fed (``ControllerMetrics.observe``, a clock handed in), a health
check's time (``ControllerMetrics.health_checked``, as the watcher tells it), each application's status
at scrape (``ControllerMetrics.refresh``) by ``api/apps.py``'s rule, the replica's constructor time
(``ReplicaMetrics.initialized``), and the gRPC counts (``IngressMetrics.grpc_request``: Serve's gRPC
proxy's labels). The buckets are Serve's, read from its source."""

from __future__ import annotations

import ast
import itertools
import pathlib

import pytest

import rankcore as rc
from executors.ray_gpu.base import metrics as mx
from executors.ray_gpu.base.metrics import (
    APPLICATION_STATUS_NUMERIC,
    LATENCY_BUCKETS_MS,
    REPLICA_LIFECYCLE_BUCKETS_MS,
    ControllerMetrics,
    IngressMetrics,
    ReplicaMetrics,
    application_status,
    merged,
)
from tests.unit.test_metrics import _Observed, samples, tot


class Clock:
    """A monotonic clock the test moves (seconds)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _hist(s: dict, name: str, **labels: str) -> tuple[float, float]:
    """(count, sum) of histogram ``name`` over the series matching ``labels``."""
    return tot(s, name + "_count", **labels), tot(s, name + "_sum", **labels)


def _held(kind: type):
    return lambda c: isinstance(c, kind)


# ------------------------------------------------------------------ a replica's start, reconfigure, stop
def test_a_replicas_start_is_timed_from_its_start_replica_to_its_ready():
    clock = Clock()
    m = ControllerMetrics(clock=clock)
    d = _Observed(m, nodes=["n0"])
    started = d.run(rc.DeploymentApplied(name="app", num_replicas=2), hold=_held(rc.InitializeReplica))
    assert sum(isinstance(c, rc.StartReplica) for c in started) == 2 and len(d.held) == 2
    assert _hist(samples(m.exposition(d.state)), "ray_serve_replica_startup_latency_ms") == (0, 0)
    clock.now += 0.25
    d.release(lambda c: c.replica_id == d.held[0].replica_id)
    clock.now += 0.5
    d.release()
    s = samples(m.exposition(d.state))
    assert _hist(s, "ray_serve_replica_startup_latency_ms", deployment="app", application="app") == (2, 250 + 750)
    assert tot(s, "ray_serve_replica_startup_latency_ms_bucket", le="250.0") == 1  # (Serve's startup buckets)
    assert tot(s, "ray_serve_replica_startup_latency_ms_bucket", le="1000.0") == 2
    assert m._starting == {}


def test_a_reconfigure_is_timed_to_the_answer_of_its_version_and_a_stop_to_stopped():
    clock = Clock()
    m = ControllerMetrics(clock=clock)
    d = _Observed(m, nodes=["n0"])
    d.run(rc.DeploymentApplied(name="app", num_replicas=3, user_config={"v": 1}, has_reconfigure=True))
    hold = _held(rc.ReconfigureReplica)
    d.run(rc.DeploymentApplied(name="app", num_replicas=3, user_config={"v": 2}, has_reconfigure=True), hold=hold)
    old = d.held[0]
    # an answer to an older version (a repeated or late one) ends nothing: the core finds it stale
    d.step(rc.ReplicaReconfigured(replica_id=old.replica_id, version=old.version - 1))
    assert _hist(samples(m.exposition(d.state)), "ray_serve_replica_reconfigure_latency_ms") == (0, 0)
    answered = 0
    while d.held:  # (the core reconfigures them in turn: each answered 40 ms after it was sent)
        clock.now += 0.04
        cmd = d.held.pop(0)
        d.run(rc.ReplicaReconfigured(replica_id=cmd.replica_id, version=cmd.version), hold=hold)
        answered += 1
    assert answered == 3
    s = samples(m.exposition(d.state))
    count, total = _hist(s, "ray_serve_replica_reconfigure_latency_ms", deployment="app")
    assert (count, round(total, 6)) == (3, 120.0)
    assert tot(s, "ray_serve_replica_reconfigure_latency_ms_bucket", le="50.0") == 3  # (the request buckets)

    victims = tuple(sorted(d.state.deployments["app"].replicas))[:2]
    d.run(rc.ScaleRequested(deployment="app", num_replicas=1, victims=victims), hold=_held(rc.StopReplica))
    assert {c.replica_id for c in d.held} == set(victims)
    clock.now += 1.5
    d.release()
    s = samples(m.exposition(d.state))
    count, total = _hist(s, "ray_serve_replica_shutdown_duration_ms", deployment="app", application="app")
    assert (count, round(total, 6)) == (2, 3000.0)
    assert tot(s, "ray_serve_replica_shutdown_duration_ms_bucket", le="2000.0") == 2
    assert (m._starting, m._reconfiguring, m._stopping) == ({}, {}, {})


def test_a_replica_that_crashes_or_is_lost_is_not_timed_and_not_kept():
    clock = Clock()
    m = ControllerMetrics(clock=clock)
    d = _Observed(m, nodes=["n0", "n1"])
    d.run(rc.DeploymentApplied(name="app", num_replicas=2), hold=_held(rc.InitializeReplica))
    first, second = (c.replica_id for c in d.held)
    d.held = [c for c in d.held if c.replica_id != first]
    d.run(rc.ReplicaCrashed(replica_id=first, reason="boom", cause="error"), hold=_held(rc.InitializeReplica))
    assert first not in m._starting and second in m._starting
    # a node lost takes its replicas without an answer to each: forgotten at the next scrape
    node = d.state.deployments["app"].replicas[second].node_id
    d.run(rc.NodeLost(node_id=node), hold=_held(rc.InitializeReplica))
    m.exposition(d.state)
    assert second not in m._starting
    assert set(m._starting) <= set(d.state.index)
    assert _hist(samples(m.exposition(d.state)), "ray_serve_replica_startup_latency_ms") == (0, 0)


def test_an_observer_step_is_constant_time_in_the_replicas_held():
    """Told a step whose event answers nothing and whose commands start, stop or reconfigure nothing,
    the observer touches none of its waits (they hold only what is awaited)."""
    m = ControllerMetrics(clock=Clock())
    m._starting.update({f"r{i}": (0.0, "d") for i in range(1000)})
    m.observe(0.0, rc.Tick(now=1.0), rc.State(), rc.Step(state=rc.State(), commands=()))
    assert len(m._starting) == 1000


# ------------------------------------------------------------------ health checks
def test_health_check_latency_is_per_deployment_in_the_request_buckets():
    m = ControllerMetrics()
    m.health_checked("d", 3.0)
    m.health_checked("d", 700.0)
    s = samples(m.exposition(rc.State()))
    assert _hist(s, "ray_serve_health_check_latency_ms", deployment="d", application="d") == (2, 703.0)
    les = {float(dict(ls)["le"]) for (n, ls), _ in s.items() if n == "ray_serve_health_check_latency_ms_bucket"}
    assert les == {*map(float, LATENCY_BUCKETS_MS), float("inf")}


def test_the_watcher_tells_each_timed_check_with_its_deployment():
    """``Watcher._check_took`` (what ``health_checks`` calls with an answered or timed-out check's
    time): the deployment the core holds the replica under, in ms; none told for a replica it does not
    hold, nor when no one listens."""
    from executors.ray_gpu.control.observe import Watcher

    class Ledger:
        class driver:
            state = rc.State()

    d = _Observed(ControllerMetrics(), nodes=["n0"])
    d.run(rc.DeploymentApplied(name="app", num_replicas=1))
    Ledger.driver.state = d.state
    watcher = Watcher.__new__(Watcher)
    watcher.ledger = Ledger()  # type: ignore[assignment]
    told: list[tuple[str, float]] = []
    watcher._check_took(next(iter(d.state.index)), 0.002)  # (no one listens: nothing)
    watcher.on_check_time = lambda dep, ms: told.append((dep, ms))
    watcher._check_took(next(iter(d.state.index)), 0.002)
    watcher._check_took("gone#9", 0.002)
    assert [(dep, round(ms, 6)) for dep, ms in told] == [("app", 2.0)]


# ------------------------------------------------------------------ the application status
def test_application_status_is_apps_rule():
    """``metrics.application_status`` answers as ``api/apps.py``'s ``_app_status`` for every set of
    deployment statuses (it is written again because apps.py may not be imported by metrics.py)."""
    from executors.ray_gpu.api.apps import _app_status

    words = ("HEALTHY", "UPDATING", "UNHEALTHY", "DEPLOY_FAILED", "DELETING", "UPSCALING")
    for n in range(len(words) + 1):
        for chosen in itertools.combinations(words, n):
            deps = [{"name": f"d{i}", "status": w, "message": ""} for i, w in enumerate(chosen)]
            assert application_status(chosen) == _app_status(deps)[0], chosen


def test_application_status_per_application_at_scrape(monkeypatch):
    table = {"front": "shop", "back": "shop"}
    monkeypatch.setattr(mx, "_apps_table", lambda: table)
    m = ControllerMetrics()
    d = _Observed(m, nodes=["n0"])
    d.run(rc.DeploymentApplied(name="front", num_replicas=1))
    d.run(rc.DeploymentApplied(name="back", num_replicas=1))
    d.run(rc.DeploymentApplied(name="solo", num_replicas=1))

    def status() -> dict[str, float]:
        s = samples(m.exposition(d.state))
        return {dict(ls)["application"]: v for (n, ls), v in s.items() if n == "ray_serve_application_status"}

    assert status() == {"shop": 6, "solo": 6}  # (RUNNING; solo: a deployment no application holds)
    d.run(rc.DeploymentApplied(name="back", num_replicas=2), hold=_held(rc.InitializeReplica))
    assert status() == {"shop": 5, "solo": 6}  # (one deployment UPDATING: the application DEPLOYING)
    d.release()
    d.run(rc.DeploymentDeleted(deployment="solo"), hold=_held(rc.StopReplica))
    assert status() == {"shop": 6, "solo": 4}  # (DELETING)
    d.release()
    assert status() == {"shop": 6}  # (gone: its series too)
    assert APPLICATION_STATUS_NUMERIC == {"DEPLOY_FAILED": 1, "UNHEALTHY": 2, "NOT_STARTED": 3, "DELETING": 4,
                                          "DEPLOYING": 5, "RUNNING": 6}


def test_application_status_numbers_are_serves():
    """Serve's ``ApplicationStatus.to_numeric`` mapping, read from its source (not imported)."""
    ray = pytest.importorskip("ray")
    src = (pathlib.Path(ray.__file__).parent / "serve" / "schema.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "to_numeric"
              and "ApplicationStatus" in ast.unparse(n))
    mapping = next(n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict))
    serve = {ast.unparse(k).removeprefix("ApplicationStatus."): ast.literal_eval(v)
             for k, v in zip(mapping.keys, mapping.values)}
    assert serve == APPLICATION_STATUS_NUMERIC, ray.__version__


def test_lifecycle_buckets_are_serves():
    ray = pytest.importorskip("ray")
    src = (pathlib.Path(ray.__file__).parent / "serve" / "_private" / "constants.py").read_text()
    found = [n.value for n in ast.parse(src).body if isinstance(n, ast.AnnAssign)
             and isinstance(n.target, ast.Name) and n.target.id == "DEFAULT_REPLICA_STARTUP_SHUTDOWN_LATENCY_BUCKETS_MS"]
    assert len(found) == 1 and found[0] is not None, ray.__version__
    assert list(REPLICA_LIFECYCLE_BUCKETS_MS) == ast.literal_eval(found[0]), ray.__version__


# ------------------------------------------------------------------ the replica's constructor
def test_the_replica_exports_its_constructors_time_with_its_replica():
    a, b = ReplicaMetrics("d", "d#1"), ReplicaMetrics("d", "d#2")
    a.initialized(120.0)
    b.initialized(30_000.0)
    s = samples(merged(a.families() + b.families()))
    assert _hist(s, "ray_serve_replica_initialization_latency_ms", replica="d#1") == (1, 120.0)
    assert _hist(s, "ray_serve_replica_initialization_latency_ms", deployment="d", application="d") == (2, 30_120.0)
    assert tot(s, "ray_serve_replica_initialization_latency_ms_bucket", le="250.0") == 1
    assert tot(s, "ray_serve_replica_initialization_latency_ms_bucket", le="30000.0") == 2


# ------------------------------------------------------------------ gRPC, as Serve's gRPC proxy labels it
def test_grpc_calls_are_counted_with_serves_grpc_labels():
    m = IngressMetrics("node", "1.2.3.4")
    m.grpc_started()
    m.grpc_request(method="/pkg.Echo/Say", deployment="echo", code="OK", latency_ms=4.0)
    m.grpc_request(method="/pkg.Echo/Say", deployment="echo", code="INTERNAL", latency_ms=30.0)
    m.grpc_request(method="/pkg.Echo/Say", deployment="", code="NOT_FOUND", latency_ms=0.2)
    s = samples(m.exposition())
    assert s[("ray_serve_num_grpc_requests_total", (("application", "echo"), ("method", "/pkg.Echo/Say"),
                                                    ("route", "echo"), ("status_code", "StatusCode.OK")))] == 1
    assert tot(s, "ray_serve_num_grpc_requests_total") == 3
    assert tot(s, "ray_serve_num_grpc_error_requests_total") == 2
    assert s[("ray_serve_num_grpc_error_requests_total", (("application", ""), ("error_code", "StatusCode.NOT_FOUND"),
                                                          ("method", "/pkg.Echo/Say"), ("route", "")))] == 1
    assert s[("ray_serve_num_deployment_grpc_error_requests_total",
              (("application", "echo"), ("deployment", "echo"), ("error_code", "StatusCode.INTERNAL"),
               ("method", "/pkg.Echo/Say"), ("route", "echo")))] == 1
    assert _hist(s, "ray_serve_grpc_request_latency_ms", status_code="StatusCode.INTERNAL") == (1, 30.0)
    assert s[("ray_serve_num_ongoing_grpc_requests", (("node_id", "node"), ("node_ip_address", "1.2.3.4")))] == 1
    m.grpc_ended()
    assert tot(samples(m.exposition()), "ray_serve_num_ongoing_grpc_requests") == 0
    # the HTTP families are another protocol's: untouched
    assert tot(s, "ray_serve_num_http_requests_total") == 0


# ------------------------------------------------------------------ a replica's calls, counted (no Ray)
class _Served:
    def __call__(self) -> str:
        return "hi"

    def fails(self) -> None:
        raise ValueError("no")

    async def items(self):  # (an async generator)
        for i in range(5):
            yield i


def test_a_stream_its_caller_closed_counts_as_answered_and_a_raise_as_failed():
    """CI once counted a plain deployment's call as failed with ``GeneratorExit``: a progress call's
    router reads the answer and drops the stream, which closes the replica's generator at its last
    ``yield``. A stream closed so, or mid-way (a client gone), is answered; a raise is failed."""
    import asyncio

    from executors.ray_gpu.replica.actor import ReplicaActor

    r = ReplicaActor("d", "d#0", _Served, (), {}, lineage=0, global_rank=0, world_size=1)
    r.instance = _Served()

    async def go() -> None:
        progress = r.handle_progress("__call__", (), {})
        assert [await progress.__anext__(), await progress.__anext__()] == ["started", "hi"]
        await progress.aclose()  # (the answer read, the rest never asked for)
        stream = r.handle_stream("items", (), {})
        assert await stream.__anext__() == 0
        await stream.aclose()  # (a client gone mid-stream)
        with pytest.raises(ValueError, match="no"):
            await r.handle_request("fails", (), {})
    asyncio.run(go())
    s = samples(merged(r.metrics.families()))
    assert tot(s, "ray_serve_deployment_request_counter_total") == 2
    assert {dict(ls)["exception_type"] for n, ls in s if n == "ray_serve_deployment_error_counter_total"} \
        == {"ValueError"}
    assert tot(s, "ray_serve_deployment_error_counter_total") == 1
    assert tot(s, "ray_serve_deployment_processing_latency_ms_count") == 3


# ------------------------------------------------------------------ the proxies, in Serve's numbers
def test_proxy_status_is_serves_number_for_the_cores_phase_and_a_drained_one_stays_drained():
    """``ray_serve_proxy_status`` reads the core's proxy book at scrape: STARTING 1, HEALTHY 2, BACKOFF
    (it died before it was ready again: restarting) 3 UNHEALTHY, DRAINING 4; a proxy the core stopped
    once drained stays 5 DRAINED, as Serve's gauge keeps its last value. ``proxy_stopped`` times a stop."""
    from tests.unit.test_proxies import Run, cluster, deploy, ready_all

    m = ControllerMetrics()
    ips = {"head": "10.0.0.1", "w0": "10.0.0.2"}
    m.node_ip = lambda node: ips.get(node, "")

    class Watched(Run):
        def __call__(self, event: object) -> rc.Step:
            before = self.state
            result = super().__call__(event)
            m.observe(0.0, event, before, result)
            return result

    run = Watched()

    def status() -> dict[str, tuple[str, float]]:
        s = samples(m.exposition(run.state))
        return {dict(ls)["node_id"]: (dict(ls)["node_ip_address"], v)
                for (n, ls), v in s.items() if n == "ray_serve_proxy_status"}

    cluster(run, workers=1, drain=0.0)
    assert status() == {"head": ("10.0.0.1", 1.0)}
    deploy(run, 1)
    ready_all(run)
    assert status() == {"head": ("10.0.0.1", 2.0), "w0": ("10.0.0.2", 2.0)}
    run(rc.ScaleRequested(deployment="llm", num_replicas=0))
    run(rc.ReplicaStopped(replica_id="llm#0", now=12.0))  # (its node is empty: its proxy drains)
    assert status()["w0"] == ("10.0.0.2", 4.0)
    worker = run.state.proxies.proxies["w0"].proxy_id
    run(rc.Tick(now=50.0))
    run(rc.ProxyHealthChecked(proxy_id=worker, healthy=True, ongoing=0, now=50.0))
    assert "w0" not in run.state.proxies.proxies and status()["w0"] == ("10.0.0.2", 5.0)
    head = run.state.proxies.proxies["head"].proxy_id
    run(rc.ProxyCrashed(proxy_id=head, now=51.0))  # (the first death restarts at once)
    assert status()["head"] == ("10.0.0.1", 1.0)
    run(rc.ProxyCrashed(proxy_id=run.state.proxies.proxies["head"].proxy_id, now=52.0))  # (again: it backs off)
    assert run.state.proxies.proxies["head"].phase is rc.ProxyPhase.BACKOFF and status()["head"] == ("10.0.0.1", 3.0)
    deploy(run, 1)  # (w0 is wanted again: a new proxy there is the series' value)
    assert status()["w0"] == ("10.0.0.2", 1.0)

    m.proxy_stopped("w0", 120.0)
    s = samples(m.exposition(run.state))
    assert _hist(s, "ray_serve_proxy_shutdown_duration_ms", node_id="w0", node_ip_address="10.0.0.2") == (1, 120.0)

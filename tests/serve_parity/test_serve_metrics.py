"""Ray Serve's metrics tests, run against ``from executors.ray_gpu import serve`` on one local Ray
(issue 64, "Prove it on Serve's own tests").

Sources, ray-project/ray (the versions the search index holds):

* python/ray/serve/tests/test_metrics.py @ f8e626d01308448dbb4da94ca7d21067b313c121 (56,878 characters:
  the proxy, replica, request-context and handle cases in one file)
* python/ray/serve/tests/test_metrics_2.py @ 03b58aeb2dc75edcbdfbc6a6ec75bac14a04680e, the file Serve
  later moved the request-context and handle cases to: those are ported once, under test_metrics.py's
  names; its cases test_metrics.py has not (``test_fastapi_route_metrics``, ``TestProxyStateMetrics``)
  are here too. (Serve's unit/test_metrics_utils.py tests its private in-memory metrics store and
  pusher, which rankcore has not: not ported.)

Every case is here under its own name and parameters, re-expressed from what it checks (written anew,
not copied); the tally is in docs/testing.md, "Ray Serve's own tests (tests/serve_parity/)".

How: Serve scrapes Ray's metrics agent (port 9999) on a fresh cluster per case; rankcore's metrics
are scraped at the proxy's ``GET /metrics`` (the ingress's, the controller's and every serving
replica's, docs/metrics.md) and parsed with prometheus_client's parser. Ray starts once for the module
(``_local_ray``), the proxies serve HTTP and gRPC on free ports, and every case deletes the
applications it ran; so that cases do not see each other's counts, a case reads the series of its own
deployments, or the increase of a counter across it (a deleted replica's series go with it).

Adapted throughout, as said at each case:

* Serve's function deployments (``@serve.deployment def f``) are classes with ``__call__`` (rankcore's
  ``@serve.deployment`` takes a class: test_serve_config.py); deployment names are global in rankcore
  (docs/ray.md, "Porting a Serve app"), so where Serve runs one deployment name in two applications
  the second is another name.
* gRPC: the tests' own service (tests/integration/protos/echo.proto, its method ``/rankcore.test.Echo/Say``)
  stands for Serve's ``UserDefinedService``; its calls name their application in the ``application``
  metadata, as Serve's clients do. Its ``ListApplications`` and
  health services are not counted (docs/metrics.md, "What is counted where"), so a case counting
  gRPC calls makes a call of the user's service.
* A label on an unmatched path: ``route`` ``""`` for a 404 (and for a gRPC call to no application),
  as Serve's later version of these cases expects it (test_metrics.py with ``metrics_start_shutdown``,
  89,835 characters in the index), where this version expected the path (``"/fake_route"``).
* The queue gauges (``ray_serve_deployment_queued_queries``, ``ray_serve_num_ongoing_requests_at_replicas``)
  are the proxy's router's (docs/metrics.md, "The ingress"): Serve's handle calls from an actor are
  HTTP calls here.

A documented gap or a rankcore defect is a strict xfail whose reason says what differs; the check that
shows it raises ``Gap`` (the mark's ``raises``), after every other check of the case, so any other
failure of such a case fails the run.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest
import ray
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

import rankcore as rc
from executors.ray_gpu import serve
from executors.ray_gpu.ingress.http import ingress_address, proxies
from tests.integration.conftest import _local_ray, witness_dir  # noqa: F401 (fixtures of this module too)
from tests.integration.protos import echo_pb2, echo_pb2_grpc

ORIGINS = ("python/ray/serve/tests/test_metrics.py @ f8e626d01308448dbb4da94ca7d21067b313c121",
           "python/ray/serve/tests/test_metrics_2.py @ 03b58aeb2dc75edcbdfbc6a6ec75bac14a04680e")
CPU = {"num_cpus": 0.05}
SERVICERS = ["tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"]
SAY = "/rankcore.test.Echo/Say"

CODE_NAMES = ("rankcore defect: the gRPC metrics' status_code and error_code are the code's name (NOT_FOUND, "
              "INTERNAL), where Serve's are str(grpc.StatusCode.X) ('StatusCode.NOT_FOUND'): a dashboard or alert "
              "written for Serve matches nothing (docs/metrics.md gives the names, not as a difference)")
ROUTE_PATTERN = ("the route label of a request to an ASGI (FastAPI) deployment is the app's matched route (\"/api\", "
                 "\"/api2/{user_id}\"), as Serve's, in the proxy's and the replicas' metrics and in the calls it makes "
                 "through handles")
OUTSIDE_REPLICAS = ("differs on purpose: serve.metrics recorded outside a replica (a Ray task's, an actor's) are kept "
                    "in that process and exported nowhere; rankcore's /metrics gathers the replicas' (docs/metrics.md, "
                    "\"Your own metrics\"), where Serve's go through Ray's metrics agent, which this project does "
                    "not install (ray[default])")
ROUTER_ONLY = ("differs on purpose: the queue gauges are the proxy's router's only (docs/metrics.md, \"The ingress\": "
               "serve_deployment_queued_queries and serve_num_ongoing_requests_at_replicas, \"the ingress's router "
               "only, handle http\"); the handles of other processes (a driver's, a replica's) are not scraped")


class Gap(AssertionError):
    """What a strict xfail of this file names did not match Serve."""


def gap(ok: bool, what: str) -> None:
    if not ok:
        raise Gap(what)


# ------------------------------------------------------------------ the cluster
@pytest.fixture(scope="module", autouse=True)
def ray_serve():
    """One local Ray; the proxies serve HTTP and gRPC (the tests' service) on free ports; at the end the
    controller forgets everything."""
    gen = _local_ray(0, 128, "reset")
    next(gen)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 0},
                    grpc_options={"port": 0, "grpc_servicer_functions": SERVICERS})
        yield
    finally:
        next(gen, None)


@pytest.fixture(autouse=True)
def _fresh_applications():
    """What a case ran is deleted after it (Serve's fresh cluster per case); a module fixture's stays."""
    before = set(serve._APPS)
    yield
    for name in set(serve._APPS) - before:
        try:
            serve.delete(name)
        except rc.RankcoreError:
            pass


def base() -> str:
    host, port = ingress_address()  # type: ignore[misc]
    return f"http://{host}:{port}"


def grpc_channel() -> grpc.Channel:
    (head,) = [p for p in proxies().values() if p["head"]]
    host, port = head["grpc_address"]
    return grpc.insecure_channel(f"{host}:{port}")


def say(application: str | None, text: str = "hi") -> grpc.StatusCode:
    """One call of the tests' service; the code it ended with."""
    with grpc_channel() as channel:
        metadata = () if application is None else (("application", application),)
        try:
            echo_pb2_grpc.EchoStub(channel).Say(echo_pb2.EchoRequest(text=text), metadata=metadata, timeout=60)
            return grpc.StatusCode.OK
        except grpc.RpcError as exc:
            return exc.code()


def get(path: str, **kw: Any) -> httpx.Response:
    return httpx.get(base() + path, timeout=60, **kw)


Sample = tuple[str, dict, float]


def scrape() -> list[Sample]:
    r = httpx.get(f"{base()}/metrics", timeout=60)
    assert r.status_code == 200
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(r.text) for s in fam.samples]


def series(name: str, got: list[Sample] | None = None, **labels: str) -> list[dict]:
    """The label sets of sample ``name`` that have ``labels``."""
    return [ls for n, ls, _ in (scrape() if got is None else got) if n == name and labels.items() <= ls.items()]


def total(name: str, got: list[Sample] | None = None, **labels: str) -> float:
    return sum(v for n, ls, v in (scrape() if got is None else got) if n == name and labels.items() <= ls.items())


def grown(name: str, before: list[Sample], got: list[Sample], **labels: str) -> list[dict]:
    """The label sets of sample ``name`` (with ``labels``) whose value rose since ``before``: this case's."""
    was = {tuple(sorted(ls.items())): v for n, ls, v in before if n == name}
    return [ls for n, ls, v in got if n == name and labels.items() <= ls.items()
            and v > was.get(tuple(sorted(ls.items())), 0.0)]


def names(got: list[Sample]) -> set[str]:
    return {n for n, _, _ in got}


def wait_for(check: Callable[[], Any], timeout: float = 45.0) -> Any:
    """``check()`` once it passes (retried while it raises an ``AssertionError`` other than ``Gap``, or a
    ``KeyError``: a series not scraped yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except Gap:
            raise
        except (AssertionError, KeyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@ray.remote(num_cpus=0)
class Signal:
    """Serve's ``SignalActor``: ``wait`` returns once ``send`` is called; ``waiters`` counts those waiting."""

    def __init__(self):
        self.event = asyncio.Event()
        self.waiting = 0

    async def wait(self):
        self.waiting += 1
        try:
            await self.event.wait()
        finally:
            self.waiting -= 1

    async def send(self):
        self.event.set()

    async def waiters(self):
        return self.waiting


# ------------------------------------------------------------------ deployments
@serve.deployment(name="metrics", ray_actor_options=CPU)
class Metrics:
    async def __call__(self, request=None):
        return "hello"

    def Say(self, request):
        return echo_pb2.EchoReply(text="hello")


@serve.deployment(name="A", ray_actor_options=CPU, graceful_shutdown_timeout_s=0.0001)
class Waiting:
    def __init__(self, signal):
        self.signal = signal

    async def __call__(self, request=None):
        await self.signal.wait.remote()


@serve.deployment(name="A", ray_actor_options=CPU, graceful_shutdown_timeout_s=0.01)
class Dies:
    async def __init__(self):
        pass

    async def __call__(self, *args):
        os._exit(0)

    async def Say(self, request):
        os._exit(0)


@serve.deployment(name="f", ray_actor_options=CPU)
class Fails:
    def __call__(self, *args):
        return 1 / 0

    def Say(self, request):
        return 1 / 0


@serve.deployment(name="f", ray_actor_options=CPU, graceful_shutdown_timeout_s=0.001)
class F:
    def __call__(self, *args):
        return "hello"


@serve.deployment(name="g", ray_actor_options=CPU, graceful_shutdown_timeout_s=0.001)
class G:
    def __call__(self, *args):
        return "world"


@serve.deployment(name="h", ray_actor_options=CPU, graceful_shutdown_timeout_s=0.001)
class H:
    def __call__(self, *args):
        return 1 / 0

    def Say(self, request):
        return 1 / 0


def three_apps(prefix: str) -> None:
    """Serve's f, g and h, in applications app1, app2 and app3, routed at ``prefix`` + f, g, h or the
    application's name."""
    for cls, name, app in ((F, "f", "app1"), (G, "g", "app2"), (H, "h", "app3")):
        serve.run(cls.bind(), name=app, route_prefix=f"/{app}" if prefix == "app" else f"/{name}")


# ================================================================== test_metrics.py
def test_serve_metrics_for_successful_connection():
    handle = serve.run(Metrics.bind(), name="app1")
    assert get("/").text == "hello"
    for response in [handle.remote() for _ in range(10)]:
        assert response.result(timeout=60) == "hello"
    assert say("app1") is grpc.StatusCode.OK  # (ListApplications is not counted: a call of the user's service)
    exported = ["ray_serve_num_http_requests_total", "ray_serve_num_grpc_requests_total",
                "ray_serve_deployment_queued_queries", "ray_serve_deployment_request_counter_total",
                "ray_serve_deployment_replica_starts_total", "ray_serve_deployment_processing_latency_ms_bucket",
                "ray_serve_deployment_processing_latency_ms_count", "ray_serve_deployment_processing_latency_ms_sum",
                "ray_serve_replica_processing_queries", "ray_serve_deployment_replica_healthy"]

    def present() -> set[str]:
        got = names(scrape())
        assert set(exported) <= got, set(exported) - got
        return got
    wait_for(present)

    def routed() -> None:  # (the ingress's router took the HTTP call and the gRPC one; a driver's handle is not
        got = scrape()     # in a scraped process: its 10 calls are the replica's, not a router counter's)
        assert {(ls["route"], ls["application"], ls["handle"]) for ls in
                series("ray_serve_num_router_requests_total", got, deployment="metrics")} >= \
            {("/", "app1", "http"), ("app1", "app1", "http")}
        assert {(ls["route"], ls["handle"]) for ls in
                series("ray_serve_handle_request_counter_total", got, deployment="metrics")} >= \
            {("/", "app1#metrics#http"), ("app1", "app1#metrics#http")}
    wait_for(routed)


def test_http_replica_gauge_metrics():
    signal = Signal.remote()
    handle = serve.run(Waiting.bind(signal), name="app1")
    response = handle.remote()
    try:
        def processing() -> None:
            got = scrape()
            (labels,) = series("ray_serve_replica_processing_queries", got, deployment="A")
            assert labels["application"] == "app1"
            assert total("ray_serve_replica_processing_queries", got, deployment="A") == 1.0
        wait_for(processing)
    finally:
        ray.get(signal.send.remote())
    response.result(timeout=60)


def test_proxy_metrics_not_found():
    before = scrape()
    for _ in range(2):
        assert get("/B/").status_code == 404
    assert say("foo") is grpc.StatusCode.NOT_FOUND  # (no application runs: none is named "foo")

    def counted() -> list[Sample]:
        got = scrape()
        for name in ("ray_serve_num_http_requests_total", "ray_serve_num_grpc_requests_total",
                     "ray_serve_num_http_error_requests_total", "ray_serve_num_grpc_error_requests_total",
                     "ray_serve_num_deployment_http_error_requests_total", "ray_serve_http_request_latency_ms_sum",
                     "ray_serve_num_deployment_grpc_error_requests_total", "ray_serve_grpc_request_latency_ms_sum"):
            assert name in names(got), name
        for name, labels, n in (("ray_serve_num_http_error_requests_total", {"error_code": "404"}, 2),
                                ("ray_serve_num_deployment_http_error_requests_total", {"error_code": "404"}, 2),
                                ("ray_serve_num_grpc_error_requests_total", {"method": SAY}, 1),
                                ("ray_serve_num_deployment_grpc_error_requests_total", {"method": SAY}, 1)):
            assert total(name, got, **labels) - total(name, before, **labels) == n, name
        return got
    got = wait_for(counted)
    codes = {ls["error_code"] for ls in series("ray_serve_num_deployment_grpc_error_requests_total", got, method=SAY)}
    gap(codes == {str(grpc.StatusCode.NOT_FOUND)}, f"{CODE_NAMES}: {codes}")


def test_proxy_metrics_internal_error():
    before = scrape()
    serve.run(Dies.bind(), name="app")
    for _ in range(2):  # each kills its replica (Serve: RayActorError), which the core starts again
        assert get("/A/").status_code == 500
    assert say("app") is not grpc.StatusCode.OK

    def counted() -> None:
        got = scrape()
        for name, n in (("ray_serve_num_http_error_requests_total", 2),
                        ("ray_serve_num_deployment_http_error_requests_total", 2),
                        ("ray_serve_num_grpc_error_requests_total", 1),
                        ("ray_serve_num_deployment_grpc_error_requests_total", 1)):
            labels = {"deployment": "A"} if "deployment" in name else {"application": "app"}
            assert total(name, got, **labels) - total(name, before, **labels) == n, name
        for name in ("ray_serve_num_http_requests_total", "ray_serve_num_grpc_requests_total",
                     "ray_serve_http_request_latency_ms_sum", "ray_serve_grpc_request_latency_ms_sum"):
            assert series(name, got, application="app"), name
    wait_for(counted)


def test_proxy_metrics_fields_not_found():
    before = scrape()
    assert get("/fake_route").status_code == 404
    assert say("fake-app") is grpc.StatusCode.NOT_FOUND

    def labelled() -> tuple[dict, dict]:
        got = scrape()
        (http_req,) = grown("ray_serve_num_http_requests_total", before, got)
        assert (http_req["route"], http_req["method"], http_req["application"], http_req["status_code"]) == \
            ("", "GET", "", "404")
        (http_err,) = grown("ray_serve_num_http_error_requests_total", before, got)
        assert (http_err["route"], http_err["error_code"], http_err["method"]) == ("", "404", "GET")
        (grpc_req,) = grown("ray_serve_num_grpc_requests_total", before, got)
        assert (grpc_req["route"], grpc_req["method"], grpc_req["application"]) == ("", SAY, "")
        (grpc_err,) = grown("ray_serve_num_grpc_error_requests_total", before, got)
        assert (grpc_err["route"], grpc_err["method"]) == ("", SAY)
        return grpc_req, grpc_err
    grpc_req, grpc_err = wait_for(labelled)
    gap((grpc_req["status_code"], grpc_err["error_code"]) == (str(grpc.StatusCode.NOT_FOUND),) * 2,
        f"{CODE_NAMES}: {grpc_req['status_code']}, {grpc_err['error_code']}")


def test_proxy_metrics_fields_internal_error():
    before = scrape()
    serve.run(Fails.bind(), name="app", route_prefix="/real_route")
    serve.run(Fails.options(name="f2").bind(), name="app2", route_prefix="/real_route2")  # (names are global)
    assert get("/real_route").status_code == 500
    assert say("app") is grpc.StatusCode.INTERNAL

    def labelled() -> tuple[dict, dict]:
        got = scrape()
        (err,) = grown("ray_serve_num_deployment_http_error_requests_total", before, got)
        assert (err["deployment"], err["error_code"], err["method"], err["application"]) == ("f", "500", "GET", "app")
        (gerr,) = grown("ray_serve_num_deployment_grpc_error_requests_total", before, got)
        assert (gerr["deployment"], gerr["method"], gerr["application"]) == ("f", SAY, "app")
        (lat,) = grown("ray_serve_http_request_latency_ms_count", before, got)
        assert (lat["method"], lat["route"], lat["application"], lat["status_code"]) == \
            ("GET", "/real_route", "app", "500")
        (glat,) = grown("ray_serve_grpc_request_latency_ms_count", before, got)
        assert (glat["method"], glat["route"], glat["application"]) == (SAY, "app", "app")
        return gerr, glat
    gerr, glat = wait_for(labelled)
    gap((gerr["error_code"], glat["status_code"]) == (str(grpc.StatusCode.INTERNAL),) * 2,
        f"{CODE_NAMES}: {gerr['error_code']}, {glat['status_code']}")


def test_replica_metrics_fields():
    three_apps("deployment")
    assert get("/f").text == "hello" and get("/g").text == "world"
    mine = {"f", "g", "h"}

    def of(name: str, got: list[Sample], *keys: str) -> set[tuple]:
        return {tuple(ls[k] for k in keys) for ls in series(name, got) if ls.get("deployment") in mine}

    def answered() -> None:
        got = scrape()
        counted = of("ray_serve_deployment_request_counter_total", got, "route", "deployment", "application")
        if not counted >= {("/f", "f", "app1"), ("/g", "g", "app2")}:
            # (asked again: a replica that replaced the one that answered, under a loaded machine's health
            # checks, has served nothing yet; what the scrape held is in the message when it never shows)
            assert get("/f").text == "hello" and get("/g").text == "world"
            raise AssertionError(f"counted {counted}; replicas scraped "
                                 f"{[(ls['deployment'], ls['replica'], ls['application']) for ls in series('rankcore_replica_metrics_up', got) if ls.get('deployment') in mine]}; "
                                 f"starts {of('ray_serve_deployment_replica_starts_total', got, 'deployment', 'replica')}")
        assert of("ray_serve_deployment_replica_starts_total", got, "deployment", "application") == \
            {("f", "app1"), ("g", "app2"), ("h", "app3")}
        for name in ("ray_serve_deployment_processing_latency_ms_count", "ray_serve_deployment_processing_latency_ms_sum"):
            assert {("f", "app1"), ("g", "app2")} <= of(name, got, "deployment", "application")
        assert of("ray_serve_replica_processing_queries", got, "deployment", "application") == \
            {("f", "app1"), ("g", "app2"), ("h", "app3")}
    wait_for(answered)
    assert get("/h").status_code == 500

    def failed() -> None:
        got = scrape()
        assert of("ray_serve_deployment_error_counter_total", got, "route", "deployment", "application") == \
            {("/h", "h", "app3")}, of("ray_serve_deployment_error_counter_total", got, "deployment", "exception_type")
        assert of("ray_serve_deployment_replica_healthy", got, "deployment", "application") == \
            {("f", "app1"), ("g", "app2"), ("h", "app3")}
    wait_for(failed)


class TestRequestContextMetrics:
    def test_request_context_pass_for_http_proxy(self):
        before = scrape()  # (the proxy's counters of earlier cases' applications app1 ... are kept)
        three_apps("app")
        r1, r2, r3 = get("/app1"), get("/app2"), get("/app3")
        assert (r1.status_code, r1.text, r2.status_code, r2.text, r3.status_code) == (200, "hello", 200, "world", 500)

        def routes(name: str, got: list[Sample]) -> dict[str, tuple[set, set]]:
            out: dict[str, tuple[set, set]] = {}
            for ls in series(name, got):
                if ls.get("deployment") in ("f", "g", "h"):
                    rs, apps = out.setdefault(ls["deployment"], (set(), set()))
                    rs.add(ls["route"])
                    apps.add(ls["application"])
            return out

        def passed() -> list[Sample]:
            got = scrape()
            assert set(routes("ray_serve_deployment_processing_latency_ms_sum", got)) == {"f", "g", "h"}
            ok = routes("ray_serve_deployment_request_counter_total", got)
            assert ok.get("f") == ({"/app1"}, {"app1"}) and ok.get("g") == ({"/app2"}, {"app2"}), ok
            failed = routes("ray_serve_deployment_error_counter_total", got)
            assert failed.get("h") == ({"/app3"}, {"app3"}), failed
            for name in ("ray_serve_num_http_requests_total", "ray_serve_http_request_latency_ms_sum"):
                assert {ls["route"] for ls in grown(name, before, got) if ls["application"] in ("app1", "app2", "app3")} \
                    == {"/app1", "/app2", "/app3"}
            assert routes("ray_serve_deployment_processing_latency_ms_sum", got) == \
                {"f": ({"/app1"}, {"app1"}), "g": ({"/app2"}, {"app2"}), "h": ({"/app3"}, {"app3"})}
            for name in ("ray_serve_handle_request_counter_total", "ray_serve_num_router_requests_total"):
                # (the ingress's routers outlive a deleted application, as Serve's counters: what grew is this case's)
                assert {(ls["deployment"], ls["route"], ls["application"]) for ls in grown(name, before, got)
                        if ls["deployment"] in ("f", "g", "h")} == \
                    {("f", "/app1", "app1"), ("g", "/app2", "app2"), ("h", "/app3", "app3")}, name
            return got
        wait_for(passed)

    def test_request_context_pass_for_grpc_proxy(self):
        before = scrape()
        serve.run(GrpcDeployment.bind(), name="app1", route_prefix="/app1")
        serve.run(Market.bind(Stand.options(name="mango-stand").bind("mango"),
                              Stand.options(name="orange-stand").bind("orange")), name="app2", route_prefix="/app2")
        serve.run(H.options(name="H").bind(), name="app3", route_prefix="/app3")
        assert say("app1") is grpc.StatusCode.OK
        assert say("app2") is grpc.StatusCode.OK
        assert say("app3") is grpc.StatusCode.INTERNAL
        mine = {"grpc-deployment": "app1", "grpc-deployment-model-composition": "app2", "mango-stand": "app2",
                "orange-stand": "app2", "H": "app3"}

        def passed() -> list[Sample]:
            got = scrape()
            lat = {ls["deployment"]: ls for ls in series("ray_serve_deployment_processing_latency_ms_sum", got)
                   if ls.get("deployment") in mine}
            assert set(lat) == set(mine)  # (app1 one deployment, app2 three, app3 one)
            assert {d: ls["application"] for d, ls in lat.items()} == mine
            for name in ("ray_serve_num_grpc_requests_total", "ray_serve_grpc_request_latency_ms_sum"):
                assert {ls["route"] for ls in grown(name, before, got, method=SAY) if ls["application"] in
                        ("app1", "app2", "app3")} == {"app1", "app2", "app3"}
            return got
        got = wait_for(passed)
        counted = {ls["deployment"]: ls["route"] for name in ("ray_serve_deployment_request_counter_total",
                                                               "ray_serve_deployment_error_counter_total")
                   for ls in series(name, got) if ls.get("deployment") in ("grpc-deployment",
                                                                           "grpc-deployment-model-composition", "H")}
        assert counted == {"grpc-deployment": "app1", "grpc-deployment-model-composition": "app2", "H": "app3"}, \
            counted  # (a gRPC call's route is its application's, as Serve's: the proxy's note gives it)

        def routed() -> dict[str, set]:  # (the proxy's router, route the application; the composition's
            out: dict[str, set] = {}     # handles, in its replica, route the request's: app2 too)
            for ls in grown("ray_serve_num_router_requests_total", before, scrape()):
                if ls.get("deployment") in mine:
                    out.setdefault(ls["deployment"], set()).add((ls["route"], ls["application"]))
            assert out == {d: {(a, a)} for d, a in mine.items()}, out
            return out
        wait_for(routed)

    def test_request_context_pass_for_handle_passing(self):
        serve.run(Gateway.bind(G1.bind(), G2.bind()), name="app")
        assert get("/api").text == '"ok1"' and get("/api2").text == '"ok2"'

        def passed() -> dict[str, set]:
            got = scrape()
            out: dict[str, set] = {}
            for ls in series("ray_serve_deployment_request_counter_total", got):
                if ls.get("deployment") in ("G", "g1", "g2"):
                    assert ls["application"] == "app"
                    out.setdefault(ls["deployment"], set()).add(ls["route"])
            assert set(out) == {"G", "g1", "g2"}
            return out
        routes = wait_for(passed)
        gap(routes == {"G": {"/api", "/api2"}, "g1": {"/api"}, "g2": {"/api2"}}, f"{ROUTE_PATTERN}: {routes}")

    def test_customer_metrics_with_context(self):
        serve.run(CustomMetrics.bind(), name="app", route_prefix="/app")
        deployment_name, replica_id = get("/app").json()
        static = {"my_static_tag": "static_value", "replica": replica_id, "deployment": deployment_name,
                  "application": "app", "route": "/app"}

        def recorded() -> dict[str, list[dict]]:
            got = scrape()
            out = {n: series(n, got) for n in ("ray_my_counter_total", "ray_my_gauge", "ray_my_histogram_sum")}
            assert all(len(v) == 1 for v in out.values()), out
            return out
        got = wait_for(recorded)
        for name, runtime in (("ray_my_counter_total", "100"), ("ray_my_gauge", "300"), ("ray_my_histogram_sum", "200")):
            assert got[name][0] == {**static, "my_runtime_tag": runtime}, (name, got[name])
        assert (total("ray_my_counter_total"), total("ray_my_gauge"), total("ray_my_histogram_sum")) == (1, 300, 200)

    @pytest.mark.parametrize("use_actor", [False, True])
    def test_serve_metrics_outside_serve(self, use_actor):
        pytest.skip(OUTSIDE_REPLICAS)


def test_multiplexed_metrics():
    handle = serve.run(Multiplexed.bind(), name="app", route_prefix="/app")
    for model in ("model1", "model2", "model3"):  # the third evicts one (max_num_models_per_replica=2)
        handle.remote(model).result(timeout=60)

    def present() -> None:
        got = names(scrape())
        for name in ("ray_serve_multiplexed_model_load_latency_ms_sum", "ray_serve_multiplexed_model_unload_latency_ms_sum",
                     "ray_serve_num_multiplexed_models", "ray_serve_multiplexed_models_load_counter_total",
                     "ray_serve_multiplexed_models_unload_counter_total"):
            assert name in got, name
    wait_for(present)


class TestHandleMetrics:
    def test_queued_queries_basic(self):
        # Serve's calls from an actor's handle are HTTP calls here (the queue gauge is the proxy's router's)
        signal = Signal.remote()
        serve.run(Waiting.options(name="WaitForSignal", max_ongoing_requests=1).bind(signal), name="app1")
        calls = [threading.Thread(target=get, args=("/",), daemon=True)]
        calls[0].start()  # the first takes the replica's one slot
        try:
            for i in range(5):
                calls.append(threading.Thread(target=get, args=("/",), daemon=True))
                calls[-1].start()
                wait_for(lambda n=i + 1: _eq(total("ray_serve_deployment_queued_queries", application="app1"), n))
        finally:
            ray.get(signal.send.remote())
        for t in calls:
            t.join(60)
        wait_for(lambda: _eq(total("ray_serve_deployment_queued_queries", application="app1",
                                   deployment="WaitForSignal"), 0))

    def test_queued_queries_multiple_handles(self):
        pytest.skip(ROUTER_ONLY)

    def test_queued_queries_disconnected(self):
        # (Serve's scheduling tasks, ray_serve_num_scheduling_tasks and _in_backoff: no such concept in rankcore's
        # router, docs/metrics.md; those checks are left out)
        signal = Signal.remote()
        serve.run(Waiting.options(name="hang_on_first_request", max_ongoing_requests=1).bind(signal), name="default")
        host, port = ingress_address()  # type: ignore[misc]
        ongoing = "ray_serve_num_ongoing_http_requests"
        before = total(ongoing)

        def request() -> socket.socket:
            s = socket.create_connection((host, port), timeout=30)
            s.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            return s
        clients = [request()]
        try:
            wait_for(lambda: _eq(ray.get(signal.waiters.remote()), 1))
            wait_for(lambda: _eq(total(ongoing) - before, 1))
            clients += [request() for _ in range(3)]
            wait_for(lambda: _eq(total("ray_serve_deployment_queued_queries", deployment="hang_on_first_request"), 3))
            wait_for(lambda: _eq(total(ongoing) - before, 4))
            for s in clients:  # the clients go away: their requests are cancelled
                s.close()
            wait_for(lambda: _eq(total("ray_serve_deployment_queued_queries", deployment="hang_on_first_request"), 0))
            wait_for(lambda: _eq(total(ongoing) - before, 0))
        finally:
            for s in clients:
                s.close()
            ray.get(signal.send.remote())

    def test_running_requests_gauge(self):
        pytest.skip(ROUTER_ONLY)


def test_long_poll_host_sends_counted():
    pytest.skip("differs on purpose: rankcore's controller is no long-poll host with namespaces (docs/metrics.md, "
                "\"Ray Serve's metrics, one by one\": serve_long_poll_host_transmission_counter, no such concept)")


def test_actor_summary():
    # Serve: the controller, the proxy and the application's replica are alive actors of those classes.
    # rankcore's are named actors: rankcore-controller and rankcore-http (namespace rankcore) and a replica
    # ModelActor:<deployment>:<replica> (docs/ray.md, "How it works", "HTTP ingress")
    serve.run(F.bind(), name="app")
    alive = {(a["namespace"], a["name"]) for a in ray.util.list_named_actors(all_namespaces=True)}
    assert ("rankcore", "rankcore-controller") in alive and ("rankcore", "rankcore-http") in alive
    assert any(name.startswith("ModelActor:f:") for _, name in alive), alive


# ================================================================== test_metrics_2.py (cases test_metrics.py has not)
@pytest.mark.parametrize("route_prefix", ["", "/prefix"])
def test_fastapi_route_metrics(route_prefix: str):
    if route_prefix:
        serve.run(Routes.bind(), route_prefix=route_prefix)
    else:
        serve.run(Routes.bind())
    assert get(f"{route_prefix}/api").text == '"ok1"' and get(f"{route_prefix}/api2/abc123").text == '"ok2"'

    def counted() -> set[str]:
        got = {ls["route"] for ls in series("ray_serve_deployment_request_counter_total", deployment="A")}
        assert got
        return got
    routes = wait_for(counted)
    gap(routes == {f"{route_prefix}/api", f"{route_prefix}/api2/{{user_id}}"}, f"{ROUTE_PATTERN}: {routes}")


class TestProxyStateMetrics:
    def test_proxy_status_metric(self):
        serve.run(F.options(name="proxy-status-f").bind(), name="app")

        def healthy() -> list[dict]:
            got = series("ray_serve_proxy_status")
            assert got and all(ls["node_id"] and ls["node_ip_address"] for ls in got), got
            assert total("ray_serve_proxy_status") == 2  # (HEALTHY in Serve's numbers)
            return got
        (proxy,) = wait_for(healthy)  # (one node: one proxy)
        assert proxy["node_id"] == ray.get_runtime_context().get_node_id()

    def test_proxy_shutdown_duration_metric(self):
        serve.run(F.options(name="proxy-shutdown-f").bind(), name="app")
        wait_for(lambda: _eq(total("ray_serve_proxy_status"), 2))
        serve.shutdown()  # (the proxies stop: each one's shutdown is timed)
        # Serve scrapes Ray's metrics agent, which outlives the proxies; rankcore's /metrics is a proxy's:
        # the controller's histogram is read once the proxies serve again
        serve.start(http_options={"host": "127.0.0.1", "port": 0},
                    grpc_options={"port": 0, "grpc_servicer_functions": SERVICERS})
        got = wait_for(lambda: series("ray_serve_proxy_shutdown_duration_ms_sum") or _eq(None, "a series"))
        assert len(got) == 1 and got[0]["node_id"] == ray.get_runtime_context().get_node_id(), got
        assert total("ray_serve_proxy_shutdown_duration_ms_count") >= 1


# ------------------------------------------------------------------ the cases' deployments and helpers
@serve.deployment(ray_actor_options=CPU, graceful_shutdown_timeout_s=0.001)
class CustomMetrics:
    """Serve's ``Model`` of test_customer_metrics_with_context: a Counter, a Histogram and a Gauge with a
    static default tag, a runtime tag and ``route``; it answers its deployment and replica id."""

    def __init__(self):
        keys = ("my_static_tag", "my_runtime_tag", "route")
        self.counter = serve.metrics.Counter("my_counter", description="my counter metrics", tag_keys=keys)
        self.histogram = serve.metrics.Histogram("my_histogram", description="my histogram ",
                                                 boundaries=[1, 10, 100, 1000, 10000], tag_keys=keys)
        self.gauge = serve.metrics.Gauge("my_gauge", description="my_gauge", tag_keys=keys)
        for m in (self.counter, self.histogram, self.gauge):
            m.set_default_tags({"my_static_tag": "static_value"})

    def __call__(self, *args):
        self.counter.inc(tags={"my_runtime_tag": "100"})
        self.histogram.observe(200, tags={"my_runtime_tag": "200"})
        self.gauge.set(300, tags={"my_runtime_tag": "300"})
        ctx = serve.get_replica_context()
        return [ctx.deployment, ctx.replica_id]


def _eq(got: float, want: float) -> bool:
    assert got == want, (got, want)
    return True


@serve.deployment(name="grpc-deployment", ray_actor_options=CPU, graceful_shutdown_timeout_s=0.001)
class GrpcDeployment:
    def Say(self, request):
        return echo_pb2.EchoReply(text="hello")


@serve.deployment(name="grpc-deployment-model-composition", ray_actor_options=CPU, graceful_shutdown_timeout_s=0.001)
class Market:
    def __init__(self, mango, orange):
        self.mango, self.orange = mango, orange

    async def Say(self, request):
        a, b = await self.mango.remote(), await self.orange.remote()
        return echo_pb2.EchoReply(text=f"{a} {b}")


@serve.deployment(ray_actor_options=CPU, graceful_shutdown_timeout_s=0.001)
class Stand:
    def __init__(self, fruit):
        self.fruit = fruit

    def __call__(self, *args):
        return self.fruit


@serve.deployment(name="g1", ray_actor_options=CPU)
class G1:
    def __call__(self, *args):
        return "ok1"


@serve.deployment(name="g2", ray_actor_options=CPU)
class G2:
    def __call__(self, *args):
        return "ok2"


gateway_api = FastAPI()


@serve.deployment(name="G", ray_actor_options=CPU)
@serve.ingress(gateway_api)
class Gateway:
    def __init__(self, handle1, handle2):
        self.handle1, self.handle2 = handle1, handle2

    @gateway_api.get("/api")
    async def app1(self):
        return await self.handle1.remote()

    @gateway_api.get("/api2")
    async def app2(self):
        return await self.handle2.remote()


routes_api = FastAPI()


@serve.deployment(name="A", ray_actor_options=CPU)
@serve.ingress(routes_api)
class Routes:
    @routes_api.get("/api")
    def route1(self):
        return "ok1"

    @routes_api.get("/api2/{user_id}")
    def route2(self, user_id: str):
        return "ok2"


@serve.deployment(name="Model", ray_actor_options=CPU)
class Multiplexed:
    @serve.multiplexed(max_num_models_per_replica=2)
    async def get_model(self, model_id: str):
        return model_id

    async def __call__(self, model_id: str):
        await self.get_model(model_id)

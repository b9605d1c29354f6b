"""The HTTP ingress (issue 22) with a real HTTP client (httpx) on loopback: answers, the
error statuses (404, 400, 413, 500 naming the application's error, 503, 408), healthz and
routes, progress as server-sent events, the status page and its JSON twin (and, where
Chromium is installed, the page as a headless browser renders it), ``rankcore serve``."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import ray

import rankcore as rc
from executors.ray_gpu import delete, deployment, http_method, multiplexed, run
from executors.ray_gpu.base.exposed import Reachable
from executors.ray_gpu.control.controller import NAMESPACE
from executors.ray_gpu.ingress.http import (
    INGRESS_NAME,
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    args_of,
    expose,
    ingress_address,
    match_route,
    not_found_text,
    public_methods,
    start_ingress,
)

from .conftest import ROOT
from .test_ray_metrics import scrape, total
from .test_ray_wire_fuzz import connect, error_answer, exchange, read_until_closed

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}


@deployment(name="adder", num_replicas=2, ray_actor_options=OPTS)
class Adder:
    def __call__(self, a=0, b=0):
        return a + b

    @http_method
    def echo(self, *args, **kwargs):
        return {"args": list(args), "kwargs": kwargs}

    @http_method
    def fail(self, what="boom"):
        raise ValueError(f"application says {what}")

    @http_method
    def nap(self, seconds):
        time.sleep(seconds)
        return seconds

    @http_method
    def not_json(self):
        return {1, 2}

    @http_method
    def late(self):
        raise TimeoutError("the application's own timeout")


@deployment(name="gone", num_replicas=1, ray_actor_options=OPTS)
class Gone:
    def __call__(self):
        return "here"


@deployment(name="tight", num_replicas=1, max_ongoing_requests=1, max_queued_requests=1, ray_actor_options=OPTS)
class Tight:
    def __call__(self, seconds=1.0):
        time.sleep(seconds)
        return "slept"


@deployment(name="slowpoke", num_replicas=1, max_ongoing_requests=1, ray_actor_options=OPTS)
class Slowpoke:
    """One replica, one slot: a call left running holds up the next one."""

    def __call__(self):
        return "awake"

    @http_method
    async def nap(self, seconds=5.0):
        await asyncio.sleep(seconds)
        return seconds

    @http_method
    async def drip(self, n=3, seconds=5.0):
        for i in range(n):
            yield i
            await asyncio.sleep(seconds)


#: for ``rankcore serve tests.integration.test_ray_http:cli_app``
cli_app = Gone.options(name="served").bind()


@pytest.fixture(scope="module")
def base():
    """The ingress on a free loopback port with three deployments routed."""
    run(Adder.bind(), route_prefix="/add", port=0)
    run(Gone.bind(), http=True)  # default route: /gone
    run(Tight.bind(), http=True)
    run(Slowpoke.bind(), http=True)
    host, port = ingress_address()
    return f"http://{host}:{port}"


@pytest.fixture()
def client(base):
    with httpx.Client(base_url=base, timeout=30.0) as c:
        yield c


def error_of(r: httpx.Response) -> dict:
    """The ingress's JSON error; a request that reached the app has its id, the answer's ``x-request-id``."""
    body = r.json()
    assert set(body) == {"error", "detail", "deployment", "request_id"}, body
    assert body["request_id"] == r.headers["x-request-id"], (body, r.headers)
    return body


def configure(**limits) -> None:
    ray.get(ray.get_actor(INGRESS_NAME, namespace=NAMESPACE).configure.remote(**limits))


# ------------------------------------------------------------------ rules (no Ray needed, but quick)
def test_args_of_maps_bodies_to_arguments():
    assert args_of(b"") == ((), {})
    assert args_of(b'{"args": [1, 2], "kwargs": {"x": 3}}') == ((1, 2), {"x": 3})
    assert args_of(b'{"kwargs": {"x": 3}}') == ((), {"x": 3})
    assert args_of(b"[1, 2]") == (([1, 2],), {})  # a bare value is the one argument
    assert args_of(b'{"text": "hi"}') == (({"text": "hi"},), {})
    assert args_of(b"7") == ((7,), {})


def test_match_route_longest_prefix_and_methods():
    routes = {"/": "root", "/a": "A", "/a/b": "AB"}
    assert match_route(routes, "/a") == ("/a", "A", "__call__")
    assert match_route(routes, "/a/echo") == ("/a", "A", "echo")
    assert match_route(routes, "/a/b") == ("/a/b", "AB", "__call__")
    assert match_route(routes, "/x") == ("/", "root", "x")
    assert match_route(routes, "/a/_private") is None
    assert match_route({"/a": "A"}, "/ab") is None


def test_public_methods_are_what_a_route_may_call():
    """Over HTTP only ``__call__`` and ``@http_method`` methods; over gRPC the public methods; never a
    lifecycle method or a ``@multiplexed`` loader, however it is named or marked."""

    class NoCall:
        limit = 3  # (not callable: not a method)

        def echo(self):
            pass

        def _hidden(self):
            pass

        def reconfigure(self, config):
            pass

        def check_health(self):
            pass

        @multiplexed
        async def get_model(self, model_id):
            return model_id

    class Anything:
        def __getattr__(self, name):
            return lambda: name

    adder = public_methods(Adder.cls)
    assert adder.http == {"echo", "fail", "late", "nap", "not_json", "__call__"}
    assert adder.grpc == {"echo", "fail", "late", "nap", "not_json", "__call__"}
    no_call = public_methods(NoCall)
    assert no_call == Reachable(http=frozenset(), grpc=frozenset({"echo"}))
    for method in ("reconfigure", "check_health", "get_model", "echo", "__call__"):
        assert no_call.refusal("nc", method, "http") is not None, method
    for method in ("reconfigure", "check_health", "get_model", "__call__"):
        assert no_call.refusal("nc", method, "grpc") is not None, method
    assert no_call.refusal("nc", "echo", "grpc") is None
    anything = public_methods(Anything)  # any name may be a method: gRPC sends it on, HTTP only __call__
    assert anything.grpc is None and anything.refusal("a", "whatever", "grpc") is None
    assert anything.refusal("a", "reconfigure", "grpc") is not None
    assert anything.refusal("a", "whatever", "http") is not None


def test_http_method_refuses_what_no_client_may_reach():
    with pytest.raises(rc.InvalidConfig, match=r"'reconfigure'.*lifecycle"):

        class Bad:
            @http_method
            def reconfigure(self, config):
                pass

    with pytest.raises(rc.InvalidConfig, match=r"'get_model'.*@multiplexed"):

        class Loader:
            @http_method
            @multiplexed
            async def get_model(self, model_id):
                return model_id


# ------------------------------------------------------------------ answers
def test_answers_json_in_and_out(client):
    assert client.post("/add", json={"args": [2, 3]}).json() == 5
    assert client.post("/add", json={"kwargs": {"a": 4, "b": 6}}).json() == 10
    assert client.get("/add").json() == 0  # GET: no arguments
    assert client.post("/add/echo", json={"x": [1]}).json() == {"args": [{"x": [1]}], "kwargs": {}}
    assert client.get("/gone").json() == "here"
    r = client.post("/add", json={"args": [1, 1]})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"


def test_keep_alive_answers_not_held_by_nagle(client):
    """A keep-alive connection's answers come at once: with Nagle on, each one's body waited for
    the client's delayed ACK (44 ms a request, measured; 0.5 ms without)."""
    client.get("/-/routes")
    took = []
    for _ in range(21):
        t0 = time.perf_counter()
        assert client.get("/-/routes").status_code == 200
        took.append(time.perf_counter() - t0)
    assert sorted(took)[10] < 0.03, f"median {sorted(took)[10] * 1e3:.1f} ms"


def test_concurrent_requests_all_answered(base):
    results: list = [None] * 40

    def one(i: int) -> None:
        with httpx.Client(base_url=base, timeout=30.0) as c:
            results[i] = c.post("/add", json={"args": [i, 1]}).json()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [i + 1 for i in range(len(results))]


def test_the_proxy_sends_plain_calls_by_value_to_replicas_it_knows_the_server_of(client):
    """The proxy's calls go over the replicas' gRPC servers (``base.by_value``; ``RAY_SERVE_PROXY_USE_GRPC=0``
    would send them as Ray calls): once its router knows both replicas' servers, every plain call
    is counted sent by value (the status JSON's queue), answered as before, errors included."""
    def sent() -> int:
        adder = next(d for d in client.get("/-/status.json").json()["deployments"] if d["name"] == "adder")
        return (adder["queue"] or {}).get("sent_by_value", 0)

    assert client.post("/add", json={"args": [1, 2]}).json() == 3
    deadline = time.monotonic() + 30
    while True:  # (the first calls go by reference until the replicas said where their servers are)
        before = sent()
        assert client.post("/add", json={"args": [2, 2]}).json() == 4
        if sent() == before + 1:
            break
        assert time.monotonic() < deadline, "no call went by value"
        time.sleep(0.1)
    before = sent()
    assert [client.post("/add", json={"args": [i, 1]}).json() for i in range(5)] == [1, 2, 3, 4, 5]
    r = client.post("/add/fail", json="by value")
    assert r.status_code == 500 and "application says by value" in error_of(r)["detail"]
    assert sent() == before + 6


# ------------------------------------------------------------------ errors
def test_unknown_route_404(client):
    r = client.get("/nowhere")
    assert r.status_code == 404  # (Ray Serve's words, as text: scripts and load balancers match them)
    assert r.text == "Path '/nowhere' not found. Ping http://.../-/routes for available routes."
    assert r.headers["content-type"].startswith("text/plain")
    private = client.post("/add/_private")
    assert private.status_code == 404 and private.text == not_found_text("/add/_private")
    assert client.delete("/add").status_code == 405  # (a JSON route takes GET and POST)


def test_unknown_method_404_names_the_deployment_and_its_methods_before_any_call(client):
    """``<prefix>/<name>`` where the class has no public method ``name``: 404 ``unknown_method``
    naming both and listing the methods, no traceback, nothing sent (the handle submitted nothing);
    it was a 500 with the replica's AttributeError traceback."""

    def submitted() -> int:
        deps = {d["name"]: d for d in client.get("/-/status.json").json()["deployments"]}
        return deps["adder"]["queue"]["submitted"]

    assert client.post("/add", json={"args": [1, 2]}).json() == 3  # (the handle has a queue to read)
    before = submitted()
    for r in (client.get("/add/nope"), client.post("/add/nope", json={"args": [1]}),
              client.get("/add/nope?progress=1")):
        assert r.status_code == 404, r.text[:500]
        body = error_of(r)
        assert body["error"] == "unknown_method" and body["deployment"] == "adder", body
        assert "'adder' has no method 'nope'" in body["detail"] and "echo, fail, late, nap" in body["detail"]
        assert "Traceback" not in body["detail"]
    assert submitted() == before
    assert client.post("/add/echo", json=1).json() == {"args": [1], "kwargs": {}}  # a method it has: served


@deployment(name="guarded", num_replicas=1, user_config={"threshold": 1}, ray_actor_options=OPTS)
class Guarded:
    """What a Serve app has beside ``__call__``: a ``reconfigure``, a ``@multiplexed`` loader, a
    lifecycle hook and a helper the user never meant to publish."""

    def __init__(self):
        self.threshold = None

    def reconfigure(self, config):
        self.threshold = config["threshold"]

    def check_health(self):
        pass

    @multiplexed
    async def get_model(self, model_id):
        return f"model {model_id}"

    def helper(self):
        return "internal"

    def __call__(self):
        return self.threshold


def test_only_what_the_user_exposed_is_reachable_over_http(client):
    """``/guarded/reconfigure`` set the replica's config behind the controller's back (200) and
    ``/guarded/get_model`` loaded any model id a client named (issue 64): now 404 before anything
    is sent, as every method not marked ``@http_method``; the route still calls ``__call__``."""
    run(Guarded.bind(), route_prefix="/guarded")
    try:
        assert client.get("/guarded").json() == 1
        for method, body in (("reconfigure", {"args": [{"threshold": 999}]}), ("get_model", "any-model"),
                             ("check_health", None), ("helper", None), ("__init__", None)):
            r = client.post(f"/guarded/{method}", json=body)
            assert r.status_code == 404, (method, r.status_code, r.text[:300])
            if method != "__init__":  # (not a method name a path can carry: no route matched)
                assert error_of(r)["error"] == "unknown_method", r.text
                assert "@http_method" in error_of(r)["detail"]
        assert client.get("/guarded").json() == 1  # the file's config still served
    finally:
        delete("guarded")


@deployment(name="evolving", num_replicas=1, ray_actor_options=OPTS)
class EvolvingV1:
    @http_method
    def kept(self):
        return "v1"

    @http_method
    def dropped(self):
        return "v1"


@deployment(name="evolving", num_replicas=1, ray_actor_options=OPTS)
class EvolvingV2:
    @http_method
    def kept(self):
        return "v2"

    @http_method
    def added(self):
        return "v2"


def test_new_code_under_a_kept_route_is_called_by_its_own_methods(client):
    """``run`` of new code without route arguments keeps the deployment's route: the methods HTTP may
    call are the new class's (one it adds is served, one it drops is a 404 before anything is sent),
    not those read when the route was added."""
    run(EvolvingV1.bind(), route_prefix="/evolving")
    try:
        assert client.get("/evolving/dropped").json() == "v1"
        assert error_of(client.get("/evolving/added"))["error"] == "unknown_method"
        run(EvolvingV2.bind())
        assert client.get("/-/routes").json()["/evolving"] == "evolving"
        assert client.get("/evolving/added").json() == "v2"
        assert client.get("/evolving/kept").json() == "v2"
        r = client.get("/evolving/dropped")
        assert r.status_code == 404 and error_of(r)["error"] == "unknown_method", r.text[:300]
        assert "added, kept" in error_of(r)["detail"]
    finally:
        delete("evolving")
    assert "/evolving" not in client.get("/-/routes").json()
    s = client.get("/-/status.json").json()  # (gone from the page too, not an error there)
    assert "evolving" not in [d["name"] for d in s["deployments"]] and s["errors"] == [], s["errors"]


def test_bad_json_400(client):
    r = client.post("/add", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    body = error_of(r)
    assert body["error"] == "bad_request" and body["deployment"] == "adder" and "not JSON" in body["detail"]
    r = client.post("/add", json={"args": "not a list"})
    assert r.status_code == 400 and "'args' must be a JSON array" in error_of(r)["detail"]


def test_body_too_large_413(client):
    big = b"[" + b"1," * (1 << 20) + b"1]"  # above the 1 MiB default, by Content-Length
    r = client.post("/add", content=big)
    assert r.status_code == 413 and error_of(r)["error"] == "body_too_large"
    configure(max_body_bytes=1000)
    try:
        def chunks():  # no Content-Length: refused as it streams in
            for _ in range(10):
                yield b" " * 500

        r = client.post("/add", content=chunks())
        assert r.status_code == 413 and "max_body_bytes=1000" in error_of(r)["detail"]
        assert client.post("/add", json={"args": [1, 2]}).json() == 3  # small bodies still pass
    finally:
        configure(max_body_bytes=1 << 20)


def test_application_error_500_names_the_exception_never_its_traceback(client):
    """A 500 says what the application raised and the request's id; the traceback (the replica's file
    paths, pid, IP, actor id) stays in the proxy's log under that id (issue 64)."""
    r = client.post("/add/fail", json="kaput")
    assert r.status_code == 500
    body = error_of(r)
    assert body["error"] == "application_error" and body["deployment"] == "adder"
    assert body["detail"] == "ValueError: application says kaput", body
    raw = r.text
    for leak in ("Traceback", 'File "', "test_ray_http.py", "pid=", "ip=", "actor_id", "ray::"):
        assert leak not in raw, (leak, raw)
    assert "\x1b[" not in body["detail"]  # no terminal colours in JSON
    events = events_of(client.post("/add/fail", json="late", headers={"accept": "text/event-stream"}).text)
    assert events[-1][0] == "error" and events[-1][1]["detail"] == "ValueError: application says late", events
    assert client.post("/add", json={"args": [1, 2]}).json() == 3  # the replica still serves


def test_status_of_keeps_the_traceback_out_and_logs_it(caplog):
    """``status_of`` gives the type and message of what the application raised; ``log_failure`` puts
    the whole traceback in the proxy's log under the request id."""
    from executors.ray_gpu.ingress.http import MAX_ERROR_MESSAGE, status_of
    from executors.ray_gpu.ingress.words import log_failure

    try:
        raise KeyError("x" * (MAX_ERROR_MESSAGE + 50))
    except KeyError as exc:
        status, error, detail = status_of(exc)
        assert (status, error) == (500, "application_error")
        assert detail.startswith("KeyError: 'xxx") and detail.endswith("...") and len(detail) < MAX_ERROR_MESSAGE + 20
        with caplog.at_level("ERROR", logger="executors.ray_gpu.ingress.http"):
            log_failure(exc, status, "adder", "fail", "rid-42")
    assert "rid-42" in caplog.text and "Traceback" in caplog.text and "adder.fail" in caplog.text


def test_unserialisable_result_500(client):
    r = client.get("/add/not_json")
    assert r.status_code == 500 and error_of(r)["error"] == "unserialisable_result"


def test_application_timeout_error_is_500_not_408(client):
    """A TimeoutError the method raises is the application's error (500 naming it), not the ingress's
    request timeout."""
    r = client.get("/add/late")
    assert r.status_code == 500, r.text
    body = error_of(r)
    assert body["error"] == "application_error" and "the application's own timeout" in body["detail"]


def test_timeout_408(client):
    configure(request_timeout_s=0.5)
    try:
        t0 = time.monotonic()
        r = client.post("/add/nap", json=3)
        assert r.status_code == 408, r.text
        assert error_of(r)["error"] == "timeout" and time.monotonic() - t0 < 2.5
    finally:
        configure(request_timeout_s=60.0)


def test_overloaded_503(base):
    """max_queued_requests=1, max_ongoing_requests=1, one replica: of 4 calls at once, one runs,
    one waits, the others are refused at once with 503 overloaded."""
    answers: list = []

    def one() -> None:
        with httpx.Client(base_url=base, timeout=30.0) as c:
            answers.append(c.post("/tight", json=1.5))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in answers)
    assert codes.count(200) >= 1 and 503 in codes, [(r.status_code, r.text[:200]) for r in answers]
    refused = [error_of(r) for r in answers if r.status_code == 503]
    assert all(b["error"] == "overloaded" and b["deployment"] == "tight" for b in refused)


def test_no_replica_503(client):
    from executors.ray_gpu import get_deployment_handle

    get_deployment_handle("gone").scale(0)
    try:
        t0 = time.monotonic()
        r = client.get("/gone", timeout=90.0)
        assert r.status_code == 503, r.text
        assert error_of(r)["error"] == "unavailable"
        waited = time.monotonic() - t0
    finally:
        get_deployment_handle("gone").scale(1)
    assert client.get("/gone").json() == "here"
    assert waited < 10, f"503 took {waited:.1f}s"


# ------------------------------------------------------------------ the ingress's own pages
def test_healthz_and_routes(client):
    r = client.get("/-/healthz")
    assert r.status_code == 200 and r.text == "success"  # (Ray Serve's word)
    assert client.get("/-/routes").json() == {"/add": "adder", "/gone": "gone", "/tight": "tight",
                                              "/slowpoke": "slowpoke"}


def test_route_prefix_rules(base):
    import rankcore as rc
    from executors.ray_gpu import get_deployment_handle

    gone = get_deployment_handle("gone")
    with pytest.raises(rc.InvalidConfig, match="already routes to deployment 'adder'"):
        expose(gone, "/add")
    with pytest.raises(rc.InvalidConfig, match="under '/-/'"):
        expose(gone, "/-/mine")
    _, port = ingress_address()
    with pytest.raises(rc.InvalidConfig, match="already runs on"):
        expose(gone, "/gone", port=port + 1 if port < 65535 else port - 1)


# ------------------------------------------------------------------ progress (SSE)
def events_of(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((fields["event"], json.loads(fields["data"])))
    return out


def test_progress_events_end_in_done(client):
    r = client.post("/add/nap", json=0.5, headers={"accept": "text/event-stream"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = events_of(r.text)
    names = [e for e, _ in events]
    assert names[0] == "queued" and names[-1] == "done", names
    assert events[-1][1] == {"result": 0.5}
    assert set(names) <= {"queued", "loading", "dispatched", "running", "done"}
    assert len(names) >= 3, names  # something between queued and done (dispatched / running)
    by_query = events_of(client.post("/add?progress=1", json={"args": [1, 2]}).text)
    assert by_query[0][0] == "queued" and by_query[-1] == ("done", {"result": 3})


def test_progress_error_event(client):
    events = events_of(client.post("/add/fail", json="late", headers={"accept": "text/event-stream"}).text)
    name, data = events[-1]
    assert name == "error" and data["status"] == 500 and "application says late" in data["detail"]


def test_progress_caller_gone_cancels_its_request(base, client):
    """A progress caller that hangs up cancels its request (the handle's counters, which the
    status JSON shows as the deployment's queue, count it)."""
    def cancelled() -> int:
        adder = next(d for d in client.get("/-/status.json").json()["deployments"] if d["name"] == "adder")
        return (adder["queue"] or {}).get("cancelled", 0)

    before = cancelled()
    with httpx.Client(base_url=base, timeout=30.0) as c, \
            c.stream("POST", "/add/nap", json=5, headers={"accept": "text/event-stream"}) as r:
        first = next(r.iter_lines())
        assert first == "event: queued"
    deadline = time.monotonic() + 10
    while cancelled() == before:
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.2)


def slowpoke_counts(client) -> tuple[int, int, dict]:
    """(calls the ingress's handle cancelled, 499 answers counted, the handle's counters)."""
    s = client.get("/-/status.json").json()
    queue = next(d for d in s["deployments"] if d["name"] == "slowpoke")["queue"] or {}
    return queue.get("cancelled", 0), s["ingress"]["answers"].get("499", 0), queue


@pytest.mark.parametrize("how", ["plain", "progress", "ndjson"])
def test_client_gone_cancels_its_request_and_frees_the_slot(base, client, how):
    """A client that goes away (a plain call timing out on its side, a progress or an NDJSON stream
    closed mid-way) has its call cancelled within 4 s: counted 499 and cancelled, and the replica's
    one slot is free at once (the next call is answered long before the 5 s nap would end)."""
    cancelled0, gone0, _ = slowpoke_counts(client)
    with httpx.Client(base_url=base, timeout=0.5) as c:
        if how == "plain":
            with pytest.raises(httpx.ReadTimeout):
                c.post("/slowpoke/nap", json=5)
        elif how == "progress":
            with c.stream("POST", "/slowpoke/nap", json=5, headers={"accept": "text/event-stream"}) as r:
                seen = []
                for line in r.iter_lines():
                    seen.append(line)
                    if line in ("event: dispatched", "event: running"):
                        break
                assert seen[0] == "event: queued", seen
        else:
            with c.stream("POST", "/slowpoke/drip", json={"args": [3, 5]}) as r:
                assert r.status_code == 200 and json.loads(next(r.iter_lines())) == 0
    deadline = time.monotonic() + 4.0  # (before the 5 s nap would end; a loaded machine is slow to notice)
    while True:
        cancelled, gone, queue = slowpoke_counts(client)
        if cancelled > cancelled0 and gone > gone0:
            break
        assert time.monotonic() < deadline, f"not cancelled within 4 s: 499s {gone0} -> {gone}, counters {queue}"
        time.sleep(0.05)
    assert queue["lost"] == 0
    t0 = time.monotonic()
    assert client.get("/slowpoke", timeout=10.0).json() == "awake"
    assert time.monotonic() - t0 < 2.0, "the replica's slot was still held by the cancelled call"
    assert slowpoke_counts(client)[2]["in_flight"] == 0


# ------------------------------------------------------------------ status page
def test_status_json_and_page(client):
    s = client.get("/-/status.json").json()
    deps = {d["name"]: d for d in s["deployments"]}
    assert {"adder", "gone", "tight"} <= set(deps)
    adder = deps["adder"]
    assert adder["route"] == "/add" and adder["status"]["status"] == "HEALTHY"
    ranks = sorted(r["rank"][0] for r in adder["status"]["replicas"].values())
    assert ranks == [0, 1]
    assert set(adder["pool"].values()) == {"serving"} and len(adder["pool"]) == 2
    queue = adder["queue"]  # the ingress's handle's counters
    assert queue["answered"] >= 1 and queue["lost"] == 0 and queue["in_queue"] == 0
    assert s["ingress"]["routes"]["/add"] == "adder" and s["errors"] == []
    assert "tiers" in s and isinstance(s["faults"], list)
    page = client.get("/-/status")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert "data-deployment='adder'" in html
    for rid, r in adder["status"]["replicas"].items():
        assert rid in html
        assert re.search(rf"<td>{re.escape(rid)}</td><td class=rank>{r['rank'][0]}/", html), rid
    # self-contained: no external scripts, styles or images; refreshes from its JSON twin
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)
    assert "fetch(\"/-/status.json\"" in html and "setInterval(refresh" in html


def test_status_page_in_headless_chromium(base):
    """The page as a real browser runs it: the script fetched the JSON twin and rendered the
    deployments and their ranks (``data-refreshes`` counts its renders)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no Chromium installed (apt-get install chromium); test_status_json_and_page checks the HTML")
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--virtual-time-budget=5000", "--dump-dom", f"{base}/-/status"],
                         capture_output=True, text=True, timeout=120)
    dom = out.stdout
    assert "</html>" in dom, out.stderr[-2000:]
    refreshes = re.search(r'data-refreshes="(\d+)"', dom)
    assert refreshes and int(refreshes.group(1)) >= 1, dom[:500]
    assert re.search(r'<span id="updated" class="">updated \d', dom), re.findall(r"<span id=.updated.*?</span>", dom)
    assert 'data-deployment="adder"' in dom  # rendered by the script (quotes normalised by the DOM)
    assert re.search(r'<td class="rank">0/', dom) and re.search(r'<td class="rank">1/', dom)


def test_ingress_restarted_keeps_address_and_routes(base):
    """Ray restarts a killed ingress (as Ray Serve's controller restarts its proxy): same port,
    same routes, answering again."""
    actor = ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)
    routes = ray.get(actor.routes.remote())
    ray.kill(actor, no_restart=False)
    deadline = time.monotonic() + 60
    while True:
        try:
            with httpx.Client(base_url=base, timeout=5.0) as c:
                if c.get("/-/healthz").status_code == 200:
                    break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the ingress did not come back"
        time.sleep(0.2)
    with httpx.Client(base_url=base, timeout=30.0) as c:
        assert c.get("/-/routes").json() == routes
        assert c.post("/add", json={"args": [20, 22]}).json() == 42
        assert c.get("/add/nope").json()["error"] == "unknown_method"  # (the methods kept with the routes)


def wait_serving(base: str, replaced: str) -> None:
    """Until the head's proxy answers ``/-/healthz`` from another actor than ``replaced`` (its id)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            actor = ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)
            if actor._actor_id.hex() != replaced and httpx.get(f"{base}/-/healthz", timeout=5.0).status_code == 200:
                return
        except (ValueError, httpx.TransportError):
            pass
        assert time.monotonic() < deadline, "the ingress did not come back"
        time.sleep(0.2)


def test_connection_limits_survive_a_proxy_restart(base):
    """Limits set on the running proxies (``start_ingress``, as ``rankcore serve`` does) are stored
    with the proxies' settings: the proxy the core starts after the head's is killed enforces them
    (it started with the defaults: 16 KiB heads, 10,000 connections)."""
    from executors.ray_gpu.base import persist

    host, port = ingress_address()
    start_ingress(max_header_bytes=2048, max_connections=4)
    stored, _ = persist.load_proxies()
    assert (stored.max_header_bytes, stored.max_connections) == (2048, 4)  # (what every new proxy starts with)
    actor = ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)
    killed = actor._actor_id.hex()
    ray.kill(actor, no_restart=False)
    wait_serving(base, killed)
    socks = []
    try:
        limits = httpx.get(f"{base}/-/status.json", timeout=30).json()["ingress"]
        assert (limits["max_header_bytes"], limits["max_connections"]) == (2048, 4), limits
        p = {"host": host, "port": port}
        head = b"GET /add HTTP/1.1\r\nHost: x\r\nX-Fat: " + b"v" * 3000 + b"\r\n\r\n"
        status, body, _ = exchange(p, head, within=5)
        assert status == 431 and "max_header_bytes=2048" in body["detail"], body
        socks = [connect(p) for _ in range(6)]  # (4 held open, the rest refused)
        raw, _ = read_until_closed(socks[-1], 5)
        status, body = error_answer(raw)
        assert status == 503 and body["error"] == "too_many_connections", body
    finally:
        for s in socks:
            s.close()
        start_ingress(max_header_bytes=MAX_HEADER_BYTES, max_connections=MAX_CONNECTIONS)
    assert httpx.post(f"{base}/add", json={"args": [1, 2]}, timeout=30).json() == 3


def test_guard_answers_are_measured_and_logged(base):
    """The connection guard's answers (a head too large 431, one too slow 408, one not HTTP 400, a
    connection too many 503) are counted in ``/metrics`` and have an access record, as any answer:
    they were only counted in ``/-/status.json``."""
    host, port = ingress_address()
    p = {"host": host, "port": port}
    actor = ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)
    with httpx.Client(base_url=base, timeout=30.0) as c:
        before = scrape(c)
        configure(header_timeout_s=0.5)
        try:
            flood = b"GET /add HTTP/1.1\r\nHost: x\r\nX-Fat: " + b"v" * (MAX_HEADER_BYTES + 10) + b"\r\n\r\n"
            assert exchange(p, flood, within=5)[0] == 431
            assert exchange(p, b"POST /add/echo HTTP/1.1\r\nHost: x\r\nContent-Le", within=5)[0] == 408
            assert exchange(p, b"GARBAGE\r\n\r\n", within=5)[0] == 400
        finally:
            configure(header_timeout_s=10.0)
        after = scrape(c)
    reqs = "ray_serve_num_http_requests_total"
    for labels in ({"status_code": "431", "route": "/add", "method": "GET", "application": "adder"},
                   {"status_code": "408", "route": "/add", "method": "POST", "application": "adder"},
                   {"status_code": "400", "route": "", "method": ""}):
        assert total(after, reqs, **labels) == total(before, reqs, **labels) + 1, labels
    assert total(after, "ray_serve_num_http_error_requests_total", error_code="431") == \
        total(before, "ray_serve_num_http_error_requests_total", error_code="431") + 1
    assert total(after, "ray_serve_http_request_latency_ms_count", status_code="408") == \
        total(before, "ray_serve_http_request_latency_ms_count", status_code="408") + 1
    records = ray.get(actor.access_records.remote(3))
    got = [(r["status"], r["method"], r["route"], r["path"], r["deployment"], r["replica"]) for r in records["records"]]
    assert got == [(431, "GET", "/add", "/add", "adder", None), (408, "POST", "/add", "/add/echo", "adder", None),
                   (400, "", "", "", None, None)], got
    late = records["records"][1]
    assert late["latency_ms"] >= 400 and late["bytes"] > 0 and late["request_id"], late
    with open(records["path"]) as fp:  # (the access log itself)
        assert late["request_id"] in fp.read()


# ------------------------------------------------------------------ rankcore serve
def test_rankcore_serve_command(base):
    host, port = ingress_address()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "executors.cli", "serve", "tests.integration.test_ray_http:cli_app",
                             "--address", ray.get_runtime_context().gcs_address, "--route-prefix", "/served"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        with httpx.Client(base_url=base, timeout=10.0) as c:
            while time.monotonic() < deadline:
                assert proc.poll() is None, proc.communicate()
                if c.get("/-/routes").json().get("/served") == "served":
                    break
                time.sleep(0.5)
            assert c.get("/served").json() == "here"
        line = proc.stdout.readline()
        assert f"http://{host}:{port}/served" in line, line
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0, proc.stderr.read()[-2000:]


# ------------------------------------------------------------------ reset (last: it ends every deployment)
def test_reset_stops_the_ingress_and_forgets_its_routes_and_port(base):
    """The controller's ``reset`` starts over as on a new cluster: the ingress is stopped (its port
    refuses connections), its KV keys are gone, and a new ``run(..., route_prefix=...)`` starts a
    new one serving only the new route."""
    from ray.experimental import internal_kv

    from executors.ray_gpu import get_controller
    from executors.ray_gpu.api.deployments import ask

    ask(get_controller(), "reset")
    assert ingress_address() is None
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{base}/-/routes", timeout=5.0)
    assert internal_kv._internal_kv_get(b"rankcore/http_routes") is None
    assert internal_kv._internal_kv_get(b"rankcore/http_port") is None
    run(Gone.options(name="again").bind(), route_prefix="/again", port=0)
    host, port = ingress_address()
    with httpx.Client(base_url=f"http://{host}:{port}", timeout=30.0) as c:
        assert c.get("/-/routes").json() == {"/again": "again"}
        assert c.get("/again").json() == "here"
        assert c.get("/add").status_code == 404


def test_a_head_proxy_that_cannot_bind_is_named_at_once_and_another_port_waits_for_a_reset():
    """The head's proxy fails to start (its port held by another process): ``start_ingress`` says
    why as soon as it fails (not "did not start within 30 s"), a second call on another port is
    told the proxies are set to the first one and why they never served, and a reset frees them."""
    from executors.ray_gpu import get_controller
    from executors.ray_gpu.api.deployments import ask

    from .ports import free_port

    ask(get_controller(), "reset")
    port = free_port()
    try:
        with socket.socket() as held:
            held.bind(("127.0.0.1", port))
            held.listen()
            with pytest.raises(rc.InvalidConfig, match=rf"did not start: InvalidConfig: the HTTP ingress cannot "
                                                        rf"listen on 127\.0\.0\.1:{port}: .*in use"):
                start_ingress(port=port)
            other = free_port()
            with pytest.raises(rc.InvalidConfig, match=rf"set to 127\.0\.0\.1:{port}, where the head node's proxy "
                                                        rf"did not start .*cannot listen.*free that port.*rankcore "
                                                        rf"shutdown.*deletes every application"):
                start_ingress(port=other)
        ask(get_controller(), "reset")
        start_ingress(port=other)
        assert ingress_address() == ("127.0.0.1", other)
        assert httpx.get(f"http://127.0.0.1:{other}/-/healthz", timeout=10.0).status_code == 200
    finally:
        ask(get_controller(), "reset")  # (proxies set to a held port would fail every later start)

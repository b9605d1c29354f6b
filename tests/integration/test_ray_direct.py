"""The direct data plane on Ray (issue 65): ``start_ingress(data_plane="direct")`` puts HAProxy on
the ingress's port, sending a deployment's plain requests straight to its replicas' own HTTP
servers (``base/direct.py``) as the core's table says (``rankcore.requests.dataplane``), and
everything else to the proxy. The proxy's answers carry uvicorn's ``server`` header, a replica's
own none: that is how each test tells which way a request went."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import tempfile
import threading
import time

import httpx
import pytest
import ray

import rankcore as rc
from executors.ray_gpu import delete, deployment, http_method, run
from executors.ray_gpu.base.context import _get_serve_request_context
from executors.ray_gpu.base.replicas import actor_name
from executors.ray_gpu.control.controller import NAMESPACE
from executors.ray_gpu.ingress import warden
from executors.ray_gpu.ingress.http import INGRESS_NAME, ingress_address, start_ingress
from rankcore.requests import dataplane as dp

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}


@deployment(name="dir", num_replicas=2, ray_actor_options=OPTS)
class Direct:
    async def __call__(self, x=None):
        ctx = _get_serve_request_context()
        return {"x": x, "request_id": ctx.request_id, "route": ctx.route, "app": ctx.app_name, "pid": os.getpid()}

    @http_method
    def fail(self):
        raise ValueError("the application says no")

    @http_method
    def count(self, n=3):
        yield from range(n)

    @http_method
    def not_json(self):
        return {1, 2}

    @http_method
    async def hold(self, folder, seconds=30.0):
        with open(os.path.join(folder, "began"), "w"):
            pass
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            with open(os.path.join(folder, "cancelled"), "w"):
                pass
            raise
        return "held"


@deployment(name="tight", num_replicas=1, max_ongoing_requests=1, max_queued_requests=1, ray_actor_options=OPTS)
class Tight:
    async def __call__(self, seconds=0.0):
        await asyncio.sleep(seconds)
        return seconds


@pytest.fixture(scope="module")
def base():
    """The direct data plane on a free loopback port, ``Direct`` at ``/dir`` and ``Tight`` at ``/tight``."""
    start_ingress(port=0, data_plane="direct")
    run(Direct.bind(), route_prefix="/dir")
    run(Tight.bind(), route_prefix="/tight")
    for name, n in (("dir", 2), ("tight", 1)):
        ready_servers(name, n)
    host, port = ingress_address()
    return f"http://{host}:{port}"


def ingress():
    return ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)


def plane() -> dict:
    return ray.get(ingress().data_plane.remote())


def ready_servers(deployment_name: str, n: int, timeout: float = 30.0) -> list:
    """Wait until the data plane's route of ``deployment_name`` holds exactly ``n`` ready servers."""
    deadline = time.monotonic() + timeout
    while True:
        info = plane()
        route = next((r for r in info["routes"] if r["deployment"] == deployment_name), None)
        ready = [s for s in (route or {}).get("servers", []) if s[2]]
        if route is not None and len(ready) == n and len(route["servers"]) == n:
            return ready
        assert time.monotonic() < deadline, f"{deployment_name}: not {n} ready servers: {info}"
        time.sleep(0.1)


def direct(deployment_name: str) -> bool:
    """Whether the data plane's route of ``deployment_name`` sends its requests straight to replicas now."""
    return any(r["deployment"] == deployment_name and r["direct"] for r in plane()["routes"])


def proxied(r: httpx.Response) -> bool:
    """Whether the proxy answered ``r`` (uvicorn's ``server`` header; a replica's own server sends none)."""
    return r.headers.get("server") == "uvicorn"


def held_as_told() -> dict:
    """The plane's info, once HAProxy itself holds exactly the servers of the table (``show servers
    state`` against the core's table)."""
    deadline = time.monotonic() + 20
    while True:
        info = plane()
        told = {r["backend"]: sorted(dp.server_name(s[0]) for s in r["servers"]) for r in info["routes"]}
        held = {b: sorted(names) for b, names in (info["held"] or {}).items()}
        if info["held"] is not None and all(held.get(b, []) == names for b, names in told.items()):
            return info
        assert time.monotonic() < deadline, f"HAProxy holds {held}, the table {told}"
        time.sleep(0.1)


@pytest.fixture()
def client(base):
    with httpx.Client(base_url=base, timeout=30.0) as c:
        yield c


def test_a_plain_request_goes_straight_to_a_replica_with_its_context(client):
    info = plane()
    assert info["data_plane"] == "direct" and info["errors"] == 0 and info["haproxy_pid"]
    r = client.post("/dir", json={"a": 1}, headers={"x-request-id": "direct-1"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["x"] == {"a": 1} and body["request_id"] == "direct-1" and body["route"] == "/dir"
    assert body["app"] == "dir" and r.headers["x-request-id"] == "direct-1"
    assert not proxied(r)
    assert proxied(client.get("/-/routes"))  # (and the check tells the two apart)
    pids = {client.get("/dir").json()["pid"] for _ in range(20)}
    assert len(pids) == 2  # (both replicas serve: least connections, ties in turn)


def test_errors_answer_as_the_proxy_does(client):
    r = client.post("/dir/fail", headers={"x-request-id": "direct-fail"})
    assert r.status_code == 500 and r.json() == {"error": "application_error", "detail": "ValueError: the "
                                                  "application says no", "deployment": "dir",
                                                  "request_id": "direct-fail"}
    assert not proxied(r)
    r = client.post("/dir/nope")
    assert r.status_code == 404 and r.json()["error"] == "unknown_method"
    r = client.get("/dir/not_json")
    assert r.status_code == 500 and r.json()["error"] == "unserialisable_result"
    r = client.post("/dir", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"] == "bad_request"
    r = client.put("/dir")
    assert r.status_code == 405
    r = client.post("/dir", content=b"x" * ((1 << 20) + 1))
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"


def test_limits_hold_on_the_direct_path_and_follow_configure(client):
    """A head above ``max_header_bytes`` is 431 from the replica, one above HAProxy's buffer its 400;
    an answer slower than ``request_timeout_s`` is 408. ``configure`` changes them on the running
    data plane (HAProxy reloaded, the replicas' servers told)."""
    r = client.get("/dir", headers={"x-fat": "v" * 20_000})
    assert r.status_code == 431 and r.json()["error"] == "header_too_large"
    assert client.get("/dir", headers={"x-fat": "v" * 40_000}).status_code == 400
    reloads = plane()["reloads"]
    ray.get(ingress().configure.remote(max_header_bytes=2048, request_timeout_s=0.5, header_timeout_s=0.5))
    try:
        deadline = time.monotonic() + 20
        while plane()["reloads"] == reloads or not direct("dir"):
            assert time.monotonic() < deadline, plane()
            time.sleep(0.1)
        time.sleep(0.3)  # (the replicas told their new limits: a call each)
        r = client.get("/dir", headers={"x-fat": "v" * 3000})
        assert r.status_code == 431 and "max_header_bytes=2048" in r.json()["detail"], r.text
        with tempfile.TemporaryDirectory() as folder:
            r = client.post("/dir/hold", json={"args": [folder, 3.0]})
            assert r.status_code == 408 and r.json()["error"] == "timeout", r.text
            deadline = time.monotonic() + 10  # (the replica answered its own 408: its call is cancelled)
            while not os.path.exists(os.path.join(folder, "cancelled")):
                assert time.monotonic() < deadline, os.listdir(folder)
                time.sleep(0.05)
        host, port = ingress_address()
        with socket.create_connection((host, port), timeout=10) as s:  # (a head that never ends)
            s.sendall(b"GET /dir HTTP/1.1\r\nHost: x\r\n")
            answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer  # (HAProxy's own page: it takes no error file for it)
    finally:
        ray.get(ingress().configure.remote(max_header_bytes=16 << 10, request_timeout_s=60.0, header_timeout_s=10.0))
    deadline = time.monotonic() + 20
    while not direct("dir"):
        assert time.monotonic() < deadline, plane()
        time.sleep(0.1)


def test_past_max_connections_a_connection_gets_503_and_is_closed(base):
    """As the proxy: the connection opened past ``max_connections`` has its requests answered 503
    ``too_many_connections`` and is closed; those open before it are served."""
    from executors.ray_gpu.ingress.http import MAX_CONNECTIONS

    reloads = plane()["reloads"]
    ray.get(ingress().configure.remote(max_connections=2))
    socks: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 20
        while plane()["reloads"] == reloads or not direct("dir"):
            assert time.monotonic() < deadline, plane()
            time.sleep(0.1)
        time.sleep(0.5)  # (the old HAProxy's connections gone)
        host, port = ingress_address()
        for _ in range(3):
            socks.append(socket.create_connection((host, port), timeout=10))
            time.sleep(0.2)
        answers = []
        for s in socks:
            s.sendall(b"POST /dir HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1")
            answers.append(s.recv(4096))
        assert answers[0].startswith(b"HTTP/1.1 200") and answers[1].startswith(b"HTTP/1.1 200"), answers
        assert answers[2].startswith(b"HTTP/1.1 503") and b"too_many_connections" in answers[2], answers
        assert socks[2].recv(4096) == b""  # (and closed)
    finally:
        for s in socks:
            s.close()
        ray.get(ingress().configure.remote(max_connections=MAX_CONNECTIONS))
    deadline = time.monotonic() + 20
    while not direct("dir"):
        assert time.monotonic() < deadline, plane()
        time.sleep(0.1)


def test_a_generator_method_streams_lines(client):
    r = client.post("/dir/count", json={"kwargs": {"n": 4}}, headers={"x-request-id": "direct-stream"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    assert [json.loads(line) for line in r.text.splitlines()] == [0, 1, 2, 3]
    assert not proxied(r)


def test_what_needs_the_proxy_goes_through_it(client):
    r = client.get("/-/routes")
    assert r.status_code == 200 and r.json() == {"/dir": "dir", "/tight": "tight"}
    r = client.post("/dir", json=1, headers={"x-request-id": "via-model", "serve_multiplexed_model_id": "m1"})
    assert r.status_code == 200 and proxied(r)
    r = client.post("/dir?progress=1", json=1, headers={"x-request-id": "via-progress"})
    assert r.status_code == 200 and "event: done" in r.text and proxied(r)
    r = client.get("/nowhere", headers={"x-request-id": "via-404"})
    assert r.status_code == 404 and proxied(r)


def test_past_max_queued_requests_the_balancer_answers_503(base):
    async def burst() -> list:
        async with httpx.AsyncClient(base_url=base, timeout=30.0) as c:
            async def one(i: int) -> httpx.Response:
                await asyncio.sleep(0.3 * i)  # (in turn: one runs, one waits, two find the queue full)
                return await c.post("/tight", json=2.0)
            return await asyncio.gather(*(one(i) for i in range(4)))
    answers = asyncio.run(burst())
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200, 200, 503, 503], [r.text for r in answers]
    refused = [r.json() for r in answers if r.status_code == 503]
    assert all(b["error"] == "overloaded" and b["deployment"] == "tight" for b in refused), refused


def test_the_balancer_s_own_answers_are_counted_and_recorded(base):
    """A 503 HAProxy answers itself (no replica saw the request) is in the ingress's metrics and access
    records, as the proxy's own refusals are: read from HAProxy's log of its own answers."""
    from prometheus_client.parser import text_string_to_metric_families

    def refused() -> float:
        text = httpx.get(f"{base}/metrics", timeout=30).text
        return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == "ray_serve_num_http_requests_total" and s.labels.get("route") == "/tight"
                   and s.labels.get("status_code") == "503")
    before, answered = refused(), plane()["answered"]
    rid = f"refused-{time.monotonic_ns()}"

    async def burst() -> list:
        async with httpx.AsyncClient(base_url=base, timeout=30.0) as c:
            async def one(i: int) -> httpx.Response:
                await asyncio.sleep(0.3 * i)
                return await c.post("/tight", json=1.5, headers={"x-request-id": f"{rid}-{i}"})
            return await asyncio.gather(*(one(i) for i in range(4)))
    answers = asyncio.run(burst())
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200, 200, 503, 503], [r.text for r in answers]
    deadline = time.monotonic() + 10
    while refused() - before < 2:
        assert time.monotonic() < deadline, (refused(), before, plane()["answered"])
        time.sleep(0.1)
    assert refused() - before == 2 and plane()["answered"] - answered == 2
    records = {r["request_id"]: r for r in ray.get(ingress().access_records.remote())["records"]
               if (r["request_id"] or "").startswith(rid)}
    mine = sorted((r["status"], r["replica"] is None) for r in records.values())
    assert mine == [(200, False), (200, False), (503, True), (503, True)], records
    assert all(r["route"] == "/tight" and r["deployment"] == "tight" and r["path"] == "/tight"
               for r in records.values() if r["status"] == 503)


def test_a_client_gone_cancels_its_call(base):
    host, port = ingress_address()
    with tempfile.TemporaryDirectory() as folder:
        body = json.dumps({"args": [folder]}).encode()
        s = socket.create_connection((host, port))
        s.sendall(b"POST /dir/hold HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(folder, "began")):
            assert time.monotonic() < deadline, "the call never began"
            time.sleep(0.05)
        s.close()
        while not os.path.exists(os.path.join(folder, "cancelled")):
            assert time.monotonic() < deadline, "the call was not cancelled when its client left"
            time.sleep(0.05)


def test_a_dead_replica_fails_no_request(client):
    """A replica dead before the requests come, still a server in HAProxy's table: a connect to it
    fails, so each request goes to the other replica (only a failed connect is tried again: nothing
    was sent); the table drops it once the pool does, and its replacement is a server once started."""
    victim, address, _ready, _most, _grpc = next(r for r in plane()["routes"] if r["deployment"] == "dir")["servers"][0]
    actor = ray.get_actor(actor_name("dir", victim), namespace=NAMESPACE)
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 30
    while True:  # (Ray calls it dead a moment before its process is gone: until then it answers)
        try:
            socket.create_connection(tuple(address.rsplit(":", 1)), timeout=1).close()
        except OSError:
            break
        assert time.monotonic() < deadline, f"{victim}'s server still answers at {address}"
        time.sleep(0.02)
    statuses = []
    for i in range(40):
        try:
            r = client.post("/dir", json=i)
            statuses.append((r.status_code, r.text[:200] if r.status_code != 200 else ""))
        except httpx.HTTPError as exc:
            statuses.append((0, repr(exc)))
    assert statuses == [(200, "")] * 40, [s for s in statuses if s[0] != 200]
    deadline = time.monotonic() + 30
    while victim in [s[0] for r in plane()["routes"] for s in r["servers"]]:
        assert time.monotonic() < deadline, plane()
        time.sleep(0.1)
    ready_servers("dir", 2, timeout=60)
    assert dp.server_name(victim) not in str(held_as_told()["held"])  # (gone from HAProxy itself too)


def test_scaling_down_drains_without_a_failure(base):
    """While a client keeps sending, the deployment goes from 2 replicas to 1: the one that stops is
    set to drain (nothing new), finishes what it holds, then is removed; no request fails."""
    ready_servers("dir", 2, timeout=60)
    stop, statuses = threading.Event(), []

    def keep_sending() -> None:
        with httpx.Client(base_url=base, timeout=30.0) as c:
            while not stop.is_set():
                statuses.append(c.post("/dir", json=1).status_code)
    t = threading.Thread(target=keep_sending)
    t.start()
    try:
        time.sleep(0.5)
        run(Direct.options(num_replicas=1).bind(), route_prefix="/dir")
        ready_servers("dir", 1, timeout=60)
        time.sleep(0.5)
    finally:
        stop.set()
        t.join(30)
    assert statuses and set(statuses) == {200}, sorted(set(statuses))
    assert held_as_told()["errors"] == 0
    run(Direct.options(num_replicas=2).bind(), route_prefix="/dir")  # (as the other tests find it)
    ready_servers("dir", 2, timeout=60)


def test_requests_answered_direct_are_in_the_ingress_s_metrics(client):
    """The replicas' own servers count what they answer under Serve's HTTP metrics; the ingress's
    ``/metrics`` sums them with its own, each series once."""
    from prometheus_client.parser import text_string_to_metric_families

    def counted(status: str) -> float:
        text = client.get("/metrics").text
        samples = [(s.name, tuple(sorted(s.labels.items())), s.value)
                   for fam in text_string_to_metric_families(text) for s in fam.samples]
        assert len({(n, ls) for n, ls, _ in samples}) == len(samples), "a series appears twice"
        return sum(v for n, ls, v in samples if n == "ray_serve_num_http_requests_total"
                   and dict(ls).get("route") == "/dir" and dict(ls).get("status_code") == status)
    before, failed = counted("200"), counted("500")
    for i in range(5):
        assert client.post("/dir", json=i).status_code == 200
    assert client.post("/dir/fail").status_code == 500
    assert counted("200") - before == 5 and counted("500") - failed == 1


def test_requests_answered_direct_have_access_records(client):
    """A replica's own server writes each request's access record, as the proxy writes those it
    carries (its replica and rank named), to its node's ``access.jsonl``; the ingress's
    ``access_records()`` merges them in; ``configure(enable_access_log=False)`` stops them."""
    rids = [f"direct-record-{i}-{time.monotonic_ns()}" for i in range(4)]
    for rid in rids[:3]:
        r = client.post("/dir", json=1, headers={"x-request-id": rid})
        assert r.status_code == 200 and not proxied(r)
    assert client.post("/dir/fail", headers={"x-request-id": rids[3]}).status_code == 500
    got = ray.get(ingress().access_records.remote())
    mine = {rec["request_id"]: rec for rec in got["records"] if rec["request_id"] in rids}
    assert set(mine) == set(rids), got["records"][-8:]
    ok, failed = mine[rids[0]], mine[rids[3]]
    assert (ok["method"], ok["route"], ok["path"], ok["deployment"], ok["status"]) == ("POST", "/dir", "/dir", "dir",
                                                                                       200)
    assert ok["bytes"] > 0 and ok["latency_ms"] >= 0 and ok["replica"] and isinstance(ok["rank"], int)
    assert (failed["path"], failed["status"]) == ("/dir/fail", 500)
    servers = {s[0] for r in plane()["routes"] if r["deployment"] == "dir" for s in r["servers"]}
    assert {rec["replica"] for rec in mine.values()} <= servers
    with open(got["path"]) as f:  # (the same node's file as the proxy's: this test's cluster has one node)
        written = [json.loads(line) for line in f if line.strip()]
    assert {rec["request_id"] for rec in written} >= set(rids)
    reloads = plane()["reloads"]
    ray.get(ingress().configure.remote(enable_access_log=False))
    try:
        deadline = time.monotonic() + 20
        while plane()["reloads"] == reloads or not direct("dir"):
            assert time.monotonic() < deadline, plane()
            time.sleep(0.1)
        time.sleep(0.3)  # (the replicas told: a call each)
        quiet = f"direct-record-off-{time.monotonic_ns()}"
        assert client.post("/dir", json=1, headers={"x-request-id": quiet}).status_code == 200
        records = ray.get(ingress().access_records.remote())["records"]
        assert quiet not in {rec["request_id"] for rec in records}
    finally:
        ray.get(ingress().configure.remote(enable_access_log=True))


def test_a_route_at_the_root_leaves_the_pages_to_the_proxy(client):
    """A deployment routed at ``/`` gets every path but the proxy's pages and ``/metrics``; a longer
    prefix's paths stay its own."""
    run(Direct.options(name="root", num_replicas=1).bind(), route_prefix="/")
    try:
        ready_servers("root", 1)
        held_as_told()
        r = client.get("/")
        assert r.status_code == 200 and r.json()["route"] == "/" and not proxied(r)
        r = client.get("/nope")  # (a method the root's class lacks: its replica's 404)
        assert r.status_code == 404 and r.json()["error"] == "unknown_method" and not proxied(r)
        r = client.get("/dir")
        assert r.status_code == 200 and r.json()["route"] == "/dir" and not proxied(r)
        for page in ("/-/healthz", "/-/routes", "/metrics"):
            r = client.get(page)
            assert r.status_code == 200 and proxied(r), (page, r.status_code, r.text[:200])
    finally:
        delete("root")
    deadline = time.monotonic() + 30
    while any(r["deployment"] == "root" for r in plane()["routes"]):
        assert time.monotonic() < deadline, plane()
        time.sleep(0.1)


def test_a_bad_data_plane_is_refused():
    with pytest.raises(rc.InvalidConfig, match="data_plane must be one of 'proxy', 'direct', got 'fast'"):
        start_ingress(data_plane="fast")


def test_the_running_data_plane_cannot_change(base):
    with pytest.raises(rc.InvalidConfig, match="run with data_plane='direct', not 'proxy'"):
        start_ingress(data_plane="proxy")


class Load:
    """Two clients posting to ``/dir`` in a loop, each on its own kept-alive connection, until
    ``stop``: ``answered`` (when, whether the proxy answered), ``failed`` (when, the status or the
    exception)."""

    def __init__(self, base: str) -> None:
        self.base, self.answered, self.failed = base, [], []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(2)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=30.0) as c:
            while not self._stop.is_set():
                try:
                    r = c.post("/dir", json=1)
                    if r.status_code == 200:
                        self.answered.append((time.monotonic(), proxied(r)))
                    else:
                        self.failed.append((time.monotonic(), r.status_code))
                except httpx.HTTPError as exc:
                    self.failed.append((time.monotonic(), exc))

    def more(self, n: int = 10) -> None:
        """Wait for ``n`` more answers."""
        want, deadline = len(self.answered) + n, time.monotonic() + 10
        while len(self.answered) < want:
            assert time.monotonic() < deadline, self.failed[:3]
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def test_a_killed_haproxy_is_started_again_on_the_same_socket_and_no_connection_is_refused(base):
    """HAProxy itself killed (``SIGKILL``), its ingress alive: the plane sees it exit at once (its
    standard error closes) and starts another, whole, on the socket the ingress holds. New connections
    wait in the socket's backlog meanwhile: none is refused; the requests the dead one held fail."""
    before = plane()
    pid = before["haproxy_pid"]
    load = Load(base)
    try:
        load.more()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:  # (until the new HAProxy serves and the plane holds its table again: set once it started)
            after = plane()
            route = next((r for r in after["routes"] if r["deployment"] == "dir"), None)
            if after["haproxy_pid"] not in (None, pid) and after["restarts"] == before["restarts"] + 1 and route:
                break
            assert time.monotonic() < deadline, after
            time.sleep(0.05)
        assert route["direct"], after
        load.more()
    finally:
        load.stop()
    errors = [f for _, f in load.failed]
    assert not [f for f in errors if isinstance(f, httpx.ConnectError)], errors[:5]  # (none refused)
    assert len(errors) <= 2, errors  # (at most what the two clients had in the dead one)


def test_a_killed_ingress_s_haproxy_serves_on_until_its_successor_adopts_the_port(base):
    """The ingress actor killed under load: its HAProxy outlives it (``ingress/warden.py``) and goes on
    sending requests straight to the replicas; the core starts the next ingress on the same port, which
    takes the listening socket over, and the old HAProxy finishes and goes. No request failed, no
    connection was refused, and requests were answered straight from the replicas while no ingress
    was alive."""
    pid = plane()["haproxy_pid"]
    load = Load(base)
    try:
        load.more()
        ray.kill(ingress(), no_restart=True)
        killed_at = time.monotonic()
        deadline, back_at = time.monotonic() + 60, None
        while True:  # (until the successor serves direct, from its own HAProxy)
            try:
                after = plane()
                back_at = back_at or time.monotonic()
                route = next(r for r in after["routes"] if r["deployment"] == "dir")
                if route["direct"] and after["haproxy_pid"] not in (None, pid):
                    break
            except (ray.exceptions.RayActorError, ValueError, StopIteration):
                pass
            assert time.monotonic() < deadline, "no ingress serves direct again"
            time.sleep(0.1)
        adopted = warden.Process(pid)
        try:  # (the adopted HAProxy finishes its connections and goes)
            assert adopted.wait(30.0), f"HAProxy {pid} outlived its adoption"
        finally:
            adopted.close()
        settled = len(load.answered)
        load.more()
    finally:
        load.stop()
    assert load.failed == [], load.failed[:5]  # (none refused or broken)
    # (while no ingress was alive the orphan answered, straight from the replicas; the successor's own
    # HAProxy took over with a whole table, ``dataplane.takes_over``: no request went through a proxy)
    assert any(killed_at < t < back_at for t, _ in load.answered[:settled])
    assert not any(via_proxy for _, via_proxy in load.answered)
    assert ingress_address()[1] == int(base.rsplit(":", 1)[1])
    with httpx.Client(base_url=base, timeout=30.0) as c:
        r = c.post("/tight", json=0, headers={"x-request-id": "after-restart"})
        assert r.status_code == 200 and r.json() == 0 and not proxied(r)

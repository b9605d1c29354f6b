"""Hostile clients against the proxy (issue 40, "wire input"): raw sockets and httpx against the
HTTP ingress, and raw bytes against its gRPC server, one deployed application shared by every
test. Truncated requests, garbage request lines, wrong JSON types, huge numbers, deep nesting,
bodies above ``max_body_bytes`` (with and without Content-Length, chunked), a slowloris client,
500 idle connections, header floods; malformed protobuf, an unknown method, an oversized message,
bad metadata.

After each: a 4xx with the ingress's JSON error body (``{"error", "detail", "deployment"}``, no
traceback), or the connection closed by the server within a stated bound; the proxy answers a
normal request right after; its resident memory (``VmRSS`` of the proxy actor's process) grows by
less than ``RSS_GROWTH_MB`` over the idle-connection, header-flood and big-body cases; and no
hostile request was answered 500. The limits are set short for the test (``LIMITS``) so that the
timeouts are seconds, not the defaults' tens of seconds."""

from __future__ import annotations

import json
import os
import select
import socket
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
import ray
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from executors.ray_gpu import deployment, run
from executors.ray_gpu.control.controller import NAMESPACE
from executors.ray_gpu.ingress.http import (
    INGRESS_NAME,
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    MAX_JSON_DEPTH,
    expose,
    proxies,
    start_ingress,
)
from tests.integration.protos import echo_pb2, echo_pb2_grpc

pytestmark = pytest.mark.usefixtures("local_ray")

SERVICERS = ["tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"]
#: short limits for the module (the defaults: header 10 s, request 60 s)
LIMITS = {"header_timeout_s": 1.0, "request_timeout_s": 2.0}
#: how long past a limit the server may take to close a connection (a loaded 2-core machine)
SLACK_S = 3.0
#: the proxy's resident memory may grow this much over a case (idle connections, floods, big bodies)
RSS_GROWTH_MB = 100
JSON_KEYS = {"error", "detail", "deployment"}
#: and, where the request reached the app, the id its answer's ``x-request-id`` carries
JSON_KEYS_WITH_ID = JSON_KEYS | {"request_id"}


@deployment(name="wire", num_replicas=1, ray_actor_options={"num_cpus": 0.05})
class Wire:
    """Echoes what it is given (HTTP), and the gRPC Echo service's Say."""

    def __call__(self, *args, **kwargs):
        return {"args": list(args), "kwargs": kwargs}

    def Say(self, request):
        return echo_pb2.EchoReply(text=request.text.upper())


# ------------------------------------------------------------------ the shared application
@pytest.fixture(scope="module")
def proxy() -> Iterator[dict]:
    """The proxy (HTTP and gRPC) with ``LIMITS``, the ``wire`` deployment routed at /wire."""
    actor, (host, port) = start_ingress(port=0, grpc_port=0, grpc_servicer_functions=SERVICERS,
                                        request_timeout_s=LIMITS["request_timeout_s"],
                                        header_timeout_s=LIMITS["header_timeout_s"])
    expose(run(Wire.bind()), "/wire")
    (head,) = [p for p in proxies().values() if p["head"]]
    info = {"actor": actor, "host": host, "port": port, "base": f"http://{host}:{port}",
            "grpc": "{}:{}".format(*head["grpc_address"]), "pid": ray.get(actor.connections.remote())["pid"]}
    assert normal(info) == {"args": [1, 2], "kwargs": {}}
    info["500s"] = answers(info).get("500", 0)
    yield info
    # no hostile request of this module was answered 500
    assert answers(info).get("500", 0) == info["500s"], answers(info)


def answers(p: dict) -> dict:
    return httpx.get(f"{p['base']}/-/status.json", timeout=30).json()["ingress"]["answers"]


def normal(p: dict) -> Any:
    """A well-formed request's answer (the proxy is neither dead nor wedged)."""
    r = httpx.post(f"{p['base']}/wire", json={"args": [1, 2]}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def configure(p: dict, **limits: Any) -> dict:
    return ray.get(p["actor"].configure.remote(**limits))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fp:
        for line in fp:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


# ------------------------------------------------------------------ raw sockets
def connect(p: dict, timeout: float = 10.0) -> socket.socket:
    s = socket.create_connection((p["host"], p["port"]), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_until_closed(s: socket.socket, within: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection (``AssertionError`` if it has not
    within ``within`` seconds); and how long that took."""
    t0 = time.monotonic()
    out = b""
    while True:
        left = within - (time.monotonic() - t0)
        assert left > 0, f"the server did not close the connection within {within} s (read {out[:200]!r})"
        ready, _, _ = select.select([s], [], [], left)
        if not ready:
            continue
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return out, time.monotonic() - t0
        out += chunk


def exchange(p: dict, *parts: bytes, pause: float = 0.0, within: float = 10.0) -> tuple[int, dict, float]:
    """Send ``parts`` (``pause`` seconds apart) on a new connection, read until the server closes it
    (within ``within`` s of the last part): the status, the JSON error body, the seconds to close."""
    with connect(p) as s:
        for i, part in enumerate(parts):
            if i and pause:
                time.sleep(pause)
            try:
                s.sendall(part)
            except (BrokenPipeError, ConnectionResetError):  # (answered and closed while we were sending)
                break
        raw, took = read_until_closed(s, within)
    return (*error_answer(raw), took)


def error_answer(raw: bytes) -> tuple[int, dict]:
    """The status of a raw HTTP answer and its body: the ingress's JSON error, no traceback (a 404
    for a path no route takes: Ray Serve's text, returned as ``{"text": ...}``)."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep and head.startswith(b"HTTP/1.1 "), raw[:300]
    status = int(head.split()[1])
    assert b"Traceback" not in raw and b'File "' not in raw, raw[:2000]
    if b"transfer-encoding: chunked" in head.lower():
        size, _, rest = body.partition(b"\r\n")
        body = rest[:int(size, 16)]
    if status == 404 and body.startswith(b"Path '"):
        assert body.endswith(b"' not found. Ping http://.../-/routes for available routes."), body[:500]
        return status, {"text": body.decode("utf-8", "replace")}
    got = json.loads(body)
    assert JSON_KEYS <= set(got) <= JSON_KEYS_WITH_ID, got
    return status, got


def check_error(r: httpx.Response, status: int, error: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:500])
    body = r.json()
    assert JSON_KEYS <= set(body) <= JSON_KEYS_WITH_ID and "Traceback" not in body["detail"], body
    if error is not None:
        assert body["error"] == error, body
    return body


# ------------------------------------------------------------------ HTTP: malformed requests
GARBAGE = {
    "not_http": b"GARBAGE\r\n\r\n",
    "binary": b"\x00\xff\xfe\x16\x03\x01\x02\x00\r\n\r\n",  # (a TLS hello to a plain port, roughly)
    "bad_version": b"GET /wire HTTP/9.9\r\nConnection: close\r\n\r\n",
    "space_in_target": b"GET /wi re HTTP/1.1\r\nHost: x\r\n\r\n",
    "header_without_colon": b"GET /wire HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    "length_not_a_number": b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "length_negative": b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    "two_lengths": b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n12",
    "length_and_chunked": (b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n"
                           b"Connection: close\r\n\r\n0\r\n\r\n"),
    "bad_chunk_size": b"POST /wire HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
    "non_ascii_path": b"GET /wire/\xc3\xa9\xff HTTP/1.1\r\nHost: x\r\n\r\n",
}


#: what h11 (``RANKCORE_HTTP_PARSER=h11``) reads where httptools refuses: an unknown version, both a
#: length and chunks (RFC 9112: the chunks win), any token as a method; served as HTTP/1.1 then
LENIENT_H11 = {"bad_version": (200, 400), "length_and_chunked": (200, 400), "BREW": (405,)}


def parser(p: dict) -> str:
    return ray.get(p["actor"].stack_info.remote())["http"]


def raw_answer(raw: bytes) -> tuple[int, dict | None]:
    """A raw answer's status, and its JSON error (None for a 2xx)."""
    head = raw.partition(b"\r\n")[0]
    status = int(head.split()[1])
    return (status, None) if status < 300 else error_answer(raw)


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_a_malformed_request_is_answered_400_json_and_closed(proxy: dict, case: str) -> None:
    with connect(proxy) as s:
        s.sendall(GARBAGE[case])
        raw, _ = read_until_closed(s, SLACK_S)
    status, body = raw_answer(raw)
    allowed = LENIENT_H11.get(case, (400,)) if parser(proxy) == "h11" else (400,)
    assert status in allowed and (body is None or body["error"] == "bad_request"), (status, body)
    assert normal(proxy)


METHODS = {"PUT": 405, "DELETE": 405, "PATCH": 405, "OPTIONS": 405, "BREW": 400}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_an_unknown_method_is_4xx_json(proxy: dict, method: str) -> None:
    raw = f"{method} /wire HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
    status, _, _ = exchange(proxy, raw, within=SLACK_S)
    assert status in (LENIENT_H11.get(method, (METHODS[method],)) if parser(proxy) == "h11" else (METHODS[method],))
    assert normal(proxy)


def test_unknown_paths_are_404(proxy: dict) -> None:
    """Ray Serve's 404 words, as text, for a path no route (or no method of its route) answers."""
    with httpx.Client(base_url=proxy["base"], timeout=30) as c:
        for path in ("/nowhere", "/wire/_private", "/wire/a/b", "/wire/1x", "/-/nothing", "/%00", "/wire/%ff"):
            r = c.post(path, json=1)
            assert r.status_code == 404 and r.headers["content-type"].startswith("text/plain"), (path, r.text)
            assert r.text.startswith("Path '") and r.text.endswith("' not found. Ping http://.../-/routes for "
                                                                 "available routes."), (path, r.text)


def test_a_body_cut_short_then_closed_is_counted_499_not_500(proxy: dict) -> None:
    before = answers(proxy)
    with connect(proxy) as s:
        s.sendall(b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[1, 2")
        time.sleep(0.3)
    with connect(proxy) as s:  # a head cut short, then closed
        s.sendall(b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Le")
    deadline = time.monotonic() + 10
    while answers(proxy).get("499", 0) == before.get("499", 0):
        assert time.monotonic() < deadline, answers(proxy)
        time.sleep(0.1)
    assert answers(proxy).get("500", 0) == before.get("500", 0)
    assert normal(proxy)


def test_a_body_that_stops_arriving_is_408_and_closed(proxy: dict) -> None:
    head = b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[1, 2"
    status, body, took = exchange(proxy, head, within=LIMITS["request_timeout_s"] + SLACK_S)
    assert status == 408 and "the body did not arrive within request_timeout_s" in body["detail"], body
    assert took >= LIMITS["request_timeout_s"] - 0.5
    assert normal(proxy)


def test_a_head_that_stops_arriving_is_408_and_closed(proxy: dict) -> None:
    status, body, _ = exchange(proxy, b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Le",
                                  within=LIMITS["header_timeout_s"] + SLACK_S)
    assert status == 408 and "header_timeout_s=1" in body["detail"], body
    assert normal(proxy)


def test_a_slowloris_client_is_cut_off_at_the_header_timeout(proxy: dict) -> None:
    """Headers a byte every 0.2 s, for ever: closed with 408 once ``header_timeout_s`` has passed
    since the first byte, however steadily the bytes come."""
    head = b"GET /wire HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 1000
    t0 = time.monotonic()
    with connect(proxy) as s:
        raw = b""
        for byte in head:
            ready, _, _ = select.select([s], [], [], 0.2)
            if ready:
                raw = s.recv(65536)
                break
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            assert time.monotonic() - t0 < LIMITS["header_timeout_s"] + SLACK_S, "still sending: never cut off"
        rest, _ = read_until_closed(s, SLACK_S)
    status, body = error_answer(raw + rest)
    assert status == 408 and body["error"] == "timeout", body
    assert time.monotonic() - t0 < LIMITS["header_timeout_s"] + SLACK_S
    assert normal(proxy)


VALID = (b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Request-Id: abc\r\n"
         b"Content-Length: 37\r\n\r\n{\"args\": [1, [2]], \"kwargs\": {\"a\": 3}}")


def read_response(s: socket.socket, within: float) -> bytes:
    """One whole answer (by its Content-Length or its last chunk), or what came before the server
    closed the connection; ``AssertionError`` when neither happened within ``within`` seconds."""
    t0 = time.monotonic()
    out = b""
    while True:
        head, sep, body = out.partition(b"\r\n\r\n")
        if sep:
            length = [int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:")]
            if (length and len(body) >= length[0]) or body.endswith(b"0\r\n\r\n"):
                return out
        left = within - (time.monotonic() - t0)
        assert left > 0, f"no answer and not closed within {within} s (read {out[:200]!r})"
        ready, _, _ = select.select([s], [], [], left)
        if ready:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return out
            out += chunk


#: the limits ``test_mutated_raw_requests...`` runs with (a request cut short waits for them)
FUZZ_LIMITS = {"header_timeout_s": 0.3, "request_timeout_s": 0.5}


@pytest.fixture
def fuzz_limits(proxy: dict) -> Iterator[None]:
    configure(proxy, **FUZZ_LIMITS)
    yield
    configure(proxy, **LIMITS)


@pytest.mark.usefixtures("fuzz_limits")
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), print_blob=True,
          phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(data=st.data())
def test_mutated_raw_requests_are_answered_4xx_or_closed_never_5xx(proxy: dict, data: Any) -> None:
    """A valid request's bytes truncated, flipped, repeated or with bytes inserted: each is answered
    (a 2xx, or a 4xx with the JSON error) or its connection closed, within the (shortened) limits."""
    raw = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw)))
        kind = data.draw(st.sampled_from(["flip", "insert", "cut", "repeat"]))
        byte = data.draw(st.sampled_from(b"\x00\r\n :{}[]\"\\0123456789\x7f\x80\xff-") | st.integers(0, 255))
        if kind == "flip" and at < len(raw):
            raw[at] = byte
        elif kind == "insert":
            raw[at:at] = bytes([byte]) * data.draw(st.sampled_from([1, 2, 100]))
        elif kind == "cut":
            del raw[at:at + data.draw(st.integers(1, 40))]
        else:
            raw[at:at] = raw[max(0, at - 20):at]
    with connect(proxy) as s:
        try:
            s.sendall(bytes(raw))
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = read_response(s, FUZZ_LIMITS["request_timeout_s"] + FUZZ_LIMITS["header_timeout_s"] + SLACK_S)
    if not got:
        event("closed, no answer")
        return
    status = int(got.split()[1])
    event(f"HTTP {status}")
    assert status < 500, got[:1000]
    if status >= 400:
        error_answer(got)


# ------------------------------------------------------------------ HTTP: bodies
def test_wrong_json_types_are_400(proxy: dict) -> None:
    with httpx.Client(base_url=proxy["base"], timeout=30) as c:
        for body, says in ((b'{"args": "x"}', "'args' must be a JSON array"),
                           (b'{"args": {}}', "'args' must be a JSON array"),
                           (b'{"kwargs": []}', "'kwargs' must be a JSON object"),
                           (b'{"kwargs": 1, "args": []}', "'kwargs' must be a JSON object"),
                           (b"{not json", "not JSON"), (b"\xff\xfe", "not JSON"), (b"[1, 2", "not JSON"),
                           (b"NaN", "NaN is not a JSON value"), (b"[-Infinity]", "-Infinity is not a JSON value"),
                           (b'{"a": 1e999}', "beyond a 64-bit float"), (b"9" * 5000, "not JSON")):
            assert says in check_error(c.post("/wire", content=body), 400, "bad_request")["detail"]
        # any other JSON value is the one argument, whatever its type
        for value in (None, True, -1, 10**100, 1e308, -1e-308, "", "é" * 1000, [], {}, {"args": [None]},
                      [[[{"a": [1]}]]]):
            r = c.post("/wire", content=json.dumps(value))
            assert r.status_code == 200, r.text
            want = value["args"] if isinstance(value, dict) and value else [value]
            assert r.json() == {"args": want, "kwargs": {}}


def test_deep_nesting_is_400_and_the_depth_limit_holds(proxy: dict) -> None:
    with httpx.Client(base_url=proxy["base"], timeout=30) as c:
        for depth in (100_000, 2_000, MAX_JSON_DEPTH + 1):
            for o, e in (("[", "]"), ('{"a":', "}")):
                body = (o * depth + "1" + e * depth).encode()
                detail = check_error(c.post("/wire", content=body), 400, "bad_request")["detail"]
                assert f"nested deeper than {MAX_JSON_DEPTH}" in detail
        deep = 1
        for _ in range(MAX_JSON_DEPTH - 2):  # (the answer wraps it twice more: still within)
            deep = [deep]
        r = c.post("/wire", json={"args": [deep]})
        assert r.status_code == 200 and r.json()["args"] == [deep]
    assert normal(proxy)


def test_oversized_bodies_are_413_and_the_memory_stays_bounded(proxy: dict) -> None:
    big = b"[" + b"1," * MAX_BODY_BYTES + b"1]"  # 2 MiB
    rss = rss_mb(proxy["pid"])
    with httpx.Client(base_url=proxy["base"], timeout=30) as c:
        for _ in range(10):
            check_error(c.post("/wire", content=big), 413, "body_too_large")  # by its Content-Length

            def chunks() -> Iterator[bytes]:  # no Content-Length: refused as it streams in
                for i in range(0, len(big), 65536):
                    yield big[i:i + 65536]

            check_error(c.post("/wire", content=chunks()), 413, "body_too_large")
        r = c.post("/wire", content=b"[" + b"1," * (MAX_BODY_BYTES // 2 - 8) + b"1]")  # just below: served
        assert r.status_code == 200 and len(r.json()["args"][0]) == MAX_BODY_BYTES // 2 - 7
    # a Content-Length of 30 digits, and a chunked body that lies about its size
    status, body, _ = exchange(proxy, b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 30 + b"\r\n\r\n",
                               within=SLACK_S)
    assert status in (400, 413), body
    status, body, _ = exchange(proxy, b"POST /wire HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                      b"7fffffffffffffff\r\n" + b"a" * 1000, within=LIMITS["request_timeout_s"] + SLACK_S)
    assert status in (400, 408, 413), body
    # answered before the body was read: the connection is closed (a client trickling the rest holds nothing)
    with connect(proxy) as s:
        s.sendall(b"POST /wire HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\nabc")
        raw, _ = read_until_closed(s, SLACK_S)
    assert error_answer(raw)[0] == 413 and b"connection: close" in raw.lower()
    print(f"oversized bodies: the proxy's RSS grew {rss_mb(proxy['pid']) - rss:.1f} MB")
    assert rss_mb(proxy["pid"]) - rss < RSS_GROWTH_MB
    assert normal(proxy)


# ------------------------------------------------------------------ HTTP: headers
FLOODS = {
    "many_headers": b"GET /wire HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 90)
                                                                   for i in range(1000)) + b"\r\n",
    "many_empty_headers": b"GET /wire HTTP/1.1\r\nHost: x\r\n" + b"X: \r\n" * 20000 + b"\r\n",
    "one_huge_header": b"GET /wire HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * (4 * MAX_HEADER_BYTES) + b"\r\n\r\n",
    "huge_url": b"GET /wire?" + b"q" * (4 * MAX_HEADER_BYTES) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "endless_header": b"GET /wire HTTP/1.1\r\nHost: x\r\nX-Endless: " + b"v" * (4 << 20),  # 4 MiB, never ends
}


def test_header_floods_are_431_and_the_memory_stays_bounded(proxy: dict) -> None:
    rss = rss_mb(proxy["pid"])
    for _ in range(3):
        for case, raw in sorted(FLOODS.items()):
            status, body, _ = exchange(proxy, raw, within=SLACK_S)
            assert status == 431 and body["error"] == "header_too_large", (case, status, body)
    print(f"header floods: the proxy's RSS grew {rss_mb(proxy['pid']) - rss:.1f} MB")
    assert rss_mb(proxy["pid"]) - rss < RSS_GROWTH_MB
    # just below the limit: served
    r = httpx.post(f"{proxy['base']}/wire", json=1, headers={"X-Fat": "v" * (MAX_HEADER_BYTES - 1024)}, timeout=30)
    assert r.status_code == 200
    assert normal(proxy)


# ------------------------------------------------------------------ HTTP: connections
def test_idle_connections_are_closed_at_the_header_timeout_and_cost_little(proxy: dict) -> None:
    rss = rss_mb(proxy["pid"])
    socks = [connect(proxy) for _ in range(500)]
    try:
        t0 = time.monotonic()
        assert normal(proxy)  # served while 500 connections sit idle
        assert ray.get(proxy["actor"].connections.remote())["open"] >= 500
        grown = rss_mb(proxy["pid"]) - rss
        open_ = set(socks)
        while open_:  # each closed by the server (read: b"") within the header timeout and the slack
            left = LIMITS["header_timeout_s"] + SLACK_S - (time.monotonic() - t0)
            assert left > 0, f"{len(open_)} of 500 idle connections still open"
            ready, _, _ = select.select(list(open_), [], [], left)
            for s in ready:
                try:
                    assert s.recv(1024) == b""  # (nothing sent to one that sent nothing)
                except ConnectionResetError:
                    pass
                open_.discard(s)
    finally:
        for s in socks:
            s.close()
    print(f"500 idle connections: the proxy's RSS grew {grown:.1f} MB")
    assert grown < RSS_GROWTH_MB, f"500 idle connections cost {grown:.0f} MB"
    assert normal(proxy)


def test_connections_past_max_connections_are_refused_503_at_once(proxy: dict) -> None:
    configure(proxy, max_connections=50, header_timeout_s=30.0)
    socks: list[socket.socket] = []
    try:
        socks = [connect(proxy) for _ in range(80)]
        refused = 0
        for s in socks[50:]:
            raw, _ = read_until_closed(s, SLACK_S)
            status, body = error_answer(raw)
            assert status == 503 and body["error"] == "too_many_connections", body
            refused += 1
        assert refused == 30
        for s in socks:
            s.close()
        deadline = time.monotonic() + 10
        while ray.get(proxy["actor"].connections.remote())["open"] > 5:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert normal(proxy)
    finally:
        for s in socks:
            s.close()
        configure(proxy, max_connections=10_000, header_timeout_s=LIMITS["header_timeout_s"])


def test_the_limits_are_checked_and_reported(proxy: dict) -> None:
    actor = proxy["actor"]
    for bad in ({"header_timeout_s": 0}, {"header_timeout_s": "1"}, {"max_header_bytes": 10},
                {"max_connections": 0}, {"max_connections": 1.5}):
        with pytest.raises(ray.exceptions.RayTaskError, match="must be"):
            ray.get(actor.configure.remote(**bad))
    limits = httpx.get(f"{proxy['base']}/-/status.json", timeout=30).json()["ingress"]
    assert limits["header_timeout_s"] == LIMITS["header_timeout_s"]
    assert limits["max_header_bytes"] == MAX_HEADER_BYTES and limits["max_connections"] == 10_000


# ------------------------------------------------------------------ gRPC
@pytest.fixture(scope="module")
def channel(proxy: dict) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(proxy["grpc"]) as ch:
        yield ch


def grpc_normal(channel: grpc.Channel) -> None:
    assert echo_pb2_grpc.EchoStub(channel).Say(echo_pb2.EchoRequest(text="ok"), timeout=30).text == "OK"


def raw_call(channel: grpc.Channel, method: str, data: bytes, **kw: Any) -> grpc.RpcError:
    call = channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    with pytest.raises(grpc.RpcError) as err:
        call(data, timeout=30, **kw)
    assert "Traceback" not in (err.value.details() or "")
    return err.value


@pytest.mark.parametrize("data", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"],
                         ids=["bad_tag", "cut_short", "huge_length"])
def test_grpc_malformed_bytes_are_invalid_argument(channel: grpc.Channel, data: bytes) -> None:
    for method in ("/rankcore.test.Echo/Say", "/rankcore.RankcoreAPIService/Healthz"):
        err = raw_call(channel, method, data)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    grpc_normal(channel)


def test_grpc_unknown_method_and_oversized_message(channel: grpc.Channel) -> None:
    assert raw_call(channel, "/rankcore.test.Echo/Nope", b"").code() == grpc.StatusCode.UNIMPLEMENTED
    assert raw_call(channel, "/no.Such/Service", b"").code() == grpc.StatusCode.UNIMPLEMENTED
    big = echo_pb2.EchoRequest(text="x" * (MAX_BODY_BYTES + 10)).SerializeToString()
    err = raw_call(channel, "/rankcore.test.Echo/Say", big)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_body_bytes" in err.details(), err.details()
    huge = b"\x0a" + b"\xff\xff\xff\x07" + b"x" * (5 << 20)  # above gRPC's own bound too
    assert raw_call(channel, "/rankcore.test.Echo/Say", huge).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    grpc_normal(channel)


def test_grpc_bad_metadata_is_a_status_not_unknown(channel: grpc.Channel) -> None:
    stub = echo_pb2_grpc.EchoStub(channel)
    req = echo_pb2.EchoRequest(text="x")
    for meta in ((("application", "v" * (2 * MAX_HEADER_BYTES)),),
                 tuple((f"k{i}", "v" * 100) for i in range(500)),
                 (("application-bin", b"\xff\x00"), ("multiplexed_model_id", "m" * 1000)),
                 (("application", "nope"),)):
        try:
            stub.Say(req, metadata=meta, timeout=30)  # (one routed deployment: any application name reaches it)
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.NOT_FOUND), (exc.code(), exc.details())
            assert "Traceback" not in (exc.details() or "")
    grpc_normal(channel)
    codes = ray.get(ray.get_actor(INGRESS_NAME, namespace=NAMESPACE).grpc_codes.remote())
    assert "UNKNOWN" not in codes and "INTERNAL" not in codes, codes


def test_the_proxy_is_still_the_one_it_was(proxy: dict) -> None:
    """No hostile input of this module killed the proxy: its process is the one it started with."""
    assert ray.get(proxy["actor"].connections.remote())["pid"] == proxy["pid"] and os.path.exists(
        f"/proc/{proxy['pid']}")
    assert normal(proxy)

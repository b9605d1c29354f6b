"""A replica's own HTTP server (executors/ray_gpu/base/direct.py, the direct data plane, issue 65),
on an event loop of the test's, with plain functions for the replica: what it answers, in which
order, what it refuses, what a client that leaves does to its call, what its metrics are told."""

from __future__ import annotations

import asyncio
import json

import pytest

from executors.ray_gpu.base.direct import APP_HEADER, ROUTE_HEADER, DirectServer
from executors.ray_gpu.base.exposed import Reachable


class Replica:
    """What the server calls: ``run`` and ``stream``, recording what they were asked."""

    def __init__(self) -> None:
        self.calls: list = []
        self.cancelled: list = []
        self.observed: list = []

    async def run(self, method, args, kwargs, request):
        self.calls.append((method, args, kwargs, request))
        if method == "fail":
            raise KeyError("missing")
        if method == "slow":
            try:
                await asyncio.sleep(args[0])
            except asyncio.CancelledError:
                self.cancelled.append(request.request_id)
                raise
            return "slow done"
        if method == "weird":
            return {1, 2}
        return {"args": list(args), "kwargs": kwargs, "route": request.route, "app": request.app_name}

    async def stream(self, method, args, kwargs, request):
        if kwargs.get("first_after"):  # (a first item slow to come)
            try:
                await asyncio.sleep(kwargs["first_after"])
            except asyncio.CancelledError:
                self.cancelled.append(request.request_id)
                raise
        for i in range(args[0] if args else 3):
            yield {"i": i}
        if kwargs.get("then_fail"):
            raise ValueError("mid-way")


def _server(rep: Replica, **limits) -> DirectServer:
    reach = Reachable(http=frozenset({"__call__", "fail", "slow", "weird", "lines"}), grpc=None)
    return DirectServer("dep", reach, frozenset({"lines"}), rep.run, rep.stream, "/dep",
                        limits.get("max_body_bytes", 1000), limits.get("max_header_bytes", 2000),
                        observe=rep.observed.append)


def _request(path: str, body: bytes = b"", verb: str = "POST", headers: dict | None = None) -> bytes:
    head = f"{verb} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    return head.encode() + b"\r\n" + body


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower().decode(): v.strip().decode() for k, _, v in (ln.partition(b":") for ln in lines[1:])}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:  # chunked
        chunks = []
        while (size := int((await reader.readuntil(b"\r\n")).strip(), 16)) != 0:
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        await reader.readexactly(2)
        body = b"".join(chunks)
    return status, headers, body


def _run(scenario) -> None:
    async def main() -> None:
        rep = Replica()
        server = _server(rep)
        address = await server.start("127.0.0.1")
        host, port = address.rsplit(":", 1)
        try:
            await scenario(rep, server, host, int(port))
        finally:
            server.close()
    asyncio.run(main())


def test_a_call_with_its_context_errors_and_their_words():
    async def scenario(rep, server, host, port):
        r, w = await asyncio.open_connection(host, port)
        w.write(_request("/dep", json.dumps({"args": [1], "kwargs": {"k": 2}}).encode(),
                         headers={"x-request-id": "rid-1", ROUTE_HEADER.decode(): "/dep", APP_HEADER.decode(): "app"}))
        status, headers, body = await _read_answer(r)
        assert status == 200 and headers["x-request-id"] == "rid-1"
        assert json.loads(body) == {"args": [1], "kwargs": {"k": 2}, "route": "/dep", "app": "app"}
        assert rep.calls[-1][3].request_id == "rid-1"
        for path, verb, want, error in [("/dep/fail", "POST", 500, "application_error"),
                                        ("/dep/nope", "POST", 404, "unknown_method"),
                                        ("/dep/weird", "GET", 500, "unserialisable_result"),
                                        ("/dep", "PUT", 405, "method_not_allowed")]:
            w.write(_request(path, verb=verb))
            status, headers, body = await _read_answer(r)
            got = json.loads(body)
            assert (status, got["error"], got["deployment"]) == (want, error, "dep"), got
            assert got["request_id"] == headers["x-request-id"] and len(got["request_id"]) == 32
        assert json.loads(body)["detail"].startswith("PUT /dep")
        w.write(_request("/other"))
        status, _, body = await _read_answer(r)
        assert status == 404 and b"Path '/other' not found" in body
        w.write(_request("/dep", b"{bad"))
        status, headers, body = await _read_answer(r)
        assert status == 400 and json.loads(body)["error"] == "bad_request"
        assert [o.status for o in rep.observed] == [200, 500, 404, 500, 405, 404, 400]
        first = rep.observed[0]
        assert (first.route, first.method, first.path, first.request_id) == ("/dep", "POST", "/dep", "rid-1")
        assert first.latency_ms >= 0 and first.nbytes == len(json.dumps(
            {"args": [1], "kwargs": {"k": 2}, "route": "/dep", "app": "app"}, separators=(",", ":")))  # (compact, as Serve's)
        assert rep.observed[-1].request_id == headers["x-request-id"]  # (each its own, the one it was answered)
        w.close()
    _run(scenario)


def test_pipelined_requests_are_answered_in_order():
    async def scenario(rep, server, host, port):
        r, w = await asyncio.open_connection(host, port)
        w.write(_request("/dep/slow", b'{"args": [0.2]}') + _request("/dep", b"7"))
        first, second = await _read_answer(r), await _read_answer(r)
        assert json.loads(first[2]) == "slow done" and json.loads(second[2])["args"] == [7]
        w.close()
    _run(scenario)


def test_a_stream_is_chunked_lines_and_an_error_mid_way_a_last_line():
    async def scenario(rep, server, host, port):
        r, w = await asyncio.open_connection(host, port)
        w.write(_request("/dep/lines", json.dumps({"args": [2], "kwargs": {"then_fail": True}}).encode()))
        status, headers, body = await _read_answer(r)
        assert status == 200 and headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(x) for x in body.splitlines()]
        assert lines[:2] == [{"i": 0}, {"i": 1}] and lines[2]["error"] == "application_error"
        assert lines[2]["detail"] == "mid-stream: ValueError: mid-way"
        # (told once, at its end: its status and every line's bytes)
        assert [(o.status, o.nbytes) for o in rep.observed] == [(200, len(body))]
        w.close()
    _run(scenario)


def test_a_stream_cut_by_its_client_is_told_once_as_499():
    async def scenario(rep, server, host, port):
        r, w = await asyncio.open_connection(host, port)
        w.write(_request("/dep/lines", json.dumps({"args": [10 ** 6]}).encode()))
        await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)  # (its head: the stream began)
        w.close()
        for _ in range(200):
            if rep.observed:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert [o.status for o in rep.observed] == [499] and rep.observed[0].nbytes > 0
        assert server.answers == {499: 1}
    _run(scenario)


def test_a_client_that_leaves_cancels_its_call():
    async def scenario(rep, server, host, port):
        _r, w = await asyncio.open_connection(host, port)
        w.write(_request("/dep/slow", b'{"args": [30]}', headers={"x-request-id": "leaver"}))
        for _ in range(100):
            if rep.calls:
                break
            await asyncio.sleep(0.01)
        w.close()
        for _ in range(200):
            if rep.cancelled:
                break
            await asyncio.sleep(0.01)
        assert rep.cancelled == ["leaver"] and server.answers.get(499) == 1
        assert rep.observed[-1].status == 499 and rep.observed[-1].request_id == "leaver"  # (never answered)
    _run(scenario)


def test_past_request_timeout_s_a_call_is_answered_408_by_the_replica_and_cancelled():
    """The replica answers its own 408 (counted as 408, not as a client gone), before the balancer's
    timeout (``haproxy.GRACE_S`` later); the connection stays usable."""
    async def scenario(rep, server, host, port):
        server.request_timeout_s = 0.2
        r, w = await asyncio.open_connection(host, port)
        t0 = asyncio.get_running_loop().time()
        w.write(_request("/dep/slow", b'{"args": [30]}', headers={"x-request-id": "sleeper"}))
        status, _headers, body = await _read_answer(r)
        assert status == 408 and json.loads(body)["error"] == "timeout", body
        assert "request_timeout_s=0.2" in json.loads(body)["detail"]
        assert asyncio.get_running_loop().time() - t0 < 2.0
        assert rep.cancelled == ["sleeper"] and rep.observed[-1].status == 408
        w.write(_request("/dep", b"[1]"))  # (the same connection, the next request)
        status, _headers, body = await _read_answer(r)
        assert status == 200
        # (a stream's first item is bounded alike: 408 before anything of the stream is sent)
        w.write(_request("/dep/lines", b'{"kwargs": {"first_after": 30}}', headers={"x-request-id": "slowstream"}))
        status, _headers, body = await _read_answer(r)
        assert status == 408 and json.loads(body)["error"] == "timeout", body
        assert rep.cancelled == ["sleeper", "slowstream"] and rep.observed[-1].status == 408
        w.close()
    _run(scenario)


@pytest.mark.parametrize(("extra", "want", "error"), [
    ({"body": b"x" * 1001}, 413, "body_too_large"),
    ({"headers": {"x-big": "v" * 3000}}, 431, "header_too_large"),
])
def test_what_is_too_large_is_refused_before_any_call(extra, want, error):
    async def scenario(rep, server, host, port):
        r, w = await asyncio.open_connection(host, port)
        w.write(_request("/dep", extra.get("body", b""), headers=extra.get("headers")))
        status, headers, body = await _read_answer(r)
        assert status == want and json.loads(body)["error"] == error and headers["connection"] == "close"
        assert await asyncio.wait_for(r.read(), 5) == b""  # (and the connection closed)
        assert rep.calls == [] and rep.observed[-1].status == want
        assert rep.observed[-1].request_id == headers["x-request-id"] and rep.observed[-1].path == "/dep"
    _run(scenario)


def test_connection_close_is_kept():
    async def scenario(rep, server, host, port):
        r, w = await asyncio.open_connection(host, port)
        w.write(_request("/dep", b"1", headers={"connection": "close"}))
        status, headers, _ = await _read_answer(r)
        assert status == 200 and headers["connection"] == "close"
        assert await asyncio.wait_for(r.read(), 5) == b""
    _run(scenario)


def test_head_answers_carry_no_body_errors_included():
    async def scenario(rep, server, host, port):
        r, w = await asyncio.open_connection(host, port)
        for path, want in (("/dep", 200), ("/dep/nope", 404), ("/dep/lines", 200)):
            w.write(_request(path, verb="HEAD"))
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 %d" % want), head
        w.write(_request("/dep", b"5"))  # (the connection's framing held: the next answer is whole)
        status, _, body = await _read_answer(r)
        assert status == 200 and json.loads(body)["args"] == [5]
        assert [c[0] for c in rep.calls] == ["__call__", "__call__"]  # (a stream's HEAD ran nothing)
        w.close()
    _run(scenario)


def test_a_refusal_behind_a_request_waits_its_turn():
    async def scenario(rep, server, host, port):
        r, w = await asyncio.open_connection(host, port)
        w.write(_request("/dep/slow", b'{"args": [0.3]}') + _request("/dep", b"x" * 1001))
        first = await _read_answer(r)
        second = await _read_answer(r)
        assert json.loads(first[2]) == "slow done" and second[0] == 413
        assert rep.cancelled == [] and server.answers.get(499) is None
        assert await asyncio.wait_for(r.read(), 5) == b""
    _run(scenario)


def test_expect_100_continue_is_answered_before_the_body():
    async def scenario(rep, server, host, port):
        r, w = await asyncio.open_connection(host, port)
        w.write(b"POST /dep HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n")
        assert await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
        w.write(b"7")
        status, _, body = await _read_answer(r)
        assert status == 200 and json.loads(body)["args"] == [7]
        w.close()
    _run(scenario)

"""The controller's REST server (``api/rest.py``) against hostile clients: the HTTP ingress's
limits (``ingress/http.py``'s constants and code), on a ``RestServer`` run in this process on a
free port, its ``apps`` calls replaced by a fake controller that records what was applied. No Ray
is started. After each case: a 4xx naming what was wrong (never a 500 or a traceback), or the
connection closed within a stated bound, nothing applied, and the server answering the next
request. The timeouts are set short here (``LIMITS``; the defaults are 10 s and 60 s)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from executors.ray_gpu.api import apps, rest
from executors.ray_gpu.ingress.http import HEADER_TIMEOUT_S, MAX_BODY_BYTES, MAX_HEADER_BYTES, MAX_JSON_DEPTH

LIMITS = {"header_timeout_s": 0.5, "body_timeout_s": 0.5}
#: how long past a limit the server may take to close a connection (a loaded 2-core machine)
SLACK_S = 3.0


@pytest.fixture(scope="module")
def server() -> Iterator[dict]:
    """The REST server on 127.0.0.1 (a free port), ``apps`` faked: ``applied`` lists each config applied."""
    applied: list[Any] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(apps, "details", lambda: {"applications": {}, "proxies": {}})
        mp.setattr(apps, "apply_config", lambda cfg, wait_s=None: applied.append(cfg))
        mp.setattr(apps, "delete_all", lambda: None)
        srv = rest.RestServer("127.0.0.1", 0, **LIMITS)
        host, port = srv.ready()
        try:
            yield {"url": f"http://{host}:{port}{rest.PATH}", "host": host, "port": port, "applied": applied,
                   "server": srv}
        finally:
            srv.stop()


@pytest.fixture
def applied(server: dict) -> Iterator[list]:
    """What a test applied (empty at its start); at its end the server still answers."""
    server["applied"].clear()
    yield server["applied"]
    assert httpx.get(server["url"], timeout=10).status_code == 200


def put(server: dict, body: bytes, **kw: Any) -> httpx.Response:
    return httpx.put(server["url"], content=body, timeout=10, **kw)


def raw(server: dict, data: bytes, wait_s: float) -> tuple[bytes, float]:
    """Send ``data`` on a fresh connection and read until the server closes it (at most ``wait_s``):
    ``(what came back, seconds until closed)``; a connection still open after ``wait_s`` fails."""
    t0 = time.monotonic()
    with socket.create_connection((server["host"], server["port"]), timeout=wait_s) as s:
        s.sendall(data)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                break
            except TimeoutError:
                pytest.fail(f"the connection is still open after {wait_s} s: {got[:200]!r}")
            if not chunk:
                break
            got += chunk
    return got, time.monotonic() - t0


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


# ------------------------------------------------------------------ the body
@pytest.mark.parametrize("body, message", [
    (b"[" * 10_000 + b"]" * 10_000, f"nested deeper than {MAX_JSON_DEPTH} (MAX_JSON_DEPTH)"),
    (b'{"applications": [], "x": ' + b'{"a": ' * 200 + b"1" + b"}" * 201, "(MAX_JSON_DEPTH)"),
    (b'{"applications": NaN}', "NaN is not a JSON value"),
    (b'{"applications": 1e999}', "beyond a 64-bit float"),
], ids=["deep-list", "deep-object", "nan", "infinity"])
def test_hostile_json_is_400_naming_the_limit(server: dict, applied: list, body: bytes, message: str) -> None:
    """(10,000 levels were a RecursionError: a 500.)"""
    got = put(server, body)
    assert got.status_code == 400, (got.status_code, got.text[:300])
    assert got.text.startswith("request body: ") and message in got.text, got.text[:300]
    assert applied == []


def test_bad_json_and_wrong_types_are_400_and_nothing_applied(server: dict, applied: list) -> None:
    """Each answer names what is wrong; a body that is not an object (``null`` among them: it
    applied an empty config, deleting every application) is refused."""
    for body, message in [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b'{"applications": ' + b"1" * 5_000 + b"}", "not valid JSON"),  # (an int of more than 4,300 digits)
        (b"", "empty: send the config"),
        (b"  \n", "empty: send the config"),
        (b"{}", "applications: missing"),
        (b"null", "must be a JSON object (the config), got null"),
        (b"[1, 2]", "must be a JSON object (the config), got list"),
        (b'"x"', "must be a JSON object (the config), got str"),
        (b'{"applications": 5}', "applications: must be a list, got int"),
        (b'{"applications": [{"name": 1, "import_path": []}]}', "applications[0]"),
    ]:
        got = put(server, body)
        assert got.status_code == 400, (body[:40], got.status_code, got.text[:300])
        assert got.text.startswith("request body: ") and message in got.text, (body[:40], got.text[:300])
        assert "Traceback" not in got.text and applied == [], body[:40]


def test_the_depth_limit_is_the_ingress_s(server: dict, applied: list) -> None:
    """``MAX_JSON_DEPTH`` levels are read (and applied); one more is 400."""
    def body(depth: int) -> bytes:  # the config object, its applications list, and user data below
        inner = b"[" * (depth - 4) + b"]" * (depth - 4)
        return (b'{"applications": [{"name": "a", "import_path": "m:app", "args": {"x": ' + inner + b"}}]}")
    got = put(server, body(MAX_JSON_DEPTH))
    assert got.status_code == 200, got.text[:300]
    assert len(applied) == 1
    got = put(server, body(MAX_JSON_DEPTH + 1))
    assert got.status_code == 400 and f"nested deeper than {MAX_JSON_DEPTH}" in got.text, got.text[:300]
    assert len(applied) == 1


def test_a_body_above_the_cap_is_413_before_it_is_read(server: dict, applied: list) -> None:
    """By its Content-Length: answered at once, nothing read, the connection closed."""
    head = (f"PUT {rest.PATH} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {MAX_BODY_BYTES + 1}\r\n\r\n").encode()
    answer, _ = raw(server, head + b"{", SLACK_S)
    assert status_of(answer) == 413 and f"above max_body_bytes={MAX_BODY_BYTES}" in answer.decode(), answer[:300]
    assert b"connection: close" in answer.lower()
    huge = f"PUT {rest.PATH} HTTP/1.1\r\nhost: x\r\ncontent-length: {'9' * 30}\r\n\r\n".encode()
    assert status_of(raw(server, huge, SLACK_S)[0]) in (400, 413)  # (httptools refuses a length past 2**64: 400)
    assert applied == []


def test_a_body_above_the_cap_without_a_length_is_413_as_it_streams(server: dict, applied: list) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    got = put(server, chunks())  # (chunked: no Content-Length)
    assert got.status_code == 413 and "above max_body_bytes" in got.text, got.text[:300]
    assert applied == []


def test_a_body_that_stops_arriving_is_408_and_closed(server: dict, applied: list) -> None:
    head = f"PUT {rest.PATH} HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n".encode()
    answer, took = raw(server, head + b'{"applications": ', LIMITS["body_timeout_s"] + SLACK_S)
    assert status_of(answer) == 408 and b"did not arrive within" in answer, answer[:300]
    assert took >= LIMITS["body_timeout_s"] * 0.9
    assert applied == []


# ------------------------------------------------------------------ the request head
def test_a_head_that_stops_arriving_is_408_and_closed(server: dict, applied: list) -> None:
    answer, took = raw(server, f"PUT {rest.PATH} HTTP/1.1\r\nhost: x\r\n".encode(),
                       LIMITS["header_timeout_s"] + SLACK_S)
    assert status_of(answer) == 408 and b"header_timeout_s" in answer, answer[:300]
    assert took >= LIMITS["header_timeout_s"] * 0.9
    assert HEADER_TIMEOUT_S is not None and LIMITS["header_timeout_s"] < HEADER_TIMEOUT_S  # (the default: longer)


def test_a_connection_that_sends_nothing_is_closed(server: dict, applied: list) -> None:
    answer, _ = raw(server, b"", LIMITS["header_timeout_s"] + SLACK_S)
    assert answer == b""


def test_a_head_above_the_cap_is_431(server: dict, applied: list) -> None:
    flood = f"GET {rest.PATH} HTTP/1.1\r\nhost: x\r\nx-big: {'a' * MAX_HEADER_BYTES}\r\n\r\n".encode()
    answer, _ = raw(server, flood, SLACK_S)
    assert status_of(answer) == 431, answer[:300]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "header_too_large"


def test_garbage_is_the_guard_s_400(server: dict, applied: list) -> None:
    """What the parser cannot read: the ingress's JSON 400, the connection closed."""
    answer, _ = raw(server, b"\x00\x01 nonsense \xff\r\n\r\n", SLACK_S)
    assert status_of(answer) == 400, answer[:300]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "bad_request"

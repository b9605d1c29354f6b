"""The connection limits against hostile clients (issue 40): ``guarded``, the uvicorn protocol a
connection gets, which bounds a request head's time and size and the connections open at once, and
answers what it refuses itself. Split from ``http`` (issue 66).
"""

from __future__ import annotations

import json
from typing import Any

from ..base.access import (
    REQUEST_ID_HEADER,
)
from .app import IngressState
from .words import _HTTP_METHODS

_REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}
#: how much of a refused request's head is kept to read its method and path from (a longer request
#: line: its path is not recorded)
_LINE_KEPT = 2048


def guarded(base: type, ingress: IngressState) -> type:
    """uvicorn's HTTP protocol (``base``: httptools' or h11's) with the connection limits of
    ``ingress`` (read on every connection: ``configure`` changes them at once): at most
    ``max_connections`` open (503 past it, before anything is read), a request head within
    ``header_timeout_s`` (408, or closed when nothing was sent) and ``max_header_bytes`` (431, counted
    as the bytes arrive, before the parser buffers them), and uvicorn's own 400 for what its parser
    cannot read answered as the ingress's JSON error. Each closes the connection, and is counted in the
metrics and the access records as any answer (``IngressState.refused``: the method and path its request
line gave, when it was read; latency from the head's first byte). (A protocol object
    per connection; uvicorn's attributes used: ``connections``, ``transport``, ``cycle``, ``loop``,
    ``conn`` (h11), ``send_400_response``.)"""
    h11 = "h11" in base.__module__

    class Guarded(base):
        _head_timer: Any = None
        _head_fed = 0  # bytes of the head under way (received with no request in progress)
        _tail = b""  # its last 3 bytes (a head's end, CRLF CRLF, may straddle two reads)
        _in_head = False  # (httptools) between a message's first byte and its complete head
        _piped = 0  # (httptools) bytes received while a request runs and the next one's head is incomplete
        _line = b""  # the start of the last head begun (up to ``_LINE_KEPT`` bytes: its request line)
        _began = 0.0  # (the loop's clock) when it began, or when the connection was made

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if h11:  # (its parser's own bound on a head it buffers, at this ingress's limit)
                import h11 as h11_lib

                self.conn = h11_lib.Connection(h11_lib.SERVER, ingress.max_header_bytes)

        # ------------------------------------------------------------ asyncio's calls
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._began = self.loop.time()
            most = ingress.max_connections
            if most is not None and len(self.connections) > most:
                self._answer(503, "too_many_connections", f"{most} connections are open (max_connections={most})")
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._no_request() and not self._head_within(data):
                return
            super().data_received(data)
            if self.transport.is_closing():
                self._disarm()
            elif self._no_request():
                if self._head_fed:  # (a head begun: its clock runs)
                    self._arm()
            else:
                self._disarm()
                self._head_fed, self._tail = 0, b""
                if self._in_head:  # (httptools: the next request's head, pipelined, buffered by the parser)
                    self._piped += len(data)
                    if self._piped > ingress.max_header_bytes:
                        self._line = b""  # (not the running request's line: this one's is unknown)
                        self._refused_head()

        def _head_within(self, data: bytes) -> bool:
            """Count ``data`` into the head under way (up to its end, CRLF CRLF); False (and 431
            answered, before the parser buffers any of it) when the head is above ``max_header_bytes``."""
            if not self._head_fed:  # (a new head: its first bytes)
                self._line, self._began = b"", self.loop.time()
            if len(self._line) < _LINE_KEPT and b"\r\n" not in self._line:
                self._line += data[:_LINE_KEPT - len(self._line)]
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            size = self._head_fed + (len(data) if end < 0 else end + 4 - len(self._tail))
            if size > ingress.max_header_bytes:
                self._refused_head()
                return False
            self._head_fed, self._tail = (size, seen[-3:]) if end < 0 else (0, b"")
            return True

        # --------------------------------------------- httptools' parser callbacks
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._piped = True, 0

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        # ------------------------------------------------------------------ answers
        def send_400_response(self, msg: str) -> None:
            if h11 and len(self.conn.trailing_data[0]) >= ingress.max_header_bytes:
                self._refused_head()
            else:
                self._answer(400, "bad_request", f"{msg.rstrip('.')}: the request line or headers are not HTTP/1.1")

        def _refused_head(self) -> None:
            self._answer(431, "header_too_large", f"the request head is above max_header_bytes="
                                                  f"{ingress.max_header_bytes}")

        def _answer(self, status: int, error: str, detail: str) -> None:
            """Answer the JSON error (written as is: the parser's state no longer matters) and close;
            counted (``/-/status.json``), measured and logged (``IngressState.refused``)."""
            self._disarm()
            if self.transport.is_closing():
                return
            body = json.dumps({"error": error, "detail": detail, "deployment": None}).encode()
            method, path = self._request_line()
            rid = ingress.refused(method, path, status, (self.loop.time() - self._began) * 1000.0, len(body))
            self.transport.write(f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
                                 f"content-length: {len(body)}\r\n{REQUEST_ID_HEADER}: {rid}\r\n"
                                 f"connection: close\r\n\r\n".encode() + body)
            self.transport.close()
            ingress._count(status, error, detail, None)

        def _request_line(self) -> tuple[str, str]:
            """The method and path of the head refused, as far as its request line was read ("" for
            what was not, or is not a method or an origin-form path)."""
            line, ended, _ = self._line.partition(b"\r\n")
            parts = line.split(b" ")
            method = parts[0].decode("latin-1")
            method = method if method in _HTTP_METHODS else ""
            target = parts[1] if len(parts) > 1 and (ended or len(parts) > 2) else b""
            path = target.partition(b"?")[0].decode("latin-1")
            return method, path if path.startswith("/") else ""

        # ------------------------------------------------------------------ the head's clock
        def _no_request(self) -> bool:
            """No request in progress: what arrives is a request's head."""
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            timeout = ingress.header_timeout_s
            if timeout is not None and self._head_timer is None:
                self._head_timer = self.loop.call_later(timeout, self._head_late)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or not self._no_request():
                return
            if self._head_fed:
                self._answer(408, "timeout", f"the request head did not arrive within header_timeout_s="
                                             f"{ingress.header_timeout_s:g}")
            else:  # (a connection that never sent anything: nothing asked, nothing answered)
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded

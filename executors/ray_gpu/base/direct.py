"""A replica's own HTTP server: direct ingress (issue 65).

With ``data_plane="direct"`` (``ingress/haproxy.py``) a compiled balancer routes a deployment's
requests straight to its replicas, each of which answers HTTP itself on its user event loop: no
Python proxy on the way, no thread hop to reach an ``async def`` method. This is that server, an
``asyncio.Protocol`` over the ``httptools`` parser (uvicorn's fast path, without the ASGI layer),
answering as the proxy does (``base/httpwords.py``: the same routes, bodies, errors and words):

* ``POST``/``GET``/``HEAD`` at the route prefix calls ``__call__``, ``<prefix>/<method>`` a method
  marked ``@http_method``; any other method 404 ``unknown_method``, any other verb 405;
* the body is the call's arguments (``args_of``); the answer JSON, or the JSON error
  ``{"error", "detail", "deployment", "request_id"}`` with ``status_of``'s status; a 500's
  traceback goes to this replica's log under the request id, never to the client;
* a generator method answers newline-delimited JSON, chunked as it yields, an error after the
  first line as a last line ``{"error", ...}`` (as the proxy's streams);
* ``X-Request-Id``: the client's (when safe to echo) or a new one, in the answer and in the request
  context the user's code reads, with the route and application the balancer names in its
  ``x-rankcore-route`` / ``x-rankcore-app`` headers;
* a client gone before its answer cancels the call (the user's task is cancelled, its slot freed);
* a head above ``max_header_bytes`` is 431, a body above ``max_body_bytes`` 413, both before the
  call, and the connection closed; a call not answered within ``request_timeout_s`` is 408
  ``timeout`` and cancelled, as the proxy answers it (``within``: the replica answers first, the
  balancer waits a grace longer);
* each request is told to ``observe`` once, when its answer ended (``Answered``: its status, the
  time from its arrival to its last byte, its body's bytes; a client gone before the end 499),
  as the proxy's ``_Observe`` tells its metrics and access records.

One request at a time per connection, in order (a pipelined one waits for the one before; reading
goes on, so a client that leaves is noticed at once); the balancer holds many connections. The
replica's ``max_ongoing_requests`` slots bound how many run at once, whatever path sent them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple

import rankcore as rc

from .context import RequestContext
from .exposed import Reachable
from .httpwords import ANSI, Reply, args_of, json_answer, match_route, not_found_text, request_id_of, status_of

log = logging.getLogger(__name__)

__all__ = ["ROUTE_HEADER", "APP_HEADER", "Answered", "DirectServer", "listen", "within"]

#: the route prefix the balancer matched, set by it on every request it sends (a client's own is replaced)
ROUTE_HEADER = b"x-rankcore-route"
#: the application of the deployment, set by the balancer likewise
APP_HEADER = b"x-rankcore-app"
_REQUEST_ID = b"x-request-id"
_MODEL_ID = b"serve_multiplexed_model_id"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            413: "Content Too Large", 431: "Request Header Fields Too Large", 499: "Client Closed Request",
            500: "Internal Server Error", 503: "Service Unavailable"}

Run = Callable[[str, tuple, dict, RequestContext], Awaitable[Any]]
Stream = Callable[[str, tuple, dict, RequestContext], AsyncIterator[Any]]


class Answered(NamedTuple):
    """One request's answer, ended: what the replica's metrics and access record say of it."""

    route: str  # the route prefix it matched ("" for none)
    method: str  # its HTTP verb
    path: str
    status: int  # 499: its client left before the answer's end
    latency_ms: float  # from the request read whole to the answer's last byte
    nbytes: int  # the answer's body (a stream's lines), as sent
    request_id: str | None  # None: refused before a request id was given


#: ``observe(answered)``: one request answered (the replica's HTTP metrics and access records)
Observe = Callable[[Answered], None]


class DirectServer:
    """The server of one replica of ``deployment``: ``run(method, args, kwargs, request)`` awaits one
    call, ``stream(...)`` a generator method's items; ``streams``: the class's generator methods."""

    def __init__(self, deployment: str, reach: Reachable, streams: frozenset[str], run: Run, stream: Stream,
                 prefix: str, max_body_bytes: int, max_header_bytes: int, observe: Observe | None = None,
                 request_timeout_s: float | None = None) -> None:
        self.deployment, self.reach, self.streams, self.observe = deployment, reach, streams, observe
        self.run, self.stream, self.prefix = run, stream, prefix
        self.max_body_bytes, self.max_header_bytes = max_body_bytes, max_header_bytes
        self.request_timeout_s = request_timeout_s
        self.server: asyncio.AbstractServer | None = None
        #: answers by status (tests, the replica's report)
        self.answers: dict[int, int] = {}

    async def start(self, host: str) -> str:
        """Listen on ``host`` (a free port): ``host:port``."""
        self.server, port = await listen(self, host)
        return f"{host}:{port}"

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def answer(self, conn: _Connection, verb: str, path: str, headers: dict[bytes, bytes], body: bytes
                     ) -> None:
        """One request, answered on ``conn`` (module docstring)."""
        sent = headers.get(_REQUEST_ID)
        rid = conn._rid = request_id_of(sent.decode("latin-1") if sent is not None else None)
        name, method = self.deployment, "__call__"
        try:
            prefix = headers.get(ROUTE_HEADER, b"").decode("latin-1") or self.prefix
            conn.route = prefix
            found = match_route({prefix: name}, path)
            if found is None:
                return conn.reply(404, not_found_text(path).encode(), b"text/plain; charset=utf-8", rid)
            method = found[2]
            if verb not in ("GET", "HEAD", "POST"):
                raise Reply(405, "method_not_allowed", f"{verb} {path}: a deployment's route takes GET and POST")
            refusal = self.reach.refusal(name, method, "http")
            if refusal is not None:
                raise Reply(404, "unknown_method", refusal)
            args, kwargs = args_of(body) if verb == "POST" else ((), {})
            request = RequestContext(route=prefix, request_id=rid, app_name=headers.get(APP_HEADER, b"").decode(),
                                     multiplexed_model_id=headers.get(_MODEL_ID, b"").decode("latin-1"))
            if method in self.streams:
                if verb == "HEAD":  # (a stream's head alone: nothing run)
                    return conn.reply(200, b"", b"application/x-ndjson", rid)
                return await self._stream(conn, method, args, kwargs, request)
            value = await within(self.run(method, args, kwargs, request), self.request_timeout_s, name)
        except Reply as r:
            return self._error(conn, r.status, r.error, r.detail, rid)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            status, error, detail = status_of(exc)
            _log_failure(exc, status, name, method, rid)
            return self._error(conn, status, error, detail, rid)
        try:
            data = json_answer(value)
        except (TypeError, ValueError, RecursionError) as exc:
            return self._error(conn, 500, "unserialisable_result",
                               f"{name!r} answered a {type(value).__name__}, which is not JSON: {exc}", rid)
        conn.reply(200, data, b"application/json", rid)

    def refused(self, conn: _Connection, status: int, error: str, detail: str) -> None:
        """A request refused before it was read whole (its head or body too large, unreadable): the
        JSON error, with a new request id (as the proxy gives a request its guard refused)."""
        rid = request_id_of(None)
        body = {"error": error, "detail": detail, "deployment": self.deployment}
        conn.reply(status, json_answer(body), b"application/json", rid)

    def _error(self, conn: _Connection, status: int, error: str, detail: str, rid: str) -> None:
        body = {"error": error, "detail": detail, "deployment": self.deployment, "request_id": rid}
        conn.reply(status, json_answer(body), b"application/json", rid)

    async def _stream(self, conn: _Connection, method: str, args: tuple, kwargs: dict, request: RequestContext
                      ) -> None:
        """A generator method's items as newline-delimited JSON, chunked (module docstring)."""
        items = self.stream(method, args, kwargs, request).__aiter__()
        try:  # (its first item within request_timeout_s: else 408, nothing sent yet, as for a call)
            first = await within(items.__anext__(), self.request_timeout_s, self.deployment)
        except StopAsyncIteration:
            first = _NOTHING
        conn.begin_chunked(200, b"application/x-ndjson", request.request_id)
        try:
            if first is not _NOTHING:
                conn.chunk(json_answer(first) + b"\n")
                async for item in items:
                    conn.chunk(json_answer(item) + b"\n")
                    await conn.drained()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            status, error, detail = status_of(exc)
            _log_failure(exc, status, self.deployment, method, request.request_id)
            conn.chunk(json_answer({"error": error, "detail": f"mid-stream: {detail}",
                                    "deployment": self.deployment}) + b"\n")
        finally:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()
        conn.end_chunked()


_NOTHING = object()

#: pipelined requests read ahead of the one being answered, at most (then reading pauses)
_MOST_WAITING = 16
#: a stream's chunks held for one write at most this many bytes
_FLUSH_AT = 64 << 10


async def listen(server: Any, host: str) -> tuple[asyncio.AbstractServer, int]:
    """``server``'s connections on ``host``, a free port: the listener and its port. ``server``: what a
    connection asks of its server (``DirectServer``'s ``answer``, ``refused``, ``deployment``, limits,
    ``observe`` and ``answers``; ``grpc_h1.GrpcH1Server`` serves gRPC calls so)."""
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: _Connection(server), host, 0, backlog=2048, reuse_address=True)
    return listener, listener.sockets[0].getsockname()[1]


async def within(call: Awaitable[Any], timeout: float | None, deployment: str) -> Any:
    """Await ``call``, a call of ``deployment`` in this task, for at most ``timeout`` seconds (None:
    no limit): past it the task is cancelled (the call with it, its slot freed) and
    ``rankcore.RequestTimeout`` raised, the proxy's 408 and gRPC's ``DEADLINE_EXCEEDED``. A timer on
    the task itself: no task of its own, no hop. A cancel from elsewhere (the client gone) stays one."""
    if timeout is None:
        return await call
    task = asyncio.current_task()
    assert task is not None
    fired = False

    def fire() -> None:
        nonlocal fired
        fired = True
        task.cancel()
    timer = asyncio.get_running_loop().call_later(timeout, fire)
    try:
        return await call
    except asyncio.CancelledError:
        if not fired:
            raise  # (its client cancelled)
        uncancel = getattr(task, "uncancel", None)  # (Python 3.11+: the task is not being cancelled any more)
        if uncancel is not None:
            uncancel()
        raise rc.RequestTimeout(f"no answer from {deployment!r} within request_timeout_s={timeout:g}",
                                deployment=deployment) from None
    finally:
        timer.cancel()


def _log_failure(exc: BaseException, status: int, deployment: str, method: str, request_id: str) -> None:
    if status >= 500:
        log.error("request %s to %s.%s failed (%d):\n%s", request_id, deployment, method, status,
                  ANSI.sub("", "".join(traceback.format_exception(exc))))


class _Connection(asyncio.Protocol):
    """One client connection (the balancer's): parses requests, answers one at a time."""

    def __init__(self, server: Any) -> None:
        import httptools

        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task | None = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._keep_alive = True
        self._closing = False
        self._chunked = False
        self._out = bytearray()  # (a stream's chunks not written yet: ``chunk``)
        self._flushing = False
        self._drain: asyncio.Future | None = None
        #: requests read, not answered yet (pipelined), in order; a refusal ``(None, (status, error,
        #: detail))`` waits its turn as they do
        self._waiting: collections.deque[tuple] = collections.deque()
        self._refusing = False  # (a refusal waits its turn: nothing more is read)
        #: the request being answered: its verb, path, route (set once matched), when it was read whole,
        #: its answer's status and body bytes so far, and its request id
        self.verb, self.path, self.route, self.t0 = "", "", "", 0.0
        self._status, self._sent, self._open = 0, 0, False
        self._rid: str | None = None

    # ------------------------------------------------------------ asyncio
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self.task is not None and not self.task.done():
            self.task.cancel()  # (its client is gone: the call is cancelled, its slot freed)
            self._status = 499
            self._ended()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        import httptools

        if self._refusing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "bad_request", "protocol upgrades are not served here")
        except httptools.HttpParserError as exc:
            if not self._closing:
                self._refuse(400, "bad_request", f"the request could not be read: {exc}")

    # ------------------------------------------------------------ httptools
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body, self._head_bytes, self._body_bytes = b"", {}, [], 0, 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value
        self._count_head(len(name) + len(value))

    def on_headers_complete(self) -> None:
        length = self._headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_body_bytes:
            self._refuse(413, "body_too_large", f"the body ({int(length)} bytes) is above max_body_bytes="
                                                f"{self.server.max_body_bytes}")
        elif self._headers.get(b"expect", b"").lower() == b"100-continue" and self.task is None \
                and self.transport is not None:  # (the client waits for it before sending its body, as curl does)
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.server.max_body_bytes:
            self._refuse(413, "body_too_large", f"the body is above max_body_bytes={self.server.max_body_bytes}")
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._closing:
            return
        import httptools

        verb = self.parser.get_method().decode("latin-1")
        path = httptools.parse_url(self._url).path.decode("latin-1")
        self._waiting.append((verb, path, self._headers, b"".join(self._body), self.parser.should_keep_alive(),
                              time.perf_counter()))
        if self.task is None:
            self._next()
        elif len(self._waiting) >= _MOST_WAITING and self.transport is not None:
            self.transport.pause_reading()  # (a client pipelining without end: read again once answered)

    def _next(self) -> None:
        """Answer the oldest request read and not answered yet (or send the refusal waiting its turn)."""
        item = self._waiting.popleft()
        if item[0] is None:
            self._refuse_now(*item[1])
            return
        if self.transport is not None and not self._refusing and len(self._waiting) < _MOST_WAITING:
            self.transport.resume_reading()
        verb, path, headers, body, self._keep_alive, self.t0 = item
        self.verb, self.path, self.route = verb, path, ""
        self._status, self._sent, self._rid, self._open = 0, 0, None, True
        self.task = asyncio.get_running_loop().create_task(self.server.answer(self, verb, path, headers, body))
        self.task.add_done_callback(self._answered)

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.server.max_header_bytes:
            self._refuse(431, "header_too_large", f"the request head is above max_header_bytes="
                                                  f"{self.server.max_header_bytes}")

    def _answered(self, task: asyncio.Task) -> None:
        self.task = None
        if not task.cancelled() and task.exception() is not None:  # (a bug here: never a hang)
            exc = task.exception()
            log.error("direct ingress: answering failed: %r", exc)
            if not self._closing and self.transport is not None:
                self.transport.close()
            return
        if self._closing or self.transport is None:
            return
        if not self._keep_alive:
            self._closing = True
            self.transport.close()
            return
        if self._waiting:
            self._next()

    # ------------------------------------------------------------ answers
    def _refuse(self, status: int, error: str, detail: str) -> None:
        """An answer before the request was read whole: sent, then the connection closed. Behind a
        request still being answered (pipelined), it waits its turn; nothing more is read."""
        if self._closing or self._refusing:
            return
        if self.task is not None:
            self._refusing = True
            self._waiting.append((None, (status, error, detail)))
            assert self.transport is not None
            self.transport.pause_reading()
            return
        self._refuse_now(status, error, detail)

    def _refuse_now(self, status: int, error: str, detail: str) -> None:
        if self._closing:
            return
        if self.task is None:  # (what the metrics say of it: the request it refused)
            try:
                self.verb = self.parser.get_method().decode("latin-1")
            except Exception:  # (no method read yet)
                self.verb = "-"
            try:
                import httptools

                self.path = httptools.parse_url(self._url).path.decode("latin-1") if self._url else ""
            except Exception:  # (a request line not read whole)
                self.path = ""
            self.route, self.t0 = "", time.perf_counter()
            self._status, self._sent, self._rid, self._open = 0, 0, None, True
        self._keep_alive = False
        self.server.refused(self, status, error, detail)
        self._closing = True
        assert self.transport is not None
        self.transport.close()

    def _ended(self) -> None:
        """The request's answer ended (or its client left): counted, and told to ``observe``, once."""
        if not self._open:
            return
        self._open = False
        status = self._status
        answers = self.server.answers
        answers[status] = answers.get(status, 0) + 1
        if self.server.observe is not None and self.verb:
            try:
                self.server.observe(Answered(self.route, self.verb, self.path, status,
                                             (time.perf_counter() - self.t0) * 1000.0, self._sent, self._rid))
            except Exception:  # (metrics never fail an answer)
                log.exception("direct ingress: recording a request's metrics failed")

    def reply(self, status: int, body: bytes, content_type: bytes, rid: str | None) -> None:
        """The whole answer (a ``HEAD``'s without its body, its length said all the same)."""
        if self._closing or self.transport is None:
            return
        sent = b"" if self.verb == "HEAD" else body
        self._status, self._sent, self._rid = status, len(sent), rid
        head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n" % (
            status, _REASONS.get(status, "").encode(), content_type, len(body))
        if rid:
            head += b"x-request-id: %s\r\n" % rid.encode()
        if not self._keep_alive:
            head += b"connection: close\r\n"
        self.transport.write(head + b"\r\n" + sent)
        self._ended()

    def reply_raw(self, status: int, data: bytes) -> None:
        """The whole answer as ``data`` says it, head included (``status``: what its metrics say)."""
        if self._closing or self.transport is None:
            return
        self._status = status
        self.transport.write(data)
        self._ended()

    def elapsed_ms(self) -> float:
        """Milliseconds since the request being answered was read (or refused)."""
        return (time.perf_counter() - self.t0) * 1000.0

    def peer(self) -> Any:
        """The client's address (the balancer's end of this connection), as the socket gives it."""
        return None if self.transport is None else self.transport.get_extra_info("peername")

    def begin_raw(self, status: int) -> None:
        """An answer written as it comes (``send``, ``write``, then ``end_chunked``): a gRPC answer."""
        self._status, self._chunked = status, True

    def write(self, data: bytes) -> None:
        """Bytes of the answer now, after any held (a gRPC answer's head: the call's begin marker)."""
        if data and not self._closing and self.transport is not None:
            self._out += data
            self._flush()

    def send(self, data: bytes) -> None:
        """Bytes of the answer, written with whatever else comes before the loop turns (``chunk``)."""
        if data and not self._closing and self.transport is not None:
            self._sent += len(data)
            self._hold(data)

    def begin_chunked(self, status: int, content_type: bytes, rid: str) -> None:
        if self._closing or self.transport is None:
            return
        self._status, self._rid = status, rid
        self._chunked = True
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n"
                             b"x-request-id: %s\r\n\r\n" % (status, _REASONS.get(status, "").encode(),
                                                            content_type, rid.encode()))

    def chunk(self, data: bytes) -> None:
        """One chunk of a stream, sent once the stream's task lets the loop run (the generator waits
        for something, or the stream ends): items made back to back go out in one write, not one
        each (100 small items: 100 sends, and as many wake-ups of HAProxy, before)."""
        if not self._closing and self.transport is not None and data:
            self._sent += len(data)
            self._hold(b"%x\r\n%s\r\n" % (len(data), data))

    def _hold(self, data: bytes) -> None:
        self._out += data
        if len(self._out) >= _FLUSH_AT:  # (a generator that never waits: written now, so flow control holds it)
            self._flush()
        elif not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if self._out and not self._closing and self.transport is not None:
            self.transport.write(bytes(self._out))
        self._out.clear()

    def end_chunked(self, last: bytes = b"0\r\n\r\n") -> None:
        """The stream's end: its last chunk (``last``: with trailers, a gRPC answer's)."""
        if not self._closing and self.transport is not None and self._chunked:
            self._out += last
            self._flush()
            self._ended()
        self._chunked = False

    async def drained(self) -> None:
        """Wait while the client reads slower than the stream is made (back-pressure)."""
        if self._drain is not None and not self._drain.done():
            await self._drain

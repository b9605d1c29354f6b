"""The starlette app of one ingress: ``IngressState`` (routes, handles, limits, metrics, the status it
shows) and ``make_app``; a deployment's call through its route, an ASGI deployment's answer relayed,
progress as server-sent events, ``/-/healthz``, ``/-/routes``, ``/-/status``, ``/metrics``; every
answer observed for the metrics and the access log (``_Observe``). Split from ``http`` (issue 66).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter, deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

import rankcore as rc

from ..base import appnames, by_value
from ..base.access import (
    REQUEST_ID_HEADER,
    AccessLog,
    request_id_of,
)
from ..base.access import record as access_record
from ..base.context import RequestContext, model_request
from ..base.exposed import ASGI_ENTRY, Reachable
from ..base.httpwords import (
    METRICS_PATH,
    Reply,
    args_of,
    json_answer,
    match_prefix,
    match_route,
    not_found_text,
    status_of,
)
from ..base.metrics import (
    CONTENT_TYPE,
    GRPC_REQUEST_METRICS,
    HTTP_REQUEST_METRICS,
    Departed,
    IngressMetrics,
    merged,
    router_families,
)
from ..base.router import routed
from ..base.routers import ROUTING_KEY_HEADER, routing_key_of
from ..control.controller import CONTROLLER_NAME, NAMESPACE
from .calls import (
    _NOTHING,
    _UNKNOWN,
    MODEL_ID_HEADER,
    ClientGone,
    _answer,
    _cancel,
    _cancel_sent,
    _client_gone,
    _declares_body,
    _first,
    _progress,
    _replica_of,
    _request_of,
    _submit,
)
from .status import render_page
from .words import (
    _HTTP_METHODS,
    CALL_THREADS,
    CONTROLLER_METRICS_TIMEOUT_S,
    GONE,
    HEADER_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    NO_REPLICAS_MESSAGE,
    PROGRESS_POLL_S,
    RANKS_TTL_S,
    RECENT_FAULTS,
    REPLICA_METRICS_TIMEOUT_S,
    _jsonable,
    log_failure,
    route_pattern,
)

_ROUTING_KEY = ROUTING_KEY_HEADER.encode()  # (as the ASGI scope holds a header: bytes, lower case)


class _Relayed:
    """The answer of a deployment that takes ASGI requests (``IngressState._asgi``): the replica's
    ASGI messages sent on as they come, while the client is watched: gone, the call is cancelled
    (its replica stops the app) and 499 counted. The app's error before its answer began is the
    usual JSON error answer; after, the answer is cut (the proxy's log has the traceback)."""

    def __init__(self, ingress: IngressState, name: str, first: list, items: Any, response: Any,
                 note: dict | None) -> None:
        self.ingress, self.name, self.first, self.items, self.response, self.note = (
            ingress, name, first, items, response, note)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        relay = asyncio.ensure_future(self._relay(scope, receive, send))
        watch = asyncio.ensure_future(_client_gone(receive))
        try:
            done, _ = await asyncio.wait((relay, watch), return_when=asyncio.FIRST_COMPLETED)
            if relay not in done:  # the client went away: stop the app
                relay.cancel()
                await asyncio.gather(relay, return_exceptions=True)
                self.ingress.answers[GONE] += 1
            else:
                relay.result()
        finally:
            watch.cancel()
            relay.cancel()
            self.ingress.in_flight[self.name] -= 1

    async def _relay(self, scope: dict, receive: Any, send: Any) -> None:
        ingress, started, ended = self.ingress, False, False
        try:
            batch = self.first
            while True:
                for message in batch:
                    if message.get("type") == "http.response.start":
                        started = True
                        ingress.answers[int(message.get("status", 200))] += 1
                    await send(message)
                    if message.get("type") == "http.response.body" and not message.get("more_body", False):
                        ended = True
                if ended:
                    return
                try:
                    batch = await self.items.__anext__()
                except StopAsyncIteration:
                    break
            raise RuntimeError(f"{self.name!r}'s ASGI app returned without completing its response")
        except Exception as exc:
            status, error, detail = ingress.failed(exc, self.name, "__call__", self.note)
            if started:  # (the answer began: it is cut here, and its client sees that)
                ingress._count(status, error, f"mid-answer: {detail}", self.name)
                return
            rid = self.note["request_id"] if self.note else None
            await ingress._error(status, error, detail, self.name, request_id=rid)(scope, receive, send)
        finally:
            if not ended:
                _cancel(self.response)
            await self.items.aclose()


class IngressState:
    """The starlette app's state: routes, limits, counters; one call thread pool. (Public: the REST
    server holds its limits in one, so both servers share one definition and one enforcement.)"""

    def __init__(self, routes: dict[str, str], handles: dict[str, Any], max_body_bytes: int,
                 request_timeout_s: float | None, access: AccessLog | None = None,
                 metrics: IngressMetrics | None = None) -> None:
        self.routes = dict(routes)  # prefix -> deployment
        self.handles = dict(handles)  # deployment -> its handle (``__call__``), as ``expose`` gave it
        #: deployment -> the methods a client may call (``public_methods``; absent: ``Reachable.unknown()``)
        self.methods: dict[str, Reachable] = {}
        self.max_body_bytes, self.request_timeout_s = max_body_bytes, request_timeout_s
        #: the connection limits (``HEADER_TIMEOUT_S`` ...: ``configure`` changes them)
        self.header_timeout_s: float | None = HEADER_TIMEOUT_S
        self.max_header_bytes: int = MAX_HEADER_BYTES
        self.max_connections: int | None = MAX_CONNECTIONS
        self.pool = ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="rankcore-http-call")
        self.answers: Counter[int] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.faults: deque[dict] = deque(maxlen=RECENT_FAULTS)
        self.address: tuple[str, int] = ("", 0)
        self.access = access if access is not None else AccessLog(enabled=False)
        self.metrics = metrics if metrics is not None else IngressMetrics()
        #: the replicas' HTTP request counts (the direct data plane's), kept from falling when one goes
        self._http = Departed(s.name for s in (*HTTP_REQUEST_METRICS, *GRPC_REQUEST_METRICS))
        self._http_shares: list = []
        #: deployment -> (when heard, {replica: global rank}); and the asks under way
        self.ranks: dict[str, tuple[float, dict[str, int]]] = {}
        self._asking: dict[str, asyncio.Future] = {}
        #: access records in the order their answers ended (``observed``): each takes the next place
        #: when its answer ends; a record is written once every place before it was (``_in_place``)
        self._places = itertools.count()
        self._written = 0
        self._ready: dict[int, tuple] = {}
        self.actor_id = ""  # (this actor's id: the queue gauges' ``actor_id``)
        #: a draining proxy (``DrainProxy``) answers ``/-/healthz`` with 503; requests in flight now
        self.draining = False
        #: the head node's proxy (it takes traffic with no replica anywhere: an application scaled to zero
        #: scales up from its requests); another node's is ready only once a handle has a replica (``unready``)
        self.is_head = True
        self.ongoing = 0

    # ------------------------------------------------------------ calls
    async def call(self, name: str, method: str, args: tuple, kwargs: dict, sent: dict | None = None,
                   receive: Any = None, note: dict | None = None, model_id: str = "") -> Any:
        """Send and wait, within ``request_timeout_s`` (``rankcore.RequestTimeout`` past it), and,
        given the request's ``receive``, until its client goes away (``ClientGone``).
        ``sent["response"]``: the response once the call is sent (progress streams read it).
        A call given up (timed out, its client gone, or this coroutine cancelled) is cancelled
        through the handle, also when it is given up while being sent (as soon as it is).
        ``note["replica"]``: the replica the router sent it to (metrics, access records).
        ``model_id``: the multiplexed model a call without a ``note`` names (gRPC's metadata)."""
        loop = asyncio.get_running_loop()
        timeout = self.request_timeout_s
        deadline = None if timeout is None else loop.time() + timeout
        handle = self.handles[name] if method == "__call__" else getattr(self.handles[name], method)
        # (progress: says `running`; a plain call goes by value unless RAY_SERVE_PROXY_USE_GRPC=0: base.by_value)
        handle = handle.options(progress=True) if sent is not None else handle.options(
            _by_reference=by_value.PROXY_BY_REFERENCE)
        self.in_flight[name] += 1
        response = None
        try:
            try:
                request = _request_of(note) if note is not None else model_request(name, model_id)
                response = await self.send(handle, name, args, kwargs, timeout, request, routing_key_of(note))
            except asyncio.TimeoutError:  # (here only: the application may raise a TimeoutError, a 500)
                raise rc.RequestTimeout(f"no answer from {name!r} within request_timeout_s={timeout:g}",
                                        deployment=name) from None
            if sent is not None:
                sent["response"] = response
            left = None if deadline is None else max(0.0, deadline - loop.time())
            answered, value = await _answer(response, receive, left)
        except (asyncio.CancelledError, ClientGone):
            if response is not None:
                _cancel(response)
            raise
        finally:
            self.in_flight[name] -= 1
            if note is not None and response is not None:
                note["replica"] = _replica_of(response)
        if not answered:
            _cancel(response)
            raise rc.RequestTimeout(f"no answer from {name!r} within request_timeout_s={timeout:g}",
                                    deployment=name)
        return value

    async def send(self, handle: Any, name: str, args: tuple, kwargs: dict, timeout: float | None,
                   request: RequestContext | None = None, routing_key: str = "") -> Any:
        """``handle.remote(...)``: on this loop once the handle knows its pool (sending then never
        blocks: no thread hop), else on a call thread (the first call asks the controller),
        within ``timeout`` (``asyncio.TimeoutError``); a call given up while being sent is
        cancelled as soon as it is. ``request``: the HTTP request's id and route (``_submit``), and
        the multiplexed model it names (the call goes through ``options(multiplexed_model_id=...)``);
        ``routing_key``: its session key (``routers.ROUTING_KEY_HEADER``; ``options(routing_key=...)``)."""
        if request is not None and request.multiplexed_model_id:
            handle = handle.options(multiplexed_model_id=request.multiplexed_model_id)
        if routing_key:
            handle = handle.options(routing_key=routing_key)
        if handle.knows_pool():
            return _submit(handle, name, args, kwargs, request)
        submit = asyncio.get_running_loop().run_in_executor(self.pool, _submit, handle, name, args, kwargs,
                                                            request)
        try:
            return await asyncio.wait_for(asyncio.shield(submit), timeout)
        except BaseException:
            submit.add_done_callback(_cancel_sent)
            raise

    def unknown_method(self, name: str, method: str, via: str = "http") -> str | None:
        """Why a client may not call ``method`` of ``name`` over ``via`` ("http", "grpc"), or None."""
        return self.methods.get(name, Reachable.unknown()).refusal(name, method, via)

    async def is_stream(self, name: str, method: str) -> bool:
        """Whether ``method`` of ``name`` is a generator method: asked on this loop once the handle
        knows its pool (it then never blocks), else on a call thread."""
        handle = self.handles[name]
        if handle.knows_pool():
            return bool(handle.is_stream(method))
        return bool(await asyncio.get_running_loop().run_in_executor(self.pool, handle.is_stream, method))

    def _error(self, status: int, error: str, detail: str, deployment: str | None, close: bool = False,
               request_id: str | None = None) -> Any:
        """The JSON error answer (with ``request_id`` when known: what the proxy's log files a 500's
        traceback under); ``close``: with ``Connection: close`` (answered before the request's body
        was read: a client trickling the rest would otherwise hold the connection)."""
        from starlette.responses import JSONResponse

        self._count(status, error, detail, deployment)
        body = {"error": error, "detail": detail, "deployment": deployment}
        if request_id:
            body["request_id"] = request_id
        return JSONResponse(body, status_code=status, headers={"Connection": "close"} if close else None)

    def failed(self, exc: BaseException, name: str | None, method: str, note: dict | None) -> tuple[int, str, str]:
        """``status_of(exc)``, its traceback logged under the request's id (``log_failure``)."""
        status, error, detail = status_of(exc)
        log_failure(exc, status, name, method, note["request_id"] if note else "")
        return status, error, detail

    def _count(self, status: int, error: str, detail: str, deployment: str | None) -> None:
        self.answers[status] += 1
        if status >= 500 or status == 408:
            self.faults.append({"time": time.time(), "status": status, "error": error, "deployment": deployment,
                                "detail": detail[-2000:]})

    async def _body(self, request: Any) -> bytes:
        """The body, refused with 413 past ``max_body_bytes`` (by its Content-Length before
        reading anything, or as it streams in), with 408 when it is still arriving after
        ``request_timeout_s``; ``ClientGone`` when the client closed before its end."""
        most = self.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and len(length) < 20 and int(length) > most:
            raise Reply(413, "body_too_large", f"the body is {int(length)} bytes, above max_body_bytes={most}")
        if length is not None and length.isdigit() and len(length) >= 20:  # (no int of 10,000 digits made)
            raise Reply(413, "body_too_large", f"the body is {len(length)} digits of bytes, above max_body_bytes={most}")
        try:
            return await asyncio.wait_for(self._read(request, most), self.request_timeout_s)
        except asyncio.TimeoutError:
            raise Reply(408, "timeout", f"the body did not arrive within request_timeout_s="
                                        f"{self.request_timeout_s:g}") from None

    @staticmethod
    async def _read(request: Any, most: int) -> bytes:
        from starlette.requests import ClientDisconnect

        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > most:
                    raise Reply(413, "body_too_large", f"the body is above max_body_bytes={most}")
                chunks.append(chunk)
        except ClientDisconnect:  # (a body cut short: its client closed before sending it all)
            raise ClientGone() from None
        return b"".join(chunks)

    async def deployment_call(self, request: Any) -> Any:
        from starlette.responses import Response, StreamingResponse

        name, method = None, ""
        note = request.scope.get("rankcore")  # (``_Observe``'s: what the metrics and the access record say)
        rid = note["request_id"] if note else None
        unread = _declares_body(request)  # (a body not read yet: an early answer closes the connection)
        try:
            path = request.url.path
            under = match_prefix(self.routes, path)
            if under is None:
                return self._not_found(path, rid, close=unread)
            prefix, name, _rest = under
            if note is not None:
                note["route"], note["deployment"] = prefix, name
            reach = self.methods.get(name, _UNKNOWN)
            if reach.asgi:
                if note is not None and reach.routes:  # (the metrics' and the log's route: Serve's pattern)
                    note["route"] = route_pattern(prefix, reach.routes, path, request.method)
                return await self._asgi(request, prefix, name, note)
            found = match_route(self.routes, path)
            if found is None:
                return self._not_found(path, rid, close=unread, deployment=name)
            method = found[2]
            if request.method not in ("GET", "HEAD", "POST"):
                raise Reply(405, "method_not_allowed", f"{request.method} {path}: a deployment's route takes GET "
                                                       f"and POST (an ASGI ingress takes any: docs/ray.md)", name)
            unknown = self.unknown_method(name, method)
            if unknown is not None:  # (before the body is read, or any call sent)
                raise Reply(404, "unknown_method", unknown, name)
            if request.method == "POST":
                body = await self._body(request)
                unread = False
                args, kwargs = args_of(body)
            else:
                args, kwargs = (), {}
            accept = request.headers.get("accept", "")
            if await self.is_stream(name, method):
                return await self._stream(name, method, args, kwargs, request.receive, note)
            if "text/event-stream" in accept or request.query_params.get("progress") in ("1", "true"):
                return StreamingResponse(self._events(name, method, args, kwargs, note), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            value = await self.call(name, method, args, kwargs, receive=request.receive, note=note)
        except Reply as r:
            return self._error(r.status, r.error, r.detail, r.deployment or name, close=unread, request_id=rid)
        except ClientGone:
            return self._gone(name)
        except Exception as exc:
            return self._error(*self.failed(exc, name, method, note), name, close=unread, request_id=rid)
        try:
            answer = json_answer(value)
        except (TypeError, ValueError, RecursionError) as exc:
            return self._error(500, "unserialisable_result",
                               f"{name!r} answered a {type(value).__name__}, which is not JSON: {exc}", name,
                               request_id=rid)
        self.answers[200] += 1
        return Response(answer, media_type="application/json", headers={"Connection": "close"} if unread else None)

    def _not_found(self, path: str, request_id: str | None, close: bool = False, deployment: str | None = None
                   ) -> Any:
        """404 for a path no route (or no method of its route) answers: Ray Serve's words, as text."""
        from starlette.responses import PlainTextResponse

        self._count(404, "not_found", path, deployment)
        headers = {"Connection": "close"} if close else {}
        return PlainTextResponse(not_found_text(path), status_code=404, headers=headers)

    async def _asgi(self, request: Any, prefix: str, name: str, note: dict | None) -> Any:
        """A request to a deployment that takes ASGI requests (``replica.asgi``: Serve's
        ``__call__(request)`` or ``@serve.ingress`` app): its body read here (within
        ``max_body_bytes``), its scope (``root_path`` the route prefix, ``path`` whole, as Serve's
        proxy sets them) and body streamed to the replica's ``ENTRY``, whose ASGI messages are sent on
        as they come. ``request_timeout_s`` bounds the wait for the first (408); a client gone
        cancels the call (499). An error before the answer began is the usual error answer (500
        without a traceback); one after it cuts the answer (its traceback in the proxy's log)."""
        scope = request.scope
        body = await self._body(request)
        headers = [(bytes(k), bytes(v)) for k, v in scope.get("headers", ())]
        if note is not None and not any(k == b"x-request-id" for k, _ in headers):
            headers.append((b"x-request-id", note["request_id"].encode()))
        sent = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                "http_version": scope.get("http_version", "1.1"), "method": scope["method"],
                "scheme": scope.get("scheme", "http"), "path": scope["path"], "raw_path": scope.get("raw_path"),
                "query_string": scope.get("query_string", b""), "headers": headers,
                "root_path": scope.get("root_path", "") + ("" if prefix == "/" else prefix),
                "client": scope.get("client"), "server": scope.get("server")}
        handle = self.handles[name].options(stream=True, method_name=ASGI_ENTRY)
        response = await self.send(handle, name, (sent, body), {}, self.request_timeout_s, _request_of(note),
                                   routing_key_of(note))
        items, first = await self._first_item(name, response, request.receive, self.request_timeout_s, note)
        if first is _NOTHING:
            self.in_flight[name] -= 1
            raise RuntimeError(f"{name!r}'s ASGI app ended without an answer")
        return _Relayed(self, name, first, items, response, note)

    async def _first_item(self, name: str, response: Any, receive: Any, timeout: float | None,
                          note: dict | None) -> tuple[Any, Any]:
        """``(items, first)`` of a stream sent to ``name`` (``first``: ``_NOTHING`` for none), counted
        in flight from now (its reader counts it out when it ends). An error, no first item within
        ``timeout`` (``rankcore.RequestTimeout``) or the client gone cancels the call and counts it
        out. ``note["replica"]``: the replica it went to."""
        items = response.__aiter__()
        self.in_flight[name] += 1
        try:
            answered, first = await _answer(_first(items), receive, timeout)
            if not answered:
                raise rc.RequestTimeout(f"no answer from {name!r} within request_timeout_s={timeout:g}",
                                        deployment=name)
        except BaseException:
            self.in_flight[name] -= 1
            _cancel(response)
            raise
        finally:
            if note is not None:
                note["replica"] = _replica_of(response)
        return items, first

    def _gone(self, name: str | None) -> Any:
        """The client went away before its answer: its call was cancelled; 499 counted (nginx's
        Client Closed Request), nothing sent (uvicorn drops what is sent on a closed connection)."""
        from starlette.responses import Response

        self.answers[GONE] += 1
        return Response(status_code=GONE)

    async def _stream(self, name: str, method: str, args: tuple, kwargs: dict, receive: Any,
                      note: dict | None = None) -> Any:
        """A generator method over HTTP: newline-delimited JSON, one line per item, chunked as the
        replica yields them (Ray's back-pressure bounds how far it runs ahead of this reader). An error
        before the first item is an ordinary error answer (503, 500, ...); one after it (the replica
        died mid-stream, the application raised) is a last line ``{"error": ..., "detail": ...}``:
        the stream never just stops. A client gone (before the first item, or mid-stream: starlette
        then cancels ``lines``) cancels the stream through the handle (its slot on the replica is
        freed) and counts 499; a finished stream counts 200, or its error's status."""
        from starlette.responses import StreamingResponse

        handle = self.handles[name].options(stream=True, method_name=method)
        response = await self.send(handle, name, args, kwargs, None, _request_of(note), routing_key_of(note))
        items, first = await self._first_item(name, response, receive, None, note)
        ended = False

        async def lines() -> AsyncIterator[bytes]:
            nonlocal ended
            try:
                if first is not _NOTHING:
                    yield json_answer(first) + b"\n"
                    async for item in items:
                        yield json_answer(item) + b"\n"
                ended = True
                self.answers[200] += 1
            except Exception as exc:
                ended = True
                status, error, detail = self.failed(exc, name, method, note)
                self._count(status, error, f"mid-stream: {detail}", name)
                yield json_answer({"error": error, "detail": detail, "deployment": name}) + b"\n"
            finally:
                self.in_flight[name] -= 1
                if not ended:  # the client went away mid-stream
                    _cancel(response)
                    self.answers[GONE] += 1
                await items.aclose()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def _events(self, name: str, method: str, args: tuple, kwargs: dict,
                      note: dict | None = None) -> AsyncIterator[str]:
        """Server-sent events: each change of the request's state (``_progress``), then ``done``
        with ``{"result": ...}`` or ``error`` with the error body and its ``status``. Counted when
        it ends: 200, the error's status, or 499 when the client went away (starlette cancels this
        generator on ``http.disconnect``; the call is cancelled through the handle)."""
        sent: dict = {}
        task = asyncio.ensure_future(self.call(name, method, args, kwargs, sent, note=note))
        last: dict | None = {"state": "queued", "position": None}
        try:
            yield _sse("queued", last)
            while not task.done():
                await asyncio.wait({task}, timeout=PROGRESS_POLL_S)
                if task.done() or "response" not in sent:
                    continue
                now = _progress(sent["response"])
                if now is not None and now != last and now["state"] not in ("done", "failed", "rejected",
                                                                             "cancelled"):
                    if now["state"] == "running" and last is not None and last["state"] != "dispatched":
                        yield _sse("dispatched", {**now, "state": "dispatched"})  # (passed between two looks)
                    last = now
                    yield _sse(now["state"], now)
            try:
                value = task.result()
            except Exception as exc:
                status, error, detail = self.failed(exc, name, method, note)
                self._count(status, error, detail, name)
                yield _sse("error", {"status": status, "error": error, "detail": detail, "deployment": name})
            else:
                self.answers[200] += 1
                yield _sse("done", {"result": value})
        finally:
            if not task.done():  # the client went away
                task.cancel()
                self.answers[GONE] += 1

    # ------------------------------------------------------- metrics and access records
    async def observed(self, note: dict, method: str, path: str, status: int, latency_ms: float,
                       nbytes: int) -> None:
        """One request answered (``_Observe``): counted in the metrics, and its access record
        written (with its replica's rank: ``rank_of``), in the order the answers ended: a record
        waiting for a rank the controller is asked for holds back the ones after it (its place is
        taken now, before the wait: ``_in_place``). Else a client's next request, answered while the
        first one's rank was asked, was recorded before it."""
        self._measured(note, method, status, latency_ms)
        if not self.access.enabled:
            return
        replica = note["replica"]
        place, rank = next(self._places), None
        try:
            rank = await self.rank_of(note["deployment"], replica) if replica is not None else None
        finally:  # (a lookup that failed or was cancelled: written without its rank, never holding back the rest)
            self._in_place(place, (note, method, path, status, latency_ms, nbytes, rank))

    def refused(self, method: str, path: str, status: int, latency_ms: float, nbytes: int) -> str:
        """A request answered by the connection guard (``guarded``: 400, 408, 431, 503), before the app
        saw it: counted and logged as ``observed`` does any other (route and deployment those its path
        matches, where the request line was read; no replica). Returns its new request id. Its record
        is written in its place: at once, or after the records answered before it that wait for a rank."""
        found = match_route(self.routes, path) if path else None
        rid = request_id_of(None)
        note = {"route": found[0] if found else "", "deployment": found[1] if found else "", "replica": None,
                "request_id": rid}
        self._measured(note, method, status, latency_ms)
        if self.access.enabled:
            self._in_place(next(self._places), (note, method, path, status, latency_ms, nbytes, None))
        return rid

    def balancer_answered(self, method: str, path: str, status: int, latency_ms: float, nbytes: int,
                          request_id: str, route: str, deployment: str) -> None:
        """An HTTP answer the direct data plane's balancer gave itself, which no replica counted
        (``haproxy.Answered``: 503 ``overloaded``/``unavailable``, its 400 and 408, 500
        ``replica_died``): counted and logged as ``refused`` does (the client's request id when it
        sent a usable one, else a new one; no replica). On this ingress's loop."""
        note = {"route": route, "deployment": deployment, "replica": None, "request_id": request_id_of(request_id or None)}
        method = method if method in _HTTP_METHODS else ""
        self._measured(note, method, status, latency_ms)
        if self.access.enabled:
            self._in_place(next(self._places), (note, method, path, status, latency_ms, nbytes, None))

    def _in_place(self, place: int, record: tuple) -> None:
        """``record`` (``_logged``'s arguments) is ready: written with every ready one after it, once
        every place before it was."""
        self._ready[place] = record
        while self._written in self._ready:
            ready = self._ready.pop(self._written)
            self._written += 1
            self._logged(*ready)

    def _measured(self, note: dict, method: str, status: int, latency_ms: float) -> None:
        self.metrics.request(route=note["route"], method=method, deployment=note["deployment"], status=status,
                             latency_ms=latency_ms)

    def _logged(self, note: dict, method: str, path: str, status: int, latency_ms: float, nbytes: int,
                rank: int | None) -> None:
        self.access.write(access_record(request_id=note["request_id"], method=method, route=note["route"], path=path,
                                        deployment=note["deployment"] or None, replica=note["replica"], rank=rank,
                                        status=status, latency_ms=latency_ms, nbytes=nbytes))

    async def rank_of(self, deployment: str, replica: str) -> int | None:
        """``replica``'s global rank as the controller last said (asked again when older than
        ``RANKS_TTL_S``: in the background, or waited for when the replica is new to us)."""
        loop = asyncio.get_running_loop()
        heard, ranks = self.ranks.get(deployment, (0.0, {}))
        if replica not in ranks or loop.time() - heard > RANKS_TTL_S:
            ask = self._asking.get(deployment)
            if ask is None:
                ask = self._asking[deployment] = asyncio.ensure_future(self._ask_ranks(deployment))
            if replica not in ranks:
                try:
                    await asyncio.wait_for(asyncio.shield(ask), CONTROLLER_METRICS_TIMEOUT_S)
                except Exception:
                    return None
                ranks = self.ranks.get(deployment, (0.0, {}))[1]
        return ranks.get(replica)

    async def _ask_ranks(self, deployment: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            got = await loop.run_in_executor(self.pool, _ask_controller, "ranks", deployment)
            self.ranks[deployment] = (loop.time(), {rid: rk[0] for rid, rk in got.items()})
        except Exception:  # (the controller restarting: no rank in the records meanwhile)
            pass
        finally:
            self._asking.pop(deployment, None)

    async def prometheus(self, request: Any) -> Any:
        """``GET /metrics``: the ingress's metrics (its routers' queues read now), then the
        controller's (asked; within ``CONTROLLER_METRICS_TIMEOUT_S``, else left out and
        ``rankcore_controller_metrics_up`` 0), then every serving replica's, merged
        (``_gather``), its own with them (``merged``: a series several processes count, summed). One
        scrape target."""
        from starlette.responses import Response

        loop = asyncio.get_running_loop()
        self.metrics.queues(self._loads(), "http", self.actor_id)
        try:
            theirs, per_replica, answered = await loop.run_in_executor(self.pool, _gather)
        except Exception:  # (the controller unknown: restarting)
            theirs, per_replica, answered = None, None, {}
        self.metrics.controller_up(theirs is not None)
        self.metrics.replicas_up(answered)
        # (its routers' counts join the replicas' families: a replica's handles count under the same names;
        # its own HTTP request counts too: on the direct data plane the replicas' servers count theirs,
        # and one that left keeps its share: ``Departed``. A scrape that found no pools leaves them as they were)
        families = [f for fams in (per_replica or {}).values() for f in fams or () if f.name not in self._http.names]
        if per_replica is not None:
            self._http_shares = self._http.fold(per_replica)
        families = list(self.metrics.registry.collect()) + router_families(routed(), self.actor_id, handle="http") \
            + families + self._http_shares
        body = merged(families) + (theirs or b"")
        return Response(body, media_type=CONTENT_TYPE)

    def _loads(self) -> dict[str, tuple[int, int]]:
        """Each routed deployment's queue in this ingress: (queued, in flight at replicas)."""
        out = {}
        for name in set(self.routes.values()):
            q = self._queue(name)
            if q is not None:
                out[name] = (int(q.get("in_queue", 0)), int(q.get("in_flight", 0)))
        return out

    # ---------------------------------------------------------- the ingress's own pages
    async def unready(self) -> tuple[str, str] | None:
        """Why this proxy should get no traffic now, ``(error, message)``, or None: draining (an outside
        load balancer moves away; what is in flight finishes), or, on a node other than the head, none
        of its handles has heard of a serving replica yet (Serve's ``ready_for_traffic``: it could only
        queue requests). The HTTP and gRPC health checks answer by it."""
        if self.draining:
            return "draining", "This node is being drained."
        if not self.is_head:
            handles = list(self.handles.values())

            def populated() -> bool:  # (on a call thread: a handle's first look asks the controller)
                return any(h.replicas_populated() for h in handles)
            if not await asyncio.get_running_loop().run_in_executor(self.pool, populated):
                return "no_replicas", NO_REPLICAS_MESSAGE
        return None

    async def healthz(self, request: Any) -> Any:
        from starlette.responses import PlainTextResponse

        why = await self.unready()
        if why is not None:
            return self._error(503, why[0], why[1], None)
        try:
            await asyncio.get_running_loop().run_in_executor(self.pool, _ask_controller, "status")
        except Exception as exc:
            return self._error(503, "unhealthy", f"the controller does not answer: {exc}", None)
        return PlainTextResponse("success")  # (Ray Serve's proxy answers this word: scripts test for it)

    async def list_routes(self, request: Any) -> Any:
        """Route prefix -> application (Ray Serve's answer: ``appnames``; a deployment no application
        holds is its own); 503 while this proxy drains, as Ray Serve's (a load balancer that reads
        the routes moves away too)."""
        from starlette.responses import JSONResponse

        if self.draining:
            return self._error(503, "draining", "This node is being drained.", None)
        return JSONResponse({prefix: appnames.of(name) for prefix, name in sorted(self.routes.items())})

    async def status_json(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse(await self.status())

    async def status_page(self, request: Any) -> Any:
        from starlette.responses import HTMLResponse

        return HTMLResponse(render_page(await self.status()))

    async def status(self) -> dict:
        """The status page's data: the ingress, every deployment (routed or in a pool) with its
        replicas, ranks and phases, pool, queue; tiers; recent faults."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._status)

    def _status(self) -> dict:
        errors: list[str] = []
        deleted = object()

        def get(what: str, *args: Any, deleted_ok: bool = False) -> Any:
            try:
                return _jsonable(_ask_controller(what, *args))
            except Exception as exc:
                if deleted_ok and isinstance(getattr(exc, "cause", None), rc.UnknownDeployment):
                    return deleted
                errors.append(f"{what}{args!r}: {type(exc).__name__}: {exc}")
                return None

        pools = get("pools") or {"members": {}, "coming": {}}
        by_route = {dep: prefix for prefix, dep in self.routes.items()}
        names = sorted(set(by_route) | set(pools.get("members", {})) | set(pools.get("coming", {})))
        deployments = []
        faults = list(self.faults)
        for name in names:
            # (deleted a moment ago: an empty pool is all the request path keeps of it, not an error)
            st = get("deployment_status", name, deleted_ok=name not in by_route)
            if st is deleted:
                continue
            members = pools.get("members", {}).get(name, {})
            deployments.append({"name": name, "route": by_route.get(name), "status": st, "pool": members,
                                "coming": pools.get("coming", {}).get(name), "queue": self._queue(name),
                                "in_flight_http": self.in_flight.get(name, 0)})
            if st and st.get("status") not in (None, "HEALTHY"):
                faults.append({"deployment": name, "error": st.get("status"), "detail": st.get("status_message")})
            for rid in (st or {}).get("failed", []):
                faults.append({"deployment": name, "error": "replica_failed", "detail": rid})
        tiers = get("tiers_status")
        if tiers is not None:
            tiers["log"] = tiers.get("log", [])[-50:]
        ctl_status = get("status") or {}
        for rejected in (ctl_status.get("rejected") or [])[-RECENT_FAULTS:]:
            faults.append({"error": "rejected_event", "detail": rejected})
        host, port = self.address
        return {"time": time.time(), "errors": errors,
                "ingress": {"host": host, "port": port, "routes": dict(sorted(self.routes.items())),
                            "max_body_bytes": self.max_body_bytes, "request_timeout_s": self.request_timeout_s,
                            "header_timeout_s": self.header_timeout_s, "max_header_bytes": self.max_header_bytes,
                            "max_connections": self.max_connections,
                            "answers": {str(k): v for k, v in sorted(self.answers.items())}},
                "deployments": deployments, "tiers": tiers, "faults": faults[-RECENT_FAULTS * 2:]}

    def _queue(self, name: str) -> dict | None:
        """The deployment's queue as this ingress's handle counts it (``handle.counters()``:
        ``in_queue``, ``in_flight``, answered, ..., ``lost``, and how many went by value: ``base.by_value``);
        None before its first call."""
        import attrs

        try:
            c = self.handles[name].counters()
        except Exception:
            return None
        if c is None or not attrs.has(type(c)):
            return None
        by_value = getattr(getattr(self.handles[name], "_router", None), "sent_by_value", 0)
        return _jsonable({**attrs.asdict(c), "lost": c.lost, "sent_by_value": by_value})


def _ask_controller(method: str, *args: Any, timeout: float = 5.0) -> Any:
    """Ask the controller (by its name): what the status page and ``/-/healthz`` show. Once:
    a controller restarting is shown as such, not waited out."""
    controller = ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
    return ray.get(getattr(controller, method).remote(*args), timeout=timeout)


def _gather(controller_s: float = CONTROLLER_METRICS_TIMEOUT_S, replica_s: float = REPLICA_METRICS_TIMEOUT_S
            ) -> tuple[bytes | None, dict[tuple[str, str], list | None] | None, dict[tuple[str, str], bool]]:
    """(On a call thread.) The controller's exposition (None: no answer in ``controller_s``), the
    metric families of every replica its pools list as serving (None: those of one that did not answer
    within ``replica_s``), and whether each answered: ``(text, {(deployment, replica): families or
    None}, {(deployment, replica): answered})``; None for the families when the pools were not read. Every replica is asked
    at once, so a scrape waits for the slowest answer up to ``replica_s``, never for their sum.
    The ingress gathers them (not the controller): scrapes stay on the data path's actor, and the
    controller's loop answers two small calls (its exposition, its pools) per scrape, not one per replica."""
    controller = ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
    text_ref, pools_ref = controller.metrics_text.remote(), controller.pools.remote()
    ready, _ = ray.wait([text_ref, pools_ref], num_returns=2, timeout=controller_s)
    text = _got(text_ref) if text_ref in ready else None
    pools_read = pools_ref in ready
    actors: dict[tuple[str, str], Any] = {}
    members = (_got(pools_ref) or {}).get("members", {}) if pools_read else {}
    pool_refs = {name: controller.pool.remote(name) for name in members}
    if pool_refs:
        ready, _ = ray.wait(list(pool_refs.values()), num_returns=len(pool_refs), timeout=controller_s)
        for name, ref in pool_refs.items():
            pool = _got(ref) if ref in ready else None
            for rid, actor in (pool or {}).get("serving", ()):
                actors[(name, rid)] = actor
    refs = {key: actor.metrics_families.remote() for key, actor in actors.items()}
    families: dict[tuple[str, str], list | None] = {}
    answered: dict[tuple[str, str], bool] = {}
    if refs:
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=replica_s)
        for key, ref in refs.items():
            got = _got(ref) if ref in ready else None
            answered[key] = got is not None
            families[key] = got
    return text, (families if pools_read else None), answered


def _got(ref: Any) -> Any:
    """A ready ref's value; None when its task raised (the actor died, a deployment just deleted)."""
    try:
        return ray.get(ref, timeout=0)
    except Exception:
        return None


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, default=repr)}\n\n"


class _Observe:
    """ASGI middleware around the app: every request but the ingress's own pages (``/-/``) and
    ``/metrics`` gets its request id (``request_id_of``, returned in ``x-request-id``), is counted
    in flight while it runs, and once answered is measured and recorded (``IngressState.observed``:
    status, latency from its arrival to its last byte, body bytes). The app notes in
    ``scope["rankcore"]`` the route, deployment and replica it found. A client gone before the
    answer's end is recorded as 499, whatever the status line said."""

    def __init__(self, app: Any, ingress: IngressState) -> None:
        self.app, self.ingress = app, ingress

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path == METRICS_PATH or path.startswith("/-/"):
            await self.app(scope, receive, send)
            return
        sent_id = None
        model = key = ""
        for k, v in scope.get("headers", ()):
            if k == b"x-request-id":
                sent_id = v.decode("latin-1")
            elif k == MODEL_ID_HEADER:
                model = v.decode("latin-1").strip()
            elif k == _ROUTING_KEY:
                key = v.decode("latin-1").strip()
        rid = request_id_of(sent_id)
        note = {"route": "", "deployment": "", "replica": None, "request_id": rid, "model": model,
                "routing_key": key}
        scope["rankcore"] = note
        t0 = time.perf_counter()
        out = {"status": 500, "bytes": 0, "done": False}
        header = (REQUEST_ID_HEADER.encode(), rid.encode())

        async def observed_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                out["status"] = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), header]}
            elif message["type"] == "http.response.body":
                out["bytes"] += len(message.get("body", b""))
                if not message.get("more_body", False):
                    out["done"] = True
            await send(message)

        ingress = self.ingress
        ingress.metrics.started()
        ingress.ongoing += 1
        try:
            await self.app(scope, receive, observed_send)
        finally:
            ingress.ongoing -= 1
            ingress.metrics.ended()
            status = out["status"] if out["done"] else GONE
            await ingress.observed(note, scope.get("method", ""), path, status,
                                   (time.perf_counter() - t0) * 1000.0, out["bytes"])


def make_app(ingress: IngressState) -> Any:
    """The starlette app: the ingress's own pages under ``/-/``, ``/metrics``, every other path a
    deployment's; wrapped in ``_Observe`` (metrics, access records, request ids)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    async def http_error(request: Any, exc: Exception) -> Any:
        note = request.scope.get("rankcore")
        rid = note["request_id"] if note else None
        if isinstance(exc, HTTPException) and exc.status_code == 404:
            return ingress._not_found(request.url.path, rid)
        if isinstance(exc, HTTPException):
            return ingress._error(exc.status_code, "not_found" if exc.status_code == 404 else "http_error",
                                  str(exc.detail), None, request_id=rid)
        log_failure(exc, 500, None, request.url.path, rid or "")  # (the proxy's own fault: its log has it)
        return ingress._error(500, "http_error", f"the proxy failed ({type(exc).__name__}); its log has the "
                                                 f"traceback under this request id", None, request_id=rid)

    routes = [Route("/-/healthz", ingress.healthz, methods=["GET"]),
              Route("/-/routes", ingress.list_routes, methods=["GET"]),
              Route("/-/status", ingress.status_page, methods=["GET"]),
              Route("/-/status.json", ingress.status_json, methods=["GET"]),
              Route(METRICS_PATH, ingress.prometheus, methods=["GET"]),
              Route("/{path:path}", ingress.deployment_call, methods=list(_HTTP_METHODS - {"CONNECT", "TRACE"}))]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: http_error})
    return _Observe(app, ingress)

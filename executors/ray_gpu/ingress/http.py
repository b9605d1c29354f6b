"""HTTP ingress for the Ray executor (issue 22): Ray Serve's HTTP proxy, in rankcore's terms.

One detached actor, ``rankcore-http`` (``num_cpus=0``, restarted by Ray like the
controller), runs a uvicorn server on a thread of its own with a starlette app:

* a route per deployment (``route_prefix``, default ``/<name>``): ``POST`` JSON
  in, JSON out (``args_of`` says how a body becomes the call's arguments);
  ``GET`` calls with no arguments; ``<prefix>/<method>`` calls a method the user marked
  ``@http_method`` (any other name, a lifecycle method and a ``@multiplexed`` loader
  included: 404 ``unknown_method``, nothing sent: ``public_methods``, ``base.exposed``);
* errors as JSON ``{"error", "detail", "deployment"}`` with the status the
  request path gives them (``status_of``): a ``rankcore.RequestError`` its own
  ``.status`` (503 overloaded or no replica, 408 timeout, 499, 500 replica
  died), 404 unknown route or deployment, 413 body above ``max_body_bytes``,
  400 bad JSON, 500 naming the application's error (its traceback only in the proxy's log);
* limits on what a hostile client can hold (issue 40): a request head within
  ``header_timeout_s`` (408) and ``max_header_bytes`` (431), at most ``max_connections``
  (503), a body within ``request_timeout_s`` (408), JSON at most ``MAX_JSON_DEPTH`` deep
  (400); a request the parser cannot read is a JSON 400 too (``guarded``); these answers
  are counted and logged as any other (``IngressState.refused``);
* progress while waiting (``Accept: text/event-stream`` or ``?progress=1``):
  server-sent events ``queued`` / ``loading`` / ``dispatched`` / ``running``,
  then ``done`` with the result or ``error``;
* ``GET /-/healthz``, ``GET /-/routes``, and a status page ``GET /-/status``
  (self-contained HTML refreshing from its JSON twin ``GET /-/status.json``);
* ``GET /metrics``: Prometheus metrics, the ingress's and the controller's
  (``base/metrics.py``), and one access record per request with its
  ``x-request-id`` (``access.py``), both taken by ``_Observe`` around the app
  (docs/metrics.md).

The route table (with each route's handle) and the port bound live in Ray's
internal KV store (``persist.save_http_routes`` / ``save_http_port``, beside the
controller's keys), so a restarted ingress serves the same routes at the same
address; the controller's ``reset`` stops the ingress and forgets both. The ingress
decides nothing about requests: it calls the handles it is given (``expose``:
the caller's ``DeploymentHandle``, public API only) and maps what comes back;
it imports nothing of api.py (which starts it: ``run(..., route_prefix=...)``).
docs/ray.md, "HTTP ingress".
"""

from __future__ import annotations

import asyncio
import functools
import html
import itertools
import json
import logging
import os
import socket
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

import rankcore as rc

from ..base import appnames, by_value, persist
from ..base.access import (
    ENABLE_ACCESS_LOG,
    REQUEST_ID_HEADER,
    AccessLog,
    check_enable_access_log,
    default_logs_dir,
    request_id_of,
)
from ..base.access import record as access_record
from ..base.context import RequestContext, _serve_request_context, model_request
from ..base.exposed import ASGI_ENTRY, Reachable, reachable
from ..base.httpwords import ANSI as _ANSI
from ..base.httpwords import (
    MAX_ERROR_MESSAGE,
    MAX_JSON_DEPTH,
    METRICS_PATH,
    Reply,
    args_of,
    json_answer,
    match_prefix,
    match_route,
    not_found_text,
    read_json,
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
from ..control.controller import CONTROLLER_NAME, INGRESS_NAME, NAMESPACE

log = logging.getLogger(__name__)

__all__ = ["INGRESS_NAME", "check_port", "DEFAULT_HOST", "DEFAULT_PORT", "MAX_BODY_BYTES", "REQUEST_TIMEOUT_S", "HEADER_TIMEOUT_S",
           "MAX_HEADER_BYTES", "MAX_CONNECTIONS", "MAX_JSON_DEPTH", "MAX_ERROR_MESSAGE", "match_prefix", "match_route",
           "not_found_text", "HttpIngress",
           "start_ingress", "expose", "refresh_methods", "ingress_address", "proxies", "args_of", "read_json", "status_of", "check_route_prefix",
           "make_app", "IngressState", "Reply", "ClientGone", "guarded", "check_limits", "check_connection_limits",
           "set_access_log", "METRICS_PATH"]

#: Ray Serve's defaults: loopback only, port 8000
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
#: a body above this is refused with 413 before it is read (configurable)
MAX_BODY_BYTES = 1 << 20
#: a request still unanswered after this long gets 408 (Ray Serve waits forever by default;
#: a bounded wait frees the caller and the ingress's thread; None: no limit); a body still arriving
#: after this long too (408, the connection closed)
REQUEST_TIMEOUT_S: float | None = 60.0
# the connection limits (issue 40: hostile clients), configurable as the two above; read by the
# proxy's protocol (``guarded``) on every connection, so ``configure`` changes them at once
#: a request's head (request line and headers) must have arrived this long after the connection
#: opened, or after its first byte on a kept-alive connection: else 408 and the connection closed
#: (nothing sent to one that sent nothing). Without it a client sending a byte a second (slowloris),
#: or none, holds its connection for ever: uvicorn times only the wait between two requests. A real
#: client sends its head in one packet; 10 s allows a very slow link (nginx 60 s, Node 60 s, Apache
#: 20-40 s). None: no limit
HEADER_TIMEOUT_S: float | None = 10.0
#: a request head above this many bytes is refused with 431 (and the connection closed): h11's and
#: uvicorn's default (``h11_max_incomplete_event_size``), Node's too; the httptools parser has none,
#: so a header that never ends grew without bound
MAX_HEADER_BYTES = 16 << 10
#: connections open at once; one more is answered 503 and closed before anything is read (uvicorn's
#: ``limit_concurrency`` answers only once a request is read, and has no default). Each costs a file
#: descriptor and a few KB (500 idle: under 1 MB, measured); idle ones go after ``HEADER_TIMEOUT_S``.
#: None: no limit
MAX_CONNECTIONS: int | None = 10_000
#: threads for what may block: a handle's first call (it asks the controller), the controller's answers
CALL_THREADS = 256
#: how often a progress stream looks at its request's status
PROGRESS_POLL_S = 0.05
#: how many recent error answers the status page lists
RECENT_FAULTS = 20
#: a call still unanswered this long starts watching its client (a quick answer pays for no watcher)
WATCH_AFTER_S = 0.2
#: what a request whose client went away is counted as (nginx's "Client Closed Request")
GONE = 499
#: how long the ingress trusts the ranks it last heard (access records' ``rank``)
RANKS_TTL_S = 1.0
#: how long a scrape waits for the controller's metrics (then serves the ingress's alone)
CONTROLLER_METRICS_TIMEOUT_S = 2.0
#: how long a scrape waits for the replicas' metrics, all asked at once (one late is left out of
#: this scrape, ``rankcore_replica_metrics_up`` 0: a slow replica never stalls the scrape)
REPLICA_METRICS_TIMEOUT_S = 1.0




# ------------------------------------------------------------------ pure rules
def check_route_prefix(prefix: Any) -> str:
    """A route prefix starts with ``/``, has no trailing ``/`` (but ``/`` itself), and is not
    under ``/-/`` (the ingress's own pages)."""
    if not isinstance(prefix, str) or not prefix.startswith("/"):
        raise rc.InvalidConfig(f"route_prefix must be a string starting with '/', got {prefix!r}")
    if prefix != "/" and prefix.endswith("/"):
        raise rc.InvalidConfig(f"route_prefix must not end with '/', got {prefix!r}")
    if prefix == "/-" or prefix.startswith("/-/"):
        raise rc.InvalidConfig(f"route_prefix {prefix!r} is under '/-/', which the ingress keeps for itself")
    if prefix == METRICS_PATH or prefix.startswith(METRICS_PATH + "/"):
        raise rc.InvalidConfig(f"route_prefix {prefix!r} is the ingress's Prometheus endpoint {METRICS_PATH!r}")
    if any(c.isspace() or c in "?#" for c in prefix):
        raise rc.InvalidConfig(f"route_prefix must not hold spaces, '?' or '#', got {prefix!r}")
    return prefix


@functools.lru_cache(maxsize=256)
def _pattern_routes(patterns: tuple[tuple[str, tuple[str, ...] | None], ...]) -> tuple[Any, ...]:
    """Starlette routes of an app's declared ``patterns`` (``Reachable.routes``), made once a set."""
    from starlette.routing import Route

    async def nothing(request: Any) -> None:  # pragma: no cover - (matched against, never called)
        return None
    return tuple(Route(path, nothing, methods=list(methods) if methods else None) for path, methods in patterns)


def route_pattern(prefix: str, patterns: tuple[tuple[str, tuple[str, ...] | None], ...], path: str,
                  method: str) -> str:
    """The route label of a request to an ASGI deployment routed at ``prefix``, as Serve's proxy's
    ``match_route_pattern``: the app's declared route that ``path`` and ``method`` fully match, the
    prefix in front (``/api`` + ``/users/{user_id}``); a path that matches none with a slash added
    or taken off (starlette redirects it) matches that route, so shown; else ``prefix`` (no other
    label: a label per path would grow without bound)."""
    if not patterns:
        return prefix
    from starlette.routing import Match

    base = "" if prefix == "/" else prefix
    rel = path[len(base):]  # ("" for the prefix itself: as Serve's, it matches no route, "/" redirected)
    routes = _pattern_routes(patterns)

    def full(p: str) -> str | None:
        scope = {"type": "http", "path": p, "root_path": "", "method": method}
        for route in routes:
            if route.matches(scope)[0] is Match.FULL:
                return route.path
        return None
    name = full(rel)
    if name is None and path != "/":
        other = full(rel[:-1] if rel.endswith("/") else rel + "/")
        if other is not None:
            name = other + "/" if rel.endswith("/") else other[:-1]
    if not name:
        return prefix
    return base + "/" + name.lstrip("/") if base else name


#: a worker node's proxy's ``/-/healthz`` before any of its handles has a replica (Serve's, word for word)
NO_REPLICAS_MESSAGE = "No replicas are available yet."


def log_failure(exc: BaseException, status: int, deployment: str | None, method: str, request_id: str) -> None:
    """A 500's whole story (the remote traceback) goes to the proxy's log, under the request id
    its answer carries; the client sees only ``status_of``'s detail."""
    if status >= 500:
        log.error("request %s to %s.%s failed (%d):\n%s", request_id or "-", deployment or "-", method, status,
                  _ANSI.sub("", "".join(traceback.format_exception(exc))))


def _jsonable(value: Any) -> Any:
    """Controller answers for the status page: tuples as lists, anything else JSON lacks as text."""
    return json.loads(json.dumps(value, default=lambda o: repr(o)))


# ------------------------------------------------- the handle, behind two functions
_NOTHING = object()  # (a stream without items)
_UNKNOWN = Reachable.unknown()  # (a deployment whose methods the proxy was not told)


async def _first(items: Any) -> Any:
    """A stream's first item, or ``_NOTHING``."""
    try:
        return await items.__anext__()
    except StopAsyncIteration:
        return _NOTHING


def _declares_body(request: Any) -> bool:
    """Whether the request's head announces a body (a Content-Length above 0, or chunks)."""
    headers = request.headers
    return headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers


def _submit(handle: Any, name: str, args: tuple, kwargs: dict, request: RequestContext | None = None) -> Any:
    """Send the call (on this loop or a call thread) with ``request`` as the current request, so
    the handle carries its id and route to the replica (as Serve's proxy sets
    ``_serve_request_context`` before it calls its handle). A handle's own ``TimeoutError`` here
    means no replica took it: 503, not the caller's 408."""
    token = _serve_request_context.set(request)
    try:
        return handle.remote(*args, **kwargs)
    except rc.RequestError:
        raise
    except TimeoutError as exc:
        raise rc.Unavailable(f"no replica of {name!r} took the call: {exc}", deployment=name) from exc
    finally:
        _serve_request_context.reset(token)


#: the header a request names its multiplexed model in (Serve's ``SERVE_MULTIPLEXED_MODEL_ID``)
MODEL_ID_HEADER = b"serve_multiplexed_model_id"


def public_methods(cls: Any) -> Reachable:
    """What HTTP and gRPC may call on a deployment of class ``cls`` (``base.exposed.reachable``):
    over HTTP ``__call__`` and the ``@http_method`` ones, over gRPC its public methods; never a
    lifecycle method or a ``@multiplexed`` loader."""
    return reachable(cls)


def _methods_of(deployment: str) -> Reachable:
    """(Where a route is added: the caller of ``expose`` has the deployment's class importable.)
    ``public_methods`` of the class the controller last applied for ``deployment``, read from what
    it stored (``persist.load_specs``); ``Reachable.unknown()`` when that cannot be read here."""
    try:
        spec = (persist.load_specs() or {}).get(deployment)
    except Exception:  # (a class this process cannot import: __call__ over HTTP, no lifecycle method)
        return Reachable.unknown()
    return public_methods(spec.get("cls")) if isinstance(spec, dict) else Reachable.unknown()


def _request_of(note: dict | None) -> RequestContext | None:
    """What the replica's user code sees of this HTTP request: its id (``x-request-id``), route, and
    the multiplexed model its ``serve_multiplexed_model_id`` header names."""
    if note is None:
        return None
    return RequestContext(route=note["route"], request_id=note["request_id"], app_name=appnames.of(note["deployment"]),
                          multiplexed_model_id=note.get("model", ""))


class ClientGone(Exception):
    """The client closed its connection before its answer was complete (nginx's 499)."""


async def _client_gone(receive: Any) -> None:
    """Return once the client has gone: past the body, uvicorn answers ``receive()`` with
    ``http.disconnect`` only when the connection is lost (or the response is complete)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(response: Any, receive: Any, timeout: float | None) -> tuple[bool, Any]:
    """Wait for ``response`` (awaited on this loop: no thread), for the client's going away
    (``receive``, when given; watched only once the answer is ``WATCH_AFTER_S`` late, so that a
    quick answer pays for no watcher) and for ``timeout``: ``(True, result)``, or ``(False,
    None)`` when the time ran out; ``ClientGone`` when the client went away; the call's own error
    raised as is. The response itself is left alone (``call`` cancels it through the handle)."""
    answer = asyncio.ensure_future(response)
    if receive is None:
        done, _ = await asyncio.wait((answer,), timeout=timeout)
    else:
        grace = WATCH_AFTER_S if timeout is None else min(WATCH_AFTER_S, timeout)
        done, _ = await asyncio.wait((answer,), timeout=grace)
        left = None if timeout is None else timeout - grace
        if not done and (left is None or left > 0):
            watch = asyncio.ensure_future(_client_gone(receive))
            try:
                done, _ = await asyncio.wait((answer, watch), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watch.cancel()
            if answer not in done and watch in done:
                answer.add_done_callback(_retrieved)
                raise ClientGone()
    if answer not in done:
        answer.add_done_callback(_retrieved)
        return False, None
    return True, answer.result()


def _retrieved(task: Any) -> None:
    """(A dropped answer's outcome read, so asyncio does not warn that it never was.)"""
    if not task.cancelled():
        task.exception()


def _progress(response: Any) -> dict | None:
    """Where a sent request stands, as an event: the handle's ``response.status()``
    (``rankcore.requests.RequestStatus``) where it has one, else ``dispatched`` (a response
    exists: the handle has sent the call to a replica)."""
    status = getattr(response, "status", None)
    if not callable(status):
        return {"state": "dispatched"}
    st = status()
    if st is None:
        return None
    return {"state": st.state, "position": st.position, "replica_id": st.replica_id, "attempt": st.attempt}


def _cancel(response: Any) -> None:
    """A caller gone or timed out: cancel the call where the handle can."""
    cancel = getattr(response, "cancel", None)
    if callable(cancel):
        try:
            cancel()
        except Exception:
            pass


def _replica_of(response: Any) -> str | None:
    """The replica the router sent a call to (None: not dispatched)."""
    return getattr(getattr(response, "call", None), "replica_id", None)


def _cancel_sent(submit: Any) -> None:
    """``submit`` done: cancel the call it sent (if it sent one)."""
    if not submit.cancelled() and submit.exception() is None:
        _cancel(submit.result())


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


# ----------------------------------------------------------------- the app
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
                response = await self.send(handle, name, args, kwargs, timeout, request)
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
                   request: RequestContext | None = None) -> Any:
        """``handle.remote(...)``: on this loop once the handle knows its pool (sending then never
        blocks: no thread hop), else on a call thread (the first call asks the controller),
        within ``timeout`` (``asyncio.TimeoutError``); a call given up while being sent is
        cancelled as soon as it is. ``request``: the HTTP request's id and route (``_submit``), and
        the multiplexed model it names (the call goes through ``options(multiplexed_model_id=...)``)."""
        if request is not None and request.multiplexed_model_id:
            handle = handle.options(multiplexed_model_id=request.multiplexed_model_id)
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
        response = await self.send(handle, name, (sent, body), {}, self.request_timeout_s, _request_of(note))
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
        response = await self.send(handle, name, args, kwargs, None, _request_of(note))
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
        model = ""
        for k, v in scope.get("headers", ()):
            if k == b"x-request-id":
                sent_id = v.decode("latin-1")
            elif k == MODEL_ID_HEADER:
                model = v.decode("latin-1").strip()
        rid = request_id_of(sent_id)
        note = {"route": "", "deployment": "", "replica": None, "request_id": rid, "model": model}
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


# ------------------------------------------------------------------ the connection limits
_REASONS = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}
#: the methods a refused request's record may name (its ``method`` label: another token is "", so a
#: hostile client cannot grow the metrics' label sets)
_HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"})
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


# ------------------------------------------------------------------ the status page
def _e(v: Any) -> str:
    return html.escape("-" if v is None else str(v))


def _rank(r: Any) -> str:
    return "/".join("-" if x is None else str(x) for x in r) if isinstance(r, (list, tuple)) else _e(r)


def render_page(status: dict) -> str:
    """The status page: the tables rendered here (it reads without JavaScript), then kept
    current by the inline script, which fetches ``/-/status.json`` every 2 s and renders the
    same tables (``render`` in _PAGE_JS)."""
    rows = []
    for d in status["deployments"]:
        st = d["status"] or {}
        rows.append(f"<section class=dep data-deployment='{_e(d['name'])}'><h2>{_e(d['name'])} "
                    f"<small>{_e(d['route'])} · {_e(st.get('status'))} · target {_e(st.get('target'))} · "
                    f"queue {_e(_queue_text(d['queue']))} · in flight (HTTP) {_e(d['in_flight_http'])}</small></h2>"
                    "<table><tr><th>replica</th><th>rank</th><th>phase</th><th>pool</th><th>node</th></tr>")
        for rid, r in sorted((st.get("replicas") or {}).items(), key=lambda kv: str(kv[1].get("rank"))):
            rows.append(f"<tr><td>{_e(rid)}</td><td class=rank>{_rank(r.get('rank'))}</td><td>{_e(r.get('phase'))}"
                        f"</td><td>{_e(d['pool'].get(rid))}</td><td>{_e((r.get('node_id') or '')[:12])}</td></tr>")
        rows.append("</table></section>")
    faults = "".join(f"<li>{_e(f.get('deployment'))}: {_e(f.get('error'))} {_e(str(f.get('detail'))[:300])}</li>"
                     for f in status["faults"]) or "<li>none</li>"
    tiers = status.get("tiers") or {}
    tier_log = "".join(f"<li>{_e(x)}</li>" for x in (tiers.get("log") or [])[-10:]) or "<li>none</li>"
    initial = html.escape(json.dumps(status), quote=False)
    return (_PAGE_HEAD + "<main id=view>" + "".join(rows) +
            f"<h2>Tiers</h2><ul id=tiers>{tier_log}</ul><h2>Recent faults</h2><ul id=faults>{faults}</ul></main>"
            f"<script type=application/json id=initial>{initial}</script><script>{_PAGE_JS}</script></body></html>")


def _queue_text(q: Any) -> str:
    if not q:
        return "-"
    return ", ".join(f"{k} {v}" for k, v in q.items() if isinstance(v, (int, float)))


_PAGE_HEAD = """<!doctype html><html><head><meta charset=utf-8><title>rankcore status</title><style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.3em}h2{font-size:1.05em;margin:1.2em 0 .3em}
small{color:#666;font-weight:normal}table{border-collapse:collapse}td,th{padding:2px 10px;border-bottom:1px solid #ddd;
text-align:left}td.rank{font-family:monospace}#updated{color:#666}#updated.stale{color:#b00}ul{margin:.2em 0}
</style></head><body data-refreshes=0><h1>rankcore <span id=updated>(served)</span></h1>"""

# the same tables as render_page, from /-/status.json (no external assets)
_PAGE_JS = r"""
const esc = v => String(v === null || v === undefined ? "-" : v).replace(/[&<>"']/g,
  c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const rank = r => Array.isArray(r) ? r.map(x => x === null ? "-" : x).join("/") : esc(r);
const queue = q => q ? Object.entries(q).filter(([k, v]) => typeof v === "number").map(([k, v]) => k + " " + v)
  .join(", ") : "-";
function render(s) {
  let out = "";
  for (const d of s.deployments) {
    const st = d.status || {};
    out += `<section class=dep data-deployment='${esc(d.name)}'><h2>${esc(d.name)} <small>${esc(d.route)} · ` +
      `${esc(st.status)} · target ${esc(st.target)} · queue ${esc(queue(d.queue))} · in flight (HTTP) ` +
      `${esc(d.in_flight_http)}</small></h2><table><tr><th>replica</th><th>rank</th><th>phase</th><th>pool</th>` +
      `<th>node</th></tr>`;
    const reps = Object.entries(st.replicas || {}).sort((a, b) => String(a[1].rank) < String(b[1].rank) ? -1 : 1);
    for (const [rid, r] of reps) {
      out += `<tr><td>${esc(rid)}</td><td class=rank>${rank(r.rank)}</td><td>${esc(r.phase)}</td>` +
        `<td>${esc((d.pool || {})[rid])}</td><td>${esc((r.node_id || "").slice(0, 12))}</td></tr>`;
    }
    out += "</table></section>";
  }
  const log = ((s.tiers || {}).log || []).slice(-10).map(x => `<li>${esc(JSON.stringify(x))}</li>`).join("");
  const faults = (s.faults || []).map(f => `<li>${esc(f.deployment)}: ${esc(f.error)} ` +
    `${esc(String(f.detail).slice(0, 300))}</li>`).join("");
  out += `<h2>Tiers</h2><ul id=tiers>${log || "<li>none</li>"}</ul>` +
    `<h2>Recent faults</h2><ul id=faults>${faults || "<li>none</li>"}</ul>`;
  document.getElementById("view").innerHTML = out;
}
async function refresh() {
  const u = document.getElementById("updated");
  try {
    const r = await fetch("/-/status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    document.body.dataset.refreshes = Number(document.body.dataset.refreshes) + 1;
    u.textContent = "updated " + new Date().toLocaleTimeString(); u.className = "";
  } catch (e) { u.textContent = "not updated: " + e; u.className = "stale"; }
}
render(JSON.parse(document.getElementById("initial").textContent));
refresh(); setInterval(refresh, 2000);
"""


# ------------------------------------------------------------------ the actor
class HttpIngress:
    """The ingress actor: binds its socket when created (an address in use fails the
    creation, naming it) and serves on a thread of its own, restarts included."""

    def __init__(self, host: str, port: int, max_body_bytes: int = MAX_BODY_BYTES,
                 request_timeout_s: float | None = REQUEST_TIMEOUT_S, enable_access_log: bool = ENABLE_ACCESS_LOG,
                 logs_dir: str | None = None, *, proxy_id: str = "", remember_port: bool = True, is_head: bool = True,
                 grpc_port: int | None = None, grpc_servicer_functions: tuple[str, ...] = (),
                 header_timeout_s: float | None = HEADER_TIMEOUT_S, max_header_bytes: int = MAX_HEADER_BYTES,
                 max_connections: int | None = MAX_CONNECTIONS, data_plane: str = "proxy") -> None:
        import uvicorn

        from .haproxy import check_data_plane

        check_data_plane(data_plane)
        check_limits(max_body_bytes, request_timeout_s)
        check_connection_limits(header_timeout_s, max_header_bytes, max_connections)
        routes, handles, methods = _load_routes()
        ctx = ray.get_runtime_context()
        metrics = IngressMetrics(node_id=ctx.get_node_id() or "", node_ip=ray.util.get_node_ip_address())
        access = AccessLog(enable_access_log, logs_dir if logs_dir is not None else default_logs_dir())
        self.state = IngressState(routes, handles, max_body_bytes, request_timeout_s, access, metrics)
        st = self.state
        st.methods = methods
        st.is_head = is_head
        st.header_timeout_s, st.max_header_bytes, st.max_connections = header_timeout_s, max_header_bytes, max_connections
        self.state.actor_id = ctx.get_actor_id() or ""
        sock = _listen(host, port, remember_port)
        self.state.address = (host, sock.getsockname()[1])
        #: the direct data plane (``haproxy.DataPlane``: an HAProxy on the public socket, this server on a
        #: loopback port of its own behind it) or None (this server on the public socket)
        self.plane: Any = None
        self.public = sock
        if data_plane == "direct":
            sock = _listen("127.0.0.1", 0, remember=False)
        #: the direct data plane with gRPC: HAProxy takes the public gRPC socket too, and the proxy's gRPC
        #: server listens on a loopback port behind it (``haproxy`` module docstring)
        self.grpc_public: socket.socket | None = None
        grpc_host, grpc_bind = host, grpc_port
        if data_plane == "direct" and grpc_servicer_functions and grpc_port is not None:
            self.grpc_public = _listen(host, grpc_port, remember=False)
            grpc_host, grpc_bind = "127.0.0.1", 0
        self.proxy_id, self.node_id = proxy_id, ctx.get_node_id() or ""
        self._gone = threading.Event()
        self._routes_lock = threading.Lock()

        class Server(uvicorn.Server):
            def install_signal_handlers(self) -> None:  # the actor's process keeps Ray's handlers
                pass

            def capture_signals(self) -> Any:
                import contextlib

                return contextlib.nullcontext()

        loop, parser = server_stack()
        self.stack = (loop, parser)
        if parser == "httptools":
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as protocol
        else:
            from uvicorn.protocols.http.h11_impl import H11Protocol as protocol  # type: ignore[assignment]
        # ws="none": no route takes a WebSocket (an Upgrade is served as plain HTTP, the limits kept)
        config = uvicorn.Config(make_app(self.state), log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=30, http=guarded(protocol, self.state), ws="none")
        self.server = Server(config)
        #: gRPC beside HTTP (grpc_proxy.py), on the same loop, when servicer functions are given
        self.grpc: Any = None
        self.grpc_error: BaseException | None = None
        self._grpc_lock = threading.Lock()  # (``set_grpc_services``: one at a time)
        if grpc_servicer_functions and grpc_port is not None:
            from ..base.grpc_proxy import GrpcFront

            self.grpc = GrpcFront(self.state, grpc_servicer_functions, _cancel)
        def serve() -> None:
            if loop == "uvloop":
                import uvloop

                uvloop.run(self._serve(sock, grpc_host, grpc_bind))
            else:
                asyncio.run(self._serve(sock, grpc_host, grpc_bind))

        self.thread = threading.Thread(target=serve, name="rankcore-http", daemon=True)
        self.thread.start()
        if data_plane == "direct":
            from . import haproxy

            grpc_proxy = None
            if self.grpc_public is not None:
                self.ready()  # (the proxy's gRPC server started first: HAProxy sends it what is not direct)
                grpc_proxy = f"127.0.0.1:{self.grpc.address[1]}"
            opts = haproxy.Options(proxy=f"127.0.0.1:{sock.getsockname()[1]}", listen_fd=self.public.fileno(),
                                   request_timeout_s=request_timeout_s, header_timeout_s=header_timeout_s,
                                   max_connections=max_connections,
                                   grpc_fd=self.grpc_public.fileno() if self.grpc_public is not None else None,
                                   grpc_proxy=grpc_proxy)
            self.plane = haproxy.DataPlane(opts, self._direct_routes, request_timeout_s, max_body_bytes,
                                           max_header_bytes, access.enabled, logs_dir,
                                           tuple(grpc_servicer_functions) if grpc_proxy else (),
                                           on_answered=self._balancer_answered)

    def _balancer_answered(self, answer: Any, route: Any) -> None:
        """``haproxy.DataPlane``'s log thread: an answer HAProxy gave itself, counted on the server's
        loop (a gRPC call's in Serve's gRPC metrics, with the code HAProxy ended it with)."""
        self.ready()
        deployment = route.deployment if route is not None else ""
        if answer.grpc_code is not None:
            self.loop.call_soon_threadsafe(functools.partial(
                self.state.metrics.grpc_request, method=answer.path, deployment=deployment, code=answer.grpc_code,
                latency_ms=answer.latency_ms))
            return
        self.loop.call_soon_threadsafe(self.state.balancer_answered, answer.method, answer.path, answer.status,
                                       answer.latency_ms, answer.nbytes, answer.request_id,
                                       route.prefix if route is not None else "", deployment)

    def data_plane(self) -> dict:
        """What carries deployments' requests: ``{"data_plane": "proxy"}``, or for the direct one its
        routes (``prefix``, ``direct``, servers ``(replica, address, ready, maxconn, grpc address)``),
        the commands and reloads carried out and the failures to (tests, the status page)."""
        if self.plane is None:
            return {"data_plane": "proxy"}
        return {"data_plane": "direct", **self.plane.info()}

    def _direct_routes(self) -> list[tuple[str, str, str, bool, Any]]:
        """The routes the direct data plane holds: ``(deployment, prefix, application, asgi, router)``,
        the router told to wake the plane at each pool answer."""
        out = []
        st = self.state
        for prefix, name in list(st.routes.items()):
            handle = st.handles.get(name)
            router = getattr(handle, "_router", None)
            if router is None:
                continue
            if self.plane is not None and self.plane.changed not in router.listeners:
                router.listeners.append(self.plane.changed)
            out.append((name, prefix, appnames.of(name), st.methods.get(name, _UNKNOWN).asgi, router))
        return out

    async def _serve(self, sock: socket.socket, host: str, grpc_port: int | None) -> None:
        self.loop = asyncio.get_running_loop()
        if self.grpc is not None:
            try:
                await self.grpc.start(host, grpc_port or 0)
            except BaseException as exc:  # (ready() says so; its HTTP port is given back)
                self.grpc_error = exc
                sock.close()
                return
        try:
            await self.server.serve(sockets=[sock])
        finally:
            if self.grpc is not None:
                await self.grpc.stop()

    def ready(self, timeout: float = 30.0) -> tuple[str, int]:
        """The address once the server accepts connections."""
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self.grpc_error is not None:
                raise RuntimeError(f"the proxy's gRPC server did not start: {self.grpc_error}")
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP ingress did not start on {self.state.address}")
            time.sleep(0.01)
        return self.state.address

    def grpc_address(self) -> tuple[str, int] | None:
        """The gRPC server's address (None: this proxy serves no gRPC): on the direct data plane with
        gRPC, HAProxy's public one."""
        self.ready()
        if self.grpc_public is not None:
            return (self.state.address[0], self.grpc_public.getsockname()[1])
        return self.grpc.address if self.grpc is not None else None

    def set_grpc_services(self, grpc_port: int | None, servicer_functions: tuple[str, ...]) -> tuple[str, int]:
        """Serve the services of ``servicer_functions`` over gRPC from now on (``Proxies.set_grpc``): the
        running gRPC server learns them at once (``GrpcFront.set_services``); a proxy that serves no gRPC
        starts its gRPC server on ``grpc_port`` (0 or None: any free port), on the same loop. HTTP and
        the calls under way are untouched. Its gRPC address."""
        from ..base.grpc_proxy import GrpcFront

        self.ready()
        with self._grpc_lock:
            if self.grpc is not None:
                self.grpc.set_services(tuple(servicer_functions))
                if self.grpc_public is not None:  # (the direct data plane's replicas serve them too)
                    self.plane.set_grpc_services(tuple(servicer_functions))
                    return (self.state.address[0], self.grpc_public.getsockname()[1])
                return self.grpc.address
            front = GrpcFront(self.state, tuple(servicer_functions), _cancel)
            asyncio.run_coroutine_threadsafe(front.start(self.state.address[0], grpc_port or 0), self.loop).result(30)
            if self.state.draining:
                asyncio.run_coroutine_threadsafe(front.draining(True), self.loop).result(10)
            self.grpc = front
            return front.address

    def stack_info(self) -> dict:
        """Its event loop and HTTP parser (``server_stack``)."""
        return {"loop": self.stack[0], "http": self.stack[1]}

    def grpc_codes(self) -> dict[str, int]:
        """gRPC answers by status code (``OK``, ``CANCELLED``, ``NOT_FOUND`` ...)."""
        return dict(self.grpc.codes) if self.grpc is not None else {}

    def add_route(self, prefix: str, handle: Any, methods: Reachable | None = None) -> dict[str, str]:
        """Route ``prefix`` to ``handle``'s deployment (replacing the deployment's earlier
        route); a prefix another deployment holds is refused. ``methods``: what its class may be
        called by (``public_methods``; None: ``Reachable.unknown()``, only ``__call__`` over HTTP)."""
        check_route_prefix(prefix)
        with self._routes_lock:  # (the actor's calls run on up to 16 threads: no change is lost)
            return self._add_route(prefix, handle, methods)

    def _add_route(self, prefix: str, handle: Any, methods: Reachable | None) -> dict[str, str]:
        deployment = handle.name
        st = self.state
        appnames.invalidate()  # (serve.run named the application before it routed it: seen from now on)
        holder = st.routes.get(prefix)
        if holder is not None and holder != deployment:
            raise rc.InvalidConfig(f"route_prefix {prefix!r} already routes to deployment {holder!r}")
        new, _ = _without(st.routes, {}, deployment)
        new[prefix] = deployment
        st.methods = {**st.methods, deployment: methods if isinstance(methods, Reachable) else Reachable.unknown()}
        st.handles = {**st.handles, deployment: handle}
        st.routes = new
        _save_routes(new, st.handles, st.methods)
        self._plane_changed()
        return dict(new)

    def set_methods(self, methods: dict[str, Reachable]) -> bool:
        """The callable methods of deployments it routes, read again (``refresh_methods``); one it
        does not route is left out. Whether anything changed."""
        st = self.state
        with self._routes_lock:
            changed = _changed_methods(st.methods, methods)
            if changed:
                st.methods = {**st.methods, **changed}
                _save_routes(st.routes, st.handles, st.methods)
                self._plane_changed()
        return bool(changed)

    def _plane_changed(self) -> None:
        """The routes changed: the direct data plane (if any) follows."""
        if self.plane is not None:
            self.plane.changed()

    def remove_route(self, deployment: str) -> dict[str, str]:
        st = self.state
        with self._routes_lock:
            st.routes, st.handles = _without(st.routes, st.handles, deployment)
            st.methods = {d: m for d, m in st.methods.items() if d != deployment}
            _save_routes(st.routes, st.handles, st.methods)
            self._plane_changed()
            return dict(st.routes)

    def routes(self) -> dict[str, str]:
        return dict(self.state.routes)

    def reload_routes(self) -> dict[str, str]:
        """The routes as the head's proxy saved them (another node's proxy, after a route changed)."""
        st = self.state
        appnames.invalidate()
        with self._routes_lock:
            st.routes, st.handles, st.methods = _load_routes()
            self._plane_changed()
            return dict(st.routes)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (``StopProxy``, the controller's ``reset``, before this actor is killed): the
        server closes its listening socket, so the port is free once this returns (the direct data
        plane's HAProxy, which holds it too, finishes its connections and exits first)."""
        if self.plane is not None:
            self.plane.stop()
            self.public.close()
            if self.grpc_public is not None:
                self.grpc_public.close()
        self.server.should_exit = True
        self.thread.join(timeout)
        self._gone.set()

    # ------------------------------------------------ the controller's side (control/proxies.py)
    def identity(self) -> tuple[str, str]:
        """(proxy id the core gave it, its node): what a restarted controller adopts."""
        return self.proxy_id, self.node_id

    def set_draining(self, draining: bool) -> None:
        """``DrainProxy``: ``/-/healthz`` answers 503 while draining (200 again when not); gRPC's
        health service says NOT_SERVING."""
        self.state.draining = bool(draining)
        if self.grpc is not None:
            asyncio.run_coroutine_threadsafe(self.grpc.draining(bool(draining)), self.loop).result(10)

    def check_health(self) -> int:
        """Alive and serving: how many requests are in flight (a drain ends at none)."""
        if not self.thread.is_alive():
            raise RuntimeError("the proxy's server thread has stopped")
        return self.state.ongoing

    @ray.method(concurrency_group="watch")
    def watch(self) -> None:
        """Pending until this proxy stops: the controller sees its death at once (in a concurrency
        group of its own: the other calls' threads stay free)."""
        self._gone.wait()

    def configure(self, max_body_bytes: int | None = None, request_timeout_s: Any = "keep",
                  enable_access_log: bool | None = None, *, header_timeout_s: Any = "keep",
                  max_header_bytes: int | None = None, max_connections: Any = "keep") -> dict:
        """Change the limits of this running proxy (None or ``"keep"``: leave one as it is; a
        connection limit applies to the next event of every connection), and turn its access
        records on or off (None: as they are). This proxy's only: ``start_ingress`` changes every
        proxy's and stores them for the proxies started later (``_configure_all``)."""
        st = self.state
        most = st.max_body_bytes if max_body_bytes is None else max_body_bytes
        timeout = st.request_timeout_s if request_timeout_s == "keep" else request_timeout_s
        head_s = st.header_timeout_s if header_timeout_s == "keep" else header_timeout_s
        head_bytes = st.max_header_bytes if max_header_bytes is None else max_header_bytes
        conns = st.max_connections if max_connections == "keep" else max_connections
        check_limits(most, timeout)
        check_connection_limits(head_s, head_bytes, conns)
        if enable_access_log is not None:
            st.access.enabled = check_enable_access_log(enable_access_log)
        st.max_body_bytes, st.request_timeout_s = most, timeout
        st.header_timeout_s, st.max_header_bytes, st.max_connections = head_s, head_bytes, conns
        if self.plane is not None:  # (HAProxy reloaded with them, the replicas' servers told)
            self.plane.set_limits(request_timeout_s=timeout, header_timeout_s=head_s, max_connections=conns,
                                  max_body_bytes=most, max_header_bytes=head_bytes,
                                  enable_access_log=st.access.enabled)
        return {"max_body_bytes": most, "request_timeout_s": timeout, "enable_access_log": st.access.enabled,
                "header_timeout_s": head_s, "max_header_bytes": head_bytes, "max_connections": conns}

    def connections(self) -> dict:
        """The connections the HTTP server holds now, and this process's id (its memory: the tests')."""
        return {"open": len(self.server.server_state.connections), "pid": os.getpid()}

    def access_records(self, n: int | None = None) -> dict:
        """The last ``n`` access records kept (all of them: ``access.KEEP``), whether records are
        written, and the file they go to. On the direct data plane, the records of the replicas it
        sends requests to are merged in by time (each replica keeps its last ``KEEP``; one that does
        not answer within ``CONTROLLER_METRICS_TIMEOUT_S`` is left out, and one that left is in the
        file only)."""
        acc = self.state.access
        records = acc.last(n)
        if self.plane is not None:
            actors = list(self.plane.replicas().values())
            refs = [a.access_records.remote(n) for a in actors]
            done, _late = ray.wait(refs, num_returns=len(refs), timeout=CONTROLLER_METRICS_TIMEOUT_S)
            for ref in done:
                try:
                    records += ray.get(ref)
                except Exception:  # (a replica that died since)
                    pass
            records.sort(key=lambda r: r["time"])
            records = records if n is None else records[-n:] if n > 0 else []
        return {"enabled": acc.enabled, "path": acc.path, "records": records}


def server_stack() -> tuple[str, str]:
    """The proxy's event loop and HTTP parser: ``uvloop`` and ``httptools`` where installed (the
    ``http`` extra installs both; docs/benchmarks.md measured them), else asyncio's loop and
    ``h11``. ``RANKCORE_HTTP_LOOP`` (``uvloop`` / ``asyncio``) and ``RANKCORE_HTTP_PARSER``
    (``httptools`` / ``h11``) choose one (the benchmark compares them)."""
    import importlib.util

    loop = os.environ.get("RANKCORE_HTTP_LOOP") or ("uvloop" if importlib.util.find_spec("uvloop") else "asyncio")
    parser = os.environ.get("RANKCORE_HTTP_PARSER") or (
        "httptools" if importlib.util.find_spec("httptools") else "h11")
    if loop not in ("uvloop", "asyncio") or parser not in ("httptools", "h11"):
        raise rc.InvalidConfig(f"RANKCORE_HTTP_LOOP must be uvloop or asyncio and RANKCORE_HTTP_PARSER httptools "
                               f"or h11, got {loop!r} and {parser!r}")
    return loop, parser


def check_port(host: str | None, port: int | None) -> None:
    """``rankcore.InvalidConfig`` now when the head's proxy could not listen on ``host:port``
    (defaults as ``start_ingress``'s), in ``_listen``'s words: ``rankcore serve`` asks before it
    starts a local Ray, so a port in use is named at once, not after the proxy's start fails."""
    _listen(host or DEFAULT_HOST, DEFAULT_PORT if port is None else port, remember=False).close()


def _listen(host: str, port: int, remember: bool = True) -> socket.socket:
    """The listening socket. Port 0 (any free port): the port an earlier incarnation of the
    head's proxy bound, where it is free, so that a restarted one keeps its address
    (``remember``: the head's proxy; another node's binds any free port each time)."""
    tries = [port]
    if port == 0 and remember:
        last = persist.load_http_port()
        if last:
            tries.insert(0, last)
    for i, p in enumerate(tries):
        # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say TCP, and
        # with it on, a keep-alive answer's body waits for the client's delayed ACK (40 ms)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((host, p))
        except OSError as exc:
            sock.close()
            if i + 1 < len(tries):
                continue
            raise rc.InvalidConfig(f"the HTTP ingress cannot listen on {host}:{port}: {exc}") from None
        sock.listen(2048)
        if remember:
            persist.save_http_port(sock.getsockname()[1])
        return sock
    raise AssertionError("unreachable")


def check_limits(max_body_bytes: Any, request_timeout_s: Any) -> None:
    """A body's limits as every server here takes them (``rankcore.InvalidConfig`` naming the bad one)."""
    if type(max_body_bytes) is not int or max_body_bytes < 0:
        raise rc.InvalidConfig(f"max_body_bytes must be an int >= 0, got {max_body_bytes!r}")
    if request_timeout_s is not None and (isinstance(request_timeout_s, bool) or
                                          not isinstance(request_timeout_s, (int, float)) or request_timeout_s <= 0):
        raise rc.InvalidConfig(f"request_timeout_s must be a number > 0 or None, got {request_timeout_s!r}")


def check_connection_limits(header_timeout_s: Any, max_header_bytes: Any, max_connections: Any) -> None:
    """A connection's limits as ``guarded`` enforces them (``rankcore.InvalidConfig`` naming the bad one)."""
    if header_timeout_s is not None and (isinstance(header_timeout_s, bool) or
                                         not isinstance(header_timeout_s, (int, float)) or not header_timeout_s > 0):
        raise rc.InvalidConfig(f"header_timeout_s must be a number > 0 or None, got {header_timeout_s!r}")
    if type(max_header_bytes) is not int or max_header_bytes < 1024:
        raise rc.InvalidConfig(f"max_header_bytes must be an int >= 1024, got {max_header_bytes!r}")
    if max_connections is not None and (type(max_connections) is not int or max_connections < 1):
        raise rc.InvalidConfig(f"max_connections must be an int >= 1 or None, got {max_connections!r}")


def _save_routes(routes: dict[str, str], handles: dict[str, Any], methods: dict[str, Reachable]) -> None:
    """The route table, and per deployment its handle with the methods it may be called by
    (``persist.save_http_routes``: each deployment's ``(handle, methods)``)."""
    persist.save_http_routes(routes, {d: (h, methods.get(d)) for d, h in handles.items()})


def _load_routes() -> tuple[dict[str, str], dict[str, Any], dict[str, Reachable]]:
    """What ``_save_routes`` stored: routes, handles, methods (a bare handle, or methods saved
    before issue 64 as a plain list: ``Reachable.unknown()``, only ``__call__`` over HTTP)."""
    routes, saved = persist.load_http_routes()
    handles, methods = {}, {}
    for d, v in saved.items():
        handles[d], reach = v if isinstance(v, tuple) else (v, None)
        methods[d] = reach if isinstance(reach, Reachable) else Reachable.unknown()
    return routes, handles, methods


def _without(routes: dict[str, str], handles: dict[str, Any], deployment: str) -> tuple[dict, dict]:
    """The route table and handles with ``deployment``'s gone."""
    return ({p: d for p, d in routes.items() if d != deployment},
            {d: h for d, h in handles.items() if d != deployment})


# ------------------------------------------------------------------ the driver's side
def start_ingress(host: str | None = None, port: int | None = None, *, max_body_bytes: int | None = None,
                  request_timeout_s: Any = "keep", enable_access_log: bool | None = None,
                  logs_dir: str | None = None, proxy_location: Any = None,
                  worker_port: int | None = None, proxy_options: rc.ProxyOptions | None = None,
                  grpc_port: int | None = None,
                  grpc_servicer_functions: Any = (), header_timeout_s: Any = "keep",
                  max_header_bytes: int | None = None, max_connections: Any = "keep",
                  data_plane: str | None = None) -> tuple[Any, tuple[str, int]]:
    """The head node's proxy and its address: the running one, or the proxies started. The
    core decides where proxies run (``proxy_location``, Ray Serve's names and default:
    ``EveryNode``, the head and every node that holds a replica; ``HeadOnly``; ``Disabled``)
    and the controller starts, drains, stops and restarts them (control/proxies.py). Each
    binds ``host`` (default 127.0.0.1) and ``port`` (default 8000; 0: any free port) on its
    node; ``worker_port`` (default: ``port``) is what the other nodes' proxies bind (0 on a
    one-host test cluster: any free port each). A running set of proxies on another host or
    port raises ``rankcore.InvalidConfig``; new limits (and ``enable_access_log``) are applied to
    every running proxy and stored with the proxies' settings (``_configure_all``), so a proxy the
    controller starts later (restarted after a crash, on another node) has them too.
    ``enable_access_log`` (Serve's ``LoggingConfig`` field; None: the running proxy's, else
    ``access.ENABLE_ACCESS_LOG``) and ``logs_dir`` (where its ``access.jsonl`` goes; a new
    proxy's only): docs/metrics.md. ``proxy_options`` (``rankcore.ProxyOptions``: the drain's
    minimum, the ready timeout ...) instead of ``proxy_location`` alone. ``grpc_servicer_functions``
    (import paths of generated ``add_XServicer_to_server``; Serve's ``gRPCOptions``) turns on gRPC
    beside HTTP on ``grpc_port`` (default 9000, Serve's; base/grpc_proxy.py). The connection
    limits (``header_timeout_s``, ``max_header_bytes``, ``max_connections``; ``"keep"`` / None: as
    they are, the defaults on a new proxy) are ``ProxySettings`` fields as the other two.
    ``data_plane`` (``haproxy.DATA_PLANES``; None: the running proxies', else ``haproxy.default_data_plane``:
    "proxy", or "direct" with Serve's ``RAY_SERVE_ENABLE_HA_PROXY=1``): "direct" puts
    an HAProxy on each proxy's port that sends a deployment's plain requests straight to its replicas'
    own HTTP servers (ingress/haproxy.py); proxies that run with another are refused
    (``rankcore.InvalidConfig``): ``serve.shutdown()`` first."""
    from ..base.grpc_proxy import DEFAULT_GRPC_PORT, check_servicer_functions
    from ..control.controller import controller_actor
    from ..control.proxies import ProxySettings
    from .haproxy import check_data_plane, default_data_plane

    if data_plane is not None:
        check_data_plane(data_plane)
    servicers = check_servicer_functions(grpc_servicer_functions)
    asked_port = grpc_port  # (None: the running one's, or the default for new proxies)
    if servicers and grpc_port is None:
        grpc_port = DEFAULT_GRPC_PORT
    for name, value in (("port", port), ("worker_port", worker_port), ("grpc_port", grpc_port)):
        if value is not None and (type(value) is not int or not 0 <= value <= 65535):
            raise rc.InvalidConfig(f"{name} must be an int in 0..65535, got {value!r}")
    if enable_access_log is not None:
        check_enable_access_log(enable_access_log)
    check_connection_limits(HEADER_TIMEOUT_S if header_timeout_s == "keep" else header_timeout_s,
                            MAX_HEADER_BYTES if max_header_bytes is None else max_header_bytes,
                            MAX_CONNECTIONS if max_connections == "keep" else max_connections)
    if proxy_options is not None and proxy_location is not None:
        raise rc.InvalidConfig("give proxy_location or proxy_options (which has one), not both")
    options = proxy_options if proxy_options is not None else (
        rc.ProxyOptions() if proxy_location is None else rc.ProxyOptions(proxy_location=proxy_location))
    actor: Any
    try:
        actor = ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)
    except ValueError:
        check_limits(MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes,
                     REQUEST_TIMEOUT_S if request_timeout_s == "keep" else request_timeout_s)
        settings = ProxySettings(
            host=host or DEFAULT_HOST, port=DEFAULT_PORT if port is None else port, worker_port=worker_port,
            max_body_bytes=MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes,
            request_timeout_s=REQUEST_TIMEOUT_S if request_timeout_s == "keep" else request_timeout_s,
            header_timeout_s=HEADER_TIMEOUT_S if header_timeout_s == "keep" else header_timeout_s,
            max_header_bytes=MAX_HEADER_BYTES if max_header_bytes is None else max_header_bytes,
            max_connections=MAX_CONNECTIONS if max_connections == "keep" else max_connections,
            enable_access_log=_next["enable_access_log"] if enable_access_log is None else enable_access_log,
            logs_dir=logs_dir, options=options, actor_class=HttpIngress,
            grpc_port=grpc_port if servicers else None, grpc_servicer_functions=servicers,
            data_plane=data_plane or default_data_plane())
        try:
            explicit = proxy_location is not None or proxy_options is not None
            name = ray.get(controller_actor().start_proxies.remote(settings, set_options=explicit))
        except RayTaskError as exc:
            if isinstance(exc.cause, rc.RankcoreError):
                raise exc.cause from None
            raise
        if not name:
            raise rc.InvalidConfig("proxy_location=Disabled: no proxy runs, so nothing serves HTTP") from None
        actor = ray.get_actor(name, namespace=NAMESPACE)
    else:
        running = persist.load_proxies()
        runs = getattr(running[0], "data_plane", "proxy") if running is not None else None
        if data_plane is not None and runs is not None and runs != data_plane:
            raise rc.InvalidConfig(f"the proxies run with data_plane={runs!r}, not {data_plane!r}: "
                                   f"it is chosen when they start (serve.shutdown() first)")
        if proxy_location is not None or proxy_options is not None:  # (where they run may change)
            ray.get(controller_actor().set_proxy_options.remote(options))
        if servicers:  # (gRPC asked of proxies that run: services they lack are added, on their gRPC port)
            _add_grpc_services(servicers, asked_port, grpc_port)
    deadline = time.monotonic() + 60.0
    while True:
        try:
            address = ray.get(actor.ready.remote())
            break
        except RayActorError as exc:  # (one the core gave up on: its successor takes the name)
            try:
                failure = ray.get(controller_actor().head_proxy_failure.remote(), timeout=10)
            except Exception:  # (the controller restarting: waited out as the proxy is)
                failure = None
            if failure is not None:  # (its start fails: the reason, not a minute's wait)
                raise rc.InvalidConfig(failure) from None
            if time.monotonic() > deadline:
                cause = getattr(exc, "cause", None) or exc
                raise rc.InvalidConfig(f"the HTTP ingress did not start: {cause}") from None
            time.sleep(0.2)
            try:
                actor = ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)
            except ValueError:
                pass
    if (host is not None and host != address[0]) or (port not in (None, 0) and port != address[1]):
        raise rc.InvalidConfig(f"the HTTP ingress already runs on {address[0]}:{address[1]}, not "
                               f"{host or address[0]}:{port if port is not None else address[1]} (one ingress per "
                               f"cluster: leave port out to use it)")
    connection: dict[str, Any] = {}
    if header_timeout_s != "keep":
        connection["header_timeout_s"] = header_timeout_s
    if max_header_bytes is not None:
        connection["max_header_bytes"] = max_header_bytes
    if max_connections != "keep":
        connection["max_connections"] = max_connections
    if max_body_bytes is not None or request_timeout_s != "keep" or enable_access_log is not None or connection:
        _configure_all(actor, max_body_bytes=max_body_bytes, request_timeout_s=request_timeout_s,
                       enable_access_log=enable_access_log, **connection)
    return actor, tuple(address)


def _add_grpc_services(servicers: tuple[str, ...], asked_port: int | None, grpc_port: int | None) -> None:
    """(``start_ingress``, proxies running.) Services of ``servicers`` the proxies lack are served by
    them from now on, applications untouched (``Proxies.set_grpc``; gRPC started on ``grpc_port`` where
    it was off); another port than their gRPC one, or a set that leaves one of theirs out, is refused."""
    import attrs

    from ..base.grpc_proxy import servicer_methods
    from ..control.controller import controller_actor

    running = ray.get(controller_actor().proxy_settings.remote())
    if running is None:
        return
    if running.grpc_port is not None and asked_port not in (None, 0) and asked_port != running.grpc_port:
        raise rc.InvalidConfig(f"the proxies serve gRPC on grpc_port={running.grpc_port}, not {asked_port} (one "
                               f"gRPC port a cluster: leave grpc_port out to add services to them)")
    if set(servicers) == set(running.grpc_servicer_functions):
        return
    servicer_methods(servicers)  # (each registers a service: refused here, not in every proxy)
    settings = attrs.evolve(running, grpc_servicer_functions=tuple(servicers),
                            grpc_port=running.grpc_port if running.grpc_port is not None else grpc_port)
    try:
        ray.get(controller_actor().start_proxies.remote(settings, set_options=False))
    except RayTaskError as exc:
        if isinstance(exc.cause, rc.RankcoreError):
            raise exc.cause from None
        raise


def proxies(timeout: float = 60.0) -> dict:
    """Each proxy the core runs: proxy id -> its node, actor name, phase (the core's) and address
    (a controller restarting is waited out)."""
    from ray.exceptions import ActorUnavailableError

    from ..control.controller import controller_actor

    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get(controller_actor().proxies.remote())
        except (ActorUnavailableError, RayActorError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


#: what the next ingress this process starts is given where ``start_ingress`` is not told (``set_access_log``)
_next: dict[str, Any] = {"enable_access_log": ENABLE_ACCESS_LOG}


def set_access_log(enabled: bool) -> None:
    """Turn the running ingress's access records on or off (Serve's
    ``logging_config.enable_access_log``); with no ingress running, the next one starts so."""
    check_enable_access_log(enabled)
    try:
        actor = ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)
    except ValueError:
        _next["enable_access_log"] = enabled
        return
    _configure_all(actor, enable_access_log=enabled)


def expose(handle: Any, route_prefix: str | None = None, port: int | None = None,
           host: str | None = None) -> str:
    """Route ``route_prefix`` (default ``/<deployment>``) of the ingress (started if need be)
    to ``handle``'s deployment (a ``DeploymentHandle``: ``run`` returns one,
    ``get_deployment_handle`` makes one); returns the route's URL."""
    prefix = check_route_prefix(f"/{handle.name}" if route_prefix is None else route_prefix)
    actor, (h, p) = start_ingress(host, port)
    try:
        ray.get(actor.add_route.remote(prefix, handle, _methods_of(handle.name)))
    except RayTaskError as exc:
        if isinstance(exc.cause, rc.RankcoreError):
            raise exc.cause from None
        raise
    _reload_others()
    return f"http://{h}:{p}{'' if prefix == '/' else prefix}"


def _changed_methods(known: dict[str, Reachable], fresh: dict[str, Reachable]) -> dict[str, Reachable]:
    """The lists of ``fresh`` that differ from ``known``'s, for deployments ``known`` routes."""
    return {d: m for d, m in fresh.items() if d in known and known[d] != m}


def refresh_methods(deployments: Any) -> None:
    """The callable methods of each of ``deployments`` that has a route, read again from the class
    the controller now holds (``run`` of new code keeps a route: a method the new class adds is
    served, one it drops answers 404 before anything is sent). A deployment with no route, or
    classes this process cannot read: nothing changes."""
    routed = set(_load_routes()[2]) & set(deployments)  # (the head's proxy saves every change)
    if not routed:
        return
    try:
        specs = persist.load_specs() or {}
    except Exception:  # (a class this process cannot import: the lists stay as they are)
        return
    fresh = {d: public_methods(specs[d].get("cls")) for d in routed if isinstance(specs.get(d), dict)}
    if not fresh:
        return
    from ray.exceptions import ActorDiedError

    for attempt in range(3):
        try:
            changed = ray.get(ray.get_actor(INGRESS_NAME, namespace=NAMESPACE).set_methods.remote(fresh))
        except (ValueError, ActorDiedError):  # (none runs, or it died: the routes a started one loads)
            routes, handles, known = _load_routes()
            changed = _changed_methods(known, fresh)
            if changed:
                _save_routes(routes, handles, {**known, **changed})
        except RayActorError:  # (unreachable a moment: alive, so it is asked again)
            if attempt < 2:
                time.sleep(0.5)
                continue
            log.warning("the routes' methods of %s were not refreshed: the ingress did not answer", sorted(fresh))
            return
        if changed:
            _reload_others()
        return


def _reload_others() -> None:
    """The other nodes' proxies take the routes the head's saved (a new one loads them as it starts)."""
    _on_others(lambda actor: actor.reload_routes.remote())


def _configure_all(head: Any, **changes: Any) -> dict:
    """``changes`` (``HttpIngress.configure``'s keywords) applied to the head's proxy (which checks
    them), then what it runs with stored in the proxies' settings (``proxies.save_configured``: a
    proxy the controller starts from now on, restarted or on another node, starts with it) and
    applied to the other nodes' proxies. Returns what the head's runs with."""
    from ..control.proxies import save_configured

    now = ray.get(head.configure.remote(**changes))
    save_configured(now)
    _on_others(lambda actor: actor.configure.remote(**now))
    return now


def _on_others(call: Any) -> None:
    """``call(actor)`` (a remote call) for each other node's proxy, waited for (one going away is
    skipped: its successor starts from what is stored)."""
    from ..control.proxies import proxy_names

    refs = []
    for name in proxy_names():
        if name != INGRESS_NAME:
            try:
                refs.append(call(ray.get_actor(name, namespace=NAMESPACE)))
            except ValueError:
                pass
    for ref in refs:
        try:
            ray.get(ref, timeout=10)
        except Exception:  # (one going away: its successor loads them)
            pass


def unexpose(deployment: str) -> None:
    """Drop ``deployment``'s route (it was deleted): through the running ingress, else from the
    routes a restarted one would load. Called by ``api.delete``; nothing to drop is fine."""
    try:
        actor = ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)
    except ValueError:
        routes, handles, methods = _load_routes()
        if deployment in routes.values() or deployment in handles:
            _save_routes(*_without(routes, handles, deployment), methods)
        return
    ray.get(actor.remove_route.remote(deployment))
    _reload_others()


def ingress_address() -> tuple[str, int] | None:
    """The running ingress's address, or None."""
    try:
        actor = ray.get_actor(INGRESS_NAME, namespace=NAMESPACE)
    except ValueError:
        return None
    return tuple(ray.get(actor.ready.remote()))

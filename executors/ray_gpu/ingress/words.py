"""The ingress's settings and pure rules: its defaults and limits (Ray Serve's where it has one), what a
route prefix may be and the pattern it matches, how a failure is logged, the checks of a port and of
the limits a caller sets. No I/O; split from ``http`` (issue 66).
"""

from __future__ import annotations

import functools
import json
import logging
import traceback
from typing import Any

import rankcore as rc

from ..base.exposed import Reachable
from ..base.httpwords import ANSI as _ANSI
from ..base.httpwords import METRICS_PATH

#: the ingress's one logger, named as it was before the split (its records keep their name)
log = logging.getLogger("executors.ray_gpu.ingress.http")

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
#: the methods a refused request's record may name (its ``method`` label: another token is "", so a
#: hostile client cannot grow the metrics' label sets)
_HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"})


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


def _changed_methods(known: dict[str, Reachable], fresh: dict[str, Reachable]) -> dict[str, Reachable]:
    """The lists of ``fresh`` that differ from ``known``'s, for deployments ``known`` routes."""
    return {d: m for d, m in fresh.items() if d in known and known[d] != m}

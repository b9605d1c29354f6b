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

This module is the ingress's face and the driver's side (``start_ingress``, ``expose``,
``proxies``, ...); the rest is split by seam (issue 66): ``words`` (settings and pure rules),
``calls`` (a handle behind two functions), ``app`` (``IngressState``, ``make_app``), ``limits``
(``guarded``), ``status`` (the status page) and ``actor`` (``HttpIngress``). Its ``__all__``
names stay importable from here.
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

import rankcore as rc

from ..base import persist
from ..base.access import (
    ENABLE_ACCESS_LOG,
    check_enable_access_log,
)
from ..base.httpwords import (
    MAX_ERROR_MESSAGE,
    MAX_JSON_DEPTH,
    METRICS_PATH,
    Reply,
    args_of,
    match_prefix,
    match_route,
    not_found_text,
    read_json,
    status_of,
)
from ..control.controller import INGRESS_NAME, NAMESPACE
from .actor import HttpIngress, _load_routes, _save_routes, _without, check_port
from .app import IngressState, make_app
from .calls import ClientGone, _methods_of, public_methods
from .limits import guarded
from .words import (
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
    log,
)

__all__ = ["INGRESS_NAME", "check_port", "DEFAULT_HOST", "DEFAULT_PORT", "MAX_BODY_BYTES", "REQUEST_TIMEOUT_S", "HEADER_TIMEOUT_S",
           "MAX_HEADER_BYTES", "MAX_CONNECTIONS", "MAX_JSON_DEPTH", "MAX_ERROR_MESSAGE", "match_prefix", "match_route",
           "not_found_text", "HttpIngress",
           "start_ingress", "expose", "refresh_methods", "ingress_address", "proxies", "args_of", "read_json", "status_of", "check_route_prefix",
           "make_app", "IngressState", "Reply", "ClientGone", "guarded", "check_limits", "check_connection_limits",
           "set_access_log", "METRICS_PATH"]


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

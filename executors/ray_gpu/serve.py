"""Ray Serve's names, so that a Serve app ports by changing one import (issue 64)::

    from ray import serve                  # before
    from executors.ray_gpu import serve    # after

Each name here is rankcore's own implementation under Serve's name and signature (``deployment``,
``ingress``, ``run``, ``batch``, ``multiplexed``, ``get_multiplexed_model_id``, ``get_replica_context``,
``get_app_handle``, ``get_deployment_handle``, ``delete``, ``status``, ``shutdown``, ``start``,
``DeploymentHandle``, ``DeploymentResponse``, ``Application``, ``Deployment``, ``HTTPOptions``,
``gRPCOptions``, ``grpc_util.RayServegRPCContext``: a method taking ``grpc_context`` gets one over gRPC,
``base.grpc_context``; ``metrics.Counter``, ``metrics.Gauge``, ``metrics.Histogram``, the user's own
metrics: ``replica.user_metrics``). A name of Ray Serve's that rankcore has no equivalent for (``run_many`` ...) raises
``NoEquivalent`` when it is used, saying so and what to use instead; a name Ray Serve does not have
either is an ``AttributeError``. docs/ray.md, "Porting a Serve app".

HTTP as in Serve: a class deployed with this module's ``deployment`` gets, at every path under its
route prefix, a starlette ``Request`` in ``__call__`` (``replica.asgi``); under ``@ingress(app)`` its
FastAPI (or any ASGI) app answers. (rankcore's own ``deployment`` keeps its JSON calls: the body's
JSON is the arguments, ``<route>/<method>`` a method marked ``@http_method``.)

Applications: ``run(app, name=...)`` names its deployments' application in Ray's KV store
(``base.appnames``: metrics, ``/-/routes``, gRPC routing and status read it), so
``get_app_handle(name)`` and ``delete(name)`` find them from any process (this process also keeps
them, its ingress first); a name applied from a config file (``rankcore deploy``) is found in what
``api.apps`` keeps.
"""

from __future__ import annotations

import inspect
import logging
import sys
import time
from typing import Any

import rankcore as rc

from .api.config import GRPCOptions as gRPCOptions
from .api.config import HTTPOptions, options_from
from .api.deployments import Application, Deployment, DeploymentHandle, DeploymentResponse
from .api.deployments import delete as _delete_deployment
from .api.deployments import deployment as _deployment
from .api.deployments import get_deployment_handle as _handle
from .api.deployments import run as _run
from .base import appnames
from .base import grpc_context as grpc_util
from .base.context import get_replica_context
from .base.exposed import http_method
from .replica import user_metrics as metrics
from .replica.asgi import ingress, request_ingress
from .replica.batching import batch
from .replica.multiplex import get_multiplexed_model_id, multiplexed

__all__ = ["deployment", "ingress", "run", "start", "batch", "multiplexed", "get_multiplexed_model_id", "get_replica_context",
           "get_app_handle", "get_deployment_handle", "delete", "status", "shutdown", "DeploymentHandle",
           "DeploymentResponse", "Application", "Deployment", "HTTPOptions", "gRPCOptions", "http_method",
           "grpc_util", "metrics", "NoEquivalent"]

#: ``from ray.serve.grpc_util import RayServegRPCContext`` ports as
#: ``from executors.ray_gpu.serve.grpc_util import RayServegRPCContext`` (this module is no package:
#: the name is registered, so the import system finds it)
sys.modules.setdefault(f"{__name__}.grpc_util", grpc_util)
sys.modules.setdefault(f"{__name__}.metrics", metrics)  # (``from ray.serve.metrics import Counter`` too)

#: Ray Serve's default application name (``serve.run``'s ``name``)
DEFAULT_APP_NAME = "default"


class NoEquivalent(rc.RankcoreError, NotImplementedError):
    """A Ray Serve name or argument rankcore has no equivalent for (what to use instead is said)."""


def _function_class(fn: Any) -> Any:
    """Serve's function deployment (``@serve.deployment`` on a ``def``): a class named as the function
    whose ``__call__`` calls it (awaited, or its items relayed, as the function is written), so a
    request or a handle call reaches it as a class's ``__call__`` would be reached; anything else as it is."""
    if not inspect.isfunction(fn):
        return fn
    call: Any
    if inspect.isasyncgenfunction(fn):
        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            async for item in fn(*args, **kwargs):
                yield item
    elif inspect.isgeneratorfunction(fn):
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            yield from fn(*args, **kwargs)
    elif inspect.iscoroutinefunction(fn):
        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)
    else:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)
    call.__name__, call.__qualname__ = "__call__", f"{fn.__qualname__}.__call__"
    return type(fn.__name__, (), {"__call__": call, "__module__": fn.__module__, "__qualname__": fn.__qualname__,
                                  "__doc__": fn.__doc__})


def deployment(_func_or_class: Any = None, *args: Any, **options: Any) -> Any:
    """Serve's ``@serve.deployment`` (``@deployment`` or ``@deployment(num_replicas=2, ...)``):
    rankcore's ``deployment`` with Serve's HTTP: ``__call__(self, request)`` gets a starlette
    ``Request`` for each HTTP request under the route prefix (``replica.asgi.request_ingress``; a class
    under ``@ingress(app)`` keeps its app). On a function, as Serve's: the function is called
    (``_function_class``). A first argument that is a string (``@serve.deployment("name", ...)``) is
    ignored, as Serve's decorator ignores it: the deployment keeps its class's name (``name=`` names it)."""
    if isinstance(_func_or_class, str):
        _func_or_class = None
    if _func_or_class is not None:
        return _deployment(request_ingress(_function_class(_func_or_class)), *args, **options)

    def decorate(target: Any) -> Any:
        return _deployment(request_ingress(_function_class(target)), *args, **options)

    return decorate


_log = logging.getLogger(__name__)
#: application name -> its deployments, ingress first (``run`` in this process)
_APPS: dict[str, tuple[str, ...]] = {}


def start(http_options: HTTPOptions | dict | None = None, grpc_options: gRPCOptions | dict | None = None,
          proxy_location: str | None = None, **others: Any) -> None:
    """Start the proxies (``serve.start``): HTTP on ``http_options``' host and port, gRPC when
    ``grpc_options`` names servicer functions; ``proxy_location`` as Serve's."""
    from .api.apps import start_proxies

    if others:
        raise NoEquivalent(f"serve.start({', '.join(sorted(others))}=...): no such option in rankcore "
                           f"(http_options, grpc_options, proxy_location)")
    # (a dict's keys by the config file's rules: keep_alive_timeout_s accepted and ignored, ssl_* refused ...)
    http = options_from(HTTPOptions, http_options, "serve.start(http_options)") if isinstance(http_options, dict) \
        else http_options or HTTPOptions()
    grpc = options_from(gRPCOptions, grpc_options, "serve.start(grpc_options)") if isinstance(grpc_options, dict) \
        else grpc_options or gRPCOptions()
    start_proxies(http, grpc, proxy_location)


def run(target: Application, blocking: bool = False, name: str = DEFAULT_APP_NAME, route_prefix: str | None = "/",
        logging_config: Any = None, _local_testing_mode: bool = False) -> DeploymentHandle:
    """Deploy ``target`` as application ``name`` and wait until it serves (``serve.run``); HTTP at
    ``route_prefix`` (Serve's default ``/``; None: no route); a handle to its ingress. The deployments
    an earlier ``run`` of ``name`` held that ``target`` no longer has are deleted, as Serve does; a
    ``target`` whose ingress is another deployment takes over the route once it serves."""
    if not isinstance(target, Application):
        raise rc.InvalidConfig(f"serve.run takes a bound application (Deployment.bind(...)), got "
                               f"{type(target).__name__}")
    if _local_testing_mode:
        raise NoEquivalent("serve.run(_local_testing_mode=True): rankcore has no local testing mode; its "
                           "simulator runs the same rules without Ray (docs/scenarios.md)")
    if logging_config is not None:
        raise NoEquivalent("serve.run(logging_config=...): rankcore logs through Python's logging as configured")
    names = tuple(d.name for d in target.graph())
    before = _APPS.get(name) or _ran_elsewhere(name)  # (the application as it was: its ingress first)
    appnames.assign(name, names)  # (before its route: the proxy's first answer names the application)
    if route_prefix is not None and before and before[0] not in names:
        # Another graph under the application's name replaces it, as in Serve: the new one runs, then
        # takes the route from the old ingress (deleted below with the rest of the old graph)
        from .ingress.http import expose, unexpose

        handle = _run(target)
        unexpose(before[0])
        expose(handle, route_prefix)
    else:
        handle = _run(target, route_prefix=route_prefix) if route_prefix is not None else _run(target)
    for gone in set(before) - set(names):
        _delete_deployment(gone)
    _APPS[name] = names
    while blocking:  # (Serve's blocking=True: serve until interrupted)
        time.sleep(1.0)
    return handle


def _deployments_of(name: str) -> tuple[str, ...]:
    """The deployments application ``name`` holds, ingress first (``rankcore.InvalidEvent``: none)."""
    if name in _APPS:
        return _APPS[name]
    from .api.apps import applied_apps

    applied = applied_apps().get(name)
    if applied is not None:
        return applied.deployments
    ran = _ran_elsewhere(name)  # (an application another process's serve.run made)
    if ran:
        return ran
    known = sorted({*_APPS, *applied_apps(), *appnames.table(0.0).values()})
    raise rc.InvalidEvent(f"no application {name!r} (applications: {', '.join(known) or 'none'})")


def _ran_elsewhere(name: str) -> tuple[str, ...]:
    """The deployments of application ``name`` as ``appnames`` keeps them (any process's
    ``serve.run``), its routed one (the ingress) first; () when it has none."""
    from .base import persist

    members = sorted(d for d, app in appnames.table(0.0).items() if app == name)
    if not members:
        return ()
    try:
        routed = set(persist.load_http_routes()[0].values())
    except Exception:  # (no route table here: the order is the names')
        routed = set()
    return tuple(sorted(members, key=lambda d: (d not in routed, d)))


def get_app_handle(name: str) -> DeploymentHandle:
    """A handle to application ``name``'s ingress deployment (``serve.get_app_handle``)."""
    return _handle(_deployments_of(name)[0])


def get_deployment_handle(deployment_name: str, app_name: str | None = None, *args: Any, **kwargs: Any
                          ) -> DeploymentHandle:
    """A handle to ``deployment_name`` (``serve.get_deployment_handle``; deployment names are global
    in rankcore, so ``app_name``, when given, must hold it)."""
    if app_name is not None and deployment_name not in _deployments_of(app_name):
        raise rc.InvalidEvent(f"application {app_name!r} has no deployment {deployment_name!r}")
    return _handle(deployment_name)


def delete(name: str, _blocking: bool = True) -> None:
    """Delete application ``name`` and its deployments (``serve.delete``). An application that does
    not exist (deleted already, say) is nothing to do, as in Serve; ``rankcore delete`` says so instead."""
    if name in _APPS:
        for d in _APPS.pop(name):
            _delete_deployment(d, wait=_blocking)
        appnames.forget(name)
        return
    from .api.apps import applied_apps, delete_app

    applied = name in applied_apps()
    ran = () if applied else _ran_elsewhere(name)
    if ran:  # (another process's serve.run)
        for d in ran:
            _delete_deployment(d, wait=_blocking)
        appnames.forget(name)
        return
    if not applied:
        _log.info("serve.delete(%r): no such application, nothing deleted", name)
        return
    delete_app(name, wait=_blocking)


def status() -> dict:
    """What ``rankcore status --json`` prints (Serve's ``serve.status()`` gives a ``ServeStatus``
    object of the same facts: applications, deployments, replicas, proxies)."""
    from .api.apps import status as _status

    return _status()


def shutdown() -> None:
    """Delete every application, stop every replica and proxy (``serve.shutdown``); Ray keeps running."""
    from .api.apps import delete_all

    _APPS.clear()
    delete_all()  # (every application's name too: appnames.forget_all)


#: Ray Serve's names with no equivalent here, and what to use instead
_NO_EQUIVALENT = {
    "run_many": "serve.run_many: call serve.run once per application",
    "shutdown_async": "serve.shutdown_async: call serve.shutdown",
    "get_multiplexed_model_ids": "no such call: a request names one model (get_multiplexed_model_id)",
    "llm": "ray.serve.llm: no equivalent",
    "AutoscalingConfig": "pass autoscaling_config as a dict to @serve.deployment (Serve's keys)",
    "RequestRouter": "Serve's RequestRouter (async choose_replicas over its replica objects) cannot run here: "
                     "choose a router with request_router_config (Serve's class paths work), or write a "
                     "rankcore.requests.Router; docs/routing.md maps each of Serve's hooks to one",
}


def __getattr__(name: str) -> Any:
    why = _NO_EQUIVALENT.get(name)
    if why is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise NoEquivalent(why)

    unavailable.__name__ = name
    return unavailable

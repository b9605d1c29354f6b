"""What a client outside the cluster may call on a deployment (issue 64): only what the user exposed.

Ray Serve sends every path under a route prefix to the ingress's ``__call__``; nothing else of the
class is reachable over HTTP. rankcore keeps that as the default: over HTTP a route calls
``__call__``, and ``<prefix>/<method>`` reaches a method only when the user marked it
``@http_method``. Over gRPC a call names its method by the RPC (as in Serve): the services the
user registered (``grpc_servicer_functions``) are what it exposed. The methods rankcore calls
itself (``reconfigure``, ``check_health``, ``record_routing_stats``, ``__del__``) and
``@multiplexed`` loaders are reachable by neither, whatever they are marked or named: a client
that could call ``reconfigure`` would set the replica's config behind the controller's back.
A method that declares ``grpc_context`` is called over gRPC through its entry
(``__rankcore_grpc__<method>``, ``base.grpc_context``; ``Reachable.grpc_context`` lists them): a name
starting with ``__``, which no client can name.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from rankcore import InvalidConfig

#: ``replica.asgi.ENTRY`` (named here: ``asgi`` imports starlette where it runs, this module nothing)
ASGI_ENTRY = "__rankcore_asgi__"
#: ``replica.asgi.APP_ATTR``: an ``@ingress`` class's app
ASGI_APP_ATTR = "__rankcore_asgi_app__"
#: ``base.grpc_context.ENTRY_PREFIX``: ``<it><method>`` calls ``method`` with a ``grpc_context``
GRPC_ENTRY_PREFIX = "__rankcore_grpc__"

__all__ = ["http_method", "Reachable", "reachable", "stream_methods", "LIFECYCLE", "HTTP_ATTR"]

#: what ``@http_method`` sets on the function
HTTP_ATTR = "__rankcore_http_method__"
#: the methods the replica's runtime calls: no client reaches them
LIFECYCLE = frozenset({"reconfigure", "check_health", "record_routing_stats", "__del__", "__init__"})
#: a name a path segment (or an RPC) can carry
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")

F = TypeVar("F")


def _is_loader(fn: Any) -> bool:
    """A ``@multiplexed`` loader (it sets ``multiplex_options`` on what it returns)."""
    return getattr(fn, "multiplex_options", None) is not None


def http_method(fn: F) -> F:
    """Expose a deployment's method over HTTP at ``<route_prefix>/<method name>`` (the route itself
    calls ``__call__``). A lifecycle method or a ``@multiplexed`` loader is refused
    (``rankcore.InvalidConfig``): exposing one would let any client reconfigure the replica or load
    any model."""
    name = getattr(fn, "__name__", None)
    if not callable(fn) or not isinstance(name, str):
        raise InvalidConfig(f"@http_method decorates a method, got {type(fn).__name__}")
    if name in LIFECYCLE or _is_loader(fn):
        what = "a @multiplexed loader" if _is_loader(fn) else "a lifecycle method rankcore calls itself"
        raise InvalidConfig(f"@http_method cannot expose {name!r}: it is {what}, never reachable by a client")
    if not _NAME.fullmatch(name):
        raise InvalidConfig(f"@http_method cannot expose {name!r}: a path names a method that starts with a letter")
    setattr(fn, HTTP_ATTR, True)
    return fn


@dataclass(frozen=True)
class Reachable:
    """A deployment's methods a client may call: ``http`` (``__call__`` and the ``@http_method``
    ones) and ``grpc`` (its public methods but lifecycle ones and loaders; None: any name but a
    lifecycle one, for a class whose methods cannot be listed)."""

    http: frozenset[str]
    grpc: frozenset[str] | None
    #: HTTP requests reach the class as ASGI requests (``replica.asgi``: Serve's ``__call__(request)`` or
    #: ``@serve.ingress`` app): every path under its route prefix, whatever its method
    asgi: bool = False
    #: the methods a gRPC call reaches through their ``grpc_context`` entry (``base.grpc_context``: they
    #: declare a ``grpc_context`` parameter, and the class has the entry)
    grpc_context: frozenset[str] = frozenset()
    #: an ``@serve.ingress`` app's declared routes, ``(path, methods)`` (methods None: any), for the route
    #: label of its requests' metrics and logs (``route_patterns``; () for none: the route prefix)
    routes: tuple[tuple[str, tuple[str, ...] | None], ...] = ()

    @classmethod
    def unknown(cls) -> Reachable:
        """A class this process cannot read (or a route saved before issue 64): ``__call__`` over
        HTTP only; over gRPC any name but a lifecycle method."""
        return cls(http=frozenset({"__call__"}), grpc=None)

    def refusal(self, name: str, method: str, via: str) -> str | None:
        """Why ``method`` of deployment ``name`` cannot be called over ``via`` ("http" or "grpc"), or None."""
        if via == "http" and self.asgi:
            return None
        allowed = self.http if via == "http" else self.grpc
        if method not in LIFECYCLE and (allowed is None or method in allowed):
            return None
        if via == "http":
            listed = ", ".join(sorted(m for m in self.http if m != "__call__")) or "none"
            if method == "__call__":
                return (f"deployment {name!r} has no __call__: the route itself calls __call__, "
                        f"<route>/<method> a method marked @http_method (those: {listed})")
            return (f"deployment {name!r} has no method {method!r} exposed over HTTP (only __call__ at the "
                    f"route and methods marked @http_method at <route>/<method> are; those: {listed})")
        listed = ", ".join(sorted(self.grpc or ())) or "none"
        return f"deployment {name!r} has no method {method!r} (methods: {listed})"


def reachable(cls: Any) -> Reachable:
    """What a client may call on a deployment of class ``cls`` (``Reachable.unknown`` when ``cls`` is
    not a class)."""
    if not isinstance(cls, type):
        return Reachable.unknown()
    own = cls.__mro__[:-1]
    names = {m for m in dir(cls) if _NAME.fullmatch(m) and callable(getattr(cls, m, None))}
    public = {m for m in names if m not in LIFECYCLE and not _is_loader(getattr(cls, m))}
    has_call = any("__call__" in vars(k) for k in own)
    http = {m for m in public if getattr(getattr(cls, m), HTTP_ATTR, False)} | ({"__call__"} if has_call else set())
    dynamic = any("__getattr__" in vars(k) for k in own)  # (any name may be a method: gRPC sends it on)
    grpc = public | ({"__call__"} if has_call else set())
    with_context = frozenset(m for m in grpc if callable(getattr(cls, GRPC_ENTRY_PREFIX + m, None)))
    return Reachable(http=frozenset(http), grpc=None if dynamic else frozenset(grpc),
                     asgi=callable(getattr(cls, ASGI_ENTRY, None)), grpc_context=with_context,
                     routes=route_patterns(getattr(cls, ASGI_APP_ATTR, None)))


def stream_methods(cls: type) -> tuple[str, ...]:
    """The class's generator methods, plain or async (its streams): what the routers read from the
    controller's pool answers and a replica's own HTTP server reads from its class."""
    return tuple(m for m in dir(cls) if inspect.isgeneratorfunction(getattr(cls, m, None))
                 or inspect.isasyncgenfunction(getattr(cls, m, None)))


def route_patterns(app: Any) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    """The routes an ASGI app (FastAPI, Starlette) declares, as Serve's ``extract_route_patterns``
    reads them: each route's whole path (a ``Mount``'s and an ``include_router``'s prefix in front,
    the app's ``root_path`` too) with its methods, sorted by path; a mount with no routes of its own
    takes any method. () for an app without routes, or one whose routes cannot be read."""
    found: dict[str, set[str] | None] = {}

    def walk(routes: Any, prefix: str) -> None:
        for route in routes:
            included = getattr(route, "original_router", None)  # (FastAPI >= 0.137's include_router)
            if included is not None:
                walk(included.routes, prefix + route.include_context.prefix)
                continue
            path = prefix + route.path
            inner = getattr(route, "routes", None) if not hasattr(route, "endpoint") else None
            if inner:  # (a Mount of routes)
                walk(inner, path)
            elif getattr(route, "methods", None) and found.get(path, set()) is not None:
                found.setdefault(path, set()).update(route.methods)  # type: ignore[union-attr]
            else:
                found[path] = None
    try:
        walk(getattr(app, "routes", None) or (), "")
    except Exception:  # (an app of another shape: no patterns, the route prefix labels its requests)
        return ()
    root = (getattr(app, "root_path", "") or "").rstrip("/")
    if root:
        found = {(root + "/" + path.lstrip("/") if path != "/" else root + path): m for path, m in found.items()}
    return tuple(sorted((path, None if m is None else tuple(sorted(m))) for path, m in found.items()))

"""Ray Serve's two HTTP ingress shapes, run in the replica (issue 64, "a Serve app ports by
changing one import"):

* ``__call__(self, request)`` of a class deployed with ``serve.deployment`` receives a starlette
  ``Request`` for every path under its route prefix (any method), and what it returns becomes
  the answer as Serve makes it: a starlette ``Response`` is sent as is, ``str`` as
  ``text/plain; charset=utf-8``, ``bytes`` as ``text/plain``, ``None`` as an empty body, anything
  else as JSON.
* ``@serve.ingress(app)``: ``app`` (a FastAPI or starlette app, any ASGI app, or a function that
  builds one in the replica) answers every path under the route prefix; a FastAPI app's routes
  defined on the class are methods of the replica's instance (Serve's class-based view: their
  ``self`` is the instance), made so in each replica as it starts (the app travels as the user
  wrote it: a FastAPI router of included routes holds a lock, which does not pickle).

The proxy sends the request's ASGI scope (its ``root_path`` is the route prefix, its ``path`` the
whole path, as Serve's proxy sets them) and its body (read there, within ``max_body_bytes``) to
the replica's ``__rankcore_asgi__`` (``ENTRY``), a stream of ASGI message lists, and sends them on
as they come: a ``StreamingResponse`` streams. rankcore's own deployments (``rankcore``'s
``deployment``) keep their JSON calls (docs/ray.md, "HTTP ingress"): only a class that has
``ENTRY`` gets requests this way.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from rankcore import InvalidConfig

from ..base.exposed import ASGI_APP_ATTR, ASGI_ENTRY

__all__ = ["ENTRY", "ingress", "request_ingress", "is_asgi", "started", "stopped", "current_instance"]

#: the replica method the proxy streams an HTTP request to (a client cannot name it: ``exposed``)
ENTRY = ASGI_ENTRY
#: the ASGI app (or its builder) ``ingress`` put on the class
APP_ATTR = ASGI_APP_ATTR
#: the class's qualified name where it was defined (a class defined in a function comes back from
#: cloudpickle named bare, while its methods keep ``f.<locals>.Cls.m``: its routes are found by this)
QUALNAME_ATTR = "__rankcore_asgi_qualname__"
#: which shape: "ingress" (``@serve.ingress``) or "request" (``__call__(request)``)
KIND_ATTR = "__rankcore_asgi_kind__"

#: the replica's instance while its app runs: a class-based view's ``self`` (FastAPI resolves it
#: as a dependency, in the task or thread that runs the route: both copy this context)
_instance: contextvars.ContextVar[Any] = contextvars.ContextVar("rankcore_asgi_instance", default=None)
#: id(instance) -> (its app, its lifespan or None): one per replica
_apps: dict[int, tuple[Any, Any]] = {}


def current_instance() -> Any:
    """The replica instance whose ASGI app is answering (a FastAPI dependency's view of ``self``)."""
    obj = _instance.get()
    if obj is None:
        raise RuntimeError("no rankcore replica is answering an HTTP request here")
    return obj


def is_asgi(cls: Any) -> bool:
    """Whether HTTP requests reach ``cls`` as ASGI requests (``ENTRY``) rather than JSON calls."""
    return isinstance(cls, type) and callable(getattr(cls, ENTRY, None))


def ingress(app: Any) -> Callable[[type], type]:
    """Serve's ``serve.ingress``: the class's HTTP ingress is ``app``, an ASGI app (FastAPI,
    starlette, ...) or a function that returns one (called once in each replica). A FastAPI app's
    routes that are methods of the class get the replica's instance as ``self``."""
    if not callable(app):
        raise InvalidConfig(f"serve.ingress takes an ASGI app (FastAPI(), Starlette(), ...) or a function that "
                            f"builds one, got {type(app).__name__}")

    def decorate(cls: Any) -> type:
        if not isinstance(cls, type):
            raise InvalidConfig(f"@serve.ingress decorates a class, got {type(cls).__name__} (put it under "
                                f"@serve.deployment)")
        if "__call__" in vars(cls):
            raise InvalidConfig(f"class {cls.__name__!r} passed to @serve.ingress may not have a __call__ method: "
                                f"its app answers every path")
        if _is_fastapi(app):
            for route in _views_of(app, cls):  # (made views in the replica, ``started``: a FastAPI router
                _resolve(route.endpoint)       # of included routes holds a lock, which does not pickle)
        setattr(cls, APP_ATTR, app)
        setattr(cls, QUALNAME_ATTR, cls.__qualname__)  # (cloudpickle rebuilds a class of a function bare-named)
        setattr(cls, KIND_ATTR, "ingress")
        setattr(cls, ENTRY, _answer)
        return cls

    return decorate


def request_ingress(target: Any) -> Any:
    """(``serve.deployment``'s.) A class whose ``__call__`` gets a starlette ``Request`` over HTTP,
    as in Serve; a class already under ``@serve.ingress``, one without ``__call__`` and anything
    but a class are returned as they are."""
    if not isinstance(target, type) or is_asgi(target) or not any("__call__" in vars(k) for k in target.__mro__[:-1]):
        return target
    setattr(target, KIND_ATTR, "request")
    setattr(target, ENTRY, _answer)
    return target


# ------------------------------------------------------------------ in the replica
async def started(instance: Any) -> None:
    """(The replica, once its instance is built.) Build its app and run the app's lifespan startup
    (FastAPI's ``lifespan`` / ``on_event("startup")``), as Serve's replica does before it serves: a
    startup that fails fails the replica's start."""
    if not is_asgi(type(instance)) or id(instance) in _apps:
        return
    cls = type(instance)
    if getattr(cls, KIND_ATTR, None) == "request":
        _apps[id(instance)] = (functools.partial(_request_app, instance), None)
        return
    app = getattr(cls, APP_ATTR)
    if inspect.isfunction(app):  # (a builder: Serve calls it in the replica)
        app = app()
    if _is_fastapi(app):
        _class_based_view(app, cls)
    lifespan = _lifespan(app)
    if lifespan is not None:
        token = _instance.set(instance)
        try:
            await lifespan.startup()
        finally:
            _instance.reset(token)
        if lifespan.should_exit:
            raise RuntimeError(f"the ASGI lifespan startup of {cls.__name__!r} failed (the replica's log says why)")
    _apps[id(instance)] = (app, lifespan)


async def stopped(instance: Any) -> None:
    """(The replica, as it stops.) The app's lifespan shutdown."""
    app_lifespan = _apps.pop(id(instance), None)
    if app_lifespan is not None and app_lifespan[1] is not None:
        await app_lifespan[1].shutdown()


def _lifespan(app: Any) -> Any:
    """uvicorn's lifespan runner for ``app`` (Serve's: ``LifespanOn``), or None without uvicorn."""
    try:
        import logging

        from uvicorn.config import Config
        from uvicorn.lifespan.on import LifespanOn
    except ImportError:  # pragma: no cover - (the http extra installs uvicorn)
        return None
    runner = LifespanOn(Config(app, lifespan="auto", log_level=None, log_config=None, access_log=False))
    runner.logger = logging.getLogger(__name__)
    return runner


async def _answer(self: Any, scope: dict, body: bytes) -> AsyncIterator[list[dict]]:
    """``ENTRY``: run the replica's app on one request (``scope`` and its whole ``body``) and yield
    its ASGI messages in lists, each list what the app sent since the last (a plain answer is one
    list; a streaming one, one per chunk as it comes). The app's error before any message is the
    call's error (the proxy's 500); after one, the stream ends (the client sees its answer cut).
    The call cancelled (its client went away): the app's task is cancelled."""
    if id(self) not in _apps:  # (an instance the replica did not start: in-process use)
        await started(self)
    app = _apps[id(self)][0]
    queue: asyncio.Queue[dict] = asyncio.Queue()
    receive = _buffered(body)

    async def send(message: dict) -> None:
        queue.put_nowait(message)

    token = _instance.set(self)
    try:
        task = asyncio.ensure_future(app(dict(scope), receive, send))  # (its context: a copy with self)
    finally:
        _instance.reset(token)
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait((task, getter), return_when=asyncio.FIRST_COMPLETED)
            out = [getter.result()] if getter in done else []
            if getter not in done:
                getter.cancel()
            while not queue.empty():
                out.append(queue.get_nowait())
            if out:
                yield out
            if task in done and queue.empty():
                break
        task.result()  # (the app's own error, raised)
    finally:
        if not task.done():
            task.cancel()


def _buffered(body: bytes) -> Callable[[], Any]:
    """An ASGI ``receive`` that gives ``body`` once, then waits until cancelled (the body was read
    whole at the proxy; starlette listens for a disconnect while it streams, and cancels that)."""
    given = False

    async def receive() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}  # pragma: no cover - (never reached: cancelled)

    return receive


async def _request_app(instance: Any, scope: dict, receive: Any, send: Any) -> None:
    """The ASGI app of a ``request_ingress`` class: ``instance.__call__(Request)``, its answer
    sent as Serve sends it (``response_of``). A sync ``__call__`` runs on a thread (with this
    request's context), so one slow request does not hold the replica's loop."""
    from starlette.requests import Request

    fn = instance.__call__
    args = (Request(scope, receive),) if _takes_args(fn) else ()  # (Serve: no Request for a __call__(self))
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__func__", None)):
        result = await fn(*args)
    else:
        ctx = contextvars.copy_context()
        result = await asyncio.get_running_loop().run_in_executor(None, ctx.run, fn, *args)
        if inspect.isawaitable(result):
            result = await result
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        raise TypeError(f"{type(instance).__name__}.__call__ returned a generator: over HTTP, return a starlette "
                        f"StreamingResponse of it (a handle call takes the generator with stream=True)")
    await response_of(result)(scope, receive, send)


def _takes_args(fn: Any) -> bool:
    """Whether a bound ``__call__`` takes an argument (Serve's ``takes_any_args``: a ``__call__(self)``
    is called with none)."""
    try:
        return bool(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # pragma: no cover - (a builtin: given the request)
        return True


def response_of(result: Any) -> Any:
    """What ``__call__``'s ``result`` is sent as, by Serve's rules: a starlette ``Response`` as is;
    ``None``: empty ``text/plain``; ``bytes``: ``text/plain``; ``str``: ``text/plain;
    charset=utf-8``; anything else: compact JSON (FastAPI's ``jsonable_encoder`` first when FastAPI
    is installed, so pydantic models and dataclasses encode as in Serve)."""
    from starlette.responses import Response

    if isinstance(result, Response):
        return result
    if result is None or isinstance(result, bytes):  # (as the headers are given: starlette adds no charset)
        return Response(result or b"", headers={"content-type": "text/plain"})
    if isinstance(result, str):
        return Response(result.encode("utf-8"), headers={"content-type": "text/plain; charset=utf-8"})
    try:
        from fastapi.encoders import jsonable_encoder
    except ImportError:  # pragma: no cover - (fastapi is optional)
        encoded = result
    else:
        encoded = jsonable_encoder(result)
    return Response(json.dumps(encoded, separators=(",", ":")).encode(), media_type="application/json")


# ------------------------------------------------------------------ FastAPI
def _is_fastapi(app: Any) -> bool:
    try:
        from fastapi import FastAPI
    except ImportError:
        return False
    return isinstance(app, FastAPI)


def _resolve(endpoint: Any) -> None:
    """Fix ``endpoint``'s signature with its annotations evaluated here, where its module's globals
    are: a method pickled by value keeps only the globals its code reads, so in the replica a
    string annotation (``from __future__ import annotations``) naming a body model would not
    resolve and FastAPI would read the body as a query parameter."""
    from fastapi.dependencies.utils import get_typed_signature

    signature = get_typed_signature(endpoint)
    if not signature.parameters:
        raise InvalidConfig(f"FastAPI route {endpoint.__qualname__!r} of an ingress class must take self")
    endpoint.__signature__ = signature


def _views_of(app: Any, cls: type) -> list:
    """The FastAPI routes of ``app`` defined as methods of ``cls`` (by their qualified name)."""
    from fastapi.routing import APIRoute, APIWebSocketRoute

    qualname = vars(cls).get(QUALNAME_ATTR, cls.__qualname__)
    return [r for r in app.routes if isinstance(r, (APIRoute, APIWebSocketRoute))
            and getattr(r.endpoint, "__qualname__", "").startswith(qualname + ".")]


def _class_based_view(app: Any, cls: type) -> None:
    """Make the FastAPI routes defined as methods of ``cls`` (their endpoint's qualified name is
    under the class's) take the replica's instance as ``self``: ``self`` becomes a dependency
    (``current_instance``) and the other parameters keyword-only, then the routes are included
    again so FastAPI reads their new signatures (Serve's ``make_fastapi_class_based_view``)."""
    from fastapi import APIRouter, Depends

    done = app.__dict__.setdefault("_rankcore_views", set())
    if cls in done:  # (once per app and class in a process)
        return
    done.add(cls)

    async def instance() -> Any:
        return current_instance()

    router = APIRouter()
    for route in _views_of(app, cls):
        app.routes.remove(route)
        signature = inspect.signature(route.endpoint)
        params = list(signature.parameters.values())
        new = [params[0].replace(default=Depends(instance))] + [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params[1:]]
        route.endpoint.__signature__ = signature.replace(parameters=new)
        route.endpoint._rankcore_cls = cls
        router.routes.append(route)
    app.include_router(router)
    # (a route another ingress class of this app made its own is not this one's)
    app.routes[:] = [r for r in app.routes if getattr(getattr(r, "endpoint", None), "_rankcore_cls", cls) is cls]

"""gRPC beside HTTP in every proxy (issue 38), in Ray Serve's style.

The user names the generated ``add_XServicer_to_server`` functions of their services
(``grpc_servicer_functions``, import paths, as Serve's ``gRPCOptions``); each is called once
with a stand-in server that keeps the service's method handlers, so the proxy knows every
method's request and response types without the user's servicer. A call is routed to the
application named by its ``application`` metadata (a routed deployment's name; with one
routed deployment, that one whatever it says: Serve's rule), and that deployment's method
of the RPC's name is called with the request message and returns the response message
(unary), or yields them (a generator method: server streaming). It runs on the HTTP
server's event loop and goes through the same request path (``http.IngressState.call``: the
handle, ``request_timeout_s``, cancellation). A method that declares ``grpc_context`` is called
through its entry (``base.grpc_context``), as a stream of its answer and then what it set on Serve's
``RayServegRPCContext``: its code, details and trailing metadata end the call (``_apply``).

The services are looked up at each call (``_Services``, the server's one handler of them), so a
running proxy serves services added later (``set_services``; ``HttpIngress.set_grpc_services``,
``control.proxies.Proxies.set_grpc``) without a restart of its server or of any application.

Errors map to status codes: bytes that are not the method's request message ``INVALID_ARGUMENT``,
a message above ``max_body_bytes`` (or metadata above ``max_header_bytes``) ``RESOURCE_EXHAUSTED``,
an unknown method ``UNIMPLEMENTED`` (gRPC's; also a method of the services that the deployment's class
lacks, or a lifecycle method or ``@multiplexed`` loader it has, before anything is sent:
``http.IngressState.unknown_method``); an unknown or missing application ``NOT_FOUND``; overloaded or
no replica ``UNAVAILABLE``; past ``request_timeout_s`` ``DEADLINE_EXCEEDED``; the
application's own exception ``INTERNAL`` with its message; a client that cancels (or whose
deadline passes) cancels the call through the handle (its slot on the replica is freed;
counted ``CANCELLED``). Health: the standard ``grpc.health.v1.Health`` service (``SERVING``;
``NOT_SERVING`` while the proxy drains), and ``/rankcore.RankcoreAPIService/ListApplications``
(``google.protobuf.Empty`` in, ``google.protobuf.ListValue`` of the application names out)
and ``/rankcore.RankcoreAPIService/Healthz`` (``StringValue`` "success"; ``UNAVAILABLE`` while
draining), well-known types so that no stub is needed to call them.

Metrics: each call of a user's service is counted in the proxy's ``IngressMetrics`` (``grpc_request``:
Serve's ``serve_num_grpc_requests``, errors, latency; ``serve_num_ongoing_grpc_requests`` while a call to
an application runs), labelled as Serve's gRPC proxy labels it: the method's full name, the application
as its route, the code it ended with by name (``_Call``). The API and health services are not counted,
as the HTTP side's ``/-/`` pages are not.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Any

import grpc
from google.protobuf import empty_pb2, struct_pb2, wrappers_pb2
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

import rankcore as rc

from . import appnames
from .access import request_id_of
from .by_value import BEGAN
from .context import RequestContext
from .grpc_context import GrpcState, RayServegRPCContext, entry_name
from .routers import ROUTING_KEY_HEADER, routing_key_of

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_GRPC_PORT", "API_SERVICE", "check_servicer_functions", "servicer_methods", "GrpcFront", "call_began",
           "code_of"]

#: Ray Serve's default gRPC port (``gRPCOptions.port``)
DEFAULT_GRPC_PORT = 9000
#: gRPC's own default ``max_receive_message_length`` (4 MiB): what the server buffers of a message at
#: most when ``max_body_bytes`` is below it (each call checks ``max_body_bytes`` itself)
GRPC_MESSAGE_BYTES = 4 << 20
API_SERVICE = "rankcore.RankcoreAPIService"
#: the HTTP status the request path gives an error -> its gRPC code
_CODES = {404: grpc.StatusCode.NOT_FOUND, 503: grpc.StatusCode.UNAVAILABLE, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
          499: grpc.StatusCode.CANCELLED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED, 400: grpc.StatusCode.INVALID_ARGUMENT}


class _Keeper:
    """What ``add_XServicer_to_server`` is handed instead of a server: it keeps the handlers."""

    def __init__(self) -> None:
        self.services: dict[str, dict[str, Any]] = {}
        self._generic: dict[str, dict[str, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        """A service's handlers as grpcio-tools before 1.62 generates them (and a hand-written function,
        as Serve's test writes): ``grpc.method_handlers_generic_handler``'s, by full method name (read as
        Serve's gRPC server reads them). Newer generated code also calls ``add_registered_method_handlers``
        with the same methods, which wins."""
        for handler in handlers:
            methods = getattr(handler, "_method_handlers", None)
            name = handler.service_name() if callable(getattr(handler, "service_name", None)) else None
            if not isinstance(name, str) or not isinstance(methods, dict):
                continue  # (a handler of its own kind: it names no methods to route)
            prefix = f"/{name}/"
            self._generic[name] = {full[len(prefix):]: h for full, h in methods.items()
                                   if isinstance(full, str) and full.startswith(prefix)}

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.services[service] = dict(handlers)

    def found(self) -> dict[str, dict[str, Any]]:
        """service -> method -> handler: the registered ones, and the generic ones of the services no
        registered call named."""
        return {**{k: v for k, v in self._generic.items() if v}, **self.services}


class _Services(grpc.GenericRpcHandler):
    """The server's one handler of the users' services: the method handlers by full name
    (``/package.Service/Method``), looked up at each call, so services added to a running proxy
    (``GrpcFront.set_services``) are served at once: gRPC's own generic handlers may be added only
    before the server starts."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}

    def service(self, handler_call_details: Any) -> Any:
        return self.handlers.get(handler_call_details.method)


#: the metadata key a call names its multiplexed model with (Serve's gRPC proxy reads the same)
MODEL_ID_KEY = "multiplexed_model_id"


#: the metadata key a call's id comes in (when the client sends one) and goes back in, trailing (Serve's)
REQUEST_ID_KEY = "request_id"


def _metadata(context: aio.ServicerContext) -> dict:
    """The call's metadata as a dict, read once a call (``_Call.meta``; a call outside one: now)."""
    call = _CALL.get()
    if call is not None and call.meta is not None:
        return call.meta
    return dict(context.invocation_metadata() or ())


def _note_of(name: str, context: aio.ServicerContext) -> dict:
    """The call's note (what ``http.IngressState.call`` carries to the replica as its request context):
    its id, the client's ``request_id`` when it sent a usable one, else a new one, set at once in the
    trailing metadata (Serve's gRPC proxy returns it there, errors included); its multiplexed model;
    its session key (``x-routing-key``: ``routers.ROUTING_KEY_HEADER``); its route the application's
    name (Serve's gRPC request: the replica's request counters carry it)."""
    meta = _metadata(context)
    sent = meta.get(REQUEST_ID_KEY)
    rid = request_id_of(sent if isinstance(sent, str) else None)
    context.set_trailing_metadata(((REQUEST_ID_KEY, rid),))
    return {"route": appnames.of(name), "deployment": name, "request_id": rid, "model": _model_of(context, meta),
            "replica": None, "routing_key": str(meta.get(ROUTING_KEY_HEADER, "") or "").strip()}


def _model_of(context: aio.ServicerContext, meta: dict | None = None) -> str:
    """The multiplexed model the call's metadata names ("" none)."""
    return str((meta if meta is not None else _metadata(context)).get(MODEL_ID_KEY, "") or "").strip()


class _AnyServicer:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def check_servicer_functions(paths: Any) -> tuple[str, ...]:
    """Import paths (``package.module.add_XServicer_to_server``), each importable and callable;
    ``rankcore.InvalidConfig`` naming the one that is not."""
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)):
        raise rc.InvalidConfig(f"grpc_servicer_functions must be a list of import paths, got {paths!r}")
    for path in paths:
        _function(path)
    return tuple(paths)


def _function(path: Any) -> Any:
    if not isinstance(path, str) or "." not in path:
        raise rc.InvalidConfig(f"grpc_servicer_functions: {path!r} is not an import path (module.function)")
    module, _, name = path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise rc.InvalidConfig(f"grpc_servicer_functions: cannot import {path!r}: {exc}") from None
    if not callable(fn):
        raise rc.InvalidConfig(f"grpc_servicer_functions: {path!r} is not callable")
    return fn


def servicer_methods(paths: Sequence[str]) -> dict[str, dict[str, Any]]:
    """service name -> method name -> its generated handler (request deserializer, response
    serializer, whether it streams), from the ``add_XServicer_to_server`` functions."""
    keeper = _Keeper()
    for path in paths:
        _function(path)(_AnyServicer(), keeper)
    services = keeper.found()
    if not services:
        raise rc.InvalidConfig(f"grpc_servicer_functions {list(paths)!r} registered no service (neither "
                               f"add_registered_method_handlers nor grpc.method_handlers_generic_handler handlers)")
    return services


class _Call:
    """One call of a user's service, for the metrics (``GrpcFront._opened``/``_closed``): the deployment its
    ``application`` metadata names (None: none), when it began, the code it ended with (``_ended``), and
    its metadata (read once)."""

    __slots__ = ("name", "began", "code", "meta", "context")

    def __init__(self, name: str | None, meta: dict | None = None, context: aio.ServicerContext | None = None) -> None:
        self.name, self.began, self.meta, self.context = name, time.perf_counter(), meta, context
        self.code: str | None = None


#: the call this task answers (grpc.aio runs each call in a task of its own): ``GrpcFront._ended`` tells it its code
_CALL: ContextVar[_Call | None] = ContextVar("rankcore_grpc_call", default=None)


def call_began() -> Callable[[], Awaitable[None]] | None:
    """What sends the initial metadata of the call this task answers (None: no call): a replica's own
    server (``direct_grpc``) awaits it once the call holds a slot, before the user's method, so the
    balancer re-sends only a call that got nothing back (``rankcore.requests.dataplane.GRPC_RETRY_ON``)."""
    call = _CALL.get()
    if call is None or call.context is None:
        return None
    return functools.partial(call.context.send_initial_metadata, BEGAN)  # (a by-value call's marker too)


class _Refused:
    """A request message refused as it was read (``GrpcFront._read``): the code and the detail."""

    def __init__(self, code: grpc.StatusCode, detail: str) -> None:
        self.code, self.detail = code, detail


def code_of(status: int) -> grpc.StatusCode:
    return _CODES.get(status, grpc.StatusCode.INTERNAL)


def _error_code(code: Any) -> grpc.StatusCode | None:
    """``code`` when it is a ``grpc.StatusCode`` other than ``OK`` (a method's ``grpc_context`` code that
    ends the call), else None."""
    return code if isinstance(code, grpc.StatusCode) and code != grpc.StatusCode.OK else None


def _request_of(name: str, note: dict) -> RequestContext:
    """The replica's request context of a call (``_note_of``'s note)."""
    app = appnames.of(name)  # (Serve's gRPC request: its route and app_name are the application's)
    return RequestContext(route=app, request_id=note["request_id"], app_name=app, multiplexed_model_id=note["model"])


class GrpcFront:
    """The proxy's gRPC server: one ``grpc.aio`` server on the HTTP server's loop."""

    def __init__(self, ingress: Any, servicer_functions: Sequence[str], cancel: Any) -> None:
        #: http.IngressState: routes, handles, the request path, and ``failed`` (an error's HTTP status,
        #: mapped to a code here, its traceback logged)
        self.ingress = ingress
        #: http._cancel, handed in: this module does not import http.py, which starts it
        self._cancel = cancel
        self.services: dict[str, dict[str, Any]] = {}
        self.servicer_functions: tuple[str, ...] = ()
        self._services = _Services()
        self.set_services(servicer_functions)
        self.server: aio.Server | None = None
        self.health = health_aio.HealthServicer()
        self.codes: Counter[str] = Counter()  # answers by status code name
        self.address: tuple[str, int] = ("", 0)
        #: a replica's server of these calls over HTTP/1.1 (``grpc_h1``), where it serves them so
        self.h1: Any = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        server = self.server = aio.server(options=self.options())
        server.add_generic_rpc_handlers((self._services,))
        api = {"ListApplications": grpc.unary_unary_rpc_method_handler(
                   self._list, request_deserializer=self._read(empty_pb2.Empty.FromString),
                   response_serializer=struct_pb2.ListValue.SerializeToString),
               "Healthz": grpc.unary_unary_rpc_method_handler(
                   self._healthz, request_deserializer=self._read(empty_pb2.Empty.FromString),
                   response_serializer=wrappers_pb2.StringValue.SerializeToString)}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(API_SERVICE, api),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        bound = server.add_insecure_port(where)
        if bound == 0:
            raise rc.InvalidConfig(f"the gRPC server cannot listen on {where}")
        await server.start()
        self.address = (host, bound)
        return self.address

    def set_services(self, servicer_functions: Sequence[str]) -> None:
        """Serve the services of ``servicer_functions`` from now on (the running server included: calls
        under way keep their method; the API and health services are the server's own)."""
        services = servicer_methods(servicer_functions)
        handlers = {f"/{service}/{name}": self._handler(name, h, f"/{service}/{name}")
                    for service, methods in services.items() for name, h in methods.items()}
        self.services, self.servicer_functions = services, tuple(servicer_functions)
        self._services.handlers = handlers

    def handler_of(self, path: str) -> Any:
        """The server's handler of a user's method (``/package.Service/Method``; None: no service has it)."""
        return self._services.handlers.get(path)

    def options(self) -> list[tuple[str, Any]]:
        """The server's channel options: the HTTP side's limits, as gRPC's own (read when it starts):
        a message above ``max(max_body_bytes, 4 MiB)`` is refused by gRPC before it is read whole
        (``RESOURCE_EXHAUSTED``; each call then checks the current ``max_body_bytes``: ``_read``),
        metadata above ``max_header_bytes`` too, and a connection's HTTP/2 handshake must end within
        ``header_timeout_s``."""
        ing = self.ingress
        out: list[tuple[str, Any]] = [("grpc.so_reuseport", 0),
                                      ("grpc.max_receive_message_length", max(ing.max_body_bytes, GRPC_MESSAGE_BYTES)),
                                      ("grpc.max_metadata_size", ing.max_header_bytes)]
        if ing.header_timeout_s is not None:
            out.append(("grpc.server_handshake_timeout_ms", max(1, int(ing.header_timeout_s * 1000))))
        return out

    def _read(self, deserialize: Any) -> Any:
        """``deserialize`` that never raises: a message above ``max_body_bytes`` or one that does not
        parse becomes a ``_Refused`` the call answers with its code (gRPC answered ``UNKNOWN`` with
        the decoder's exception for bytes that are not the message)."""
        ingress = self.ingress

        def read(data: bytes) -> Any:
            most = ingress.max_body_bytes
            if len(data) > most:
                return _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"the message is {len(data)} bytes, above max_body_bytes={most}")
            try:
                return deserialize(data)
            except Exception as exc:
                return _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a message of this method's "
                                                                  f"type: {type(exc).__name__}: {exc}")
        return read

    async def _refuse(self, request: Any, context: aio.ServicerContext) -> None:
        """A request ``_read`` refused: answered with its code (the call ends here)."""
        if isinstance(request, _Refused):
            self._ended(request.code.name)
            await context.abort(request.code, request.detail)

    async def stop(self, grace: float = 5.0) -> None:
        if self.server is not None:
            await self.server.stop(grace)
        if self.h1 is not None:
            self.h1.close()

    async def draining(self, draining: bool) -> None:
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING if draining
                              else health_pb2.HealthCheckResponse.SERVING)

    # ---------------------------------------------------------------- calls
    def _handler(self, method: str, generated: Any, full: str) -> Any:
        """The server's handler of ``method`` (``full``: ``/package.Service/Method``), each call measured."""
        kw = {"request_deserializer": self._read(generated.request_deserializer),
              "response_serializer": generated.response_serializer}
        if generated.unary_unary is not None:
            async def unary(request: Any, context: aio.ServicerContext) -> Any:
                call, out = self._opened(context), None
                try:
                    return await self._unary(method, request, context)
                except BaseException as exc:
                    out = exc
                    raise
                finally:
                    self._closed(call, full, out)
            return grpc.unary_unary_rpc_method_handler(unary, **kw)
        if generated.unary_stream is not None:
            async def stream(request: Any, context: aio.ServicerContext) -> Any:
                call, out = self._opened(context), None
                try:
                    async for item in self._stream(method, request, context):
                        yield item
                except BaseException as exc:  # (GeneratorExit too: the client went while an item was sent)
                    out = exc
                    raise
                finally:
                    self._closed(call, full, out)
            return grpc.unary_stream_rpc_method_handler(stream, **kw)
        raise rc.InvalidConfig(f"gRPC method {method!r}: only unary and server-streaming calls are served")

    # ------------------------------------------------------------- metrics
    def _opened(self, context: aio.ServicerContext) -> _Call:
        """A call begins: measured from now; in flight (Serve's ongoing gauge) when an application takes it."""
        meta = dict(context.invocation_metadata() or ())
        call = _Call(self._application(context, meta), meta, context)
        _CALL.set(call)
        if call.name is not None:
            self.ingress.metrics.grpc_started()
        return call

    def _ended(self, code: str) -> None:
        """The call this task answers ends with ``code`` (a ``grpc.StatusCode``'s name): counted in ``codes``
        and told to its metrics (``_Call``)."""
        self.codes[code] += 1
        call = _CALL.get()
        if call is not None:
            call.code = code

    def _closed(self, call: _Call, full: str, exc: BaseException | None) -> None:
        """A call ended: counted with its code (one never told: ``CANCELLED`` for a call cancelled or closed,
        else ``UNKNOWN``, gRPC's answer to an unexpected error) and its time since ``_opened``."""
        metrics = self.ingress.metrics
        code = call.code or ("CANCELLED" if isinstance(exc, asyncio.CancelledError | GeneratorExit) else "UNKNOWN")
        if call.name is not None:
            metrics.grpc_ended()
        metrics.grpc_request(method=full, deployment=call.name or "", code=code,
                             latency_ms=(time.perf_counter() - call.began) * 1000.0)

    def refused(self, full: str, deployment: str, code: str, latency_ms: float) -> None:
        """A call of ``full`` (``/package.Service/Method``) to ``deployment`` refused before any handler ran
        (a replica's HTTP/1.1 server, ``grpc_h1``: its message or head too large, unreadable) with
        ``code``: counted as the calls the handlers end are, when ``full`` is a user's method."""
        if full and self.handler_of(full) is not None:
            self.codes[code] += 1
            self.ingress.metrics.grpc_request(method=full, deployment=deployment, code=code, latency_ms=latency_ms)

    def _application(self, context: aio.ServicerContext, meta: dict | None = None) -> str | None:
        """The routed deployment the ``application`` metadata names: an application's (``serve.run``'s
        ``name``, a config's: its ingress, ``base.appnames``) or a deployment's own name; with one
        routed deployment, that one whatever it says (Serve's rule). None: unknown, or not given
        with several."""
        handles = self.ingress.handles
        named = (meta if meta is not None else _metadata(context)).get("application")
        if len(handles) == 1:
            return next(iter(handles))
        if named in handles:
            return named
        return next((d for d in sorted(handles) if appnames.of(d) == named), None) if named else None

    async def _app_or_abort(self, context: aio.ServicerContext) -> str:
        call = _CALL.get()
        name = call.name if call is not None else self._application(context)  # (found once, as the call opened)
        if name is None:
            named = _metadata(context).get("application")
            self._ended("NOT_FOUND")
            what = "Application metadata not set." if named is None else f"Application {named!r} not found."
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"{what} Ping /{API_SERVICE}/ListApplications for the applications.")
        return name  # type: ignore[return-value]

    async def _method_or_abort(self, name: str, method: str, context: aio.ServicerContext) -> None:
        """A method the deployment's class does not have: ``UNIMPLEMENTED`` (nothing sent)."""
        unknown = self.ingress.unknown_method(name, method, via="grpc")
        if unknown is not None:
            self._ended("UNIMPLEMENTED")
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, unknown)

    async def _failed(self, exc: BaseException, name: str, method: str, context: aio.ServicerContext,
                      note: dict | None = None, state: GrpcState | None = None) -> None:
        """Abort with the error's code and ``status_of``'s detail (never a traceback: that goes to the
        proxy's log under the request id, ``IngressState.failed``). ``state``: what a method taking
        ``grpc_context`` set before it raised: its trailing metadata is sent, and the code it set (not
        ``OK``) ends the call instead of ``INTERNAL``, with the details it set or else the error's (Serve's)."""
        status, error, detail = self.ingress.failed(exc, name, method, note)
        code = code_of(status)
        if state is not None:
            self._trailing(state, context)
            if error == "application_error" and _error_code(state.code) is not None:
                code, detail = state.code, state.details or detail
        self._ended(code.name)
        await context.abort(code, detail[-4000:])

    def _takes_context(self, name: str, method: str) -> bool:
        """Whether ``method`` of ``name`` declares ``grpc_context`` (called through its entry)."""
        reach = self.ingress.methods.get(name)
        return reach is not None and method in getattr(reach, "grpc_context", ())

    async def _unary(self, method: str, request: Any, context: aio.ServicerContext) -> Any:
        await self._refuse(request, context)
        name = await self._app_or_abort(context)
        note = _note_of(name, context)
        await self._method_or_abort(name, method, context)
        if self._takes_context(name, method):
            return await self._unary_with_context(name, method, request, context, note)
        self.ingress.ongoing += 1  # (what a drain waits for, as HTTP requests)
        try:
            value = await self.ingress.call(name, method, (request,), {}, note=note)
        except asyncio.CancelledError:  # the client cancelled (or its deadline passed): the call is cancelled
            self._ended("CANCELLED")
            raise
        except Exception as exc:
            await self._failed(exc, name, method, context, note)
        finally:
            self.ingress.ongoing -= 1
        self._ended("OK")
        return value

    async def _stream(self, method: str, request: Any, context: aio.ServicerContext) -> Any:
        await self._refuse(request, context)
        name = await self._app_or_abort(context)
        note = _note_of(name, context)
        await self._method_or_abort(name, method, context)
        if self._takes_context(name, method):
            async for item in self._stream_with_context(name, method, request, context, note):
                yield item
            return
        ingress = self.ingress
        response = None
        ended = False
        ingress.ongoing += 1
        try:
            handle = ingress.handles[name].options(stream=True, method_name=method)
            response = await ingress.send(handle, name, (request,), {}, ingress.request_timeout_s,
                                          _request_of(name, note), routing_key_of(note))
            async for item in self._bounded(name, response):
                yield item
            ended = True
        except asyncio.CancelledError:
            self._ended("CANCELLED")
            raise
        except Exception as exc:
            ended = True
            await self._failed(exc, name, method, context, note)
        finally:
            ingress.ongoing -= 1
            if not ended and response is not None:
                self._cancel(response)
        self._ended("OK")

    # ------------------------------------------------- methods taking grpc_context
    async def _send_to_entry(self, name: str, method: str, request: Any, context: aio.ServicerContext,
                             note: dict) -> Any:
        """The call of ``method``'s entry (``base.grpc_context``): a stream of the method's answer, then
        what it set on the ``RayServegRPCContext`` made here from the call's context."""
        ingress = self.ingress
        handle = ingress.handles[name].options(stream=True, method_name=entry_name(method))
        return await ingress.send(handle, name, (request, RayServegRPCContext(context)), {},
                                  ingress.request_timeout_s, _request_of(name, note), routing_key_of(note))

    async def _unary_with_context(self, name: str, method: str, request: Any, context: aio.ServicerContext,
                                  note: dict) -> Any:
        """A unary call of a method taking ``grpc_context``: its one answer within ``request_timeout_s``,
        then what it set applied (``_apply``)."""
        ingress = self.ingress
        answers: list[Any] = []
        state: GrpcState | None = None
        failure: list[BaseException] = []
        response: Any = None

        async def collect() -> None:
            nonlocal response, state
            try:
                response = await self._send_to_entry(name, method, request, context, note)
                async for item in response:
                    if isinstance(item, GrpcState):
                        state = item
                    else:
                        answers.append(item)
            except Exception as exc:  # (the application's, a dead replica ...: answered below)
                failure.append(exc)

        timeout = ingress.request_timeout_s
        ingress.ongoing += 1
        try:
            await asyncio.wait_for(collect(), timeout)
        except asyncio.TimeoutError:  # (only its own: collect keeps every error it meets)
            if response is not None:
                self._cancel(response)
            failure.append(rc.RequestTimeout(f"no answer from {name!r} within request_timeout_s={timeout:g}",
                                             deployment=name))
        except asyncio.CancelledError:  # the client cancelled (or its deadline passed)
            self._ended("CANCELLED")
            if response is not None:
                self._cancel(response)
            raise
        finally:
            ingress.ongoing -= 1
        if not failure and len(answers) != 1:
            failure.append(TypeError(f"{name}.{method} gave {len(answers)} answers to a unary gRPC call (a "
                                     f"generator method is a server-streaming RPC)"))
        if failure:
            await self._failed(failure[0], name, method, context, note, state)
        await self._apply(state, context, stream=False)
        self._ended("OK")
        return answers[0]

    def _bounded(self, name: str, response: Any) -> Any:
        """A server-streaming call's items, the first within ``request_timeout_s`` (as the HTTP side
        bounds an answer's first message; Serve's gRPC proxy a call): none by then cancels the call on
        its replica, and the stream ends in ``rankcore.RequestTimeout`` (``DEADLINE_EXCEEDED`` naming
        the option). No limit: ``response`` itself. The limit is a timer that cancels the call, not a
        task of its own: the caller's cancellation reaches the read as before."""
        timeout = self.ingress.request_timeout_s
        return response if timeout is None else self._first_within(name, response, timeout)

    async def _first_within(self, name: str, response: Any, timeout: float) -> Any:
        items = response.__aiter__()
        fired = False

        def fire() -> None:
            nonlocal fired
            fired = True
            self._cancel(response)

        def late() -> rc.RequestTimeout:
            return rc.RequestTimeout(f"no answer from {name!r} within request_timeout_s={timeout:g}", deployment=name)
        timer = asyncio.get_running_loop().call_later(timeout, fire)
        try:
            first = await items.__anext__()
        except Exception as exc:  # (the end of the stream too: StopAsyncIteration)
            if fired:
                raise late() from None
            if isinstance(exc, StopAsyncIteration):
                return
            raise
        finally:
            timer.cancel()
        if fired:  # (its first item came as the call was being cancelled: too late all the same)
            raise late()
        yield first
        async for item in items:
            yield item

    async def _stream_with_context(self, name: str, method: str, request: Any, context: aio.ServicerContext,
                                   note: dict) -> Any:
        """A server-streaming call of a method taking ``grpc_context``: its items as they come, then
        what it set applied (``_apply``)."""
        ingress = self.ingress
        state: GrpcState | None = None
        failure: BaseException | None = None
        response: Any = None
        ended = False
        ingress.ongoing += 1
        try:
            response = await self._send_to_entry(name, method, request, context, note)
            async for item in self._bounded(name, response):
                if isinstance(item, GrpcState):
                    state = item
                else:
                    yield item
            ended = True
        except asyncio.CancelledError:
            self._ended("CANCELLED")
            raise
        except Exception as exc:
            ended = True
            failure = exc
        finally:
            ingress.ongoing -= 1
            if not ended and response is not None:
                self._cancel(response)
        if failure is not None:
            await self._failed(failure, name, method, context, note, state)
        await self._apply(state, context, stream=True)
        self._ended("OK")

    def _trailing(self, state: GrpcState, context: aio.ServicerContext) -> None:
        """The trailing metadata the method set (with the call's ``request_id``), where gRPC takes it."""
        if state.trailing_metadata:
            try:
                context.set_trailing_metadata(tuple((k, v) for k, v in state.trailing_metadata))
            except Exception as exc:  # (keys gRPC refuses ...: logged, the request id kept)
                log.warning("the trailing metadata a method set was not sent: %r (%s)", state.trailing_metadata, exc)

    async def _apply(self, state: GrpcState | None, context: aio.ServicerContext, stream: bool) -> None:
        """End a call as the method's ``grpc_context`` says (Serve's ``_set_on_grpc_context``): its
        trailing metadata, compression (a unary call's) and details; a code other than ``OK`` aborts
        the call with it (a unary call's answer is not sent)."""
        if state is None:
            return
        self._trailing(state, context)
        if state.compression is not None and not stream:
            context.set_compression(state.compression)
        if state.code is not None and state.code != grpc.StatusCode.OK:
            code = _error_code(state.code)
            details = state.details or ""
            if code is None:
                code, details = grpc.StatusCode.INTERNAL, f"grpc_context.set_code takes a grpc.StatusCode, " \
                                                          f"got {state.code!r}"
            self._ended(code.name)
            await context.abort(code, details)
        if state.details:
            context.set_details(state.details)

    # ------------------------------------------------------------- the API
    async def _list(self, request: Any, context: aio.ServicerContext) -> Any:
        await self._refuse(request, context)
        if self.ingress.draining:  # (as /-/routes and Healthz: a load balancer moves away)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "This node is being drained.")
        out = struct_pb2.ListValue()
        out.extend(sorted({appnames.of(d) for d in self.ingress.handles}))  # (the applications' names: Serve's)
        return out

    async def _healthz(self, request: Any, context: aio.ServicerContext) -> Any:
        await self._refuse(request, context)
        why = await self.ingress.unready()  # (draining; a worker's proxy with no replica yet)
        if why is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, why[1])
        return wrappers_pb2.StringValue(value="success")

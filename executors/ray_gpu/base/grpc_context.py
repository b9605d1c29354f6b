"""Serve's gRPC context (``ray.serve.grpc_util.RayServegRPCContext``, issue 64): a deployment's method
that declares a ``grpc_context`` parameter gets one when a gRPC call reaches it, and what it sets there
(``set_code``, ``set_details``, ``set_trailing_metadata``, ``set_compression``) reaches the client.

How: ``attach`` (called by ``deployment`` for every class, so ``serve.deployment`` and rankcore's own
both have it) puts one entry method on the class for each method that takes ``grpc_context``, named
``__rankcore_grpc__<method>`` (``ENTRY_PREFIX``; a name no client can call: ``base.exposed``), of the
same kind as the user's method (a plain or ``async def`` method, a generator or async generator: the
replica runs it as it would run the method itself, a plain one on its request threads, an ``async def``
on its loop). The proxy (``base.grpc_proxy``) sends such a method's calls to its entry, as a stream,
with the request message and a ``RayServegRPCContext`` made from the call's own context
(``invocation_metadata`` the client's metadata, ``trailing_metadata`` the call's ``request_id``,
``peer`` ...). The entry calls the method with ``grpc_context=`` that object, yields its answer (a
unary method's one response, a generator's items) and then the context's ``GrpcState`` (its code,
details, trailing metadata, compression): also when the method raises, before the error, so a code set
and then an exception still reaches the client (Serve's since 2.54). ``base.exposed.reachable`` lists
the methods that have an entry (``Reachable.grpc_context``): the proxy calls the entry for those
alone, so a method without ``grpc_context`` is called exactly as before.

The proxy then ends the call as Ray Serve's does: a code other than ``OK`` (a truthy one; ``None``:
not set) ends it with that code and the details set (the response is not sent; a stream's items
already sent stay sent); the trailing metadata set is sent (``request_id`` kept, as Serve's
``set_trailing_metadata`` keeps it); a method that set a code and raised ends with its code, and
the details it set or else the error's ``Type: message``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .exposed import GRPC_ENTRY_PREFIX, LIFECYCLE

__all__ = ["RayServegRPCContext", "GrpcState", "GRPC_CONTEXT_ARG", "ENTRY_PREFIX", "entry_name", "attach",
           "takes_grpc_context"]

#: the parameter name that asks for the context (Serve's ``GRPC_CONTEXT_ARG_NAME``)
GRPC_CONTEXT_ARG = "grpc_context"
#: the entry methods' prefix (``base.exposed``: a name starting with ``__`` no client reaches)
ENTRY_PREFIX = GRPC_ENTRY_PREFIX
#: set on each entry: the user method it calls
_ENTRY_OF = "__rankcore_grpc_entry_of__"
#: a name an RPC can carry (``base.exposed``'s rule), and ``__call__``
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*|__call__")


def _read(context: Any, name: str, default: Any) -> Any:
    """``context.<name>()``, or ``default`` where the context has no such method (a stand-in)."""
    fn = getattr(context, name, None)
    if not callable(fn):
        return default
    value = fn()
    return default if value is None and default is not None else value


def _pairs(metadata: Any) -> list[tuple[str, Any]]:
    return [(key, value) for key, value in (metadata or ())]


class RayServegRPCContext:
    """Ray Serve's gRPC context, as a method taking ``grpc_context`` gets it: the call's facts
    (``invocation_metadata``, ``peer``, ``auth_context`` ...) read from the proxy's gRPC context, and
    what the method sets (``set_code``, ``set_details``, ``set_trailing_metadata``, ``set_compression``)
    sent back to the client by the proxy. Picklable (it travels with the request to the replica);
    made from any object with ``grpc.ServicerContext``'s methods, as Serve's is."""

    def __init__(self, grpc_context: Any = None) -> None:
        self._auth_context: dict[str, Any] = dict(_read(grpc_context, "auth_context", {}) or {})
        self._code: Any = _read(grpc_context, "code", None)
        self._details: str | None = _read(grpc_context, "details", None)
        self._invocation_metadata = _pairs(_read(grpc_context, "invocation_metadata", ()))
        self._peer: str = _read(grpc_context, "peer", "")
        self._peer_identities: Any = _read(grpc_context, "peer_identities", None)
        self._peer_identity_key: str | None = _read(grpc_context, "peer_identity_key", None)
        self._trailing_metadata = _pairs(_read(grpc_context, "trailing_metadata", ()))
        self._compression: Any = None

    # ------------------------------------------------------------ the call's facts
    def auth_context(self) -> dict[str, Any]:
        """The call's auth properties (name -> the values' bytes)."""
        return self._auth_context

    def invocation_metadata(self) -> list[tuple[str, Any]]:
        """The metadata the client sent (``application``, ``request_id`` ... included)."""
        return self._invocation_metadata

    def peer(self) -> str:
        """The client's address as gRPC names it (``ipv4:127.0.0.1:53412``)."""
        return self._peer

    def peer_identities(self) -> Any:
        """The peer's identities (None: the call is not authenticated)."""
        return self._peer_identities

    def peer_identity_key(self) -> str | None:
        """The auth property that identifies the peer (None: not authenticated)."""
        return self._peer_identity_key

    # ------------------------------------------------------------ what the method sets
    def code(self) -> Any:
        """The status code to end the call with (None: not set; the proxy's own then)."""
        return self._code

    def details(self) -> str | None:
        """The details to end the call with."""
        return self._details

    def trailing_metadata(self) -> list[tuple[str, Any]]:
        """The trailing metadata to send (the call's ``request_id`` first)."""
        return self._trailing_metadata

    def set_code(self, code: Any) -> None:
        """End the call with ``code`` (a ``grpc.StatusCode``; one other than ``OK`` ends it as an
        error, its response unsent)."""
        self._code = code

    def set_details(self, details: str) -> None:
        """The details string the call ends with."""
        self._details = details

    def set_compression(self, compression: Any) -> None:
        """The compression of the call's answer (a ``grpc.Compression``; a unary call's)."""
        self._compression = compression

    def _request_id_metadata(self) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in self._trailing_metadata if k == "request_id"][:1]

    def set_trailing_metadata(self, trailing_metadata: Any) -> None:
        """The trailing metadata to send: the last one set, after the call's ``request_id`` (kept, as
        Serve keeps it)."""
        self._trailing_metadata = self._request_id_metadata() + _pairs(trailing_metadata)

    def _state(self) -> GrpcState:
        return GrpcState(self._code, self._details, list(self._trailing_metadata), self._compression)


class GrpcState:
    """What a method set on its ``RayServegRPCContext``: the entry's last item (the proxy applies it)."""

    __slots__ = ("code", "details", "trailing_metadata", "compression")

    def __init__(self, code: Any = None, details: str | None = None, trailing_metadata: Any = (),
                 compression: Any = None) -> None:
        self.code, self.details = code, details
        self.trailing_metadata = _pairs(trailing_metadata)
        self.compression = compression

    def __getstate__(self) -> tuple:
        return self.code, self.details, self.trailing_metadata, self.compression

    def __setstate__(self, state: tuple) -> None:
        self.code, self.details, self.trailing_metadata, self.compression = state

    def __repr__(self) -> str:
        return (f"GrpcState(code={self.code!r}, details={self.details!r}, "
                f"trailing_metadata={self.trailing_metadata!r})")


# ------------------------------------------------------------------ the class's entries
def entry_name(method: str) -> str:
    """The entry that calls ``method`` with a ``grpc_context``."""
    return ENTRY_PREFIX + method


def takes_grpc_context(fn: Any) -> bool:
    """Whether ``fn`` declares a ``grpc_context`` parameter (Serve's test: its signature's names)."""
    try:
        return GRPC_CONTEXT_ARG in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _callable_names(cls: type) -> list[str]:
    """The names a gRPC call may name on ``cls`` (``base.exposed``'s rule: a letter first, or ``__call__``)."""
    out = []
    for name in dir(cls):
        if not _NAME.fullmatch(name) or name in LIFECYCLE or not callable(getattr(cls, name, None)):
            continue
        out.append(name)
    return out


def attach(cls: Any) -> Any:
    """Give ``cls`` an entry (``entry_name``) for each of its methods that takes ``grpc_context``;
    anything but a class is returned as it is. Idempotent (a class deployed twice, ``.options``)."""
    if not isinstance(cls, type):
        return cls
    for name in _callable_names(cls):
        fn = getattr(cls, name)
        if getattr(fn, _ENTRY_OF, None) is not None or not takes_grpc_context(fn):
            continue
        current = getattr(cls, entry_name(name), None)
        if current is not None and getattr(current, _ENTRY_OF, None) == name:
            continue
        setattr(cls, entry_name(name), _entry(name, fn))
    return cls


def _entry(name: str, fn: Any) -> Any:
    """The entry of method ``name`` (``fn``): of its kind, yielding its answer, then the context's
    ``GrpcState`` (before the method's exception too, then raised as is)."""
    if inspect.isasyncgenfunction(fn):
        async def entry(self: Any, request: Any, context: RayServegRPCContext) -> AsyncIterator[Any]:
            try:
                async for item in getattr(self, name)(request, grpc_context=context):
                    yield item
            except Exception:
                yield context._state()
                raise
            yield context._state()
    elif inspect.iscoroutinefunction(fn):
        async def entry(self: Any, request: Any, context: RayServegRPCContext) -> AsyncIterator[Any]:
            try:
                answer = await getattr(self, name)(request, grpc_context=context)
            except Exception:
                yield context._state()
                raise
            yield answer
            yield context._state()
    elif inspect.isgeneratorfunction(fn):
        def entry(self: Any, request: Any, context: RayServegRPCContext) -> Iterator[Any]:  # type: ignore[misc]
            try:
                yield from getattr(self, name)(request, grpc_context=context)
            except Exception:
                yield context._state()
                raise
            yield context._state()
    else:
        def entry(self: Any, request: Any, context: RayServegRPCContext) -> Iterator[Any]:  # type: ignore[misc]
            try:
                answer = getattr(self, name)(request, grpc_context=context)
            except Exception:
                yield context._state()
                raise
            yield answer
            yield context._state()
    entry.__name__ = entry.__qualname__ = entry_name(name)
    setattr(entry, _ENTRY_OF, name)
    return entry

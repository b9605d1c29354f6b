"""gRPC over HTTP/1.1: a replica's own gRPC server on the direct data plane (issue 65).

HAProxy speaks HTTP/2 to gRPC clients and converts each call to HTTP/1.1 for a replica's backend,
a chunked request and a chunked answer whose trailers carry ``grpc-status`` (HAProxy turns them back
into HTTP/2 trailers). So a replica serves gRPC with the same ``httptools`` server as its HTTP
(``base.direct``), not with a ``grpc.aio`` server: on this project's 2-core machine, behind the same
HAProxy, the server's CPU a call was 58-150 us this way and 351-471 us with ``grpc.aio``, at 64 and 1
clients (``benchmarks/bench_grpc_wire.py``, docs/benchmarks.md). The calls are still answered by the
proxy's own gRPC code (``grpc_proxy.GrpcFront``'s handlers, given an ``H1Context`` for gRPC's
``ServicerContext``), so codes, ``request_id`` trailing metadata, limits, ``grpc_context`` and
metrics are as before.

The begin marker (``grpc_proxy.call_began``) is the answer's head: ``200``, ``application/grpc`` and
the call's initial metadata, written once the call holds a slot, before the user's method. A gRPC
answer's HTTP status is 200 whatever its outcome, so an early head promises nothing. HAProxy re-sends
only a call that got no byte back (``rankcore.requests.dataplane.GRPC_RETRY_ON``), which on HTTP/1.1
is a head like any other.

What ``grpc.aio`` did and this server does itself:

* ``grpc-timeout`` (the client's deadline): past it the call is cancelled and answered
  ``DEADLINE_EXCEEDED``;
* the request's one message: its 5-byte prefix read, a ``gzip`` or ``deflate`` message inflated
  whole (another ``grpc-encoding`` is ``UNIMPLEMENTED``); not exactly one message, one cut short or
  followed by more bytes, or a flag other than 0 and 1, ``INTERNAL``; a content type other than
  ``application/grpc`` (``+proto`` and the like) ``UNIMPLEMENTED``;
* a method no service has: ``UNIMPLEMENTED``; a method's exception: ``UNKNOWN`` (as ``grpc.aio``);
* metadata: the request's headers but HTTP's and gRPC's own (``invocation_metadata``; a ``-bin``
  key's value base64-decoded); a key sent twice keeps its last value;
* a head above ``max_header_bytes`` and a message above ``max_body_bytes`` are
  ``RESOURCE_EXHAUSTED``, a request that cannot be read ``INTERNAL``, and the connection closed;
  a call of a user's method refused so is counted in the metrics with that code, as the front counts.

Answers are not compressed (``grpc_context.set_compression`` is read and not applied: a server may
always answer uncompressed).
"""

from __future__ import annotations

import asyncio
import base64
import re
import struct
import urllib.parse
import zlib
from typing import Any

import grpc
from grpc import aio

import rankcore as rc

from . import direct
from .grpc_proxy import GrpcFront

__all__ = ["GRPC_CONTENT_TYPE", "H1Context", "GrpcH1Server", "timeout_of", "trailers"]

GRPC_CONTENT_TYPE = b"application/grpc"
#: request headers that are HTTP's or gRPC's own, not the call's metadata
_NOT_METADATA = frozenset({b"host", b"content-type", b"content-length", b"transfer-encoding", b"connection", b"te",
                           b"keep-alive", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"})
_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_TIMEOUT = re.compile(r"([0-9]{1,8})([HMSmun])")
#: a metadata key gRPC takes (lower case; ``grpc-`` keys are its own)
_KEY = re.compile(r"[0-9a-z_.\-]+")
#: the most a message is inflated to (zlib's bound), whatever ``max_body_bytes`` says
_MOST_INFLATED = 2**31 - 1
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/grpc\r\ntransfer-encoding: chunked\r\n"
#: the HTTP refusals of ``base.direct`` (before the request was read whole) -> their gRPC code
_REFUSED = {431: grpc.StatusCode.RESOURCE_EXHAUSTED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED}


def _is_grpc(content_type: bytes) -> bool:
    """``application/grpc``, or one of its forms (``+proto``, ``;charset``), not ``application/grpc-web``."""
    rest = content_type[len(GRPC_CONTENT_TYPE):] if content_type.startswith(GRPC_CONTENT_TYPE) else None
    return rest is not None and (not rest or rest[:1] in (b"+", b";"))


def timeout_of(value: bytes | None) -> float | None:
    """A ``grpc-timeout`` header's seconds (``100m``: 0.1); None: none, or not gRPC's form."""
    if not value:
        return None
    found = _TIMEOUT.fullmatch(value.decode("latin-1"))
    return None if found is None else int(found.group(1)) * _UNITS[found.group(2)]


def _lines(metadata: Any) -> bytes:
    """Metadata pairs as header lines; ``ValueError`` naming a key or value gRPC would refuse."""
    out = b""
    for key, value in metadata or ():
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key.startswith("grpc-"):
            raise ValueError(f"metadata key {key!r} is not a gRPC metadata key (lower case letters, digits, -_.)")
        if key.endswith("-bin"):
            if not isinstance(value, bytes):
                raise ValueError(f"metadata {key!r} ends in -bin: its value must be bytes, got {type(value).__name__}")
            text = base64.b64encode(value)
        else:
            if not isinstance(value, str) or not value.isascii() or not value.isprintable():
                raise ValueError(f"metadata {key!r}: its value must be printable ASCII text, got {value!r}")
            text = value.encode()
        out += key.encode() + b": " + text + b"\r\n"
    return out


def trailers(code: grpc.StatusCode, details: str | None, metadata: Any = ()) -> bytes:
    """The answer's end: the last chunk and its trailers (``grpc-status``, the details
    percent-encoded as gRPC's ``grpc-message``, the trailing metadata)."""
    out = b"0\r\ngrpc-status: %d\r\n" % code.value[0]
    if details:
        out += b"grpc-message: " + urllib.parse.quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode() \
            + b"\r\n"
    return out + _lines(metadata) + b"\r\n"


def _prefixed(data: bytes) -> bytes:
    """One message of the answer: gRPC's 5-byte prefix (not compressed) and the message (a chunk's data)."""
    return b"\x00" + struct.pack(">I", len(data)) + data


class _Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def _message(body: bytes, encoding: bytes | None, most: int) -> bytes:
    """The request's one message (inflated to ``most`` bytes and one more at most: the reader refuses
    what is above ``max_body_bytes``); ``_Refusal`` when the body is not exactly one."""
    if len(body) < 5:
        raise _Refusal(grpc.StatusCode.INTERNAL, "the request has no message (a unary request has one)")
    flag, n = body[0], struct.unpack(">I", body[1:5])[0]
    if flag > 1:
        raise _Refusal(grpc.StatusCode.INTERNAL, f"the message's compressed flag is {flag} (0 or 1)")
    if len(body) != n + 5:
        raise _Refusal(grpc.StatusCode.INTERNAL, f"the request is not one message: its prefix says {n} bytes, "
                                                 f"{len(body) - 5} follow")
    data = body[5:]
    if not flag:
        return data
    name = (encoding or b"identity").decode("latin-1").lower()
    if name == "identity":
        raise _Refusal(grpc.StatusCode.INTERNAL, "a compressed message without its grpc-encoding")
    if name in ("gzip", "deflate"):
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS if name == "gzip" else zlib.MAX_WBITS)
        out = inflate.decompress(data, min(most + 1, _MOST_INFLATED))
        if len(out) <= most and (not inflate.eof or inflate.unused_data):  # (cut short, or bytes after its end)
            raise _Refusal(grpc.StatusCode.INTERNAL, f"the {name} message is not whole")
        return out
    raise _Refusal(grpc.StatusCode.UNIMPLEMENTED, f"a message compressed with {name!r}: this server reads gzip "
                                                  f"and deflate")


class H1Context:
    """What a ``grpc.aio.ServicerContext`` gives ``GrpcFront``'s handlers, for one call on an HTTP/1.1
    connection (``direct._Connection``): its metadata, deadline and peer; what the handler sets (the
    code, details, trailing metadata); ``abort`` (``grpc.aio.AbortError``, as ``grpc.aio``); and
    ``send_initial_metadata``, which writes the answer's head now (the begin marker)."""

    def __init__(self, conn: Any, headers: dict[bytes, bytes], deadline: float | None) -> None:
        self._conn, self._headers, self._deadline = conn, headers, deadline
        self._meta: tuple | None = None
        self.code_set: grpc.StatusCode | None = None
        self.details_set: str | None = None
        self.trailing: tuple = ()
        self.head_sent = False

    def invocation_metadata(self) -> tuple:
        if self._meta is None:
            pairs = []
            for key, value in self._headers.items():
                if key in _NOT_METADATA or key.startswith(b"x-rankcore-"):
                    continue
                name = key.decode("latin-1")
                pairs.append((name, _unbase64(value) if name.endswith("-bin") else value.decode("latin-1")))
            self._meta = tuple(pairs)
        return self._meta

    def head(self, metadata: Any = ()) -> bytes:
        """The answer's head, once (b"" after): the HTTP status line and gRPC's headers, with ``metadata``."""
        if self.head_sent:
            return b""
        lines = _lines(metadata)
        self.head_sent = True
        return _HEAD + lines + b"\r\n"

    async def send_initial_metadata(self, metadata: Any) -> None:
        if self.head_sent:
            raise aio.UsageError("Send initial metadata failed: already sent")  # (grpc.aio's words)
        self._conn.write(self.head(metadata))

    def set_trailing_metadata(self, metadata: Any) -> None:
        pairs = tuple(metadata or ())
        _lines(pairs)  # (refused now, as grpc.aio refuses what it cannot send)
        self.trailing = pairs

    def trailing_metadata(self) -> tuple:
        return self.trailing

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self.code_set, self.details_set = code, details
        if trailing_metadata:
            self.set_trailing_metadata(trailing_metadata)
        raise aio.AbortError()

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code_set = code

    def code(self) -> grpc.StatusCode | None:
        return self.code_set

    def set_details(self, details: str) -> None:
        self.details_set = details

    def details(self) -> str | None:
        return self.details_set

    def set_compression(self, compression: Any) -> None:
        pass  # (answers go uncompressed: module docstring)

    def disable_next_message_compression(self) -> None:
        pass

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - asyncio.get_running_loop().time())

    def peer(self) -> str:
        where = self._conn.peer()
        if not where:
            return ""
        return f"ipv6:[{where[0]}]:{where[1]}" if ":" in where[0] else f"ipv4:{where[0]}:{where[1]}"

    def auth_context(self) -> dict:
        return {}

    def peer_identities(self) -> None:
        return None

    def peer_identity_key(self) -> None:
        return None

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False


def _unbase64(value: bytes) -> bytes:
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4))
    except ValueError:
        return value


class GrpcH1Server:
    """A replica's gRPC server over HTTP/1.1 (module docstring): ``base.direct``'s connections, each
    call answered by ``front``'s handler of its method (``GrpcFront``, whose ingress is the replica's
    ``replica.direct_grpc.ReplicaIngress``: the deployment, the call on a slot, the metrics)."""

    def __init__(self, front: GrpcFront) -> None:
        self.front = front
        self.deployment = front.ingress.deployment
        self.observe = None  # (its calls are counted by ``front``'s handlers, as gRPC calls)
        self.answers: dict[int, int] = {}
        self.server: asyncio.AbstractServer | None = None

    @property
    def max_body_bytes(self) -> int:
        return self.front.ingress.max_body_bytes + 5  # (the message's prefix; the message is checked by its reader)

    @property
    def max_header_bytes(self) -> int:
        return self.front.ingress.max_header_bytes

    async def start(self, host: str) -> tuple[str, int]:
        """Listen on ``host`` (a free port): ``(host, port)``."""
        self.server, port = await direct.listen(self, host)
        return host, port

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def refused(self, conn: Any, status: int, error: str, detail: str) -> None:
        """A request refused before it was read whole (``base.direct``'s HTTP status): its gRPC code."""
        code = _REFUSED.get(status, grpc.StatusCode.INTERNAL)
        if status == 413:  # (the body's limit is the message's and its prefix: say the message's)
            detail = f"the message is above max_body_bytes={self.front.ingress.max_body_bytes}"
        self.front.refused(conn.path, self.deployment, code.name, conn.elapsed_ms())
        conn.reply_raw(status, _HEAD + b"connection: close\r\n\r\n" + trailers(code, detail))

    async def answer(self, conn: Any, verb: str, path: str, headers: dict[bytes, bytes], body: bytes) -> None:
        """One call: its method's handler run, its answer written as it comes (module docstring)."""
        handler = self.front.handler_of(path)
        deadline_s = timeout_of(headers.get(b"grpc-timeout"))
        loop = asyncio.get_running_loop()
        context = H1Context(conn, headers, None if deadline_s is None else loop.time() + deadline_s)
        conn.begin_raw(200)
        if verb != "POST" or not _is_grpc(headers.get(b"content-type", b"")):
            return self._end(conn, context, grpc.StatusCode.UNIMPLEMENTED, "this server answers gRPC calls only")
        if handler is None:
            return self._end(conn, context, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
        try:
            request = handler.request_deserializer(_message(body, headers.get(b"grpc-encoding"),
                                                            self.front.ingress.max_body_bytes))
        except _Refusal as r:
            return self._end(conn, context, r.code, r.details)
        except zlib.error as exc:
            return self._end(conn, context, grpc.StatusCode.INTERNAL, f"the message could not be inflated: {exc}")
        try:
            await direct.within(self._answer(conn, context, handler, request), deadline_s, self.deployment)
        except aio.AbortError:
            code, details = context.code_set or grpc.StatusCode.UNKNOWN, context.details_set
        except rc.RequestTimeout:  # (past the client's deadline: the call was cancelled)
            code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        except Exception as exc:  # (as grpc.aio answers a handler's unexpected error)
            code, details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}"
        else:
            code, details = context.code_set or grpc.StatusCode.OK, context.details_set
        self._end(conn, context, code, details)

    @staticmethod
    async def _answer(conn: Any, context: H1Context, handler: Any, request: Any) -> None:
        """The handler's answer, its messages sent as they come (a stream's at the client's pace)."""
        if handler.unary_unary is not None:
            reply = await handler.unary_unary(request, context)
            conn.send(context.head())
            conn.chunk(_prefixed(handler.response_serializer(reply)))
            return
        items = handler.unary_stream(request, context)
        try:
            async for item in items:
                conn.send(context.head())
                conn.chunk(_prefixed(handler.response_serializer(item)))
                await conn.drained()
        finally:  # (a client gone while it waited to write: the handler's stream ends now)
            await items.aclose()

    def _end(self, conn: Any, context: H1Context, code: grpc.StatusCode, details: str | None) -> None:
        """The answer's end: its head if not sent yet, then the trailers (a trailing metadata gRPC would
        refuse was refused when set: ``H1Context.set_trailing_metadata``)."""
        conn.send(context.head())
        conn.end_chunked(trailers(code, details, context.trailing))

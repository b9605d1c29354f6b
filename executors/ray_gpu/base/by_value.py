"""A call sent to its replica by value: over a gRPC channel straight to the replica, past Ray's actor
call (Ray Serve's interdeployment gRPC transport: ``handle.options(_by_reference=False)``, and
``RAY_SERVE_PROXY_USE_GRPC`` for its proxy).

Why: a Ray actor call from the proxy to a replica is most of what one HTTP request costs. On the
quiet 16-core host it was 1.52-1.58 ms of ours' 2.65-2.74 ms p50, 70% of Serve's published 2.2 ms
before any routing or HTTP parsing. By value, on the same kind of host, HTTP took 1.53-1.91 ms p50
and a handle call 1.10 ms (docs/benchmarks.md). The request machine,
the router's bookkeeping and the replica's slots, metrics and witness are the same on both paths:
only the bytes' way differs.

* The replica starts its server the first time a router asks (``ReplicaActor.by_value_address``), on
  its user event loop, bound to its node's address on a free port: a replica no by-value caller
  uses pays nothing. The one method, ``/rankcore.Replica/Call``, takes what ``handle_call`` takes,
  pickled (``encode``), and answers ``(True, value)`` or ``(False, RayTaskError)`` pickled: the
  caller raises the same ``RayTaskError(<cause>)`` a Ray call raises, with the remote traceback.
* The replica's server sends a begin marker (``BEGAN``, as initial metadata) once a call holds one of
  its slots, before the user's method: a call cut off without it (its replica or node lost) never
  began, and its router sends it to another replica (``never_began``), with no witness to ask.
* A call whose caller cancels it (``CancelOnReplica``) cancels its gRPC call; gRPC cancels the
  replica's handler task there, as ``ray.cancel`` does an async actor task.
* What goes by reference anyway: streams and progress calls (Ray's streaming generators), a call
  holding a Ray ``ObjectRef`` or actor handle at any depth (only Ray's serialisation makes the
  replica a borrower of it) or that cannot be pickled, a call larger than ``MAX_BY_VALUE_BYTES``
  (Ray's object store moves large data without copies), and any call to a replica whose address
  the router does not know yet or cannot reach.
* A router sends with gRPC's threaded client (``channel``): no event loop of its own or the caller's.
* Server and channels are made as Ray makes its own gRPC ones (``ray._private.grpc_utils``, as
  Serve's replicas do): with Ray's token authentication (``RAY_AUTH_MODE=token``) and TLS
  (``RAY_USE_TLS``) where the cluster has them. Without them, anybody who can reach the port can
  have the replica unpickle bytes, as with Ray's own ports: run it on a network you trust.
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import traceback
import types
from typing import Any

import grpc
import ray

try:  # (Ray's own gRPC setup: its token authentication and TLS where the cluster has them; Ray 2.60 has it)
    from ray._private.grpc_utils import create_grpc_server_with_interceptors, init_grpc_channel
except ImportError:  # (an older Ray has neither: plain channels, as its own)
    create_grpc_server_with_interceptors = init_grpc_channel = None  # type: ignore[assignment]
try:
    from ray._common.tls_utils import add_port_to_grpc_server
except ImportError:
    add_port_to_grpc_server = None  # type: ignore[assignment]

__all__ = ["METHOD", "MAX_BY_VALUE_BYTES", "UNAVAILABLE", "BEGAN", "NotByValue", "never_sent", "never_began",
           "encode", "decode",
           "failure", "start_server", "channel"]

#: Serve's ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` (its fast mode) turns handles' calls by value by default,
#: as in Serve; ``RAY_SERVE_USE_GRPC_BY_DEFAULT`` says otherwise when set
THROUGHPUT_OPTIMIZED = os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED", "0") == "1"
#: a handle's default way (``handle.options(_by_reference=...)`` not given): Serve's
#: ``RAY_SERVE_USE_GRPC_BY_DEFAULT=1`` sends by value, else by reference (Serve's default; by value
#: under ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``)
HANDLE_BY_REFERENCE = os.environ.get("RAY_SERVE_USE_GRPC_BY_DEFAULT", "1" if THROUGHPUT_OPTIMIZED else "0") != "1"
#: the HTTP and gRPC proxies' way to their replicas: Serve's ``RAY_SERVE_PROXY_USE_GRPC`` ("1" by value,
#: "0" by reference), else by value, where Serve follows ``RAY_SERVE_USE_GRPC_BY_DEFAULT``: ours
#: measured faster by value (docs/benchmarks.md), and a proxy's calls are plain data from the wire
PROXY_BY_REFERENCE = os.environ.get("RAY_SERVE_PROXY_USE_GRPC", "1") == "0"
#: the one RPC a replica serves (unary: a call in, its answer out)
METHOD = "/rankcore.Replica/Call"
#: a call's pickled bytes above this go by reference (Serve's ``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH``
#: default, 4 MiB); an answer may be larger (``MAX_ANSWER_BYTES``)
MAX_BY_VALUE_BYTES = 4 * 1024 * 1024
#: what an answer may be pickled (gRPC's most: a larger one fails its call, saying so)
MAX_ANSWER_BYTES = 2**31 - 1 - 1024
#: what one message may hold either way (gRPC's own default refuses answers above 4 MiB)
_LIMITS = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]
#: a channel pings its server while it has calls (also while a long call sends nothing), so a call to a
#: replica cut off by the network fails within about 30 s instead of waiting for the controller; the
#: server takes pings that often
_CLIENT = [*_LIMITS, ("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 10_000),
           ("grpc.keepalive_permit_without_calls", 0), ("grpc.http2.max_pings_without_data", 0)]
_SERVER = [*_LIMITS, ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
           ("grpc.http2.max_ping_strikes", 0)]
#: the status a call gets when its replica could not be reached (then Ray is asked whether it lives)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
#: what gRPC's core says of an UNAVAILABLE call that never had a connection to go on
_NOT_CONNECTED = ("failed to connect", "dns resolution failed", "name resolution failure")


#: the begin marker: the initial metadata a replica's server sends once a call holds one of its slots,
#: before the user's method is entered. A call that failed on its way without it never began there
#: (``never_began``), whatever became of the replica or its node: it may go to another replica. It
#: rides the call's own response stream (no round trip of its own); a replica that dies between
#: sending it and its arrival has begun the call, and it runs again: the marker's flight, as with a
#: progress call's start marker (base/router.py)
BEGAN = (("rankcore-began", "1"),)


def never_began(call: Any) -> bool:
    """Whether a by-value call (its ended gRPC future) never began on its replica: no ``BEGAN`` in the
    initial metadata it received (gRPC's threaded future gives what arrived once the call ended,
    ``()`` when nothing did)."""
    try:
        got = call.initial_metadata()
    except Exception:  # (none to read: counted as begun, as every doubt)
        return False
    return got is not None and not any(k == BEGAN[0][0] for k, _ in got)


def never_sent(exc: BaseException) -> bool:
    """Whether a call that failed with ``exc`` never left this process: UNAVAILABLE because no
    connection to its server could be made (then no part of it ran there, and it may go again)."""
    if not isinstance(exc, grpc.Call) or exc.code() != UNAVAILABLE:
        return False
    details = (exc.details() or "").lower()
    return any(m in details for m in _NOT_CONNECTED)


class NotByValue(Exception):
    """What cannot go by value: a Ray ``ObjectRef`` or actor handle inside (only Ray's own
    serialisation tells Ray that the replica borrows it: sent by pickle, the object or actor can go
    while the replica holds it), or more bytes than allowed."""


#: what never travels by value, at any depth
_REFS = (ray.ObjectRef, ray.ObjectRefGenerator, ray.actor.ActorHandle)


class _Capped:
    """A pickler's file: keeps what it is given, refusing past ``most`` bytes (None: no limit), so a
    large call stops being pickled as soon as it is too large."""

    def __init__(self, most: int | None) -> None:
        self.parts: list[Any] = []
        self.size, self.most = 0, most

    def write(self, data: Any) -> int:
        n = len(data) if isinstance(data, bytes) else memoryview(data).nbytes
        self.size += n
        if self.most is not None and self.size > self.most:
            raise NotByValue(f"more than {self.most} bytes pickled")
        self.parts.append(bytes(data) if not isinstance(data, bytes) else data)
        return n


def _refuse(obj: Any) -> Any:
    if isinstance(obj, _REFS):
        raise NotByValue(f"a Ray {type(obj).__name__} cannot travel by value")
    return NotImplemented


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            # (plain pickle names it, and the replica's ``__main__`` is not the caller's: by value instead)
            raise pickle.PicklingError(f"{obj.__qualname__} is defined in __main__")
        return _refuse(obj)


@functools.cache
def _cloudpickler() -> Any:
    """``_Pickler`` for what plain pickle refuses: Ray's cloudpickle, refusing the same refs (made on
    first use: most calls never need it)."""
    from ray import cloudpickle

    class CloudPickler(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            _refuse(obj)
            return super().reducer_override(obj)

    return CloudPickler


def encode(value: Any, most: int | None = None) -> bytes:
    """``value`` pickled (protocol 5); what plain pickle refuses or would only name (a lambda, a
    class or function defined in ``__main__``) by Ray's cloudpickle, which the other side reads with
    plain ``pickle.loads``. ``NotByValue`` for a Ray ``ObjectRef`` or actor handle anywhere inside,
    or past ``most`` bytes."""
    out = _Capped(most)
    try:
        _Pickler(out, protocol=5).dump(value)
    except (pickle.PicklingError, TypeError, AttributeError):
        out = _Capped(most)
        _cloudpickler()(out, protocol=5).dump(value)
    return b"".join(out.parts)


def decode(data: bytes) -> Any:
    return pickle.loads(data)


def failure(function_name: str, exc: BaseException) -> bytes:
    """The answer for a call whose user method raised ``exc``: a ``RayTaskError`` as Ray makes
    one (the caller turns it into ``RayTaskError(<cause>)``: ``as_instanceof_cause``). An exception
    that cannot be pickled travels as Ray sends one (``RayTaskError`` puts a ``RayError`` saying so,
    with the traceback, in its place); one that still does not, as a ``RuntimeError`` with its text."""
    from ray.exceptions import RayTaskError

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    err = RayTaskError(function_name, tb, exc, pid=os.getpid())
    try:
        return encode((False, err))
    except Exception:  # (the cause does not pickle)
        cause = RuntimeError(f"{type(exc).__name__}: {exc}")
        return encode((False, RayTaskError(function_name, tb, cause, pid=os.getpid())))


async def start_server(answer: Any, host: str) -> tuple[Any, str]:
    """A gRPC server on the running loop serving ``METHOD`` with ``answer(bytes, began) -> bytes`` (a
    coroutine function; ``began()``, awaited once the call holds a replica slot, sends ``BEGAN``),
    bound to ``host`` on a free port; returns it and its ``host:port``."""
    async def call(request: bytes, context: Any) -> bytes:
        return await answer(request, functools.partial(context.send_initial_metadata, BEGAN))

    handler = grpc.method_handlers_generic_handler(
        "rankcore.Replica", {"Call": grpc.unary_unary_rpc_method_handler(call)})
    if create_grpc_server_with_interceptors is not None:  # (as Serve's replicas make theirs)
        server = create_grpc_server_with_interceptors(options=_SERVER, asynchronous=True)
    else:
        server = grpc.aio.server(options=_SERVER)
    server.add_generic_rpc_handlers((handler,))
    where = f"{_bracketed(host)}:0"
    port = add_port_to_grpc_server(server, where) if add_port_to_grpc_server is not None \
        else server.add_insecure_port(where)
    await server.start()
    return server, f"{_bracketed(host)}:{port}"


def channel(address: str) -> Any:
    """A channel to a replica's server: gRPC's threaded client (``unary_unary(METHOD).future(data)``),
    which any thread may call and cancel, with no event loop: a caller that blocks its own loop (a
    ``.result()`` inside an ``async def``) cannot block its call, and none waits for a hop to a
    sending loop's thread (0.94 ms p50 a call here against 1.1-1.2 ms for ``grpc.aio`` on another
    thread's loop, on this project's 2-core machine). Made as Ray makes its own (and Serve its
    channels to replicas): its token and TLS where the cluster uses them."""
    if init_grpc_channel is not None:
        return init_grpc_channel(address, options=_CLIENT)
    return grpc.insecure_channel(address, options=_CLIENT)


def _bracketed(host: str) -> str:
    try:
        socket.inet_pton(socket.AF_INET6, host)
    except OSError:
        return host
    return f"[{host}]"



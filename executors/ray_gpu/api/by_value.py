"""A call sent to its replica by value: over a gRPC channel straight to the replica, past Ray's actor
call (Ray Serve's interdeployment gRPC transport: ``handle.options(_by_reference=False)``, and
``RAY_SERVE_PROXY_USE_GRPC`` for its proxy).

Why: a Ray actor call from the proxy to a replica is most of what one HTTP request costs. On the
quiet 16-core host it was 1.52-1.58 ms of ours' 2.65-2.74 ms p50, 70% of Serve's published 2.2 ms
before any routing or HTTP parsing (docs/benchmarks.md); a gRPC unary call of the same bytes between
two processes costs a third of a Ray call on this project's 2-core machine. The request machine,
the router's bookkeeping and the replica's slots, metrics and witness are the same on both paths:
only the bytes' way differs.

* The replica starts its server the first time a router asks (``ReplicaActor.by_value_address``), on
  its user event loop, bound to its node's address on a free port: a replica no by-value caller
  uses pays nothing. The one method, ``/rankcore.Replica/Call``, takes what ``handle_call`` takes,
  pickled (``encode``), and answers ``(True, value)`` or ``(False, RayTaskError)`` pickled: the
  caller raises the same ``RayTaskError(<cause>)`` a Ray call raises, with the remote traceback.
* A call whose caller cancels it (``CancelOnReplica``) cancels its gRPC call; gRPC cancels the
  replica's handler task there, as ``ray.cancel`` does an async actor task.
* What goes by reference anyway: streams and progress calls (Ray's streaming generators), a call
  whose arguments hold a Ray ``ObjectRef`` (its ownership travels only with Ray's serialisation) or
  that cannot be pickled, a call larger than ``MAX_BY_VALUE_BYTES`` (Ray's object store moves large
  data without copies), and any call to a replica whose address the router does not know yet.
* Anybody who can reach the port can have the replica unpickle bytes, as with Ray's own ports and
  Serve's transport: run it on a network you trust.
"""

from __future__ import annotations

import os
import pickle
import socket
import traceback
from typing import Any

import grpc

__all__ = ["METHOD", "MAX_BY_VALUE_BYTES", "TransportError", "encode", "decode", "failure", "start_server", "channel"]

#: a handle's default way (``handle.options(_by_reference=...)`` not given): Serve's
#: ``RAY_SERVE_USE_GRPC_BY_DEFAULT=1`` sends by value, else by reference (Serve's default)
HANDLE_BY_REFERENCE = os.environ.get("RAY_SERVE_USE_GRPC_BY_DEFAULT", "0") != "1"
#: the HTTP and gRPC proxies' way to their replicas: Serve's ``RAY_SERVE_PROXY_USE_GRPC`` ("1" by value,
#: "0" by reference), else by value, where Serve follows ``RAY_SERVE_USE_GRPC_BY_DEFAULT``: ours
#: measured faster by value (docs/benchmarks.md), and a proxy's calls are plain data from the wire
PROXY_BY_REFERENCE = os.environ.get("RAY_SERVE_PROXY_USE_GRPC", "1") == "0"
#: the one RPC a replica serves (unary: a call in, its answer out)
METHOD = "/rankcore.Replica/Call"
#: a call's pickled bytes above this go by reference (Serve's ``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH``
#: default, 4 MiB); an answer may be larger (``_LIMITS``)
MAX_BY_VALUE_BYTES = 4 * 1024 * 1024
#: what one message may hold either way (gRPC's own default refuses answers above 4 MiB)
_LIMITS = [("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)]


def encode(value: Any) -> bytes:
    """``value`` pickled (protocol 5); what plain pickle refuses (a lambda, a class defined in
    ``__main__``) by Ray's cloudpickle, which the other side reads with plain ``pickle.loads``."""
    try:
        return pickle.dumps(value, protocol=5)
    except (pickle.PicklingError, TypeError, AttributeError):
        from ray import cloudpickle

        return cloudpickle.dumps(value, protocol=5)


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
    """A gRPC server on the running loop serving ``METHOD`` with ``answer(bytes) -> bytes`` (a
    coroutine function), bound to ``host`` on a free port; returns it and its ``host:port``."""
    async def call(request: bytes, context: Any) -> bytes:
        return await answer(request)

    handler = grpc.method_handlers_generic_handler(
        "rankcore.Replica", {"Call": grpc.unary_unary_rpc_method_handler(call)})
    server = grpc.aio.server(options=_LIMITS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{_bracketed(host)}:0")
    await server.start()
    return server, f"{_bracketed(host)}:{port}"


def channel(address: str) -> Any:
    """A channel to a replica's server, made on (and only for) the running loop."""
    return grpc.aio.insecure_channel(address, options=_LIMITS)


def _bracketed(host: str) -> str:
    try:
        socket.inet_pton(socket.AF_INET6, host)
    except OSError:
        return host
    return f"[{host}]"


#: a by-value call failed on its way (the replica unreachable, its process gone), not in the user's
#: method (whose error comes back as an answer)
TransportError = grpc.aio.AioRpcError

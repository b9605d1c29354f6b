"""A replica's own gRPC server: the direct data plane's gRPC (issue 65).

With ``data_plane="direct"`` and gRPC (``grpc_servicer_functions``), the proxy's HAProxy sends a
deployment's gRPC calls straight to its replicas (``ingress/haproxy.py``), each of which serves the
user's services itself on its user event loop with the proxy's gRPC handlers (``grpc_proxy.GrpcFront``:
the same codes, metadata, limits, ``grpc_context`` and metrics), over HTTP/1.1 (``base.grpc_h1``: HAProxy
converts each call, and the replica's HTTP server answers it). ``ReplicaIngress``
answers what that server asks of its ingress from the replica itself: the one deployment it serves
(every ``application`` is this one: the balancer chose it by that metadata), its methods, the call
run on a slot of its own (``run``), a generator method's items (``stream``), its errors' codes, and
its metrics (the replica's ``ReplicaMetrics``, summed by the ingress's ``/metrics``).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from ..base import appnames
from ..base.context import RequestContext
from ..base.direct import within
from ..base.exposed import Reachable
from ..base.grpc_h1 import GrpcH1Server
from ..base.grpc_proxy import GrpcFront, call_began
from ..base.httpwords import ANSI, status_of

log = logging.getLogger(__name__)

__all__ = ["ReplicaIngress", "start"]

#: ``run(method, args, kwargs, request, on_begin)``: one call on a slot (``on_begin``, awaited once it
#: holds one, before the user's method: ``grpc_proxy.call_began``, the balancer's begin marker)
Run = Callable[[str, tuple, dict, RequestContext, Any], Awaitable[Any]]
Stream = Callable[[str, tuple, dict, RequestContext, Any], AsyncIterator[Any]]


class _Handle:
    """What ``GrpcFront`` asks of a deployment's handle: ``options(stream=True, method_name=m)``."""

    def __init__(self, method: str = "__call__") -> None:
        self.method = method

    def options(self, *, method_name: str = "__call__", **_: Any) -> _Handle:
        return _Handle(method_name)


class _Items:
    """A generator method's items, as ``GrpcFront`` reads a handle's stream: ``cancel()`` before the
    first item (past ``request_timeout_s``: ``GrpcFront._first_within``) stops the stream, whose end
    the server then answers ``DEADLINE_EXCEEDED``. The first item is awaited in a task of its own so
    that it can be cancelled; each step of the replica's stream sets its request context itself."""

    def __init__(self, items: AsyncIterator[Any]) -> None:
        self._items = items
        self._first: asyncio.Future | None = None
        self._started = self._stopped = False

    def __aiter__(self) -> _Items:
        return self

    async def __anext__(self) -> Any:
        if self._stopped:
            raise StopAsyncIteration
        if self._started:
            return await self._items.__anext__()
        self._started = True
        self._first = asyncio.ensure_future(self._items.__anext__())
        try:
            return await self._first
        except asyncio.CancelledError:
            if self._stopped and self._first.cancelled():  # (ours: the server's first-item bound)
                raise StopAsyncIteration from None
            raise
        finally:
            self._first = None

    def cancel(self) -> None:
        """Stop the stream: its first item's wait is cancelled, or, once it has given items, the replica's
        generator is closed now (its slot freed), not when it is collected."""
        self._stopped = True
        if self._first is not None:
            self._first.cancel()
        elif self._started:
            asyncio.get_running_loop().create_task(self._close())

    async def _close(self) -> None:
        aclose = getattr(self._items, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except RuntimeError:  # (it is being read right now: whoever reads it ends it)
                pass


def _cancel(response: Any) -> None:
    cancel = getattr(response, "cancel", None)
    if callable(cancel):
        cancel()


class ReplicaIngress:
    """What ``GrpcFront`` asks of its ingress, answered by one replica of ``deployment`` (module
    docstring); ``limits``: the ingress's (``haproxy.DataPlane.limits``)."""

    def __init__(self, deployment: str, reach: Reachable, run: Run, stream: Stream, metrics: Any,
                 limits: dict) -> None:
        self.deployment, self.run, self.stream, self.metrics = deployment, run, stream, metrics
        self.handles = {deployment: _Handle()}
        self.methods = {deployment: reach}
        self.ongoing = 0
        self.draining = False
        self.header_timeout_s: float | None = None
        self.set_limits(limits)

    def set_limits(self, limits: dict) -> None:
        self.max_body_bytes, self.max_header_bytes = limits["max_body_bytes"], limits["max_header_bytes"]
        self.request_timeout_s: float | None = limits.get("request_timeout_s")

    def unknown_method(self, name: str, method: str, via: str = "grpc") -> str | None:
        return self.methods[name].refusal(name, method, via)

    def failed(self, exc: BaseException, name: str | None, method: str, note: dict | None) -> tuple[int, str, str]:
        """``status_of(exc)``, a 500's traceback in this replica's log under the call's request id."""
        status, error, detail = status_of(exc)
        if status >= 500:
            log.error("gRPC call %s to %s.%s failed (%d):\n%s", note["request_id"] if note else "-", name, method,
                      status, ANSI.sub("", "".join(traceback.format_exception(exc))))
        return status, error, detail

    async def unready(self) -> tuple[str, str] | None:
        return None  # (the balancer sends nothing to a replica that is not serving)

    @staticmethod
    def _request(name: str, note: dict) -> RequestContext:
        app = appnames.of(name)
        return RequestContext(route=app, request_id=note["request_id"], app_name=app,
                              multiplexed_model_id=note.get("model", ""))

    async def call(self, name: str, method: str, args: tuple, kwargs: dict, note: dict | None = None,
                   **_: Any) -> Any:
        """One unary call on this replica, within ``request_timeout_s`` (``rankcore.RequestTimeout``
        past it: ``DEADLINE_EXCEEDED``; the call is cancelled, its slot freed)."""
        assert note is not None
        return await within(self.run(method, args, kwargs, self._request(name, note), call_began()),
                            self.request_timeout_s, name)

    async def send(self, handle: _Handle, name: str, args: tuple, kwargs: dict, timeout: float | None,
                   request: RequestContext | None = None, routing_key: str = "") -> _Items:
        """A generator method's (or a ``grpc_context`` entry's) items on this replica (``GrpcFront``
        bounds the first by ``request_timeout_s`` and cancels one its client left; ``routing_key``:
        no router to tell, the call is here)."""
        assert request is not None
        return _Items(self.stream(handle.method, args, kwargs, request, call_began()))


async def start(deployment: str, reach: Reachable, run: Run, stream: Stream, metrics: Any, limits: dict,
                servicer_functions: Sequence[str], host: str) -> GrpcFront:
    """This replica's gRPC server of ``servicer_functions`` on ``host`` (a free port: the front's
    ``address``): gRPC over HTTP/1.1 (``base.grpc_h1``: HAProxy converts each call), answered by the
    front's handlers (its ``h1`` the server)."""
    front = GrpcFront(ReplicaIngress(deployment, reach, run, stream, metrics, limits), servicer_functions, _cancel)
    front.h1 = GrpcH1Server(front)
    front.address = await front.h1.start(host)
    return front

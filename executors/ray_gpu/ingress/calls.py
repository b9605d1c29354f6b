"""A deployment's handle behind two functions, as the ingress calls it: ``_submit`` (a call sent, its
request context set) and ``_answer`` (its result, the client watched while it runs: gone, the call is
cancelled and 499 counted), with what a route exposes (``public_methods``). Split from ``http``
(issue 66).
"""

from __future__ import annotations

import asyncio
from typing import Any

import rankcore as rc

from ..base import appnames, persist
from ..base.context import RequestContext, _serve_request_context
from ..base.exposed import Reachable, reachable
from .words import WATCH_AFTER_S

_NOTHING = object()  # (a stream without items)
_UNKNOWN = Reachable.unknown()  # (a deployment whose methods the proxy was not told)


async def _first(items: Any) -> Any:
    """A stream's first item, or ``_NOTHING``."""
    try:
        return await items.__anext__()
    except StopAsyncIteration:
        return _NOTHING


def _declares_body(request: Any) -> bool:
    """Whether the request's head announces a body (a Content-Length above 0, or chunks)."""
    headers = request.headers
    return headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers


def _submit(handle: Any, name: str, args: tuple, kwargs: dict, request: RequestContext | None = None) -> Any:
    """Send the call (on this loop or a call thread) with ``request`` as the current request, so
    the handle carries its id and route to the replica (as Serve's proxy sets
    ``_serve_request_context`` before it calls its handle). A handle's own ``TimeoutError`` here
    means no replica took it: 503, not the caller's 408."""
    token = _serve_request_context.set(request)
    try:
        return handle.remote(*args, **kwargs)
    except rc.RequestError:
        raise
    except TimeoutError as exc:
        raise rc.Unavailable(f"no replica of {name!r} took the call: {exc}", deployment=name) from exc
    finally:
        _serve_request_context.reset(token)


#: the header a request names its multiplexed model in (Serve's ``SERVE_MULTIPLEXED_MODEL_ID``)
MODEL_ID_HEADER = b"serve_multiplexed_model_id"


def public_methods(cls: Any) -> Reachable:
    """What HTTP and gRPC may call on a deployment of class ``cls`` (``base.exposed.reachable``):
    over HTTP ``__call__`` and the ``@http_method`` ones, over gRPC its public methods; never a
    lifecycle method or a ``@multiplexed`` loader."""
    return reachable(cls)


def _methods_of(deployment: str) -> Reachable:
    """(Where a route is added: the caller of ``expose`` has the deployment's class importable.)
    ``public_methods`` of the class the controller last applied for ``deployment``, read from what
    it stored (``persist.load_specs``); ``Reachable.unknown()`` when that cannot be read here."""
    try:
        spec = (persist.load_specs() or {}).get(deployment)
    except Exception:  # (a class this process cannot import: __call__ over HTTP, no lifecycle method)
        return Reachable.unknown()
    return public_methods(spec.get("cls")) if isinstance(spec, dict) else Reachable.unknown()


def _request_of(note: dict | None) -> RequestContext | None:
    """What the replica's user code sees of this HTTP request: its id (``x-request-id``), route, and
    the multiplexed model its ``serve_multiplexed_model_id`` header names."""
    if note is None:
        return None
    return RequestContext(route=note["route"], request_id=note["request_id"], app_name=appnames.of(note["deployment"]),
                          multiplexed_model_id=note.get("model", ""))


class ClientGone(Exception):
    """The client closed its connection before its answer was complete (nginx's 499)."""


async def _client_gone(receive: Any) -> None:
    """Return once the client has gone: past the body, uvicorn answers ``receive()`` with
    ``http.disconnect`` only when the connection is lost (or the response is complete)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(response: Any, receive: Any, timeout: float | None) -> tuple[bool, Any]:
    """Wait for ``response`` (awaited on this loop: no thread), for the client's going away
    (``receive``, when given; watched only once the answer is ``WATCH_AFTER_S`` late, so that a
    quick answer pays for no watcher) and for ``timeout``: ``(True, result)``, or ``(False,
    None)`` when the time ran out; ``ClientGone`` when the client went away; the call's own error
    raised as is. The response itself is left alone (``call`` cancels it through the handle)."""
    answer = asyncio.ensure_future(response)
    if receive is None:
        done, _ = await asyncio.wait((answer,), timeout=timeout)
    else:
        grace = WATCH_AFTER_S if timeout is None else min(WATCH_AFTER_S, timeout)
        done, _ = await asyncio.wait((answer,), timeout=grace)
        left = None if timeout is None else timeout - grace
        if not done and (left is None or left > 0):
            watch = asyncio.ensure_future(_client_gone(receive))
            try:
                done, _ = await asyncio.wait((answer, watch), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watch.cancel()
            if answer not in done and watch in done:
                answer.add_done_callback(_retrieved)
                raise ClientGone()
    if answer not in done:
        answer.add_done_callback(_retrieved)
        return False, None
    return True, answer.result()


def _retrieved(task: Any) -> None:
    """(A dropped answer's outcome read, so asyncio does not warn that it never was.)"""
    if not task.cancelled():
        task.exception()


def _progress(response: Any) -> dict | None:
    """Where a sent request stands, as an event: the handle's ``response.status()``
    (``rankcore.requests.RequestStatus``) where it has one, else ``dispatched`` (a response
    exists: the handle has sent the call to a replica)."""
    status = getattr(response, "status", None)
    if not callable(status):
        return {"state": "dispatched"}
    st = status()
    if st is None:
        return None
    return {"state": st.state, "position": st.position, "replica_id": st.replica_id, "attempt": st.attempt}


def _cancel(response: Any) -> None:
    """A caller gone or timed out: cancel the call where the handle can."""
    cancel = getattr(response, "cancel", None)
    if callable(cancel):
        try:
            cancel()
        except Exception:
            pass


def _replica_of(response: Any) -> str | None:
    """The replica the router sent a call to (None: not dispatched)."""
    return getattr(getattr(response, "call", None), "replica_id", None)


def _cancel_sent(submit: Any) -> None:
    """``submit`` done: cancel the call it sent (if it sent one)."""
    if not submit.cancelled() and submit.exception() is None:
        _cancel(submit.result())

"""What a replica knows about itself: ``get_replica_context()`` inside a replica; and what it knows
about the request it is answering: ``_get_serve_request_context()`` (Ray Serve's name).

Each replica is its own Ray actor process, so one module-level context per
process is exact. The executor updates it *before* calling the user's
``reconfigure``, so the context already shows the new rank there.

The request context is per call, so it is a ``contextvars.ContextVar`` (as Serve's
``_serve_request_context``), never a global: concurrent calls of one replica each see their
own. The replica sets it around the user's method (in the thread or task that runs it); a
handle call made while it is set carries its ``request_id`` on (Serve's
``get_request_metadata``), else the call gets a new one (``generate_request_id``).
"""

from __future__ import annotations

import contextvars
import threading
import uuid
from typing import Any

import attrs

import rankcore as rc

__all__ = ["ReplicaContext", "get_replica_context", "RequestContext", "_get_serve_request_context",
           "generate_request_id"]


@attrs.frozen
class ReplicaContext:
    """``bundle_indices``: a static deployment's rank's bundles
    (``replica_bundle_mapping[rank]``; the replica runs on the first), and
    ``placement_group`` the caller's group they belong to, so the replica can
    start its own workers there (None for other deployments). ``gang``: a gang
    member's ``rankcore.GangContext`` (``gang_id``, ``rank_in_gang``,
    ``gang_size``, ``members`` in gang-rank order; None outside gangs). ``group``: a
    ``collective_group`` deployment's ``rankcore.GroupContext``, its collective group's epoch as the
    core last told it (``epoch``, ``rank``, ``world_size``, ``members``; None before the first epoch
    forms; ``executors.ray_gpu.collective`` re-forms a ``torch.distributed`` group from it).
    ``weights_version``: the weights version the replica holds (0: its
    class's own; each push raises it); ``tier``: ``"hot"`` (on its device,
    serving) or ``"warm"`` (asleep: in CPU memory)."""

    deployment: str
    replica_id: str
    rank: rc.ReplicaRank
    world_size: int
    user_config: Any = attrs.field(default=None, eq=False)
    bundle_indices: tuple[int, ...] | None = None
    placement_group: Any = attrs.field(default=None, eq=False)
    gang: rc.GangContext | None = None
    weights_version: int = 0
    group: rc.GroupContext | None = None
    tier: str = "hot"


_lock = threading.Lock()
_current: ReplicaContext | None = None


def _set(ctx: ReplicaContext) -> None:
    global _current
    with _lock:
        _current = ctx


def get_replica_context() -> ReplicaContext:
    """The calling replica's deployment, id, rank record and world_size (and
    its bundles and gang, see ``ReplicaContext``).

    Raises RuntimeError outside a replica (or before it was initialised).
    """
    ctx = _current
    if ctx is None:
        raise RuntimeError("get_replica_context() is only available inside a rankcore replica")
    return ctx


@attrs.frozen
class RequestContext:
    """The request a replica is answering (Ray Serve's ``ray.serve.context._RequestContext``, the
    fields rankcore has): ``request_id``: the HTTP request's ``X-Request-Id`` (kept or made by the
    ingress) or, for a call made from Python, a new one (or the one of the request it was made
    inside); ``route``: the HTTP route prefix the request matched (``""`` for a handle call made
    outside a request); ``app_name``: the application the deployment belongs to (``base.appnames``:
    ``serve.run``'s ``name``, a config file's; a deployment no application holds is its own);
    ``multiplexed_model_id``: the model the request names ("" none: ``handle.options(
    multiplexed_model_id=...)``, the ``serve_multiplexed_model_id`` header, the gRPC
    ``multiplexed_model_id`` metadata; read it with ``get_multiplexed_model_id()``)."""

    route: str = ""
    request_id: str = ""
    app_name: str = ""
    multiplexed_model_id: str = ""


#: the request the running user code answers (Serve's ``_serve_request_context``; None outside one)
_serve_request_context: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "rankcore request context", default=None)


def _get_serve_request_context() -> RequestContext:
    """The request the calling code is answering (Ray Serve's accessor, same name:
    ``_get_serve_request_context().request_id``); an empty ``RequestContext`` outside a request."""
    ctx = _serve_request_context.get()
    return ctx if ctx is not None else RequestContext()


def generate_request_id() -> str:
    """A new request id: a UUID4 string, as Ray Serve's ``generate_request_id``."""
    return str(uuid.uuid4())


_app_of: Any = None  # (``base.appnames.of``, once imported: a handle call asks it every time)


def _app(deployment: str) -> str:
    """The application ``deployment`` belongs to (``base.appnames``, imported here on first use: a
    scenario replica's process imports this module alone, never the control package)."""
    global _app_of
    if _app_of is None:
        from . import appnames

        _app_of = appnames.of
    return str(_app_of(deployment))


def model_request(app_name: str, model_id: str) -> RequestContext | None:  # (app_name: the deployment's)
    """The request context of a call that names only a multiplexed model (the gRPC proxy's, an
    HTTP call with no note); None when it names none."""
    return RequestContext(app_name=_app(app_name), multiplexed_model_id=model_id) if model_id else None


def request_for_call(app_name: str, model_id: str = "") -> RequestContext:  # (app_name: the deployment's)
    """The request context a handle call carries to its replica: the current request's id and route
    when the call is made inside one (Serve's ``get_request_metadata``), else a new id; and the
    handle's ``multiplexed_model_id`` (never the current request's: as Serve, a call names its
    model through its handle's options)."""
    cur = _serve_request_context.get()
    app_name = _app(app_name)
    if cur is not None and cur.request_id:
        return RequestContext(route=cur.route, request_id=cur.request_id, app_name=app_name,
                              multiplexed_model_id=model_id)
    return RequestContext(route=cur.route if cur is not None else "", request_id=generate_request_id(),
                          app_name=app_name, multiplexed_model_id=model_id)


def to_wire(request: RequestContext | None) -> tuple[str, str, str, str] | None:
    """``request`` as a plain tuple for a call's one argument to its replica (``from_wire`` there):
    Ray sends plain types by msgpack, where an attrs object is pickled, about 80 us a call."""
    if request is None:
        return None
    return (request.route, request.request_id, request.app_name, request.multiplexed_model_id)


def from_wire(sent: tuple[str, str, str, str] | None) -> RequestContext | None:
    """What ``to_wire`` sent, as the ``RequestContext`` the replica's user code reads."""
    return None if sent is None else RequestContext(*sent)

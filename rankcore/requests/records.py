"""The request machine's records: the events it takes, the actions it gives,
what it answers about a request, a deployment's counters and its pool.

Frozen, slotted, keyword-only attrs records that validate on construction
(like ``rankcore/base/events.py``): a malformed one raises ``InvalidConfig``
naming the record, the field and the value, so it never reaches the machine.

Internal module: import its public names from ``rankcore.requests``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..base import fields as f
from ..base.errors import InvalidConfig
from ..base.options import MAX_ONGOING_REQUESTS, MAX_QUEUED_REQUESTS, MAX_RETRIES

__all__ = [
    "REJECT_REASONS",
    "FAIL_REASONS",
    "STATES",
    "Configure",
    "Submit",
    "Started",
    "Completed",
    "NotDelivered",
    "Cancel",
    "Tick",
    "ReplicaLocated",
    "Dispatch",
    "Rejected",
    "Failed",
    "CancelOnReplica",
    "RequestStatus",
    "Counters",
    "ReplicaView",
]

#: why a request ended before any replica ran it (``Rejected.reason``), with the
#: HTTP status an ingress answers: 503, 503, 408, 404, and none (the caller left)
REJECT_REASONS = ("overloaded", "unavailable", "timeout", "unknown_deployment", "cancelled")
#: why a request ended without an answer after a replica had started it (``Failed.reason``)
FAIL_REASONS = ("replica_died", "timeout")
#: ``RequestStatus.state``: live ones first, then the ends
STATES = ("queued", "loading", "dispatched", "running", "done", "failed", "rejected", "cancelled")


def _where(inst: Any, attribute: attrs.Attribute) -> str:
    return f"{type(inst).__name__}.{attribute.name}"


def _clock(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """A finite number on the executor's clock (any origin)."""
    if not f.finite(value):
        raise InvalidConfig(f"{_where(inst, attribute)} must be a finite number, got {f.shown(value)}")


def _optional_clock(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None:
        _clock(inst, attribute, value)


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in choices:
            raise InvalidConfig(f"{_where(inst, attribute)} must be one of {choices}, got {f.shown(value)}")
    return check


def _keywords(value: Any) -> Any:
    """A router's keywords: a mapping, or the ``(name, value)`` pairs a deployment's option holds."""
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        return dict(value)
    return value


# ---------------------------------------------------------------- events (in)


@attrs.frozen(kw_only=True)
class Configure:
    """``deployment``'s request limits, Ray Serve's names and defaults: at most
    ``max_ongoing_requests`` in flight per replica, at most
    ``max_queued_requests`` waiting (-1: no limit), a started idempotent
    request retried up to ``max_retries`` times. Again on a live deployment:
    the new limits hold from now on (nothing already queued or in flight is
    ejected)."""

    deployment: str = attrs.field(validator=f.name)
    #: (the defaults: a deployment's options, declared once in rankcore/base/options.py, RequestOptions)
    max_ongoing_requests: int = attrs.field(default=MAX_ONGOING_REQUESTS, validator=f.positive_int)
    max_queued_requests: int = attrs.field(default=MAX_QUEUED_REQUESTS, validator=f.queue_limit)
    max_retries: int = attrs.field(default=MAX_RETRIES, validator=f.count)
    #: the deployment's router by name ("": the machine's own rule, least in flight; rankcore.requests.routing)
    #: and its keywords (Ray Serve's ``request_router_config``: ``request_router_class``, ``request_router_kwargs``)
    request_router: str = attrs.field(default="", validator=f.text)
    request_router_kwargs: Any = attrs.field(factory=dict, hash=False, converter=_keywords)

    @request_router_kwargs.validator
    def _check_kwargs(self, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise InvalidConfig(f"Configure({self.deployment!r}).request_router_kwargs must be a mapping of "
                                f"keywords, got {f.shown(value)}")


@attrs.frozen(kw_only=True)
class Submit:
    """A caller sent ``request_id`` to ``deployment``. ``idempotent``: it may run
    again after a replica died while running it; ``stream``: its answer is a
    stream (never retried once started: the caller may hold part of it);
    ``deadline``: on the executor's clock, compared only with ``Tick.now``;
    ``model_id``: Serve's multiplexed model id; ``reports_started``: the executor
    will send this request's ``Started`` (a call whose replica tells it began,
    as ``RequestMachine(reports_started=True)`` says of every request): if its
    replica dies before, it never ran, and it is queued again, not failed.
    Ids must be unique among the machine's live and remembered requests."""

    request_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    idempotent: bool = attrs.field(default=False, validator=f.flag)
    stream: bool = attrs.field(default=False, validator=f.flag)
    deadline: float | None = attrs.field(default=None, validator=_optional_clock)
    #: the multiplexed model it asks for ("" none): routed to a replica that holds it
    #: (``rankcore.requests.route_model``)
    model_id: str = attrs.field(default="", validator=f.text)
    reports_started: bool = attrs.field(default=False, validator=f.flag)
    #: what a router may route by (rankcore.requests.routing): a session key (``consistent_hash``),
    #: the text whose prefix a replica may have cached (``prefix_affinity``), and the caller's node
    #: and availability zone (``locality``; "" unknown)
    routing_key: str = attrs.field(default="", validator=f.text)
    prefix: str = attrs.field(default="", validator=f.text)
    caller_node: str = attrs.field(default="", validator=f.text)
    caller_zone: str = attrs.field(default="", validator=f.text)


@attrs.frozen(kw_only=True)
class Started:
    """The replica began running ``request_id``. Optional: see
    ``RequestMachine(reports_started=...)``. ``replica_id``, when given, must
    be the replica it was dispatched to; otherwise the event is stale (counted
    late, ignored)."""

    request_id: str = attrs.field(validator=f.name)
    replica_id: str | None = attrs.field(default=None, validator=f.optional_name)


@attrs.frozen(kw_only=True)
class Completed:
    """The replica answered ``request_id``: ``ok=False`` means the application
    raised; that is still an answer (the caller gets the error, Ray Serve's 500
    with the traceback) and is never retried. ``replica_id`` as in ``Started``."""

    request_id: str = attrs.field(validator=f.name)
    ok: bool = attrs.field(default=True, validator=f.flag)
    replica_id: str | None = attrs.field(default=None, validator=f.optional_name)


@attrs.frozen(kw_only=True)
class NotDelivered:
    """The executor could not hand ``request_id`` to its replica (it never
    started there): it goes back to the head of the queue, and that replica
    gets nothing new until a ``PoolChanged`` / ``PoolReset`` names it again.
    ``replica_id`` as in ``Started``."""

    request_id: str = attrs.field(validator=f.name)
    replica_id: str | None = attrs.field(default=None, validator=f.optional_name)


@attrs.frozen(kw_only=True)
class Cancel:
    """The caller gave up on ``request_id`` (a client disconnected)."""

    request_id: str = attrs.field(validator=f.name)


@attrs.frozen(kw_only=True)
class Tick:
    """The executor's clock reads ``now`` (never going back): every request whose
    deadline is ``<= now`` ends. The core's ``rankcore.Tick`` is taken too."""

    now: float = attrs.field(validator=_clock)


@attrs.frozen(kw_only=True)
class ReplicaLocated:
    """Where ``replica_id`` of ``deployment`` runs: its node (the core's ``Replica.node_id``) and that
    node's availability zone (its ``ZONE_LABEL`` label; "" none), read by the ``locality`` router.
    The executor sends it with the replica's first serving membership (a fact from the core's state,
    like ``ReplicaModels``); for a replica not in the pool it changes nothing. No answer."""

    deployment: str = attrs.field(validator=f.name)
    replica_id: str = attrs.field(validator=f.name)
    node_id: str = attrs.field(validator=f.text)
    zone: str = attrs.field(default="", validator=f.text)


# -------------------------------------------------------------- actions (out)


@attrs.frozen(kw_only=True)
class Dispatch:
    """Send ``request_id`` to ``replica_id``. ``attempt``: 0 the first time a
    replica runs it, +1 for each retry after a replica died while running it."""

    request_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    replica_id: str = attrs.field(validator=f.name)
    attempt: int = attrs.field(validator=f.count)


@attrs.frozen(kw_only=True)
class Rejected:
    """``request_id`` ended before any replica ran it (``REJECT_REASONS``);
    ``detail`` says why in words, for the caller."""

    request_id: str = attrs.field(validator=f.name)
    reason: str = attrs.field(validator=_one_of(REJECT_REASONS))
    detail: str = attrs.field(default="", validator=f.text)


@attrs.frozen(kw_only=True)
class Failed:
    """``request_id`` ended without an answer after replica ``replica_id`` had
    started it (``FAIL_REASONS``); ``detail`` names the replica and why."""

    request_id: str = attrs.field(validator=f.name)
    reason: str = attrs.field(validator=_one_of(FAIL_REASONS))
    replica_id: str | None = attrs.field(default=None, validator=f.optional_name)
    detail: str = attrs.field(default="", validator=f.text)


@attrs.frozen(kw_only=True)
class CancelOnReplica:
    """Best effort: tell ``replica_id`` to stop running ``request_id``, which has
    ended. Its slot stays taken until the replica answers it (the answer is
    counted late) or leaves the pool."""

    request_id: str = attrs.field(validator=f.name)
    replica_id: str = attrs.field(validator=f.name)


# ---------------------------------------------------------------- read models


@attrs.frozen(kw_only=True)
class RequestStatus:
    """Where a request stands (``RequestMachine.status``). ``position``: its
    0-based place in its deployment's queue while queued or loading, else
    None. ``replica_id``: the replica holding it (dispatched, running), or the
    one that ended it. ``reason``: why it ended, for the ends other than done
    (``"app_error"`` for an answer that is an application error)."""

    request_id: str
    state: str = attrs.field(validator=_one_of(STATES))
    deployment: str
    position: int | None = None
    replica_id: str | None = None
    attempt: int = 0
    reason: str | None = None


@attrs.frozen(kw_only=True)
class Counters:
    """What happened to the requests of one deployment, or of all.
    ``rejected`` by reason (``"cancelled"`` is counted in ``cancelled``, not
    here); ``late``: events about a request that had already ended or moved on
    to another replica (ignored); ``lost`` is always 0."""

    submitted: int
    dispatched: int
    answered: int
    app_errors: int
    retried: int
    failed: int
    rejected: dict[str, int] = attrs.field(eq=True, hash=False)
    cancelled: int
    late: int
    in_queue: int
    in_flight: int

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def lost(self) -> int:
        """Accepted and neither answered, ended with an error, queued nor in flight."""
        return self.submitted - (self.answered + self.app_errors + self.failed + self.rejected_total
                                 + self.cancelled + self.in_queue + self.in_flight)


@attrs.frozen(kw_only=True)
class ReplicaView:
    """One replica of a pool, for a status page: its membership (``"serving"``
    or ``"draining"``), the slots it holds (``in_flight``: requests it runs,
    ended ones it has not answered yet included) and whether a
    ``NotDelivered`` keeps it from new work (``excluded``), the multiplexed
    models it holds or loads (``models``: as last reported, with those sent to it since),
    and whether it is left out of new work for its silence while its peers answer
    (``quiet``: ``rankcore.requests.outliers``)."""

    replica_id: str
    membership: str
    in_flight: int
    excluded: bool
    models: tuple[str, ...] = ()
    quiet: bool = False

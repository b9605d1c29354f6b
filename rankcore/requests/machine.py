"""The request path as a sans-IO machine (issue 22): events in, actions out.

``RequestMachine.handle(event) -> list[action]``, h11's shape: no I/O, no clock
(time comes in as ``Tick(now)``), no randomness, no threads. Requests do not
go through ``rankcore.step``: per-request state would flood the control-plane
state and its trace. The control core tells this machine who serves with
``PoolChanged`` / ``PoolReset`` / ``PoolComing``, which it takes as events as
they are.

Per deployment: one FIFO queue, the pool's replicas with the slots each holds
(at most ``max_ongoing_requests``), dispatch to the serving replica with the
fewest in flight (ties: round-robin in pool-join order), retries of idempotent
requests whose replica died, cancellation, deadlines, back-pressure
(``max_queued_requests``). Every accepted request ends exactly once; the
counters prove nothing is lost. Rules and the event -> action table:
docs/requests.md.

Mutable and NOT thread-safe: an executor holds a lock around ``handle`` and
the reads. Deterministic: the same events give the same actions (no hash
order, no clock). Each event costs O(log n) in the replicas and queued
requests (amortised; no scan of every request), except ``Configure`` changing
``max_ongoing_requests``, ``PoolReset``, dispatching a request with a multiplexed model id
(``Submit.model_id``: the replicas are compared, ``rankcore.requests.route_model``) and dispatching
through a deployment's router (``Configure.request_router``: its candidates listed,
``rankcore.requests.routing``), O(replicas).

Public module for executors: ``from rankcore.requests import RequestMachine, Submit, ...``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict
from heapq import heapify, heappop, heappush
from typing import Any, Union, cast

from ..base import events as _core_events
from ..base.commands import POOL_MEMBERSHIPS, PoolChanged, PoolComing, PoolReset
from ..base.errors import InvalidConfig, InvalidEvent, UnknownDeployment
from ..base.fields import check_record, shown
from ..base.options import MAX_ONGOING_REQUESTS, MAX_QUEUED_REQUESTS, MAX_RETRIES
from ..base.records import maker
from .multiplex import ReplicaModels, route_model
from .outliers import QUIET_AFTER_S, quiet
from .queue import RequestQueue
from .records import (
    FAIL_REASONS,
    REJECT_REASONS,
    STATES,
    Cancel,
    CancelOnReplica,
    Completed,
    Configure,
    Counters,
    Dispatch,
    Failed,
    NotDelivered,
    Rejected,
    ReplicaLocated,
    ReplicaView,
    RequestStatus,
    Started,
    Submit,
    Tick,
)
from .routing import Candidate, Router, RouteRequest, RouterError, make_router

__all__ = [
    "RequestMachine",
    "RequestEvent",
    "RequestAction",
    "REMEMBER_ENDED",
    "MODEL_ASKS_HALF_LIFE",
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
    "Dispatch",
    "Rejected",
    "Failed",
    "CancelOnReplica",
    "RequestStatus",
    "Counters",
    "ReplicaView",
    "PoolChanged",
    "PoolReset",
    "PoolComing",
    "ReplicaModels",
    "ReplicaLocated",
]

RequestEvent = Union[Configure, Submit, Started, Completed, NotDelivered, Cancel, Tick, PoolChanged, PoolReset,
                     PoolComing, ReplicaModels, ReplicaLocated, _core_events.Tick]
RequestAction = Union[Dispatch, Rejected, Failed, CancelOnReplica]

#: every ``MODEL_ASKS_HALF_LIFE`` requests with a model id, a deployment's counts of how often each
#: model was asked for halve (``route_model``'s eviction choice follows what is popular now)
MODEL_ASKS_HALF_LIFE = 1000

#: how many ended requests the machine remembers by default (for ``status`` and
#: to tell a late event from an unknown id); older ones are forgotten
REMEMBER_ENDED = 10_000

_QUEUED, _DISPATCHED, _RUNNING = "queued", "dispatched", "running"
#: rejected counters: every reason but "cancelled" (counted on its own)
_REJECT_COUNTED = tuple(r for r in REJECT_REASONS if r != "cancelled")

# actions the machine builds from values it holds valid: no validators
_dispatch = maker(Dispatch)
_rejected = maker(Rejected)
_failed = maker(Failed)
_cancel_on = maker(CancelOnReplica)


_Candidate = maker(Candidate)


def _hook(name: str, dep: _Dep, what: str, fn: Any, *args: Any) -> None:
    """A router's ``dispatched`` / ``forget``; one that raised is a ``RouterError`` naming it."""
    try:
        fn(*args)
    except Exception as exc:
        raise RouterError(f"request router {name!r} of {dep.name!r} raised {exc!r} in {what}()") from exc


def _route_of(req: _Request) -> RouteRequest:
    """What ``req``'s router may read of it."""
    return RouteRequest(req.rid, req.key, req.prefix, req.model, *req.caller)


class _Request:
    """A live request (or an ended one its replica still holds: ``final`` set)."""

    __slots__ = ("rid", "dep", "seq", "idempotent", "stream", "deadline", "model", "attempt", "state", "replica",
                 "slot", "ran_on", "last", "final", "reason", "tells_start", "sent", "key", "prefix", "caller")

    def __init__(self, rid: str, dep: _Dep, seq: int, ev: Submit) -> None:
        self.rid = rid
        self.dep = dep
        self.seq = seq  # submission order: the queue's order, the deadline heap's tie-break
        self.idempotent = ev.idempotent
        self.stream = ev.stream
        self.deadline = ev.deadline
        self.model = ev.model_id  # its multiplexed model ("" none)
        self.tells_start = ev.reports_started  # its Started will come (else: the machine's reports_started)
        self.attempt = 0
        self.state = _QUEUED
        self.replica: _Replica | None = None
        self.slot: int | None = None  # where in the queue: an index of RequestQueue.main, FRONT, None
        self.ran_on: str | None = None  # the replica that last died while running it
        self.last: str | None = None  # the replica it was last dispatched to
        self.final: str | None = None
        self.reason: str | None = None
        self.sent: float | None = None  # the clock when last dispatched (None: no Tick yet)
        self.key, self.prefix = ev.routing_key, ev.prefix  # what a router may route by (``_route_of``)
        self.caller = (ev.caller_node, ev.caller_zone)


class _Replica:
    __slots__ = ("rid", "join", "serving", "excluded", "held", "models", "heard", "quiet", "node", "zone", "offered")

    def __init__(self, rid: str, join: int) -> None:
        self.rid = rid
        self.join = join  # pool-join order: the round-robin order
        self.serving = False
        self.excluded = False  # a NotDelivered: nothing new until the pool names it again
        self.held: dict[str, _Request] = {}  # its slots, in dispatch order
        self.heard: float | None = None  # the clock when it last answered or started a request
        self.quiet = False  # silent while its peers answer (``outliers.quiet``): nothing new until it speaks
        #: the multiplexed models it holds or loads: as last reported, with those sent to it since
        self.models: dict[str, None] = {}
        self.node = self.zone = ""  # where it runs ("" unknown: ``ReplicaLocated``)
        #: what a router was last offered of it (None: its models or place changed since)
        self.offered: Candidate | None = None

    def offer(self) -> Candidate:
        """It as a router's candidate: the one last built while it holds as many requests and its
        models and place are the same (a dispatch changes one or two replicas' counts, not 64)."""
        c = self.offered
        k = len(self.held)
        if c is None or c.in_flight != k:
            c = self.offered = _Candidate(replica_id=self.rid, in_flight=k, join=self.join, models=tuple(self.models),
                                          node_id=self.node, zone=self.zone)
        return c


class _Dep:
    """One deployment: its limits, pool, queue and counters."""

    __slots__ = ("name", "configured", "max_ongoing", "max_queued", "max_retries", "coming", "replicas", "by_join",
                 "next_join", "serving", "free", "lows", "low_set", "last_join", "queue", "in_flight",
                 "submitted", "dispatched", "answered", "app_errors", "retried", "failed", "rejected", "cancelled",
                 "late", "asked", "asks", "heard", "router", "router_spec")

    def __init__(self, name: str) -> None:
        self.name = name
        self.configured = False
        self.max_ongoing = MAX_ONGOING_REQUESTS  # (the options' defaults until its Configure)
        self.max_queued = MAX_QUEUED_REQUESTS
        self.max_retries = MAX_RETRIES
        self.coming = False
        self.replicas: dict[str, _Replica] = {}  # in join order
        self.by_join: dict[int, _Replica] = {}
        self.next_join = 0
        self.serving = 0  # replicas serving (excluded ones too)
        # the replicas that can take a request now (serving, not excluded, a
        # free slot), by how many they hold: sorted join numbers; ``lows`` is a
        # heap of the counts that may have some (``low_set``: those in it)
        self.free: dict[int, list[int]] = {}
        self.lows: list[int] = []
        self.low_set: set[int] = set()
        self.last_join = -1  # the replica chosen last
        self.queue: RequestQueue[_Request] = RequestQueue()
        #: multiplexed model -> how often it was asked for lately (``route_model``'s eviction choice:
        #: the replica whose least recently used model is asked for least); every count halves each
        #: ``MODEL_ASKS_HALF_LIFE`` requests with a model id (``asks`` counts them), so it follows a
        #: change of what is popular
        self.asked: dict[str, int] = {}
        self.asks = 0
        self.in_flight = 0  # live requests on replicas
        self.heard: float | None = None  # the clock when any of its replicas last answered or started one
        self.submitted = self.dispatched = self.answered = self.app_errors = 0
        self.retried = self.failed = self.cancelled = self.late = 0
        self.rejected = dict.fromkeys(_REJECT_COUNTED, 0)
        #: its router (None: ``choose``, the machine's own rule) and what built it (name, sorted keywords)
        self.router: Router | None = None
        self.router_spec: tuple = ("", ())

    # -- the replicas that can take a request now

    def enter(self, rep: _Replica) -> None:
        """Put ``rep`` among the free ones if it can take a request."""
        k = len(rep.held)
        if rep.serving and not rep.excluded and not rep.quiet and k < self.max_ongoing:
            lst = self.free.get(k)
            if lst is None:
                lst = self.free[k] = []
            if k not in self.low_set:
                self.low_set.add(k)
                heappush(self.lows, k)
            insort(lst, rep.join)

    def leave(self, rep: _Replica) -> None:
        """Take ``rep`` out of the free ones (before its slots or membership change)."""
        k = len(rep.held)
        if rep.serving and not rep.excluded and not rep.quiet and k < self.max_ongoing:
            lst = self.free[k]
            del lst[bisect_left(lst, rep.join)]

    def choose(self) -> _Replica | None:
        """The free replica holding fewest; ties: the next after the last chosen
        in pool-join order (round-robin)."""
        lows, free = self.lows, self.free
        while lows:
            lst = free[lows[0]]
            if lst:
                i = bisect_right(lst, self.last_join)
                return self.by_join[lst[i] if i < len(lst) else lst[0]]
            self.low_set.discard(heappop(lows))
        return None

    def takers(self) -> list[_Replica]:
        """The replicas that can take a request now (those ``enter`` keeps in ``free``), in pool-join
        order. O(replicas)."""
        cap = self.max_ongoing
        return [r for r in self.replicas.values() if r.serving and not r.excluded and not r.quiet and len(r.held) < cap]

    def choose_model(self, model: str) -> _Replica | None:
        """The free replica a request for multiplexed ``model`` goes to (``route_model``'s rule).
        O(replicas)."""
        asked = self.asked
        join = route_model(((r.join, len(r.held), len(r.models), model in r.models,
                             asked.get(next(iter(r.models)), 0) if r.models else -1) for r in self.takers()),
                           self.last_join)
        return None if join is None else self.by_join[join]

    def pick(self, model: str) -> _Replica | None:
        """The machine's own rule: a free holder of ``model`` (``choose_model``) when it names one,
        else the free replica holding fewest (``choose``)."""
        return self.choose_model(model) if model else self.choose()

    def ask(self, model: str) -> None:
        """A request for ``model``: counted (amortised O(1): the halving is O(models) every
        ``MODEL_ASKS_HALF_LIFE`` requests)."""
        asked = self.asked
        asked[model] = asked.get(model, 0) + 2
        self.asks += 1
        if self.asks >= MODEL_ASKS_HALF_LIFE:
            self.asks = 0
            self.asked = {m: n // 2 for m, n in asked.items() if n > 1}

    def rebuild_free(self) -> None:
        self.free, self.lows, self.low_set = {}, [], set()
        for rep in self.replicas.values():
            self.enter(rep)


class RequestMachine:
    """Queues, pools and dispatch of every deployment's requests. Not
    thread-safe (hold a lock). Deterministic.

    ``reports_started``: whether the executor sends ``Started``. If not (the
    default), a dispatched request counts as started: when its replica dies it
    is retried only if idempotent, never run twice otherwise (a request
    submitted with ``Submit.reports_started`` excepted: its own start is told).
    ``remember_ended``: how many ended requests ``status`` still knows and
    late events are recognised for; an older id is unknown (``status`` gives
    None, an event for it raises ``InvalidEvent``). ``quiet_after_s``: a
    replica silent this long while its peers answer gets nothing new until it
    answers again (``rankcore.requests.outliers``; judged at each ``Tick``);
    None: never."""

    def __init__(self, *, reports_started: bool = False, remember_ended: int = REMEMBER_ENDED,
                 quiet_after_s: float | None = QUIET_AFTER_S) -> None:
        if type(reports_started) is not bool:
            raise InvalidConfig(f"RequestMachine.reports_started must be a bool, got {shown(reports_started)}")
        if type(remember_ended) is not int or remember_ended < 0:
            raise InvalidConfig(f"RequestMachine.remember_ended must be an int >= 0, got {shown(remember_ended)}")
        if quiet_after_s is not None and (type(quiet_after_s) not in (int, float) or not quiet_after_s > 0
                                          or quiet_after_s == float("inf")):
            raise InvalidConfig(f"RequestMachine.quiet_after_s must be a finite number > 0 or None, "
                                f"got {shown(quiet_after_s)}")
        self.reports_started = reports_started
        self.remember_ended = remember_ended
        self.quiet_after_s = quiet_after_s
        self._quiet_due = float("-inf")  # (the clock from which the next Tick looks for quiet replicas)
        self._deps: dict[str, _Dep] = {}
        self._requests: dict[str, _Request] = {}
        # ended requests no replica holds: id -> (deployment, state, replica, attempt, reason)
        self._recent: OrderedDict[str, tuple[str, str, str | None, int, str | None]] = OrderedDict()
        self._seq = 0
        self._now: float | None = None
        self._deadlines: list[tuple[float, int, str]] = []  # (deadline, seq, id); stale entries skipped
        self._with_deadline = 0  # live requests with a deadline
        self._unknown_submitted = 0  # Submits for a deployment never configured
        self._unknown_late = 0
        self._handlers: dict[type, Any] = {
            Submit: self._submit, Completed: self._completed, Started: self._started,
            NotDelivered: self._not_delivered, Cancel: self._cancel, Tick: self._tick,
            _core_events.Tick: self._tick, Configure: self._configure, PoolChanged: self._pool_changed,
            PoolReset: self._pool_reset, PoolComing: self._pool_coming, ReplicaModels: self._replica_models,
            ReplicaLocated: self._replica_located,
        }

    # ------------------------------------------------------------------ events

    def handle(self, event: RequestEvent) -> list[RequestAction]:
        """Take one event; return the actions to carry out, in order. Bad input
        raises ``InvalidEvent`` naming what was wrong and changes nothing."""
        handler = self._handlers.get(type(event))
        if handler is None:
            raise InvalidEvent(f"the request machine takes no {type(event).__name__} (got {shown(event)})")
        try:
            check_record(event)  # (built by its constructor, or as if: one unpickled or forged is checked here)
        except InvalidConfig as exc:
            raise InvalidEvent(str(exc)) from exc  # (the machine's word for bad input)
        out: list[RequestAction] = handler(event)
        return out

    def _configure(self, ev: Configure) -> list[RequestAction]:
        spec = (ev.request_router, tuple(sorted(ev.request_router_kwargs.items())))
        old = self._deps.get(ev.deployment)
        router = None
        if (old.router_spec if old is not None else ("", ())) != spec and ev.request_router:
            router = make_router(ev.request_router, ev.request_router_kwargs)  # (refused before anything changes)
        dep = self._dep(ev.deployment)
        routed = dep.router_spec != spec
        if routed:
            dep.router, dep.router_spec = router, spec
        dep.configured = True
        dep.max_queued = ev.max_queued_requests
        dep.max_retries = ev.max_retries
        out: list[RequestAction] = []
        if ev.max_ongoing_requests != dep.max_ongoing:
            dep.max_ongoing = ev.max_ongoing_requests
            dep.rebuild_free()
            self._pump(dep, out)
        elif routed:  # (a new router: what waits goes out by it, as a queue left by a refused pick does)
            self._pump(dep, out)
        return out

    def _submit(self, ev: Submit) -> list[RequestAction]:
        rid = ev.request_id
        if rid in self._requests or rid in self._recent:
            raise InvalidEvent(f"Submit: request id {rid!r} is already in use (live or ended recently); "
                               "request ids must be unique")
        dep = self._deps.get(ev.deployment)
        if dep is None or not dep.configured:
            self._unknown_submitted += 1
            self._remember(rid, (ev.deployment, "rejected", None, 0, "unknown_deployment"))
            return [_rejected(request_id=rid, reason="unknown_deployment",
                              detail=f"no deployment named {ev.deployment!r}")]
        dep.submitted += 1
        if ev.deadline is not None and self._now is not None and ev.deadline <= self._now:
            return [self._reject_new(dep, rid, "timeout", f"its deadline {ev.deadline!r} had passed (now {self._now!r})")]
        if not dep.serving and not dep.coming:
            return [self._reject_new(dep, rid, "unavailable",
                                     f"deployment {dep.name!r} has no replica serving and none coming")]
        self._seq += 1
        if ev.model_id:
            dep.ask(ev.model_id)
        waiting = dep.queue.n
        if waiting:
            rep = None
        elif dep.router is not None:
            try:
                rep = self._route(dep, RouteRequest(ev.request_id, ev.routing_key, ev.prefix, ev.model_id,
                                                    ev.caller_node, ev.caller_zone))
            except RouterError:
                dep.submitted -= 1  # (refused whole: never accepted)
                raise
        else:
            rep = dep.choose_model(ev.model_id) if ev.model_id else dep.choose()  # (``pick``, inline: every Submit)
        if rep is None and 0 <= dep.max_queued <= waiting:
            return [self._reject_new(dep, rid, "overloaded",
                                     f"deployment {dep.name!r} has {waiting} requests queued "
                                     f"(max_queued_requests={dep.max_queued})")]
        req = _Request(rid, dep, self._seq, ev)
        self._requests[rid] = req
        if ev.deadline is not None:
            self._with_deadline += 1
            heappush(self._deadlines, (ev.deadline, self._seq, rid))
        if rep is None:
            dep.queue.push(req)
            return []
        out: list[RequestAction] = []
        self._send(dep, req, rep, out)
        return out

    def _completed(self, ev: Completed) -> list[RequestAction]:
        req = self._lookup(ev, ev.replica_id)
        if req is None:
            return []
        rep = req.replica
        if rep is None:
            raise InvalidEvent(f"Completed: request {req.rid!r} is queued: no replica holds it")
        dep = req.dep
        out: list[RequestAction] = []
        self._heard(dep, rep)
        if req.final is not None:  # ended while its replica ran it: the answer is late
            dep.late += 1
        else:
            dep.in_flight -= 1
            if ev.ok:
                dep.answered += 1
                self._end(req, "done", None)
            else:
                dep.app_errors += 1
                self._end(req, "failed", "app_error")
        self._free_slot(dep, rep, req)
        self._forget(req)
        self._pump(dep, out)
        return out

    def _started(self, ev: Started) -> list[RequestAction]:
        req = self._lookup(ev, ev.replica_id)
        if req is None:
            return []
        if req.final is not None:
            req.dep.late += 1
        elif req.state == _QUEUED:
            raise InvalidEvent(f"Started: request {req.rid!r} is queued: no replica holds it")
        elif req.state == _RUNNING:
            raise InvalidEvent(f"Started: request {req.rid!r} already started on replica {req.replica.rid!r}")  # type: ignore[union-attr]
        else:
            req.state = _RUNNING
        out: list[RequestAction] = []
        if req.replica is not None and self._heard(req.dep, req.replica):
            self._pump(req.dep, out)  # (back among the free: it may take what waits)
        return out

    def _not_delivered(self, ev: NotDelivered) -> list[RequestAction]:
        req = self._lookup(ev, ev.replica_id)
        if req is None:
            return []
        rep, dep = req.replica, req.dep
        if rep is None:
            raise InvalidEvent(f"NotDelivered: request {req.rid!r} is queued: no replica holds it")
        if req.final is None and req.state == _RUNNING:
            raise InvalidEvent(f"NotDelivered: request {req.rid!r} was reported started on replica {rep.rid!r}")
        out: list[RequestAction] = []
        dep.leave(rep)
        del rep.held[req.rid]
        rep.excluded = True
        req.replica = None
        if req.final is not None:
            dep.late += 1
            self._forget(req)
        else:
            dep.in_flight -= 1
            req.state = _QUEUED
            dep.queue.put_back(req)
        self._pump(dep, out)
        return out

    def _cancel(self, ev: Cancel) -> list[RequestAction]:
        req = self._lookup(ev, None)
        if req is None:
            return []
        dep = req.dep
        if req.final is not None:
            dep.late += 1
            return []
        dep.cancelled += 1
        rep = req.replica
        if rep is None:
            dep.queue.remove(req)
            self._end(req, "cancelled", None)
            self._forget(req)
            return [_rejected(request_id=req.rid, reason="cancelled", detail="the caller cancelled it")]
        dep.in_flight -= 1
        self._end(req, "cancelled", None)
        return [_cancel_on(request_id=req.rid, replica_id=rep.rid)]

    def _tick(self, ev: Tick | _core_events.Tick) -> list[RequestAction]:
        now = ev.now
        if self._now is not None and now < self._now:
            raise InvalidEvent(f"Tick: the clock went back from {self._now!r} to {now!r}")
        self._now = now
        heap = self._deadlines
        out: list[RequestAction] = []
        while heap and heap[0][0] <= now:
            _, seq, rid = heappop(heap)
            req = self._requests.get(rid)
            if req is None or req.seq != seq or req.final is not None:
                continue
            dep, rep = req.dep, req.replica
            if rep is None:
                dep.queue.remove(req)
                out.append(self._end_queued(req, "timeout", f"its deadline {req.deadline!r} passed (now {now!r})"))
            else:
                dep.in_flight -= 1
                dep.failed += 1
                self._end(req, "failed", "timeout")
                out.append(_failed(request_id=rid, reason="timeout", replica_id=rep.rid,
                                   detail=f"its deadline {req.deadline!r} passed on replica {rep.rid!r} (now {now!r})"))
                out.append(_cancel_on(request_id=rid, replica_id=rep.rid))
        if len(heap) > 2 * self._with_deadline + 64:  # mostly stale entries of ended requests
            live = self._requests
            self._deadlines = [e for e in heap if (r := live.get(e[2])) is not None and r.seq == e[1]
                               and r.final is None]
            heapify(self._deadlines)
        if self.quiet_after_s is not None and now >= self._quiet_due:  # (a tenth of the silence apart at most)
            self._quiet_due = now + self.quiet_after_s / 10
            self._find_quiet(now, self.quiet_after_s)
        return out

    def _find_quiet(self, now: float, after_s: float) -> None:
        """Leave out of new work each replica ``outliers.quiet`` says is silent while its peers answer.
        O(replicas holding requests) of deployments with requests in flight, at most every tenth of
        ``quiet_after_s`` of the clock (``_tick``): a replica is left out that much late at most."""
        for dep in self._deps.values():
            if not dep.in_flight or dep.heard is None:
                continue
            for rep in dep.replicas.values():
                if rep.quiet or not rep.held or not rep.serving:
                    continue
                oldest = next((r.sent for r in rep.held.values() if r.state != _RUNNING), None)
                if quiet(now, oldest, rep.heard, dep.heard, after_s):
                    dep.leave(rep)
                    rep.quiet = True

    def _heard(self, dep: _Dep, rep: _Replica) -> bool:
        """``rep`` answered or started a request: heard now, and no longer quiet (True if it was)."""
        rep.heard = dep.heard = self._now
        if not rep.quiet:
            return False
        rep.quiet = False
        dep.enter(rep)
        return True

    # -- the pool

    def _pool_changed(self, ev: PoolChanged) -> list[RequestAction]:
        if ev.membership not in POOL_MEMBERSHIPS:
            raise InvalidEvent(f"PoolChanged: membership must be one of {POOL_MEMBERSHIPS}, got {shown(ev.membership)}")
        dep = self._dep(ev.deployment)
        out: list[RequestAction] = []
        rep = dep.replicas.get(ev.replica_id)
        if ev.membership == "gone":
            if rep is None:
                return out
            self._forget_replicas(dep, [rep.rid])
            self._gone(dep, rep, out)
        else:
            self._member(dep, ev.replica_id, ev.membership == "serving")
        self._settle(dep, out)
        return out

    def _pool_reset(self, ev: PoolReset) -> list[RequestAction]:
        both = sorted(set(ev.serving) & set(ev.draining))
        if both:
            raise InvalidEvent(f"PoolReset({ev.deployment!r}): replicas both serving and draining: {shown(both)}")
        dep = self._dep(ev.deployment)
        out: list[RequestAction] = []
        listed = set(ev.serving) | set(ev.draining)
        leaving = [r for r in dep.replicas.values() if r.rid not in listed]
        self._forget_replicas(dep, [r.rid for r in leaving])
        for rep in leaving:
            self._gone(dep, rep, out)
        for rid in ev.serving:
            self._member(dep, rid, True)
        for rid in ev.draining:
            self._member(dep, rid, False)
        dep.coming = ev.coming
        self._settle(dep, out)
        return out

    def _replica_models(self, ev: ReplicaModels) -> list[RequestAction]:
        """What a replica says it holds replaces what the machine believed; routing only, so
        nothing is dispatched (a replica not in the pool: a late report, ignored)."""
        dep = self._deps.get(ev.deployment)
        rep = dep.replicas.get(ev.replica_id) if dep is not None else None
        if rep is not None:
            said = dict.fromkeys(ev.model_ids)  # (in the machine's own order of use where it knows it)
            rep.models = {**{m: None for m in rep.models if m in said}, **said}
            rep.offered = None
        return []

    def _replica_located(self, ev: ReplicaLocated) -> list[RequestAction]:
        """Where a replica runs (routing only: nothing is dispatched; one not in the pool: ignored)."""
        dep = self._deps.get(ev.deployment)
        rep = dep.replicas.get(ev.replica_id) if dep is not None else None
        if rep is not None:
            rep.node, rep.zone = ev.node_id, ev.zone
            rep.offered = None
        return []

    def _pool_coming(self, ev: PoolComing) -> list[RequestAction]:
        dep = self._dep(ev.deployment)
        dep.coming = ev.coming
        out: list[RequestAction] = []
        self._settle(dep, out)
        return out

    def _member(self, dep: _Dep, rid: str, serving: bool) -> None:
        """``rid`` serves (or drains) from now on; a NotDelivered's exclusion ends."""
        rep = dep.replicas.get(rid)
        if rep is None:
            rep = dep.replicas[rid] = dep.by_join[dep.next_join] = _Replica(rid, dep.next_join)
            dep.next_join += 1
        else:
            dep.leave(rep)
        dep.serving += serving - rep.serving
        rep.serving = serving
        rep.excluded = False
        dep.enter(rep)

    def _gone(self, dep: _Dep, rep: _Replica, out: list[RequestAction]) -> None:
        """``rep`` left the pool: what it held never started goes back to the
        head of the queue; a started idempotent (not streamed) request is
        retried while retries remain; any other started one fails."""
        dep.leave(rep)
        del dep.replicas[rep.rid]
        del dep.by_join[rep.join]
        dep.serving -= rep.serving

        for req in rep.held.values():  # in dispatch order
            req.replica = None
            if req.final is not None:  # ended: the answer it owed will never come
                self._forget(req)
                continue
            dep.in_flight -= 1
            started = req.state == _RUNNING or not (self.reports_started or req.tells_start)
            if not started:
                req.state = _QUEUED
                dep.queue.put_back(req)
            elif req.idempotent and not req.stream and req.attempt < dep.max_retries:
                req.attempt += 1
                req.ran_on = rep.rid
                req.state = _QUEUED
                dep.retried += 1
                dep.queue.put_back(req)
            else:
                dep.failed += 1
                why = ("a stream" if req.stream else "not idempotent" if not req.idempotent
                       else f"retries used up: {dep.max_retries}")
                self._end(req, "failed", "replica_died")
                self._forget(req)
                out.append(_failed(request_id=req.rid, reason="replica_died", replica_id=rep.rid,
                                   detail=f"replica {rep.rid!r} of {dep.name!r} died while running it ({why})"))
        rep.held = {}

    def _settle(self, dep: _Dep, out: list[RequestAction]) -> None:
        """After a pool change: with no replica serving and none coming every
        queued request ends at once; otherwise dispatch what fits."""
        if dep.serving or dep.coming:
            self._pump(dep, out)
            return
        queue = dep.queue
        while queue.n:
            req = queue.pop()
            out.append(self._end_queued(req, "unavailable",
                                        f"deployment {dep.name!r} has no replica serving and none coming"))

    # ----------------------------------------------------------------- helpers

    def _dep(self, name: str) -> _Dep:
        dep = self._deps.get(name)
        if dep is None:
            dep = self._deps[name] = _Dep(name)
        return dep

    def _lookup(self, ev: Started | Completed | NotDelivered | Cancel, replica_id: str | None) -> _Request | None:
        """The request an event names, or None for a late event (counted)."""
        rid = ev.request_id
        req = self._requests.get(rid)
        if req is None:
            rec = self._recent.get(rid)
            if rec is None:
                raise InvalidEvent(f"{type(ev).__name__}: unknown request id {rid!r} "
                                   f"(never submitted, or ended more than {self.remember_ended} requests ago)")
            dep = self._deps.get(rec[0])
            if dep is not None and dep.configured:
                dep.late += 1
            else:
                self._unknown_late += 1
            return None
        if replica_id is not None and (req.replica is None or req.replica.rid != replica_id):
            req.dep.late += 1  # about an earlier dispatch to another replica
            return None
        return req

    def _send(self, dep: _Dep, req: _Request, rep: _Replica, out: list[RequestAction]) -> None:
        held = rep.held
        k = len(held)
        lst = dep.free[k]
        del lst[bisect_left(lst, rep.join)]
        held[req.rid] = req
        if req.model:  # it loads the model if it does not hold it: requests for it follow
            models = rep.models
            models.pop(req.model, None)
            models[req.model] = None  # (its most recently used now: the replica's LRU order)
            rep.offered = None
        if k + 1 < dep.max_ongoing:
            dep.enter(rep)
        req.replica = rep
        req.last = rep.rid
        req.sent = self._now
        req.state = _DISPATCHED
        dep.last_join = rep.join
        dep.in_flight += 1
        dep.dispatched += 1
        out.append(_dispatch(request_id=req.rid, deployment=dep.name, replica_id=rep.rid, attempt=req.attempt))

    def _pump(self, dep: _Dep, out: list[RequestAction]) -> None:
        """Dispatch from the head of the queue while a replica can take one."""
        queue = dep.queue
        while queue.n:
            rep = dep.choose()
            if rep is None:
                return
            req = queue.pop()
            if dep.router is not None:
                try:
                    rep = self._route(dep, _route_of(req)) or rep
                except RouterError:
                    queue.put_back(req)  # (kept at the head: nothing accepted is lost)
                    raise
            elif req.model:
                rep = dep.choose_model(req.model) or rep
            self._send(dep, req, rep, out)

    @staticmethod
    def _forget_replicas(dep: _Dep, rids: list[str]) -> None:
        """``dep``'s router forgets replicas leaving the pool, before anything else changes (a router
        that raises refuses the event: ``RouterError``, the machine unchanged)."""
        if dep.router is not None:
            for rid in rids:
                _hook(dep.router_spec[0], dep, "forget", dep.router.forget, rid)

    def _route(self, dep: _Dep, request: RouteRequest) -> _Replica | None:
        """The candidate ``dep``'s router picks for ``request`` (None: no candidate); its own rule
        when the router says None. O(replicas). A pick that is no candidate, or a router that
        raised, is a ``RouterError`` naming the router (the machine's state is unchanged)."""
        cands = dep.takers()
        if not cands:
            return None
        name, router = dep.router_spec[0], cast(Router, dep.router)
        offered = tuple(r.offer() for r in cands)
        try:
            pick = router.choose(offered, request)
        except Exception as exc:
            raise RouterError(f"request router {name!r} of {dep.name!r} raised {exc!r} choosing for "
                              f"{request.request_id!r}") from exc
        if pick is None:
            rep = dep.pick(request.model_id)
        else:
            rep = next((r for r in cands if r.rid == pick), None)
            if rep is None:
                raise RouterError(f"request router {name!r} of {dep.name!r} picked {shown(pick)} for "
                                  f"{request.request_id!r}, which is no candidate (candidates: "
                                  f"{', '.join(r.rid for r in cands)}): a router picks among the candidates only")
        if rep is not None:  # (it is sent there: nothing fails after)
            _hook(name, dep, "dispatched", router.dispatched, rep.rid, request)
        return rep

    def _free_slot(self, dep: _Dep, rep: _Replica, req: _Request) -> None:
        dep.leave(rep)
        del rep.held[req.rid]
        req.replica = None
        dep.enter(rep)

    def _reject_new(self, dep: _Dep, rid: str, reason: str, detail: str) -> Rejected:
        dep.rejected[reason] += 1
        self._remember(rid, (dep.name, "rejected", None, 0, reason))
        out: Rejected = _rejected(request_id=rid, reason=reason, detail=detail)
        return out

    def _end_queued(self, req: _Request, reason: str, detail: str) -> Rejected | Failed:
        """A queued request ends: ``Rejected`` if no replica ever ran it, else
        ``Failed`` naming the replica that died while running it."""
        dep = req.dep
        if req.ran_on is None:
            dep.rejected[reason] += 1
            self._end(req, "rejected", reason)
            self._forget(req)
            out: Rejected | Failed = _rejected(request_id=req.rid, reason=reason, detail=detail)
            return out
        dep.failed += 1
        why = "timeout" if reason == "timeout" else "replica_died"
        self._end(req, "failed", why)
        self._forget(req)
        return _failed(request_id=req.rid, reason=why, replica_id=req.ran_on,
                       detail=f"replica {req.ran_on!r} died while running it, then {detail}")

    def _end(self, req: _Request, final: str, reason: str | None) -> None:
        req.final = final
        req.reason = reason
        if req.deadline is not None:
            self._with_deadline -= 1

    def _forget(self, req: _Request) -> None:
        """An ended request no replica holds leaves the live table for the memory (every caller
        ended it first: ``final`` is set)."""
        del self._requests[req.rid]
        self._remember(req.rid, (req.dep.name, cast(str, req.final), req.last, req.attempt, req.reason))

    def _remember(self, rid: str, rec: tuple[str, str, str | None, int, str | None]) -> None:
        if self.remember_ended:
            recent = self._recent
            recent[rid] = rec
            if len(recent) > self.remember_ended:
                recent.popitem(last=False)

    # ------------------------------------------------------------------- reads

    def status(self, request_id: str) -> RequestStatus | None:
        """Where ``request_id`` stands; None for an id never submitted or ended
        longer ago than the machine remembers. O(log n)."""
        req = self._requests.get(request_id)
        if req is None:
            rec = self._recent.get(request_id)
            if rec is None:
                return None
            dep_name, state, replica, attempt, reason = rec
            return RequestStatus(request_id=request_id, state=state, deployment=dep_name, replica_id=replica,
                                 attempt=attempt, reason=reason)
        dep = req.dep
        if req.final is not None:
            return RequestStatus(request_id=request_id, state=req.final, deployment=dep.name,
                                 replica_id=req.last, attempt=req.attempt,
                                 reason=req.reason)
        if req.replica is None:
            return RequestStatus(request_id=request_id, state="queued" if dep.serving else "loading",
                                 deployment=dep.name, position=dep.queue.position(req), replica_id=None,
                                 attempt=req.attempt)
        return RequestStatus(request_id=request_id, state=req.state, deployment=dep.name,
                             replica_id=req.replica.rid, attempt=req.attempt)

    def counters(self, deployment: str | None = None) -> Counters:
        """One deployment's counters, or everyone's (``deployment=None``, with the
        Submits for deployments never configured). Raises ``UnknownDeployment``
        for a deployment never configured."""
        if deployment is not None:
            dep = self._deps.get(deployment)
            if dep is None or not dep.configured:
                raise UnknownDeployment(f"counters: no deployment named {deployment!r} was configured")
            deps = [dep]
        else:
            deps = [d for d in self._deps.values() if d.configured]
        rejected = dict.fromkeys(_REJECT_COUNTED, 0)
        for d in deps:
            for reason, n in d.rejected.items():
                rejected[reason] += n
        unknown = deployment is None
        if unknown:
            rejected["unknown_deployment"] += self._unknown_submitted
        return Counters(
            submitted=sum(d.submitted for d in deps) + (self._unknown_submitted if unknown else 0),
            dispatched=sum(d.dispatched for d in deps), answered=sum(d.answered for d in deps),
            app_errors=sum(d.app_errors for d in deps), retried=sum(d.retried for d in deps),
            failed=sum(d.failed for d in deps), rejected=rejected, cancelled=sum(d.cancelled for d in deps),
            late=sum(d.late for d in deps) + (self._unknown_late if unknown else 0),
            in_queue=sum(d.queue.n for d in deps), in_flight=sum(d.in_flight for d in deps))

    def pool(self, deployment: str) -> tuple[ReplicaView, ...]:
        """``deployment``'s replicas in pool-join order (empty if it has none)."""
        dep = self._deps.get(deployment)
        if dep is None:
            return ()
        return tuple(ReplicaView(replica_id=r.rid, membership="serving" if r.serving else "draining",
                                 in_flight=len(r.held), excluded=r.excluded, models=tuple(r.models),
                                 quiet=r.quiet)
                     for r in dep.replicas.values())

    def load(self, deployment: str) -> tuple[int, tuple[tuple[str, int], ...]]:
        """What ``deployment``'s autoscaler is fed (``AutoscalingMetrics.queued`` and ``.ongoing``):
        the requests queued, and in flight on each replica of its pool; nothing if unknown."""
        dep = self._deps.get(deployment)
        if dep is None:
            return 0, ()
        return dep.queue.n, tuple((r.rid, len(r.held)) for r in dep.replicas.values())

    def coming(self, deployment: str) -> bool:
        """Whether replicas are on their way to ``deployment`` (``PoolComing``)."""
        dep = self._deps.get(deployment)
        return bool(dep and dep.coming)

    def queued(self, deployment: str) -> tuple[str, ...]:
        """The ids queued for ``deployment``, head first. O(queue): for status pages and tests."""
        dep = self._deps.get(deployment)
        return tuple(r.rid for r in dep.queue.in_order()) if dep else ()

    def deployments(self) -> tuple[str, ...]:
        """The deployments configured, in the order they were."""
        return tuple(d.name for d in self._deps.values() if d.configured)

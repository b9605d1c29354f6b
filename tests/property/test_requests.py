"""The request machine under random events (rankcore/requests/machine.py, issue 22).

Random Configure / PoolChanged / PoolReset / PoolComing / Submit / Started /
Completed / NotDelivered / Cancel / Tick / ReplicaModels (Submits with multiplexed model ids),
some of them illegal or stale; after
every step: no replica over ``max_ongoing_requests`` from a dispatch, no
dispatch to a replica not serving or left out, a Submit queued only below
``max_queued_requests``, every request ends exactly once and is never
dispatched after its end, nothing lost (the counters' identity and a count of
our own), the queue in submission order and dispatched from its head,
positions exact, work-conserving, a request with a model id sent to a free replica holding
it if there is one (else one with the fewest models); at the end the same events replayed on a
fresh machine give the same actions. And the queue alone against a sorted
list: order and positions after random pushes, pops, removals, puts back.
"""

from __future__ import annotations

from typing import Any, ClassVar

from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import rankcore as rc
from rankcore.requests import (
    Cancel,
    CancelOnReplica,
    Completed,
    Configure,
    Dispatch,
    Failed,
    NotDelivered,
    Rejected,
    ReplicaLocated,
    ReplicaModels,
    RequestMachine,
    Started,
    Submit,
    Tick,
)
from rankcore.requests.queue import RequestQueue

DEPS = ("llm", "emb")
UNKNOWN_DEP = "zzz"
REPLICAS = {d: tuple(f"{d}#{i}" for i in range(4)) for d in DEPS}
ENDED = ("done", "failed", "rejected", "cancelled")
LIVE_ON_REPLICA = ("dispatched", "running")
MODELS = ("", "", "m1", "m2", "m3")


#: prompts whose prefixes overlap (a router by prefix sees shared blocks of 4 characters)
#: where replicas run and callers call from (the locality router's facts; "" unknown)
NODES = ("", "n0", "n1")
ZONES = ("", "z0", "z1")
PROMPTS = ("", "system: be brief. hi", "system: be brief. bye", "system: be kind. hi", "user: x")


class RequestMachineProps(RuleBasedStateMachine):
    reports_started = True
    #: the deployments' router (rankcore.requests.routing; "": the machine's own rule) and its keywords
    router = ""
    router_kwargs: ClassVar[dict] = {}

    def __init__(self) -> None:
        super().__init__()
        self.m = RequestMachine(reports_started=self.reports_started)
        self.log: list[tuple[Any, Any]] = []  # (event, actions or the error's type)
        self.limits: dict[str, tuple[int, int]] = {}  # deployment -> (max_ongoing, max_queued)
        self.ids: list[str] = []
        self.tells: dict[str, bool] = {}  # whether its Started will be told (its own, or the machine's)
        self.order: dict[str, int] = {}  # submission order
        self.dep_of: dict[str, str] = {}
        self.ended: set[str] = set()
        self.now = 0.0

    # ---------------------------------------------------------------- driving

    def feed(self, event: Any, invalid: bool = False) -> list[Any]:
        before = self.view() if invalid else None
        try:
            actions = self.m.handle(event)
        except rc.InvalidEvent as e:
            assert invalid, f"{event!r} raised {e}"
            assert self.view() == before, f"{event!r} raised but changed the machine"
            self.log.append((event, rc.InvalidEvent))
            return []
        assert not invalid, f"{event!r} should have raised"
        self.log.append((event, actions))
        self.check_step(actions)
        return actions

    def view(self) -> tuple:
        return (self.m.counters(), tuple((d, self.m.pool(d), self.m.queued(d), self.m.coming(d)) for d in DEPS),
                tuple(self.m.status(r) for r in self.ids))

    def pick(self, i: int) -> str:
        return self.ids[i % len(self.ids)]

    def state_of(self, rid: str) -> str:
        s = self.m.status(rid)
        assert s is not None
        return s.state

    # ------------------------------------------------------------------ rules

    @initialize()
    def start(self) -> None:
        self.feed(Configure(deployment="llm", request_router=self.router, request_router_kwargs=self.router_kwargs))

    @rule(dep=st.sampled_from(DEPS), ongoing=st.integers(1, 3), queued=st.integers(-1, 3), retries=st.integers(0, 2))
    def configure(self, dep: str, ongoing: int, queued: int, retries: int) -> None:
        self.limits[dep] = (ongoing, queued)
        self.feed(Configure(deployment=dep, max_ongoing_requests=ongoing, max_queued_requests=queued,
                            max_retries=retries, request_router=self.router, request_router_kwargs=self.router_kwargs))

    @rule(dep=st.sampled_from(DEPS), i=st.integers(0, 3),
          membership=st.sampled_from(("serving", "serving", "draining", "gone")))
    def pool_changed(self, dep: str, i: int, membership: str) -> None:
        rid = REPLICAS[dep][i]
        unstarted = [r for r in self.ids if self.tells.get(r, self.reports_started) and r not in self.ended
                     and (s := self.m.status(r)) is not None and s.state == "dispatched" and s.replica_id == rid]
        attempts = {r: self.m.status(r).attempt for r in unstarted}  # type: ignore[union-attr]
        out = self.feed(rc.PoolChanged(deployment=dep, replica_id=rid, membership=membership))
        if membership == "gone":  # what never started there is queued again (or sent on, or refused as any
            # queued request when nothing serves), not failed nor retried
            failed = {a.request_id for a in out if isinstance(a, Failed)}
            for r in unstarted:
                s = self.m.status(r)
                assert r not in failed and s is not None and s.attempt == attempts[r], (r, s, out)

    @rule(dep=st.sampled_from(DEPS), who=st.lists(st.sampled_from(("serving", "draining", "out")), min_size=4,
                                                 max_size=4), coming=st.booleans(), clash=st.booleans())
    def pool_reset(self, dep: str, who: list[str], coming: bool, clash: bool) -> None:
        serving = [r for r, w in zip(REPLICAS[dep], who) if w == "serving"]
        draining = [r for r, w in zip(REPLICAS[dep], who) if w == "draining"]
        invalid = clash and bool(serving)
        if invalid:
            draining.append(serving[0])
        self.feed(rc.PoolReset(deployment=dep, serving=serving, draining=draining, coming=coming), invalid=invalid)

    @rule(dep=st.sampled_from(DEPS), coming=st.booleans())
    def pool_coming(self, dep: str, coming: bool) -> None:
        self.feed(rc.PoolComing(deployment=dep, coming=coming))

    @rule(dep=st.sampled_from(DEPS), i=st.integers(0, 3), models=st.sets(st.sampled_from(MODELS[2:])))
    def replica_models(self, dep: str, i: int, models: set[str]) -> None:
        rid = REPLICAS[dep][i]
        self.feed(ReplicaModels(deployment=dep, replica_id=rid, model_ids=tuple(sorted(models))))
        view = {v.replica_id: v for v in self.m.pool(dep)}
        if rid in view:  # (the same set; the ones it knew keep the order it dispatched them in)
            assert sorted(view[rid].models) == sorted(models)

    @rule(dep=st.sampled_from(DEPS), i=st.integers(0, 4), node=st.sampled_from(NODES), zone=st.sampled_from(ZONES))
    def replica_located(self, dep: str, i: int, node: str, zone: str) -> None:
        rid = (*REPLICAS[dep], "gone#9")[i]  # (one never in the pool: changes nothing)
        assert self.feed(ReplicaLocated(deployment=dep, replica_id=rid, node_id=node, zone=zone)) == []

    @rule(dep=st.sampled_from(DEPS + DEPS + (UNKNOWN_DEP,)), idempotent=st.booleans(), stream=st.booleans(),
          deadline=st.none() | st.floats(0, 6), model=st.sampled_from(MODELS), tells=st.booleans(),
          key=st.sampled_from(("", "alice", "bob")), prompt=st.sampled_from(PROMPTS),
          node=st.sampled_from(NODES), zone=st.sampled_from(ZONES))
    def submit(self, dep: str, idempotent: bool, stream: bool, deadline: float | None, model: str,
               tells: bool, key: str, prompt: str, node: str, zone: str) -> None:
        rid = f"q{len(self.ids)}"
        before = len(self.m.queued(dep))
        pool = self.m.pool(dep)
        self.order[rid] = len(self.ids)
        self.dep_of[rid] = dep
        self.ids.append(rid)
        self.tells[rid] = tells or self.reports_started
        out = self.feed(Submit(request_id=rid, deployment=dep, idempotent=idempotent, stream=stream,
                               deadline=None if deadline is None else self.now + deadline, model_id=model,
                               reports_started=tells, routing_key=key, prefix=prompt, caller_node=node,
                               caller_zone=zone))
        sent = [a.replica_id for a in out if isinstance(a, Dispatch)]
        if model and sent and not self.router:  # the routing rule: a free holder of its model, else fewest models
            limit = self.limits.get(dep, (5, -1))[0]
            free = [v for v in pool if v.membership == "serving" and not v.excluded and not v.quiet
                    and v.in_flight < limit]
            chosen = next(v for v in free if v.replica_id == sent[0])
            if any(model in v.models for v in free):
                assert model in chosen.models, (model, sent, free)
                assert chosen.in_flight == min(v.in_flight for v in free if model in v.models)
            else:
                assert len(chosen.models) == min(len(v.models) for v in free), (model, sent, free)
            assert model in {v.replica_id: v for v in self.m.pool(dep)}[sent[0]].models
        state = self.state_of(rid)
        if state in ("queued", "loading"):
            limit = self.limits.get(dep, (5, -1))[1]
            assert limit < 0 or before < limit, f"{rid} queued behind {before} with max_queued_requests={limit}"

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 10**6), stale=st.booleans())
    def started(self, i: int, stale: bool) -> None:
        rid = self.pick(i)
        state = self.state_of(rid)
        self.feed(Started(request_id=rid, replica_id="nobody" if stale else None),
                  invalid=not stale and state in ("queued", "loading", "running"))

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 10**6), ok=st.booleans(), stale=st.booleans())
    def completed(self, i: int, ok: bool, stale: bool) -> None:
        rid = self.pick(i)
        state = self.state_of(rid)
        late = self.m.counters().late
        self.feed(Completed(request_id=rid, ok=ok, replica_id="nobody" if stale else None),
                  invalid=not stale and state in ("queued", "loading"))
        if state in LIVE_ON_REPLICA and not stale:
            self.end(rid)
        if stale or state in ENDED:
            assert self.m.counters().late == late + 1

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 10**6))
    def not_delivered(self, i: int) -> None:
        rid = self.pick(i)
        state = self.state_of(rid)
        self.feed(NotDelivered(request_id=rid), invalid=state in ("queued", "loading", "running"))

    @precondition(lambda self: self.ids)
    @rule(i=st.integers(0, 10**6))
    def cancel(self, i: int) -> None:
        rid = self.pick(i)
        state = self.state_of(rid)
        out = self.feed(Cancel(request_id=rid))
        if state in LIVE_ON_REPLICA:
            assert [type(a) for a in out] == [CancelOnReplica]
            self.end(rid)
        if state in ENDED:
            assert out == []

    @rule(dt=st.floats(0, 3))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.feed(Tick(now=self.now))

    @rule()
    def clock_back(self) -> None:
        if self.now > 0:
            self.feed(Tick(now=self.now / 2 - 1), invalid=True)

    # ------------------------------------------------------------- the checks

    def end(self, rid: str) -> None:
        assert rid not in self.ended, f"{rid} ended twice"
        self.ended.add(rid)

    def check_step(self, actions: list[Any]) -> None:
        pools = {d: {v.replica_id: v for v in self.m.pool(d)} for d in DEPS}
        dispatched_in_step: dict[str, list[str]] = {}
        for a in actions:
            if isinstance(a, (Rejected, Failed)):
                self.end(a.request_id)
            elif isinstance(a, Dispatch):
                assert a.request_id not in self.ended, f"{a.request_id} dispatched after its end"
                assert a.deployment == self.dep_of[a.request_id]
                v = pools[a.deployment].get(a.replica_id)
                assert v is not None and v.membership == "serving" and not v.excluded and not v.quiet, f"{a} to {v}"
                assert v.in_flight <= self.limits.get(a.deployment, (5, -1))[0], f"{a}: {v} over the limit"
                dispatched_in_step.setdefault(a.deployment, []).append(a.request_id)
        for dep, ids in dispatched_in_step.items():  # FIFO: from the head of the queue
            waiting = self.m.queued(dep)
            if waiting:
                assert max(self.order[r] for r in ids) < min(self.order[r] for r in waiting), (ids, waiting)

    @invariant()
    def nothing_lost(self) -> None:
        c = self.m.counters()
        assert c.lost == 0, c
        for d in self.m.deployments():
            assert self.m.counters(d).lost == 0
        live = [r for r in self.ids if r not in self.ended]
        assert c.in_queue + c.in_flight == len(live), (c, live)
        assert c.submitted == len(self.ids)
        for r in live:
            assert self.state_of(r) in ("queued", "loading", "dispatched", "running")
        for r in self.ended:
            assert self.state_of(r) in ENDED

    @invariant()
    def queue_in_submission_order_positions_exact(self) -> None:
        for d in DEPS:
            q = self.m.queued(d)
            assert [self.order[r] for r in q] == sorted(self.order[r] for r in q)
            for n, r in enumerate(q):
                s = self.m.status(r)
                assert s is not None and s.position == n and s.state in ("queued", "loading")

    @invariant()
    def work_conserving(self) -> None:
        for d in self.m.deployments():
            if self.m.queued(d):
                limit = self.limits.get(d, (5, -1))[0]
                room = [v for v in self.m.pool(d) if v.membership == "serving" and not v.excluded
                        and not v.quiet and v.in_flight < limit]
                assert room == [], f"{d}: queued while {room} has room"

    def teardown(self) -> None:
        replay = RequestMachine(reports_started=self.reports_started)
        for event, expected in self.log:
            try:
                got: Any = replay.handle(event)
            except rc.InvalidEvent:
                got = rc.InvalidEvent
            assert got == expected, f"replaying {event!r}: {got!r} != {expected!r}"


class RequestMachineNoStarted(RequestMachineProps):
    reports_started = False


class RoutedByTwoChoices(RequestMachineProps):
    """Issue 68: every invariant above holds whatever the router picks (it picks among the candidates
    only: the queue, its order, back-pressure and work conservation stay the machine's)."""

    router = "power_of_two_choices"


class RoutedByKey(RequestMachineNoStarted):
    router = "consistent_hash"


class RoutedByLocality(RequestMachineProps):
    router = "locality"


class RoutedByPrefix(RequestMachineProps):
    router = "prefix_affinity"
    router_kwargs: ClassVar[dict] = {"block_chars": 4, "eviction_threshold_chars": 12,
                                         "eviction_target_chars": 12, "imbalanced_threshold": 1}

    @invariant()
    def prefix_stores_bounded_and_only_of_the_pool(self) -> None:
        for d in self.m.deployments():
            router = self.m._deps[d].router
            if router is None:
                continue
            pool = {v.replica_id for v in self.m.pool(d)}
            assert set(router.stores) <= pool, (d, set(router.stores), pool)
            assert all(len(store) <= 3 for store in router.stores.values())
            inverse: dict[int, set[str]] = {}  # (the holders' index is the stores' inverse, nothing more)
            for rid, store in router.stores.items():
                for block in store:
                    inverse.setdefault(block, set()).add(rid)
            assert router.holders == inverse


TestRequestMachine = RequestMachineProps.TestCase
TestRequestMachineNoStarted = RequestMachineNoStarted.TestCase
TestRoutedByTwoChoices = RoutedByTwoChoices.TestCase
TestRoutedByKey = RoutedByKey.TestCase
TestRoutedByLocality = RoutedByLocality.TestCase
TestRoutedByPrefix = RoutedByPrefix.TestCase


# ------------------------------------------------- the queue alone, against a list


class _Item:
    __slots__ = ("rid", "seq", "slot")

    def __init__(self, seq: int) -> None:
        self.rid, self.seq, self.slot = f"i{seq}", seq, None


@given(st.lists(st.tuples(st.sampled_from(("push", "push", "pop", "remove", "put_back")), st.integers(0, 10**6)),
                max_size=400))
def test_the_queue_is_a_sorted_list_with_exact_positions(ops: list[tuple[str, int]]) -> None:
    q: RequestQueue[_Item] = RequestQueue()
    model: list[_Item] = []  # head first
    out: list[_Item] = []  # popped: may be put back (they are older than anything fresh)
    n = 0
    for op, k in ops:
        if op == "push":
            n += 1
            item = _Item(n)
            q.push(item)
            model.append(item)
        elif op == "pop" and model:
            got = q.pop()
            assert got is model.pop(0)
            out.append(got)
        elif op == "remove" and model:
            item = model.pop(k % len(model))
            q.remove(item)
        elif op == "put_back" and out:
            item = out.pop(k % len(out))
            q.put_back(item)
            model.append(item)
            model.sort(key=lambda i: i.seq)
        assert q.in_order() == model and len(q) == len(model)
        assert [q.position(i) for i in model] == list(range(len(model)))
        assert all(i.slot is None for i in out)

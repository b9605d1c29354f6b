"""Tests added for mutmut's survivors in the rule modules (issue 36, `make mutate`;
docs/testing.md names each survivor and what killed it, or why it is equivalent).

Each test states a behaviour the module promises (its docstring, a caller's
need), not a mutant's text.
"""

from __future__ import annotations

import attrs
import pytest

import rankcore as rc
from rankcore.base.cluster import Cluster
from rankcore.base.errors import InvalidConfig, InvalidEvent, InvariantViolation
from rankcore.base.records import copier, maker, updater
from rankcore.requests import records
from rankcore.requests.queue import FRONT, RequestQueue
from rankcore.requests.records import FAIL_REASONS, REJECT_REASONS, Failed, Rejected, Submit, Tick

# ------------------------------------------------------------ requests/queue.py


class _Req:
    """A queued request that counts how often the queue writes its slot."""

    writes = 0

    def __init__(self, rid: str, seq: int) -> None:
        self.rid, self.seq, self._slot = rid, seq, None

    @property
    def slot(self) -> int | None:
        return self._slot

    @slot.setter
    def slot(self, value: int | None) -> None:
        _Req.writes += 1
        self._slot = value


def _reqs(n: int) -> list[_Req]:
    return [_Req(f"r{i}", i) for i in range(n)]


@pytest.mark.parametrize("n", [100, 2000])
def test_draining_a_queue_costs_amortised_constant_work_per_request(n: int) -> None:
    """"Garbage is compacted once it outgrows the live requests (amortised O(1))":
    pushing n requests and popping them all moves each request's slot a bounded
    number of times (a compaction on every pop would be quadratic)."""
    q: RequestQueue[_Req] = RequestQueue()
    reqs = _reqs(n)
    _Req.writes = 0
    for r in reqs:
        q.push(r)
    assert [q.pop() for _ in range(n)] == reqs
    assert _Req.writes <= 4 * n, f"{_Req.writes} slot writes to drain {n} requests"
    assert len(q) == 0 and q.in_order() == []


def test_removing_from_the_middle_costs_amortised_constant_work_per_request() -> None:
    q: RequestQueue[_Req] = RequestQueue()
    reqs = _reqs(3000)
    for r in reqs:
        q.push(r)
    _Req.writes = 0
    for r in reqs[::-1][:2900]:  # (from the tail: the head never moves, only holes)
        q.remove(r)
    assert q.in_order() == reqs[:100]
    assert _Req.writes <= 4 * 3000


def test_a_drained_queue_keeps_no_garbage() -> None:
    """Once every request has left, the queue holds nothing of them (memory is not kept
    for the requests a long-lived deployment has seen)."""
    for n, popped in ((1, 1), (5, 2), (50, 25)):
        q: RequestQueue[_Req] = RequestQueue()
        reqs = _reqs(n)
        for r in reqs:
            q.push(r)
        for _ in range(popped):
            q.pop()
        for r in reqs[popped:]:
            q.remove(r)
        assert (q.main, q.lo, q.dead, q.front, len(q)) == ([], 0, [], [], 0), n


def test_a_removed_request_is_not_queued_and_removing_it_again_is_refused() -> None:
    q: RequestQueue[_Req] = RequestQueue()
    a, b = _reqs(2)
    q.push(a)
    q.push(b)
    q.remove(a)
    assert a.slot is None  # (the Queued protocol: None while not queued)
    with pytest.raises(InvariantViolation, match="'r0' is not queued"):
        q.remove(a)
    assert q.in_order() == [b] and q.position(b) == 0


def test_positions_count_the_put_back_head_then_the_live_requests_before() -> None:
    q: RequestQueue[_Req] = RequestQueue()
    reqs = _reqs(6)
    for r in reqs[2:]:
        q.push(r)
    q.remove(reqs[3])
    for r in (reqs[1], reqs[0]):
        q.put_back(r)
    assert reqs[0].slot == FRONT
    assert q.in_order() == [reqs[0], reqs[1], reqs[2], reqs[4], reqs[5]]
    assert [q.position(r) for r in q.in_order()] == [0, 1, 2, 3, 4]


# ---------------------------------------------------------- requests/records.py


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Tick(now=float("nan")), "Tick.now must be a finite number, got nan"),
    (lambda: Submit(request_id="a", deployment="d", deadline=float("inf")),
     "Submit.deadline must be a finite number, got inf"),
    (lambda: Rejected(request_id="a", reason="bogus"),
     "Rejected.reason must be one of ('overloaded', 'unavailable', 'timeout', 'unknown_deployment', 'cancelled'), "
     "got 'bogus'"),
    (lambda: Failed(request_id="a", reason="overloaded"),
     "Failed.reason must be one of ('replica_died', 'timeout'), got 'overloaded'"),
])
def test_a_malformed_request_record_is_refused_naming_the_record_the_field_and_the_value(make, message) -> None:
    """The module's promise: "a malformed one raises InvalidConfig naming the record, the field
    and the value" (an executor logs it; an ingress answers it)."""
    with pytest.raises(InvalidConfig) as caught:
        make()
    assert str(caught.value) == message


def test_well_formed_clocks_and_reasons_are_taken() -> None:
    assert Submit(request_id="a", deployment="d").deadline is None
    assert Submit(request_id="a", deployment="d", deadline=-3.5).deadline == -3.5  # (any origin)
    assert Tick(now=0).now == 0
    assert [Rejected(request_id="a", reason=r).reason for r in REJECT_REASONS] == list(REJECT_REASONS)
    assert [Failed(request_id="a", reason=r).reason for r in FAIL_REASONS] == list(FAIL_REASONS)


def test_the_one_of_validator_takes_its_choices_and_refuses_anything_else_by_name() -> None:
    """``_one_of`` builds its validator when the record classes are defined (at import), so
    the records above exercise only the validator built then; this builds one now, so a
    change to the factory itself shows too."""
    check = records._one_of(("a", "b"))
    field = attrs.fields(Rejected).reason
    inst = Rejected(request_id="r", reason="timeout")
    assert check(inst, field, "a") is None and check(inst, field, "b") is None
    with pytest.raises(InvalidConfig) as caught:
        check(inst, field, "c")
    assert str(caught.value) == "Rejected.reason must be one of ('a', 'b'), got 'c'"


# ------------------------------------------------------------- tiers/residency.py


def _fed(events, state=None):
    state = state or rc.State()
    result = None
    for ev in events:
        result = rc.step(state, ev)
        state = result.state
    return state, result


_RUNNING = [rc.DeploymentApplied(name="d", num_replicas=1), rc.ReplicaPlaced(replica_id="d#0", node_id="n"),
            rc.ReplicaReady(replica_id="d#0")]


def test_fully_serving_is_healthy_awake_and_every_replica_serving() -> None:
    """``rankcore.query.fully_serving`` (what ``wait_until_serving`` waits for)."""
    state, _ = _fed(_RUNNING)
    assert rc.query.fully_serving(state.deployments["d"])  # healthy, awake, d#0 serving
    asleep, _ = _fed([rc.SleepRequested(deployment="d")], state)
    assert not rc.query.fully_serving(asleep.deployments["d"])  # asleep (d#0 offloading)
    scaled, _ = _fed([rc.DeploymentApplied(name="d", num_replicas=2)], state)
    dep = scaled.deployments["d"]
    assert not dep.healthy and rc.query.is_serving(dep, dep.replicas["d#0"])
    assert not rc.query.fully_serving(dep)  # every replica there serves, but one is missing: not healthy
    pushed, _ = _fed([rc.WeightsPushed(deployment="d", version=1)], state)
    dep = pushed.deployments["d"]
    assert dep.healthy and not dep.asleep and not rc.query.fully_serving(dep)  # d#0 is still on version 0


def test_a_failed_move_leaves_the_weights_where_they_were() -> None:
    """``TierMoveFailed``: an offload that failed leaves the replica HOT (its weights never
    left the GPU); a failure naming a replica with no move in flight is stale."""
    state, _ = _fed(_RUNNING + [rc.SleepRequested(deployment="d")])
    assert state.deployments["d"].replicas["d#0"].residency is rc.Residency.OFFLOADING
    after, result = _fed([rc.TierMoveFailed(replica_id="d#0")], state)
    assert not result.stale and after.deployments["d"].replicas["d#0"].residency is rc.Residency.HOT
    again = rc.step(after, rc.TierMoveFailed(replica_id="d#0"))
    assert again.stale and again.state.deployments["d"].replicas["d#0"].residency is rc.Residency.HOT


def test_a_failed_load_leaves_the_replica_asleep_and_the_next_wake_retries_it() -> None:
    state, _ = _fed(_RUNNING + [rc.SleepRequested(deployment="d"), rc.TierMoved(replica_id="d#0", tier="warm"),
                                rc.WakeRequested(deployment="d")])
    assert state.deployments["d"].replicas["d#0"].residency is rc.Residency.LOADING
    after, result = _fed([rc.TierMoveFailed(replica_id="d#0")], state)
    assert not result.stale and after.deployments["d"].replicas["d#0"].residency is rc.Residency.WARM
    assert not rc.query.fully_serving(after.deployments["d"])
    retry = rc.step(after, rc.WakeRequested(deployment="d"))
    assert [(type(c).__name__, c.replica_id) for c in retry.commands] == [("LoadReplica", "d#0")]


def test_a_failed_move_keeps_or_frees_the_gpu_memory_as_the_weights_are() -> None:
    """With GPU memory booked (a node declaring its devices, a model's size): a failed offload
    keeps the replica's booking (its weights are still on the GPU); a failed load frees the
    booking made for it (its weights stayed in CPU memory)."""
    from rankcore import invariants as inv

    G = 10**9
    state = rc.State()
    for e in (rc.NodeJoined(node_id="n0", resources={"GPU": 1, "CPU": 8}, devices=(80 * G,)),
              rc.DeploymentApplied(name="a", num_replicas=1, resources={"GPU": 1}, model_bytes=60 * G,
                                   min_deployment_time_s=0.0),
              rc.ReplicaPlaced(replica_id="a#0", node_id="n0"), rc.ReplicaReady(replica_id="a#0"),
              rc.SleepRequested(deployment="a"), rc.TierMoveFailed(replica_id="a#0")):
        result = rc.step(state, e)
        inv.check_step(state, e, result, full=True)
        state = result.state
    assert state.deployments["a"].replicas["a#0"].residency is rc.Residency.HOT and "a#0" in state.cluster.hot
    for e, where, booked in ((rc.SleepRequested(deployment="a"), rc.Residency.OFFLOADING, True),
                             (rc.TierMoved(replica_id="a#0", tier="warm"), rc.Residency.WARM, False),
                             (rc.WakeRequested(deployment="a"), rc.Residency.LOADING, True),
                             (rc.TierMoveFailed(replica_id="a#0"), rc.Residency.WARM, False)):
        result = rc.step(state, e)
        inv.check_step(state, e, result, full=True)
        state = result.state
        assert state.deployments["a"].replicas["a#0"].residency is where, e
        assert ("a#0" in state.cluster.hot) is booked, e


# ------------------------------------------------------------ control/pool.py (PoolView)


def _serving_state(n: int = 2) -> tuple[rc.State, list[str]]:
    state = rc.State()
    first = rc.step(state, rc.DeploymentApplied(name="llm", num_replicas=n))
    state = first.state
    rids = [c.replica_id for c in first.commands if isinstance(c, rc.StartReplica)]
    for rid in rids:
        state = rc.step(state, rc.ReplicaPlaced(replica_id=rid, node_id="a")).state
        state = rc.step(state, rc.ReplicaReady(replica_id=rid)).state
    return state, rids


def test_a_pool_view_knows_no_replica_of_a_deployment_it_was_never_told_of():
    assert rc.PoolView().serving("never-told") == []


def test_a_pool_view_still_holding_a_deployment_the_core_no_longer_has_is_a_mismatch():
    """Members of a deployment absent from the state (deleted, or never there) are checked too:
    the core's pool for it is empty, so a view that still serves from it differs, and says so."""
    state, _ = _serving_state()
    view = rc.PoolView()
    view.apply(rc.PoolReset(deployment="llm", serving=tuple(sorted(state.deployments["llm"].replicas)),
                            draining=(), coming=True))
    assert view.mismatch(state) is None
    view.apply(rc.PoolChanged(deployment="ghost", replica_id="ghost#0", membership="serving"))
    assert view.mismatch(state) == "ghost: serving told ['ghost#0'], the core's []"
    only_coming = rc.PoolView()
    only_coming.apply(rc.PoolReset(deployment="llm", serving=tuple(sorted(state.deployments["llm"].replicas)),
                                   draining=(), coming=True))
    only_coming.apply(rc.PoolComing(deployment="ghost", coming=True))
    assert only_coming.mismatch(state) == "ghost: coming told True, the core's False"


def test_a_pool_view_mismatch_names_the_draining_replicas_and_coming_as_told_and_as_the_core_has_them():
    state, rids = _serving_state()
    serving = tuple(sorted(rids))
    draining = rc.PoolView()
    draining.apply(rc.PoolReset(deployment="llm", serving=serving, draining=("llm#99",), coming=True))
    assert draining.mismatch(state) == "llm: draining told ['llm#99'], the core's []"
    coming = rc.PoolView()
    coming.apply(rc.PoolReset(deployment="llm", serving=serving, draining=(), coming=False))
    assert coming.mismatch(state) == "llm: coming told False, the core's True"  # (a target of 2 wants replicas)
    untold = rc.PoolView()
    untold.apply(rc.PoolChanged(deployment="llm", replica_id=serving[0], membership="serving"))
    untold.apply(rc.PoolChanged(deployment="llm", replica_id=serving[1], membership="serving"))
    assert untold.mismatch(state) == "llm: coming told False, the core's True"  # never told: read as not coming


def test_the_field_naming_an_events_deployment_is_found_for_a_type_never_seen_before():
    """``announce`` asks each event type once which field names its deployment (``deployment``, else
    ``name``, else none) and keeps the answer; the first ask of a new type must find it, the same for a
    type that is not an attrs record. (Through the core the cache is filled by the first step of each
    type, so only a type never stepped shows the lookup itself.)"""
    from rankcore.control import pool

    @attrs.frozen
    class ByDeployment:
        deployment: str
        name: str

    @attrs.frozen
    class ByName:
        name: str

    @attrs.frozen
    class Nameless:
        replica_id: str

    class NotARecord:
        deployment = "x"

    assert pool._name_field(ByDeployment) == "deployment"
    assert pool._name_field(ByDeployment) == "deployment"  # (asked again: the kept answer)
    assert pool._name_field(ByName) == "name"
    assert pool._name_field(Nameless) == ""
    assert pool._name_field(NotARecord) == ""


def test_a_replica_missing_or_of_a_deployment_missing_is_gone():
    """``membership(dep, rep)``: a replica its deployment does not hold (None), or one of a deployment
    the state no longer has (None), is ``gone``, whatever the other is; a stopping replica is
    ``draining`` only in its deployment. Kills ``membership__mutmut_1`` (``and`` for ``or``: the other
    one was looked at, and a stopping replica of no deployment taken as draining). (Through the core,
    ``announce`` only asks with both or neither: the index and the deployments agree.)"""
    from rankcore.control import pool

    state, rids = _serving_state(1)
    dep = state.deployments["llm"]
    rep = dep.replicas[rids[0]]
    assert pool.membership(dep, rep) == pool.SERVING
    assert pool.membership(dep, None) == pool.GONE
    assert pool.membership(None, rep) == pool.GONE
    assert pool.membership(None, None) == pool.GONE
    down = rc.step(state, rc.ScaleRequested(deployment="llm", num_replicas=0)).state.deployments["llm"]
    stopping = down.replicas[rids[0]]
    assert stopping.phase is rc.Phase.STOPPING and pool.membership(down, stopping) == pool.DRAINING
    assert pool.membership(None, stopping) == pool.GONE


def test_a_replica_record_kept_while_its_deployment_wants_newer_weights_leaves_the_serving_pool():
    """``_change(before, after, rid)`` is the membership change between two states, whatever made
    it: the same replica record, serving before, under a deployment that now wants another weights
    version no longer serves (``rankcore.query.is_serving`` reads the deployment's version), so it is
    announced ``draining``; the same record under the same version is no change. (The core itself
    sends ``UpdateWeights`` in that step, so the record changes too; ``_change`` must not rely on
    it.) Kills ``_change__mutmut_28`` (the shortcut taken when the versions differ)."""
    from rankcore.control import pool

    state, rids = _serving_state(1)
    dep = state.deployments["llm"]
    newer = attrs.evolve(dep, weights_version=dep.weights_version + 1)
    after = attrs.evolve(state, deployments=state.deployments.set("llm", newer))
    assert newer.replicas[rids[0]] is dep.replicas[rids[0]]
    changed = pool._change(state, after, rids[0])
    assert changed is not None and (changed.replica_id, changed.membership) == (rids[0], pool.DRAINING)
    same = attrs.evolve(state, deployments=state.deployments.set("llm", attrs.evolve(dep)))
    assert pool._change(state, same, rids[0]) is None


def test_a_recovery_step_keeps_the_compaction_it_made_and_is_not_stale():
    """A ``ControllerRecovered`` whose reports leave a hole compacts in the same step: the step
    ``announce`` returns (with its ``PoolReset``) still carries that compaction, and a recovery is
    never stale. Kills ``announce__mutmut_14`` (the compactions dropped) and ``_7`` (``stale=None``)."""
    from rankcore.control.pool import PoolReset

    spec = rc.DeploymentApplied(name="app", num_replicas=2, user_config={}, has_reconfigure=True,
                                reconfigure_takes_rank=True)
    reports = tuple(rc.ReplicaReport(replica_id=rid, deployment="app", rank=rank, node_id="n0")
                    for rid, rank in (("app#0", rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
                                      ("app#3", rc.ReplicaRank(rank=5, node_rank=0, local_rank=1))))
    step = rc.step(rc.State(), rc.ControllerRecovered(deployments=(spec,), reports=reports))
    assert step.stale is False and step.recovery is not None
    (comp,) = step.compactions
    assert comp.deployment == "app" and [(c.replica, c.new.rank) for c in comp.changes] == [("app#3", 1)]
    assert [type(c) for c in step.pool] == [PoolReset]


def test_an_autoscaled_deployment_at_zero_is_coming_while_it_may_scale_up_to_one_whole_gang():
    """``coming``: at target 0, an autoscaled deployment wants replicas (a request may wait: it is
    what brings one back) when its upper bound allows at least one replica, a whole gang for a
    gang deployment; not when ``max_replicas`` is below one gang (its bound is 0: ``DeploymentApplied``
    refuses that now, so the record is made by hand). Kills ``coming__mutmut_14`` (``>= 0``) and
    ``_15`` (``> 1``: a bound of exactly one)."""
    import attrs

    from rankcore.control import pool

    for kw, top, want in ((dict(max_replicas=1), 1, True), (dict(max_replicas=2, gang_size=2), 1, False),
                          (dict(max_replicas=2, gang_size=2), 2, True)):
        step = rc.step(rc.State(), rc.DeploymentApplied(name="a", num_replicas=0, autoscaling=True, min_replicas=0,
                                                        **kw))
        dep = attrs.evolve(step.state.deployments["a"], max_replicas=top)
        assert dep.target == 0 and pool.coming(dep) is want, (kw, top)


def test_the_replica_a_replacement_replaces_is_looked_at_when_the_event_names_none():
    """The replicas a step can have moved include the one each ``StartReplica`` replaces, in a fixed
    order (the commands' replicas, each then the one it replaces): here a replacement held back by a
    restart backoff, released by a ``Tick``, which names no replica. (In the steps the core makes, the
    replaced replica is also the event's or a ``StopReplica``'s, or gone before and after, so only the
    candidates show it.) Kills ``_candidates__mutmut_24``, ``_25``, ``_30``, ``_31``, ``_32`` (``replaces``
    never read) and ``_33`` (read only when it is not a name)."""
    from rankcore.control import pool

    state = rc.step(rc.State(), rc.Tick(now=0.0)).state
    for e in (rc.DeploymentApplied(name="llm", num_replicas=1, restart_backoff_s=1.0),
              rc.ReplicaPlaced(replica_id="llm#0", node_id="a", now=0.0),
              rc.ReplicaCrashed(replica_id="llm#0", cause="error", now=1.0),  # retried at once: llm#1
              rc.ReplicaPlaced(replica_id="llm#1", node_id="a", now=1.0),
              rc.ReplicaCrashed(replica_id="llm#1", cause="error", now=2.0)):  # llm#2 waits 1 s
        state = rc.step(state, e).state
    tick = rc.Tick(now=3.0)
    released = rc.step(state, tick)
    (start,) = released.commands
    assert isinstance(start, rc.StartReplica) and (start.replica_id, start.replaces) == ("llm#2", "llm#1")
    assert pool._candidates(state, released.state, tick, released.commands) == ["llm#2", "llm#1"]


def test_a_deployments_own_event_looks_at_all_its_replicas_the_first_time_its_type_is_stepped(monkeypatch):
    """A deployment's own event that changed its replica records (a scale up: the map gains one) looks at
    every replica it had, after the ones its commands name; also when it is the first event of its type
    (the field naming the deployment not yet kept: ``_NAMES`` empty). Kills ``_candidates__mutmut_43``
    (the field worked out only when already kept) and ``_candidates__mutmut_44`` (not worked out: no
    deployment), which only the first step of a type shows; and ``_moved__mutmut_1`` (``and`` for ``or``:
    a step that changed the replicas but not the weights version looked at none of them)."""
    from rankcore.control import pool

    state, rids = _serving_state(2)
    scale = rc.ScaleRequested(deployment="llm", num_replicas=3)
    up = rc.step(state, scale)
    new = [c.replica_id for c in up.commands if isinstance(c, rc.StartReplica)]
    assert len(new) == 1 and up.state.deployments["llm"].weights_version == state.deployments["llm"].weights_version
    monkeypatch.setattr(pool, "_NAMES", {})
    for _ in range(2):  # (the second time with the field kept)
        got = pool._candidates(state, up.state, scale, up.commands)
        assert got[:1] == new and sorted(got[1:]) == sorted(rids)  # (the deployment's: in its map's order)
        assert list(pool._NAMES.items()) == [(rc.ScaleRequested, "deployment")]


# ------------------------------------------------------------------ base/records.py


@attrs.frozen(kw_only=True)
class _Tagged:
    name: str
    tags: list = attrs.field(factory=list)
    size: int = 2


def test_only_slotted_attrs_classes_are_copied_and_the_refusal_names_the_class() -> None:
    """Kills ``_check__mutmut_5`` (``and`` for ``or``: an attrs class without slots, or a slotted
    class that is not attrs, let through) and ``_check__mutmut_9`` (the message dropped)."""

    @attrs.frozen(kw_only=True, slots=False)
    class Loose:
        a: int

    class Plain:
        __slots__ = ("a",)

    for cls in (Loose, Plain):
        for make in (maker, copier, lambda c: updater(c, "a")):
            with pytest.raises(TypeError) as caught:
                make(cls)
            assert str(caught.value) == f"{cls.__name__}: rankcore.base.records copies only slotted attrs classes"


def test_a_maker_fills_a_factory_field_with_a_fresh_value_unless_one_is_given() -> None:
    """Kills ``_maker__mutmut_21`` to ``_maker__mutmut_27`` (the factory, the argument or the slot
    write of a field with a factory broken). The core's own records get their makers at import,
    before mutmut's workers fork, so only a maker built at test time shows the generator itself."""

    @attrs.frozen(kw_only=True)
    class Fresh:
        name: str
        tags: list = attrs.field(factory=list)
        size: int = 2

    make = maker(Fresh)
    one, two = make(name="a"), make(name="b")
    assert one == Fresh(name="a") and one.tags == [] and one.size == 2
    assert one.tags is not two.tags  # (a new list each time, as the constructor makes)
    given = [1]
    got = make(name="c", tags=given, size=5)
    assert got == Fresh(name="c", tags=[1], size=5) and got.tags is given


def test_a_factory_taking_self_is_refused_naming_the_field() -> None:
    """Kills ``_maker__mutmut_20`` (the message dropped)."""

    @attrs.frozen(kw_only=True)
    class Selfish:
        a: int
        b: int = attrs.field(default=attrs.Factory(lambda self: self.a, takes_self=True))

    with pytest.raises(TypeError) as caught:
        maker(Selfish)
    assert str(caught.value) == "Selfish.b: a factory taking self"


def test_an_updater_names_every_field_the_record_lacks_or_the_field_named_twice() -> None:
    """Kills ``_updater__mutmut_14`` (the unknown fields joined by a wrong separator) and
    ``_updater__mutmut_15`` (the "twice" message changed)."""
    with pytest.raises(TypeError) as caught:
        updater(Cluster, "now", "colck", "nwo")
    assert str(caught.value) == "updater(Cluster, now, colck, nwo): no field colck, nwo"
    with pytest.raises(TypeError) as caught:
        updater(Cluster, "now", "now")
    assert str(caught.value) == "updater(Cluster, now, now): a field twice"


def test_copiers_and_makers_are_generated_once_per_class() -> None:
    """"Functions generated once per class": asking again gives the same function (generating
    one compiles source). Kills ``copier__mutmut_1``, ``copier__mutmut_2``, ``maker__mutmut_1``
    and ``maker__mutmut_2`` (the cache never read)."""
    assert copier(_Tagged) is copier(_Tagged)
    assert maker(_Tagged) is maker(_Tagged)


def test_a_generated_function_is_named_for_what_it_does_and_the_record_it_is_for() -> None:
    """What a traceback or a profile shows for a frame of the generated code (``copy``, ``make``,
    ``update``, in ``<rankcore.base.records KIND for CLASS>``). Kills ``_copier__mutmut_22``/``23``,
    ``_maker__mutmut_43``/``44`` and ``_updater__mutmut_39``/``40`` (the name changed). The record
    class is made here: its functions are generated in this test, not found in the per-class cache
    filled by an earlier test or at import (before mutmut's workers fork, with the unmutated code)."""

    @attrs.frozen(kw_only=True)
    class _Fresh:
        name: str
        size: int = 2

    for kind, fn in (("copy", copier(_Fresh)), ("make", maker(_Fresh)), ("update", updater(_Fresh, "size"))):
        assert fn.__name__ == kind
        assert fn.__code__.co_filename == f"<rankcore.base.records {kind} for _Fresh>"
    assert updater(_Fresh, "size")(maker(_Fresh)(name="a"), 7) == _Fresh(name="a", size=7)


def test_a_wake_that_must_wait_for_gpu_room_sends_no_load() -> None:
    """A sleeper whose node has no GPU room for it (what took the room is too young to evict)
    stays WARM, with no ``LoadReplica``, and waits (``Cluster.evicting``). Kills
    ``settle__mutmut_32`` (the wait's ``None`` became ``""``: a load was sent anyway)."""
    from rankcore import invariants as inv

    state = rc.State()
    for e in (rc.NodeJoined(node_id="n0", resources={"GPU": 1, "CPU": 8}, devices=(80,)),
              rc.DeploymentApplied(name="llm", num_replicas=1, resources={"GPU": 1}, model_bytes=60,
                                   min_deployment_time_s=0.0),
              rc.ReplicaPlaced(replica_id="llm#0", node_id="n0"), rc.ReplicaReady(replica_id="llm#0"),
              rc.SleepRequested(deployment="llm"), rc.TierMoved(replica_id="llm#0", tier="warm"),
              rc.DeploymentApplied(name="tr", num_replicas=1, resources={"GPU": 1}, model_bytes=50,
                                   min_deployment_time_s=3600.0),
              rc.ReplicaPlaced(replica_id="tr#1", node_id="n0"), rc.ReplicaReady(replica_id="tr#1"),
              rc.WakeRequested(deployment="llm")):
        result = rc.step(state, e)
        inv.check_step(state, e, result, full=True)
        state = result.state
    assert result.commands == ()
    assert state.deployments["llm"].replicas["llm#0"].residency is rc.Residency.WARM
    assert "llm#0" in state.cluster.evicting and "llm#0" not in state.cluster.hot


def test_a_repeated_sleep_or_wake_request_is_stale() -> None:
    """A request that changes nothing (asleep already, or awake already with no newer weights,
    every replica where it should be) is stale and sends nothing. Kills ``_request__mutmut_6``,
    ``sleep__mutmut_2``, ``sleep__mutmut_7``, ``wake__mutmut_28`` (never None) and
    ``wake__mutmut_14`` (the version already held taken as newer)."""
    state, _ = _fed(_RUNNING)
    for ev in (rc.WakeRequested(deployment="d"), rc.WakeRequested(deployment="d", weights_version=0)):
        again = rc.step(state, ev)
        assert again.stale and again.commands == () and again.state.deployments["d"] is state.deployments["d"], ev
    state, result = _fed([rc.SleepRequested(deployment="d")], state)
    assert not result.stale and [type(c).__name__ for c in result.commands] == ["OffloadReplica"]
    for step_first in ([], [rc.TierMoved(replica_id="d#0", tier="warm")]):  # (offloading, then asleep)
        state, _ = _fed(step_first, state)
        again = rc.step(state, rc.SleepRequested(deployment="d"))
        assert again.stale and again.commands == () and again.state.deployments["d"] is state.deployments["d"]


def test_a_wake_with_the_version_already_pushed_is_taken_and_an_older_one_refused() -> None:
    """``WakeRequested.weights_version``: the version pushed last is fine (versions only go up:
    an equal one is not older); an older one is refused naming the event, the deployment and
    both versions. Kills ``_check_version__mutmut_1`` (``<=``), ``_check_version__mutmut_2``
    (no message) and ``wake__mutmut_4``, ``_8``, ``_9``, ``_10`` (the event's name changed)."""
    state, _ = _fed(_RUNNING + [rc.WeightsPushed(deployment="d", version=1), rc.WeightsUpdated(replica_id="d#0", version=1),
                                rc.SleepRequested(deployment="d"), rc.TierMoved(replica_id="d#0", tier="warm")])
    woken = rc.step(state, rc.WakeRequested(deployment="d", weights_version=1))
    assert [(type(c).__name__, c.replica_id) for c in woken.commands] == [("LoadReplica", "d#0")]
    assert woken.state.deployments["d"].weights_version == 1
    with pytest.raises(InvalidEvent) as caught:
        rc.step(state, rc.WakeRequested(deployment="d", weights_version=0))
    assert str(caught.value) == ("WakeRequested('d'): weights version 0 is older than the last one pushed, 1 "
                                 "(versions only go up)")


def test_a_push_of_a_version_not_newer_is_refused_naming_both_versions() -> None:
    """Kills ``push__mutmut_1`` (``<``: the same version pushed again taken) and ``push__mutmut_2``
    (no message)."""
    state, _ = _fed(_RUNNING)
    with pytest.raises(InvalidEvent) as caught:
        rc.step(state, rc.WeightsPushed(deployment="d", version=0))
    assert str(caught.value) == "WeightsPushed('d'): version 0 is not newer than the last one pushed, 0"
    state, _ = _fed([rc.WeightsPushed(deployment="d", version=2)], state)
    with pytest.raises(InvalidEvent) as caught:
        rc.step(state, rc.WeightsPushed(deployment="d", version=2))
    assert str(caught.value) == "WeightsPushed('d'): version 2 is not newer than the last one pushed, 2"


def test_a_finished_load_keeps_the_gpu_memory_booked_for_it() -> None:
    """``TierMoved`` to ``hot``: the booking made for the load stays (the weights are on the GPU);
    only a move to ``warm`` frees it. Kills ``moved__mutmut_21`` (``or`` for ``and``: a load's
    answer freed the booking of a replica now on the GPU)."""
    from rankcore import invariants as inv

    state = rc.State()
    for e, where, booked in ((rc.NodeJoined(node_id="n0", resources={"GPU": 1, "CPU": 8}, devices=(80,)), None, False),
                             (rc.DeploymentApplied(name="a", num_replicas=1, resources={"GPU": 1}, model_bytes=60,
                                                   min_deployment_time_s=0.0), None, True),
                             (rc.ReplicaPlaced(replica_id="a#0", node_id="n0"), rc.Residency.HOT, True),
                             (rc.ReplicaReady(replica_id="a#0"), rc.Residency.HOT, True),
                             (rc.SleepRequested(deployment="a"), rc.Residency.OFFLOADING, True),
                             (rc.TierMoved(replica_id="a#0", tier="warm"), rc.Residency.WARM, False),
                             (rc.WakeRequested(deployment="a"), rc.Residency.LOADING, True),
                             (rc.TierMoved(replica_id="a#0", tier="hot"), rc.Residency.HOT, True)):
        result = rc.step(state, e)
        inv.check_step(state, e, result, full=True)
        state = result.state
        if where is not None:
            assert state.deployments["a"].replicas["a#0"].residency is where, e
        assert ("a#0" in state.cluster.hot) is booked, e
    assert rc.query.fully_serving(state.deployments["a"])


def test_a_weights_answer_clears_pending_only_for_the_version_last_sent() -> None:
    """``WeightsUpdated``: an older version's answer (a push overtook it) is stale and leaves
    the newer one pending (the replica does not serve weights it does not hold); the answer for
    the version last sent clears it (``False``, the field's type), and the same answer again is
    stale; a version never sent is refused, naming the replica and both versions. Kills
    ``updated__mutmut_3`` (``and`` for ``or``), ``updated__mutmut_13`` (pending set to None) and
    ``updated__mutmut_2`` (no message)."""
    state, _ = _fed(_RUNNING + [rc.WeightsPushed(deployment="d", version=1), rc.WeightsPushed(deployment="d", version=2)])
    rep = state.deployments["d"].replicas["d#0"]
    assert (rep.weights_version, rep.weights_pending) == (2, True)
    older = rc.step(state, rc.WeightsUpdated(replica_id="d#0", version=1))
    assert older.stale and older.state.deployments["d"].replicas["d#0"].weights_pending is True
    assert not rc.query.fully_serving(older.state.deployments["d"])
    state, result = _fed([rc.WeightsUpdated(replica_id="d#0", version=2)], state)
    assert not result.stale and state.deployments["d"].replicas["d#0"].weights_pending is False
    assert rc.query.fully_serving(state.deployments["d"])
    again = rc.step(state, rc.WeightsUpdated(replica_id="d#0", version=2))
    assert again.stale and again.state.deployments["d"] is state.deployments["d"]
    with pytest.raises(InvalidEvent) as caught:
        rc.step(state, rc.WeightsUpdated(replica_id="d#0", version=3))
    assert str(caught.value) == "WeightsUpdated: replica 'd#0' says it holds version 3, but the last one sent was 2"

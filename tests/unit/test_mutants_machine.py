"""Tests added for mutmut's survivors in rankcore/requests/machine.py (issue 36, `make mutate`;
docs/testing.md names each survivor and what killed it, or why it is equivalent).

Each test states a behaviour the module promises (its docstrings, docs/requests.md, a caller's
need), not a mutant's text. Mutants of ``RequestMachine``'s methods are named here by the
method (``_started__mutmut_8`` for ``xǁRequestMachineǁ_started__mutmut_8``).
"""

from __future__ import annotations

import pytest

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
    RequestMachine,
    RequestStatus,
    Started,
    Submit,
    Tick,
)

D = "llm"


def machine(*replicas: str, reports_started: bool = True, remember_ended: int = 100,
            **limits: int) -> RequestMachine:
    """A machine with ``D`` configured (``limits``) and ``replicas`` serving, in that join order."""
    m = RequestMachine(reports_started=reports_started, remember_ended=remember_ended)
    assert m.handle(Configure(deployment=D, **limits)) == []
    for r in replicas:
        m.handle(rc.PoolChanged(deployment=D, replica_id=r, membership="serving"))
    return m


def submit(m: RequestMachine, rid: str, **kw: object) -> list:
    return m.handle(Submit(request_id=rid, deployment=D, **kw))  # type: ignore[arg-type]


def late(m: RequestMachine) -> int:
    return m.counters(D).late


def snapshot(m: RequestMachine, *rids: str) -> tuple:
    return (m.counters(), m.pool(D), m.queued(D), [m.status(r) for r in rids])


# ------------------------------------------------------------------ late events
def test_every_event_about_a_request_that_ended_on_its_replica_counts_one_late() -> None:
    """``Counters.late``: each event about a request that had already ended is counted, once,
    and ignored. A request cancelled while its replica runs it stays on that replica (its slot
    held) until the replica answers or says it was never delivered: a second ``Cancel``, a
    ``Started`` (twice) and then the ``NotDelivered`` each add one. Kills ``_cancel__mutmut_8``,
    ``_started__mutmut_8`` and ``_not_delivered__mutmut_20`` (``late = 1``: the count reset),
    ``_cancel__mutmut_9``, ``_started__mutmut_9``, ``_not_delivered__mutmut_21`` (``-= 1``) and
    ``_cancel__mutmut_10``, ``_started__mutmut_10``, ``_not_delivered__mutmut_22`` (``+= 2``)."""
    m = machine("a")
    submit(m, "r0")
    assert m.handle(Cancel(request_id="r0")) == [CancelOnReplica(request_id="r0", replica_id="a")]
    assert late(m) == 0
    for n in (1, 2):
        assert m.handle(Cancel(request_id="r0")) == []
        assert late(m) == n
    for n in (3, 4):
        assert m.handle(Started(request_id="r0", replica_id="a")) == []
        assert late(m) == n
    assert m.pool(D)[0].in_flight == 1  # still held: its slot waits for the replica
    assert m.handle(NotDelivered(request_id="r0", replica_id="a")) == []
    assert late(m) == 5
    assert m.status("r0") == RequestStatus(request_id="r0", state="cancelled", deployment=D, replica_id="a")
    c = m.counters(D)
    assert (c.cancelled, c.in_flight, c.lost) == (1, 0, 0)


# ------------------------------------------------------------------ bad events
def test_a_started_or_not_delivered_that_cannot_be_is_refused_naming_the_request_and_changes_nothing() -> None:
    """Bad input raises ``InvalidEvent`` naming what was wrong, and changes nothing: a
    ``Started`` or ``NotDelivered`` for a queued request (no replica holds it), a second
    ``Started``, a ``NotDelivered`` for one reported started. Kills ``_started__mutmut_12``,
    ``_started__mutmut_14``, ``_not_delivered__mutmut_9`` and ``_not_delivered__mutmut_13``
    (each message dropped: ``InvalidEvent(None)``)."""
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0")
    submit(m, "r1")
    m.handle(Started(request_id="r0"))
    before = snapshot(m, "r0", "r1")
    cases = [
        (Started(request_id="r1"), "Started: request 'r1' is queued: no replica holds it"),
        (Started(request_id="r0"), "Started: request 'r0' already started on replica 'a'"),
        (NotDelivered(request_id="r1"), "NotDelivered: request 'r1' is queued: no replica holds it"),
        (NotDelivered(request_id="r0"), "NotDelivered: request 'r0' was reported started on replica 'a'"),
    ]
    for event, message in cases:
        with pytest.raises(rc.InvalidEvent) as caught:
            m.handle(event)
        assert str(caught.value) == message
        assert snapshot(m, "r0", "r1") == before


def test_a_pool_reset_naming_a_replica_both_serving_and_draining_is_refused_listing_them() -> None:
    """A ``PoolReset`` that lists a replica as both serving and draining is refused, naming the
    deployment and those replicas, and changes nothing. Kills ``_pool_reset__mutmut_6`` (no
    message) and ``_pool_reset__mutmut_7`` (None shown, not the replicas)."""
    m = machine("a", "b")
    before = snapshot(m)
    with pytest.raises(rc.InvalidEvent) as caught:
        m.handle(rc.PoolReset(deployment=D, serving=("c", "a", "b"), draining=("b", "a"), coming=False))
    assert str(caught.value) == "PoolReset('llm'): replicas both serving and draining: ['a', 'b']"
    assert snapshot(m) == before


# ------------------------------------------------------------------ NotDelivered
def test_a_not_delivered_naming_the_replica_it_left_is_stale() -> None:
    """``NotDelivered.replica_id``, when given, must be the replica the request is on;
    otherwise the event is stale: counted late and ignored. A request not delivered to ``a``
    moved on to ``b``; a second report from ``a`` must not take it off ``b`` nor leave ``b``
    out. Kills ``_not_delivered__mutmut_3`` (the replica named not checked)."""
    m = machine("a", "b", max_ongoing_requests=1)
    submit(m, "r0")
    assert m.handle(NotDelivered(request_id="r0", replica_id="a")) == [
        Dispatch(request_id="r0", deployment=D, replica_id="b", attempt=0)]
    assert m.handle(NotDelivered(request_id="r0", replica_id="a")) == []
    assert late(m) == 1
    assert m.status("r0") == RequestStatus(request_id="r0", state="dispatched", deployment=D, replica_id="b")
    assert [(v.replica_id, v.in_flight, v.excluded) for v in m.pool(D)] == [("a", 0, True), ("b", 1, False)]


def test_a_request_put_back_by_not_delivered_is_queued_again() -> None:
    """A ``NotDelivered`` request goes back to the head of the queue, queued: with no replica
    free it waits, and a ``Started`` for it is refused (no replica holds it), as for any
    queued request. Kills ``_not_delivered__mutmut_27`` (its state left unset: the ``Started``
    taken, the request marked running while queued)."""
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0")
    assert m.handle(NotDelivered(request_id="r0", replica_id="a")) == []  # a is left out
    assert m.queued(D) == ("r0",)
    assert m.status("r0") == RequestStatus(request_id="r0", state="queued", deployment=D, position=0)
    with pytest.raises(rc.InvalidEvent, match="Started: request 'r0' is queued: no replica holds it"):
        m.handle(Started(request_id="r0"))
    assert m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="serving")) == [
        Dispatch(request_id="r0", deployment=D, replica_id="a", attempt=0)]
    assert m.handle(Started(request_id="r0", replica_id="a")) == []
    assert m.status("r0").state == "running"  # type: ignore[union-attr]


# ------------------------------------------------------------------ deadlines
def test_a_request_cancelled_on_its_replica_does_not_also_time_out() -> None:
    """Every accepted request ends exactly once: one cancelled while its replica runs it (its
    slot still held) is not failed again when its deadline passes. Kills ``_tick__mutmut_17``
    (``and`` for ``or``: an ended request whose deadline entry is current timed out too)."""
    m = machine("a")
    submit(m, "r0", deadline=5.0)
    m.handle(Cancel(request_id="r0"))
    assert m.handle(Tick(now=6.0)) == []
    c = m.counters(D)
    assert (c.cancelled, c.failed, c.in_flight, c.lost) == (1, 0, 0, 0)
    assert m.status("r0").state == "cancelled"  # type: ignore[union-attr]


def test_an_old_deadline_of_a_reused_id_does_not_end_the_new_request() -> None:
    """An id forgotten past the memory (``remember_ended``) may be submitted again: the new
    request keeps its own deadline (none here), not the one of the request that had the id
    before. Kills ``_tick__mutmut_17`` (``and`` for ``or``: an entry of another request under
    the same id taken for the live one)."""
    m = machine("a", remember_ended=0)
    submit(m, "r0", deadline=5.0)
    m.handle(Completed(request_id="r0"))
    assert m.status("r0") is None  # forgotten: the id is free again
    submit(m, "r0")
    assert m.handle(Tick(now=6.0)) == []
    assert m.status("r0").state == "dispatched"  # type: ignore[union-attr]


def test_an_ended_requests_deadline_does_not_hold_up_the_later_ones() -> None:
    """Every request whose deadline is ``<= now`` ends at a ``Tick``, whatever ended before it:
    ``r0`` (deadline 1) answered, ``r1`` (deadline 2, on the slot ``r0`` freed) must still time
    out at t=3.
    Kills ``_tick__mutmut_22`` (``break`` for ``continue``: an ended request's entry stopped
    the sweep)."""
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0", deadline=1.0)
    submit(m, "r1", deadline=2.0)
    assert m.handle(Completed(request_id="r0")) == [Dispatch(request_id="r1", deployment=D, replica_id="a",
                                                              attempt=0)]
    assert m.handle(Tick(now=3.0)) == [
        Failed(request_id="r1", reason="timeout", replica_id="a", detail="its deadline 2.0 passed on replica 'a' (now 3.0)"),
        CancelOnReplica(request_id="r1", replica_id="a")]


def test_requests_timing_out_on_their_replicas_each_count_failed_with_reason_timeout() -> None:
    """A dispatched request whose deadline passes fails (``Failed("timeout")``, counted in
    ``failed``, one each) and says so in its status while its replica still holds it and after.
    Kills ``_tick__mutmut_38`` (``failed = 1``: the count reset), ``_tick__mutmut_43`` (no
    reason kept), ``_tick__mutmut_49`` and ``_tick__mutmut_50`` (another reason kept)."""
    m = machine("a", "b", max_ongoing_requests=1)
    submit(m, "r0", deadline=5.0)
    submit(m, "r1", deadline=5.0)
    out = m.handle(Tick(now=5.0))
    assert [(type(a).__name__, a.request_id) for a in out] == [
        ("Failed", "r0"), ("CancelOnReplica", "r0"), ("Failed", "r1"), ("CancelOnReplica", "r1")]
    assert m.counters(D).failed == 2
    want = RequestStatus(request_id="r0", state="failed", deployment=D, replica_id="a", reason="timeout")
    assert m.status("r0") == want
    m.handle(Completed(request_id="r0", replica_id="a"))  # the late answer frees the slot
    assert m.status("r0") == want


def test_the_deadline_heap_is_rebuilt_only_past_twice_its_live_entries_plus_64() -> None:
    """Ended requests leave their deadline entries in the heap (skipped when popped); a
    ``Tick`` rebuilds it once it holds more than twice the live deadlines plus 64 (mostly
    stale: memory stays bounded), and not before (the rebuild scans every entry: done each
    ``Tick`` it would break the amortised O(log n) an event costs). One live deadline: 66
    entries are kept, 67 are rebuilt to the live one. Kills ``_tick__mutmut_67`` (``>=``: a
    heap at the bound rebuilt), ``_tick__mutmut_68`` (``- 64``: rebuilt at nearly every
    ``Tick``) and ``_tick__mutmut_70`` (``3 *``: a heap past the bound kept)."""
    m = machine("a", max_ongoing_requests=1000)
    submit(m, "live", deadline=50.0)
    for i in range(65):
        submit(m, f"r{i}", deadline=100.0)
        m.handle(Completed(request_id=f"r{i}"))
    assert len(m._deadlines) == 66
    assert m.handle(Tick(now=1.0)) == []
    assert len(m._deadlines) == 66
    submit(m, "r65", deadline=100.0)
    m.handle(Completed(request_id="r65"))
    assert m.handle(Tick(now=2.0)) == []
    assert [e[2] for e in m._deadlines] == ["live"]
    assert [a.request_id for a in m.handle(Tick(now=50.0))] == ["live", "live"]  # Failed, CancelOnReplica


# ------------------------------------------------------------------ ends in the queue
def test_a_request_rejected_at_submission_is_remembered_as_never_run() -> None:
    """``status`` of a request rejected when submitted: rejected, why, no replica, attempt 0
    (no replica ever ran it). Kills ``_reject_new__mutmut_10`` (attempt 1 remembered) and
    ``status__mutmut_8`` (a remembered status without its request id)."""
    m = machine("a", max_ongoing_requests=1, max_queued_requests=0)
    submit(m, "r0")
    assert [a.reason for a in submit(m, "r1")] == ["overloaded"]
    assert m.status("r1") == RequestStatus(request_id="r1", state="rejected", deployment=D, attempt=0,
                                           reason="overloaded")


@pytest.mark.parametrize("how, reason", [("timeout", "timeout"), ("no replica", "unavailable")])
def test_a_queued_request_that_ends_unrun_is_rejected_in_its_status(how: str, reason: str) -> None:
    """A queued request no replica ever ran ends ``Rejected``, and ``status`` says so with the
    same reason (a deadline passed; no replica serving and none coming). Kills
    ``_end_queued__mutmut_7`` (no end state kept: remembered as done), ``_end_queued__mutmut_8``
    (no reason kept), ``_end_queued__mutmut_12`` and ``_end_queued__mutmut_13`` (a state that
    is none of ``STATES``)."""
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0")
    m.handle(Started(request_id="r0"))  # (not idempotent: fails if a dies)
    submit(m, "r1", deadline=5.0)
    if how == "timeout":
        out = m.handle(Tick(now=5.0))
    else:
        out = m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
        out = [a for a in out if a.request_id == "r1"]
    assert [(type(a), a.reason) for a in out] == [(Rejected, reason)]
    assert m.status("r1") == RequestStatus(request_id="r1", state="rejected", deployment=D, reason=reason)
    assert m.counters(D).rejected[reason] == 1


def test_retried_requests_left_with_no_replica_fail_naming_the_replica_that_died() -> None:
    """No replica serving and none coming: a queued request a dead replica had started (put
    back for a retry) ends ``Failed("replica_died")`` naming that replica, the detail saying
    why it ended; each counts one ``failed``, and its status says failed, why, where, which
    attempt. Two here, retried off ``a``. Kills ``_end_queued__mutmut_22`` (``failed = 1``),
    ``_end_queued__mutmut_23`` (``-= 1``), ``_end_queued__mutmut_24`` (``+= 2``),
    ``_end_queued__mutmut_27`` (always ``"timeout"``), ``_end_queued__mutmut_33`` and
    ``_end_queued__mutmut_34`` (another reason), ``_end_queued__mutmut_36``,
    ``_end_queued__mutmut_41`` and ``_end_queued__mutmut_42`` (the end state not kept, or not
    one of ``STATES``), ``_end_queued__mutmut_37`` (no reason kept), ``_end_queued__mutmut_44``
    (no request id in the action), ``_end_queued__mutmut_47`` and ``_end_queued__mutmut_51``
    (no detail)."""
    m = machine("a", reports_started=False, max_ongoing_requests=2)
    submit(m, "r0", idempotent=True)
    submit(m, "r1", idempotent=True)
    detail = "replica 'a' died while running it, then deployment 'llm' has no replica serving and none coming"
    assert m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone")) == [
        Failed(request_id="r0", reason="replica_died", replica_id="a", detail=detail),
        Failed(request_id="r1", reason="replica_died", replica_id="a", detail=detail)]
    c = m.counters(D)
    assert (c.retried, c.failed, c.in_queue, c.lost) == (2, 2, 0, 0)
    for rid in ("r0", "r1"):
        assert m.status(rid) == RequestStatus(request_id=rid, state="failed", deployment=D, replica_id="a",
                                              attempt=1, reason="replica_died")


# ------------------------------------------------------------------ the pool
def test_a_replica_gone_holding_an_ended_request_forgets_it_and_still_settles_the_rest() -> None:
    """A replica that leaves the pool: a request it held that had already ended (cancelled
    while it ran; the answer it owed will never come) is forgotten, its status kept in the
    memory, and every other request it held is dealt with as usual, in dispatch order (here
    ``r1``, never started, back to the queue, then dispatched to ``b``). Kills
    ``_gone__mutmut_6`` (the ended request not passed on to be forgotten: an error) and
    ``_gone__mutmut_7`` (``break`` for ``continue``: the requests after an ended one left on
    a replica that is gone)."""
    m = machine("a", max_ongoing_requests=2)
    submit(m, "r0")
    submit(m, "r1")
    m.handle(Cancel(request_id="r0"))
    m.handle(rc.PoolChanged(deployment=D, replica_id="b", membership="serving"))
    assert m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone")) == [
        Dispatch(request_id="r1", deployment=D, replica_id="b", attempt=0)]
    assert m.status("r0") == RequestStatus(request_id="r0", state="cancelled", deployment=D, replica_id="a")
    assert m.status("r1") == RequestStatus(request_id="r1", state="dispatched", deployment=D, replica_id="b")
    c = m.counters(D)
    assert (c.cancelled, c.in_flight, c.in_queue, c.lost) == (1, 1, 0, 0)
    assert m.handle(Completed(request_id="r0")) == [] and m.counters(D).late == 1


@pytest.mark.parametrize("started", [False, True])
def test_a_request_put_back_when_its_replica_left_is_queued_again(started: bool) -> None:
    """A replica gone: a request it held that never started goes back to the queue, and so does
    a started idempotent one to be retried; either is queued again, so a ``Started`` for it,
    while no replica holds it, is refused as for any queued request. Kills ``_gone__mutmut_16``
    (never started: its state left unset) and ``_gone__mutmut_26`` (retried: the same)."""
    m = machine("a")
    m.handle(rc.PoolComing(deployment=D, coming=True))
    submit(m, "r0", idempotent=True)
    if started:
        m.handle(Started(request_id="r0"))
    assert m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone")) == []
    assert m.status("r0") == RequestStatus(request_id="r0", state="loading", deployment=D, position=0,
                                           attempt=int(started))
    with pytest.raises(rc.InvalidEvent, match="Started: request 'r0' is queued: no replica holds it"):
        m.handle(Started(request_id="r0"))
    assert m.handle(rc.PoolChanged(deployment=D, replica_id="b", membership="serving")) == [
        Dispatch(request_id="r0", deployment=D, replica_id="b", attempt=int(started))]


def test_started_requests_a_gone_replica_held_each_fail_saying_why_not_retried() -> None:
    """A replica gone: each started request it held that cannot be retried fails
    (``Failed("replica_died")``, one ``failed`` each, and so in its status), the detail naming
    the replica and why: a stream, not idempotent, or its retries used up. Kills
    ``_gone__mutmut_31`` (``failed = 1``), ``_gone__mutmut_37`` and ``_gone__mutmut_41`` (the
    why garbled) and ``_gone__mutmut_46`` (no reason kept)."""
    m = machine("a", max_retries=0)
    submit(m, "r0", idempotent=True, stream=True)
    submit(m, "r1")
    submit(m, "r2", idempotent=True)
    for rid in ("r0", "r1", "r2"):
        m.handle(Started(request_id=rid))
    died = "replica 'a' of 'llm' died while running it"
    assert m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone")) == [
        Failed(request_id="r0", reason="replica_died", replica_id="a", detail=f"{died} (a stream)"),
        Failed(request_id="r1", reason="replica_died", replica_id="a", detail=f"{died} (not idempotent)"),
        Failed(request_id="r2", reason="replica_died", replica_id="a", detail=f"{died} (retries used up: 0)")]
    c = m.counters(D)
    assert (c.failed, c.retried, c.in_flight, c.lost) == (3, 0, 0, 0)
    for rid in ("r0", "r1", "r2"):
        assert m.status(rid) == RequestStatus(request_id=rid, state="failed", deployment=D, replica_id="a",
                                              reason="replica_died")


# ------------------------------------------------------------------ reads
def test_the_load_of_a_deployment_never_seen_is_nothing() -> None:
    """``load``: nothing queued and no replica for a deployment the machine does not know (the
    autoscaler is fed no phantom request). Kills ``load__mutmut_4`` (one queued reported)."""
    m = machine("a")
    submit(m, "r0")
    assert m.load("nope") == (0, ())
    assert m.load(D) == (0, (("a", 1),))


@pytest.mark.parametrize("name", ["nope", "pooled"])
def test_counters_of_a_deployment_never_configured_are_refused_naming_it(name: str) -> None:
    """``counters(deployment)`` raises ``UnknownDeployment`` naming the deployment for one never
    configured (a pool alone is not a configuration). Kills ``counters__mutmut_7`` (no message)."""
    m = machine("a")
    m.handle(rc.PoolChanged(deployment="pooled", replica_id="b", membership="serving"))
    with pytest.raises(rc.UnknownDeployment) as caught:
        m.counters(name)
    assert str(caught.value) == f"counters: no deployment named {name!r} was configured"


def test_counters_in_all_add_up_each_deployments_and_the_unknown_ones_only_there() -> None:
    """``counters()`` (everyone's) is each configured deployment's counters added up, plus the
    Submits for deployments never configured and the late events about them; one
    deployment's counters hold none of the latter. Kills ``counters__mutmut_25`` (no
    ``dispatched`` in all) and ``counters__mutmut_60`` (the unknown deployments' late events in
    every deployment's count)."""
    m = machine("a")
    m.handle(Configure(deployment="emb"))
    m.handle(rc.PoolChanged(deployment="emb", replica_id="e", membership="serving"))
    submit(m, "r0")
    submit(m, "r1")
    m.handle(Submit(request_id="e0", deployment="emb"))
    m.handle(Submit(request_id="z0", deployment="zzz"))
    assert m.handle(Cancel(request_id="z0")) == []  # about a request that ended: late, unknown deployment
    m.handle(Completed(request_id="r0"))
    assert m.handle(Cancel(request_id="r0")) == []  # late, llm
    one, emb, every = m.counters(D), m.counters("emb"), m.counters()
    assert (one.dispatched, emb.dispatched, every.dispatched) == (2, 1, 3)
    assert (one.late, emb.late, every.late) == (1, 0, 2)
    assert (one.submitted, emb.submitted, every.submitted) == (2, 1, 4)
    assert (one.rejected["unknown_deployment"], every.rejected["unknown_deployment"]) == (0, 1)
    assert every.lost == 0


# ------------------------------------------------------------------ session 44: the rest of the module
def test_completed_without_a_replica_for_a_queued_request_is_refused_naming_it() -> None:
    """``Completed`` for a request still in the queue (no replica holds it) is an illegal event,
    refused with an error that names the request. Kills ``_completed__mutmut_9`` (no message)."""
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0")
    submit(m, "r1")
    assert m.queued(D) == ("r1",)
    with pytest.raises(rc.InvalidEvent, match=r"Completed: request 'r1' is queued"):
        m.handle(Completed(request_id="r1"))
    assert m.queued(D) == ("r1",)  # nothing changed


def test_unknown_request_ids_are_refused_naming_the_event() -> None:
    """An event about an id the machine never saw names the event's own type, so the caller
    knows which of its answers was wrong. Kills ``_lookup__mutmut_9`` ("NoneType")."""
    m = machine("a")
    for ev, name in ((Completed(request_id="zz"), "Completed"), (Started(request_id="zz"), "Started"),
                     (Cancel(request_id="zz"), "Cancel")):
        with pytest.raises(rc.InvalidEvent, match=rf"^{name}: unknown request id 'zz'"):
            m.handle(ev)


def test_answers_after_a_request_ended_on_its_replica_count_each_time() -> None:
    """A request cancelled while its replica runs it: the replica's ``Started`` and then its
    ``Completed`` are both late, two in all (counted, not reset). Kills ``_completed__mutmut_13``."""
    m = machine("a")
    submit(m, "r0")
    m.handle(Cancel(request_id="r0"))
    assert m.handle(Started(request_id="r0", replica_id="a")) == []
    assert late(m) == 1
    assert m.handle(Completed(request_id="r0", replica_id="a")) == []
    assert late(m) == 2
    assert m.status("r0") == RequestStatus(request_id="r0", state="cancelled", deployment=D, replica_id="a")


def test_a_completed_request_is_remembered_as_done_and_failed_answers_add_up() -> None:
    """``status`` of a request answered ok is ``done``; of one whose handler raised, ``failed``
    (``app_error``), and every such answer is counted. Kills ``_completed__mutmut_23`` (the
    request ended with no final state) and ``_completed__mutmut_29`` (``app_errors = 1``)."""
    m = machine("a")
    for rid in ("r0", "r1", "r2"):
        submit(m, rid)
    m.handle(Completed(request_id="r0", replica_id="a"))
    assert m.status("r0") == RequestStatus(request_id="r0", state="done", deployment=D, replica_id="a")
    m.handle(Completed(request_id="r1", replica_id="a", ok=False))
    m.handle(Completed(request_id="r2", replica_id="a", ok=False))
    assert m.status("r2") == RequestStatus(request_id="r2", state="failed", deployment=D, replica_id="a",
                                           reason="app_error")
    c = m.counters(D)
    assert (c.answered, c.app_errors, c.in_flight) == (1, 2, 0)


def test_events_about_an_earlier_dispatch_are_late_and_change_nothing() -> None:
    """A request that never started on ``a`` goes back to the queue when ``a`` leaves and is sent
    to ``b``: ``a``'s ``Started`` and ``Completed`` for it, arriving afterwards, are about the
    earlier dispatch: each counted late, the request still dispatched on ``b`` (not started, not
    ended). Kills ``_started__mutmut_3`` (``Started`` looked up without its replica) and
    ``_lookup__mutmut_26`` (``late = 1``)."""
    m = machine("a", "b")
    submit(m, "r0")
    assert m.status("r0").replica_id == "a"  # type: ignore[union-attr]
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
    assert out == [Dispatch(request_id="r0", deployment=D, replica_id="b", attempt=0)]
    assert m.handle(Started(request_id="r0", replica_id="a")) == []
    assert m.handle(Completed(request_id="r0", replica_id="a")) == []
    assert late(m) == 2
    assert m.status("r0") == RequestStatus(request_id="r0", state="dispatched", deployment=D, replica_id="b")
    m.handle(Started(request_id="r0", replica_id="b"))  # b's own answers still count
    assert m.status("r0").state == "running"  # type: ignore[union-attr]


def test_status_carries_the_attempt_while_dispatched_and_after_it_ended() -> None:
    """A started idempotent request whose replica died is retried (attempt 1) on the next one;
    ``status`` says attempt 1 while it is dispatched there, and still after it was cancelled
    there (ended, its replica still holding it). Kills ``status__mutmut_62`` and
    ``status__mutmut_32`` (the attempt left out: 0)."""
    m = machine("a", "b")
    submit(m, "r0", idempotent=True)
    m.handle(Started(request_id="r0", replica_id="a"))
    m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
    assert m.status("r0") == RequestStatus(request_id="r0", state="dispatched", deployment=D, replica_id="b",
                                           attempt=1)
    m.handle(Cancel(request_id="r0"))
    assert m.status("r0") == RequestStatus(request_id="r0", state="cancelled", deployment=D, replica_id="b",
                                           attempt=1)


def test_the_live_deadline_count_falls_by_one_per_ended_request() -> None:
    """The count of live requests with a deadline (what the heap's bound is twice of) falls by
    one per request that ends, so 100 live deadlines and one ended keep a heap of 101 entries
    through a ``Tick`` (bound 2 x 99 + 64), where a count reset to 1 would rebuild it at every
    ``Tick`` (a scan of every entry each time). Kills ``_end__mutmut_4`` (``= 1`` for ``-= 1``)."""
    m = machine("a", max_ongoing_requests=1000)
    for i in range(101):
        submit(m, f"r{i}", deadline=100.0)
    m.handle(Completed(request_id="r0"))
    m.handle(Completed(request_id="r1"))
    assert m.handle(Tick(now=1.0)) == []
    assert len(m._deadlines) == 101


def test_bad_construction_and_foreign_events_are_refused_naming_the_field_and_the_value() -> None:
    """``RequestMachine(...)`` with a bad setting names the setting and what it got; an event the
    machine does not take names its type and shows it. Kills ``__init____mutmut_4/5/12`` and
    ``handle__mutmut_5/6/7`` (a message dropped, or showing None)."""
    with pytest.raises(rc.InvalidConfig, match=r"^RequestMachine.reports_started must be a bool, got 'yes'"):
        RequestMachine(reports_started="yes")  # type: ignore[arg-type]
    with pytest.raises(rc.InvalidConfig, match=r"^RequestMachine.remember_ended must be an int >= 0, got -1"):
        RequestMachine(remember_ended=-1)
    with pytest.raises(rc.InvalidEvent, match=r"^the request machine takes no ReplicaReady \(got ReplicaReady\("):
        machine("a").handle(rc.ReplicaReady(replica_id="a"))  # type: ignore[arg-type]


def test_a_reused_request_id_is_refused_saying_ids_must_be_unique() -> None:
    """Kills ``_submit__mutmut_6/7`` (the refusal's reason garbled)."""
    m = machine("a")
    submit(m, "r0")
    with pytest.raises(rc.InvalidEvent, match=r"'r0' is already in use .*; request ids must be unique$"):
        submit(m, "r0")


def test_requests_refused_at_submission_say_why_and_are_remembered_under_their_id() -> None:
    """A Submit for a deployment never configured, one whose deadline had already passed, and one
    for a deployment with no replica serving and none coming: each ``Rejected`` names the request
    and why (a detail saying what), and ``status`` remembers it rejected, attempt 0, with that
    reason. Kills ``_submit__mutmut_22/23/24`` (the unknown deployment's record garbled),
    ``_submit__mutmut_42`` (the expired request rejected under no id), ``_submit__mutmut_44`` and
    ``_submit__mutmut_57`` (no detail)."""
    m = machine("a")
    (r,) = m.handle(Submit(request_id="u", deployment="nope"))
    assert (r.request_id, r.reason) == ("u", "unknown_deployment")
    assert m.status("u") == RequestStatus(request_id="u", state="rejected", deployment="nope",
                                          reason="unknown_deployment")
    m.handle(Tick(now=10.0))
    (r,) = submit(m, "late", deadline=5.0)
    assert (r.request_id, r.reason) == ("late", "timeout") and "its deadline 5.0 had passed (now 10.0)" in r.detail
    assert m.status("late") == RequestStatus(request_id="late", state="rejected", deployment=D, reason="timeout")
    m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
    (r,) = submit(m, "none")
    assert (r.request_id, r.reason) == ("none", "unavailable")
    assert r.detail == f"deployment {D!r} has no replica serving and none coming"


def test_a_draining_replica_is_not_serving_so_a_lone_one_leaves_the_deployment_unavailable() -> None:
    """The serving count falls when a replica drains (it finishes what it holds, takes nothing
    new): with its only replica draining and none coming, a new request is refused
    ``unavailable`` rather than queued for a replica that will never take it; serving again,
    it takes requests. Kills ``_member__mutmut_15`` (a drain counted as one more serving)."""
    m = machine("a")
    m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="draining"))
    assert [a.reason for a in submit(m, "r0")] == ["unavailable"]
    m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="serving"))
    assert submit(m, "r1") == [Dispatch(request_id="r1", deployment=D, replica_id="a", attempt=0)]


def test_the_free_slot_heap_stays_small_over_many_requests() -> None:
    """The heap of slot counts that may have a free replica holds each count once (``low_set``):
    1,000 requests through one replica leave it at most ``max_ongoing_requests`` entries long.
    Kills ``_Dep.enter__mutmut_11`` (a count never marked as in the heap: pushed again on every
    entry, the heap growing with the requests served)."""
    m = machine("a", max_ongoing_requests=2)
    for i in range(1000):
        submit(m, f"r{i}")
        m.handle(Completed(request_id=f"r{i}"))
    assert len(m._deps[D].lows) <= 2

"""The request machine's rules, one at a time (rankcore/requests/machine.py, issue 22)."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.base.records import maker
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
    Started,
    Submit,
    Tick,
)

D = "llm"


def machine(*replicas: str, reports_started: bool = True, coming: bool = False, **limits: int) -> RequestMachine:
    m = RequestMachine(reports_started=reports_started)
    assert m.handle(Configure(deployment=D, **limits)) == []
    for r in replicas:
        m.handle(rc.PoolChanged(deployment=D, replica_id=r, membership="serving"))
    if coming:
        m.handle(rc.PoolComing(deployment=D, coming=True))
    return m


def submit(m: RequestMachine, rid: str, **kw: object) -> list:
    return m.handle(Submit(request_id=rid, deployment=D, **kw))  # type: ignore[arg-type]


def where(actions: list) -> dict[str, str]:
    return {a.request_id: a.replica_id for a in actions if isinstance(a, Dispatch)}


def snapshot(m: RequestMachine) -> tuple:
    return (m.counters(), m.pool(D), m.queued(D), m.coming(D),
            [m.status(r) for r in ("r0", "r1", "r2", "r3", "r4")])


def no_loss(m: RequestMachine) -> None:
    assert m.counters().lost == 0
    for d in m.deployments():
        assert m.counters(d).lost == 0


# ---------------------------------------------------------------- configure


def test_configure_defaults_are_ray_serves():
    c = Configure(deployment=D)
    assert (c.max_ongoing_requests, c.max_queued_requests, c.max_retries) == (5, -1, 3)


@pytest.mark.parametrize("field,value", [("max_ongoing_requests", 0), ("max_ongoing_requests", -1),
                                         ("max_queued_requests", -2), ("max_retries", -1),
                                         ("max_ongoing_requests", True)])
def test_bad_limits_are_refused_by_name(field, value):
    with pytest.raises(rc.InvalidConfig, match=f"Configure.{field}"):
        Configure(deployment=D, **{field: value})


def test_submit_to_a_deployment_never_configured_is_rejected_404():
    m = RequestMachine()
    m.handle(rc.PoolChanged(deployment="other", replica_id="a", membership="serving"))  # a pool is not a config
    for dep in ("nope", "other"):
        (a,) = m.handle(Submit(request_id=f"x-{dep}", deployment=dep))
        assert isinstance(a, Rejected) and a.reason == "unknown_deployment" and dep in a.detail
    c = m.counters()
    assert (c.submitted, c.rejected["unknown_deployment"], c.lost) == (2, 2, 0)
    assert m.status("x-nope").state == "rejected"


# -------------------------------------------------------------- bad input


def test_bad_input_raises_and_changes_nothing():
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0")
    submit(m, "r1")  # queued
    m.handle(Started(request_id="r0"))
    before = snapshot(m)
    bad = [
        Submit(request_id="r0", deployment=D),  # duplicate live id
        Completed(request_id="nobody"),  # unknown id
        Completed(request_id="r1"),  # queued: no replica holds it
        Started(request_id="r1"),
        Started(request_id="r0"),  # already started
        NotDelivered(request_id="r0"),  # started: it was delivered
        rc.PoolReset(deployment=D, serving=("a",), draining=("a",), coming=False),
        rc.ScaleRequested(deployment=D, num_replicas=1),  # not a request event
    ]
    for ev in bad:
        with pytest.raises(rc.InvalidEvent):
            m.handle(ev)  # type: ignore[arg-type]
        assert snapshot(m) == before, ev
    m.handle(Tick(now=10.0))
    with pytest.raises(rc.InvalidEvent, match="went back"):
        m.handle(Tick(now=9.0))


def test_a_reused_id_of_a_request_that_ended_recently_is_refused():
    m = machine("a")
    submit(m, "r0")
    m.handle(Completed(request_id="r0"))
    with pytest.raises(rc.InvalidEvent, match="already in use"):
        submit(m, "r0")


def test_unknown_membership_is_refused():
    with pytest.raises(ValueError, match="membership"):  # where the record is built (commands.py)
        rc.PoolChanged(deployment=D, replica_id="a", membership="sleeping")
    m = machine("a")
    before = snapshot(m)
    unchecked = maker(rc.PoolChanged)(deployment=D, replica_id="a", membership="sleeping")
    with pytest.raises(rc.InvalidEvent, match="sleeping"):  # and by the machine, built without its validator
        m.handle(unchecked)
    assert snapshot(m) == before


# ------------------------------------------------------------ dispatch


def test_at_most_max_ongoing_per_replica_then_the_queue():
    m = machine("a", "b", max_ongoing_requests=2)
    out = [a for i in range(5) for a in submit(m, f"r{i}")]
    assert sorted(where(out).values()) == ["a", "a", "b", "b"]
    assert m.queued(D) == ("r4",)
    assert {v.replica_id: v.in_flight for v in m.pool(D)} == {"a": 2, "b": 2}


def test_fewest_in_flight_wins():
    m = machine("a", "b", "c", max_ongoing_requests=5)
    for i in range(3):
        submit(m, f"r{i}")  # one each
    submit(m, "r3")  # a gets a second
    m.handle(Completed(request_id="r1"))  # b has 0 now
    assert where(submit(m, "r4")) == {"r4": "b"}


def test_ties_go_round_robin_in_join_order():
    m = machine("a", "b", "c")
    seen = []
    for i in range(7):
        seen += where(submit(m, f"r{i}")).values()
        m.handle(Completed(request_id=f"r{i}"))
    assert seen == ["a", "b", "c", "a", "b", "c", "a"]


def test_a_freed_slot_takes_the_head_of_the_queue_at_once():
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0")
    submit(m, "r1")
    submit(m, "r2")
    assert m.handle(Completed(request_id="r0")) == [Dispatch(request_id="r1", deployment=D, replica_id="a", attempt=0)]
    assert m.queued(D) == ("r2",)


def test_a_new_serving_replica_takes_queued_work_at_once():
    m = machine("a", max_ongoing_requests=1)
    for i in range(3):
        submit(m, f"r{i}")
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="b", membership="serving"))
    assert where(out) == {"r1": "b"}


# -------------------------------------------------------------- back-pressure


def test_overloaded_at_once_when_the_queue_is_full():
    m = machine("a", max_ongoing_requests=1, max_queued_requests=2)
    for i in range(3):
        submit(m, f"r{i}")
    (a,) = submit(m, "r3")
    assert isinstance(a, Rejected) and a.reason == "overloaded" and "max_queued_requests=2" in a.detail
    assert m.counters(D).rejected["overloaded"] == 1 and m.queued(D) == ("r1", "r2")


def test_max_queued_zero_never_queues():
    m = machine("a", max_ongoing_requests=1, max_queued_requests=0)
    assert where(submit(m, "r0")) == {"r0": "a"}
    assert submit(m, "r1")[0].reason == "overloaded"


def test_no_replica_and_none_coming_is_unavailable():
    m = machine()
    (a,) = submit(m, "r0")
    assert isinstance(a, Rejected) and a.reason == "unavailable"


def test_none_serving_but_coming_waits_loading_then_runs():
    m = machine(coming=True)
    assert submit(m, "r0") == [] and submit(m, "r1") == []
    s = m.status("r1")
    assert (s.state, s.position) == ("loading", 1)
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="serving"))
    assert where(out) == {"r0": "a", "r1": "a"}


def test_coming_withdrawn_rejects_every_waiting_request():
    m = machine(coming=True)
    submit(m, "r0")
    submit(m, "r1")
    out = m.handle(rc.PoolComing(deployment=D, coming=False))
    assert [(a.request_id, a.reason) for a in out] == [("r0", "unavailable"), ("r1", "unavailable")]
    no_loss(m)


def test_the_last_replica_gone_with_none_coming_fails_every_waiting_caller():
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0")  # dispatched, not started
    submit(m, "r1")  # queued
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
    assert [(type(a), a.request_id, a.reason) for a in out] == [(Rejected, "r0", "unavailable"),
                                                                (Rejected, "r1", "unavailable")]
    assert m.counters(D).rejected["unavailable"] == 2
    no_loss(m)


# ---------------------------------------------------------------- draining, gone


def test_a_draining_replica_finishes_what_it_holds_and_gets_nothing_new():
    m = machine("a", "b", max_ongoing_requests=1)
    submit(m, "r0")  # a
    submit(m, "r1")  # b
    m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="draining"))
    submit(m, "r2")
    assert m.handle(Completed(request_id="r0")) == []  # a's slot frees, a takes nothing
    assert m.queued(D) == ("r2",)
    assert where(m.handle(Completed(request_id="r1"))) == {"r2": "b"}


def test_gone_never_started_go_back_to_the_head_in_order_attempt_unchanged():
    m = machine("a", "b", max_ongoing_requests=2)
    for i in range(6):
        submit(m, f"r{i}")  # a: r0 r2, b: r1 r3; queued r4 r5
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
    assert out == []
    assert m.queued(D) == ("r0", "r2", "r4", "r5")
    assert (m.status("r0").attempt, m.status("r0").position) == (0, 0)
    assert [a.request_id for a in m.handle(Completed(request_id="r1"))] == ["r0"]
    no_loss(m)


def test_requests_put_back_keep_submission_order_across_replicas():
    m = machine("a", "b", "c", max_ongoing_requests=2)
    for i in range(8):
        submit(m, f"r{i}")  # a r0 r3, b r1 r4, c r2 r5; queued r6 r7
    m.handle(rc.PoolChanged(deployment=D, replica_id="b", membership="gone"))
    m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
    assert m.queued(D) == ("r0", "r1", "r3", "r4", "r6", "r7")


def test_started_idempotent_is_retried_until_retries_are_used_up():
    m = machine("a", coming=True, max_ongoing_requests=1, max_retries=2)
    assert where(submit(m, "r0", idempotent=True)) == {"r0": "a"}
    for attempt, (old, new) in enumerate([("a", "b"), ("b", "c")], 1):
        m.handle(Started(request_id="r0"))
        assert m.handle(rc.PoolChanged(deployment=D, replica_id=old, membership="gone")) == []
        assert m.status("r0").attempt == attempt and m.status("r0").state == "loading"
        out = m.handle(rc.PoolChanged(deployment=D, replica_id=new, membership="serving"))
        assert out == [Dispatch(request_id="r0", deployment=D, replica_id=new, attempt=attempt)]
    m.handle(Started(request_id="r0"))
    (f,) = m.handle(rc.PoolChanged(deployment=D, replica_id="c", membership="gone"))
    assert isinstance(f, Failed) and f.reason == "replica_died" and f.replica_id == "c"
    assert "retries used up: 2" in f.detail
    c = m.counters(D)
    assert (c.retried, c.failed, c.lost) == (2, 1, 0)


def test_started_not_idempotent_fails_naming_the_replica():
    m = machine("a", "b")
    submit(m, "r0")
    m.handle(Started(request_id="r0"))
    (f,) = m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
    assert f == Failed(request_id="r0", reason="replica_died", replica_id="a", detail=f.detail)
    assert "'a'" in f.detail and "not idempotent" in f.detail
    assert m.status("r0").state == "failed"


def test_a_started_stream_fails_even_when_idempotent():
    m = machine("a", "b")
    submit(m, "r0", idempotent=True, stream=True)
    m.handle(Started(request_id="r0"))
    (f,) = m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
    assert isinstance(f, Failed) and "stream" in f.detail


def test_a_stream_never_started_runs_elsewhere():
    m = machine("a", "b", max_ongoing_requests=1)
    submit(m, "r0", stream=True)
    submit(m, "r1")
    m.handle(Completed(request_id="r1"))
    assert where(m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))) == {"r0": "b"}


def test_without_started_reports_a_dispatched_request_counts_as_started():
    m = machine("a", "b", reports_started=False, coming=True)
    submit(m, "r0")
    submit(m, "r1", idempotent=True)  # b
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
    assert [type(a) for a in out] == [Failed]
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="b", membership="gone"))
    assert out == [] and m.status("r1").attempt == 1 and m.counters(D).retried == 1


def test_a_request_that_reports_its_start_is_queued_again_if_its_replica_dies_before():
    """``Submit.reports_started`` (a Ray progress call): its own start is told, whatever the machine's
    default: dead before ``Started``, it never ran and goes to another replica; dead after, it fails
    (not idempotent) as any started request."""
    m = machine("a", "b", reports_started=False, max_ongoing_requests=1)
    assert where(submit(m, "r0", reports_started=True)) == {"r0": "a"}
    assert where(submit(m, "r1")) == {"r1": "b"}  # a plain one: counts as started once dispatched
    assert submit(m, "r2", reports_started=True) == []  # queued behind them
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="gone"))
    assert where(out) == {} and not [a for a in out if isinstance(a, Failed)]
    assert [r for r in m.queued(D)] == ["r0", "r2"] and m.status("r0").attempt == 0  # at the head, again
    m.handle(rc.PoolChanged(deployment=D, replica_id="c", membership="serving"))
    assert m.status("r0").state == "dispatched" and m.status("r0").replica_id == "c"
    m.handle(Started(request_id="r0", replica_id="c"))
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="c", membership="gone"))
    assert [(type(a), a.request_id) for a in out if isinstance(a, Failed)] == [(Failed, "r0")]  # it had started
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="b", membership="gone"))
    assert [(type(a), a.request_id) for a in out if isinstance(a, Failed)] == [(Failed, "r1")]
    no_loss(m)


def test_pool_reset_unlisted_replicas_are_gone_listed_take_their_membership():
    m = machine("a", "b", "c")
    submit(m, "r0")  # a
    submit(m, "r1")  # b
    m.handle(Started(request_id="r1"))
    out = m.handle(rc.PoolReset(deployment=D, serving=("c", "d"), draining=("a",), coming=True))
    assert [(type(a), a.request_id) for a in out] == [(Failed, "r1")]
    assert [(v.replica_id, v.membership, v.in_flight) for v in m.pool(D)] == [
        ("a", "draining", 1), ("c", "serving", 0), ("d", "serving", 0)]
    assert m.coming(D)
    assert where(submit(m, "r2")) == {"r2": "c"}


# --------------------------------------------------------------- not delivered


def test_not_delivered_goes_back_to_the_head_and_the_replica_is_left_out_until_named():
    m = machine("a", "b", max_ongoing_requests=1)
    submit(m, "r0")  # a
    submit(m, "r1")  # b
    submit(m, "r2")  # queued
    assert m.handle(NotDelivered(request_id="r0")) == []  # a is excluded: r0 waits at the head
    assert m.queued(D) == ("r0", "r2") and m.status("r0").attempt == 0
    assert [v.excluded for v in m.pool(D)] == [True, False]
    assert where(m.handle(Completed(request_id="r1"))) == {"r0": "b"}
    out = m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="serving"))
    assert where(out) == {"r2": "a"}


# ----------------------------------------------------------------- cancel


def test_cancel_queued_ends_it_at_once():
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0")
    submit(m, "r1")
    assert m.handle(Cancel(request_id="r1")) == [Rejected(request_id="r1", reason="cancelled",
                                                          detail="the caller cancelled it")]
    c = m.counters(D)
    assert (c.cancelled, c.rejected_total, c.in_queue, c.lost) == (1, 0, 0, 0)
    assert m.status("r1").state == "cancelled"


def test_cancel_dispatched_tells_the_replica_and_its_late_answer_is_ignored():
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0")
    submit(m, "r1")
    assert m.handle(Cancel(request_id="r0")) == [CancelOnReplica(request_id="r0", replica_id="a")]
    assert m.status("r0").state == "cancelled"
    assert m.pool(D)[0].in_flight == 1 and m.queued(D) == ("r1",)  # the slot is held until a answers
    assert where(m.handle(Completed(request_id="r0"))) == {"r1": "a"}
    c = m.counters(D)
    assert (c.cancelled, c.answered, c.late, c.lost) == (1, 0, 1, 0)
    assert m.handle(Cancel(request_id="r0")) == [] and m.counters(D).late == 2


def test_an_event_naming_another_replica_is_stale():
    m = machine("a", "b", max_ongoing_requests=1)
    submit(m, "r0")
    m.handle(NotDelivered(request_id="r0", replica_id="a"))  # then dispatched to b
    assert m.status("r0").replica_id == "b"
    assert m.handle(Completed(request_id="r0", replica_id="a")) == []
    assert m.status("r0").state == "dispatched" and m.counters(D).late == 1


# ------------------------------------------------------------------ deadlines


def test_deadlines_end_queued_and_dispatched_requests():
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0", deadline=5.0)
    submit(m, "r1", deadline=3.0)
    submit(m, "r2", deadline=9.0)
    assert m.handle(Tick(now=2.0)) == []
    assert m.handle(Tick(now=5.0)) == [
        Rejected(request_id="r1", reason="timeout", detail="its deadline 3.0 passed (now 5.0)"),
        Failed(request_id="r0", reason="timeout", replica_id="a",
               detail="its deadline 5.0 passed on replica 'a' (now 5.0)"),
        CancelOnReplica(request_id="r0", replica_id="a")]
    c = m.counters(D)
    assert (c.rejected["timeout"], c.failed, c.in_queue, c.lost) == (1, 1, 1, 0)


def test_a_deadline_already_past_is_rejected_at_once():
    m = machine("a")
    m.handle(Tick(now=10.0))
    assert submit(m, "r0", deadline=10.0)[0].reason == "timeout"


def test_the_cores_tick_is_taken_too():
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0")
    submit(m, "r1", deadline=1.0)
    assert [a.reason for a in m.handle(rc.Tick(now=1.0))] == ["timeout"]  # type: ignore[union-attr]


def test_a_retried_request_that_times_out_in_the_queue_fails_naming_its_replica():
    m = machine("a", max_ongoing_requests=1)
    submit(m, "r0", idempotent=True, deadline=5.0)
    m.handle(Started(request_id="r0"))
    m.handle(rc.PoolReset(deployment=D, serving=(), draining=(), coming=True))
    (f,) = m.handle(Tick(now=6.0))
    assert isinstance(f, Failed) and (f.reason, f.replica_id) == ("timeout", "a")


# ----------------------------------------------------------------- answers


def test_an_application_error_is_an_answer_never_retried():
    m = machine("a", "b")
    submit(m, "r0", idempotent=True)
    assert m.handle(Completed(request_id="r0", ok=False)) == []
    c = m.counters(D)
    assert (c.app_errors, c.answered, c.retried, c.failed) == (1, 0, 0, 0)
    s = m.status("r0")
    assert (s.state, s.reason) == ("failed", "app_error")


# ----------------------------------------------------------------- reconfigure


def test_reconfigure_applies_from_now_on():
    m = machine("a", max_ongoing_requests=1)
    for i in range(4):
        submit(m, f"r{i}")
    assert where(m.handle(Configure(deployment=D, max_ongoing_requests=3))) == {"r1": "a", "r2": "a"}
    assert m.handle(Configure(deployment=D, max_ongoing_requests=1, max_queued_requests=0)) == []
    assert m.pool(D)[0].in_flight == 3 and m.queued(D) == ("r3",)  # nothing ejected
    assert submit(m, "r4")[0].reason == "overloaded"
    assert m.handle(Completed(request_id="r0")) == []  # still 2 held > 1
    m.handle(Completed(request_id="r1"))
    assert where(m.handle(Completed(request_id="r2"))) == {"r3": "a"}


# --------------------------------------------------------------- status, memory


def test_status_through_a_requests_life():
    m = machine("a", max_ongoing_requests=1, reports_started=True)
    submit(m, "r0")
    submit(m, "r1")
    assert (m.status("r1").state, m.status("r1").position) == ("queued", 0)
    assert (m.status("r0").state, m.status("r0").replica_id, m.status("r0").position) == ("dispatched", "a", None)
    m.handle(Started(request_id="r0"))
    assert m.status("r0").state == "running"
    m.handle(Completed(request_id="r0"))
    assert (m.status("r0").state, m.status("r0").replica_id) == ("done", "a")
    assert m.status("never") is None


def test_positions_stay_exact_through_cancels_and_compaction():
    m = machine("a", max_ongoing_requests=1)
    submit(m, "head")
    ids = [f"q{i}" for i in range(300)]
    for rid in ids:
        submit(m, rid)
    for rid in dict.fromkeys(ids[::3] + ids[1::7]):
        m.handle(Cancel(request_id=rid))
    queued = m.queued(D)
    assert len(queued) == 300 - len(set(ids[::3] + ids[1::7]))
    assert [m.status(r).position for r in queued] == list(range(len(queued)))
    running = "head"
    for _ in range(120):  # dispatch past the holes: the queue compacts
        (d,) = m.handle(Completed(request_id=running))
        running = d.request_id
    rest = m.queued(D)
    assert rest == queued[120:]
    assert [m.status(r).position for r in rest] == list(range(len(rest)))
    assert len(m._deps[D].queue.main) < 300  # compacted
    no_loss(m)


def test_ended_requests_are_forgotten_past_the_memory():
    m = RequestMachine(remember_ended=3)
    m.handle(Configure(deployment=D))
    m.handle(rc.PoolChanged(deployment=D, replica_id="a", membership="serving"))
    for i in range(10):
        m.handle(Submit(request_id=f"r{i}", deployment=D))
        m.handle(Completed(request_id=f"r{i}"))
    assert [m.status(f"r{i}") is None for i in range(10)] == [True] * 7 + [False] * 3
    assert len(m._requests) == 0 and len(m._recent) == 3
    with pytest.raises(rc.InvalidEvent, match="unknown request id"):
        m.handle(Completed(request_id="r0"))
    with pytest.raises(rc.InvalidConfig, match="remember_ended"):
        RequestMachine(remember_ended=-1)


def test_counters_per_deployment_and_in_all():
    m = machine("a")
    m.handle(Configure(deployment="emb"))
    m.handle(rc.PoolChanged(deployment="emb", replica_id="e", membership="serving"))
    submit(m, "r0")
    m.handle(Submit(request_id="e0", deployment="emb"))
    m.handle(Submit(request_id="z0", deployment="zzz"))
    m.handle(Completed(request_id="e0"))
    assert (m.counters(D).submitted, m.counters("emb").answered, m.counters().submitted) == (1, 1, 3)
    assert m.counters().in_flight == 1 and m.counters().lost == 0
    with pytest.raises(rc.UnknownDeployment):
        m.counters("zzz")


def test_the_deadline_heap_drops_entries_of_ended_requests():
    m = machine("a", max_ongoing_requests=1000)
    for i in range(500):
        submit(m, f"r{i}", deadline=100.0)
        m.handle(Completed(request_id=f"r{i}"))
    submit(m, "last", deadline=50.0)
    assert len(m._deadlines) == 501
    m.handle(Tick(now=1.0))
    assert [e[2] for e in m._deadlines] == ["last"]
    assert [a.request_id for a in m.handle(Tick(now=50.0)) if isinstance(a, Failed)] == ["last"]


SCRIPT = r"""
import rankcore as rc
from rankcore.requests import *
m = RequestMachine(reports_started=True)
out = []
def go(ev):
    out.extend(m.handle(ev))
go(Configure(deployment="llm", max_ongoing_requests=2, max_queued_requests=6))
go(rc.PoolReset(deployment="llm", serving=("c", "a", "b"), draining=("d",), coming=True))
for i in range(9):
    go(Submit(request_id=f"r{i}", deployment="llm", idempotent=i % 2 == 0, deadline=float(i)))
go(Started(request_id="r0")); go(Started(request_id="r1"))
go(rc.PoolReset(deployment="llm", serving=("b", "e"), draining=("a",), coming=False))
go(Tick(now=4.0))
print(repr(out)); print(m.counters()); print(m.pool("llm"))
"""


def test_same_events_same_actions_across_processes():
    """String hashes differ between processes; actions must not."""
    import os
    import subprocess
    import sys

    outs = [subprocess.run([sys.executable, "-c", SCRIPT], env=dict(os.environ, PYTHONHASHSEED=seed),
                           capture_output=True, text=True, check=True).stdout for seed in ("0", "1", "4242")]
    assert outs[0] == outs[1] == outs[2]
    assert "Dispatch" in outs[0] and "Failed" in outs[0]

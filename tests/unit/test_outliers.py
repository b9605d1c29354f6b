"""A replica silent while its peers answer gets no new request until it speaks again
(rankcore/requests/outliers.py, judged by the request machine at each Tick; issue 65)."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.requests import Completed, Configure, Dispatch, RequestMachine, Started, Submit, Tick
from rankcore.requests.outliers import QUIET_AFTER_S, quiet

D = "llm"


@pytest.mark.parametrize(("now", "oldest", "heard", "peers", "want"), [
    (10.0, 4.0, None, 9.0, True),      # silent 6 s, a peer answered 1 s ago
    (10.0, 4.0, 3.0, 9.0, True),       # it last spoke before its oldest call was sent
    (10.0, 6.0, None, 9.0, False),     # its oldest call is only 4 s old
    (10.0, 4.0, 7.0, 9.0, False),      # it spoke 3 s ago
    (10.0, 4.0, None, 4.5, False),     # the peers are silent too (5.5 s): the whole deployment is slow
    (10.0, 4.0, None, 3.0, False),     # no peer spoke since its oldest call was sent
    (10.0, None, None, 9.0, False),    # it holds nothing silent
    (10.0, 4.0, None, None, False),    # nobody ever answered
])
def test_the_rule(now, oldest, heard, peers, want):
    assert quiet(now, oldest, heard, peers, 5.0) is want


def _machine(quiet_after_s: float | None = QUIET_AFTER_S) -> RequestMachine:
    m = RequestMachine(quiet_after_s=quiet_after_s)
    m.handle(Tick(now=0.0))
    m.handle(Configure(deployment=D, max_ongoing_requests=2))
    for r in ("a", "b"):
        m.handle(rc.PoolChanged(deployment=D, replica_id=r, membership="serving"))
    return m


def _send(m: RequestMachine, rid: str) -> str | None:
    got = [a for a in m.handle(Submit(request_id=rid, deployment=D)) if isinstance(a, Dispatch)]
    return got[0].replica_id if got else None


def _views(m: RequestMachine) -> dict:
    return {v.replica_id: v for v in m.pool(D)}


def test_a_frozen_replica_is_left_out_while_its_peer_answers_and_back_once_it_answers():
    m = _machine()
    assert (_send(m, "x"), _send(m, "y")) == ("a", "b")  # (least loaded, round-robin)
    m.handle(Tick(now=1.0))
    m.handle(Completed(request_id="y", ok=True, replica_id="b"))
    m.handle(Tick(now=4.9))
    assert not _views(m)["a"].quiet  # (x sent 4.9 s ago: not yet)
    m.handle(Tick(now=5.5))  # x silent 5.5 s, a never spoke, b spoke 4.5 s ago
    assert _views(m)["a"].quiet and not _views(m)["b"].quiet
    assert (_send(m, "q1"), _send(m, "q2")) == ("b", "b")  # (a holds fewer, and gets nothing)
    assert _send(m, "q3") is None and m.queued(D) == ("q3",)  # (b full: it waits rather than go to a)
    m.handle(Tick(now=6.0))
    out = m.handle(Completed(request_id="x", ok=True, replica_id="a"))  # it thawed: it answered
    assert not _views(m)["a"].quiet
    assert [(a.request_id, a.replica_id) for a in out if isinstance(a, Dispatch)] == [("q3", "a")]
    assert m.counters(D).lost == 0


def test_a_start_is_a_sign_of_life():
    m = _machine()
    assert (_send(m, "x"), _send(m, "y")) == ("a", "b")
    m.handle(Tick(now=1.0))
    m.handle(Completed(request_id="y", ok=True, replica_id="b"))
    m.handle(Tick(now=5.5))
    assert _views(m)["a"].quiet
    assert (_send(m, "q1"), _send(m, "q2"), _send(m, "q3")) == ("b", "b", None)
    out = m.handle(Started(request_id="x", replica_id="a"))  # (a stream's first item, a progress marker)
    assert not _views(m)["a"].quiet
    assert [(a.request_id, a.replica_id) for a in out if isinstance(a, Dispatch)] == [("q3", "a")]
    m.handle(Tick(now=20.0))  # x runs on (started: alive), b silent too: nobody is quiet
    assert not any(v.quiet for v in m.pool(D))


def test_when_every_replica_is_slow_none_is_quiet():
    m = _machine()
    _send(m, "x")
    _send(m, "y")
    m.handle(Tick(now=1.0))
    m.handle(Completed(request_id="y", ok=True, replica_id="b"))
    _send(m, "y2")
    m.handle(Tick(now=30.0))  # both silent 29 s: the deployment is slow, not one replica
    assert not any(v.quiet for v in m.pool(D))


def test_none_turns_the_rule_off_and_a_bad_value_is_refused_naming_it():
    m = _machine(quiet_after_s=None)
    _send(m, "x")
    _send(m, "y")
    for t in (1.0, 2.0, 9.0):
        m.handle(Tick(now=t))
    m.handle(Completed(request_id="y", ok=True, replica_id="b"))
    m.handle(Tick(now=20.0))
    assert not any(v.quiet for v in m.pool(D))
    for bad in (0, -1.0, "5", float("inf"), float("nan"), True):
        with pytest.raises(rc.InvalidConfig, match="quiet_after_s"):
            RequestMachine(quiet_after_s=bad)  # type: ignore[arg-type]

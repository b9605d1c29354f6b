"""Tests added for mutmut's survivors in the rule modules (issue 36, `make mutate`;
docs/testing.md names each survivor and what killed it, or why it is equivalent).

Each test states a behaviour the module promises (its docstring, a caller's
need), not a mutant's text.
"""

from __future__ import annotations

import pytest

from rankcore.base.errors import InvariantViolation
from rankcore.requests.queue import FRONT, RequestQueue

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

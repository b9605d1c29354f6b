"""One deployment's request queue for ``rankcore.requests``: FIFO by
submission, with requests put back at the head, removal from the middle and
each request's position, all O(log n) (amortised).

Internal module: ``rankcore.requests`` uses it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Generic, Protocol, TypeVar

from ..base.errors import InvariantViolation

__all__ = ["RequestQueue", "Queued", "FRONT"]

#: ``Queued.slot`` of a request put back at the head
FRONT = -1


class Queued(Protocol):
    """What the queue needs of a request: its id, its submission number, and a
    slot the queue keeps (None while not queued)."""

    rid: str
    seq: int
    slot: int | None


Q = TypeVar("Q", bound=Queued)


class RequestQueue(Generic[Q]):
    """One deployment's FIFO queue, ordered by submission.

    Fresh requests are appended to ``main`` (a list with a moving head ``lo``;
    a request removed from the middle leaves a ``None`` whose index goes into
    the sorted ``dead``); requests put back (never started, or retried) go to
    ``front``, kept sorted by submission. Every request put back is older than
    every fresh one still queued (dispatch always takes the head), so the
    queue is ``front`` then ``main``, in submission order. A request's
    position is O(log n): its index less the holes before it. Garbage is
    compacted once it outgrows the live requests (amortised O(1))."""

    __slots__ = ("front", "main", "lo", "dead", "live_main", "n")

    def __init__(self) -> None:
        self.front: list[tuple[int, Q]] = []  # (-seq, request): the head (oldest) is last
        self.main: list[Q | None] = []
        self.lo = 0
        self.dead: list[int] = []
        self.live_main = 0
        self.n = 0  # queued requests

    def __len__(self) -> int:
        return self.n

    def push(self, req: Q) -> None:
        req.slot = len(self.main)
        self.main.append(req)
        self.live_main += 1
        self.n += 1

    def put_back(self, req: Q) -> None:
        req.slot = FRONT
        insort(self.front, (-req.seq, req))
        self.n += 1

    def pop(self) -> Q:
        """The head (the queue is not empty)."""
        self.n -= 1
        if self.front:
            req = self.front.pop()[1]
        else:
            main, lo = self.main, self.lo
            while main[lo] is None:
                lo += 1
            req = main[lo]  # type: ignore[assignment]
            main[lo] = None
            self.lo = lo + 1
            self.live_main -= 1
            self._tidy()
        req.slot = None
        return req

    def remove(self, req: Q) -> None:
        self.n -= 1
        if req.slot == FRONT:
            del self.front[bisect_left(self.front, (-req.seq,))]
        else:
            slot = req.slot
            if slot is None:
                raise InvariantViolation(f"request {req.rid!r} is not queued")
            self.main[slot] = None
            insort(self.dead, slot)
            self.live_main -= 1
            self._tidy()
        req.slot = None

    def position(self, req: Q) -> int:
        if req.slot == FRONT:
            return len(self.front) - 1 - bisect_left(self.front, (-req.seq,))
        slot = req.slot if req.slot is not None else 0
        holes = bisect_left(self.dead, slot) - bisect_left(self.dead, self.lo)
        return len(self.front) + slot - self.lo - holes

    def in_order(self) -> list[Q]:
        """Head first (for tests and a status page: O(n))."""
        return [r for _, r in reversed(self.front)] + [r for r in self.main[self.lo:] if r is not None]

    def _tidy(self) -> None:
        main = self.main
        if not self.live_main:
            if main:
                self.main, self.lo, self.dead = [], 0, []
        elif len(main) - self.live_main > self.live_main + 32:
            kept = [r for r in main[self.lo:] if r is not None]
            for i, r in enumerate(kept):
                r.slot = i
            self.main, self.lo, self.dead = kept, 0, []  # type: ignore[assignment]

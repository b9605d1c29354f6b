"""The batcher under random events (rankcore/requests/batcher.py, issue 39).

Random Enqueue (sizes, model ids, some duplicate ids), Tick, Cancel (of waiting, running and
unknown requests), BatchDone (of running and of unknown batches), SetBatchOptions; time only
moves forward. After every step:

* every request accepted is in exactly one batch that runs, unless it was cancelled while it
  waited, and never in a batch after its cancellation; a refused one never runs;
* no batch is bigger than its bound (the sizes of its requests, the bound of its moment);
* each batch runs whole, as a batch of our own (a model of the rule) says: the requests that
  joined it and were not cancelled, its bound and its start; a request is refused exactly when it
  fits neither the forming batch nor, alone, the bound of the moment;
* a batch closes ("full") at the very step its requests reach its bound, or at the step a request
  that does not fit begins the next one, never later by its timeout; a full batch waits only while
  every slot is busy;
* batches run in the order they began, each part in arrival order, one model id a part;
* no more than ``max_concurrent_batches`` run at once;
* while a slot is free, no request waits past its batch's timeout: a batch whose timeout has
  passed closed at the step that passed it, and runs with that step's time (``next_deadline`` is
  ahead of the clock);
* at the end, with time moved past every timeout and every batch done, nothing waits; and the
  same events replayed on a fresh batcher give the same actions.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import rankcore as rc
from rankcore.requests import Cancel, Tick
from rankcore.requests.batcher import (
    BatchDone,
    Batcher,
    BatchOptions,
    Enqueue,
    Refused,
    RunBatch,
    SetBatchOptions,
)

MODELS = ("", "a", "b")


class Ours:
    """A batch as the rule makes it, worked out apart from the batcher: the requests that joined it
    (and are not cancelled), its bound and start; ``closed``: when it filled (None: forming)."""

    def __init__(self, began: float, bound: int) -> None:
        self.sizes: dict[str, int] = {}
        self.began = began
        self.bound = bound
        self.closed: float | None = None

    @property
    def size(self) -> int:
        return sum(self.sizes.values())


OPTIONS = st.builds(BatchOptions, max_batch_size=st.integers(1, 6),
                    batch_wait_timeout_s=st.sampled_from([0.0, 0.01, 0.05, 0.5]),
                    max_concurrent_batches=st.integers(1, 3))


class BatcherProps(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.b = Batcher(BatchOptions(max_batch_size=4, batch_wait_timeout_s=0.05, max_concurrent_batches=2))
        self.log: list[tuple[Any, Any]] = []
        self.now = 0.0
        self.n = 0
        self.order: dict[str, int] = {}  # arrival order of accepted requests
        self.waiting: set[str] = set()
        self.cancelled: set[str] = set()
        self.ran: dict[str, int] = {}  # request -> batch
        self.running: dict[int, RunBatch] = {}
        self.last_batch = -1
        self.refused: set[str] = set()
        self.model: dict[str, str] = {}
        self.size: dict[str, int] = {}
        self.forming: Ours | None = None
        self.full: list[Ours] = []  # closed full, not run yet, in order
        self.batch_of: dict[str, Ours] = {}  # a waiting request -> its batch

    def _do(self, ev: Any) -> list[Any]:
        try:
            out = self.b.handle(ev)
        except rc.InvalidEvent as exc:
            self.log.append((ev, type(exc)))
            raise
        self.log.append((ev, out))
        for act in out:
            if isinstance(act, Refused):
                assert act.request_id not in self.ran and act.request_id not in self.refused
                self.refused.add(act.request_id)
            else:
                assert isinstance(act, RunBatch)
                assert act.batch_id > self.last_batch, "batches run in the order they began"
                self.last_batch = act.batch_id
                assert 0 < act.size <= act.max_batch_size
                assert act.began <= act.closed <= self.now
                seen: list[str] = []
                for part in act.parts:
                    assert part.request_ids and len({self.model[r] for r in part.request_ids}) == 1
                    assert self.model[part.request_ids[0]] == part.model_id
                    assert [self.order[r] for r in part.request_ids] == sorted(self.order[r] for r in part.request_ids)
                    seen += part.request_ids
                assert len(seen) == len(set(seen))
                assert len({p.model_id for p in act.parts}) == len(act.parts)
                assert sum(self.size[r] for r in seen) == act.size
                self._ours_ran(act, seen)
                for r in seen:
                    assert r in self.waiting, f"{r} ran but was not waiting (cancelled: {r in self.cancelled})"
                    assert r not in self.ran
                    self.waiting.discard(r)
                    self.ran[r] = act.batch_id
                self.running[act.batch_id] = act
        assert len(self.running) <= self.b.options.max_concurrent_batches or isinstance(ev, SetBatchOptions) \
            or self.shrunk
        return out

    def _ours_ran(self, act: RunBatch, seen: list[str]) -> None:
        ours = self.batch_of[seen[0]]
        assert set(seen) == set(ours.sizes), "a batch runs whole: the requests that joined it, no other"
        assert (act.max_batch_size, act.began) == (ours.bound, ours.began), \
            "a batch's bound and start are those of the moment it began"
        if ours.closed is None:  # still forming: only its timeout closes it, at this step
            assert ours is self.forming
            assert (act.reason, act.closed) == ("timeout", self.now)
            self.forming = None
        else:
            assert self.full[0] is ours, "closed batches run in order"
            assert (act.reason, act.closed) == ("full", ours.closed), \
                f"a batch that filled at {ours.closed} closed at {act.closed} ({act.reason})"
            self.full.pop(0)
        for r in seen:
            del self.batch_of[r]

    def _ours_closes(self, ours: Ours) -> None:
        """Full: it closes now (and runs now if a slot is free; ``a_full_batch_waits_only_for_a_slot``)."""
        ours.closed = self.now
        self.full.append(ours)
        self.forming = None

    shrunk = False

    @rule(size=st.integers(1, 7), model=st.sampled_from(MODELS), dt=st.sampled_from([0.0, 0.0, 0.004, 0.02]),
          again=st.booleans())
    def enqueue(self, size: int, model: str, dt: float, again: bool) -> None:
        if again and self.waiting:
            rid = sorted(self.waiting)[0]
            try:
                self._do(Enqueue(request_id=rid, now=self.now + dt, size=size, model_id=model))
            except rc.InvalidEvent:
                return  # (refused whole: its clock not taken either)
            raise AssertionError("a waiting request's id was taken twice")
        self.now += dt
        rid = f"r{self.n}"
        self.n += 1
        self.model[rid] = model
        self.size[rid] = size
        ours = self.forming
        fits = ours is not None and ours.size + size <= ours.bound
        refuse = not fits and size > self.b.options.max_batch_size  # (the forming batch stays open)
        if not refuse:  # (before: a request that fills its batch runs in this step)
            self.order[rid] = len(self.order)
            self.waiting.add(rid)
            if not fits:
                if ours is not None:
                    self._ours_closes(ours)  # it cannot take this request: full
                ours = self.forming = Ours(self.now, self.b.options.max_batch_size)
            assert ours is not None
            ours.sizes[rid] = size
            self.batch_of[rid] = ours
            if ours.size >= ours.bound:
                self._ours_closes(ours)
        out = self._do(Enqueue(request_id=rid, now=self.now, size=size, model_id=model))
        assert any(isinstance(a, Refused) and a.request_id == rid for a in out) == refuse

    @rule(dt=st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.3, 1.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._do(Tick(now=self.now))

    @rule(pick=st.integers(0, 1000), which=st.sampled_from(["waiting", "ran", "unknown"]))
    def cancel(self, pick: int, which: str) -> None:
        pool = sorted(self.waiting) if which == "waiting" else sorted(self.ran) if which == "ran" else ["nope"]
        if not pool:
            return
        rid = pool[pick % len(pool)]
        before = self.b.waiting
        if which == "waiting":
            ours = self.batch_of.pop(rid)
            del ours.sizes[rid]  # (its room is free again)
            if not ours.sizes:  # an empty batch is gone
                if ours is self.forming:
                    self.forming = None
                else:
                    self.full.remove(ours)
        self._do(Cancel(request_id=rid))
        if which == "waiting":
            self.waiting.discard(rid)
            self.cancelled.add(rid)
            assert self.b.waiting == before - 1
        else:
            assert self.b.waiting == before

    @rule(pick=st.integers(0, 1000), dt=st.sampled_from([0.0, 0.01, 0.1]), bogus=st.booleans())
    def done(self, pick: int, dt: float, bogus: bool) -> None:
        if bogus or not self.running:
            try:
                self._do(BatchDone(batch_id=10_000 + pick, now=self.now + dt))
            except rc.InvalidEvent:
                return  # (refused whole: its clock not taken either)
            raise AssertionError("BatchDone of a batch not running was taken")
        self.now += dt
        bid = sorted(self.running)[pick % len(self.running)]
        del self.running[bid]
        self._do(BatchDone(batch_id=bid, now=self.now))

    @rule(options=OPTIONS)
    def set_options(self, options: BatchOptions) -> None:
        self.shrunk = self.shrunk or options.max_concurrent_batches < self.b.options.max_concurrent_batches
        self._do(SetBatchOptions(options=options))
        if len(self.running) <= options.max_concurrent_batches:
            self.shrunk = False

    @rule()
    def clock_goes_back(self) -> None:
        if self.now <= 0:
            return
        try:
            self.b.handle(Tick(now=self.now - 0.5))
        except rc.InvalidEvent:
            return
        raise AssertionError("a clock going back was taken")

    @invariant()
    def counts_agree(self) -> None:
        assert self.b.waiting == len(self.waiting)
        assert self.b.running == len(self.running)
        if len(self.running) <= self.b.options.max_concurrent_batches:
            self.shrunk = False

    @invariant()
    def a_full_batch_waits_only_for_a_slot(self) -> None:
        if self.full:
            assert len(self.running) >= self.b.options.max_concurrent_batches, \
                f"a batch that filled at {self.full[0].closed} waits at {self.now} with a slot free"

    @invariant()
    def no_wait_past_the_timeout_while_a_slot_is_free(self) -> None:
        d = self.b.next_deadline()
        if d is not None:
            assert d > self.now, f"a batch due at {d} still forms at {self.now}"
        if self.b.running < self.b.options.max_concurrent_batches and self.waiting:
            assert d is not None or self.b._waiting, "requests wait with a slot free and no deadline"

    def teardown(self) -> None:
        # drain: every batch done, time past every timeout: nothing accepted and not cancelled is left
        for _ in range(len(self.order) + 5):
            for bid in sorted(self.running):
                del self.running[bid]
                self._do(BatchDone(batch_id=bid, now=self.now))
            self.now += 10.0
            self._do(Tick(now=self.now))
            if not self.waiting and not self.running:
                break
        assert not self.waiting, f"never ran: {sorted(self.waiting)}"
        assert set(self.ran) | self.cancelled == set(self.order)
        assert not set(self.ran) & self.cancelled
        fresh = Batcher(BatchOptions(max_batch_size=4, batch_wait_timeout_s=0.05, max_concurrent_batches=2))
        for ev, out in self.log:
            try:
                got: Any = fresh.handle(ev)
            except rc.InvalidEvent as exc:
                got = type(exc)
            assert got == out, f"replay of {ev!r} gave {got!r}, not {out!r}"


TestBatcher = BatcherProps.TestCase

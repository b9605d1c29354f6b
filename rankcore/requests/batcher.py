"""When a batch closes, as a sans-IO rule (issue 39): requests and time in, "run this batch" out.

Ray Serve's ``@serve.batch`` decides this inside an asyncio task of the replica; here it is a
machine an executor drives (``Batcher.handle(event) -> list[action]``, ``next_deadline()`` for
its one timer), so the replica, the simulator and the property tests share one rule. Options
keep Serve's names and defaults (``BatchOptions``: ``max_batch_size`` 10,
``batch_wait_timeout_s`` 0.01, ``max_concurrent_batches`` 1); item sizes come in as facts
(``Enqueue.size``: what the caller's ``batch_size_fn`` said, else 1).

The rule (docs/requests.md, "Batching"):

* A batch begins with the first request that finds none forming, at that request's time,
  with the options of that moment (a ``SetBatchOptions`` applies from the next batch, as
  Serve's setters do).
* A request joins the forming batch if its size fits; if not, that batch closes ("full") and
  the request begins the next one, so order is kept and no request waits behind one that
  does not fit (Serve sends it to the back of its queue instead). A request bigger than
  ``max_batch_size`` on its own is refused (``Refused``; Serve's message).
* A batch closes when it is full, or once ``batch_wait_timeout_s`` has passed since it began
  *and* one of ``max_concurrent_batches`` is free. While every slot is busy a forming batch
  keeps filling up to its bound instead of queueing small batches behind each other (Serve
  forms batches regardless and queues them for a slot, never merged).
* A closed batch runs when a slot is free, closed batches first, in order (``RunBatch``);
  ``BatchDone`` frees its slot. A full batch that finds no slot waits for one.
* A batch runs split by multiplexed model id (``RunBatch.parts``, each in arrival order; the
  bound holds for the whole, as in Serve), all parts in one slot.
* A cancelled request leaves its batch while it waits (its room is free again); once its batch
  runs, the executor drops its answer.

Deterministic, no clock of its own, O(1) amortised per event but ``Cancel`` of a request in
a waiting batch (O(batch)).

Internal module: import its public names from ``rankcore.requests``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Union, cast

import attrs

from ..base import fields as f
from ..base.errors import InvalidConfig, InvalidEvent
from .records import Cancel, Tick, _clock

__all__ = [
    "BatchOptions", "Enqueue", "BatchDone", "SetBatchOptions", "RunBatch", "BatchPart", "Refused", "Batcher",
    "BatchEvent", "BatchAction", "MAX_BATCH_SIZE", "BATCH_WAIT_TIMEOUT_S", "MAX_CONCURRENT_BATCHES",
    "TOO_BIG",
]

#: Ray Serve's defaults (ray/serve/batching.py, ``batch``)
MAX_BATCH_SIZE = 10
BATCH_WAIT_TIMEOUT_S = 0.01
MAX_CONCURRENT_BATCHES = 1
#: Serve's words for an item bigger than the bound on its own (``Refused.detail``)
TOO_BIG = ("Size of item is greater than max_batch_size. Please increase the max_batch_size or check the "
           "implementation of the batch_size_fn.")


def _size(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if type(value) is not int or value < 1:
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be an integer >= 1, got {f.shown(value)}")


@attrs.frozen(kw_only=True)
class BatchOptions:
    """A batched method's options, declared once (the Ray decorator, the simulator's scenario
    key and the docs read them here). Serve's names and defaults."""

    max_batch_size: int = attrs.field(default=MAX_BATCH_SIZE, validator=_size)
    batch_wait_timeout_s: float = attrs.field(default=BATCH_WAIT_TIMEOUT_S, validator=f.seconds)
    max_concurrent_batches: int = attrs.field(default=MAX_CONCURRENT_BATCHES, validator=_size)


# ---------------------------------------------------------------- events (in)


@attrs.frozen(kw_only=True)
class Enqueue:
    """A call of the batched method arrived at ``now``: ``size`` items of the bound (the
    caller's ``batch_size_fn``, else 1), for multiplexed model ``model_id`` ("" none)."""

    request_id: str = attrs.field(validator=f.name)
    now: float = attrs.field(validator=_clock)
    size: int = attrs.field(default=1, validator=_size)
    model_id: str = attrs.field(default="", validator=f.text)


@attrs.frozen(kw_only=True)
class BatchDone:
    """The batch ``batch_id`` ran to its end (every part answered or failed) at ``now``."""

    batch_id: int = attrs.field(validator=f.count)
    now: float = attrs.field(validator=_clock)


@attrs.frozen(kw_only=True)
class SetBatchOptions:
    """A lightweight update (Serve's ``set_max_batch_size`` / ``set_batch_wait_timeout_s``): the
    next batch formed uses these; the forming one keeps its own. A larger
    ``max_concurrent_batches`` frees slots at once."""

    options: BatchOptions = attrs.field()

    @options.validator
    def _check_options(self, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, BatchOptions):
            raise InvalidConfig(f"SetBatchOptions.options must be a BatchOptions, got {f.shown(value)}")


# ---------------------------------------------------------------- actions (out)


@attrs.frozen(kw_only=True)
class BatchPart:
    """The requests of one multiplexed model id in a batch, in arrival order."""

    model_id: str
    request_ids: tuple[str, ...]


@attrs.frozen(kw_only=True)
class RunBatch:
    """Run batch ``batch_id`` now: each part a call of the method with its requests' arguments
    (all parts in one slot). ``began`` / ``closed``: when it began forming and closed;
    ``reason``: "full" or "timeout"; ``max_batch_size``: its bound (the sizes sum to at most it)."""

    batch_id: int
    parts: tuple[BatchPart, ...]
    size: int
    max_batch_size: int
    began: float
    closed: float
    reason: str


@attrs.frozen(kw_only=True)
class Refused:
    """``request_id`` alone is bigger than the bound: it fails (Serve: ``RuntimeError``)."""

    request_id: str
    size: int
    max_batch_size: int
    detail: str = TOO_BIG


BatchEvent = Union[Enqueue, Tick, Cancel, BatchDone, SetBatchOptions]
_EVENTS = (Enqueue, Tick, Cancel, BatchDone, SetBatchOptions)
BatchAction = Union[RunBatch, Refused]


class _Forming:
    __slots__ = ("batch_id", "items", "size", "began", "opts", "closed", "reason")

    def __init__(self, batch_id: int, began: float, opts: BatchOptions) -> None:
        self.batch_id = batch_id
        self.items: dict[str, tuple[int, str]] = {}  # request id -> (size, model id), arrival order
        self.size = 0
        self.began = began
        self.opts = opts
        self.closed: float | None = None
        self.reason = ""


class Batcher:
    """One batched method's batches (in Ray: one per replica and method). Not thread-safe."""

    def __init__(self, options: BatchOptions | None = None) -> None:
        if options is not None and not isinstance(options, BatchOptions):
            raise InvalidConfig(f"Batcher options must be a BatchOptions, got {f.shown(options)}")
        if options is not None:
            f.check_record(options)  # (one unpickled or forged is checked as its constructor checks)
        self.options = options or BatchOptions()
        self._now: float | None = None
        self._forming: _Forming | None = None
        self._waiting: deque[_Forming] = deque()  # closed (full), waiting for a slot, in order
        self._running: set[int] = set()
        self._where: dict[str, _Forming] = {}  # a waiting request -> its batch
        self._next_id = 0
        #: counters: batches run, requests run, refused, cancelled while waiting, closed by reason
        self.batches = self.ran = self.refused = self.cancelled = 0
        self.closed_by = {"full": 0, "timeout": 0}

    # ------------------------------------------------------------------ reads

    @property
    def waiting(self) -> int:
        """Requests in a batch that has not run yet."""
        return len(self._where)

    @property
    def running(self) -> int:
        """Batches running (slots in use)."""
        return len(self._running)

    def next_deadline(self) -> float | None:
        """When the forming batch closes by its timeout if nothing else happens first (the
        executor's one timer: send ``Tick`` then); None: no batch closes by time alone now."""
        b = self._forming
        return b.began + b.opts.batch_wait_timeout_s if b is not None and self._time_may_close() else None

    def _time_may_close(self) -> bool:
        """Time alone may close the forming batch: no closed batch waits and a slot is free."""
        return not self._waiting and len(self._running) < self.options.max_concurrent_batches

    # ------------------------------------------------------------------ events

    def handle(self, event: BatchEvent) -> list[BatchAction]:
        """Take one event; return what to do, in order. Bad input raises ``InvalidEvent``
        naming what was wrong and changes nothing."""
        out: list[BatchAction] = []
        if isinstance(event, _EVENTS):
            try:
                f.check_record(event)  # (built by its constructor, or as if: one unpickled or forged is checked here)
            except InvalidConfig as exc:
                raise InvalidEvent(str(exc)) from exc  # (the batcher's word for bad input)
        if isinstance(event, Enqueue):
            if event.request_id in self._where:
                raise InvalidEvent(f"Enqueue: request id {event.request_id!r} is already waiting in a batch")
            self._clock(event.now, event)
            self._enqueue(event, out)
        elif isinstance(event, Tick):
            self._clock(event.now, event)
        elif isinstance(event, Cancel):
            self._cancel(event.request_id)
        elif isinstance(event, BatchDone):
            if event.batch_id not in self._running:
                raise InvalidEvent(f"BatchDone: batch {f.shown(event.batch_id)} is not running "
                                   f"(running: {sorted(self._running)})")
            self._clock(event.now, event)
            self._running.discard(event.batch_id)
        elif isinstance(event, SetBatchOptions):
            self.options = event.options
        else:
            raise InvalidEvent(f"the batcher takes no {type(event).__name__} (got {f.shown(event)})")
        self._settle(out)
        return out

    def _clock(self, now: float, event: Any) -> None:
        if self._now is not None and now < self._now:
            raise InvalidEvent(f"{type(event).__name__}: the clock went back from {self._now!r} to {now!r}")
        self._now = now

    def _enqueue(self, ev: Enqueue, out: list[BatchAction]) -> None:
        rid = ev.request_id
        b = self._forming
        if b is not None and b.size + ev.size > b.opts.max_batch_size:
            if ev.size > self.options.max_batch_size:  # (it would begin the next batch: too big for it)
                self.refused += 1
                out.append(Refused(request_id=rid, size=ev.size, max_batch_size=self.options.max_batch_size))
                return
            self._close(b, ev.now, "full")
            b = None
        if b is None:
            if ev.size > self.options.max_batch_size:
                self.refused += 1
                out.append(Refused(request_id=rid, size=ev.size, max_batch_size=self.options.max_batch_size))
                return
            b = self._forming = _Forming(self._next_id, ev.now, self.options)
            self._next_id += 1
        b.items[rid] = (ev.size, ev.model_id)
        b.size += ev.size
        self._where[rid] = b
        if b.size >= b.opts.max_batch_size:
            self._close(b, ev.now, "full")

    def _close(self, b: _Forming, now: float, reason: str) -> None:
        b.closed, b.reason = now, reason
        self._waiting.append(b)
        self._forming = None

    def _cancel(self, rid: str) -> None:
        b = self._where.pop(rid, None)
        if b is None:  # unknown, already run, or ended: nothing waits for it here
            return
        size, _ = b.items.pop(rid)
        b.size -= size
        self.cancelled += 1
        if not b.items:
            if b is self._forming:
                self._forming = None
            else:
                self._waiting.remove(b)

    def _settle(self, out: list[BatchAction]) -> None:
        slots = self.options.max_concurrent_batches
        while self._waiting and len(self._running) < slots:
            self._run(self._waiting.popleft(), out)
        b = self._forming
        if (b is not None and self._time_may_close() and self._now is not None
                and self._now >= b.began + b.opts.batch_wait_timeout_s):
            self._close(b, self._now, "timeout")
            self._run(self._waiting.popleft(), out)

    def _run(self, b: _Forming, out: list[BatchAction]) -> None:
        parts: dict[str, list[str]] = {}
        for rid, (_, model) in b.items.items():
            parts.setdefault(model, []).append(rid)
            del self._where[rid]
        self._running.add(b.batch_id)
        self.batches += 1
        self.ran += len(b.items)
        self.closed_by[b.reason] += 1
        out.append(RunBatch(batch_id=b.batch_id, parts=tuple(BatchPart(model_id=m, request_ids=tuple(r))
                                                               for m, r in parts.items()),
                            size=b.size, max_batch_size=b.opts.max_batch_size, began=b.began, closed=cast(float, b.closed),
                            reason=b.reason))

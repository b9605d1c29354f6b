"""Golden scripts of the request plane (tests/scenarios/requests/*.txt): the request machine's
routing, the batcher and a replica's model cache, in the same datadriven form as the core's
(``golden.py``: blocks of one input line, ``----``, the output; ``RANKCORE_REWRITE=1`` rewrites).

The request plane does not go through ``rankcore.step``: each script drives one
``RequestMachine``, and, when it says so, one ``Batcher`` (``batcher ...``) and one
``ModelCache`` (``cache ...``). Vocabulary: tests/scenarios/README.md, "The request plane".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rankcore as rc
from rankcore.requests import (
    BatchDone,
    Batcher,
    BatchOptions,
    Cancel,
    CancelOnReplica,
    Completed,
    Configure,
    Dispatch,
    Enqueue,
    Failed,
    Hit,
    ModelCache,
    MultiplexOptions,
    NotDelivered,
    Refused,
    Rejected,
    ReplicaModels,
    RequestMachine,
    RunBatch,
    SetBatchOptions,
    Started,
    Submit,
    Tick,
)

from .golden import ScriptError, _split
from .golden import check as golden_check


def _ids(text: Any) -> tuple[str, ...]:
    """``a,b`` -> ("a", "b"); ``-`` or empty -> ()."""
    text = str(text)
    return () if text in ("-", "") else tuple(x for x in text.split(",") if x)


def _g(x: float) -> str:
    return f"{x:g}"


class Runner:
    def __init__(self) -> None:
        self.machine = RequestMachine(reports_started=True)
        self.batcher: Batcher | None = None
        self.cache: ModelCache | None = None
        self.deps: list[str] = []
        self.ids: list[str] = []  # the request ids submitted, in order

    # -- input

    def run(self, text: str) -> list[str]:
        word, *args = text.split()
        pos, kw = _split(args)
        try:
            handler = getattr(self, "_" + word.replace("-", "_"))
        except AttributeError:
            raise ValueError(f"unknown word {word!r}") from None
        try:
            return handler(pos, kw)
        except rc.RankcoreError as e:
            return [f"error {type(e).__name__}: {e}"]

    def _machine(self, event: object) -> list[str]:
        out = [self._action(a) for a in self.machine.handle(event)]
        return out + self._state()

    def _configure(self, pos: list[str], kw: dict) -> list[str]:
        (dep,) = pos
        if dep not in self.deps:
            self.deps.append(dep)
        return self._machine(Configure(deployment=dep, max_ongoing_requests=kw.get("ongoing", 5),
                                       max_queued_requests=kw.get("queued", -1), max_retries=kw.get("retries", 3)))

    def _pool(self, pos: list[str], kw: dict) -> list[str]:
        (dep,) = pos
        return self._machine(rc.PoolReset(deployment=dep, serving=_ids(kw.get("serving", "-")),
                                          draining=_ids(kw.get("draining", "-")), coming=bool(kw.get("coming", False))))

    def _pool_changed(self, pos: list[str], kw: dict) -> list[str]:
        dep, rid, membership = pos
        return self._machine(rc.PoolChanged(deployment=dep, replica_id=rid, membership=membership))

    def _models(self, pos: list[str], kw: dict) -> list[str]:
        dep, rid, models = pos
        return self._machine(ReplicaModels(deployment=dep, replica_id=rid, model_ids=_ids(models)))

    def _submit(self, pos: list[str], kw: dict) -> list[str]:
        rid, dep = pos
        self.ids.append(rid)
        return self._machine(Submit(request_id=rid, deployment=dep, model_id=str(kw.pop("model", "")), **kw))

    def _started(self, pos: list[str], kw: dict) -> list[str]:
        return self._machine(Started(request_id=pos[0], replica_id=pos[1] if len(pos) > 1 else None))

    def _completed(self, pos: list[str], kw: dict) -> list[str]:
        return self._machine(Completed(request_id=pos[0], replica_id=pos[1] if len(pos) > 1 else None, **kw))

    def _not_delivered(self, pos: list[str], kw: dict) -> list[str]:
        return self._machine(NotDelivered(request_id=pos[0], replica_id=pos[1] if len(pos) > 1 else None))

    def _cancel(self, pos: list[str], kw: dict) -> list[str]:
        if kw.pop("batch", False):
            return self._batch(Cancel(request_id=pos[0]))
        return self._machine(Cancel(request_id=pos[0]))

    def _tick(self, pos: list[str], kw: dict) -> list[str]:
        now = float(pos[0])
        out = [self._action(a) for a in self.machine.handle(Tick(now=now))]
        if self.batcher is not None:
            out += [self._action(a) for a in self.batcher.handle(Tick(now=now))]
            return out + self._state() + self._batch_state()
        return out + self._state()

    # the batcher

    def _batcher(self, pos: list[str], kw: dict) -> list[str]:
        options = BatchOptions(**kw)
        if self.batcher is None:
            self.batcher = Batcher(options)
            return self._batch_state()
        return self._batch(SetBatchOptions(options=options))

    def _enqueue(self, pos: list[str], kw: dict) -> list[str]:
        return self._batch(Enqueue(request_id=pos[0], now=float(kw.pop("now")), model_id=str(kw.pop("model", "")),
                                   **kw))

    def _done(self, pos: list[str], kw: dict) -> list[str]:
        return self._batch(BatchDone(batch_id=int(pos[0]), now=float(kw["now"])))

    def _batch(self, event: object) -> list[str]:
        if self.batcher is None:
            raise ScriptError("say `batcher ...` before the batcher's events")
        return [self._action(a) for a in self.batcher.handle(event)] + self._batch_state()

    def _batch_state(self) -> list[str]:
        b = self.batcher
        assert b is not None
        due = b.next_deadline()
        return [f"batcher: waiting={b.waiting} running={b.running} next_deadline={'-' if due is None else _g(due)}"]

    # the model cache

    def _cache(self, pos: list[str], kw: dict) -> list[str]:
        self.cache = ModelCache(MultiplexOptions(max_num_models_per_replica=kw.get("bound", 3)))
        return self._cache_state()

    def _use(self, pos: list[str], kw: dict) -> list[str]:
        got = self._the_cache().use(pos[0])
        return [("Hit " + pos[0]) if isinstance(got, Hit) else f"miss {pos[0]}"] + self._cache_state()

    def _begin(self, pos: list[str], kw: dict) -> list[str]:
        got = self._the_cache().begin(pos[0])
        line = (f"Hit {got.model_id}" if isinstance(got, Hit)
                else f"Load {got.model_id} evict={','.join(got.evict) or '-'}")
        return [line] + self._cache_state()

    def _loaded(self, pos: list[str], kw: dict) -> list[str]:
        self._the_cache().loaded(pos[0])
        return self._cache_state()

    def _failed(self, pos: list[str], kw: dict) -> list[str]:
        self._the_cache().failed(pos[0])
        return self._cache_state()

    def _gave_up(self, pos: list[str], kw: dict) -> list[str]:
        self._the_cache().gave_up(pos[0])
        return self._cache_state()

    def _the_cache(self) -> ModelCache:
        if self.cache is None:
            raise ScriptError("say `cache bound=N` before the cache's events")
        return self.cache

    def _cache_state(self) -> list[str]:
        c = self._the_cache()
        return [f"cache: loaded={','.join(c.loaded_ids()) or '-'} resident={','.join(c.resident()) or '-'} "
                f"loading={c.loading or '-'} loads={c.loads} hits={c.hits} evictions={c.evictions}"]

    # -- output

    @staticmethod
    def _action(a: object) -> str:
        if isinstance(a, Dispatch):
            return f"Dispatch {a.request_id} -> {a.replica_id}" + (f" attempt={a.attempt}" if a.attempt else "")
        if isinstance(a, Rejected):
            return f"Rejected {a.request_id} {a.reason}"
        if isinstance(a, Failed):
            return f"Failed {a.request_id} {a.reason} on={a.replica_id}"
        if isinstance(a, CancelOnReplica):
            return f"CancelOnReplica {a.request_id} {a.replica_id}"
        if isinstance(a, RunBatch):
            parts = " ".join(f"{p.model_id or '-'}:{','.join(p.request_ids)}" for p in a.parts)
            return (f"RunBatch {a.batch_id} {a.reason} size={a.size}/{a.max_batch_size} began={_g(a.began)} "
                    f"closed={_g(a.closed)} parts={parts}")
        if isinstance(a, Refused):
            return f"Refused {a.request_id} size={a.size}/{a.max_batch_size}"
        return repr(a)

    def _state(self) -> list[str]:
        out = []
        for dep in self.deps:
            queued = self.machine.queued(dep)
            out.append(f"{dep}: queued={','.join(queued) or '-'}")
            for v in self.machine.pool(dep):
                held = self._held(dep, v.replica_id)
                out.append(f"  {v.replica_id} {v.membership}{' excluded' if v.excluded else ''} "
                           f"in_flight={v.in_flight} models={','.join(v.models) or '-'}"
                           + (f" holds={','.join(held)}" if held else ""))
        return out

    def _held(self, dep: str, replica: str) -> list[str]:
        """The live requests ``replica`` holds, in submission order (from the statuses we sent)."""
        return [rid for rid in self.ids if (s := self.machine.status(rid)) is not None
                and s.replica_id == replica and s.state in ("dispatched", "running")]


def check(path: Path, rewrite: bool) -> str | None:
    """Run one script (``golden.check`` with this runner)."""
    return golden_check(path, rewrite, Runner())

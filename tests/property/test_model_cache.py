"""One replica's models under random requests (rankcore/requests/multiplex.py ``ModelCache``, issue 39).

Random misses and hits (``use``), loads begun (``begin``) one at a time, loads that end well or
fail, requests that give up, against a model of our own (an LRU list). After every step:

* never more models loaded than the bound (-1: any);
* a hit only for a loaded model, which becomes the most recently used;
* a load evicts exactly the least recently used models that make room, and only then;
* what the replica reports (``resident``) is the loaded models then every one still wanted or
  loading, each once;
* illegal calls (a second load at once, ending a load that is not running, ``begin`` with no
  miss waiting) raise ``InvalidEvent`` and change nothing.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import rankcore as rc
from rankcore.requests import Hit, Load, ModelCache, MultiplexOptions

MODELS = ("a", "b", "c", "d", "e")


class ModelCacheProps(RuleBasedStateMachine):
    @initialize(bound=st.sampled_from([1, 2, 3, -1]))
    def start(self, bound: int) -> None:
        self.bound = bound
        self.c = ModelCache(MultiplexOptions(max_num_models_per_replica=bound))
        self.lru: list[str] = []  # ours: least recently used first
        self.waiting: dict[str, int] = {}  # misses not yet served
        self.loading: str | None = None

    def snapshot(self) -> tuple:
        return (self.c.loaded_ids(), self.c.resident(), self.c.loading, self.c.loads, self.c.hits)

    def refused(self, fn, *args) -> None:  # type: ignore[no-untyped-def]
        before = self.snapshot()
        try:
            fn(*args)
        except rc.InvalidEvent:
            assert self.snapshot() == before
            return
        raise AssertionError(f"{fn.__name__}{args} should have raised")

    @rule(m=st.sampled_from(MODELS))
    def use(self, m: str) -> None:
        got = self.c.use(m)
        if m in self.lru:
            assert got == Hit(model_id=m)
            self.lru.remove(m)
            self.lru.append(m)
        else:
            assert got is None
            self.waiting[m] = self.waiting.get(m, 0) + 1

    @rule(m=st.sampled_from(MODELS))
    def begin(self, m: str) -> None:
        if self.loading is not None or not self.waiting.get(m):
            self.refused(self.c.begin, m)
            return
        got = self.c.begin(m)
        if m in self.lru:
            assert got == Hit(model_id=m)
            self.lru.remove(m)
            self.lru.append(m)
            self._served(m)
            return
        n = 0 if self.bound == -1 else max(0, len(self.lru) - self.bound + 1)
        assert got == Load(model_id=m, evict=tuple(self.lru[:n])), (got, self.lru)
        del self.lru[:n]
        self.loading = m

    @rule(ok=st.booleans(), m=st.sampled_from(MODELS))
    def end(self, ok: bool, m: str) -> None:
        if self.loading != m:
            self.refused(self.c.loaded if ok else self.c.failed, m)
            return
        (self.c.loaded if ok else self.c.failed)(m)
        self.loading = None
        self._served(m)
        if ok:
            self.lru.append(m)

    @rule(m=st.sampled_from(MODELS))
    def give_up(self, m: str) -> None:
        n = self.waiting.get(m, 0) - (1 if self.loading == m else 0)
        if n <= 0:  # (none waits, or only the request loading it: refused, nothing changed)
            self.refused(self.c.gave_up, m)
            return
        self.c.gave_up(m)
        self._served(m)

    def _served(self, m: str) -> None:
        self.waiting[m] -= 1
        if not self.waiting[m]:
            del self.waiting[m]

    @invariant()
    def agrees(self) -> None:
        if not hasattr(self, "c"):
            return
        assert list(self.c.loaded_ids()) == self.lru
        assert self.bound == -1 or len(self.lru) <= self.bound
        extra = set(self.waiting) | ({self.loading} if self.loading else set())
        assert self.c.resident() == (*self.lru, *sorted(extra - set(self.lru)))
        assert self.c.loading == self.loading


TestModelCache = ModelCacheProps.TestCase

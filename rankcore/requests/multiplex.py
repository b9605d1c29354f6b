"""Model multiplexing as two sans-IO rules (issue 39): which replica gets a request for model m,
and which models a replica keeps.

Ray Serve decides both inside its router and its replica wrapper (``ray/serve/multiplex.py``,
``request_router.py``); here they are pure, so the Ray replica, the simulator and the property
tests share them. Names and defaults are Serve's (``max_num_models_per_replica`` 3, -1 for no
bound).

* **Routing** (``route_model``, called by ``RequestMachine`` for a request with a model id): among
  the replicas that can take a request now, one that holds m (fewest in flight); else the one
  with the fewest models, then the one whose least recently used model is asked for least lately
  (then fewest in flight), which loads m, evicting that model if full: of the models the replicas
  would drop next, the least popular goes, not one chosen by chance (Serve's router does not look
  at what a load evicts). The machine keeps each replica's models in order of use (its
  dispatches), as the replica's cache does, and counts the requests for each model, halving the
  counts every ``MODEL_ASKS_HALF_LIFE`` (1,000) requests with a model id. Ties go round-robin in pool-join order. A model whose holders are all busy
  therefore gets another copy on the next free replica: a model hot on too few replicas for its
  load spreads at once. Serve instead tries the holders first, backs off, then tries the
  replicas with the fewest models, and only after 1-2 s (``RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S``,
  randomised) any replica; it picks two at random among the candidates (power of two choices).
  A replica holds m from the moment a request for m is dispatched to it (the machine adds it)
  until its next report says otherwise (``ReplicaModels``, a pool command of the control core:
  the replica reports ``ModelsReported`` to it, which keeps it on the replica's record): Serve
  learns of a load only from the replica's push, every 0.1 s.
* **Residency** (``ModelCache``, one per replica and loader): least recently used eviction beyond
  the bound; loads run one at a time (as Serve's lock makes them), and the eviction is decided
  when the load begins, so loaded models never exceed the bound. A model being loaded counts as
  held in what the replica reports (``resident``), as Serve's push does, so requests for it
  follow it there.

Internal module: import its public names from ``rankcore.requests``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import attrs

from ..base import fields as f
from ..base.commands import ReplicaModels
from ..base.errors import InvalidConfig, InvalidEvent

__all__ = [
    "MAX_NUM_MODELS_PER_REPLICA", "MultiplexOptions", "ReplicaModels", "ModelCache", "Hit", "Load",
    "route_model", "check_model_id",
]

#: Ray Serve's default (``serve.multiplexed``)
MAX_NUM_MODELS_PER_REPLICA = 3


def _bound(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if type(value) is not int or (value != -1 and value < 1):
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be an integer >= 1, or -1 for no bound "
                            f"(Serve's), got {f.shown(value)}")


#: ``model_id`` if it is a non-empty string, else ``InvalidConfig`` naming where (Serve's checks)
check_model_id = f.model_id


@attrs.frozen(kw_only=True)
class MultiplexOptions:
    """A multiplexed loader's options, declared once (the Ray decorator, the simulator's scenario
    key and the docs read them here). Serve's name and default; -1: no bound."""

    max_num_models_per_replica: int = attrs.field(default=MAX_NUM_MODELS_PER_REPLICA, validator=_bound)


@attrs.frozen(kw_only=True)
class Hit:
    """The model is loaded: use it (it is now the most recently used)."""

    model_id: str


@attrs.frozen(kw_only=True)
class Load:
    """Load ``model_id`` now, after unloading ``evict`` (least recently used first): then call
    ``ModelCache.loaded`` (or ``failed``)."""

    model_id: str
    evict: tuple[str, ...] = ()


class ModelCache:
    """One replica's models for one loader: least recently used eviction beyond
    ``max_num_models_per_replica`` (-1: none). Mutable, not thread-safe; deterministic.

    The executor calls ``use(m)`` for each request: ``Hit`` (use the loaded model) or None (a miss:
    m now counts as wanted, so ``resident`` shows it at once). Then, one load at a time, ``begin(m)``
    says ``Hit`` (another request loaded it meanwhile) or ``Load(m, evict)``: unload ``evict``,
    load m, and report ``loaded(m)`` or ``failed(m)``."""

    def __init__(self, options: MultiplexOptions | None = None) -> None:
        if options is not None and not isinstance(options, MultiplexOptions):
            raise InvalidConfig(f"ModelCache options must be a MultiplexOptions, got {f.shown(options)}")
        if options is not None:
            f.check_record(options)  # (one unpickled or forged is checked as its constructor checks)
        self.options = options if options is not None else MultiplexOptions()
        self._loaded: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._wanted: dict[str, int] = {}  # misses not begun or loading: model -> how many wait for it
        self._loading: str | None = None
        self.loads = self.hits = self.evictions = self.failures = 0

    def use(self, model_id: str) -> Hit | None:
        """A request for ``model_id``: ``Hit``, or None for a miss (then ``begin`` it)."""
        check_model_id(model_id, "ModelCache.use's model_id")
        if model_id in self._loaded:
            self._loaded.move_to_end(model_id)
            self.hits += 1
            return Hit(model_id=model_id)
        self._wanted[model_id] = self._wanted.get(model_id, 0) + 1
        return None

    def begin(self, model_id: str) -> Hit | Load:
        """The replica's turn to load for a miss on ``model_id`` (loads run one at a time)."""
        check_model_id(model_id, "ModelCache.begin's model_id")
        n = self._wanted.get(model_id, 0)
        if n == 0:
            raise InvalidEvent(f"ModelCache.begin({model_id!r}): no miss waits for it (call use first)")
        if self._loading is not None:
            raise InvalidEvent(f"ModelCache.begin({model_id!r}): {self._loading!r} is loading; loads run one "
                               f"at a time")
        if model_id in self._loaded:  # loaded by an earlier miss meanwhile
            self._drop_wanted(model_id)
            self._loaded.move_to_end(model_id)
            self.hits += 1
            return Hit(model_id=model_id)
        bound = self.options.max_num_models_per_replica
        evict: list[str] = []
        while bound != -1 and len(self._loaded) >= bound:
            evict.append(self._loaded.popitem(last=False)[0])
        self.evictions += len(evict)
        self._loading = model_id
        return Load(model_id=model_id, evict=tuple(evict))

    def loaded(self, model_id: str) -> None:
        """The load ``begin`` asked for ended well; the other requests that missed it get ``Hit``
        from their ``begin``."""
        check_model_id(model_id, "ModelCache.loaded's model_id")
        self._end(model_id)
        self._drop_wanted(model_id)
        self._loaded[model_id] = None
        self.loads += 1

    def failed(self, model_id: str) -> None:
        """The load failed: the request that began it gets the error; the others waiting may
        ``begin`` again (Serve: each waiting request tries the load itself)."""
        check_model_id(model_id, "ModelCache.failed's model_id")
        self._end(model_id)
        self._drop_wanted(model_id)
        self.failures += 1

    def gave_up(self, model_id: str) -> None:
        """A request that missed ``model_id`` left before its load began (cancelled)."""
        check_model_id(model_id, "ModelCache.gave_up's model_id")
        waiting = self._wanted.get(model_id, 0) - (self._loading == model_id)  # (not the one loading it)
        if waiting <= 0:
            raise InvalidEvent(f"ModelCache.gave_up({model_id!r}): no miss waits for it"
                               + (" (the request loading it ends with loaded or failed)"
                                  if self._loading == model_id else ""))
        self._drop_wanted(model_id)

    def _drop_wanted(self, model_id: str) -> None:
        n = self._wanted[model_id] - 1
        if n:
            self._wanted[model_id] = n
        else:
            del self._wanted[model_id]

    def _end(self, model_id: str) -> None:
        if self._loading != model_id:
            raise InvalidEvent(f"ModelCache: {model_id!r} is not loading (loading: {self._loading!r})")
        self._loading = None

    def loaded_ids(self) -> tuple[str, ...]:
        """The loaded models, least recently used first."""
        return tuple(self._loaded)

    def resident(self) -> tuple[str, ...]:
        """What the replica reports (``ReplicaModels``): loaded models, then the ones it is loading
        or has missed, sorted (Serve pushes both)."""
        extra = set(self._wanted)
        if self._loading is not None:
            extra.add(self._loading)
        return (*self._loaded, *sorted(extra.difference(self._loaded)))

    @property
    def loading(self) -> str | None:
        return self._loading


def route_model(candidates: Iterable[tuple[int, int, int, bool, int]], last: int) -> int | None:
    """Which replica gets a request for a model: ``candidates`` are the replicas that can take a
    request now, as ``(join, in_flight, models, holds, victim)`` (pool-join number, requests it holds,
    models it holds or loads, whether the model is one, and how often its least recently used
    model was asked for lately, -1 for none); ``last``: the join number chosen last. The holders
    first, fewest in flight; else fewest models (room, or less to lose), then the one whose least
    recently used model is asked for least (the one a load there evicts when it is full: of the
    models some replica would drop next, the least popular goes, not one chosen by chance; the
    machine does not know the bound, so among replicas holding as many this decides even when
    none is full), then fewest in flight; ties: the first after ``last`` in join order
    (round-robin). None when there is no candidate."""
    best: tuple | None = None
    choice: int | None = None
    try:
        for join, in_flight, models, holds, victim in candidates:
            key = (not holds, 0 if holds else models, 0 if holds else victim, in_flight, join <= last, join)
            if best is None or key < best:
                best, choice = key, join
    except (TypeError, ValueError) as exc:  # (not (join, in_flight, models, holds, victim) ints and a bool)
        raise InvalidConfig(f"route_model: its candidates must be (join, in_flight, models, holds, victim) "
                            f"tuples of ints and a bool, and last an int ({type(exc).__name__}: {exc})") from exc
    return choice

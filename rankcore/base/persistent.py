"""Fully persistent dict tables at the speed of plain dicts (Baker's rerooting).

Why not only a HAMT: measured here, one ``immutables.Map`` write costs ~1 µs at
100k keys, so a rank operation that touches five maps costs more than Ray
Serve's whole mutable ``assign_rank``. Rerooting keeps one set of real dicts
for the *current* version and stores, in every older version, the undo list
that turns the next version back into it. Using the newest version (the
normal, linear case) costs a dict write plus an undo entry; reading an older
version first "reroots" the store to it, replaying undo lists (cost
proportional to the distance), so every version keeps value semantics:
nothing a caller holds ever changes observably.

Thread safety: every version may be read and derived from by any number of
threads at once. Rerooting writes the shared dicts, so each store (one table
and all the versions derived from it) has one ``threading.RLock``; every
public read and every mutator of a subclass holds it for its whole run
(``@locked``, ``@atomic``), so a read never sees a store halfway through a
reroot or another version's edit. Different stores never wait for each
other: no method holds one store's lock while taking another's (iterables
handed to bulk mutators are materialised before the lock is taken). Under
the GIL the lock costs ~0.1 µs per call uncontended (docs/benchmarks.md);
threads reading *different* versions of one store take turns and pay the
reroot between them, so a thread pool over one table is safe, not parallel.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

__all__ = ["Persistent", "Edit", "MISSING", "atomic", "atomic_bulk", "locked"]

F = TypeVar("F", bound=Callable[..., Any])


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_BATCH: Any = _Missing()  # marks an undo entry that holds a {key: old} mapping


class _Store:
    __slots__ = ("dicts", "open_edit", "lock")

    def __init__(self, n: int) -> None:
        self.dicts: tuple[dict, ...] = tuple({} for _ in range(n))
        self.open_edit: Edit | None = None  # an edit not yet committed or aborted
        # Held by every public read and mutator (reentrant: they call each other).
        self.lock = threading.RLock()


def _apply(dicts: tuple[dict, ...], undo: list) -> list:
    """Apply ``undo`` (newest entry last) and return the list that reverts it."""
    inverse: list = []
    append = inverse.append
    for t, key, old in reversed(undo):
        d = dicts[t]
        if key is _BATCH:
            append((t, _BATCH, {k: d.get(k, MISSING) for k in old}))
            for k, v in old.items():
                if v is MISSING:
                    del d[k]
                else:
                    d[k] = v
        else:
            append((t, key, d.get(key, MISSING)))
            if old is MISSING:
                del d[key]
            else:
                d[key] = old
    return inverse


class Persistent:
    """Base of an immutable value stored as versions of a group of dicts.

    Subclasses declare ``_N_TABLES``; every instance is one version. ``_read``
    returns the dicts as of this version; ``_edit`` starts the next version.
    """

    __slots__ = ("_store", "_link")
    _N_TABLES = 1
    _store: _Store
    _link: tuple[list, Persistent] | None

    def __init__(self) -> None:
        object.__setattr__(self, "_store", _Store(self._N_TABLES))
        # None: this version is the one materialised in the store's dicts.
        # Otherwise (undo, newer): apply ``undo`` to ``newer`` to get this one.
        object.__setattr__(self, "_link", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple:
        """Pickle this version alone, as plain dicts (not the shared store and
        its other versions): a State can be sent to another process or saved."""
        with self._store.lock:
            return (_restore, (type(self), tuple(dict(d) for d in self._read())))

    def _read(self) -> tuple[dict, ...]:
        """The tables as of this version. Read them; never write them; hold
        the store's lock until done with them (``@locked``)."""
        if self._link is not None:
            self._reroot()
        return self._store.dicts

    def _edit(self) -> Edit:
        return Edit(self)

    def _next(self, undo: list) -> Any:
        """Make the version that ``undo`` (already applied to the dicts) led to."""
        if not undo:
            return self
        new = object.__new__(type(self))
        _set = object.__setattr__
        _set(new, "_store", self._store)
        _set(new, "_link", None)
        _set(self, "_link", (undo, new))
        return new

    def _reroot(self) -> None:
        path = []
        v: Persistent = self
        while v._link is not None:
            path.append(v)
            v = v._link[1]
        dicts = self._store.dicts
        _set = object.__setattr__
        for older in reversed(path):
            undo, newer = older._link  # type: ignore[misc]
            _set(newer, "_link", (_apply(dicts, undo), older))
            _set(older, "_link", None)


def _restore(cls: type[Persistent], dicts: tuple[dict, ...]) -> Persistent:
    new: Persistent = object.__new__(cls)
    store = _Store(len(dicts))
    store.dicts = dicts
    object.__setattr__(new, "_store", store)
    object.__setattr__(new, "_link", None)
    return new


class Edit:
    """Writes on top of one version; ``commit`` yields the next version.

    Every write records how to undo it, so ``abort`` (or an exception from the
    caller's validation) leaves the base version exactly as it was.
    """

    __slots__ = ("_base", "dicts", "_undo")

    def __init__(self, base: Persistent) -> None:
        self._base = base
        self.dicts = base._read()
        self._undo: list = []
        base._store.open_edit = self

    def set(self, t: int, key: Hashable, value: Any) -> None:
        d = self.dicts[t]
        self._undo.append((t, key, d.get(key, MISSING)))
        d[key] = value

    def pop(self, t: int, key: Hashable) -> Any:
        value = self.dicts[t].pop(key)
        self._undo.append((t, key, value))
        return value

    def discard(self, t: int, key: Hashable) -> None:
        d = self.dicts[t]
        if key in d:
            self._undo.append((t, key, d.pop(key)))

    def update(self, t: int, items: Mapping) -> None:
        """Write many keys at once (dict speed; one undo entry)."""
        if not items:
            return
        d = self.dicts[t]
        self._undo.append((t, _BATCH, {k: d.get(k, MISSING) for k in items}))
        d.update(items)

    def insert_new(self, t: int, items: Mapping) -> None:
        """Like ``update`` for keys the caller knows are absent (cheaper undo)."""
        if not items:
            return
        self._undo.append((t, _BATCH, dict.fromkeys(items, MISSING)))
        self.dicts[t].update(items)

    def pop_many(self, t: int, keys: Iterable[Hashable]) -> dict:
        """Remove many keys; a missing key raises KeyError after the ones
        before it were recorded, so ``abort`` still restores them all."""
        d = self.dicts[t]
        old: dict = {}
        self._undo.append((t, _BATCH, old))
        pop = d.pop
        for k in keys:
            old[k] = pop(k)
        return old

    def commit(self) -> Any:
        undo, self._undo = self._undo, []
        self._base._store.open_edit = None
        return self._base._next(undo)

    def abort(self) -> None:
        _apply(self.dicts, self._undo)
        self._undo = []
        self._base._store.open_edit = None


def locked(method: F) -> F:
    """Decorate a public read of a ``Persistent``: it runs holding its store's
    lock, so no other thread reroots the store under it."""

    @functools.wraps(method)
    def wrapper(self: Persistent, *args: Any, **kwargs: Any) -> Any:
        with self._store.lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _materialise(x: Any) -> Any:
    """A one-shot or lazy iterable as a list (it may read other stores: never
    under this store's lock); lists, tuples, mappings and sets as they are."""
    if x is None or isinstance(x, (list, tuple, Mapping, set, frozenset)):
        return x
    return list(x)


def _atomic(method: F, bulk: bool) -> F:
    @functools.wraps(method)
    def wrapper(self: Persistent, *args: Any, **kwargs: Any) -> Any:
        if bulk and args:
            args = (_materialise(args[0]), *args[1:])
        with self._store.lock:
            try:
                return method(self, *args, **kwargs)
            except BaseException:
                edit = self._store.open_edit
                if edit is not None:
                    edit.abort()
                raise

    return wrapper  # type: ignore[return-value]


def atomic(method: F) -> F:
    """Decorate a mutator of a ``Persistent``: it runs holding its store's
    lock, and if it raises after writing, its open edit is aborted, so the
    base version reads exactly as before."""
    return _atomic(method, bulk=False)


def atomic_bulk(method: F) -> F:
    """``atomic`` for a mutator whose first argument is an iterable of items:
    a lazy one is turned into a list before the lock is taken."""
    return _atomic(method, bulk=True)

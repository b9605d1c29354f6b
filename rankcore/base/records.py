"""Unchecked copies and constructors for the core's own records, without
attrs' per-call introspection or validators.

``attrs.evolve`` looks up the class's fields and re-runs every validator on
each call (~3-4 µs for a ``Deployment``); a step makes several, and builds
commands too. The values the core puts into its own records and commands are
already valid, so ``copier`` copies the slots and sets the changed ones,
``updater`` does so for a fixed set of changed fields, and ``maker`` builds
one from its fields: functions generated once per class, writing each slot
through its setter captured once per class (see ``_Writer``; a 17-field
``Deployment`` is copied in ~1-2 µs). ``unchecked_copy`` is named so that
nobody takes it for ``attrs.evolve``: it validates nothing. A class whose copy would not be a
valid record (a converter, ``__attrs_post_init__``, a cached hash) is refused
when its functions are generated. Not for input from outside: events from
executors are still built (and validated) by their constructors.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

__all__ = ["unchecked_copy", "copier", "maker", "updater"]

_T = TypeVar("_T")
_COPIERS: dict[type, Any] = {}
_MAKERS: dict[type, Any] = {}
_UPDATERS: dict[tuple, Any] = {}
_MISSING = object()


def _check(cls: type) -> list[str]:
    """``cls``'s field names, once it is known that copying its slots makes a
    valid record: no converter (a copy would skip it), no ``__attrs_post_init__``
    (never run), no cached hash (a copy would inherit the old one)."""
    slots = cls.__dict__.get("__slots__")
    if not attrs.has(cls) or not slots:
        raise TypeError(f"{cls.__name__}: rankcore.base.records copies only slotted attrs classes")
    if hasattr(cls, "__attrs_post_init__"):
        raise TypeError(f"{cls.__name__} has __attrs_post_init__, which a copy would not run: "
                        f"build it with its constructor")
    if "_attrs_cached_hash" in slots:
        raise TypeError(f"{cls.__name__} caches its hash (cache_hash=True), which a copy would carry over stale")
    fields = attrs.fields(cls)
    for a in fields:
        if a.converter is not None:
            raise TypeError(f"{cls.__name__}.{a.name} has a converter: build it with its constructor")
    return [a.name for a in fields]


class _Writer:
    """How generated code fills the slots of a new ``cls``: ``put(i, value)``
    writes field ``i``; ``compile`` wraps the writes in a function that makes
    the record first and returns it.

    Each field is written through its slot's own setter, captured once per
    class (``_s{i}(_o, value)``: no frozen ``__setattr__``, no name lookup).
    Measured against the other ways (issue 36, a 17-field ``Deployment``
    copied): ``object.__setattr__(_o, name, value)`` costs 1.6x as much, a
    bound ``object.__setattr__`` 1.3x, one C-level ``map`` over the fields
    2.2x. Plain attribute stores on a same-layout twin class switched with
    ``__class__`` were faster still, but needed records without a
    ``__weakref__`` slot; that switch is gone (docs/benchmarks.md)."""

    def __init__(self, cls: type, names: list[str]) -> None:
        self.scope: dict[str, Any] = {"_M": _MISSING, "_new": object.__new__, "_cls": cls}
        self.scope.update({f"_s{i}": getattr(cls, n).__set__ for i, n in enumerate(names)})

    @staticmethod
    def put(i: int, value: str) -> str:
        return f"    _s{i}(_o, {value})\n"

    def compile(self, kind: str, cls: type, head: str, body: list[str]) -> Any:
        src = f"def {kind}({head}):\n    _o = _new(_cls)\n{''.join(body)}    return _o\n"
        exec(compile(src, f"<rankcore.base.records {kind} for {cls.__name__}>", "exec"), self.scope)
        return self.scope[kind]


def _copier(cls: type) -> Any:
    names = _check(cls)
    w = _Writer(cls, names)
    body = [w.put(i, f"_i.{n} if {n} is _M else {n}") for i, n in enumerate(names)]
    return w.compile("copy", cls, "_i, *, " + ", ".join(f"{n}=_M" for n in names), body)


def _maker(cls: type) -> Any:
    names = _check(cls)
    fields = attrs.fields(cls)
    w = _Writer(cls, names)
    args, body = [], []
    for i, a in enumerate(fields):
        n = a.name
        if a.default is attrs.NOTHING:
            args.append(n)
            body.append(w.put(i, n))
        elif isinstance(a.default, attrs.Factory):  # type: ignore[arg-type]
            if a.default.takes_self:
                raise TypeError(f"{cls.__name__}.{n}: a factory taking self")
            w.scope[f"_f{i}"] = a.default.factory
            args.append(f"{n}=_M")
            body.append(w.put(i, f"_f{i}() if {n} is _M else {n}"))
        else:
            w.scope[f"_d{i}"] = a.default
            args.append(f"{n}=_d{i}")
            body.append(w.put(i, n))
    return w.compile("make", cls, "*, " + ", ".join(args), body)


def _updater(cls: type, changed: tuple[str, ...]) -> Any:
    names = _check(cls)
    unknown = [n for n in changed if n not in names]
    if unknown or len(set(changed)) != len(changed):
        raise TypeError(f"updater({cls.__name__}, {', '.join(changed)}): "
                        + (f"no field {', '.join(unknown)}" if unknown else "a field twice"))
    w = _Writer(cls, names)
    body = [w.put(i, n if n in changed else f"_i.{n}") for i, n in enumerate(names)]
    return w.compile("update", cls, ", ".join(("_i", *changed)), body)


def updater(cls: type[_T], *fields: str) -> Any:
    """A copy function that always changes the same ``fields``:
    ``updater(cls, "a", "b")(inst, a, b)`` is ``copier(cls)(inst, a=a, b=b)``
    without a keyword or a test per field (for the few copies every step makes)."""
    key = (cls, fields)
    update = _UPDATERS.get(key)
    if update is None:
        update = _UPDATERS[key] = _updater(cls, fields)
    return update


def copier(cls: type[_T]) -> Any:
    """``cls``'s copy function: ``copier(cls)(inst, **changes)`` is ``unchecked_copy(inst, **changes)``
    without the per-call lookup (for the hottest paths)."""
    copy = _COPIERS.get(cls)
    if copy is None:
        copy = _COPIERS[cls] = _copier(cls)
    return copy


def maker(cls: type[_T]) -> Any:
    """``cls``'s constructor without its validators, ``maker(cls)(**fields)``: for
    records and commands the core builds from values it already holds valid
    (defaults and factories as declared)."""
    make = _MAKERS.get(cls)
    if make is None:
        make = _MAKERS[cls] = _maker(cls)
    return make


def unchecked_copy(inst: _T, **changes: Any) -> _T:
    """A copy of frozen, slotted attrs record ``inst`` with ``changes``, NOT
    validated (unlike ``attrs.evolve``): for values the core already holds valid."""
    copy = _COPIERS.get(type(inst))
    if copy is None:
        copy = copier(type(inst))
    return copy(inst, **changes)

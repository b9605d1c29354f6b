"""``evolve`` for the core's own records, without attrs' per-call introspection.

``attrs.evolve`` looks up the class's fields and re-runs every validator on
each call (~3-4 µs for a ``Deployment``); a step makes several. The values the
core puts into its own records are already valid, so this copies the slots
and sets the changed ones (a function generated once per class, ~1 µs). Not
for input from outside: events and commands are still built (and validated)
by their constructors.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

__all__ = ["evolve"]

_T = TypeVar("_T")
_COPIERS: dict[type, Any] = {}
_MISSING = object()


def _copier(cls: type) -> Any:
    names = [a.name for a in attrs.fields(cls)]
    args = ", ".join(f"{n}=_M" for n in names)
    body = "".join(f"    _set(new, {n!r}, inst.{n} if {n} is _M else {n})\n" for n in names)
    src = f"def copy(inst, *, {args}):\n    new = _new(_cls)\n{body}    return new\n"
    scope: dict[str, Any] = {"_M": _MISSING, "_new": object.__new__, "_set": object.__setattr__, "_cls": cls}
    exec(compile(src, f"<rankcore.records copier for {cls.__name__}>", "exec"), scope)
    return scope["copy"]


def evolve(inst: _T, **changes: Any) -> _T:
    """A copy of frozen, slotted attrs record ``inst`` with ``changes`` (not validated)."""
    cls = type(inst)
    copy = _COPIERS.get(cls)
    if copy is None:
        copy = _COPIERS[cls] = _copier(cls)
    return copy(inst, **changes)

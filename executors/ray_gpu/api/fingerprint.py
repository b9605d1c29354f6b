"""A deployment's code fingerprint: its ``version`` when the user gives none (docs/rollouts.md).

Ray Serve gives a deployment without a ``version`` a random one, so every redeploy replaces every
replica. Here it is a fingerprint of the class's code instead: ``run()`` again with unchanged code
replaces nothing, a change to the class's source rolls (``rankcore.control.rollouts``). A version
the user gives is used as is (Ray Serve's meaning: the same version rolls nothing, even if the
code changed).
"""

from __future__ import annotations

import hashlib
import inspect
import types
from typing import Any

__all__ = ["code_fingerprint", "version_of"]

#: hex digits kept of the sha256
LENGTH = 16


def _source(obj: Any) -> bytes | None:
    try:
        return inspect.getsource(obj).encode()
    except (OSError, TypeError):  # defined in a REPL, by exec, or a built-in
        return None


def _code(obj: Any) -> bytes:
    """Without the source: the compiled code of the function, or of each function of the class
    (by name), and its plain attributes. (Not its cloudpickle bytes, the last resort: those of
    a class hold an id of its own, so the same code defined twice would differ.)"""
    fn = getattr(obj, "__func__", obj)  # (a classmethod or staticmethod: its function)
    code = getattr(fn, "__code__", None)
    if code is not None:
        return _compiled(code)
    if not isinstance(obj, type):
        from ray import cloudpickle

        try:
            return bytes(cloudpickle.dumps(obj))
        except Exception:  # not picklable either: its name alone
            return b""
    parts = []
    for name, value in sorted(vars(obj).items()):
        if name in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__"):
            continue
        if isinstance(value, property):
            inner = b"".join(_code(f) for f in (value.fget, value.fset, value.fdel) if f is not None)
        elif hasattr(getattr(value, "__func__", value), "__code__"):
            inner = _code(value)
        elif value is None or isinstance(value, (bool, int, float, str, bytes)):
            inner = repr(value).encode()
        else:
            inner = type(value).__qualname__.encode()
        parts.append(name.encode() + b"=" + inner)
    return b"\0".join(parts)


def _compiled(code: types.CodeType) -> bytes:
    """A code object's bytecode, names and constants (nested code too), the same in every process
    (``marshal`` is not: it depends on reference counts; a frozenset's order on string hashing)."""
    out = [code.co_code, repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                               code.co_argcount, code.co_kwonlyargcount, code.co_flags)).encode()]
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.append(_compiled(c))
        elif isinstance(c, frozenset):
            out.append(repr(sorted(map(repr, c))).encode())
        else:
            out.append(repr(c).encode())
    return b"\1".join(out)


def code_fingerprint(obj: Any) -> str:
    """sha256 over the class's (or function's) module, qualified name and source, and those of the
    classes it inherits from (``object`` and built-ins aside), shortened to ``LENGTH`` hex digits.
    Without its source (defined in a REPL, say): its compiled code instead. Code it calls in other
    functions or modules is not covered: give a ``version`` to roll on such a change."""
    h = hashlib.sha256()
    chain = [c for c in inspect.getmro(obj) if c.__module__ != "builtins"] if isinstance(obj, type) else [obj]
    for part in chain:
        h.update(f"{getattr(part, '__module__', '')}:{getattr(part, '__qualname__', '')}\0".encode())
        src = _source(part)
        h.update(src if src is not None else _code(part))
        h.update(b"\0")
    return h.hexdigest()[:LENGTH]


def version_of(version: str | None, obj: Any) -> str:
    """The version a deployment is applied with: ``version`` when given, else ``obj``'s fingerprint."""
    return version if version is not None else code_fingerprint(obj)

"""A deployment's code fingerprint: its ``version`` when the user gives none (docs/rollouts.md).

Ray Serve gives a deployment without a ``version`` a random one, so every redeploy replaces every
replica. Here it is a fingerprint of what the replicas would run instead, so that a redeploy with
nothing changed replaces nothing and any change rolls (``rankcore.control.rollouts``). It covers:

* the class's code: its source and its bases' (``class_fingerprint``);
* the source of every *project module* the deploying process has loaded (``project_modules``: a
  ``.py`` file outside the standard library, site-packages and rankcore's own packages): module
  globals, helper modules and the functions the class calls. A replica imports these from its
  node's disk (the class is pickled by reference), so their files are what it runs;
* for a class pickled by value (``@deployment`` at a module's top level, or defined in a function
  or in ``__main__``): what travels with it, the values its methods close over, their defaults and
  the module globals they read (``_runtime``);
* the ``.bind()`` arguments (``_stable``).

A bind argument or closed-over value that is not plain data (its bytes are not proven the same for
the same meaning: an arbitrary object, an array) gets a random part instead: that deployment rolls
at every redeploy, Ray Serve's rule, the safe side. (A module global or default that is an object
counts by its type's name: the module's source, fingerprinted, made it.) A version the user gives
is used as is (Ray Serve's meaning: the same version rolls nothing, even if the code changed).

A replica, when it starts, compares the project modules it imported with those the fingerprint was
taken over (``check_modules``): a file changed on its node since the deploy makes its start fail
(``CodeChanged``), so no replica serves other code under its revision's name.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import os
import site
import sys
import sysconfig
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CodeChanged", "check_modules", "class_fingerprint", "code_fingerprint", "project_modules",
           "stamp", "version_of"]

#: hex digits kept of a sha256 (the fingerprint's, and each module's in ``project_modules``)
LENGTH = 16


class CodeChanged(RuntimeError):
    """A replica would run other code than its revision was fingerprinted over."""


class _Unstable(Exception):
    """A value whose bytes are not proven the same for the same meaning, in every process."""


# ------------------------------------------------------------------ the class's code
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


def _chain(obj: Any) -> list:
    return [c for c in inspect.getmro(obj) if c.__module__ != "builtins"] if isinstance(obj, type) else [obj]


def class_fingerprint(obj: Any) -> str:
    """sha256 over the class's (or function's) module, qualified name and source, and those of the
    classes it inherits from (``object`` and built-ins aside), shortened to ``LENGTH`` hex digits.
    Without its source (defined in a REPL, say): its compiled code instead. The class's part of
    ``code_fingerprint``; alone, what a caller inside the project that gives no version gets
    (``controller.apply``)."""
    h = hashlib.sha256()
    for part in _chain(obj):
        h.update(f"{getattr(part, '__module__', '')}:{getattr(part, '__qualname__', '')}\0".encode())
        src = _source(part)
        h.update(src if src is not None else _code(part))
        h.update(b"\0")
    return h.hexdigest()[:LENGTH]


# ------------------------------------------------------------------ the project's modules
@functools.cache
def _not_project() -> tuple[str, ...]:
    """The folders whose modules are not the project's: the standard library, site-packages, and
    rankcore's own packages (``rankcore``, ``executors``: the framework, not the deployment's code)."""
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.update(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.add(site.getusersitepackages())
    import rankcore

    dirs.add(str(Path(rankcore.__file__).parent))
    dirs.add(str(Path(__file__).resolve().parents[2]))  # (executors/)
    return tuple(sorted({os.path.join(d, "") for d in dirs} | {os.path.join(os.path.realpath(d), "") for d in dirs}))


#: file -> whether it is a project module's (``_is_project``)
_KIND: dict[str, bool] = {}
#: file -> ((its stat: mtime, size, inode, ctime), sha256 of its bytes): read again when one changed
_DIGESTS: dict[str, tuple[tuple, str]] = {}


def _is_project(path: str) -> bool:
    known = _KIND.get(path)
    if known is None:
        skip = _not_project()
        known = path.endswith(".py") and not path.startswith(skip)
        if known:
            real = os.path.realpath(path)
            parts = real.split(os.sep)
            known = not real.startswith(skip) and "site-packages" not in parts and "dist-packages" not in parts
        _KIND[path] = known
    return known


def _digest(path: str) -> str | None:
    """sha256 of the file's bytes now (None: unreadable), read again only when its stat changed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)
    held = _DIGESTS.get(path)
    if held is not None and held[0] == key:
        return held[1]
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:LENGTH]
    except OSError:
        return None
    _DIGESTS[path] = (key, digest)
    return digest


def _file_of(module: Any) -> str | None:
    if not isinstance(module, types.ModuleType):
        return None
    try:
        path = module.__file__
    except Exception:  # (a lazy module that failed to load)
        return None
    return path if isinstance(path, str) else None


def project_modules(*roots: Any) -> dict[str, str]:
    """The project modules ``roots`` (objects: a class, its bind arguments) can reach, by name
    (sorted), each with the sha256 of its file's bytes: what a replica imports from disk when it
    starts. Reached: the module of each root (and of its classes' bases), then, module by module,
    every module among its globals and the module of every class or function among them, as long as
    it is a project module. (Not every module this process happens to have loaded: one imported
    later for another reason rolled every deployment at its next redeploy.) No ``roots``: every
    project module loaded."""
    if not roots:
        names = [n for n, m in list(sys.modules.items()) if _project_file(m) is not None]
    else:
        names, seen = [], set()
        todo = [m for r in roots for m in _modules_of(r)]
        while todo:
            module = todo.pop()
            name = getattr(module, "__name__", None)
            if not isinstance(name, str) or name in seen or _project_file(module) is None:
                continue
            seen.add(name)
            names.append(name)
            for value in list(vars(module).values()):
                todo.extend(_modules_of(value))
    out = {}
    for name in names:
        path = _project_file(sys.modules.get(name))
        digest = _digest(path) if path is not None else None
        if digest is not None:
            out[name] = digest
    return dict(sorted(out.items()))


def _project_file(module: Any) -> str | None:
    path = _file_of(module)
    return path if path is not None and _is_project(path) else None


def _modules_of(value: Any) -> list[Any]:
    """The modules ``value`` stands for: itself (a module), its module (a class or function, its
    classes' bases' too), its type's (an instance), those of the items of a tuple, list or dict (a
    loop over at most ``_MOST_ITEMS``, each container once: a module's global may hold itself);
    none for plain data."""
    out: list[Any] = []
    todo: list[Any] = [value]
    seen: set[int] = set()
    while todo and len(seen) < _MOST_ITEMS:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, types.ModuleType):
            out.append(v)
        elif isinstance(v, type):
            out.extend(m for k in v.__mro__[:-1] if (m := sys.modules.get(k.__module__)) is not None)
        elif isinstance(v, (types.FunctionType, types.MethodType)):
            m = sys.modules.get(getattr(v, "__module__", None) or "")
            out.extend([m] if m is not None else [])
        elif isinstance(v, (tuple, list)):
            todo.extend(v)
        elif isinstance(v, dict):
            todo.extend(v.values())
        elif not (v is None or isinstance(v, (bool, int, float, complex, str, bytes))):
            m = sys.modules.get(type(v).__module__)
            out.extend([m] if m is not None else [])
    return out


#: how many values ``_modules_of`` looks at, at most, in one module global
_MOST_ITEMS = 10_000


# ------------------------------------------------------------------ what travels by value
def _by_reference(obj: Any) -> bool:
    """Whether cloudpickle sends ``obj`` (a class or function) by name: the receiver imports it."""
    try:
        from ray.cloudpickle import cloudpickle as cp

        return bool(cp._should_pickle_by_reference(obj))
    except Exception:  # (no Ray, or another cloudpickle: its rule as it is now)
        return "<locals>" not in getattr(obj, "__qualname__", "<locals>") and obj.__module__ != "__main__"


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def _function(fn: types.FunctionType, seen: tuple) -> bytes:
    """A function sent by value: its code, what it closes over, its defaults and the globals it reads.
    One whose code is a library's or rankcore's own (the wrapper ``@batch`` or ``@multiplexed`` puts
    around a method): its name and what it wraps (``__wrapped__``), not its closure, which holds the
    decorator's running state (its runners, their queues), different after every call."""
    if fn.__code__.co_filename.startswith(_not_project()):
        inner = getattr(fn, "__wrapped__", None)
        return b"wrapper:" + fn.__code__.co_name.encode() + (
            b"(" + _stable(inner, seen) + b")" if isinstance(inner, types.FunctionType) else b"")
    lenient = isinstance(fn.__globals__.get("__file__"), str)  # (its module's file made them)
    parts = [_compiled(fn.__code__)]
    for cell in fn.__closure__ or ():
        try:
            parts.append(_stable(cell.cell_contents, seen))
        except ValueError:  # (an empty cell)
            parts.append(b"empty")
    parts.append(_stable((fn.__defaults__, fn.__kwdefaults__), seen, lenient))
    g = fn.__globals__
    for name in sorted(_global_names(fn.__code__)):
        if name in g:
            parts.append(name.encode() + b"=" + _stable(g[name], seen, lenient))
    return b"\2".join(parts)


def _runtime(obj: Any, seen: tuple = ()) -> bytes:
    """What travels with a class (or function) pickled by value, beyond its source: each method's
    closure, defaults and globals, and the class's attributes. Nothing for one pickled by reference
    (a replica imports it: its module's file is in ``project_modules``)."""
    if _by_reference(obj):
        return b""
    if not isinstance(obj, type):
        return _function(obj, (*seen, id(obj))) if isinstance(obj, types.FunctionType) else b""
    seen = (*seen, id(obj))
    parts = []
    for part in _chain(obj):
        if part is not obj and _by_reference(part):
            continue
        lenient = _file_of(sys.modules.get(part.__module__)) is not None
        for name, value in vars(part).items():
            fns = (value.fget, value.fset, value.fdel) if isinstance(value, property) \
                else (getattr(value, "__func__", value),)
            if any(isinstance(f, types.FunctionType) for f in fns):
                for f in fns:
                    if isinstance(f, types.FunctionType):
                        parts.append(name.encode() + b"=" + _function(f, seen))
            elif not (name.startswith("__") and name.endswith("__")) \
                    and not isinstance(value, (types.MemberDescriptorType, types.GetSetDescriptorType)):
                parts.append(name.encode() + b"=" + _stable(value, seen, lenient))
    return b"\3".join(parts)


def _stable(x: Any, seen: tuple = (), lenient: bool = False) -> bytes:
    """``x`` as bytes that are the same for the same value in every process, or ``_Unstable``:
    plain data (None, bools, numbers, strings, bytes; tuples, lists, dicts in their order, sets
    sorted), enums, modules, classes and functions (by name when pickled by reference, else their
    code and what travels with it) and deployment handles (the deployment's name). ``lenient``
    (a module's global, or a default, in a module with a file: its source, fingerprinted, made it):
    any other object by its type's name."""
    t = type(x)
    if x is None or t in (bool, int, float, complex, str, bytes):
        return t.__name__.encode() + b":" + repr(x).encode()
    if isinstance(x, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)):
        name = f"{getattr(x, '__module__', None) or ''}:{getattr(x, '__qualname__', x.__name__)}".encode()
        if isinstance(x, (types.BuiltinFunctionType, types.ModuleType)) or id(x) in seen or _by_reference(x):
            return b"ref:" + name  # (its code is its module's: covered by that module's file)
        return b"value:" + name + b"(" + (_source(x) or _code(x)) + _runtime(x, seen) + b")"
    if isinstance(x, enum.Enum):
        return b"enum:" + _stable(type(x), seen) + b"." + x.name.encode()
    if id(x) in seen or len(seen) > 100:
        raise _Unstable(f"a {t.__qualname__} that holds itself, or nested too deep")
    seen = (*seen, id(x))
    if t in (tuple, list):
        return t.__name__.encode() + b"[" + b",".join(_stable(v, seen, lenient) for v in x) + b"]"
    if t is dict:
        return b"dict{" + b",".join(_stable(k, seen, lenient) + b":" + _stable(v, seen, lenient)
                                    for k, v in x.items()) + b"}"
    if t in (set, frozenset):
        return t.__name__.encode() + b"{" + b",".join(sorted(_stable(v, seen, lenient) for v in x)) + b"}"
    # (by name, not by import: ``deployments`` imports this module, and a replica checking its code
    # must not import the handle and the controller)
    kind = (t.__module__, t.__qualname__)
    if kind == (_DEPLOYMENTS, "DeploymentHandle"):  # (its controller's handle aside: the deployment it calls)
        return b"handle:" + _stable((x.name, x.method, x.stream, x.progress, x.multiplexed_model_id,
                                     x.by_reference))
    if kind == (_DEPLOYMENTS, "Application"):  # (bound, not deployed yet: the deployment it will be a handle to)
        return b"handle:" + _stable((x.deployment.name, "__call__", False, False, "", None))
    if lenient:
        return b"object:" + f"{t.__module__}:{t.__qualname__}".encode()
    raise _Unstable(t.__qualname__)


def _stable_or_random(part: Any) -> bytes:
    try:
        return part()
    except _Unstable:  # not proven the same: a redeploy rolls (Ray Serve's rule)
        return b"random:" + os.urandom(16)


#: where ``DeploymentHandle`` and ``Application`` are defined (``_stable`` knows them by name)
_DEPLOYMENTS = __name__.rsplit(".", 1)[0] + ".deployments"


# ------------------------------------------------------------------ the fingerprint
def code_fingerprint(obj: Any, args: tuple = (), kwargs: Mapping | None = None,
                     modules: Mapping[str, str] | None = None) -> str:
    """sha256 over what a replica of ``obj`` bound to ``args`` and ``kwargs`` runs (the module
    docstring): ``class_fingerprint(obj)``, ``modules`` (default: ``project_modules`` it reaches now), what
    travels with a class pickled by value, and the bind arguments; ``LENGTH`` hex digits. A part
    that is not plain data is random: such a deployment rolls at every redeploy."""
    h = hashlib.sha256(class_fingerprint(obj).encode() + b"\0")
    for name, digest in sorted((project_modules(obj, args, dict(kwargs or {})) if modules is None
                                else modules).items()):
        h.update(f"{name}={digest}\0".encode())
    h.update(b"\1" + _stable_or_random(lambda: _runtime(obj)))
    h.update(b"\1" + _stable_or_random(lambda: _stable((tuple(args), dict(kwargs or {})))))
    return h.hexdigest()[:LENGTH]


def stamp(version: str | None, obj: Any, args: tuple = (), kwargs: Mapping | None = None
          ) -> tuple[str, dict[str, str] | None]:
    """The version a deployment is applied with, and the project modules its replicas must find
    unchanged when they start (``check_modules``): ``(version, None)`` when given; else the
    fingerprint and the modules it was taken over. Taken where the deployment is made (the
    driver, the ``rankcore deploy`` process), which imported the code from disk last."""
    if version is not None:
        return version, None
    modules = project_modules(obj, args, dict(kwargs or {}))
    return code_fingerprint(obj, args, kwargs, modules), modules


def version_of(version: str | None, obj: Any, args: tuple = (), kwargs: Mapping | None = None) -> str:
    """The version a deployment is applied with: ``version`` when given, else the fingerprint."""
    return stamp(version, obj, args, kwargs)[0]


# ------------------------------------------------------------------ a replica's check
def changed_modules(expected: Mapping[str, str]) -> list[str]:
    """The modules of ``expected`` (``stamp``'s) this process has loaded from a file whose bytes
    differ now (``__main__`` aside: a driver's script travels by value, the replica's is Ray's)."""
    changed = []
    for name, digest in expected.items():
        path = _file_of(sys.modules.get(name))
        if path is None or name.startswith("__") or not path.endswith(".py"):
            continue
        now = _digest(path)
        if now is not None and now != digest:
            changed.append(name)
    return sorted(changed)


def check_modules(deployment: str, revision: str, expected: Mapping[str, str]) -> None:
    """Raise ``CodeChanged`` when a module this replica loaded is not the one its revision was
    fingerprinted over (edited on this node since the deploy): it would serve other code under
    that revision's name. The start fails instead (the core backs off and retries; the deployment
    is ``UNHEALTHY`` with this message) until a redeploy rolls the new code out."""
    changed = changed_modules(expected)
    if changed:
        raise CodeChanged(
            f"deployment {deployment!r}: the code on this node changed since revision {revision!r} was "
            f"deployed ({', '.join(changed)}): this replica would run other code than its revision "
            f"records; redeploy to roll it out")

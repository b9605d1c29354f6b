"""Which application each deployment belongs to, for everything that names it (issue 64): the
``application`` label of Ray Serve's metrics, ``/-/routes`` (route prefix -> application, Serve's
answer) and a request's ``app_name``.

An application is a name ``serve.run(app, name=...)`` or ``rankcore deploy`` (a config file's
``applications[].name``) gives a graph of deployments; the core knows deployments only. The map is
kept in Ray's KV store (``rankcore/app_names``, JSON: any process may read it, none needs the
controller), written where applications are made and deleted. A deployment no application holds
(rankcore's own ``run``) is its own application: its name is the label, as before.

Readers ask ``of`` many times a second (a metric label per request), so each process keeps what
it read for ``FRESH_S``: a new application's name is seen within that.
"""

from __future__ import annotations

import json
import threading
import time

__all__ = ["assign", "forget", "forget_all", "of", "table", "invalidate", "FRESH_S"]

_KEY = b"rankcore/app_names"
#: how long a process trusts the map it last read
FRESH_S = 1.0

_lock = threading.Lock()
_cache: tuple[float, dict[str, str]] = (float("-inf"), {})


def _read() -> dict[str, str]:
    from ray.experimental import internal_kv

    try:
        raw = internal_kv._internal_kv_get(_KEY)
    except Exception:  # (no Ray here, or its KV store unreachable: no applications known)
        return {}
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:  # pragma: no cover - (written only here)
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _write(names: dict[str, str]) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(_KEY, json.dumps(names, sort_keys=True).encode(), overwrite=True)
    global _cache
    with _lock:
        _cache = (time.monotonic(), dict(names))


def table(fresh_s: float = FRESH_S) -> dict[str, str]:
    """deployment -> application, as read at most ``fresh_s`` ago."""
    global _cache
    now = time.monotonic()
    with _lock:
        when, names = _cache
    if now - when <= fresh_s:
        return names
    names = _read()
    with _lock:
        _cache = (now, names)
    return names


def invalidate() -> None:
    """The next read asks the KV store again: a process that learns that an application changed (a
    proxy given a route by ``serve.run``, which assigned the names first) sees it at once."""
    global _cache
    with _lock:
        _cache = (float("-inf"), _cache[1])


def of(deployment: str) -> str:
    """The application ``deployment`` belongs to (itself when none holds it; "" stays "")."""
    return table().get(deployment, deployment)


def assign(app: str, deployments: tuple[str, ...] | list[str]) -> None:
    """Application ``app`` is now these deployments (the ones it held before and does not now are
    no longer its)."""
    names = {d: a for d, a in _read().items() if a != app}
    names.update({d: app for d in deployments})
    _write(names)


def forget(app: str) -> None:
    """Application ``app`` was deleted."""
    names = _read()
    kept = {d: a for d, a in names.items() if a != app}
    if kept != names:
        _write(kept)


def forget_all() -> None:
    """Every application was deleted (``serve.shutdown``, ``rankcore shutdown``)."""
    _write({})

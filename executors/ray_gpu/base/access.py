"""Access logs of the HTTP ingress (issue 37): one JSON record per request.

A record says ``time`` (epoch s, when the answer ended), ``request_id``, ``method``,
``route`` (the matched route prefix, ``""`` for none), ``path``, ``deployment``, ``replica``
(the one the router sent the call to; None when none took it), ``rank`` (that replica's
global rank as the ingress last heard it from the controller), ``status``, ``latency_ms``
and ``bytes`` (the answer's body). The records go to the logger ``rankcore.access``: a
JSON-lines file ``<logs_dir>/access.jsonl`` (``logs_dir`` defaults to Ray's session log
directory's ``rankcore/``, beside Serve's ``serve/``), and the last ``KEEP`` stay readable
through the ingress actor's ``access_records()``.

The request id is the client's ``X-Request-Id`` when it sends a valid one (``request_id_of``:
at most ``REQUEST_ID_MAX`` characters of letters, digits and ``-_.:@/+=``), else a new one;
it is always returned in the answer's ``x-request-id`` header (Ray Serve's).

On by default, as Serve's ``LoggingConfig.enable_access_log``; off: ``start_ingress(
enable_access_log=False)``, ``set_access_log(False)``, ``rankcore serve --no-access-log``.

On the direct data plane (docs/ray.md) a deployment's requests are answered by its replicas' own
servers: each replica writes their records (the same fields, ``replica`` itself) to its node's
``access.jsonl``, and the ingress's ``access_records()`` merges its own with its replicas'.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from typing import Any

from .httpwords import REQUEST_ID_HEADER, REQUEST_ID_MAX, request_id_of

__all__ = ["ENABLE_ACCESS_LOG", "REQUEST_ID_HEADER", "REQUEST_ID_MAX", "KEEP", "LOGGER_NAME", "AccessLog",
           "request_id_of", "check_enable_access_log", "default_logs_dir", "record"]

#: Ray Serve's ``LoggingConfig.enable_access_log`` default: one record per request
ENABLE_ACCESS_LOG = True
#: how many records the ingress keeps readable (``access_records``)
KEEP = 1000
LOGGER_NAME = "rankcore.access"

def check_enable_access_log(value: Any) -> bool:
    """``enable_access_log`` must be a bool (Serve's field)."""
    if not isinstance(value, bool):
        from rankcore import InvalidConfig

        raise InvalidConfig(f"enable_access_log must be true or false, got {value!r}")
    return value


def record(*, request_id: str | None, method: str, route: str, path: str, deployment: str | None,
           replica: str | None, rank: int | None, status: int, latency_ms: float, nbytes: int) -> dict:
    """One access record (module docstring), ended now: the proxy's and a replica's own server's alike."""
    return {"time": round(time.time(), 6), "request_id": request_id, "method": method, "route": route, "path": path,
            "deployment": deployment, "replica": replica, "rank": rank, "status": status,
            "latency_ms": round(latency_ms, 3), "bytes": nbytes}


def default_logs_dir() -> str | None:
    """``<Ray's session log directory>/rankcore`` (beside Serve's ``serve/``); None outside Ray."""
    try:
        from ray._private.worker import global_worker

        return os.path.join(global_worker.node.get_logs_dir_path(), "rankcore")  # type: ignore[union-attr]
    except Exception:
        return None


class AccessLog:
    """Where the records go: the ``rankcore.access`` logger (a JSON-lines file under
    ``logs_dir``, when one is given) and a ring of the last ``KEEP``."""

    def __init__(self, enabled: bool = ENABLE_ACCESS_LOG, logs_dir: str | None = None) -> None:
        self.enabled = check_enable_access_log(enabled)
        self.recent: deque[dict] = deque(maxlen=KEEP)
        self.path: str | None = None
        self.log = logging.getLogger(LOGGER_NAME)
        self.log.setLevel(logging.INFO)
        self.log.propagate = False  # (not the actor's stderr: Ray would echo every request to the driver)
        if logs_dir is not None:
            os.makedirs(logs_dir, exist_ok=True)
            self.path = os.path.join(logs_dir, "access.jsonl")
            if not any(getattr(h, "baseFilename", None) == os.path.abspath(self.path) for h in self.log.handlers):
                handler = logging.FileHandler(self.path)
                handler.setFormatter(logging.Formatter("%(message)s"))
                self.log.addHandler(handler)

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.recent.append(record)
        if self.log.handlers:
            self.log.info(json.dumps(record, default=str))

    def last(self, n: int | None = None) -> list[dict]:
        items = list(self.recent)
        return items if n is None else items[-n:] if n > 0 else []

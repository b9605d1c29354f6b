"""What the Ray controller saves, so that a restarted controller can recover.

Every key the controller keeps in Ray's internal KV store, with how it is
written and read, in one place: a restarted controller (``recover.py``)
reads exactly these, and ``reset`` deletes them. Ranks are not stored: they
are rebuilt from the replicas' own reports.
"""

from __future__ import annotations

import time
from typing import Any

from ray import cloudpickle
from ray.experimental import internal_kv

import rankcore as rc

_KV_SPECS = b"rankcore/specs"  # what was applied, to recover after a restart (ranks are not stored)
_KV_COUNTERS = b"rankcore/counters"  # id and lineage high-water marks, so no id is reused
_KV_RECORDING = b"rankcore/recording"  # a trace is being recorded (survives a restart)
_KV_EPOCH = b"rankcore/epoch"  # wall-clock origin of trace time, shared by every controller incarnation
_KV_INCARNATION = b"rankcore/incarnation"  # how many controllers have started (orders their commands)
#: every replica the controller started and has not forgotten, with how far its
#: start got (Ray Serve checkpoints its replica list too): a restarted controller
#: adopts the starts under way and knows which replicas died while it was down
_KV_REPLICAS = b"rankcore/replicas"
_KV_FAULTS = b"rankcore/faults"  # faults injected while no controller ran, for the trace
_KV_ASLEEP = b"rankcore/asleep"  # the deployments meant to be asleep (rc.query.desired_asleep), beside the specs
_KV_WEIGHTS = b"rankcore/weights_versions"  # the weights version last pushed to each (rc.query.desired_weights)
_KV_NO_EVICT = b"rankcore/no_evict"  # evicted replicas' replacements still waiting (rc.query.desired_no_evict)
_KV_DELETED = b"rankcore/deleted"  # the deployments deleted, being deleted or gone (rc.query.desired_deleted)
_KV_BOOKING = b"rankcore/memory_booking"  # api.book_memory's options and the nodes' CUDA memory (probed)
_KV_HTTP_ROUTES = b"rankcore/http_routes"  # the HTTP ingress's routes with their handles (ingress.py)
_KV_HTTP_PORT = b"rankcore/http_port"  # the port the ingress bound last (a restarted one on port 0 binds it again)
_KV_PROXIES = b"rankcore/proxies"  # the proxies' settings and the head node (control/proxies.py)
_KV_PROXY_NUMBER = b"rankcore/proxy_number"  # one above the highest proxy number started (ids never reused)


def _get(key: bytes) -> Any:
    raw = internal_kv._internal_kv_get(key)
    return cloudpickle.loads(raw) if raw else None


def _put(key: bytes, value: Any) -> None:
    internal_kv._internal_kv_put(key, cloudpickle.dumps(value), overwrite=True)


def epoch() -> float:
    """The wall-clock origin of trace time: the first controller's start (set now if none is)."""
    raw = internal_kv._internal_kv_get(_KV_EPOCH)
    if raw:
        return float(raw)
    return new_epoch()


def new_epoch() -> float:
    t0 = time.time()
    internal_kv._internal_kv_put(_KV_EPOCH, repr(t0).encode())
    return t0


def next_incarnation() -> int:
    """Count this controller's start: 1 for the first (a later one's commands outrank an earlier one's)."""
    raw = internal_kv._internal_kv_get(_KV_INCARNATION)
    incarnation = int(raw) + 1 if raw else 1
    internal_kv._internal_kv_put(_KV_INCARNATION, str(incarnation).encode(), overwrite=True)
    return incarnation


def save_specs(state: rc.State, specs: dict[str, dict]) -> None:
    """The deployments as the core means them now (``rc.query.desired_specs``, the
    one copy of the specs: a scale is folded in) and, per deployment, what the
    core does not hold (``specs``: its class, arguments and actor options)."""
    desired = {d.name: d for d in rc.query.desired_specs(state)}
    _put(_KV_SPECS, {name: {**spec, "applied": desired[name]} for name, spec in specs.items() if name in desired})
    _put(_KV_ASLEEP, tuple(n for n in rc.query.desired_asleep(state) if n in specs and n in desired))
    _put(_KV_WEIGHTS, tuple((n, v) for n, v in rc.query.desired_weights(state) if n in specs and n in desired))
    _put(_KV_DELETED, rc.query.desired_deleted(state))


def load_deleted() -> tuple[str, ...]:
    """The deployments deleted when the specs were last saved (``ControllerRecovered.deleted``)."""
    return _get(_KV_DELETED) or ()


def save_no_evict(state: rc.State) -> None:
    """``rc.query.desired_no_evict``: saved whenever it changes (an eviction happens in any step)."""
    _put(_KV_NO_EVICT, rc.query.desired_no_evict(state))


def load_no_evict() -> tuple[str, ...]:
    """The replacements that wait for room and never evict (``ControllerRecovered.no_evict``)."""
    return _get(_KV_NO_EVICT) or ()


def load_asleep() -> tuple[str, ...]:
    """The deployments meant to be asleep when the specs were last saved (``ControllerRecovered.asleep``)."""
    return _get(_KV_ASLEEP) or ()


def load_weights_versions() -> tuple[tuple[str, int], ...]:
    """(deployment, weights version last pushed) when the specs were last saved
    (``ControllerRecovered.weights_versions``: a push no replica holds yet is not lost)."""
    return _get(_KV_WEIGHTS) or ()


def load_specs() -> dict | None:
    """What ``save_specs`` stored (each spec with its ``applied`` DeploymentApplied), or None."""
    return _get(_KV_SPECS)


def save_counters(started: int, lineages: int) -> None:
    _put(_KV_COUNTERS, (started, lineages))


def load_counters() -> tuple[int, int]:
    """(one past the highest replica number started, one past the highest lineage)."""
    return _get(_KV_COUNTERS) or (0, 0)


def save_replicas(checkpoint: dict[str, dict]) -> None:
    """Replica id -> ``ReplicaRecord.checkpoint()``, for every replica of ours."""
    _put(_KV_REPLICAS, checkpoint)


def load_replicas() -> dict[str, dict]:
    return _get(_KV_REPLICAS) or {}


def set_recording(snapshot_every: int) -> None:
    internal_kv._internal_kv_put(_KV_RECORDING, str(snapshot_every).encode(), overwrite=True)


def recording() -> int | None:
    """The recording trace's ``snapshot_every``, or None when no trace is recorded."""
    raw = internal_kv._internal_kv_get(_KV_RECORDING)
    return int(raw) if raw else None


def clear_recording() -> None:
    internal_kv._internal_kv_del(_KV_RECORDING)


def push_fault(type_: str, fields: dict, when: float) -> None:
    queued = _get(_KV_FAULTS) or []
    queued.append((type_, dict(fields), when))
    _put(_KV_FAULTS, queued)


def take_faults() -> list[tuple[str, dict, float]]:
    """The faults queued (``push_fault``), oldest first, removed from the store."""
    raw = internal_kv._internal_kv_get(_KV_FAULTS)
    if not raw:
        return []
    internal_kv._internal_kv_del(_KV_FAULTS)
    return list(cloudpickle.loads(raw))


def forget_all() -> None:
    """Delete what a restarted controller would recover from (``reset``); the
    incarnation count stays, so later commands still outrank earlier ones."""
    for key in (_KV_SPECS, _KV_COUNTERS, _KV_RECORDING, _KV_EPOCH, _KV_REPLICAS, _KV_FAULTS, _KV_ASLEEP,
                _KV_WEIGHTS, _KV_BOOKING, _KV_NO_EVICT, _KV_HTTP_ROUTES, _KV_HTTP_PORT, _KV_DELETED, _KV_PROXIES,
                _KV_PROXY_NUMBER):
        internal_kv._internal_kv_del(key)


def save_http_routes(routes: dict[str, str], handles: dict[str, Any]) -> None:
    """The HTTP ingress's route table (prefix -> deployment) and each deployment's handle (a handle
    pickles as its deployment's name, method and the controller's actor handle)."""
    _put(_KV_HTTP_ROUTES, (dict(routes), dict(handles)))


def load_http_routes() -> tuple[dict[str, str], dict[str, Any]]:
    """What ``save_http_routes`` stored, or no routes."""
    got = _get(_KV_HTTP_ROUTES)
    return ({}, {}) if got is None else (dict(got[0]), dict(got[1]))


def save_http_port(port: int) -> None:
    _put(_KV_HTTP_PORT, int(port))


def load_http_port() -> int | None:
    """The port the ingress bound last, or None."""
    return _get(_KV_HTTP_PORT)


def save_proxies(settings: Any, head: str) -> None:
    """The proxies' settings (``proxies.ProxySettings``) and the head node: a restarted controller
    runs the same proxies."""
    _put(_KV_PROXIES, (settings, head))


def load_proxies() -> tuple[Any, str] | None:
    return _get(_KV_PROXIES)


def forget_proxies() -> None:
    for key in (_KV_PROXIES, _KV_HTTP_PORT):
        internal_kv._internal_kv_del(key)


def save_proxy_number(n: int) -> None:
    _put(_KV_PROXY_NUMBER, int(n))


def load_proxy_number() -> int:
    return _get(_KV_PROXY_NUMBER) or 0


def save_booking(booking: Any, cuda: dict[str, tuple[int, ...]]) -> None:
    """Memory-booked placement (``memory.MemoryBooking`` or None) and the probed nodes' CUDA memory."""
    _put(_KV_BOOKING, (booking, dict(cuda)))


def load_booking() -> tuple[Any, dict[str, tuple[int, ...]]]:
    got = _get(_KV_BOOKING)
    return (None, {}) if got is None else (got[0], dict(got[1]))

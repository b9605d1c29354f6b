"""What a replica knows about itself: ``get_replica_context()`` inside a replica.

Each replica is its own Ray actor process, so one module-level context per
process is exact. The executor updates it *before* calling the user's
``reconfigure``, so the context already shows the new rank there.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs

import rankcore as rc

__all__ = ["ReplicaContext", "get_replica_context"]


@attrs.frozen
class ReplicaContext:
    """``bundle_indices``: a static deployment's rank's bundles
    (``replica_bundle_mapping[rank]``; the replica runs on the first), and
    ``placement_group`` the caller's group they belong to, so the replica can
    start its own workers there (None for other deployments). ``gang``: a gang
    member's ``rankcore.GangContext`` (``gang_id``, ``rank_in_gang``,
    ``gang_size``, ``members`` in gang-rank order; None outside gangs).
    ``weights_version``: the weights version the replica holds (0: its
    class's own; each push raises it); ``tier``: ``"hot"`` (on its device,
    serving) or ``"warm"`` (asleep: in CPU memory)."""

    deployment: str
    replica_id: str
    rank: rc.ReplicaRank
    world_size: int
    user_config: Any = attrs.field(default=None, eq=False)
    bundle_indices: tuple[int, ...] | None = None
    placement_group: Any = attrs.field(default=None, eq=False)
    gang: rc.GangContext | None = None
    weights_version: int = 0
    tier: str = "hot"


_lock = threading.Lock()
_current: ReplicaContext | None = None


def _set(ctx: ReplicaContext) -> None:
    global _current
    with _lock:
        _current = ctx


def get_replica_context() -> ReplicaContext:
    """The calling replica's deployment, id, rank record and world_size (and
    its bundles and gang, see ``ReplicaContext``).

    Raises RuntimeError outside a replica (or before it was initialised).
    """
    ctx = _current
    if ctx is None:
        raise RuntimeError("get_replica_context() is only available inside a rankcore replica")
    return ctx

"""A step's working copy of the cluster model (``Cluster``).

The copy every rule of placement, bookings, deadlines and time writes to
during one step; it becomes a new ``Cluster`` once, at the end of the step,
and only when something changed. A module of its own so that the rule
modules beneath the handlers (``scheduling``, ``deadlines``, ``restarts``,
``clock``) share it without importing each other.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from typing import Any

import immutables

from ..base.cluster import Cluster
from ..base.records import unchecked_copy

__all__ = ["ClusterTx"]


class ClusterTx:
    """A step's working copy of the ``Cluster``: what the step sets lives here,
    the rest is read through from the step's starting cluster, and one record
    is built at the end (only from what changed)."""

    nodes: immutables.Map
    joined: int
    held: immutables.Map
    queue: tuple[str, ...]
    queued: immutables.Map
    queue_kinds: immutables.Map
    blocked: frozenset | None
    avoid: immutables.Map
    retry_at: float
    retry_s: float
    now: float
    clock: bool
    suspects: immutables.Map
    deadlines: immutables.Map
    delayed: immutables.Map
    next_deadline: float
    suspect_s: float
    lost: frozenset
    devices: immutables.Map
    cache_budget: immutables.Map
    hot: immutables.Map
    caches: immutables.Map
    evicting: immutables.Map
    no_evict: immutables.Map
    evictable_at: float
    proxies_at: float
    base: Cluster
    changed: bool

    def __init__(self, base: Cluster) -> None:
        self.__dict__["base"] = base
        self.__dict__["changed"] = False

    def __getattr__(self, name: str) -> Any:  # only for fields not set in this step
        value = getattr(self.__dict__["base"], name)
        self.__dict__[name] = value
        return value

    def build(self) -> Cluster:
        if not self.changed:
            return self.base
        d = self.__dict__
        return unchecked_copy(self.base, **{k: v for k, v in d.items() if k != "base" and k != "changed"})

    def suspect(self, node_id: str) -> bool:
        until = self.suspects.get(node_id)
        return until is not None and until > self.now

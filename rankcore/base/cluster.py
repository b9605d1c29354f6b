"""The cluster as the core sees it: nodes, what replicas hold on them, who
waits for room, and the clock. Records only (immutable, persistent maps);
the moves that change them are in ``rankcore/placement/scheduling.py``.

The core places replicas once it knows a node (``NodeJoined``): it is then
*managed*. Until then (``Cluster.managed`` false) it behaves as before the
cluster model existed: ``StartReplica`` alone, and the executor says where the
replica went with ``ReplicaPlaced`` (embedders with a scheduler of their own).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from itertools import pairwise

import attrs
import immutables

__all__ = ["Node", "Cluster", "Need", "SUSPECT_S", "RETRY_S", "clock_work_due", "fits", "packing_gap"]

#: A need or a node's resources: sorted (name, amount) pairs.
Need = tuple[tuple[str, float], ...]

#: How long failed placements keep replicas off their nodes: every failure is
#: forgotten together, this long after the first since the last reset (the
#: clash may have been with something outside the core's books). Needs the
#: clock; without Ticks a node is retried once it reports its capacity again.
RETRY_S = 30.0

#: How long a node where a replica vanished (``ReplicaCrashed.suspect_node``)
#: gets no new replica while another node has room (the Ray controller's rule
#: before it moved here).
SUSPECT_S = 15.0


@attrs.frozen(kw_only=True)
class Node:
    """A live node: its total resources, what is free after the core's
    reservations (may go below zero after a capacity drop), labels, and its
    tie-break order ``(order or inf, join number, node id)``."""

    node_id: str
    resources: immutables.Map
    free: immutables.Map
    labels: tuple[tuple[str, str], ...] = ()
    order: tuple = ()
    #: how many replicas the core has booked on it (``scheduling.adjusted`` counts them): under
    #: ``EveryNode`` a node with any holds a proxy (``rankcore.control.proxies``)
    tenants: int = 0


@attrs.frozen(kw_only=True)
class Cluster:
    """Nodes, reservations, the waiting queue and the clock."""

    #: node id -> Node (live nodes only: a lost node leaves)
    nodes: immutables.Map = attrs.field(factory=immutables.Map)
    #: nodes ever joined (0: unmanaged, the executor places)
    joined: int = 0
    #: replica id -> (node id, need): what the core reserved for it, until it leaves
    held: immutables.Map = attrs.field(factory=immutables.Map)
    #: replicas waiting for room, first come first served (may still name some
    #: that left: ``queued`` is the truth, the next pass drops the others)
    queue: tuple[str, ...] = ()
    #: replica id -> its kind (below), for every replica waiting
    queued: immutables.Map = attrs.field(factory=immutables.Map)
    #: (need, avoided nodes) -> how many queued replicas have it (the pass stops
    #: once every kind has failed to fit)
    queue_kinds: immutables.Map = attrs.field(factory=immutables.Map)
    #: the kinds that did not fit at the last pass, nothing freed since (None: try)
    blocked: frozenset | None = None
    #: replica id -> nodes where its placement failed (avoided until the node
    #: reports its capacity again, or ``retry_s`` on the clock)
    avoid: immutables.Map = attrs.field(factory=immutables.Map)
    #: when the failed placements are forgotten (inf: none to forget)
    retry_at: float = math.inf
    retry_s: float = RETRY_S
    #: the clock: the latest Tick's ``now``; ``clock`` once a Tick came
    now: float = 0.0
    clock: bool = False
    #: node id -> until when it is suspect
    suspects: immutables.Map = attrs.field(factory=immutables.Map)
    #: replica id -> when its deadline falls: its placement or its start times out, or
    #: (in ``delayed``) its restart backoff ends
    deadlines: immutables.Map = attrs.field(factory=immutables.Map)
    #: replica id -> the replica it replaces: a replacement after failed starts, waiting
    #: for its backoff to end before its StartReplica (rankcore.placement.restarts)
    delayed: immutables.Map = attrs.field(factory=immutables.Map)
    #: no deadline falls before this (a lower bound: refreshed when reached)
    next_deadline: float = math.inf
    suspect_s: float = SUSPECT_S
    #: nodes the executor reported lost (and that have not joined again): a late
    #: ReplicaPlaced naming one is a replica that died with its node
    lost: frozenset = frozenset()
    #: GPU memory (rankcore.tiers.devices): node id -> its devices (``tiers.Device``), for nodes
    #: that declared them; node id -> CPU bytes for WARM copies; replica id -> (node id,
    #: ``tiers.Resident``): its weights booked on devices; node id -> its WARM copies
    #: (``tiers.CacheEntry``), in the order they came
    devices: immutables.Map = attrs.field(factory=immutables.Map)
    cache_budget: immutables.Map = attrs.field(factory=immutables.Map)
    hot: immutables.Map = attrs.field(factory=immutables.Map)
    caches: immutables.Map = attrs.field(factory=immutables.Map)
    #: replica id -> the replicas being evicted to make room for it (placed, or woken,
    #: once they are gone); replica id -> None: the replacement of an evicted replica,
    #: which waits for room instead of evicting
    evicting: immutables.Map = attrs.field(factory=immutables.Map)
    no_evict: immutables.Map = attrs.field(factory=immutables.Map)
    #: when a replica too young to be evicted for a waiting one comes of age (the
    #: queue is tried again then; inf: nobody waits for that)
    evictable_at: float = math.inf
    #: when the proxies' earliest deadline falls (``rankcore.control.proxies``: kept here, beside
    #: the replicas' deadlines, so that ``clock_work_due`` sees it; inf: none)
    proxies_at: float = math.inf

    @property
    def managed(self) -> bool:
        """True once a node joined: the core places replicas."""
        return self.joined > 0

    def suspect(self, node_id: str) -> bool:
        until = self.suspects.get(node_id)
        return until is not None and until > self.now


def fits(node: Node, need: Need) -> bool:
    """``need`` fits in what ``node`` has free (the scheduler's and the GPU-memory walk's one test)."""
    free = node.free
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in need)


def clock_work_due(cluster: Cluster, now: float) -> bool:
    """Moving the clock to ``now`` does more than move it: a start deadline or a
    placement retry comes due, or a suspect node is cleared."""
    return (now >= cluster.next_deadline or now >= cluster.retry_at or now >= cluster.evictable_at
            or now >= cluster.proxies_at or (bool(cluster.suspects) and any(t <= now for t in cluster.suspects.values())))


def packing_gap(nodes_by_rank: Sequence[Hashable | None]) -> int:
    """How far a deployment is from rank-packed: the node of each global rank,
    in rank order (None: not placed, skipped) -> the number of times
    consecutive ranks change node beyond the fewest possible (one less than the
    nodes used). 0: every node holds one block of consecutive ranks."""
    placed = [n for n in nodes_by_rank if n is not None]
    if not placed:
        return 0
    changes = sum(1 for a, b in pairwise(placed) if a != b)
    return changes - (len(set(placed)) - 1)

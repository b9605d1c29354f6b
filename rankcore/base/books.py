"""The cluster's books, one replica at a time: a booking taken or given back, a place in the
waiting queue given up, and everything freed when a replica leaves (``release``).

These are the primitives of ``ClusterTx`` that the step's floor needs: a replica's record
removed or replaced (``rankcore.base.transaction.forget`` / ``disarm``) frees what the cluster
held for it, so the freeing sits beneath every plane. What to book, where and when is placement's
(``rankcore.placement.scheduling``) and the tiers' (``rankcore.tiers.devices``).

Internal module: import its public names from ``rankcore`` (docs/embedding.md, "What you may import").
"""

from __future__ import annotations

from typing import Protocol

import immutables

from .cluster import Cluster, Need, Node
from .clustertx import ClusterTx
from .records import updater
from .state import Deployment

__all__ = ["tiered", "host_need", "off_device_nodes", "adjusted", "unbook", "dequeue", "holds_devices", "release_devices", "free_gpus", "release"]

_with_free = updater(Node, "free", "tenants")


class Tx(Protocol):
    """What ``release`` needs of ``rankcore.base.transaction.Tx``."""

    @property
    def cl(self) -> ClusterTx: ...

    @property
    def view(self) -> Cluster | ClusterTx: ...


def tiered(cl: Cluster | ClusterTx, dep: Deployment) -> bool:
    """``dep``'s replicas are booked by memory on device nodes (module docstring):
    a model size, a cluster with device nodes, neither gangs nor static placement
    (whose GPUs are placed whole; their ``model_bytes`` only sizes their moves)."""
    return (dep.config.tier.model_bytes > 0 and bool(cl.devices) and dep.gang_size == 1
            and dep.static is None)


def host_need(dep: Deployment) -> Need:
    """What a tiered replica books besides its GPU memory."""
    return tuple((k, v) for k, v in dep.resources if k != "GPU")


def off_device_nodes(cl: Cluster | ClusterTx, dep: Deployment) -> bool:
    """A deployment that counts GPUs keeps off device nodes (module docstring)."""
    return bool(cl.devices) and not tiered(cl, dep) and any(k == "GPU" for k, _ in dep.resources)


def adjusted(node: Node, need: Need, sign: float) -> Node:
    """``node`` with ``need`` given back (``sign`` 1.0: a booking freed) or taken
    (-1.0): the one primitive every booking change goes through (fast paths too)."""
    free = node.free
    for k, v in need:
        free = free.set(k, free.get(k, 0.0) + sign * v)
    return _with_free(node, free, node.tenants - 1 if sign > 0 else node.tenants + 1)


def unbook(cl: Cluster | ClusterTx, rid: str) -> tuple[immutables.Map, immutables.Map]:
    """The book and the nodes with ``rid``'s booking freed (its node's room given
    back; a node gone gives nothing back). ``rid`` holds a booking."""
    node_id, need = cl.held[rid]
    node = cl.nodes.get(node_id)
    nodes = cl.nodes.set(node_id, adjusted(node, need, 1.0)) if node is not None else cl.nodes
    return cl.held.delete(rid), nodes


def dequeue(cl: ClusterTx, rid: str) -> None:
    """``rid`` waits for a node no more (the id stays in ``queue`` until the next pass skips it)."""
    kind = cl.queued.get(rid)
    if kind is None:
        return
    cl.queued = cl.queued.delete(rid)
    n = cl.queue_kinds[kind] - 1
    cl.queue_kinds = cl.queue_kinds.set(kind, n) if n else cl.queue_kinds.delete(kind)


def holds_devices(cl: Cluster | ClusterTx, rid: str) -> bool:
    """Whether the device books hold anything of ``rid`` (a booking, a wait for victims, a
    no-evict mark): what ``release_devices`` frees when it leaves."""
    return rid in cl.hot or rid in cl.evicting or rid in cl.no_evict


def release_devices(cl: ClusterTx, rid: str) -> None:
    """``rid`` left: its device booking, its wait for victims, its no-evict mark go."""
    free_gpus(cl, rid)
    if rid in cl.evicting:
        cl.evicting = cl.evicting.delete(rid)
    if rid in cl.no_evict:
        cl.no_evict = cl.no_evict.delete(rid)
    cl.changed = True


def free_gpus(cl: ClusterTx, rid: str) -> None:
    """``rid`` is WARM (asleep): its GPU memory is free for others."""
    if rid in cl.hot:
        cl.hot = cl.hot.delete(rid)
        cl.blocked = None
        cl.changed = True


def release(tx: Tx, rid: str) -> None:
    """``rid`` left (stopped, crashed): what the cluster holds for it is freed."""
    seen = tx.view
    if rid not in seen.held and rid not in seen.queued and rid not in seen.deadlines and rid not in seen.avoid \
            and not holds_devices(seen, rid):
        return  # nothing to free (a crash replacement took its booking): no working copy
    cl = tx.cl
    if holds_devices(cl, rid):
        release_devices(cl, rid)
    if rid in cl.held:
        cl.changed = True
        cl.held, nodes = unbook(cl, rid)
        if nodes is not cl.nodes:
            cl.nodes, cl.blocked = nodes, None
    if rid in cl.queued:
        cl.changed = True
        dequeue(cl, rid)
    if rid in cl.deadlines:
        cl.changed = True
        cl.deadlines = cl.deadlines.delete(rid)
        if rid in cl.delayed:
            cl.delayed = cl.delayed.delete(rid)
    if rid in cl.avoid:
        cl.changed = True
        cl.avoid = cl.avoid.delete(rid)

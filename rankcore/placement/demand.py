"""The demand a cluster autoscaler must see: what the core wants room for and cannot place.

Once the core places replicas itself (a node joined), a replica no live node
has room for waits in the core's queue and never becomes anything Ray can
see: Ray Serve's replicas would be pending actors, whose resource shapes Ray's
autoscaler (and KubeRay's) reads as demand; ours are not created before they
have a node. So after every step the core states that demand itself, as a
``RequestResources`` command, and an executor hands it to its autoscaler (Ray:
``ray.autoscaler.sdk.request_resources``; the simulator: nodes that join after
a delay).

The rule, decided once here:

* **waiting**: every replica in the waiting queue at the end of the step (the
  placement pass has run: each one fits no live node's free room now, whether
  the cluster is full or its shape fits no node at all), less those the core
  is already making room for by evicting other models (``Cluster.evicting``):
  exactly what would be Serve's pending actors. A gang member counts as its own
  bundle; a replica waiting out a restart backoff is not queued yet and does not
  count; static placement never waits (the caller's group holds its room).
* **held**: while anything waits, what the core has booked on each live node,
  one bundle per node. ``request_resources`` means "the cluster must fit these
  bundles at once, existing usage included" (its docstring: ask for 100 CPUs
  with 45 in use and nodes are added up to 100, not 145), so asking for the
  waiting bundles alone would fit them into the nodes that are full already and
  add nothing; held + waiting is the cluster's whole need.
* **told when it changes**: ``request_resources`` replaces the previous
  request, so the command carries the full demand each time and is emitted only
  when the demand at the end of a step differs from the demand at its start
  (``()``/``()`` clears it: nothing waits any more, placed or no longer wanted).
  The demand is a function of the cluster record, so no state holds what was
  told. A recovery that reports nodes tells it whatever it is, empty included
  (``tell``): the failed controller's request still stands.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import immutables

from ..base.cluster import Cluster, Need
from ..base.clustertx import ClusterTx
from ..base.commands import RequestResources
from ..base.transaction import Tx

__all__ = ["Demand", "demand", "waiting", "held", "announce", "tell"]

#: (waiting shapes with their counts, held bundles), both sorted: ``RequestResources``' two fields
Demand = tuple[tuple[tuple[Need, int], ...], tuple[Need, ...]]
_NONE: Demand = ((), ())


def waiting(cl: Cluster | ClusterTx) -> tuple[tuple[Need, int], ...]:
    """The shapes of the replicas waiting for room, with how many of each,
    sorted by shape; those the core is evicting for are left out. Read from the
    queue's per-kind counts (a kind's first item is its need): no walk over
    the waiting replicas."""
    kinds = cl.queue_kinds
    if not kinds:
        return ()
    counts: dict[Need, int] = {}
    for kind, n in kinds.items():
        counts[kind[0]] = counts.get(kind[0], 0) + n
    if cl.evicting:
        for rid in cl.evicting:
            kind = cl.queued.get(rid)
            if kind is not None:
                counts[kind[0]] -= 1
    return tuple(sorted((need, n) for need, n in counts.items() if n > 0 and need))


def held(nodes: immutables.Map) -> tuple[Need, ...]:
    """What the core has booked on each live node (its resources less what is
    free, positive amounts only), one bundle per node that holds anything,
    sorted: the room the cluster's replicas already take. A resource a capacity
    drop took from a node whose replicas still hold it (``NodeCapacityChanged``:
    they stay) is counted too: its free amount went below zero there."""
    out = []
    for node in nodes.values():
        total, free = node.resources, node.free
        used = tuple(sorted((k, u) for k in set(total.keys()) | set(free.keys())
                            if (u := total.get(k, 0.0) - free.get(k, 0.0)) > 1e-9))
        if used:
            out.append(used)
    return tuple(sorted(out))


def demand(cl: Cluster | ClusterTx) -> Demand:
    """The demand of cluster ``cl`` (the module's rule): nothing when nothing waits."""
    w = waiting(cl)
    return (w, held(cl.nodes)) if w else _NONE


def announce(tx: Tx) -> None:
    """End-of-step pass: a ``RequestResources`` when the step changed the demand.
    Skipped when the step did not open the cluster's working copy (then neither
    the queue nor any node's room changed)."""
    cl = tx.working
    if cl is None:
        return
    before = tx.cluster
    if not before.queue_kinds and not cl.queue_kinds:
        return  # (the common step: nobody waited, nobody waits)
    w0, w1 = waiting(before), waiting(cl)
    if not w0 and not w1:
        return
    h0 = held(before.nodes) if w0 else ()
    if not w1:
        h1: tuple[Need, ...] = ()
    elif w0 and cl.nodes is before.nodes:
        h1 = h0
    else:
        h1 = held(cl.nodes)
    if (w0, h0) != (w1, h1):
        tx.emit(RequestResources(waiting=w1, held=h1))


def tell(tx: Tx) -> None:
    """The demand pass of a recovery (``passes.finish(retell=True)``): the demand of the
    rebuilt cluster whatever it is, empty included, since the request the failed controller
    made still stands and nothing says what it was. Not when the recovery reports no node:
    that core places nothing, and an executor that knows no nodes has no autoscaler to tell."""
    cl = tx.working if tx.working is not None else tx.cluster
    if not cl.joined:
        return
    w = waiting(cl)
    tx.emit(RequestResources(waiting=w, held=held(cl.nodes)) if w else RequestResources())

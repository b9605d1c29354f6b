"""The end-of-step placement walk: the waiting queue placed, where placement and tiers meet.

Once every release of the step is done (``rankcore.control.passes``, ``place_waiting``), the queue
is walked once, first come, first served: each replica that fits somewhere gets a node by its
deployment's policy (``rankcore.placement.policies.choose_node``), a gang all or nothing
(``choose_gang``), and a model booked by GPU memory by its tier choice (``rankcore.tiers.devices``:
hot here < a WARM copy with room < room < evictions; the evictions it needs are started). The
core books the node (``_reserve``: the cluster's books, its ranks, ``PlaceReplica``) and arms the
placement deadline. The walk stands above both ``placement`` and ``tiers`` (which import neither
each other), as the one rule that needs both; the queue and the bookings it walks are
``rankcore.placement.scheduling``'s.

Internal module: import its public names from ``rankcore`` (docs/embedding.md, "What you may import").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar, cast

from ..base.books import dequeue, host_need, off_device_nodes, tiered
from ..base.cluster import fits
from ..base.clustertx import ClusterTx
from ..base.commands import PlaceReplica
from ..base.errors import InvariantViolation
from ..base.records import maker, updater
from ..base.state import Deployment, Replica
from ..base.transaction import Tx
from ..placement import deadlines
from ..placement.policies import NodeView, choose_gang, choose_node
from ..placement.scheduling import hold
from ..tiers import devices
from ..tiers.choice import Choice, Tier, TierPlacement

__all__ = ["place_waiting"]

_INF = math.inf
_Place = maker(PlaceReplica)  # built from the core's own valid values: no validators
# the copies a placement makes, of the fields it changes (rankcore.base.records)
_with_node = updater(Replica, "node_id")
_with_placed = updater(Deployment, "replicas", "ranks")
_View = maker(NodeView)  # (a node the core holds, as it holds it)


def _views(cl: ClusterTx, dep: Deployment, avoid: tuple, cache: dict | None = None) -> list[NodeView]:
    """Each live node as ``dep``'s placement sees it, except ``avoid``. With
    ``cache`` (one pass over the queue), a node's view is made once per
    deployment and remade only after a reservation there."""
    ranks = dep.ranks
    if cache is None:
        return [_View(node_id=n.node_id, order=n.order, free=n.free, replicas=ranks.replicas_on(n.node_id))
                for n in cl.nodes.values() if n.node_id not in avoid]
    mine = cache.get(dep.name)
    if mine is None:
        mine = cache[dep.name] = {}
    out = []
    for n in cl.nodes.values():
        if n.node_id in avoid:
            continue
        v = mine.get(n.node_id)
        if v is None:
            v = mine[n.node_id] = _View(node_id=n.node_id, order=n.order, free=n.free,
                                        replicas=ranks.replicas_on(n.node_id))
        out.append(v)
    return out


def _choose(cl: ClusterTx, dep: Deployment, rid: str, avoid: tuple, cache: dict | None = None) -> str | None:
    need = dep.resources
    pref = cast("str | None", dep.ranks.preferred_node(rid))  # (the core's nodes are str ids)
    if pref is not None and pref not in avoid and not cl.suspect(pref):
        node = cl.nodes.get(pref)
        if node is not None and fits(node, need):
            return pref  # a crash replacement back where its predecessor ran
    views = _views(cl, dep, avoid, cache)
    rank = rank_nodes = None
    if dep.placement == "rank_packed":
        rank = dep.ranks.global_rank(rid)
        prev = dep.ranks.holder_of(rank - 1) if rank > 0 else None
        prev_node = cast("str | None", dep.ranks.node_of(prev) if prev is not None else None)
        rank_nodes = {rank - 1: prev_node} if prev_node is not None else None
    want = dict(need)
    return _healthy_first(cl, views, lambda vs: choose_node(vs, want, dep.placement, rank=rank,
                                                            rank_nodes=rank_nodes))


_T = TypeVar("_T")


def _healthy_first(cl: ClusterTx, views: list[NodeView], choose: Callable[[list[NodeView]], _T | None]) -> _T | None:
    """``choose`` among the nodes that are not suspect while one of them will
    do, else among all of them (the suspect-node rule)."""
    if cl.suspects:
        healthy = [v for v in views if not cl.suspect(v.node_id)]
        if len(healthy) < len(views):
            chosen = choose(healthy)
            if chosen is not None:
                return chosen
    return choose(views)


def _reserve(tx: Tx, dep: Deployment, rep: Replica, node_id: str, tier: TierPlacement | None = None) -> Deployment:
    rid = rep.replica_id
    ranks = dep.ranks.place(rid, node_id)
    if tier is None:
        hold(tx, rid, node_id, dep.resources)
    else:  # its GPUs by memory, the rest as always (rankcore.tiers.devices)
        hold(tx, rid, node_id, host_need(dep))
        devices.book(tx.cl, dep, rid, node_id, tier.devices)
        if tier.source is Tier.WARM:
            devices.take_cache(tx.cl, dep, node_id)
    dep = _with_placed(dep, dep.replicas.set(rid, _with_node(rep, node_id)), ranks)
    rank = ranks.rank_of(rid)
    if rank is None:
        raise InvariantViolation("a placed replica without a rank record")
    if tier is None:
        tx.emit(_Place(replica_id=rid, deployment=dep.name, node_id=node_id, rank=rank, resources=dep.resources))
    else:
        tx.emit(_Place(replica_id=rid, deployment=dep.name, node_id=node_id, rank=rank,
                       resources=host_need(dep), devices=tier.devices, source=tier.source.value))
    deadlines.placement(tx, dep, rid)
    return dep


def _waiting_gang(cl: ClusterTx, dep: Deployment, rid: str) -> list[str] | None:
    """``rid``'s gang in gang-rank order, when every member waits for a node
    (else None: a lone member re-placed after a failure goes alone)."""
    k = dep.gang_size
    g = dep.ranks.global_rank(rid) // k
    members = [cast("str | None", dep.ranks.holder_of(r)) for r in range(g * k, (g + 1) * k)]
    if all(m is not None and m in cl.queued for m in members):
        return cast("list[str]", members)
    return None


def _choose_gang(cl: ClusterTx, dep: Deployment, members: list[str]) -> list[str] | None:
    """Nodes for a whole gang (``placement.choose_gang``), avoiding where any
    member failed and, while others have room, suspect nodes."""
    avoid = tuple(sorted({n for m in members for n in cl.avoid.get(m, ())}))
    if off_device_nodes(cl, dep):
        avoid = (*avoid, *cl.devices.keys())
    want = dict(dep.resources)
    return _healthy_first(cl, _views(cl, dep, avoid),
                          lambda vs: choose_gang(vs, want, dep.gang_size, dep.gang_placement))


def _place_tiered(tx: Tx, cl: ClusterTx, dep: Deployment, rid: str, avoid: tuple) -> bool:
    """Waiting replica ``rid`` of a model booked by memory (``rankcore.tiers.devices``):
    placed (True), or not (False: no room, even by evicting; or victims chosen
    for it are still draining, in ``Cluster.evicting``). Victims chosen now are
    marked leaving and listed in ``tx.evictions`` for the next pass to evict."""
    victims = cl.evicting.get(rid)
    if victims is not None:
        if any(v in cl.hot for v in victims):
            return False  # still draining
        cl.evicting = cl.evicting.delete(rid)
        node_id, claim = cl.hot[rid]  # its victims are gone: it takes the room it claimed
        source = Tier.WARM if devices.warm_here(cl, dep, node_id) else Tier.COLD
        dequeue(cl, rid)
        tx.put(_reserve(tx, dep, dep.replicas[rid], node_id,
                        TierPlacement(node_id=node_id, choice=Choice.FREE, devices=claim.devices, source=source)))
        return True
    chosen = devices.choose(cl, dep, rid, avoid, devices.stopping(tx))
    if not isinstance(chosen, TierPlacement):
        at = devices.comes_of_age(cl, dep) if cl.clock else _INF
        if at < cl.evictable_at:  # (then a victim may be old enough: a Tick then)
            cl.evictable_at = at
            tx.tick_at(at)
        return False
    if chosen.evict:
        devices.start_evictions(tx, dep, rid, chosen)
        return False
    dequeue(cl, rid)
    tx.put(_reserve(tx, dep, dep.replicas[rid], chosen.node_id, chosen))
    return True


def place_waiting(tx: Tx) -> None:
    """Walk the queue in order; place every replica that fits somewhere. Stops
    early once every kind of need in the queue has failed to fit."""
    cl = tx.cl
    if not cl.queue or cl.blocked is not None:
        return
    cl.changed = True
    failed: set = set()
    unblock = False
    kinds = len(cl.queue_kinds)
    keep: list[str] = []
    queue = cl.queue
    cache: dict[str, dict[str, NodeView]] = {}  # deployment -> node -> view, for this pass
    i = 0
    for i, rid in enumerate(queue):  # noqa: B007 (i is used after the loop)
        kind = cl.queued.get(rid)
        if kind is None:
            continue  # left the queue (placed by the executor, stopped, crashed)
        if len(failed) >= kinds:
            break
        if kind in failed:
            keep.append(rid)
            continue
        name = tx.index[rid]
        dep = tx.deps[name]
        members = _waiting_gang(cl, dep, rid) if dep.gang_size > 1 else None
        if members is not None:  # a whole gang waits: all of it or none
            nodes = _choose_gang(cl, dep, members)
            if nodes is None:
                failed.add(kind)
                keep.append(rid)
                continue
            for member, to in zip(members, nodes):
                dequeue(cl, member)
                dep = _reserve(tx, dep, dep.replicas[member], to)
                for views in cache.values():
                    views.pop(to, None)
            tx.put(dep)
            continue
        if dep.config.tier.model_bytes and cl.devices and tiered(cl, dep):
            claimed = rid in cl.evicting
            if not _place_tiered(tx, cl, dep, rid, kind[1]):
                if rid not in cl.evicting:
                    failed.add(kind)
                keep.append(rid)
                continue
            cache.clear()  # (a node's host room changed)
            if claimed:  # its claim became a replica that may be evicted: those that failed may try again
                unblock = True
            continue
        avoid = (*kind[1], *cl.devices.keys()) if off_device_nodes(cl, dep) else kind[1]
        node_id = _choose(cl, dep, rid, avoid, cache)
        if node_id is None:
            failed.add(kind)
            keep.append(rid)
            continue
        dequeue(cl, rid)
        tx.put(_reserve(tx, dep, dep.replicas[rid], node_id))
        for views in cache.values():  # that node changed (its free room, this deployment's count)
            views.pop(node_id, None)
    else:
        i = len(queue)
    # The rest is kept as it is, not filtered: an id that left is skipped by
    # the next pass (``queued`` is the truth), and filtering here cost a
    # lookup per waiting replica at every pass that placed anyone (bug 8 of
    # issue 19: 20 ms a step at 100,000 waiting).
    cl.queue = (tuple(keep) + queue[i:]) if keep else queue[i:]
    cl.blocked = frozenset(failed) if cl.queued and not unblock else None

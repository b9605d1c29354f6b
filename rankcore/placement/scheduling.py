"""Placement decided by the core: reserve, release, the waiting queue, the clock.

Once the cluster is managed (a node joined), a new replica joins a first
come, first served queue; at the end of every step the queue is walked and
each replica that fits somewhere gets a node by its deployment's policy
(``rankcore.placement.policies.choose_node``): the core reserves its resources,
gives it its node and local ranks, and emits ``PlaceReplica``. The executor
answers ``ReplicaPlaced`` (then InitializeReplica follows) or
``PlacementFailed`` (reservation undone, that node avoided, placed again).

Rules settled here, once for every executor:

* a crash replacement goes back to its predecessor's node when that node is
  alive, not suspect and has room (it then keeps all three ranks);
* a node where a replica vanished (``ReplicaCrashed.suspect_node``) is
  avoided for ``Cluster.suspect_s`` seconds while another node has room;
* a PlaceReplica on a node the core chose owes its answer within the
  deployment's ``placement_timeout_s`` (armed here, ``rankcore.placement.deadlines``).

The step's working copy of the cluster is ``rankcore.base.clustertx.ClusterTx``.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar, cast

import immutables

from ..base.books import adjusted, dequeue, free_gpus
from ..base.cluster import Cluster, Need, Node, fits
from ..base.clustertx import ClusterTx
from ..base.commands import PlaceReplica, ScheduleTick
from ..base.errors import InvariantViolation
from ..base.lifecycle import Phase
from ..base.records import maker, unchecked_copy, updater
from ..base.state import Deployment, Replica
from ..tiers import devices
from ..tiers.choice import Choice, Tier, TierPlacement
from . import deadlines
from .policies import NodeView, choose_gang, choose_node


class Tx(Protocol):
    """What these moves need of ``rankcore.base.transaction.Tx`` (which builds on this module)."""

    @property
    def cl(self) -> ClusterTx: ...

    @property
    def view(self) -> Cluster | ClusterTx: ...

    @property
    def working(self) -> ClusterTx | None: ...

    cluster: Cluster

    deps: immutables.Map
    index: immutables.Map

    def emit(self, cmd: object) -> None: ...

    def put(self, dep: Deployment) -> None: ...

    armed: list[float] | None

    def tick_at(self, at: float) -> None: ...

    evictions: list | None

__all__ = ["ClusterTx", "adopt", "clear_avoid", "requeue_as", "keep_booking", "booking_to_pass", "announce_booking", "enqueue", "rekind", "forget_failures", "place_waiting", "unreserve", "hold", "avoid_node", "new_node"]

_copy = unchecked_copy  # rankcore.base.records: not validated, no per-call introspection
_INF = math.inf
_Place = maker(PlaceReplica)  # built from the core's own valid values: no validators
# the copies a placement makes, of the fields it changes (rankcore.base.records)
_with_node = updater(Replica, "node_id")
_with_placed = updater(Deployment, "replicas", "ranks")
_View = maker(NodeView)  # (a node the core holds, as it holds it)


def new_node(node_id: str, resources: Need, labels: tuple, order: int | None, joined: int) -> Node:
    res = immutables.Map(resources)
    return Node(node_id=node_id, resources=res, free=res, labels=labels,
                order=(order if order is not None else _INF, joined, node_id))


def _kind(cl: ClusterTx, rid: str, need: Need, gang: tuple = ()) -> tuple:
    """Replicas of one kind fit the same nodes: a kind that failed to fit in a
    pass is not tried again in it. A gang member's kind names its gang shape."""
    return (need, cl.avoid.get(rid, ()), *gang)


def enqueue(tx: Tx, dep: Deployment, rids: Iterable[str], front: bool = False) -> None:
    """New (or re-placed) replicas wait for a node, in order."""
    cl = tx.cl
    cl.changed = True
    rids = list(rids)
    gang = (dep.gang_size, dep.gang_placement) if dep.gang_size > 1 else ()
    tiered = bool(dep.config.tier.model_bytes) and dep.gang_size == 1
    if tiered:  # (a model's room depends on who it may evict: one kind per deployment, and whether it may)
        gang = ("tier", dep.name)
    kinds = cl.queue_kinds
    blocked = cl.blocked
    with cl.queued.mutate() as q:
        for rid in rids:
            kind = _kind(cl, rid, dep.resources, (*gang, "no_evict") if tiered and rid in cl.no_evict else gang)
            q.set(rid, kind)
            kinds = kinds.set(kind, kinds.get(kind, 0) + 1)
            if blocked is not None and kind not in blocked:
                blocked = None  # something new to try
        cl.queued = q.finish()
    cl.queue_kinds = kinds
    cl.blocked = blocked
    if front:  # (a placement that failed: the replica waits again, first; an old entry of its id may
        # still be in the queue, left by a pass that placed it from a gang member's place: dropped)
        again = set(rids)
        cl.queue = tuple(rids) + tuple(x for x in cl.queue if x not in again)
    else:
        cl.queue = cl.queue + tuple(rids)


def requeue_as(cl: ClusterTx, rids: list[str], kind_of: Callable[[str, tuple], tuple]) -> None:
    """Give waiting replicas ``rids`` a new kind (``kind_of(rid, old kind)``),
    keeping their places in the queue and the per-kind counts right."""
    if not any(rid in cl.queued for rid in rids):
        cl.changed = True
        return  # nobody waiting changed kind: whatever blocked the queue still does
    kinds = cl.queue_kinds
    with cl.queued.mutate() as q:
        for rid in rids:
            old = q.get(rid)
            if old is None:
                continue
            n = kinds[old] - 1
            kinds = kinds.set(old, n) if n else kinds.delete(old)
            new = kind_of(rid, old)
            q[rid] = new
            kinds = kinds.set(new, kinds.get(new, 0) + 1)
        cl.queued = q.finish()
    cl.queue_kinds = kinds
    cl.blocked = None
    cl.changed = True


def forget_failures(tx: Tx) -> None:
    """``retry_s`` passed since a placement failed: every replica may try every node again."""
    cl = tx.cl
    cl.retry_at = _INF
    failed = list(cl.avoid)
    cl.avoid = immutables.Map()
    requeue_as(cl, failed, lambda rid, old: (old[0], (), *old[2:]))


def clear_avoid(tx: Tx, node_id: str) -> None:
    """``node_id`` reported its capacity: replicas whose placement failed there may try it again."""
    cl = tx.cl
    hit = [rid for rid, nodes in cl.avoid.items() if node_id in nodes]
    if not hit:
        return
    for rid in hit:
        rest = tuple(n for n in cl.avoid[rid] if n != node_id)
        cl.avoid = cl.avoid.set(rid, rest) if rest else cl.avoid.delete(rid)
    requeue_as(cl, hit, lambda rid, old: (old[0], cl.avoid.get(rid, ()), *old[2:]))


def rekind(tx: Tx, dep: Deployment) -> None:
    """``dep``'s resources changed: its waiting replicas now need the new amount
    (they keep their places in the queue)."""
    cl = tx.cl
    mine = [rid for rid in cl.queued if tx.index.get(rid) == dep.name]
    if mine:
        requeue_as(cl, mine, lambda rid, old: _kind(cl, rid, dep.resources, old[2:]))


def adopt(tx: Tx, names: Iterable[str]) -> None:
    """The core places from now on (a first node joined, or a recovery): book
    what each replica of ``names`` holds where it runs, and queue, in
    global-rank order, the pending ones with no node not queued already."""
    for name in names:
        dep = tx.deps[name]
        if dep.static is not None:
            continue  # the caller's group holds its resources; its replicas never wait for a node
        waiting = []
        for rid in dep.ranks:  # global-rank order
            rep = dep.replicas[rid]
            if rep.node_id is not None:
                hold(tx, rid, rep.node_id, devices.host_need(dep) if devices.tiered(tx.cl, dep) else dep.resources)
            elif rep.phase is Phase.PENDING and rid not in tx.cl.queued and rid not in tx.cl.delayed:
                waiting.append(rid)  # (delayed: held for its gang, rankcore.control.moves.hold)
        if waiting:
            enqueue(tx, dep, waiting)


def hold(tx: Tx, rid: str, node_id: str, need: Need) -> None:
    """Book ``need`` on ``node_id`` for ``rid`` (a node the core does not know books nothing)."""
    cl = tx.cl
    cl.changed = True
    node = cl.nodes.get(node_id)
    if node is not None:
        cl.nodes = cl.nodes.set(node_id, adjusted(node, need, -1.0))
    cl.held = cl.held.set(rid, (node_id, need))


def avoid_node(tx: Tx, rid: str, node_id: str) -> None:
    """Keep ``rid`` off ``node_id`` (a placement there failed or timed out) until the node
    reports its capacity again or the failures are forgotten (``retry_s`` on the clock)."""
    cl = tx.cl
    cl.avoid = cl.avoid.set(rid, tuple(sorted({*cl.avoid.get(rid, ()), node_id})))
    cl.blocked = None
    cl.changed = True
    if cl.clock and cl.retry_at == _INF:
        cl.retry_at = cl.now + cl.retry_s
        tx.emit(ScheduleTick(at=cl.retry_at))


def unreserve(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """Undo a reservation the executor could not carry out: the replica keeps
    its global rank, avoids that node, and goes back to the head of the queue."""
    cl = tx.cl
    node_id = rep.node_id
    if node_id is None:
        raise InvariantViolation("a booking without a node")
    held = cl.held.get(rep.replica_id)
    if held is not None:
        cl.held = cl.held.delete(rep.replica_id)
        node = cl.nodes.get(held[0])
        if node is not None:
            cl.nodes = cl.nodes.set(held[0], adjusted(node, held[1], 1.0))
    if rep.replica_id in cl.hot:
        free_gpus(cl, rep.replica_id)  # (its GPU memory too)
    avoid_node(tx, rep.replica_id, node_id)
    dep = _copy(dep, replicas=dep.replicas.set(rep.replica_id, _copy(rep, node_id=None)),
                  ranks=dep.ranks.unplace(rep.replica_id))
    enqueue(tx, dep, [rep.replica_id], front=True)
    return dep


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
        hold(tx, rid, node_id, devices.host_need(dep))
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
                       resources=devices.host_need(dep), devices=tier.devices, source=tier.source.value))
    deadlines.placement(tx, dep, rid)
    return dep


def keep_booking(tx: Tx, dep: Deployment, rid: str, new_id: str) -> tuple[str, Need] | None:
    """A crash replacement goes back where ``rid`` ran (the core's rule: its
    predecessor's node, when up, not suspect and nobody waits): ``rid``'s
    booking passes to ``new_id`` without freeing the node (``announce_booking``
    then tells the executor). None when the rule does not apply.

    The hot path of a managed core: it reads the cluster without opening the
    step's working copy and, when nothing else changes, sets one field."""
    cl = tx.view
    held = booking_to_pass(cl, dep, rid, cl.now)
    if held is None:
        return None
    book = cl.held.delete(rid).set(new_id, held)
    if tx.working is not None:
        tx.working.held = book
        tx.working.changed = True
    else:
        tx.cluster = _copy(tx.cluster, held=book)
    return held


def booking_to_pass(cl: Cluster | ClusterTx, dep: Deployment, rid: str, now: float) -> tuple[str, Need] | None:
    """``rid``'s booking (node, need) when the rule of ``keep_booking`` lets it
    pass to a crash replacement at time ``now``: nobody waits, the need is
    unchanged, the node is up, not suspect and not over-committed; else None."""
    held = cl.held.get(rid)
    if held is None or cl.queued or held[1] != dep.resources or rid in cl.hot:
        return None  # (a replica booked by memory is placed again like anyone: rankcore.tiers.devices)
    node_id, need = held
    node = cl.nodes.get(node_id)
    if node is None:
        return None
    if cl.suspects:
        until = cl.suspects.get(node_id)
        if until is not None and until > now:
            return None
    free = node.free
    for k, _ in need:
        if free.get(k, 0.0) < -1e-9:
            return None  # an over-committed node: the replacement must fit like anyone else
    return held


def announce_booking(tx: Tx, dep: Deployment, rid: str, node_id: str) -> None:
    """Crash replacement ``rid``, born on its predecessor's node on the booking
    it left (its record and ranks say so already): PlaceReplica."""
    rank = dep.ranks.rank_of(rid)
    if rank is None:
        raise InvariantViolation("a placed replica without a rank record")
    tx.emit(_Place(replica_id=rid, deployment=dep.name, node_id=node_id, rank=rank, resources=dep.resources))
    deadlines.placement(tx, dep, rid)


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
    if devices.off_device_nodes(cl, dep):
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
        if dep.config.tier.model_bytes and cl.devices and devices.tiered(cl, dep):
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
        avoid = (*kind[1], *cl.devices.keys()) if devices.off_device_nodes(cl, dep) else kind[1]
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

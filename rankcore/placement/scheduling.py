"""Placement decided by the core: reserve, release, the waiting queue, the clock.

Once the cluster is managed (a node joined), a new replica joins a first
come, first served queue; at the end of every step the queue is walked
(``rankcore.control.placing``, above this plane and the tiers) and each replica
that fits somewhere gets a node by its deployment's policy: the core reserves its
resources, gives it its node and local ranks, and emits ``PlaceReplica``. The executor
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

import immutables

from ..base.books import adjusted, free_gpus, host_need, tiered
from ..base.cluster import Cluster, Need, Node
from ..base.clustertx import ClusterTx
from ..base.commands import PlaceReplica, ScheduleTick
from ..base.errors import InvariantViolation
from ..base.lifecycle import Phase
from ..base.records import maker, unchecked_copy
from ..base.state import Deployment, Replica
from ..base.transaction import Tx
from . import deadlines

__all__ = ["ClusterTx", "adopt", "clear_avoid", "requeue_as", "keep_booking", "booking_to_pass", "announce_booking", "enqueue", "rekind", "forget_failures", "unreserve", "hold", "avoid_node", "new_node"]

_copy = unchecked_copy  # rankcore.base.records: not validated, no per-call introspection
_INF = math.inf
_Place = maker(PlaceReplica)  # built from the core's own valid values: no validators


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
                hold(tx, rid, rep.node_id, host_need(dep) if tiered(tx.cl, dep) else dep.resources)
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

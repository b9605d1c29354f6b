"""The moves every deployment makes: start, stop, reconcile, crash, a delayed
start, and the compaction of its ranks.

Each returns the next ``Deployment`` and emits its commands in order. What
differs for static placement is asked of ``rankcore.placement.static`` (its bundles,
FAILED ranks); a gang deployment starts and stops like any other here, whole
gangs being the caller's count (``rankcore.placement.gangs`` restarts a gang and tells
its members). Rank rules: new replicas take the lowest free ranks, a crash
replacement takes its predecessor's global rank, a downscale stops named
victims first, then replicas not yet running, then the highest ranks
(``rankcore.base.victims.VICTIM_ORDER``), and a healthy deployment with holes in
its ranks is compacted once (``compaction_due``, the end-of-step pass).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Iterable

from ..base.commands import StartReplica, UpdateWorldSize
from ..base.lifecycle import LIVE, Phase, Trigger, advance
from ..base.records import maker, unchecked_copy
from ..base.state import Compaction, Deployment, Replica
from ..base.victims import VICTIM_ORDER
from ..placement import static
from ..placement.scheduling import announce_booking, avoid_node, enqueue, keep_booking, release
from . import restarts
from .transaction import Tx, reconfigure, recount, remove, stop_command, succeed, wants_successor

__all__ = ["start", "stop", "reconcile", "scale", "crash", "succeed_retired", "start_delayed", "compaction_due", "compact", "compact_touched"]

_copy = unchecked_copy  # rankcore.base.records: not validated, no per-call introspection
_IDX = {p: i for i, p in enumerate(LIVE)}
_Replica, _Start = maker(Replica), maker(StartReplica)


def start(tx: Tx, dep: Deployment, n: int) -> Deployment:
    """Start ``n`` new replicas on the lowest free ranks (static placement: each
    on its rank's bundles, or FAILED while they are not placed; a managed
    cluster: into the waiting queue, placed by the end-of-step pass)."""
    ids = tx.new_ids(dep.name, n)
    ranks = dep.ranks.assign_many([(rid, None) for rid in ids])
    lineages = {rid: tx.new_lineage() for rid in ids}
    failed = static.start_failed(dep, ((rid, ranks.global_rank(rid)) for rid in ids)) \
        if dep.static is not None else set()
    with dep.replicas.mutate() as m:
        for rid in ids:
            m.set(rid, _Replica(replica_id=rid, deployment=dep.name,
                                phase=Phase.FAILED if rid in failed else Phase.PENDING, lineage=lineages[rid],
                                revision=dep.revision))
        replicas = m.finish()
    with tx.index.mutate() as ix:
        for rid in ids:
            ix.set(rid, dep.name)
        tx.index = ix.finish()
    for rid in ids:
        if rid not in failed:
            tx.emit(_Start(replica_id=rid, deployment=dep.name, global_rank=ranks.global_rank(rid),
                           world_size=dep.target, lineage=lineages[rid], revision=dep.revision))
    c = list(dep.counts)
    c[_IDX[Phase.PENDING]] += n - len(failed)
    c[_IDX[Phase.FAILED]] += len(failed)
    dep = _copy(dep, replicas=replicas, ranks=ranks, counts=tuple(c))
    if dep.static is not None:
        for rid in ids:
            if rid not in failed:
                dep = static.place(tx, dep, rid)
        return dep
    if dep.gang_size > 1:
        tx.gang_started(dep.name)
    if tx.managed:
        enqueue(tx, dep, ids)
    return dep


def _victims(dep: Deployment, n: int, victims: Iterable[str]) -> list[str]:
    """Who a downscale by ``n`` stops: named victims first, then not-yet-running,
    then highest ranks (a gang deployment: the highest ranks, whole gangs)."""
    chosen = [v for v in victims if dep.replicas[v].phase is not Phase.STOPPING][:n]
    if len(chosen) >= n:
        return chosen
    ranks = dep.ranks
    if dep.gang_size > 1:
        top = sorted(((ranks.global_rank(r.replica_id), r.replica_id) for r in dep.replicas.values()
                      if r.phase is not Phase.STOPPING), reverse=True)
        chosen.extend(rid for _, rid in top[: n - len(chosen)])
        return chosen
    taken = set(chosen)
    candidates = sorted(
        (VICTIM_ORDER[r.phase], -ranks.global_rank(r.replica_id), r.replica_id)
        for r in dep.replicas.values()
        if r.phase is not Phase.STOPPING and r.replica_id not in taken
    )
    chosen.extend(c[2] for c in candidates[: n - len(chosen)])
    return chosen


def stop(tx: Tx, dep: Deployment, n: int, victims: Iterable[str] = ()) -> Deployment:
    """Stop ``n`` replicas (``_victims``); one with no process (FAILED, or
    waiting out its restart backoff) is simply removed."""
    chosen = _victims(dep, n, victims)
    delayed = tx.view.delayed
    for rid in [r for r in chosen if dep.replicas[r].phase is Phase.FAILED or r in delayed]:  # no process to stop
        dep = remove(tx, dep, dep.replicas[rid], dep.ranks.release(rid))
    chosen = [r for r in chosen if r in dep.replicas]
    replicas, counts = dep.replicas, dep.counts
    for rid in chosen:
        rep = replicas[rid]
        if tx.managed and rep.node_id is None and rid in tx.cl.queued:
            release(tx, rid)  # it was waiting for a node: it waits no more
        new = _copy(rep, phase=advance(rep.phase, Trigger.STOP, rid))
        replicas = replicas.set(rid, new)
        counts = recount(counts, rep.phase, new.phase)
        tx.emit(stop_command(dep, rid))
    return _copy(dep, replicas=replicas, counts=counts)


def reconcile(tx: Tx, dep: Deployment, victims: Iterable[str] = ()) -> Deployment:
    """Start or stop replicas until as many are active as the target."""
    active = dep.active
    if active < dep.target:
        if dep.unresponsive:  # it may hold any free rank: none is given until it has stopped (rankcore.control.recovery)
            return dep
        return start(tx, dep, dep.target - active)
    if active > dep.target:
        return stop(tx, dep, active - dep.target, victims)
    return dep


def scale(tx: Tx, dep: Deployment, n: int, victims: Iterable[str] = ()) -> Deployment:
    """A new target, announced at once (``UpdateWorldSize``), then ``reconcile``: the one path of a
    person's ``ScaleRequested`` and of the autoscaler's decisions (``rankcore.control.autoscaling``)."""
    if n != dep.target:
        dep = _copy(dep, target=n)
        tx.emit(UpdateWorldSize(deployment=dep.name, world_size=n))
    return reconcile(tx, dep, victims)


def crash(tx: Tx, dep: Deployment, rep: Replica, avoid: str | None = None) -> Deployment:
    """A replica died: its replacement takes its global rank (unless it was
    leaving), after the restart backoff when its starts keep failing
    (``rankcore.control.restarts``), back on its predecessor's node and booking when
    the core's rule lets it (``scheduling.keep_booking``); ``avoid``: a node
    the replacement must not go to."""
    if rep.retiring:  # a rollout was stopping it: its successor starts now
        return succeed_retired(tx, dep, rep)
    if dep.static is not None:
        return static.crash(tx, dep, rep)
    advance(rep.phase, Trigger.CRASH, rep.replica_id)
    rid = rep.replica_id
    if rep.phase is Phase.STOPPING:  # it was leaving anyway: no replacement
        return remove(tx, dep, rep, dep.ranks.release(rid))
    delay = restarts.backoff_s(dep) if tx.view.clock else 0.0
    return _replace(tx, dep, rep, delay, avoid)


def _replace(tx: Tx, dep: Deployment, rep: Replica, delay: float = 0.0, avoid: str | None = None) -> Deployment:
    """``rep``'s successor on its global rank (``succeed``): held back ``delay`` seconds (the restart
    backoff), else back on its node and booking when the core's rule lets it (``keep_booking``; not
    when it must ``avoid`` that node), else into the waiting queue (a managed cluster)."""
    rid = rep.replica_id
    managed = tx.managed
    (new_id,) = tx.new_ids(dep.name, 1)
    if managed and (delay > 0 or avoid is not None):
        release(tx, rid)  # its room is free while the replacement waits, or it goes elsewhere
    booking = keep_booking(tx, dep, rid, new_id) if managed and delay == 0 and avoid is None else None
    node_id = booking[0] if booking is not None else None
    dep = succeed(tx, dep, rep, new_id, node_id, announce=delay == 0)
    if delay > 0:
        restarts.defer(tx, new_id, rid, tx.view.now + delay)
    elif node_id is not None:  # back on its predecessor's node, on the same booking
        announce_booking(tx, dep, new_id, node_id)
    elif managed:
        if avoid is not None:
            avoid_node(tx, new_id, avoid)
        enqueue(tx, dep, [new_id])  # placed by the end-of-step pass, once every release of this step is done
    if dep.gang_size > 1:
        tx.gang_started(dep.name)
    return dep


def succeed_retired(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """A replica a rollout retired (``rankcore.control.rollouts``) has stopped or died: its
    successor, on the current revision, takes its three ranks as a crash's replacement would (its
    bundles under static placement; its node and booking where the core places replicas and its
    rule lets the booking pass, else the queue), with no restart backoff (nothing failed). None
    when the deployment no longer wants it (deleted, scaled down meanwhile): it just leaves."""
    if dep.static is not None:
        return static.succeed_retired(tx, dep, rep)
    if not wants_successor(dep):
        return remove(tx, dep, rep, dep.ranks.release(rep.replica_id))
    return _replace(tx, dep, rep)  # (no restart backoff: nothing failed)


def start_delayed(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """Replacement ``rep`` waited out its restart backoff (``rankcore.control.restarts``):
    its StartReplica now, then a node: its bundles (static placement), or the
    queue (a gang's members come due together and are placed whole)."""
    tx.emit(restarts.release(tx, dep, rep))
    if dep.static is not None:
        return static.place(tx, dep, rep.replica_id)
    if dep.gang_size > 1:
        tx.gang_started(dep.name)
    if tx.managed:
        enqueue(tx, dep, [rep.replica_id])
    return dep


def compaction_due(dep: Deployment) -> bool:
    """The rank rule's trigger: a healthy deployment with holes in its ranks (O(1))."""
    return dep.healthy and not dep.ranks.is_contiguous()


def compact(tx: Tx, dep: Deployment) -> Deployment:
    """Close the holes in ``dep``'s ranks (``RankTable.compact``: the fewest moves);
    every replica whose rank changed is reconfigured with its new one."""
    bound = dep.ranks.lower_bound()
    ranks, changes = dep.ranks.compact()
    tx.compactions.append(Compaction(deployment=dep.name, lower_bound=bound, changes=changes))
    dep = _copy(dep, ranks=ranks)
    replicas, counts = dep.replicas, dep.counts
    for change in changes:  # ordered by new global rank
        rep = replicas[change.replica]
        new, cmd = reconfigure(dep, rep, "rank")
        replicas = replicas.set(new.replica_id, new)
        counts = recount(counts, rep.phase, new.phase)
        tx.emit(cmd)
    return _copy(dep, replicas=replicas, counts=counts)


def compact_touched(tx: Tx) -> None:
    """End of step: compact each deployment this step touched whose compaction is due."""
    for name in sorted(tx.touched):
        dep = tx.deps.get(name)
        if dep is not None and compaction_due(dep):
            tx.put(compact(tx, dep))


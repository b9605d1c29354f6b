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

import math
from collections.abc import Iterable

from ..base.books import release
from ..base.cluster import fits
from ..base.commands import StartReplica, UpdateWorldSize
from ..base.errors import InvalidConfig, InvalidEvent
from ..base.fields import shown
from ..base.gangmap import gang_ranks
from ..base.lifecycle import INITIAL, LIVE, Phase, Trigger, advance
from ..base.ranks import RankTable
from ..base.records import maker, unchecked_copy
from ..base.state import Compaction, Deployment, Replica
from ..base.transaction import (
    Tx,
    by_rank,
    reconfigure,
    recount,
    remove,
    stop_command,
    succeed,
    successor,
    wants_successor,
)
from ..base.victims import VICTIM_ORDER
from ..placement import deadlines, gangs, restarts, static
from ..placement.gangs import held, is_held
from ..placement.scheduling import announce_booking, avoid_node, enqueue, keep_booking
from ..placement.scheduling import hold as book

__all__ = ["start", "stop", "reconcile", "check_scale", "retell_ranks", "scale", "fail", "restart_together", "crash", "start_beside", "start_elsewhere", "succeed_retired", "start_delayed", "compaction_due", "compact",
           "compact_touched", "waits_in", "hold", "hold_waiting_gangs",
           "start_waiting"]

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
                                phase=advance(INITIAL, Trigger.BUNDLE_LOST, rid) if rid in failed else INITIAL,
                                lineage=lineages[rid],
                                revision=dep.revision))
        replicas = m.finish()
    with tx.index.mutate() as ix:
        for rid in ids:
            ix.set(rid, dep.name)
        tx.index = ix.finish()
    waits = _gangs_retiring(dep, ranks, ids) if (dep.rolling or dep.retiring) and dep.gang_size > 1 and dep.static is None \
        else set()
    for rid in ids:
        if rid in waits:
            hold(tx, rid, None)  # (its gang is being retired: it starts with the gang's successors)
        elif rid not in failed:
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
        enqueue(tx, dep, [rid for rid in ids if rid not in waits])
    return dep


def _gangs_retiring(dep: Deployment, ranks: RankTable, ids: list[str]) -> set[str]:
    """Those of new replicas ``ids`` (ranked in ``ranks``) whose gang has a member retiring."""
    k = dep.gang_size
    return {rid for rid in ids if waits_in(dep, ranks.global_rank(rid) // k)}


def _victims(dep: Deployment, n: int, victims: Iterable[str]) -> list[str]:
    """Who a downscale by ``n`` stops: named victims first, then not-yet-running,
    then highest ranks (a gang deployment: the highest ranks, whole gangs)."""
    chosen = [v for v in victims if dep.replicas[v].phase is not Phase.STOPPING][:n]
    if len(chosen) >= n:
        return chosen
    ranks = dep.ranks
    if dep.gang_size > 1:
        # whole gangs from the top, until the members they count towards the target (``active``: a
        # retiring one too, which leaves with no successor: ``stop``) reach ``n``; their members not
        # stopping already are stopped. Counting members not stopping instead reached into the gang
        # below when a top gang's member was retiring; taking every gang at or above the target
        # instead stopped them all when replicas still stopping held the low ranks (a scale to 0,
        # then up to 4 and down to 2: the new gangs ranked 2-5 all went, and none came back).
        k, taken, counted = dep.gang_size, set(chosen), len(chosen)
        by_gang: dict[int, list[tuple[int, str, bool]]] = {}
        for r in dep.replicas.values():
            rid = r.replica_id
            if rid in taken or r.blue_ranks is not None or (r.phase is Phase.STOPPING and not r.retiring):
                continue
            rank = ranks.global_rank(rid)
            by_gang.setdefault(rank // k, []).append((rank, rid, r.phase is not Phase.STOPPING))
        for g in sorted(by_gang, reverse=True):
            if counted >= n:
                break
            counted += len(by_gang[g])
            chosen.extend(rid for _, rid, live in sorted(by_gang[g], reverse=True) if live)
        return chosen
    taken = set(chosen)
    candidates = sorted(
        (VICTIM_ORDER[r.phase], -ranks.global_rank(r.replica_id), r.replica_id)
        for r in dep.replicas.values()
        if r.phase is not Phase.STOPPING and r.replica_id not in taken
    )
    chosen.extend(c[2] for c in candidates[: n - len(chosen)])
    return chosen


def _leave_above_target(dep: Deployment) -> Deployment:
    """A gang deployment's members a rollout is retiring at or above the target leave with no
    successor (no longer ``retiring``, so no longer counted active): the gang they were in is gone
    whole, and a lower gang's retiring member still gets its successor (``wants_successor``)."""
    if dep.gang_size <= 1 or not dep.retiring:
        return dep
    replicas, left = dep.replicas, 0
    for rid, rep in dep.replicas.items():
        if rep.retiring and dep.ranks.global_rank(rid) >= dep.target:
            replicas, left = replicas.set(rid, _copy(rep, retiring=False)), left + 1
    return _copy(dep, replicas=replicas, retiring=dep.retiring - left) if left else dep


def stop(tx: Tx, dep: Deployment, n: int, victims: Iterable[str] = ()) -> Deployment:
    """Stop ``n`` replicas (``_victims``); one with no process (FAILED, or
    waiting out its restart backoff) is simply removed."""
    chosen = _victims(dep, n, victims)
    dep = _leave_above_target(dep)
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


def retell_ranks(tx: Tx, dep: Deployment, retell: Iterable[Replica]) -> Deployment:
    """The serving replicas of ``retell`` told the ranks they hold now (a blue given back other ranks
    than it was told, ``bluegreen.call_off``): one reconfigure each, in rank order, carrying the new
    user_config too. The other serving replicas get a new user_config a few at a time
    (``configs.pace_touched``, the end-of-step pass: at most ``max_unavailable`` at once)."""
    told = {r.replica_id for r in retell}
    serving = [r for r in dep.replicas.values() if r.phase in (Phase.RUNNING, Phase.RECONFIGURING)
               and r.blue_ranks is None and r.replica_id in told]
    return _tell_ranks(tx, dep, by_rank(dep, serving))


def _tell_ranks(tx: Tx, dep: Deployment, reps: Iterable[Replica]) -> Deployment:
    """One reconfigure of each of ``reps``, in their order, carrying the rank it holds in ``dep``."""
    replicas, counts = dep.replicas, dep.counts
    for rep in reps:
        new, cmd = reconfigure(dep, rep, "rank")
        replicas = replicas.set(new.replica_id, new)
        counts = recount(counts, rep.phase, new.phase)
        tx.emit(cmd)
    return _copy(dep, replicas=replicas, counts=counts)


def check_scale(dep: Deployment, n: int, victims: Iterable[str] = ()) -> None:
    """A ``ScaleRequested`` to ``n`` naming ``victims`` refused before anything moves: ``n`` above
    ``max_replicas`` (``InvalidConfig``), a victim not a live replica or already stopping, or more
    victims than the scale stops (``InvalidEvent``). (Gangs' and static placement's own checks are
    theirs: ``gangs.check_scale``, ``static.check_scale``.)"""
    if n > dep.max_replicas:
        raise InvalidConfig(
            f"ScaleRequested({dep.name!r}).num_replicas={shown(n)} is above the deployment's "
            f"max_replicas={dep.max_replicas} (raise it with DeploymentApplied.max_replicas if you mean it)"
        )
    victims = tuple(victims)
    for v in victims:
        rep = dep.replicas.get(v)
        if rep is None:
            raise InvalidEvent(f"ScaleRequested: victim {v!r} is not a live replica of {dep.name!r}")
        if rep.phase is Phase.STOPPING:
            raise InvalidEvent(f"ScaleRequested: victim {v!r} is already stopping")
    if victims and len(victims) > dep.active - n:
        raise InvalidEvent(
            f"ScaleRequested: {len(victims)} victims named, but scaling {dep.name!r} "
            f"from {dep.active} to {shown(n)} stops {max(dep.active - n, 0)}"
        )


def scale(tx: Tx, dep: Deployment, n: int, victims: Iterable[str] = ()) -> Deployment:
    """A new target, announced at once (``UpdateWorldSize``), then ``reconcile``: the one path of a
    person's ``ScaleRequested`` and of the autoscaler's decisions (``rankcore.control.autoscaling``)."""
    if n != dep.target:
        dep = _copy(dep, target=n)
        tx.emit(UpdateWorldSize(deployment=dep.name, world_size=n))
    return reconcile(tx, dep, victims)


def fail(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """A replica died (a crash, a start timeout, its node lost, failed health checks): the one entry
    for a death. Whoever dies with it (its gang, ``gangs.restarted_with``) is stopped and each is
    replaced (``crash``), walking down from here: ``crash`` asks static placement
    (``static.crash``) and the books beneath, none of which calls back up."""
    members = gangs.restarted_with(tx, dep, rep)
    return crash(tx, dep, rep) if members is None else restart_together(tx, dep, members)


def restart_together(tx: Tx, dep: Deployment, members: Iterable[tuple[Replica, bool]]) -> Deployment:
    """Gang members restarted together, in the order given: each one alive is stopped at once
    (``alive``), and each is replaced on its rank (``crash``)."""
    for member, alive in members:
        if alive:
            tx.emit(stop_command(dep, member.replica_id, now=True))
        dep = crash(tx, dep, member)
    return dep


def crash(tx: Tx, dep: Deployment, rep: Replica, avoid: str | None = None) -> Deployment:
    """A replica died: its replacement takes its global rank (unless it was
    leaving), after the restart backoff when its starts keep failing
    (``rankcore.placement.restarts``), back on its predecessor's node and booking when
    the core's rule lets it (``scheduling.keep_booking``); ``avoid``: a node
    the replacement must not go to."""
    if rep.retiring:  # a rollout was stopping it: its successor starts now
        return succeed_retired(tx, dep, rep)
    if dep.static is not None:
        return static.crash(tx, dep, rep)
    advance(rep.phase, Trigger.CRASH, rep.replica_id)
    rid = rep.replica_id
    if rep.phase is Phase.STOPPING or rep.blue_ranks is not None:
        # it was leaving anyway, or is a blue-green's blue, whose green holds its ranks: no replacement
        return remove(tx, dep, rep, dep.ranks.release(rid))
    delay = restarts.backoff_s(dep) if tx.view.clock else 0.0
    return _replace(tx, dep, rep, delay, avoid)


def _replace(tx: Tx, dep: Deployment, rep: Replica, delay: float = 0.0, avoid: str | None = None) -> Deployment:
    """``rep``'s successor on its global rank (``succeed``): held back ``delay`` seconds (the restart
    backoff), else back on its node and booking when the core's rule lets it (``keep_booking``; not
    when it must ``avoid`` that node), else into the waiting queue (a managed cluster)."""
    rid = rep.replica_id
    managed = tx.managed
    if dep.gang_size > 1 and (dep.rolling or dep.retiring or rep.retiring):  # (static gangs do not roll: not here)
        g = dep.ranks.global_rank(rid) // dep.gang_size
        if waits_in(dep, g, but=rid) or held(tx, dep, g):
            return _succeed_in_gang(tx, dep, rep, g)
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


def start_beside(tx: Tx, dep: Deployment, rep: Replica) -> Deployment | None:
    """Serving ``rep`` is stopped with a drain and its successor starts at once, in this step, on
    its three ranks and on its node (``_drain_into``), booked beside it (``rep``'s booking is held
    until it has stopped), so this needs room on that node, not suspect, with nobody waiting for a
    node longer. None where it cannot (``_drainable``, or no room there): the caller's other rule
    applies. A rollout's surge (``rankcore.control.rollouts.surge``) and an unhealthy replica's
    drain (``rankcore.control.health``) are its two callers."""
    if not _drainable(tx, dep, rep):
        return None
    node_id = rep.node_id
    cl = tx.view
    node = cl.nodes.get(node_id) if node_id is not None else None
    if node is None or cl.suspect(node_id) or not fits(node, dep.resources) or cl.queued:  # type: ignore[arg-type]
        return None  # (no room there, or a replica waits for a node longer: first come, as bluegreen.twin)
    return _drain_into(tx, dep, rep, node_id)


def start_elsewhere(tx: Tx, dep: Deployment, rep: Replica) -> Deployment | None:
    """``start_beside`` where ``rep``'s node has no room for its successor: its successor takes its
    three ranks as a crash's replacement with no node would (its node and ranks kept as a
    preference) and waits for a node (the queue): placed by the end-of-step pass where there is
    room, or once ``rep``'s drain has freed its own (``_drain_into``). Ray Serve's order for an
    unhealthy replica: a graceful stop, its replacement scheduled wherever it fits. None where
    ``_drainable`` says no, or for a replica on no node."""
    if not _drainable(tx, dep, rep) or rep.node_id is None:
        return None
    return _drain_into(tx, dep, rep, None)


def _drainable(tx: Tx, dep: Deployment, rep: Replica) -> bool:
    """Whether ``rep`` may drain while its successor starts: a running replica (a reconfigure in
    flight carries its rank: it goes the plain way, keeping it) of a deployment the core places on
    its cluster (``Tx.managed``), not a gang, not static, not a model booked by GPU memory (placed by
    the tiers' rule: ``rankcore.tiers.devices``)."""
    return (rep.phase is Phase.RUNNING and tx.managed and dep.gang_size <= 1 and dep.static is None
            and not dep.config.tier.model_bytes)


def _drain_into(tx: Tx, dep: Deployment, rep: Replica, node_id: str | None) -> Deployment:
    """``rep`` stopped with a drain, its successor on its three ranks: the successor takes ``rep``'s
    place in the rank table and its lineage, on ``node_id`` (booked there) or, None, waiting for a
    node; ``rep`` keeps a spare entry for the rest of its drain (the lowest free global rank, and
    a local rank beside its successor's on ``node_id``; none with no node, so that its node and
    local ranks stay its successor's preference), so every live replica still holds ranks of its
    own: it is not told (it takes no new call) and leaves as any stopping replica does."""
    rid = rep.replica_id
    (new_id,) = tx.new_ids(dep.name, 1)
    if node_id is not None:
        ranks = dep.ranks.replace(rid, new_id, node_id).assign(rid, node_id)
    else:
        ranks = dep.ranks.replace(rid, new_id).assign(rid)
    old = _copy(rep, phase=advance(rep.phase, Trigger.STOP, rid), lineage=tx.new_lineage())
    tx.emit(stop_command(dep, rid))
    new = successor(tx, dep, rep, new_id, node_id, ranks)
    counts = recount(recount(dep.counts, rep.phase, old.phase), None, Phase.PENDING)
    dep = _copy(dep, replicas=dep.replicas.set(rid, old).set(new_id, new), ranks=ranks, counts=counts)
    if node_id is not None:
        book(tx, new_id, node_id, dep.resources)
        announce_booking(tx, dep, new_id, node_id)
    else:
        enqueue(tx, dep, [new_id])  # (placed by the end-of-step pass, once every release of this step is done)
    return dep


def waits_in(dep: Deployment, g: int, but: str | None = None) -> bool:
    """Whether a new member of gang ``g`` must wait (``hold``) for the others: one of them (other than
    ``but``) is retiring (a rollout stopping it), or runs on an older revision and will be retired
    (a gap in a gang still on the old code: the new member would make it half-new)."""
    ranks, replicas = dep.ranks, dep.replicas
    for r in gang_ranks(g, dep.gang_size):
        rid = ranks.holder_of(r)
        if rid is None or rid == but:
            continue
        rep = replicas[rid]
        if rep.retiring or (rep.revision != dep.revision and rep.phase is not Phase.STOPPING):
            return True
    return False


def hold(tx: Tx, rid: str, replaces: str | None) -> None:
    """New member ``rid`` (PENDING, no node, its rank held) waits for its gang's retiring members to
    stop: no StartReplica yet. Kept as a restart backoff with no end (``Cluster.delayed``, deadline
    inf): it has no process (a stop removes it, a rollout makes it current) and no Tick releases it;
    ``_start_gang`` does, with the rest of its gang."""
    cl = tx.cl
    cl.delayed = cl.delayed.set(rid, replaces)
    cl.deadlines = cl.deadlines.set(rid, math.inf)
    cl.changed = True


def hold_waiting_gangs(tx: Tx, dep: Deployment) -> None:
    """After a recovery: a gang member reported pending with no node while a member of its gang is
    retiring is held (``hold``) rather than placed alone (a report cannot say it was held)."""
    if dep.gang_size <= 1 or not (dep.rolling or dep.retiring) or dep.static is not None:
        return
    k = dep.gang_size
    for rid, rep in dep.replicas.items():
        if rep.phase is Phase.PENDING and rep.node_id is None and not rep.retiring \
                and waits_in(dep, dep.ranks.global_rank(rid) // k) and rid not in tx.view.delayed:
            if tx.managed and rid in tx.view.queued:
                release(tx, rid)
            hold(tx, rid, None)


def start_waiting(tx: Tx, dep: Deployment) -> Deployment:
    """Start each gang of ``dep`` whose held members wait for nothing any more (the members they
    waited for left by another way than a retirement: a downscale, a restart, a recovery)."""
    cl = tx.view
    k = dep.gang_size
    gangs = sorted({dep.ranks.global_rank(rid) // k for rid in cl.delayed
                    if rid in dep.replicas and is_held(cl, rid)})
    for g in gangs:
        if not waits_in(dep, g):
            dep = _start_gang(tx, dep, g)
    return dep


def _succeed_in_gang(tx: Tx, dep: Deployment, rep: Replica, g: int) -> Deployment:
    """``rep`` left while its gang is being retired: its successor takes its global rank and waits
    (``hold``); once no member of the gang is retiring any more, the whole new gang starts."""
    rid = rep.replica_id
    (new_id,) = tx.new_ids(dep.name, 1)
    dep = succeed(tx, dep, rep, new_id, None, announce=False)  # (its booking freed: the gang is placed whole)
    hold(tx, new_id, rid)
    return dep if waits_in(dep, g) else _start_gang(tx, dep, g)


def _start_gang(tx: Tx, dep: Deployment, g: int) -> Deployment:
    """No member of gang ``g`` is retiring any more: every held member starts now, on the current
    revision (a rollback meanwhile included), in rank order, and (the core placing) waits for a node
    with the others, so the end-of-step pass places the gang whole; ``gangs.tell`` gives each
    StartReplica the new gang's members."""
    members = held(tx, dep, g)
    if not members:
        return dep
    cl = tx.cl
    for rid in members:
        rep = dep.replicas[rid]
        if rep.revision != dep.revision:  # (no process yet: it starts current)
            rep = _copy(rep, revision=dep.revision)
            dep = _copy(dep, replicas=dep.replicas.set(rid, rep))
        cl.deadlines, cl.next_deadline = deadlines.disarm(cl, rid)
        tx.emit(restarts.release(tx, dep, rep))
    tx.gang_started(dep.name)
    if tx.managed:
        enqueue(tx, dep, members)
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
        g = dep.ranks.global_rank(rep.replica_id) // dep.gang_size
        dep = remove(tx, dep, rep, dep.ranks.release(rep.replica_id))
        if dep.gang_size > 1 and not waits_in(dep, g):
            dep = _start_gang(tx, dep, g)  # (members held for it and still wanted start now)
        return dep
    return _replace(tx, dep, rep)  # (no restart backoff: nothing failed; a gang's: rankcore.control.rollouts)


def start_delayed(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """Replacement ``rep`` waited out its restart backoff (``rankcore.placement.restarts``):
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
    every replica whose rank changed is reconfigured with its new one, except, under
    ``rank_moves="restart"``, one whose global rank moved: its code cannot follow the move, so
    it is stopped and a new replica starts on its new ranks (``restart_together``: back on its
    node and booking when the rule lets it)."""
    bound = dep.ranks.lower_bound()
    ranks, changes = dep.ranks.compact()
    tx.compactions.append(Compaction(deployment=dep.name, lower_bound=bound, changes=changes))
    dep = _copy(dep, ranks=ranks)
    if dep.rank_moves == "restart":
        moved = [dep.replicas[c.replica] for c in changes if c.old.rank != c.new.rank]
        dep = _tell_ranks(tx, dep, [dep.replicas[c.replica] for c in changes if c.old.rank == c.new.rank])
        return restart_together(tx, dep, [(rep, True) for rep in moved])
    return _tell_ranks(tx, dep, [dep.replicas[change.replica] for change in changes])  # (by new global rank)


def compact_touched(tx: Tx) -> None:
    """End of step: compact each deployment this step touched whose compaction is due."""
    for name in sorted(tx.touched):
        dep = tx.deps.get(name)
        if dep is not None and compaction_due(dep):
            tx.put(compact(tx, dep))


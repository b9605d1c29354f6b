"""The commonest answers, stepped without a transaction.

A week of a 64-replica fleet is ~3,900 steps; nine in ten are a replica
reporting it was placed, is ready, crashed or stopped, almost always in the
plainest case: on the node the core reserved, nobody waiting for room, no
deadline coming due, no gang or static placement. For those cases these
functions build the step directly (a few record copies) instead of opening a
``Tx`` and a working copy of the cluster; anything else returns None and
``core.step`` takes the general path (``core.general_step``).

They are an optimisation only: the property suite steps every event both
ways and requires the same ``Step`` (``tests/property/test_fast_paths.py``),
so a rule changed in the handlers and not here fails there.
"""

from __future__ import annotations

import math
from typing import Any

from .cluster import Cluster, clock_work_due
from .commands import PlaceReplica, ScheduleTick, StartReplica
from .events import ReplicaCrashed, ReplicaPlaced, ReplicaReady, ReplicaStopped
from .lifecycle import Phase
from .records import copier, maker
from .scheduling import _adjust
from .state import Deployment, Replica, State, Step, parse_replica_number, replica_id
from .transaction import initialize, put_replica, recount

__all__ = ["FAST_PATHS", "placed", "ready", "crashed", "stopped"]

_PENDING, _STARTING, _RUNNING, _STOPPING = Phase.PENDING, Phase.STARTING, Phase.RUNNING, Phase.STOPPING
_Step, _Replica, _Start, _Place = maker(Step), maker(Replica), maker(StartReplica), maker(PlaceReplica)
_Tick = maker(ScheduleTick)
_copy_state, _copy_cluster, _copy_replica = copier(State), copier(Cluster), copier(Replica)
_copy_deployment = copier(Deployment)


def _plain(state: State, rid: str) -> tuple[str, Deployment, Replica, Cluster] | None:
    """The replica's deployment name, deployment, record and the cluster, when
    no placement pass could run in this step (nobody waits, or all that waits
    is blocked); None otherwise (or for a replica the core does not hold)."""
    name = state.index.get(rid)
    if name is None:
        return None
    cl = state.cluster
    if cl.queue and cl.blocked is None:
        return None
    dep = state.deployments[name]
    return name, dep, dep.replicas[rid], cl


def _clock_to(cl: Cluster, now: float | None) -> dict[str, Any] | None:
    """The cluster fields an answer's ``now`` changes ({} when the clock does
    not move); None when moving it brings work due (a Tick's step first)."""
    if now is None or (cl.clock and now <= cl.now):
        return {}
    if clock_work_due(cl, now):
        return None
    return {"now": float(now), "clock": True}


def ready(state: State, e: ReplicaReady) -> Step | None:
    """A starting replica is ready and owes nothing (no config or rank update
    due): it runs, its start deadline goes. None when the deployment becomes
    healthy with holes in its ranks (a compaction is due)."""
    rid = e.replica_id
    found = _plain(state, rid)
    if found is None:
        return None
    name, dep, rep, cl = found
    if rep.phase is not _STARTING or rep.rank_update_due or rep.config_version < dep.config_version:
        return None
    dep = put_replica(dep, rep, _copy_replica(rep, phase=_RUNNING))
    if dep.healthy and not dep.ranks.is_contiguous():
        return None
    deadlines = cl.deadlines
    if deadlines and rid in deadlines:
        at = deadlines[rid]
        deadlines = deadlines.delete(rid)
        if at <= cl.next_deadline:  # it was the earliest
            cl = _copy_cluster(cl, deadlines=deadlines, next_deadline=min(deadlines.values(), default=math.inf))
        else:
            cl = _copy_cluster(cl, deadlines=deadlines)
    return _Step(state=_copy_state(state, deployments=state.deployments.set(name, dep), cluster=cl),
                 commands=(), stale=False, compactions=(), recovery=None)


def placed(state: State, e: ReplicaPlaced) -> Step | None:
    """A pending replica landed on the node the core reserved for it: it
    starts (InitializeReplica), and its start deadline is armed when the core
    has a clock. None when the answer's clock brings other work due."""
    rid = e.replica_id
    found = _plain(state, rid)
    if found is None:
        return None
    name, dep, rep, cl = found
    if rep.phase is not _PENDING or rep.node_id != e.node_id or rep.node_id is None:
        return None
    changes = _clock_to(cl, e.now)
    if changes is None:
        return None
    dep = put_replica(dep, rep, _copy_replica(rep, phase=_STARTING, config_version=dep.config_version))
    init = initialize(dep, rid)
    commands: tuple[Any, ...] = (init,)
    timeout = dep.start_timeout_s
    if (changes or cl.clock) and timeout is not None:  # the start deadline, on the clock as moved
        at = changes.get("now", cl.now) + timeout
        changes["deadlines"] = cl.deadlines.set(rid, at)
        changes["next_deadline"] = min(cl.next_deadline, at)
        commands = (init, _Tick(at=at))
    if changes:
        cl = _copy_cluster(cl, **changes)  # one copy: the clock and the deadline
    return _Step(state=_copy_state(state, deployments=state.deployments.set(name, dep), cluster=cl),
                 commands=commands, stale=False, compactions=(), recovery=None)


def crashed(state: State, e: ReplicaCrashed) -> Step | None:
    """A running (or starting) replica crashed and its booking can pass to its
    replacement (the core's rule, ``scheduling.keep_booking``: its node is up,
    not suspect, not over-committed, and nobody waits): the replacement takes
    its ranks on the same node (StartReplica, PlaceReplica). None otherwise
    (gangs, static placement, a suspect node, anyone waiting, ...)."""
    if e.suspect_node:
        return None
    rid = e.replica_id
    found = _plain(state, rid)
    if found is None:
        return None
    name, dep, rep, cl = found
    phase = rep.phase
    if (phase is not _RUNNING and phase is not _STARTING) or dep.gang_size > 1 or dep.static is not None:
        return None
    if cl.queued or rid in cl.avoid or rid in cl.deadlines or parse_replica_number(rid) is None:
        return None
    held = cl.held.get(rid)
    if held is None or held[1] != dep.resources:
        return None
    node_id, need = held
    node = cl.nodes.get(node_id)
    if node is None:
        return None
    changes = _clock_to(cl, e.now)
    if changes is None:
        return None
    if cl.suspects:
        until = cl.suspects.get(node_id)
        if until is not None and until > changes.get("now", cl.now):
            return None
    free = node.free
    for k, _ in need:
        if free.get(k, 0.0) < -1e-9:
            return None  # over-committed: the replacement must fit like anyone else
    new_id = replica_id(name, state.next_replica)
    cl = _copy_cluster(cl, held=cl.held.delete(rid).set(new_id, held), **changes)  # one copy: clock and booking
    ranks = dep.ranks.replace(rid, new_id, node_id)
    new = _Replica(replica_id=new_id, deployment=name, phase=_PENDING, lineage=rep.lineage, node_id=node_id)
    dep = _copy_deployment(dep, replicas=dep.replicas.delete(rid).set(new_id, new), ranks=ranks,
                           counts=recount(dep.counts, phase, _PENDING))
    rank = ranks.rank_of(new_id)
    commands = (
        _Start(replica_id=new_id, deployment=name, global_rank=rank.rank, world_size=dep.target,  # type: ignore[union-attr]
               replaces=rid, lineage=rep.lineage),
        _Place(replica_id=new_id, deployment=name, node_id=node_id, rank=rank, resources=dep.resources),
    )
    return _Step(state=_copy_state(state, deployments=state.deployments.set(name, dep), cluster=cl,
                                   index=state.index.delete(rid).set(new_id, name),
                                   next_replica=state.next_replica + 1),
                 commands=commands, stale=False, compactions=(), recovery=None)


def stopped(state: State, e: ReplicaStopped) -> Step | None:
    """A replica being stopped has stopped: it leaves (ranks, index, its
    booking freed). None when anyone waits for room (the freed room is
    offered), for gangs and static placement, and when the deployment becomes
    healthy with holes in its ranks (a compaction is due)."""
    rid = e.replica_id
    found = _plain(state, rid)
    if found is None:
        return None
    name, dep, rep, cl = found
    if cl.queue or rep.phase is not _STOPPING or dep.gang_size > 1 or dep.static is not None:
        return None  # (the room it frees would be offered to whoever waits)
    if rid in cl.deadlines or rid in cl.avoid or parse_replica_number(rid) is None:
        return None
    ranks = dep.ranks.release(rid)
    dep = _copy_deployment(dep, replicas=dep.replicas.delete(rid), ranks=ranks,
                           counts=recount(dep.counts, _STOPPING, None))
    if dep.healthy and not ranks.is_contiguous():
        return None
    held = cl.held.get(rid) if cl.joined > 0 else None
    if held is not None:  # the core's book: what it held for the replica is free again
        node_id, need = held
        node = cl.nodes.get(node_id)
        if node is None:
            cl = _copy_cluster(cl, held=cl.held.delete(rid))
        else:
            cl = _copy_cluster(cl, held=cl.held.delete(rid), nodes=cl.nodes.set(node_id, _adjust(node, need, 1.0)),
                               blocked=None)
    return _Step(state=_copy_state(state, deployments=state.deployments.set(name, dep), cluster=cl,
                                   index=state.index.delete(rid)),
                 commands=(), stale=False, compactions=(), recovery=None)


#: event type -> its fast path (None from it: take the general path)
FAST_PATHS: dict[type, Any] = {ReplicaReady: ready, ReplicaPlaced: placed, ReplicaCrashed: crashed,
                               ReplicaStopped: stopped}

"""The two commonest answers, stepped without a transaction.

A week of a 64-replica fleet is ~3,900 steps, two thirds of them a replica
reporting it was placed or is ready, almost always in the plainest case: on
the node the core reserved, nobody waiting for room, no deadline coming due.
For those cases these functions build the step directly (a few record copies)
instead of opening a ``Tx`` and a working copy of the cluster; anything else
returns None and ``core.step`` takes the general path
(``core.general_step``).

They are an optimisation only: the property suite steps every event both
ways and requires the same ``Step`` (``tests/property/test_fast_paths.py``),
so a rule changed in the handlers and not here fails there.
"""

from __future__ import annotations

import math
from typing import Any

from .cluster import Cluster, clock_work_due
from .commands import ScheduleTick
from .events import ReplicaPlaced, ReplicaReady
from .lifecycle import Phase
from .records import copier, maker
from .state import Deployment, Replica, State, Step
from .transaction import initialize, put_replica

__all__ = ["FAST_PATHS", "placed", "ready"]

_PENDING, _STARTING, _RUNNING = Phase.PENDING, Phase.STARTING, Phase.RUNNING
_Step = maker(Step)
_copy_state, _copy_cluster, _copy_replica = copier(State), copier(Cluster), copier(Replica)


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
    now = e.now
    if now is not None and (not cl.clock or now > cl.now):
        if clock_work_due(cl, now):
            return None
        cl = _copy_cluster(cl, now=float(now), clock=True)
    dep = put_replica(dep, rep, _copy_replica(rep, phase=_STARTING, config_version=dep.config_version))
    init = initialize(dep, rid)
    commands: tuple[Any, ...] = (init,)
    timeout = dep.start_timeout_s
    if cl.clock and timeout is not None:
        at = cl.now + timeout
        cl = _copy_cluster(cl, deadlines=cl.deadlines.set(rid, at), next_deadline=min(cl.next_deadline, at))
        commands = (init, ScheduleTick(at=at))
    return _Step(state=_copy_state(state, deployments=state.deployments.set(name, dep), cluster=cl),
                 commands=commands, stale=False, compactions=(), recovery=None)


#: event type -> its fast path (None from it: take the general path)
FAST_PATHS: dict[type, Any] = {ReplicaReady: ready, ReplicaPlaced: placed}

"""The commonest answers, stepped without a transaction.

A week of a 64-replica fleet is ~3,900 steps; nine in ten are a replica
reporting it was placed, is ready, crashed or stopped, almost always in the
plainest case: on the node the core reserved, nobody waiting for room, no
deadline coming due, no gang or static placement. For those cases these
functions build the step directly (a few record copies) instead of opening a
``Tx`` and a working copy of the cluster; anything else returns None and
``core.step`` takes the general path (``core.general_step``).

They are an optimisation only, and restate no rule: each decision is asked
of the function the handlers ask (``restarts.started`` / ``failed_start`` /
``backoff_s``, ``moves.compaction_due``, ``deadlines.start_timeout`` /
``placement_timeout`` / ``with_deadline`` / ``disarm``,
``scheduling.booking_to_pass`` / ``unbook``, ``spares.asks``, ``configs.settled``); what is left
here is only which cases are plain enough to build without a ``Tx``. The
property suite steps every event both ways and requires the same ``Step``
(``tests/property/test_fast_paths.py``).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from typing import Any

from .base.books import holds_devices, unbook
from .base.cluster import Cluster, clock_work_due
from .base.commands import PlaceReplica, ScheduleTick, StartReplica
from .base.events import ReplicaCrashed, ReplicaPlaced, ReplicaReady, ReplicaStopped
from .base.lifecycle import TABLE, Phase, Trigger
from .base.records import maker, updater
from .base.state import Deployment, Replica, State, Step, parse_replica_number, replica_id
from .base.transaction import initialize, put_replica, recount
from .base.unhealthy import settled
from .control import configs
from .control.moves import compaction_due
from .control.pool import answer_pool
from .placement import deadlines, restarts, spares
from .placement.scheduling import booking_to_pass
from .tiers import residency

__all__ = ["FAST_PATHS", "placed", "ready", "crashed", "stopped"]

_PENDING, _STARTING, _RUNNING, _STOPPING = Phase.PENDING, Phase.STARTING, Phase.RUNNING, Phase.STOPPING
# the phases the fast paths write, read off the lifecycle table once (the general handlers ask ``advance``)
_PLACED, _READY = TABLE[_PENDING, Trigger.PLACED], TABLE[_STARTING, Trigger.READY]
_Step, _Replica, _Start, _Place = maker(Step), maker(Replica), maker(StartReplica), maker(PlaceReplica)
_Tick = maker(ScheduleTick)
# each copy a step makes, as an updater of the fields it changes (rankcore.base.records)
_with_phase, _with_phase_version = updater(Replica, "phase"), updater(Replica, "phase", "config_version")
_with_ranks = updater(Deployment, "replicas", "ranks", "counts")
_with_dep = updater(State, "deployments", "cluster")
_with_dep_index = updater(State, "deployments", "cluster", "index")
_with_dep_new = updater(State, "deployments", "cluster", "index", "next_replica")
_with_clock = updater(Cluster, "now", "clock")
_with_deadlines = updater(Cluster, "deadlines", "next_deadline")
_with_clock_deadlines = updater(Cluster, "now", "clock", "deadlines", "next_deadline")
_with_held = updater(Cluster, "held")
_with_held_clock = updater(Cluster, "held", "now", "clock")
_with_held_clock_deadlines = updater(Cluster, "held", "now", "clock", "deadlines", "next_deadline")
_with_held_nodes = updater(Cluster, "held", "nodes", "blocked")


def _done(rid: str, after: State, commands: tuple, dep0: Deployment, rep0: Replica, dep1: Deployment,
          rep1: Replica | None) -> Step:
    """The fast path's ``Step`` to ``after``, with the pool commands of ``rid``'s answer
    (``pool.answer_pool``: the rule's own comparison, from the deployment and record before and
    after, which the fast path holds; asked here so the step is built once)."""
    return _Step(state=after, commands=commands, stale=False, compactions=(), recovery=None,
                 pool=answer_pool(rid, dep0, rep0, dep1, rep1))


def _plain(state: State, rid: str) -> tuple[str, Deployment, Replica, Cluster] | None:
    """The replica's deployment name, deployment, record and the cluster, when
    no placement pass could run in this step (nobody waits, or all that waits
    is blocked) and its deployment is not being deleted; None otherwise (or
    for a replica the core does not hold)."""
    name = state.index.get(rid)
    if name is None:
        return None
    cl = state.cluster
    if cl.queue and cl.blocked is None:
        return None
    dep = state.deployments[name]
    if dep.deleting or dep.rolling or dep.collective_group or not configs.settled(dep):
        return None  # (its record may go in this step: rankcore.control.deletion's end-of-step pass; a rollout's
        # pass; a collective group's: rankcore.control.groups; a new user_config still reaching replicas:
        # rankcore.control.configs's pass)
    return name, dep, dep.replicas[rid], cl


def _moves_clock(cl: Cluster, now: float | None) -> bool | None:
    """Whether an answer's ``now`` moves the clock; None when moving it
    brings work due (a Tick's step first)."""
    if now is None or (cl.clock and now <= cl.now):
        return False
    if clock_work_due(cl, now):
        return None
    return True


def ready(state: State, e: ReplicaReady) -> Step | None:
    """A starting replica is ready and owes nothing (no config or rank update
    due): it runs, its start deadline goes. None when the deployment becomes
    healthy with holes in its ranks (a compaction is due)."""
    rid = e.replica_id
    found = _plain(state, rid)
    if found is None:
        return None
    name, dep0, rep, cl = found
    if rep.phase is not _STARTING or rep.rank_update_due or rep.config_version < dep0.config_version:
        return None
    new = _with_phase(rep, _READY)
    if not residency.quiet(dep0, new):
        return None  # (new weights or a sleep due)
    dep = put_replica(restarts.started(dep0), rep, new)
    if compaction_due(dep):
        return None
    if cl.deadlines and rid in cl.deadlines:
        cl = _with_deadlines(cl, *deadlines.disarm(cl, rid))
    dep = settled(dep)  # (healthy again: no longer UNHEALTHY for a replica that died, as Tx.put)
    return _done(rid, _with_dep(state, state.deployments.set(name, dep), cl), (), dep0, rep, dep, new)


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
    if residency.at_start(dep, rep) is not rep:
        return None  # (its record takes the version InitializeReplica carries)
    moved = _moves_clock(cl, e.now)
    if moved is None:
        return None
    dep = put_replica(dep, rep, _with_phase_version(rep, _PLACED, dep.config_version))
    init = initialize(dep, rid)
    commands: tuple[Any, ...] = (init,)
    timeout = deadlines.start_timeout(dep)
    now = float(e.now) if moved else cl.now  # type: ignore[arg-type]
    book, nxt = deadlines.disarm(cl, rid) if rid in cl.deadlines else (cl.deadlines, cl.next_deadline)  # in time
    if (moved or cl.clock) and timeout is not None:  # the start deadline, on the clock as moved
        at = now + timeout
        cl = _with_clock_deadlines(cl, now, True, *deadlines.with_deadline(book, nxt, rid, at))
        commands = (init, _Tick(at=at))
    elif book is not cl.deadlines:
        cl = _with_clock_deadlines(cl, now, cl.clock or moved, book, nxt)
    elif moved:
        cl = _with_clock(cl, now, True)
    # (pending to starting: in no pool before or after, ``pool.membership``'s GONE both times, so the
    # answer moves nothing in any pool: no ``answer_pool`` to ask)
    dep = settled(dep)  # (healthy again: no longer UNHEALTHY for a replica that died, as Tx.put)
    return _Step(state=_with_dep(state, state.deployments.set(name, dep), cl), commands=commands, stale=False,
                 compactions=(), recovery=None, pool=())


def crashed(state: State, e: ReplicaCrashed) -> Step | None:
    """A running (or starting) replica crashed and its booking can pass to its
    replacement (the core's rule, ``scheduling.keep_booking``: its node is up,
    not suspect, not over-committed, and nobody waits): the replacement takes
    its ranks on the same node (StartReplica, PlaceReplica). None otherwise
    (gangs, static placement, a suspect node, anyone waiting, ...)."""
    if e.cause == "exited":
        return None  # (its node becomes suspect)
    rid = e.replica_id
    found = _plain(state, rid)
    if found is None:
        return None
    name, dep0, rep, cl = found
    phase = rep.phase
    if (phase is not _RUNNING and phase is not _STARTING) or dep0.gang_size > 1 or dep0.static is not None:
        return None  # (gangs, static placement)
    dep = restarts.failed_start(dep0, rep, e.cause, e.reason)
    if restarts.backoff_s(dep) > 0:
        return None  # (the replacement waits out a restart backoff)
    if rid in cl.avoid or rid in cl.deadlines or parse_replica_number(rid) is None:
        return None
    moved = _moves_clock(cl, e.now)
    if moved is None:
        return None
    now = float(e.now) if moved else cl.now  # type: ignore[arg-type]
    held = booking_to_pass(cl, dep, rid, now)  # (the clock as the answer moves it)
    if held is None:
        return None
    node_id = held[0]
    new_id = replica_id(name, state.next_replica)
    book = cl.held.delete(rid).set(new_id, held)
    timeout = deadlines.placement_timeout(dep)
    at = now + timeout if (cl.clock or moved) and timeout is not None else None  # (deadlines.placement)
    if at is not None:  # one copy: booking, clock and the placement deadline
        cl = _with_held_clock_deadlines(cl, book, now, True,
                                        *deadlines.with_deadline(cl.deadlines, cl.next_deadline, new_id, at))
    else:
        cl = _with_held_clock(cl, book, now, True) if moved else _with_held(cl, book)  # one copy: clock and booking
    ranks = dep.ranks.replace(rid, new_id, node_id)
    new = _Replica(replica_id=new_id, deployment=name, phase=_PENDING, lineage=rep.lineage, node_id=node_id,
                   revision=dep.revision)
    dep = _with_ranks(dep, dep.replicas.delete(rid).set(new_id, new), ranks, recount(dep.counts, phase, _PENDING))
    rank = ranks.rank_of(new_id)
    commands: tuple[Any, ...] = (
        _Start(replica_id=new_id, deployment=name, global_rank=rank.rank, world_size=dep.target,  # type: ignore[union-attr]
               replaces=rid, lineage=rep.lineage, revision=dep.revision),
        _Place(replica_id=new_id, deployment=name, node_id=node_id, rank=rank, resources=dep.resources),
    )
    if at is not None:
        commands = (*commands, _Tick(at=at))
    dep = settled(dep)  # (healthy again: no longer UNHEALTHY for a replica that died, as Tx.put)
    return _done(rid, _with_dep_new(state, state.deployments.set(name, dep), cl,
                                    state.index.delete(rid).set(new_id, name), state.next_replica + 1),
                 commands, dep0, rep, dep, None)


def stopped(state: State, e: ReplicaStopped) -> Step | None:
    """A replica being stopped has stopped: it leaves (ranks, index, its
    booking freed). None when anyone waits for room (the freed room is
    offered), for gangs and static placement, and when the deployment becomes
    healthy with holes in its ranks (a compaction is due)."""
    rid = e.replica_id
    found = _plain(state, rid)
    if found is None:
        return None
    name, dep0, rep, cl = found
    if (cl.queue or rep.phase is not _STOPPING or dep0.gang_size > 1 or dep0.static is not None
            or spares.asks(dep0) or cl.evicting or holds_devices(cl, rid)):
        return None  # (the room it frees would be offered to whoever waits; its node may be left: rankcore.placement.spares;
        # what the device books hold of it is the general path's to release)
    if rid in cl.deadlines or rid in cl.avoid or parse_replica_number(rid) is None:
        return None
    moved = _moves_clock(cl, e.now)
    if moved is None:
        return None
    ranks = dep0.ranks.release(rid)
    dep = _with_ranks(dep0, dep0.replicas.delete(rid), ranks, recount(dep0.counts, _STOPPING, None))
    if compaction_due(dep):
        return None
    if cl.joined > 0 and rid in cl.held:  # the core's book: what it held for the replica is free again
        book, nodes = unbook(cl, rid)
        if state.proxies.options is not None and nodes is not cl.nodes and not nodes[cl.held[rid][0]].tenants:
            return None  # (its node holds no replica now: its proxy may drain, rankcore.control.proxies)
        cl = _with_held(cl, book) if nodes is cl.nodes else _with_held_nodes(cl, book, nodes, None)
    if moved:
        cl = _with_clock(cl, float(e.now), True)  # type: ignore[arg-type]
    dep = settled(dep)  # (healthy again: no longer UNHEALTHY for a replica that died, as Tx.put)
    return _done(rid, _with_dep_index(state, state.deployments.set(name, dep), cl, state.index.delete(rid)), (),
                 dep0, rep, dep, None)


#: event type -> its fast path (None from it: take the general path)
FAST_PATHS: dict[type, Any] = {ReplicaReady: ready, ReplicaPlaced: placed, ReplicaCrashed: crashed,
                               ReplicaStopped: stopped}

"""The step machinery every handler shares (``core.py``'s and ``recovery.py``'s):
``Tx``, one step's work in progress, and the moves that build a step from it
(start, stop, crash, remove, reconfigure, compact), each returning the next
``Deployment`` and emitting its commands in order. A module of its own so the
event handlers and the recovery rebuild both stand on it without importing
each other's private helpers.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import immutables

from . import restarts, spares
from .cluster import Cluster
from .commands import (
    GangChanged,
    InitializeReplica,
    PlaceReplica,
    ReconfigureReplica,
    ScheduleTick,
    StartReplica,
    StopReplica,
)
from .errors import InvalidEvent, InvariantViolation
from .fields import shown
from .gangs import GangContext, gang_id, gang_ranks
from .lifecycle import LIVE, Phase, Trigger, advance
from .policies import VICTIM_ORDER
from .records import copier, maker, unchecked_copy, updater
from .scheduling import (
    ClusterTx,
    announce_booking,
    arm_deadlines,
    avoid_node,
    enqueue,
    keep_booking,
    place_waiting,
    release,
)
from .state import (
    Compaction,
    Deployment,
    RecoveryOutcome,
    Replica,
    State,
    Step,
    parse_replica_number,
    replica_id,
)

__all__ = [
    "Tx", "recount", "put_replica", "initialize", "stop_command", "reconfigure", "start", "stop", "reconcile", "remove",
    "crash", "compact", "by_rank", "fail_member", "fail_static", "restart_failed", "place_static", "start_delayed",
    "restart_incomplete_gangs",
]

_IDX = {p: i for i, p in enumerate(LIVE)}
_copy = unchecked_copy  # rankcore.records: not validated, no per-call introspection
# The records and commands a step builds from values it already holds valid,
# made without re-running their validators (rankcore.records.maker).
_State, _Step, _Replica = maker(State), maker(Step), maker(Replica)
_Start, _Place, _Init = maker(StartReplica), maker(PlaceReplica), maker(InitializeReplica)
_Reconfigure, _Stop = maker(ReconfigureReplica), maker(StopReplica)


class Tx:
    """One step's work in progress: the state being built and the commands."""

    __slots__ = ("deps", "index", "next_replica", "next_lineage", "retired", "commands", "touched", "compactions",
                 "cluster", "_cl", "gangs", "ticks", "initial")

    def __init__(self, state: State) -> None:
        self.cluster = state.cluster
        self._cl: ClusterTx | None = None
        self.deps: immutables.Map = state.deployments
        self.initial: immutables.Map = state.deployments  # as the step found them (end-of-step passes compare)
        self.index: immutables.Map = state.index
        self.next_replica = state.next_replica
        self.next_lineage = state.next_lineage
        self.retired: immutables.Map = state.retired
        self.commands: list = []
        self.touched: set[str] = set()
        self.compactions: list[Compaction] = []
        self.gangs: set[str] | None = None  # gang deployments that started replicas this step
        self.ticks: set[float] | None = None  # the ScheduleTick times asked for this step (``tick_at``)

    @property
    def cl(self) -> ClusterTx:
        """The step's working copy of the cluster (made on first use)."""
        if self._cl is None:
            self._cl = ClusterTx(self.cluster)
        return self._cl

    @property
    def working(self) -> ClusterTx | None:
        """The working copy of the cluster if the step opened one."""
        return self._cl

    @property
    def view(self) -> Cluster | ClusterTx:
        """The cluster as this step has it so far, to read without opening a working copy."""
        return self._cl if self._cl is not None else self.cluster

    @property
    def managed(self) -> bool:
        return (self._cl.joined if self._cl is not None else self.cluster.joined) > 0

    def dep(self, name: str) -> Deployment:
        try:
            return self.deps[name]
        except KeyError:
            raise InvalidEvent(f"unknown deployment {name!r}") from None

    def put(self, dep: Deployment) -> None:
        self.deps = self.deps.set(dep.name, dep)
        self.touched.add(dep.name)

    def tick_at(self, at: float) -> None:
        """Ask for a Tick at ``at``, once per step (a gang's members backing off
        together, a deadline due and a backoff begun in the same step)."""
        ticks = self.ticks
        if ticks is None:
            ticks = self.ticks = {c.at for c in self.commands if type(c) is ScheduleTick}
        if at not in ticks:
            ticks.add(at)
            self.emit(ScheduleTick(at=at))

    def emit(self, cmd: object) -> None:
        self.commands.append(cmd)

    def new_ids(self, name: str, n: int) -> list[str]:
        start = self.next_replica
        self.next_replica += n
        return [replica_id(name, i) for i in range(start, start + n)]

    def new_lineage(self) -> int:
        self.next_lineage += 1
        return self.next_lineage - 1

    def lookup(self, rid: str) -> tuple[Deployment, Replica] | None:
        """The replica's deployment and record; None if it is stale."""
        name = self.index.get(rid)
        if name is None:
            n = parse_replica_number(rid)
            ours = n is not None and n < self.next_replica and rid.rpartition("#")[0] in self.deps
            if ours or rid in self.retired:
                return None
            raise InvalidEvent(f"unknown replica {shown(rid)}: the core never started it")
        dep = self.deps[name]
        return dep, dep.replicas[rid]

    def finish(self, stale: bool = False, recovery: RecoveryOutcome | None = None) -> Step:
        if self._cl is not None:
            place_waiting(self)
        if (self._cl.clock if self._cl is not None else self.cluster.clock) and self.commands:
            arm_deadlines(self, self.commands)
        cluster = self._cl.build() if self._cl is not None else self.cluster
        if self.gangs:
            _tell_gangs(self)
        for name in sorted(self.touched):
            dep = self.deps.get(name)
            if dep is not None and dep.healthy and not dep.ranks.is_contiguous():  # O(1)
                self.put(compact(self, dep))
        spares.announce(self)
        state = _State(
            deployments=self.deps,
            index=self.index,
            next_replica=self.next_replica,
            next_lineage=self.next_lineage,
            retired=self.retired,
            cluster=cluster,
        )
        return _Step(
            state=state, commands=tuple(self.commands), stale=stale, compactions=tuple(self.compactions),
            recovery=recovery,
        )


# ---------------------------------------------------------------- helpers
def recount(counts: tuple[int, ...], old: Phase | None, new: Phase | None) -> tuple[int, ...]:
    """``counts`` with one replica moved from phase ``old`` to ``new`` (None,
    or a phase not counted live: none)."""
    c = list(counts)
    if old is not None:
        c[_IDX[old]] -= 1
    i = _IDX.get(new)  # type: ignore[arg-type]
    if i is not None:
        c[i] += 1
    return tuple(c)


_copy_deployment, _with_replica = copier(Deployment), updater(Deployment, "replicas", "counts")


def put_replica(dep: Deployment, old: Replica, new: Replica, **changes: object) -> Deployment:
    replicas, counts = dep.replicas.set(new.replica_id, new), recount(dep.counts, old.phase, new.phase)
    if changes:
        return _copy_deployment(dep, replicas=replicas, counts=counts, **changes)
    return _with_replica(dep, replicas, counts)


def initialize(dep: Deployment, rid: str) -> InitializeReplica:
    """The InitializeReplica for a just-placed replica (the seed's startup rule)."""
    rank = dep.ranks.rank_of(rid)
    if rank is None:  # just placed
        raise InvariantViolation("a placed replica without a rank record")
    return _Init(
        replica_id=rid,
        deployment=dep.name,
        rank=rank,
        world_size=dep.target,
        user_config=dep.user_config,
        # Ray Serve 2.60 calls it when there is a user_config *or* the method
        # takes ``rank`` ("user config is not None or user subscribed to rank").
        call_reconfigure=dep.has_reconfigure and (dep.user_config is not None or dep.reconfigure_takes_rank),
        pass_rank=dep.reconfigure_takes_rank,
        health_check_period_s=dep.options.health_check_period_s,
        health_check_timeout_s=dep.options.health_check_timeout_s,
    )


def stop_command(dep: Deployment, rid: str, now: bool = False) -> StopReplica:
    """The StopReplica for ``rid``: drained by the deployment's graceful-shutdown
    options, or (``now``) killed at once: a replica the core gave up on (hung,
    unhealthy, unplaced, restarted with its gang) has nothing worth draining, and
    its room goes to its replacement in this same step."""
    o = dep.options
    return _Stop(replica_id=rid, deployment=dep.name, graceful_shutdown_wait_loop_s=o.graceful_shutdown_wait_loop_s,
                 graceful_shutdown_timeout_s=0.0 if now else o.graceful_shutdown_timeout_s)


def reconfigure(dep: Deployment, rep: Replica, reason: str) -> tuple[Replica, ReconfigureReplica]:
    rank = dep.ranks.rank_of(rep.replica_id)
    if rank is None:  # a reconfigurable replica is placed
        raise InvariantViolation("a placed replica without a rank record")
    if reason == "user_config":
        call_user = dep.has_reconfigure
    else:
        call_user = dep.has_reconfigure and dep.reconfigure_takes_rank  # user_config may be None
    new = _copy(
        rep,
        phase=advance(rep.phase, Trigger.RECONFIGURE, rep.replica_id),
        version=rep.version + 1,
        config_version=dep.config_version,
        rank_update_due=False,
    )
    cmd = _Reconfigure(
        replica_id=rep.replica_id,
        deployment=dep.name,
        rank=rank,
        world_size=dep.target,
        user_config=dep.user_config,
        version=new.version,
        reason=reason,
        call_user=call_user,
        pass_rank=dep.reconfigure_takes_rank,
    )
    return new, cmd


def start(tx: Tx, dep: Deployment, n: int) -> Deployment:
    """Start ``n`` new replicas on the lowest free ranks (gangs: whole gangs;
    static placement: each on its rank's bundles, or FAILED while they are not placed)."""
    ids = tx.new_ids(dep.name, n)
    ranks = dep.ranks.assign_many([(rid, None) for rid in ids])
    lineages = {rid: tx.new_lineage() for rid in ids}
    static = dep.static
    if static is not None and dep.count(Phase.STOPPING):
        raise InvalidEvent(f"deployment {dep.name!r} (static placement) still has {dep.count(Phase.STOPPING)} "
                           f"replicas stopping on its ranks: bring it back once they have stopped")
    failed = {rid for rid in ids if not static.placed(ranks.global_rank(rid))} if static is not None else set()
    with dep.replicas.mutate() as m:
        for rid in ids:
            m.set(rid, _Replica(replica_id=rid, deployment=dep.name,
                               phase=Phase.FAILED if rid in failed else Phase.PENDING, lineage=lineages[rid]))
        replicas = m.finish()
    with tx.index.mutate() as ix:
        for rid in ids:
            ix.set(rid, dep.name)
        tx.index = ix.finish()
    for rid in ids:
        if rid not in failed:
            tx.emit(_Start(replica_id=rid, deployment=dep.name, global_rank=ranks.global_rank(rid),
                                 world_size=dep.target, lineage=lineages[rid]))
    c = list(dep.counts)
    c[_IDX[Phase.PENDING]] += n - len(failed)
    c[_IDX[Phase.FAILED]] += len(failed)
    dep = _copy(dep, replicas=replicas, ranks=ranks, counts=tuple(c))
    if static is not None:
        for rid in ids:
            if rid not in failed:
                dep = place_static(tx, dep, rid)
        return dep
    if dep.gang_size > 1:
        _gang_started(tx, dep)
    if tx.managed:
        enqueue(tx, dep, ids)
    return dep


def stop(tx: Tx, dep: Deployment, n: int, victims: Iterable[str] = ()) -> Deployment:
    """Stop ``n`` replicas: named victims first, then not-yet-running, then highest ranks
    (a gang deployment: the highest ranks, whole gangs, nothing to compact)."""
    chosen = [v for v in victims if dep.replicas[v].phase is not Phase.STOPPING][:n]
    if dep.gang_size > 1 and len(chosen) < n:
        ranks = dep.ranks
        top = sorted(((ranks.global_rank(r.replica_id), r.replica_id) for r in dep.replicas.values()
                      if r.phase is not Phase.STOPPING), reverse=True)
        chosen.extend(rid for _, rid in top[: n - len(chosen)])
    elif len(chosen) < n:
        taken = set(chosen)
        ranks = dep.ranks
        candidates = sorted(

                (VICTIM_ORDER[r.phase], -ranks.global_rank(r.replica_id), r.replica_id)
                for r in dep.replicas.values()
                if r.phase is not Phase.STOPPING and r.replica_id not in taken

        )
        chosen.extend(c[2] for c in candidates[: n - len(chosen)])
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
    active = dep.active
    if active < dep.target:
        if dep.unresponsive:  # it may hold any free rank: none is given until it has stopped (rankcore.recovery)
            return dep
        return start(tx, dep, dep.target - active)
    if active > dep.target:
        return stop(tx, dep, active - dep.target, victims)
    return dep


def remove(tx: Tx, dep: Deployment, rep: Replica, ranks: object) -> Deployment:
    """Drop a finished replica (its ranks already handled in ``ranks``)."""
    rid = rep.replica_id
    _forget(tx, rid)
    return _copy(
        dep,
        replicas=dep.replicas.delete(rid),
        ranks=ranks,
        counts=recount(dep.counts, rep.phase, None),
    )


def _forget(tx: Tx, rid: str) -> None:
    """``rid`` leaves the index (and the cluster's book, when managed)."""
    tx.index = tx.index.delete(rid)
    _disarm(tx, rid)
    if parse_replica_number(rid) is None:
        tx.retired = tx.retired.set(rid, None)


def _disarm(tx: Tx, rid: str) -> None:
    """What the cluster holds for ``rid`` goes: its booking (when managed), its
    deadline and restart backoff (kept without a cluster model too)."""
    if tx.managed or tx.view.deadlines:
        release(tx, rid)


def crash(tx: Tx, dep: Deployment, rep: Replica, avoid: str | None = None) -> Deployment:
    """A replica died: its replacement takes its global rank (unless it was
    leaving), after the restart backoff when its starts keep failing
    (``rankcore.restarts``); ``avoid``: a node the replacement must not go to."""
    advance(rep.phase, Trigger.CRASH, rep.replica_id)
    rid = rep.replica_id
    if rep.phase is Phase.STOPPING:  # it was leaving anyway: no replacement
        return remove(tx, dep, rep, dep.ranks.release(rid))
    if dep.static is not None:
        return _crash_static(tx, dep, rep)
    managed = tx.managed
    (new_id,) = tx.new_ids(dep.name, 1)
    delay = restarts.backoff_s(dep) if tx.view.clock else 0.0
    if managed and (delay > 0 or avoid is not None):
        release(tx, rid)  # its room is free while the replacement waits, or it goes elsewhere
    booking = keep_booking(tx, dep, rid, new_id) if managed and delay == 0 and avoid is None else None
    node_id = booking[0] if booking is not None else None
    dep = _succeed(tx, dep, rep, new_id, node_id, announce=delay == 0)
    if delay > 0:
        restarts.defer(tx, new_id, rid, tx.view.now + delay)
    elif node_id is not None:  # back on its predecessor's node, on the same booking
        announce_booking(tx, dep, new_id, node_id)
    elif managed:
        if avoid is not None:
            avoid_node(tx, new_id, avoid)
        enqueue(tx, dep, [new_id])  # placed by the end-of-step pass, once every release of this step is done
    if dep.gang_size > 1:
        _gang_started(tx, dep)
    return dep


# ---------------------------------------------------------------- static placement
def place_static(tx: Tx, dep: Deployment, rid: str) -> Deployment:
    """Put ``rid`` on its rank's first bundle (the caller's group holds the
    resources: nothing is booked on the cluster model): PlaceReplica."""
    static = dep.static
    if static is None:
        raise InvariantViolation("a static-placement rule ran on a deployment without static placement")
    g = dep.ranks.global_rank(rid)
    node_id = static.node_of(g)
    if node_id is None:
        raise InvariantViolation("a static rank whose bundle has no node")
    rep = dep.replicas[rid]
    ranks = dep.ranks
    if rep.node_id != node_id:
        if rep.node_id is not None:
            ranks = ranks.unplace(rid)
        ranks = ranks.place(rid, node_id)
        dep = _copy(dep, replicas=dep.replicas.set(rid, _copy(rep, node_id=node_id)), ranks=ranks)
    rank = ranks.rank_of(rid)
    if rank is None:
        raise InvariantViolation("a placed replica without a rank record")
    tx.emit(_Place(replica_id=rid, deployment=dep.name, node_id=node_id, rank=rank, group=static.group,
                         bundles=static.bundles_of(g), capture_child_tasks=static.capture_child_tasks))
    return dep


def _succeed(tx: Tx, dep: Deployment, rep: Replica, new_id: str, node_id: str | None = None,
             announce: bool = True) -> Deployment:
    """``new_id``, a new incarnation of ``rep`` (same lineage and global rank),
    started (``announce``: its StartReplica now); on ``node_id`` with all three
    of ``rep``'s ranks when given (one rename: no place later), else with no node yet."""
    rid = rep.replica_id
    ranks = dep.ranks.replace(rid, new_id, node_id) if node_id is not None else dep.ranks.replace(rid, new_id)
    _forget(tx, rid)
    new = _Replica(replica_id=new_id, deployment=dep.name, phase=Phase.PENDING, lineage=rep.lineage, node_id=node_id)
    tx.index = tx.index.set(new_id, dep.name)
    if announce:
        tx.emit(_Start(replica_id=new_id, deployment=dep.name, global_rank=ranks.global_rank(new_id),
                       world_size=dep.target, replaces=rid, lineage=rep.lineage))
    counts = list(dep.counts)
    counts[_IDX[rep.phase]] -= 1
    counts[_IDX[Phase.PENDING]] += 1
    return _copy(dep, replicas=dep.replicas.delete(rid).set(new_id, new), ranks=ranks, counts=tuple(counts))


def _crash_static(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """A static replica died: back on the same bundles with the same rank (or
    FAILED, when a bundle of its rank is not placed now)."""
    static = dep.static
    if static is None:
        raise InvariantViolation("a static-placement rule ran on a deployment without static placement")
    if not static.placed(dep.ranks.global_rank(rep.replica_id)):
        return fail_static(tx, dep, rep, stop=False)
    (new_id,) = tx.new_ids(dep.name, 1)
    delay = restarts.backoff_s(dep) if tx.view.clock else 0.0
    dep = _succeed(tx, dep, rep, new_id, announce=delay == 0)
    if delay > 0:
        restarts.defer(tx, new_id, rep.replica_id, tx.view.now + delay)
        return dep
    return place_static(tx, dep, new_id)


def start_delayed(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """Replacement ``rep`` waited out its restart backoff (``rankcore.restarts``):
    its StartReplica now, then a node: its bundles (static placement), or the
    queue (a gang's members come due together and are placed whole)."""
    tx.emit(restarts.release(tx, dep, rep))
    if dep.static is not None:
        return place_static(tx, dep, rep.replica_id)
    if dep.gang_size > 1:
        _gang_started(tx, dep)
    if tx.managed:
        enqueue(tx, dep, [rep.replica_id])
    return dep


def fail_static(tx: Tx, dep: Deployment, rep: Replica, stop: bool = True) -> Deployment:
    """A bundle of ``rep``'s rank lost its node: FAILED. It keeps its global
    rank, is not replaced or moved, and its process (if any) is stopped."""
    rid = rep.replica_id
    phase = advance(rep.phase, Trigger.BUNDLE_LOST, rid)
    waiting = rid in tx.view.delayed  # out its restart backoff: never started, nothing to stop
    _disarm(tx, rid)  # (a start deadline, a restart backoff)
    ranks = dep.ranks.unplace(rid) if rep.node_id is not None else dep.ranks
    if stop and not waiting:
        tx.emit(stop_command(dep, rid, now=True))
    return put_replica(dep, rep, _copy(rep, phase=phase, node_id=None, rank_update_due=False), ranks=ranks)


def restart_failed(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """A FAILED replica whose bundles are all placed again: a new incarnation on its rank and bundles."""
    advance(rep.phase, Trigger.RESTART, rep.replica_id)
    (new_id,) = tx.new_ids(dep.name, 1)
    return place_static(tx, _succeed(tx, dep, rep, new_id), new_id)


# ---------------------------------------------------------------- gangs
def fail_member(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """A replica died (crash, start timeout, node loss): replace it, and under
    ``restart_gang`` every other member of its gang too (their processes stopped)."""
    if dep.gang_size <= 1 or dep.gang_failure != "restart_gang" or rep.phase is Phase.STOPPING:
        return crash(tx, dep, rep)
    k = dep.gang_size
    g = dep.ranks.global_rank(rep.replica_id) // k
    for r in gang_ranks(g, k):
        rid = cast("str | None", dep.ranks.holder_of(r))
        member = dep.replicas.get(rid) if rid is not None else None
        if member is None or member.phase is Phase.STOPPING:
            continue
        if rid != rep.replica_id and rid not in tx.view.delayed:  # (delayed: never started, nothing to stop)
            tx.emit(stop_command(dep, member.replica_id, now=True))  # alive: restarted with its gang
        dep = crash(tx, dep, member)
    return dep


def _gang_started(tx: Tx, dep: Deployment) -> None:
    if tx.gangs is None:
        tx.gangs = set()
    tx.gangs.add(dep.name)


def _members(dep: Deployment, g: int) -> tuple[str, ...]:
    holders = (cast("str | None", dep.ranks.holder_of(r)) for r in gang_ranks(g, dep.gang_size))
    return tuple(h for h in holders if h is not None)


def _tell_gangs(tx: Tx) -> None:
    """Each StartReplica of a gang member carries its gang (members as the step
    leaves them); a gang that got a new member while others kept running is
    told its new members (GangChanged)."""
    if tx.gangs is None:
        raise InvariantViolation("gang starts told with no gang deployment started")
    started: dict[tuple[str, int], set[str]] = {}
    out = []
    for c in tx.commands:
        if type(c) is StartReplica and c.deployment in tx.gangs:
            dep = tx.deps.get(c.deployment)
            if dep is not None and c.replica_id in dep.replicas:
                k = dep.gang_size
                g = c.global_rank // k
                c = _copy(c, gang=GangContext(gang_id=gang_id(dep.name, g), rank_in_gang=c.global_rank % k,
                                                gang_size=k, members=_members(dep, g)))
                started.setdefault((dep.name, g), set()).add(c.replica_id)
        out.append(c)
    for (name, g), new in sorted(started.items()):
        members = _members(tx.deps[name], g)
        if set(members) - new:
            out.append(GangChanged(deployment=name, gang_id=gang_id(name, g), members=members))
    tx.commands = out


def restart_incomplete_gangs(tx: Tx, names: Iterable[str]) -> None:
    """After a recovery: a gang whose start was cut short (some members being
    started again now) restarts whole, on its ranks."""
    fresh = {c.replica_id for c in tx.commands if type(c) is StartReplica}
    for name in names:
        dep = tx.deps[name]
        if dep.gang_size <= 1:
            continue
        k = dep.gang_size
        for g in range(dep.target // k):
            members = [cast("str | None", dep.ranks.holder_of(r)) for r in gang_ranks(g, k)]
            if not any(m in fresh for m in members):
                continue
            for rid in members:
                rep = dep.replicas.get(rid) if rid is not None else None
                if rep is None or rid in fresh or rep.phase is Phase.STOPPING:
                    continue
                tx.emit(stop_command(dep, rep.replica_id, now=True))
                dep = crash(tx, dep, rep)
        tx.put(dep)
        _starts_in_rank_order(tx, name)


def _starts_in_rank_order(tx: Tx, name: str) -> None:
    """Re-order ``name``'s StartReplica commands of this step by global rank
    (each keeps a start's slot), as every batch of starts is."""
    slots = [i for i, c in enumerate(tx.commands) if type(c) is StartReplica and c.deployment == name]
    ordered = sorted((tx.commands[i] for i in slots), key=lambda c: c.global_rank)
    for i, c in zip(slots, ordered):
        tx.commands[i] = c


def compact(tx: Tx, dep: Deployment) -> Deployment:
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


def by_rank(dep: Deployment, replicas: Iterable[Replica]) -> list[Replica]:
    return sorted(replicas, key=lambda r: (dep.ranks.global_rank(r.replica_id), r.replica_id))

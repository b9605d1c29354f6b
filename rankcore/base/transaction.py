"""The step machinery every rule stands on: ``Tx``, one step's work in progress,
and the primitives that build a step from it (a replica's record put back, its
successor, its removal, the commands that start, stop and reconfigure it).

Rules live in the modules above, by subject: ``moves`` (start, stop, crash,
compaction), ``static`` (every move of static placement), ``gangs`` (every
move of a gang), ``deadlines`` and ``clock`` (time), ``restarts`` (backoff),
``scheduling`` (the waiting queue and bookings), ``passes`` (the end-of-step
work, a named list), and the handlers (``core``, ``health``, ``recovery``).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Iterable

import immutables

from ..base.cluster import Cluster
from ..base.commands import (
    InitializeReplica,
    ReconfigureReplica,
    ScheduleTick,
    StartReplica,
    StopReplica,
)
from ..base.errors import InvalidEvent, InvariantViolation
from ..base.fields import shown
from ..base.lifecycle import LIVE, Phase, Trigger, advance
from ..base.proxybook import ProxyBook
from ..base.ranks import RankTable
from ..base.records import copier, maker, unchecked_copy, updater
from ..base.state import (
    Compaction,
    Deployment,
    RecoveryOutcome,
    Replica,
    State,
    Step,
    parse_replica_number,
    replica_id,
)
from . import unhealthy
from .books import release
from .clustertx import ClusterTx

__all__ = [
    "Tx", "recount", "put_replica", "initialize", "stop_command", "reconfigure", "remove", "forget", "disarm",
    "succeed", "by_rank", "build",
]

_IDX = {p: i for i, p in enumerate(LIVE)}
_copy = unchecked_copy  # rankcore.base.records: not validated, no per-call introspection
# The records and commands a step builds from values it already holds valid,
# made without re-running their validators (rankcore.base.records.maker).
_State, _Step, _Replica = maker(State), maker(Step), maker(Replica)
_Start, _Init = maker(StartReplica), maker(InitializeReplica)
_Reconfigure, _Stop = maker(ReconfigureReplica), maker(StopReplica)


class Tx:
    """One step's work in progress: the state being built and the commands."""

    __slots__ = ("deps", "index", "next_replica", "next_lineage", "retired", "commands", "touched", "compactions",
                 "cluster", "_cl", "gangs", "ticks", "initial", "armed",
                 "evictions", "deleted", "proxies", "initial_proxies")

    def __init__(self, state: State) -> None:
        self.cluster = state.cluster
        self._cl: ClusterTx | None = None
        self.deps: immutables.Map = state.deployments
        self.initial: immutables.Map = state.deployments  # as the step found them (end-of-step passes compare)
        self.index: immutables.Map = state.index
        self.next_replica = state.next_replica
        self.next_lineage = state.next_lineage
        self.retired: immutables.Map = state.retired
        self.deleted: immutables.Map = state.deleted  # deployments deleted and gone (rankcore.control.deletion)
        self.proxies: ProxyBook = state.proxies  # (rankcore.control.proxies)
        self.initial_proxies: ProxyBook = state.proxies
        self.commands: list = []
        self.touched: set[str] = set()
        self.compactions: list[Compaction] = []
        self.gangs: set[str] | None = None  # gang deployments that started replicas this step
        self.ticks: set[float] | None = None  # the ScheduleTick times asked for this step (``tick_at``)
        self.armed: list[float] | None = None  # deadlines armed this step (``rankcore.placement.deadlines``)
        #: evictions chosen this step, carried out by the end-of-step pass
        #: (``rankcore.control.evictions``): (victim, for replica, node, "warm"/"cold", entries dropped)
        self.evictions: list | None = None

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
        dep = unhealthy.settled(dep)  # (the dead replica's successor serves: Serve's HEALTHY again)
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
            owner = rid.rpartition("#")[0]
            ours = n is not None and n < self.next_replica and (owner in self.deps or owner in self.deleted)
            if ours or rid in self.retired:
                return None
            raise InvalidEvent(f"unknown replica {shown(rid)}: the core never started it")
        dep = self.deps[name]
        return dep, dep.replicas[rid]

    def gang_started(self, name: str) -> None:
        """A gang deployment started replicas this step: the end-of-step pass tells their gangs."""
        if self.gangs is None:
            self.gangs = set()
        self.gangs.add(name)


def build(tx: Tx, stale: bool = False, recovery: RecoveryOutcome | None = None) -> Step:
    """The ``Step`` a finished transaction makes (after the end-of-step passes, ``rankcore.control.passes``)."""
    cluster = tx.working.build() if tx.working is not None else tx.cluster
    state = _State(
        deployments=tx.deps,
        index=tx.index,
        next_replica=tx.next_replica,
        next_lineage=tx.next_lineage,
        retired=tx.retired,
        cluster=cluster,
        deleted=tx.deleted,
        proxies=tx.proxies,
    )
    return _Step(
        state=state, commands=tuple(tx.commands), stale=stale, compactions=tuple(tx.compactions),
        recovery=recovery,
    )


# ---------------------------------------------------------------- primitives
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
        health_check_period_s=dep.config.health.health_check_period_s,
        health_check_timeout_s=dep.config.health.health_check_timeout_s,
        weights_version=dep.weights_version,
    )


def stop_command(dep: Deployment, rid: str, now: bool = False) -> StopReplica:
    """The StopReplica for ``rid``: drained by the deployment's graceful-shutdown
    options, or (``now``) killed at once: a replica the core gave up on (hung,
    unhealthy, unplaced, restarted with its gang) has nothing worth draining, and
    its room goes to its replacement in this same step."""
    o = dep.config.shutdown
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


def remove(tx: Tx, dep: Deployment, rep: Replica, ranks: object) -> Deployment:
    """Drop a finished replica (its ranks already handled in ``ranks``), and from the deployment's
    counts of retiring replicas and blue-green blues."""
    rid = rep.replica_id
    forget(tx, rid)
    return _copy(
        dep,
        replicas=dep.replicas.delete(rid),
        ranks=ranks,
        counts=recount(dep.counts, rep.phase, None),
        retiring=dep.retiring - 1 if rep.retiring else dep.retiring,
        blues=dep.blues if rep.blue_ranks is None else dep.blues - 1,
    )


def forget(tx: Tx, rid: str) -> None:
    """``rid`` leaves the index (and the cluster's book, when managed)."""
    tx.index = tx.index.delete(rid)
    disarm(tx, rid)
    if parse_replica_number(rid) is None:
        tx.retired = tx.retired.set(rid, None)


def disarm(tx: Tx, rid: str) -> None:
    """What the cluster holds for ``rid`` goes: its booking (when managed), its
    deadline and restart backoff (kept without a cluster model too)."""
    if tx.managed or tx.view.deadlines:
        release(tx, rid)


def wants_successor(dep: Deployment) -> bool:
    """Whether a replica a rollout retired gets a successor on its ranks now that it has gone
    (rankcore.control.rollouts): not when the deployment is being deleted or was scaled down meanwhile."""
    return not dep.deleting and dep.active - 1 < dep.target


def succeed(tx: Tx, dep: Deployment, rep: Replica, new_id: str, node_id: str | None = None,
             announce: bool = True) -> Deployment:
    """``new_id``, a new incarnation of ``rep`` (same lineage and global rank),
    started (``announce``: its StartReplica now); on ``node_id`` with all three
    of ``rep``'s ranks when given (one rename: no place later), else with no node yet."""
    rid = rep.replica_id
    ranks = dep.ranks.replace(rid, new_id, node_id) if node_id is not None else dep.ranks.replace(rid, new_id)
    forget(tx, rid)
    new = successor(tx, dep, rep, new_id, node_id, ranks, announce)
    counts = list(dep.counts)
    counts[_IDX[rep.phase]] -= 1
    counts[_IDX[Phase.PENDING]] += 1
    return _copy(dep, replicas=dep.replicas.delete(rid).set(new_id, new), ranks=ranks, counts=tuple(counts),
                 retiring=dep.retiring - 1 if rep.retiring else dep.retiring)


def successor(tx: Tx, dep: Deployment, rep: Replica, new_id: str, node_id: str | None, ranks: RankTable,
              announce: bool = True) -> Replica:
    """The record of ``new_id``, ``rep``'s successor (its lineage, pending, on the current revision;
    ``ranks`` already gives it ``rep``'s), indexed, and (``announce``) its StartReplica. The caller
    puts it in the deployment (``succeed``, ``rollouts.surge``)."""
    tx.index = tx.index.set(new_id, dep.name)
    if announce:
        tx.emit(_Start(replica_id=new_id, deployment=dep.name, global_rank=ranks.global_rank(new_id),
                       world_size=dep.target, replaces=rep.replica_id, lineage=rep.lineage, revision=dep.revision))
    return _Replica(replica_id=new_id, deployment=dep.name, phase=Phase.PENDING, lineage=rep.lineage, node_id=node_id,
                    revision=dep.revision)


def by_rank(dep: Deployment, replicas: Iterable[Replica]) -> list[Replica]:
    return sorted(replicas, key=lambda r: (dep.ranks.global_rank(r.replica_id), r.replica_id))

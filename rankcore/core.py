"""``step(state, event) -> Step``: every rule of replica ranks, with no effects.

One handler per event type (``_on_<event>``), dispatched on ``type(event)``.
A handler either raises (the caller's state is untouched: it is immutable) or
returns the next state and the commands, in the order they must be carried
out. After every event, each deployment it touched is *settled*: once healthy,
ranks left non-contiguous by a release are compacted, each changed replica
getting exactly one ReconfigureReplica.

Determinism: nothing depends on hash order (string hashes vary between
processes); whenever replicas are walked to make commands they are sorted by
rank or id first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs
import immutables

from .commands import InitializeReplica, ReconfigureReplica, StartReplica, StopReplica, UpdateWorldSize
from .errors import InvalidConfig, InvalidEvent
from .events import (
    ControllerRecovered,
    DeploymentApplied,
    NodeLost,
    ReplicaCrashed,
    ReplicaPlaced,
    ReplicaReady,
    ReplicaReconfigured,
    ReplicaStopped,
    ScaleRequested,
)
from .lifecycle import LIVE, Phase, Trigger, advance
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

__all__ = ["step", "run"]

_IDX = {p: i for i, p in enumerate(LIVE)}
_evolve = attrs.evolve


class _Tx:
    """One step's work in progress: the state being built and the commands."""

    __slots__ = ("deps", "index", "next_replica", "next_lineage", "retired", "commands", "touched", "compactions")

    def __init__(self, state: State) -> None:
        self.deps: immutables.Map = state.deployments
        self.index: immutables.Map = state.index
        self.next_replica = state.next_replica
        self.next_lineage = state.next_lineage
        self.retired: immutables.Map = state.retired
        self.commands: list = []
        self.touched: set[str] = set()
        self.compactions: list[Compaction] = []

    def dep(self, name: str) -> Deployment:
        try:
            return self.deps[name]
        except KeyError:
            raise InvalidEvent(f"unknown deployment {name!r}") from None

    def put(self, dep: Deployment) -> None:
        self.deps = self.deps.set(dep.name, dep)
        self.touched.add(dep.name)

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
            raise InvalidEvent(f"unknown replica {rid!r}: the core never started it")
        dep = self.deps[name]
        return dep, dep.replicas[rid]

    def finish(self, stale: bool = False, recovery: RecoveryOutcome | None = None) -> Step:
        for name in sorted(self.touched):
            dep = self.deps.get(name)
            if dep is not None and dep.healthy and not dep.ranks.is_contiguous():  # O(1)
                self.put(_compact(self, dep))
        state = State(
            deployments=self.deps,
            index=self.index,
            next_replica=self.next_replica,
            next_lineage=self.next_lineage,
            retired=self.retired,
        )
        return Step(
            state=state, commands=tuple(self.commands), stale=stale, compactions=tuple(self.compactions),
            recovery=recovery,
        )


# ---------------------------------------------------------------- helpers
def _counts(counts: tuple[int, ...], old: Phase | None, new: Phase | None) -> tuple[int, ...]:
    c = list(counts)
    if old is not None:
        c[_IDX[old]] -= 1
    if new is not None and new in _IDX:
        c[_IDX[new]] += 1
    return tuple(c)


def _put_replica(dep: Deployment, old: Replica, new: Replica, **changes: object) -> Deployment:
    return _evolve(
        dep,
        replicas=dep.replicas.set(new.replica_id, new),
        counts=_counts(dep.counts, old.phase, new.phase),
        **changes,
    )


def _initialize(dep: Deployment, rid: str) -> InitializeReplica:
    """The InitializeReplica for a just-placed replica (the seed's startup rule)."""
    rank = dep.ranks.rank_of(rid)
    assert rank is not None  # just placed
    return InitializeReplica(
        replica_id=rid,
        deployment=dep.name,
        rank=rank,
        world_size=dep.target,
        user_config=dep.user_config,
        # Ray Serve 2.60 calls it when there is a user_config *or* the method
        # takes ``rank`` ("user config is not None or user subscribed to rank").
        call_reconfigure=dep.has_reconfigure and (dep.user_config is not None or dep.reconfigure_takes_rank),
        pass_rank=dep.reconfigure_takes_rank,
    )


def _reconfigure(dep: Deployment, rep: Replica, reason: str) -> tuple[Replica, ReconfigureReplica]:
    rank = dep.ranks.rank_of(rep.replica_id)
    assert rank is not None  # a reconfigurable replica is placed
    if reason == "user_config":
        call_user = dep.has_reconfigure
    else:
        call_user = dep.has_reconfigure and dep.reconfigure_takes_rank  # user_config may be None
    new = _evolve(
        rep,
        phase=advance(rep.phase, Trigger.RECONFIGURE, rep.replica_id),
        version=rep.version + 1,
        config_version=dep.config_version,
        rank_update_due=False,
    )
    cmd = ReconfigureReplica(
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


def _start(tx: _Tx, dep: Deployment, n: int) -> Deployment:
    """Start ``n`` new replicas on the lowest free ranks."""
    ids = tx.new_ids(dep.name, n)
    ranks = dep.ranks.assign_many([(rid, None) for rid in ids])
    lineages = {rid: tx.new_lineage() for rid in ids}
    with dep.replicas.mutate() as m:
        for rid in ids:
            m.set(rid, Replica(replica_id=rid, deployment=dep.name, phase=Phase.PENDING, lineage=lineages[rid]))
        replicas = m.finish()
    with tx.index.mutate() as ix:
        for rid in ids:
            ix.set(rid, dep.name)
        tx.index = ix.finish()
    for rid in ids:
        tx.emit(StartReplica(replica_id=rid, deployment=dep.name, global_rank=ranks.global_rank(rid),
                             world_size=dep.target, lineage=lineages[rid]))
    c = list(dep.counts)
    c[_IDX[Phase.PENDING]] += n
    return _evolve(dep, replicas=replicas, ranks=ranks, counts=tuple(c))


_VICTIM_ORDER = {Phase.PENDING: 0, Phase.STARTING: 1, Phase.RUNNING: 2, Phase.RECONFIGURING: 2}


def _stop(tx: _Tx, dep: Deployment, n: int, victims: Iterable[str] = ()) -> Deployment:
    """Stop ``n`` replicas: named victims first, then not-yet-running, then highest ranks."""
    chosen = [v for v in victims if dep.replicas[v].phase is not Phase.STOPPING][:n]
    if len(chosen) < n:
        taken = set(chosen)
        ranks = dep.ranks
        candidates = sorted(

                (_VICTIM_ORDER[r.phase], -ranks.global_rank(r.replica_id), r.replica_id)
                for r in dep.replicas.values()
                if r.phase is not Phase.STOPPING and r.replica_id not in taken

        )
        chosen.extend(c[2] for c in candidates[: n - len(chosen)])
    replicas, counts = dep.replicas, dep.counts
    for rid in chosen:
        rep = replicas[rid]
        new = _evolve(rep, phase=advance(rep.phase, Trigger.STOP, rid))
        replicas = replicas.set(rid, new)
        counts = _counts(counts, rep.phase, new.phase)
        tx.emit(StopReplica(replica_id=rid, deployment=dep.name))
    return _evolve(dep, replicas=replicas, counts=counts)


def _reconcile(tx: _Tx, dep: Deployment, victims: Iterable[str] = ()) -> Deployment:
    active = dep.active
    if active < dep.target:
        return _start(tx, dep, dep.target - active)
    if active > dep.target:
        return _stop(tx, dep, active - dep.target, victims)
    return dep


def _remove(tx: _Tx, dep: Deployment, rep: Replica, ranks: object) -> Deployment:
    """Drop a finished replica (its ranks already handled in ``ranks``)."""
    rid = rep.replica_id
    tx.index = tx.index.delete(rid)
    if parse_replica_number(rid) is None:
        tx.retired = tx.retired.set(rid, None)
    return _evolve(
        dep,
        replicas=dep.replicas.delete(rid),
        ranks=ranks,
        counts=_counts(dep.counts, rep.phase, None),
    )


def _crash(tx: _Tx, dep: Deployment, rep: Replica) -> Deployment:
    """A replica died: its replacement takes its global rank (unless it was leaving)."""
    advance(rep.phase, Trigger.CRASH, rep.replica_id)
    rid = rep.replica_id
    if rep.phase is Phase.STOPPING:  # it was leaving anyway: no replacement
        return _remove(tx, dep, rep, dep.ranks.release(rid))
    (new_id,) = tx.new_ids(dep.name, 1)
    ranks = dep.ranks.replace(rid, new_id)
    dep = _remove(tx, dep, rep, ranks)
    new = Replica(replica_id=new_id, deployment=dep.name, phase=Phase.PENDING, lineage=rep.lineage)
    tx.index = tx.index.set(new_id, dep.name)
    tx.emit(
        StartReplica(
            replica_id=new_id,
            deployment=dep.name,
            global_rank=ranks.global_rank(new_id),
            world_size=dep.target,
            replaces=rid,
            lineage=rep.lineage,
        )
    )
    return _evolve(
        dep,
        replicas=dep.replicas.set(new_id, new),
        counts=_counts(dep.counts, None, Phase.PENDING),
    )


def _compact(tx: _Tx, dep: Deployment) -> Deployment:
    bound = dep.ranks.lower_bound()
    ranks, changes = dep.ranks.compact()
    tx.compactions.append(Compaction(deployment=dep.name, lower_bound=bound, changes=changes))
    dep = _evolve(dep, ranks=ranks)
    replicas, counts = dep.replicas, dep.counts
    for change in changes:  # ordered by new global rank
        rep = replicas[change.replica]
        new, cmd = _reconfigure(dep, rep, "rank")
        replicas = replicas.set(new.replica_id, new)
        counts = _counts(counts, rep.phase, new.phase)
        tx.emit(cmd)
    return _evolve(dep, replicas=replicas, counts=counts)


def _by_rank(dep: Deployment, replicas: Iterable[Replica]) -> list[Replica]:
    return sorted(replicas, key=lambda r: (dep.ranks.global_rank(r.replica_id), r.replica_id))


# --------------------------------------------------------------- handlers
_E = TypeVar("_E")


def _about_replica(handler: Callable[[_Tx, _E, Deployment, Replica], Step]) -> Callable[[_Tx, _E], Step]:
    """For events naming a replica: look it up; news about one that has left is stale."""

    def on_event(tx: _Tx, e: _E) -> Step:
        found = tx.lookup(e.replica_id)  # type: ignore[attr-defined]
        if found is None:
            return tx.finish(stale=True)
        return handler(tx, e, *found)

    on_event.__name__ = handler.__name__
    return on_event


def _on_deployment_applied(tx: _Tx, e: DeploymentApplied) -> Step:
    dep = tx.deps.get(e.name)
    if dep is None:
        dep = Deployment.applied(e)
        tx.put(_reconcile(tx, dep))
        return tx.finish()
    dep = _evolve(dep, has_reconfigure=e.has_reconfigure, reconfigure_takes_rank=e.reconfigure_takes_rank,
                  max_replicas=e.max_replicas)
    config_changed = e.user_config != dep.user_config
    if config_changed:
        dep = _evolve(dep, user_config=e.user_config, config_version=dep.config_version + 1)
    if e.num_replicas != dep.target:
        dep = _evolve(dep, target=e.num_replicas)
        tx.emit(UpdateWorldSize(deployment=dep.name, world_size=dep.target))
    dep = _reconcile(tx, dep)
    if config_changed:
        # Every serving replica (not those being stopped) gets the new user_config.
        serving = [r for r in dep.replicas.values() if r.phase in (Phase.RUNNING, Phase.RECONFIGURING)]
        replicas, counts = dep.replicas, dep.counts
        for rep in _by_rank(dep, serving):
            new, cmd = _reconfigure(dep, rep, "user_config")
            replicas = replicas.set(new.replica_id, new)
            counts = _counts(counts, rep.phase, new.phase)
            tx.emit(cmd)
        dep = _evolve(dep, replicas=replicas, counts=counts)
    tx.put(dep)
    return tx.finish()


def _on_scale_requested(tx: _Tx, e: ScaleRequested) -> Step:
    dep = tx.dep(e.deployment)
    if e.num_replicas > dep.max_replicas:
        raise InvalidConfig(
            f"ScaleRequested({dep.name!r}).num_replicas={e.num_replicas} is above the deployment's "
            f"max_replicas={dep.max_replicas} (raise it with DeploymentApplied.max_replicas if you mean it)"
        )
    for v in e.victims:
        rep = dep.replicas.get(v)
        if rep is None:
            raise InvalidEvent(f"ScaleRequested: victim {v!r} is not a live replica of {dep.name!r}")
        if rep.phase is Phase.STOPPING:
            raise InvalidEvent(f"ScaleRequested: victim {v!r} is already stopping")
    if e.victims and len(e.victims) > dep.active - e.num_replicas:
        raise InvalidEvent(
            f"ScaleRequested: {len(e.victims)} victims named, but scaling {dep.name!r} "
            f"from {dep.active} to {e.num_replicas} stops {max(dep.active - e.num_replicas, 0)}"
        )
    if e.num_replicas != dep.target:
        dep = _evolve(dep, target=e.num_replicas)
        tx.emit(UpdateWorldSize(deployment=dep.name, world_size=dep.target))
    tx.put(_reconcile(tx, dep, e.victims))
    return tx.finish()


@_about_replica
def _on_replica_placed(tx: _Tx, e: ReplicaPlaced, dep: Deployment, rep: Replica) -> Step:
    if rep.phase is not Phase.PENDING and rep.node_id == e.node_id and rep.phase is not Phase.STOPPING:
        return tx.finish(stale=True)  # the same answer again (at-least-once delivery)
    phase = advance(rep.phase, Trigger.PLACED, rep.replica_id)
    if rep.phase is not Phase.PENDING:  # placed after a stop: the stop wins
        return tx.finish()
    ranks = dep.ranks.place(rep.replica_id, e.node_id)
    new = _evolve(rep, phase=phase, node_id=e.node_id, config_version=dep.config_version)
    dep = _put_replica(dep, rep, new, ranks=ranks)
    tx.put(dep)
    tx.emit(_initialize(dep, rep.replica_id))
    return tx.finish()


@_about_replica
def _on_replica_ready(tx: _Tx, e: ReplicaReady, dep: Deployment, rep: Replica) -> Step:
    if rep.phase in (Phase.RUNNING, Phase.RECONFIGURING):
        return tx.finish(stale=True)  # the same answer again (at-least-once delivery)
    phase = advance(rep.phase, Trigger.READY, rep.replica_id)
    if rep.phase is not Phase.STARTING:
        return tx.finish()
    new = _evolve(rep, phase=phase)
    if rep.config_version < dep.config_version or rep.rank_update_due:
        reason = "user_config" if rep.config_version < dep.config_version else "rank"
        new, cmd = _reconfigure(dep, new, reason)
        tx.emit(cmd)
    tx.put(_put_replica(dep, rep, new))
    return tx.finish()


@_about_replica
def _on_replica_reconfigured(tx: _Tx, e: ReplicaReconfigured, dep: Deployment, rep: Replica) -> Step:
    if e.version > rep.version:
        raise InvalidEvent(
            f"replica {rep.replica_id!r} acknowledges reconfigure {e.version}, "
            f"but the last one sent was {rep.version}"
        )
    if e.version < rep.version or rep.phase is Phase.RUNNING:
        return tx.finish(stale=True)  # an older reconfigure, or a repeated answer
    phase = advance(rep.phase, Trigger.RECONFIGURED, rep.replica_id)
    if phase is not rep.phase:
        tx.put(_put_replica(dep, rep, _evolve(rep, phase=phase)))
    return tx.finish()


@_about_replica
def _on_replica_crashed(tx: _Tx, e: ReplicaCrashed, dep: Deployment, rep: Replica) -> Step:
    tx.put(_crash(tx, dep, rep))
    return tx.finish()


@_about_replica
def _on_replica_stopped(tx: _Tx, e: ReplicaStopped, dep: Deployment, rep: Replica) -> Step:
    advance(rep.phase, Trigger.STOPPED, rep.replica_id)
    tx.put(_remove(tx, dep, rep, dep.ranks.release(rep.replica_id)))
    return tx.finish()


def _on_node_lost(tx: _Tx, e: NodeLost) -> Step:
    hit = False
    for name in sorted(tx.deps.keys()):
        dep = tx.deps[name]
        on_node = [r for r in dep.replicas.values() if r.node_id == e.node_id]
        for rep in _by_rank(dep, on_node):
            dep = _crash(tx, dep, dep.replicas[rep.replica_id])
            hit = True
        if on_node:
            tx.put(dep)
    return tx.finish(stale=not hit)


def _on_controller_recovered(tx: _Tx, e: ControllerRecovered) -> Step:
    from .recovery import rebuild

    rebuild(tx, e)
    step = tx.finish()
    known = {d.name for d in e.deployments}
    stops = [c for c in step.commands if isinstance(c, StopReplica)]
    outcome = RecoveryOutcome(
        started=tuple(c.replica_id for c in step.commands if isinstance(c, StartReplica)),
        stopped=tuple(c.replica_id for c in stops if c.deployment in known),
        unknown_stopped=tuple(c.replica_id for c in stops if c.deployment not in known),
        reconfigured=tuple(c.replica_id for c in step.commands if isinstance(c, ReconfigureReplica)),
    )
    return attrs.evolve(step, recovery=outcome)


_HANDLERS: dict[type, Callable[[_Tx, Any], Step]] = {
    DeploymentApplied: _on_deployment_applied,
    ScaleRequested: _on_scale_requested,
    ReplicaPlaced: _on_replica_placed,
    ReplicaReady: _on_replica_ready,
    ReplicaReconfigured: _on_replica_reconfigured,
    ReplicaCrashed: _on_replica_crashed,
    ReplicaStopped: _on_replica_stopped,
    NodeLost: _on_node_lost,
    ControllerRecovered: _on_controller_recovered,
}


def step(state: State, event: object) -> Step:
    """Apply one event. Pure: same state and event, same result; ``state`` is untouched.

    Raises :class:`~rankcore.errors.InvalidEvent` (naming what was wrong) for an
    event that is illegal now; the caller keeps its state.
    """
    if not isinstance(state, State):
        raise InvalidEvent(f"step needs a rankcore State, got {type(state).__name__}")
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise InvalidEvent(
            f"step got {event!r}, which is not a rankcore event "
            f"(one of: {', '.join(t.__name__ for t in _HANDLERS)})"
        )
    return handler(_Tx(state), event)


def run(events: Iterable[object], state: State | None = None) -> tuple[State, list]:
    """Apply events in order; return the final state and every command, in order."""
    state = State() if state is None else state
    commands: list = []
    for event in events:
        result = step(state, event)
        state = result.state
        commands.extend(result.commands)
    return state, commands


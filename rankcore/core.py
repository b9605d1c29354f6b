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

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs

from .base import unhealthy
from .base.books import release, tiered
from .base.cluster import clock_work_due
from .base.commands import ReconfigureReplica, StartReplica, StopReplica, UpdateWorldSize
from .base.errors import InvalidEvent, InvariantViolation
from .base.events import (
    AutoscalingMetrics,
    BundlesPlaced,
    ControllerRecovered,
    DeploymentApplied,
    DeploymentDeleted,
    HealthChecked,
    ModelsReported,
    NodeCapacityChanged,
    NodeDraining,
    NodeJoined,
    NodeLost,
    PlacementFailed,
    ProxiesConfigured,
    ProxyCrashed,
    ProxyHealthChecked,
    ProxyStarted,
    ReplicaCrashed,
    ReplicaPlaced,
    ReplicaReady,
    ReplicaReconfigured,
    ReplicaStopped,
    ScaleRequested,
    SleepRequested,
    Tick,
    TierMoved,
    TierMoveFailed,
    WakeRequested,
    WeightsPushed,
    WeightsUpdated,
)
from .base.fields import checker, shown
from .base.lifecycle import LIVE, Phase, Residency, Trigger, advance
from .base.records import unchecked_copy
from .base.state import (
    Deployment,
    RecoveryOutcome,
    Replica,
    State,
    Step,
)
from .base.transaction import Tx, by_rank, initialize, put_replica, reconfigure, remove, stop_command
from .control import (
    autoscaling,
    bluegreen,
    clock,
    deletion,
    health,
    models,
    pool,
    proxies,
    rollouts,
)
from .control.moves import check_scale, crash, fail, reconcile, scale, succeed_retired
from .control.passes import finish
from .control.recovery import rebuild, unresponsive_gone
from .fastpaths import FAST_PATHS
from .placement import deadlines, gangs, restarts, static
from .placement.scheduling import adopt, clear_avoid, hold, new_node, rekind, unreserve
from .tiers import devices, residency

__all__ = ["step", "run"]

_copy = unchecked_copy  # rankcore.base.records: not validated, no per-call introspection

# --------------------------------------------------------------- handlers
_E = TypeVar("_E")
#: the answers that say a process is gone
_GONE = (ReplicaStopped, ReplicaCrashed)


def _about_replica(handler: Callable[[Tx, _E, Deployment, Replica], Step]) -> Callable[[Tx, _E], Step]:
    """For events naming a replica: look it up; news about one that has left is stale."""

    def on_event(tx: Tx, e: _E) -> Step:
        found = tx.lookup(e.replica_id)  # type: ignore[attr-defined]
        if found is None and type(e) in _GONE and unresponsive_gone(tx, e.replica_id):  # type: ignore[attr-defined]
            return finish(tx)  # an unresponsive replica a recovery stopped: its deployment gives ranks again
        if found is None or found[1].phase is Phase.FAILED:
            return finish(tx, stale=True)  # (a FAILED replica's process was stopped; it waits for its bundles)
        return handler(tx, e, *found)

    on_event.__name__ = handler.__name__
    return on_event


def _on_deployment_applied(tx: Tx, e: DeploymentApplied) -> Step:
    dep = tx.deps.get(e.name)
    if dep is None:
        deletion.revive(tx, e.name)
        dep = autoscaling.applied(Deployment.applied(e, revision=rollouts.revision(e.config)), e, new=True)
        tx.put(reconcile(tx, dep))
        return finish(tx)
    _check_same_shape(dep, e)
    dep = deletion.cancel(dep)  # (applied again while being deleted: it stays)
    resources_changed = e.resources != dep.resources
    moved = dep.static is not None and e.static_placement is not None and e.static_placement != dep.static
    if dep.health_failed and (rollouts.revision(e.config) != dep.revision or e.user_config != dep.user_config):
        dep = unhealthy.recovered(dep)  # (a new deploy: UPDATING, no longer UNHEALTHY for a replica that died)
    health.retune(tx, dep, e.config)  # (new check timings reach the replicas running now)
    dep = _copy(dep, has_reconfigure=e.has_reconfigure, reconfigure_takes_rank=e.reconfigure_takes_rank,
                  max_replicas=e.max_replicas, config=e.config)  # (dep.static moves below, if it did)
    call_off = bluegreen.calls_off(dep, rollouts.revision(e.config), e.num_replicas, e.config.rollout.update_mode)
    dep = rollouts.applied(dep, e.config)  # (a heavyweight change: the rollout pass replaces its replicas)
    if moved:
        if e.static_placement is None:
            raise InvariantViolation("a static deployment's DeploymentApplied without its static_placement")
        dep = static.bundles_moved(tx, dep, e.static_placement.bundle_nodes, "DeploymentApplied({!r}).static_placement")
    if resources_changed and tx.managed:
        rekind(tx, dep)  # replicas already on a node keep what they reserved
    config_changed = e.user_config != dep.user_config
    if config_changed:
        dep = _copy(dep, user_config=e.user_config, config_version=dep.config_version + 1)
    target = dep.target
    dep = autoscaling.applied(dep, e, new=False)  # (autoscaled: num_replicas is no target)
    if dep.target != target:
        tx.emit(UpdateWorldSize(deployment=dep.name, world_size=dep.target))
    tx.put(bluegreen.called_off(tx, dep) if call_off else reconcile(tx, dep))
    return finish(tx)


def _check_same_shape(dep: Deployment, e: DeploymentApplied) -> None:
    """What a live deployment cannot change: its static mapping, its gang size."""
    static.check_same_shape(dep, e.static_placement)
    gangs.check_same_shape(dep, e.gang_size)
    devices.check_same_model(dep, e.model_bytes, e.resources, e.multiplexed_bytes)


def _on_bundles_placed(tx: Tx, e: BundlesPlaced) -> Step:
    dep = tx.dep(e.deployment)
    if dep.static is None:
        raise InvalidEvent(f"BundlesPlaced: deployment {dep.name!r} has no static placement")
    if e.bundle_nodes == dep.static.bundle_nodes:
        return finish(tx, stale=True)
    tx.put(static.bundles_moved(tx, dep, e.bundle_nodes))
    return finish(tx)


def _on_deployment_deleted(tx: Tx, e: DeploymentDeleted) -> Step:
    dep = tx.dep(e.deployment)
    if dep.deleting:
        return finish(tx, stale=True)  # (deleted again: nothing more to do)
    deletion.begin(tx, dep)
    return finish(tx)


def _on_scale_requested(tx: Tx, e: ScaleRequested) -> Step:
    dep = tx.dep(e.deployment)
    deletion.refuse_scale(dep)
    autoscaling.refuse_scale(dep)
    bluegreen.refuse_scale(dep)
    if dep.static is not None:
        static.check_scale(dep, e.num_replicas)
    if dep.gang_size > 1:
        gangs.check_scale(dep, e.num_replicas, e.victims)
    check_scale(dep, e.num_replicas, e.victims)
    tx.put(scale(tx, dep, e.num_replicas, e.victims))
    return finish(tx)


def _on_autoscaling_metrics(tx: Tx, e: AutoscalingMetrics) -> Step:
    if e.deployment in tx.deleted:
        return finish(tx, stale=True)  # (late news of a deployment deleted and gone)
    return finish(tx, stale=not autoscaling.observe(tx, tx.dep(e.deployment), e))


@_about_replica
def _on_replica_placed(tx: Tx, e: ReplicaPlaced, dep: Deployment, rep: Replica) -> Step:
    if rep.phase is not Phase.PENDING and rep.node_id == e.node_id and rep.phase is not Phase.STOPPING:
        return finish(tx, stale=True)  # the same answer again (at-least-once delivery)
    phase = advance(rep.phase, Trigger.PLACED, rep.replica_id)
    if rep.phase is not Phase.PENDING:  # placed after a stop: the stop wins
        return finish(tx)
    rid = rep.replica_id
    if rid in tx.view.delayed:  # its StartReplica was never sent: no executor can have placed it
        why = "held until its gang can start whole" if gangs.is_held(tx.view, rid) else "waiting out a restart backoff"
        raise InvalidEvent(f"ReplicaPlaced: replica {rid!r} was never started ({why}: its StartReplica "
                           f"has not been sent)")
    if tx.managed and dep.static is None and e.node_id not in tx.view.nodes:
        if e.node_id in tx.view.lost:  # placed there as the node went: it went with it
            tx.put(fail(tx, dep, rep))
            return finish(tx)
        raise InvalidEvent(f"ReplicaPlaced: replica {rid!r} placed on node {e.node_id!r}, which never joined the "
                           f"cluster the core places on (send NodeJoined first)")
    if rep.node_id != e.node_id and tx.managed and tiered(tx.view, dep):
        # A model booked by memory runs only on the GPUs the core booked for it (rankcore.tiers.devices):
        # an incarnation elsewhere is stopped at once and replaced, as after a placement timeout.
        deadlines.answered(tx, rid)
        tx.emit(stop_command(dep, rid, now=True))
        tx.put(crash(tx, dep, rep))
        return finish(tx)
    ranks = dep.ranks
    if rep.node_id != e.node_id:
        # Not where the core reserved it (or it was waiting and the executor
        # placed it itself): what really happened wins.
        if rep.node_id is not None:
            ranks = ranks.unplace(rid)
        ranks = ranks.place(rid, e.node_id)
        if dep.static is not None:  # the executor knows better where the caller's group has that bundle
            dep = static.placed_elsewhere(dep, ranks.global_rank(rid), e.node_id)
        elif tx.managed:  # the booking moves too
            release(tx, rid)
            hold(tx, rid, e.node_id, dep.resources)
    new = residency.at_start(dep, _copy(rep, phase=phase, node_id=e.node_id, config_version=dep.config_version))
    deadlines.answered(tx, rid)  # its placement deadline
    dep = put_replica(dep, rep, new, ranks=ranks)
    tx.put(dep)
    tx.emit(initialize(dep, rid))
    deadlines.start(tx, dep, rid)
    return finish(tx)


@_about_replica
def _on_placement_failed(tx: Tx, e: PlacementFailed, dep: Deployment, rep: Replica) -> Step:
    if rep.phase is not Phase.PENDING or rep.node_id != e.node_id:
        return finish(tx, stale=True)  # placed meanwhile, stopped, or an older reservation
    deadlines.answered(tx, rep.replica_id)  # its placement deadline
    if dep.static is not None:  # its bundles are fixed: a new incarnation tries them again
        tx.put(crash(tx, dep, rep))
        return finish(tx)
    tx.put(unreserve(tx, dep, rep))
    return finish(tx)


@_about_replica
def _on_replica_ready(tx: Tx, e: ReplicaReady, dep: Deployment, rep: Replica) -> Step:
    if rep.phase in (Phase.RUNNING, Phase.RECONFIGURING):
        return finish(tx, stale=True)  # the same answer again (at-least-once delivery)
    phase = advance(rep.phase, Trigger.READY, rep.replica_id)
    if rep.phase is not Phase.STARTING:
        return finish(tx)
    new = _copy(rep, phase=phase)
    dep = restarts.started(dep)
    deadlines.answered(tx, rep.replica_id)  # its start deadline
    if rep.config_version < dep.config_version or rep.rank_update_due:
        reason = "user_config" if rep.config_version < dep.config_version else "rank"
        new, cmd = reconfigure(dep, new, reason)
        tx.emit(cmd)
    tx.put(put_replica(dep, rep, residency.settle(tx, dep, new)))  # (new weights, asleep: rankcore.tiers.residency)
    return finish(tx)


@_about_replica
def _on_replica_reconfigured(tx: Tx, e: ReplicaReconfigured, dep: Deployment, rep: Replica) -> Step:
    if e.version > rep.version:
        raise InvalidEvent(
            f"replica {rep.replica_id!r} acknowledges reconfigure {e.version}, "
            f"but the last one sent was {rep.version}"
        )
    if e.version < rep.version or rep.phase is Phase.RUNNING:
        return finish(tx, stale=True)  # an older reconfigure, or a repeated answer
    phase = advance(rep.phase, Trigger.RECONFIGURED, rep.replica_id)
    if phase is not rep.phase:
        tx.put(put_replica(dep, rep, _copy(rep, phase=phase)))
    return finish(tx)


@_about_replica
def _on_replica_crashed(tx: Tx, e: ReplicaCrashed, dep: Deployment, rep: Replica) -> Step:
    clock.suspect(tx, rep, e.cause)
    tx.put(fail(tx, restarts.failed_start(dep, rep, e.cause, e.reason), rep))
    return finish(tx)


@_about_replica
def _on_health_checked(tx: Tx, e: HealthChecked, dep: Deployment, rep: Replica) -> Step:
    return health.checked(tx, e, dep, rep)


@_about_replica
def _on_replica_stopped(tx: Tx, e: ReplicaStopped, dep: Deployment, rep: Replica) -> Step:
    advance(rep.phase, Trigger.STOPPED, rep.replica_id)
    if rep.retiring:  # a rollout stopped it: its successor takes its ranks
        tx.put(succeed_retired(tx, dep, rep))
        return finish(tx)
    tx.put(remove(tx, dep, rep, dep.ranks.release(rep.replica_id)))
    return finish(tx)


def _on_sleep_requested(tx: Tx, e: SleepRequested) -> Step:
    dep = residency.sleep(tx, tx.dep(e.deployment))
    if dep is None:
        return finish(tx, stale=True)  # asleep already, every replica where it should be
    tx.put(dep)
    return finish(tx)


def _on_wake_requested(tx: Tx, e: WakeRequested) -> Step:
    dep = residency.wake(tx, tx.dep(e.deployment), e.weights_version)
    if dep is None:
        return finish(tx, stale=True)  # awake already, no newer weights, every replica where it should be
    tx.put(dep)
    return finish(tx)


def _on_weights_pushed(tx: Tx, e: WeightsPushed) -> Step:
    tx.put(residency.push(tx, tx.dep(e.deployment), e.version))
    return finish(tx)


@_about_replica
def _on_tier_moved(tx: Tx, e: TierMoved, dep: Deployment, rep: Replica) -> Step:
    new = residency.moved(tx, dep, rep, e.tier)
    if new is None:
        return finish(tx, stale=True)  # the same answer again
    tx.put(new)
    return finish(tx)


@_about_replica
def _on_tier_move_failed(tx: Tx, e: TierMoveFailed, dep: Deployment, rep: Replica) -> Step:
    new = residency.move_failed(tx, dep, rep)
    if new is None:
        return finish(tx, stale=True)  # no move in flight (the same answer again)
    tx.put(new)
    return finish(tx)


@_about_replica
def _on_weights_updated(tx: Tx, e: WeightsUpdated, dep: Deployment, rep: Replica) -> Step:
    new = residency.updated(dep, rep, e.version)
    if new is None:
        return finish(tx, stale=True)  # an older version's answer, or the same again
    tx.put(new)
    return finish(tx)


def _on_node_lost(tx: Tx, e: NodeLost) -> Step:
    hit = False
    if e.node_id in tx.cluster.nodes:  # first, so no replacement is placed back there
        cl = tx.cl
        cl.nodes = cl.nodes.delete(e.node_id)
        cl.lost = cl.lost | {e.node_id}
        devices.node_lost(cl, e.node_id)
        if e.node_id in cl.suspects:
            cl.suspects = cl.suspects.delete(e.node_id)
        cl.changed = hit = True
    for name in sorted(tx.deps.keys()):
        dep = tx.deps[name]
        if dep.static is not None:
            hit = static.node_lost(tx, dep, e.node_id) or hit
            continue
        on_node = [r for r in dep.replicas.values() if r.node_id == e.node_id]
        for rep in by_rank(dep, on_node):
            current = dep.replicas.get(rep.replica_id)
            if current is not None:  # (not restarted already with its gang)
                dep = unhealthy.died(dep, current, f"died: its node {e.node_id} was lost")
                dep = fail(tx, dep, current)
            hit = True
        if on_node:
            tx.put(dep)
    return finish(tx, stale=not hit)


def _on_node_joined(tx: Tx, e: NodeJoined) -> Step:
    cl = tx.cl
    known = cl.nodes.get(e.node_id)
    if known is not None:
        if tuple(sorted(known.resources.items())) == e.resources and known.labels == e.labels:
            return finish(tx, stale=True)  # the same news again
        raise InvalidEvent(f"NodeJoined: node {e.node_id!r} is already in the cluster with other resources or "
                           f"labels (send NodeCapacityChanged, or NodeLost first)")
    node = new_node(e.node_id, e.resources, e.labels, e.order, cl.joined)
    for node_id, need in cl.held.values():  # (a node back after recovery may hold replicas)
        if node_id == e.node_id:
            node = _copy(node, free=node.free.update({k: node.free.get(k, 0.0) - v for k, v in need}),
                         tenants=node.tenants + 1)
    cl.nodes = cl.nodes.set(e.node_id, node)
    devices.joined(cl, e.node_id, e.devices, e.cpu_cache_bytes)
    if e.node_id in cl.lost:
        cl.lost = cl.lost - {e.node_id}
    first = cl.joined == 0
    cl.joined += 1
    if first:  # the core places from now on: book what runs, queue what waits
        adopt(tx, sorted(tx.deps.keys()))
    if e.devices:
        _adopt_gpu_memory(tx, e.node_id)
    cl.blocked = None
    cl.changed = True
    clear_avoid(tx, e.node_id)
    return finish(tx)


def _adopt_gpu_memory(tx: Tx, node_id: str) -> None:
    """Replicas of models booked by memory already HOT on a node that declares its
    devices now (placed by the executor before the core placed): booked where they
    fit, else stopped at once and replaced (``devices.adopt``)."""
    cl = tx.cl
    for name in sorted(tx.deps.keys()):
        dep = tx.deps[name]
        if not tiered(cl, dep):
            continue
        for rep in by_rank(dep, [r for r in dep.replicas.values() if r.node_id == node_id]):
            rid = rep.replica_id
            if rid in cl.hot or rep.residency is Residency.WARM or rep.phase not in LIVE:
                continue
            if devices.adopt(cl, dep, rid, node_id) or rep.phase is Phase.STOPPING:
                continue  # (booked; or leaving anyway)
            tx.emit(stop_command(dep, rid, now=True))
            dep = crash(tx, dep, dep.replicas[rid])
        tx.put(dep)


def _on_node_capacity_changed(tx: Tx, e: NodeCapacityChanged) -> Step:
    node = tx.cluster.nodes.get(e.node_id)
    if node is None:
        return finish(tx, stale=True)  # a node that left (or never joined)
    devices.check_capacity(tx.cluster, e.node_id, e.resources)
    cl = tx.cl
    new = dict(e.resources)
    free = {k: node.free.get(k, 0.0) + new.get(k, 0.0) - node.resources.get(k, 0.0)
            for k in set(new) | set(node.free.keys())}
    cl.nodes = cl.nodes.set(e.node_id, _copy(node, resources=type(node.resources)(new),
                                               free=type(node.free)(free)))
    cl.blocked = None
    cl.changed = True
    clear_avoid(tx, e.node_id)
    return finish(tx)


def _on_proxies_configured(tx: Tx, e: ProxiesConfigured) -> Step:
    return finish(tx, stale=not proxies.configure(tx, e))


def _on_proxy_started(tx: Tx, e: ProxyStarted) -> Step:
    return finish(tx, stale=not proxies.started(tx, e))


def _on_proxy_crashed(tx: Tx, e: ProxyCrashed) -> Step:
    return finish(tx, stale=not proxies.died(tx, e))


def _on_proxy_health_checked(tx: Tx, e: ProxyHealthChecked) -> Step:
    return finish(tx, stale=not proxies.health_checked(tx, e))


@_about_replica
def _on_models_reported(tx: Tx, e: ModelsReported, dep: Deployment, rep: Replica) -> Step:
    new = models.reported(dep, rep, e.model_ids)
    if new is None:
        return finish(tx, stale=True)  # the same set again, or a replica on its way out
    tx.put(new)
    return finish(tx)


def _on_node_draining(tx: Tx, e: NodeDraining) -> Step:
    return finish(tx, stale=not proxies.node_draining(tx, e))


def _on_tick(tx: Tx, e: Tick) -> Step:
    old = tx.cluster
    if old.clock and e.now <= old.now:
        return finish(tx, stale=True)  # no time passed (or an older tick)
    clock.advance(tx, e.now, clock_work_due(old, e.now))
    return finish(tx)


def _on_controller_recovered(tx: Tx, e: ControllerRecovered) -> Step:
    rebuild(tx, e)
    step = finish(tx, retell=True)  # (the demand told anew: rankcore.placement.demand)
    known = {d.name for d in e.deployments}
    silent = {u.replica_id for u in e.unresponsive}
    stops = [c for c in step.commands if isinstance(c, StopReplica)]
    outcome = RecoveryOutcome(
        started=tuple(c.replica_id for c in step.commands if isinstance(c, StartReplica)),
        stopped=tuple(c.replica_id for c in stops if c.deployment in known and c.replica_id not in silent),
        unknown_stopped=tuple(c.replica_id for c in stops if c.deployment not in known),
        reconfigured=tuple(c.replica_id for c in step.commands if isinstance(c, ReconfigureReplica)),
        unresponsive_stopped=tuple(c.replica_id for c in stops if c.deployment in known and c.replica_id in silent),
    )
    return attrs.evolve(step, recovery=outcome)


_HANDLERS: dict[type, Callable[[Tx, Any], Step]] = {
    DeploymentApplied: _on_deployment_applied,
    BundlesPlaced: _on_bundles_placed,
    ScaleRequested: _on_scale_requested,
    DeploymentDeleted: _on_deployment_deleted,
    ReplicaPlaced: _on_replica_placed,
    ReplicaReady: _on_replica_ready,
    ReplicaReconfigured: _on_replica_reconfigured,
    ReplicaCrashed: _on_replica_crashed,
    HealthChecked: _on_health_checked,
    ReplicaStopped: _on_replica_stopped,
    NodeLost: _on_node_lost,
    NodeJoined: _on_node_joined,
    NodeCapacityChanged: _on_node_capacity_changed,
    PlacementFailed: _on_placement_failed,
    Tick: _on_tick,
    ControllerRecovered: _on_controller_recovered,
    SleepRequested: _on_sleep_requested,
    WakeRequested: _on_wake_requested,
    WeightsPushed: _on_weights_pushed,
    TierMoved: _on_tier_moved,
    TierMoveFailed: _on_tier_move_failed,
    WeightsUpdated: _on_weights_updated,
    AutoscalingMetrics: _on_autoscaling_metrics,
    ProxiesConfigured: _on_proxies_configured,
    ProxyStarted: _on_proxy_started,
    ProxyCrashed: _on_proxy_crashed,
    ProxyHealthChecked: _on_proxy_health_checked,
    NodeDraining: _on_node_draining,
    ModelsReported: _on_models_reported,
}

#: each event type's check, as its constructor checks it (``rankcore.base.fields.check_record``)
_CHECKS: dict[type, Callable[[Any], None]] = {kind: checker(kind) for kind in _HANDLERS}


def step(state: State, event: object) -> Step:
    """Apply one event. Pure: same state and event, same result; ``state`` is untouched.

    Raises :class:`~rankcore.base.errors.InvalidEvent` (naming what was wrong) for an
    event that is illegal now, and :class:`~rankcore.base.errors.InvalidConfig` (naming
    the field) for one its constructor would have refused (unpickled, forged); the
    caller keeps its state.
    """
    if not isinstance(state, State):
        raise InvalidEvent(f"step needs a rankcore State, got {type(state).__name__}")
    kind = type(event)
    check = _CHECKS.get(kind)
    if check is None:
        raise InvalidEvent(
            f"step got {shown(event)}, which is not a rankcore event "
            f"(one of: {', '.join(t.__name__ for t in _HANDLERS)})"
        )
    check(event)  # (built by its constructor, or as if: one unpickled or forged is checked here)
    fast = FAST_PATHS.get(kind)  # (fast_step, inlined: a call less on nine steps in ten)
    if fast is not None:
        done = fast(state, event)
        if done is not None:
            return done
    return general_step(state, event, _HANDLERS[kind])


def fast_step(state: State, event: object) -> Step | None:
    """``event``'s step by its fast path (``rankcore.fastpaths``), pool commands included; None where
    there is none or it declines (``general_step`` then)."""
    fast = FAST_PATHS.get(type(event))
    return None if fast is None else fast(state, event)


def general_step(state: State, event: object, handler: Any = None) -> Step:
    """``step`` without the fast paths (``rankcore.fastpaths``): every event
    through its handler. The property suite checks both give the same steps."""
    if handler is None:
        handler = _HANDLERS[type(event)]
    now = getattr(event, "now", None)
    if now is not None and handler is not _on_tick:  # an answer that carries the executor's clock
        cl = state.cluster
        if not cl.clock or now > cl.now:
            if clock_work_due(cl, now):
                # exactly Tick(now) then the event, as one step: two batches of
                # commands, each in its own order
                tick = Tick(now=now)
                first = pool.announce(state, tick, _on_tick(Tx(state), tick))
                second = pool.announce(first.state, event, handler(Tx(first.state), event))
                return attrs.evolve(second, commands=first.commands + second.commands,
                                    compactions=first.compactions + second.compactions, pool=first.pool + second.pool)
            tx = Tx(state)
            clock.advance(tx, now, False)  # only the clock moves: no working copy of the cluster
            return pool.announce(state, event, handler(tx, event))
    return pool.announce(state, event, handler(Tx(state), event))


def run(events: Iterable[object], state: State | None = None) -> tuple[State, list]:
    """Apply events in order; return the final state and every command, in order."""
    state = State() if state is None else state
    commands: list = []
    for event in events:
        result = step(state, event)
        state = result.state
        commands.extend(result.commands)
    return state, commands


"""Static placement on a caller's placement group (Ray RFC #59857): every move.

Rank N runs on the first bundle of ``mapping[N]`` of the caller's group
(``rankcore.base.bundles.StaticPlacement``, the map as plain data). The rules, each
in one function here:

* ``place``: a replica goes on its rank's bundles (``PlaceReplica`` with the
  group; nothing is booked on the cluster model and no placement deadline runs:
  there is no other node to try);
* ``start_failed``: a new replica whose rank's bundles are not all placed
  starts FAILED (no process), and waits for them;
* ``crash``: a replica that died comes back on the same bundles with the same
  rank (after the restart backoff, ``rankcore.placement.restarts``), or FAILED when a
  bundle of its rank has no node now;
* ``fail``: a bundle of a live replica's rank lost its node: FAILED, its
  process stopped, its rank kept;
* ``bundles_moved``: the caller's group has its bundles somewhere else now
  (``BundlesPlaced``): FAILED replicas whose bundles are back restart there,
  live ones follow a bundle that moved, lose one that went;
* ``node_lost``: a lost node fails the ranks with a bundle there and
  restarts the ones that only ran there;
* ``placed_elsewhere``: the executor placed a replica on another node than
  the map said: the executor knows where the group's bundle is;
* ``check_scale`` / ``check_same_shape``: what a static deployment refuses
  (any count but its mapping's length or 0; a new mapping while live).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import"); ``StaticPlacement`` and ``consecutive_mapping`` are
re-exported here for ``rankcore.placement.static.StaticPlacement``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..base.bundles import StaticPlacement, consecutive_mapping
from ..base.commands import PlaceReplica
from ..base.errors import InvalidConfig, InvalidEvent, InvariantViolation
from ..base.fields import shown
from ..base.lifecycle import Phase, Trigger, advance
from ..base.records import maker, unchecked_copy
from ..base.state import Deployment, Replica
from ..base.transaction import Tx, disarm, put_replica, remove, stop_command, succeed, wants_successor
from . import restarts

__all__ = ["StaticPlacement", "consecutive_mapping", "place", "start_failed", "crash", "fail", "restart_failed",
           "bundles_moved", "node_lost", "placed_elsewhere", "check_scale", "check_same_shape"]

_copy = unchecked_copy  # rankcore.base.records: not validated, no per-call introspection
_Place = maker(PlaceReplica)


def _map(dep: Deployment) -> StaticPlacement:
    static = dep.static
    if static is None:
        raise InvariantViolation("a static-placement rule ran on a deployment without static placement")
    return static


def place(tx: Tx, dep: Deployment, rid: str) -> Deployment:
    """Put ``rid`` on its rank's first bundle (the caller's group holds the
    resources: nothing is booked on the cluster model): PlaceReplica."""
    static = _map(dep)
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


def start_failed(dep: Deployment, global_ranks: Iterable[tuple[str, int]]) -> set[str]:
    """Of new replicas ``(id, global rank)``, those that start FAILED: a bundle of
    their rank has no node. Refuses to start while replicas of an earlier
    incarnation of the deployment still stop on its ranks (their bundles are busy)."""
    static = _map(dep)
    _check_none_stopping(dep)
    return {rid for rid, g in global_ranks if not static.placed(g)}


def _check_none_stopping(dep: Deployment) -> None:
    """A static deployment's ranks are its bundles: none is started again while a replica still stops there
    (one a rollout retires keeps its rank for its successor: no new replica is started on it)."""
    stopping = dep.count(Phase.STOPPING) - dep.retiring
    if stopping:
        raise InvalidEvent(f"deployment {dep.name!r} (static placement) still has {stopping} "
                           f"replicas stopping on its ranks: bring it back once they have stopped")


def crash(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """A static replica died: back on the same bundles with the same rank (or
    FAILED, when a bundle of its rank is not placed now); one that was leaving is gone."""
    advance(rep.phase, Trigger.CRASH, rep.replica_id)
    if rep.retiring:
        return succeed_retired(tx, dep, rep)
    if rep.phase is Phase.STOPPING:
        return remove(tx, dep, rep, dep.ranks.release(rep.replica_id))
    static = _map(dep)
    if not static.placed(dep.ranks.global_rank(rep.replica_id)):
        return fail(tx, dep, rep, stop=False)
    (new_id,) = tx.new_ids(dep.name, 1)
    delay = restarts.backoff_s(dep) if tx.view.clock else 0.0
    dep = succeed(tx, dep, rep, new_id, announce=delay == 0)
    if delay > 0:
        restarts.defer(tx, new_id, rep.replica_id, tx.view.now + delay)
        return dep
    return place(tx, dep, new_id)


def succeed_retired(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """A replica a rollout retired has gone: its successor starts on its rank's bundles (FAILED,
    holding the rank, when a bundle of it has no node now); none when no longer wanted."""
    rid = rep.replica_id
    if not wants_successor(dep):
        return remove(tx, dep, rep, dep.ranks.release(rid))
    (new_id,) = tx.new_ids(dep.name, 1)
    if _map(dep).placed(dep.ranks.global_rank(rid)):
        return place(tx, succeed(tx, dep, rep, new_id), new_id)
    dep = succeed(tx, dep, rep, new_id, announce=False)
    new = dep.replicas[new_id]
    return put_replica(dep, new, _copy(new, phase=advance(new.phase, Trigger.BUNDLE_LOST, new_id)))


def fail(tx: Tx, dep: Deployment, rep: Replica, stop: bool = True) -> Deployment:
    """A bundle of ``rep``'s rank lost its node: FAILED. It keeps its global
    rank, is not replaced or moved, and its process (if any) is stopped."""
    rid = rep.replica_id
    phase = advance(rep.phase, Trigger.BUNDLE_LOST, rid)
    waiting = rid in tx.view.delayed  # out its restart backoff: never started, nothing to stop
    disarm(tx, rid)  # (a start deadline, a restart backoff)
    ranks = dep.ranks.unplace(rid) if rep.node_id is not None else dep.ranks
    if stop and not waiting:
        tx.emit(stop_command(dep, rid, now=True))
    return put_replica(dep, rep, _copy(rep, phase=phase, node_id=None, rank_update_due=False), ranks=ranks)


def restart_failed(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """A FAILED replica whose bundles are all placed again: a new incarnation on its rank and bundles."""
    advance(rep.phase, Trigger.RESTART, rep.replica_id)
    (new_id,) = tx.new_ids(dep.name, 1)
    return place(tx, succeed(tx, dep, rep, new_id), new_id)


def bundles_moved(tx: Tx, dep: Deployment, bundle_nodes: tuple, said: str = "BundlesPlaced({!r})") -> Deployment:
    """The caller's group has its bundles on ``bundle_nodes`` now: FAILED replicas
    whose bundles are all placed restart there; a live replica whose bundle lost
    its node fails; one whose bundle moved follows it. ``said``: the event (and field)
    that said so, as a refusal names it."""
    static = _map(dep)
    if len(bundle_nodes) != static.bundle_count:
        raise InvalidEvent(f"{said.format(dep.name)} lists {len(bundle_nodes)} bundles, but group "
                           f"{static.group!r} has {static.bundle_count}")
    static = static.with_nodes(bundle_nodes)
    dep = _copy(dep, static=static)
    for rid in list(dep.ranks):  # global-rank order
        rep = dep.replicas[rid]
        g = dep.ranks.global_rank(rid)
        if rep.phase is Phase.FAILED:
            if static.placed(g):
                dep = restart_failed(tx, dep, rep)
        elif rep.phase is not Phase.STOPPING and not static.placed(g):
            dep = fail(tx, dep, rep)
        elif rep.phase is not Phase.STOPPING and rep.node_id is not None and rep.node_id != static.node_of(g):
            tx.emit(stop_command(dep, rep.replica_id, now=True))  # its bundle moved: follow it
            dep = crash(tx, dep, rep)
    return dep


def node_lost(tx: Tx, dep: Deployment, node_id: str) -> bool:
    """``node_id`` is gone: a rank with a bundle there is FAILED (not moved: the
    group is the caller's); one that only ran there restarts on its bundles.
    Whether the deployment had anything there."""
    static = _map(dep)
    lost = set(static.ranks_on(node_id))
    there = {dep.ranks.global_rank(r.replica_id) for r in dep.replicas.values() if r.node_id == node_id}
    if not lost and not there:
        return False
    dep = _copy(dep, static=static.lose(node_id))
    for g in sorted(lost | there):
        rid = dep.ranks.holder_of(g)
        rep = dep.replicas.get(rid) if rid is not None else None
        if rep is None or rep.phase is Phase.FAILED:
            continue
        if rep.phase is Phase.STOPPING or g not in lost:  # leaving anyway; or back on its bundles
            dep = crash(tx, dep, rep)
        else:
            dep = fail(tx, dep, rep)
    tx.put(dep)
    return True


def placed_elsewhere(dep: Deployment, global_rank: int, node_id: str) -> Deployment:
    """The executor placed rank ``global_rank`` on ``node_id``, not where the map
    said: it knows better where the caller's group has that bundle."""
    static = _map(dep)
    nodes = list(static.bundle_nodes)
    nodes[static.bundles_of(global_rank)[0]] = node_id
    return _copy(dep, static=static.with_nodes(nodes))


def check_scale(dep: Deployment, num_replicas: int) -> None:
    """A static placement fixes the replica count to its mapping's length (or 0: shut down)."""
    static = _map(dep)
    if num_replicas not in (0, static.replicas):
        raise InvalidConfig(f"ScaleRequested({dep.name!r}): a static placement fixes the replica count to its "
                            f"mapping's length ({static.replicas}, or 0 to shut it down); "
                            f"got num_replicas={shown(num_replicas)}")
    if num_replicas > dep.active:  # (refused here even when no start follows at once: an unresponsive replica)
        _check_none_stopping(dep)


def check_same_shape(dep: Deployment, new: StaticPlacement | None) -> None:
    """A live deployment keeps its static mapping (group, mapping, capture_child_tasks):
    only where the bundles are may change (``BundlesPlaced``)."""
    if (dep.static is None) != (new is None) or (
            dep.static is not None and new is not None and not dep.static.same_layout(new)):
        raise InvalidConfig(
            f"DeploymentApplied({dep.name!r}) changes its static placement (group, mapping or "
            f"capture_child_tasks); only where the bundles are may change (BundlesPlaced): deploy it under a new name")

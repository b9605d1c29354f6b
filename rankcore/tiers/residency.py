"""Sleep, wake and weight versions: where a live replica's weights are, and
which version it holds (issue 21; docs/tiers.md).

RL post-training puts the inference replicas to sleep while the trainer uses
the GPUs, then wakes them with new weights (vLLM's sleep mode). Here a
deployment is *meant* to be asleep or awake (``Deployment.asleep``) and holds
the weights version last pushed; :func:`settle` is the one rule that moves a
replica towards both, called whenever a replica or its deployment changes:

* a replica that has been initialised and is behind the version gets
  ``UpdateWeights`` (a starting one too: it applies them once ready, and does
  not serve before it answers; one not yet initialised loads them at start,
  ``InitializeReplica.weights_version``);
* a running replica HOT while its deployment is asleep gets
  ``OffloadReplica``; one asleep (WARM) while its deployment is awake gets
  ``LoadReplica``. A move in flight is left alone until its answer.

Sleeping changes no rank and no world size: a sleeper keeps its process, its
ranks and its bundle. A failed move leaves the weights where they were; the
next request (``SleepRequested`` or ``WakeRequested`` again, a push) or a
recovery retries it.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from ..base.books import free_gpus
from ..base.commands import LoadReplica, OffloadReplica, UpdateWeights
from ..base.errors import InvalidEvent
from ..base.lifecycle import Phase, Residency, TierTrigger, advance_tier
from ..base.records import unchecked_copy
from ..base.state import Deployment, Replica
from ..base.transaction import Tx, by_rank, put_replica
from . import devices

__all__ = ["settle", "settle_all", "needs", "quiet", "serving", "fully_serving", "at_start",
           "sleep", "wake", "push", "moved", "move_failed", "updated"]

_copy = unchecked_copy
_INITIALISED = (Phase.STARTING, Phase.RUNNING, Phase.RECONFIGURING)
_SERVING = (Phase.RUNNING, Phase.RECONFIGURING)


def serving(dep: Deployment, rep: Replica) -> bool:
    """Running, on its GPU, holding the deployment's weights version (nothing pending), and not a
    blue-green's new set standing by while the old one serves (``Deployment.blues``): what a handle
    may send requests to (``rankcore.query.is_serving``)."""
    return (rep.phase in _SERVING and rep.residency is Residency.HOT and not rep.weights_pending
            and rep.weights_version == dep.weights_version and (not dep.blues or rep.blue_ranks is not None))


def fully_serving(dep: Deployment) -> bool:
    """Healthy, awake, and every replica serving (``rankcore.query.fully_serving``: what
    ``wait_until_serving`` waits for)."""
    return dep.healthy and not dep.asleep and all(serving(dep, r) for r in dep.replicas.values())


def needs(dep: Deployment, rep: Replica) -> tuple[bool, TierTrigger | None]:
    """(new weights due, the tier move due) for ``rep`` as it is now."""
    if rep.phase not in _INITIALISED:
        return False, None  # pending: InitializeReplica will carry the version; stopping, failed: nothing
    move = None
    if rep.phase in _SERVING:
        if dep.asleep and rep.residency is Residency.HOT:
            move = TierTrigger.SLEEP
        elif not dep.asleep and rep.residency is Residency.WARM:
            move = TierTrigger.WAKE
    return rep.weights_version < dep.weights_version, move


def quiet(dep: Deployment, rep: Replica) -> bool:
    """Nothing is due for ``rep`` (what a fast path asks before it skips :func:`settle`)."""
    return needs(dep, rep) == (False, None)


def settle(tx: Tx, dep: Deployment, rep: Replica) -> Replica:
    """What ``rep`` needs now (module docstring, :func:`needs`): the commands are
    emitted, the new record returned (the caller puts it)."""
    weights, move = needs(dep, rep)
    if weights:
        tx.emit(UpdateWeights(replica_id=rep.replica_id, deployment=dep.name, version=dep.weights_version))
        rep = _copy(rep, weights_version=dep.weights_version, weights_pending=True)
    if move is TierTrigger.WAKE and not devices.wake_room(tx, dep, rep.replica_id, rep.node_id):
        move = None  # waits for GPU room on its node (rankcore.tiers.devices; retried by rankcore.control.evictions)
    if move is not None:
        cmd = OffloadReplica if move is TierTrigger.SLEEP else LoadReplica
        tx.emit(cmd(replica_id=rep.replica_id, deployment=dep.name))
        rep = _copy(rep, residency=advance_tier(rep.residency, move, rep.replica_id))
    return rep


def settle_all(tx: Tx, dep: Deployment) -> Deployment:
    """Every replica of ``dep``, in rank order (the commands' order)."""
    for rep in by_rank(dep, list(dep.replicas.values())):
        new = settle(tx, dep, rep)
        if new is not rep:
            dep = put_replica(dep, rep, new)
    return dep


def _check_version(dep: Deployment, version: int, what: str) -> None:
    if version < dep.weights_version:
        raise InvalidEvent(f"{what}({dep.name!r}): weights version {version} is older than the last one pushed, "
                           f"{dep.weights_version} (versions only go up)")


def at_start(dep: Deployment, rep: Replica) -> Replica:
    """``rep`` as its ``InitializeReplica`` leaves it: given the deployment's weights
    version (``transaction.initialize`` puts it on the command)."""
    return rep if rep.weights_version == dep.weights_version else _copy(rep, weights_version=dep.weights_version)


def _request(tx: Tx, before: Deployment, meant: Deployment) -> Deployment | None:
    """Settle every replica of ``meant`` (what the request asks); None when nothing
    changed (a repeated request with every replica where it should be). A repeated
    request retries a move that failed."""
    new = settle_all(tx, meant)
    return None if new is before else new


def sleep(tx: Tx, dep: Deployment) -> Deployment | None:
    """``SleepRequested``: the deployment is meant to sleep (None: it sleeps already, every
    replica where it should be)."""
    return _request(tx, dep, dep if dep.asleep else _copy(dep, asleep=True))


def wake(tx: Tx, dep: Deployment, version: int | None) -> Deployment | None:
    """``WakeRequested``, with new weights when ``version`` is newer (None: awake already,
    no newer weights, every replica where it should be)."""
    if version is not None:
        _check_version(dep, version, "WakeRequested")
    newer = version is not None and version > dep.weights_version
    meant = dep
    if dep.asleep or newer:
        meant = _copy(dep, asleep=False, weights_version=version if newer else dep.weights_version)
    return _request(tx, dep, meant)


def push(tx: Tx, dep: Deployment, version: int) -> Deployment:
    """``WeightsPushed``: a new version for every replica."""
    if version <= dep.weights_version:
        raise InvalidEvent(f"WeightsPushed({dep.name!r}): version {version} is not newer than the last one "
                           f"pushed, {dep.weights_version}")
    return settle_all(tx, _copy(dep, weights_version=version))


_STABLE = (Residency.HOT, Residency.WARM)


def moved(tx: Tx, dep: Deployment, rep: Replica, tier: str) -> Deployment | None:
    """``TierMoved``: the weights arrived (None: stale). What happened wins: weights
    reported where the core did not send them (a move the previous controller sent,
    after a recovery) are where they are, and the replica is settled from there; an
    answer naming where a move in flight started from is an earlier move's, stale."""
    if rep.residency.value == tier:
        return None  # the same answer again
    if rep.phase in (Phase.PENDING, Phase.STARTING):  # (HOT: a replica sleeps only once it runs)
        raise InvalidEvent(f"TierMoved: replica {rep.replica_id!r} is {rep.phase.value}: its weights cannot be "
                           f"{tier} (a replica sleeps only once it runs: no OffloadReplica was sent to it)")
    if rep.residency in _STABLE:
        new = _copy(rep, residency=Residency(tier))
    else:
        new = _copy(rep, residency=advance_tier(rep.residency, TierTrigger.MOVED, rep.replica_id))
        if new.residency.value != tier:
            return None  # (loading, an earlier offload's answer; or the other way round)
    if new.residency is Residency.WARM and rep.replica_id in tx.view.hot:
        free_gpus(tx.cl, rep.replica_id)  # its GPU memory is free for others
    return put_replica(dep, rep, settle(tx, dep, new))


def move_failed(tx: Tx, dep: Deployment, rep: Replica) -> Deployment | None:
    """``TierMoveFailed``: the weights stay where they were (None: no move in flight, stale).
    Not retried on its own: the next request (or a recovery) retries it."""
    if rep.residency in _STABLE:
        return None
    new = _copy(rep, residency=advance_tier(rep.residency, TierTrigger.MOVE_FAILED, rep.replica_id))
    if new.residency is Residency.WARM and rep.replica_id in tx.view.hot:
        free_gpus(tx.cl, rep.replica_id)  # the load it was booked for failed
    return put_replica(dep, rep, new)


def updated(dep: Deployment, rep: Replica, version: int) -> Deployment | None:
    """``WeightsUpdated``: the replica holds ``version`` (None: an older answer)."""
    if version > rep.weights_version:
        raise InvalidEvent(f"WeightsUpdated: replica {rep.replica_id!r} says it holds version {version}, but the "
                           f"last one sent was {rep.weights_version}")
    if version < rep.weights_version or not rep.weights_pending:
        return None
    return put_replica(dep, rep, _copy(rep, weights_pending=False))

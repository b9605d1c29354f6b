"""Restarts after failed starts: what counts as one, the backoff, the status.

A replica whose ``__init__`` keeps raising (or hanging) used to be restarted at
once, forever. Here a start that failed (``ReplicaCrashed(cause="error")``
while starting, or the core's own start timeout) counts in
``Deployment.start_failures``; any replica becoming ready resets it. The first
failure is retried at once (it may be a fluke); the k-th in a row (k >= 2) delays
the replacement's ``StartReplica`` by
``min(restart_backoff_s * 2**(k-2), restart_backoff_max_s)`` on the core's
clock (1, 2, 4, ... 64 s by default): the replacement exists at once (it holds the rank, PENDING, on no node),
its start is held in ``Cluster.delayed`` until a Tick reaches its deadline.
After ``min(max_constructor_retry_count, 3 x target)`` failures in a row the
deployment is UNHEALTHY (``Deployment.failing_to_start``), as Ray Serve marks it, and retrying goes on.

Gangs and static placement back off the same way. Under ``restart_gang`` every
member of the gang waits the same backoff (their replacements come due in one
Tick and are placed whole); a static rank's replacement waits before its
``StartReplica`` and ``PlaceReplica`` on its bundles (a bundle lost meanwhile
makes it FAILED: nothing was started, nothing is stopped).
"""

from __future__ import annotations

from ..base import unhealthy
from ..base.commands import StartReplica
from ..base.lifecycle import Phase
from ..base.records import maker, unchecked_copy
from ..base.state import Deployment, Replica
from ..base.transaction import Tx

__all__ = ["FAILED_START_CAUSES", "failed_start", "started", "backoff_s", "doubling", "defer", "release"]

#: what makes a crash a failed start (of a replica still starting): its code raised, or it hung
FAILED_START_CAUSES = frozenset({"error", "start_timeout"})
_Start = maker(StartReplica)


#: how much of a failed start's reason the deployment keeps (its status message shows it)
MAX_FAILURE_SHOWN = 500


def failed_start(dep: Deployment, rep: Replica, cause: str, reason: str = "") -> Deployment:
    """``dep`` after ``rep`` died for ``cause``: one more failed start in a row when
    it was still starting and its own code is to blame (``reason`` kept as the last one's);
    UNHEALTHY when it was serving (``unhealthy.died``)."""
    if rep.phase is Phase.STARTING and cause in FAILED_START_CAUSES:
        return unchecked_copy(dep, start_failures=dep.start_failures + 1, last_start_failure=reason[:MAX_FAILURE_SHOWN])
    return unhealthy.died(dep, rep, f"died: {reason or cause}"[:MAX_FAILURE_SHOWN])


def started(dep: Deployment) -> Deployment:
    """A replica became ready: the failures in a row are over."""
    return unchecked_copy(dep, start_failures=0) if dep.start_failures else dep


def backoff_s(dep: Deployment) -> float:
    """How long the next replacement waits after ``dep.start_failures`` failures in a row."""
    k = dep.start_failures
    if k <= 1:
        return 0.0  # the first failure is retried at once (it may have been a fluke)
    o = dep.config.start
    return doubling(k, o.restart_backoff_s, o.restart_backoff_max_s)


def doubling(k: int, base_s: float, max_s: float) -> float:
    """The wait after the ``k``-th failure in a row (``k`` >= 2): ``base_s``, doubling, at most
    ``max_s`` (the replicas' rule; the proxies' too, ``rankcore.control.proxies``)."""
    return min(base_s * 2.0 ** min(k - 2, 64), max_s)


def defer(tx: Tx, rid: str, replaces: str, at: float) -> None:
    """Hold replacement ``rid``'s StartReplica until the clock reaches ``at``."""
    cl = tx.cl
    cl.delayed = cl.delayed.set(rid, replaces)
    cl.deadlines = cl.deadlines.set(rid, at)
    cl.next_deadline = min(cl.next_deadline, at)
    cl.changed = True
    tx.tick_at(at)  # (a gang's members: one Tick)


def release(tx: Tx, dep: Deployment, rep: Replica) -> StartReplica:
    """Replacement ``rep``'s backoff is over (its deadline already taken off the
    clock): its StartReplica, with the world size as it is now."""
    cl = tx.cl
    replaces = cl.delayed[rep.replica_id]
    cl.delayed = cl.delayed.delete(rep.replica_id)
    cl.changed = True
    return _Start(replica_id=rep.replica_id, deployment=dep.name, global_rank=dep.ranks.global_rank(rep.replica_id),
                  world_size=dep.target, replaces=replaces, lineage=rep.lineage, revision=rep.revision)

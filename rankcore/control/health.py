"""Health checks: the executor checks, the core counts and decides.

The executor checks each running replica every ``health_check_period_s``
(``InitializeReplica`` carries it), bounds each check by
``health_check_timeout_s``, and reports every outcome as ``HealthChecked``.
The core counts failures in a row per replica (``Replica.health_failures``); a
passing check resets the count; at ``health_check_failure_threshold`` it stops
the replica at once (``StopReplica`` with no drain: it is not serving) and
replaces it on its rank (its gang too, under ``restart_gang``), as Ray Serve's
controller does after 3 failed checks. Checks of a replica not serving (still
starting, being stopped) change nothing: Ray Serve checks only running
replicas.
"""

from __future__ import annotations

from ..base.events import HealthChecked
from ..base.lifecycle import Phase
from ..base.records import updater
from ..base.state import Deployment, Replica, Step
from ..placement.gangs import fail_member
from .passes import finish
from .transaction import Tx, put_replica, stop_command

__all__ = ["checked"]

_with_failures = updater(Replica, "health_failures")


def checked(tx: Tx, e: HealthChecked, dep: Deployment, rep: Replica) -> Step:
    """One check's outcome for ``rep`` (a replica the core holds)."""
    if rep.phase is not Phase.RUNNING and rep.phase is not Phase.RECONFIGURING:
        return finish(tx, stale=True)  # not serving: not checked (a late answer)
    if e.healthy:
        if not rep.health_failures:
            return finish(tx)
        tx.put(put_replica(dep, rep, _with_failures(rep, 0)))
        return finish(tx)
    failures = rep.health_failures + 1
    if failures < dep.config.health.health_check_failure_threshold:
        tx.put(put_replica(dep, rep, _with_failures(rep, failures)))
        return finish(tx)
    tx.emit(stop_command(dep, rep.replica_id, now=True))  # unhealthy: its process goes, its rank is replaced
    tx.put(fail_member(tx, dep, rep))
    return finish(tx)

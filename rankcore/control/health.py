"""Health checks: the executor checks, the core counts and decides.

The executor checks each running replica every ``health_check_period_s``
(``InitializeReplica`` carries it), bounds each check by
``health_check_timeout_s``, and reports every outcome as ``HealthChecked``.
The core counts failures in a row per replica (``Replica.health_failures``); a
passing check resets the count; at ``health_check_failure_threshold`` (Ray
Serve's 3) the replica is replaced on its rank:

* drained, as Ray Serve 2.60 stops an unhealthy replica by default
  (``RAY_SERVE_FORCE_STOP_UNHEALTHY_REPLICAS=0``: a graceful stop, so what it is
  running may still finish), with its successor started at once on its ranks:
  booked beside it on its node where that node has room
  (``moves.start_beside``), else waiting for a node (``moves.start_elsewhere``:
  placed wherever there is room, or once the drain has freed its own), while
  nothing else is under way for the deployment (a rollout, a restart backoff);
* else killed at once (``StopReplica`` with no drain) so its room goes to its
  successor in the same step (its gang too, under ``restart_gang``): with
  ``force_stop_unhealthy_replicas`` (Serve's ``RAY_SERVE_FORCE_STOP_UNHEALTHY_REPLICAS=1``:
  a frozen process drains nothing, and on a full cluster its successor would
  wait out the drain), a gang, static placement, a model booked by GPU memory,
  a cluster the core does not place on, a replica reconfiguring, a rollout or a
  restart backoff under way.

Checks of a replica not serving (still starting, being stopped) change nothing:
Ray Serve checks only running replicas.
"""

from __future__ import annotations

from ..base.commands import UpdateHealthChecks
from ..base.events import HealthChecked
from ..base.lifecycle import Phase
from ..base.options import DeploymentConfig
from ..base.records import updater
from ..base.state import Deployment, Replica, Step
from ..base.transaction import Tx, put_replica, stop_command
from ..base.unhealthy import died
from ..placement import restarts
from .moves import fail, start_beside, start_elsewhere
from .passes import finish

__all__ = ["checked", "retune"]

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
    dep = died(dep, rep, f"failed its health check: {e.detail}")  # (Ray Serve's UNHEALTHY: rankcore.base.unhealthy)
    unhealthy = _with_failures(rep, failures)  # (kept on its record while it drains: it was stopped as unhealthy)
    if (not dep.config.health.force_stop_unhealthy_replicas and not dep.rolling and not dep.retiring
            and not (tx.view.clock and restarts.backoff_s(dep))):
        drained = start_beside(tx, dep, unhealthy)
        if drained is None:
            drained = start_elsewhere(tx, dep, unhealthy)
        if drained is not None:
            tx.put(drained)
            return finish(tx)
    tx.emit(stop_command(dep, rep.replica_id, now=True))  # unhealthy: its process goes, its rank is replaced
    tx.put(fail(tx, dep, rep))
    return finish(tx)


def retune(tx: Tx, dep: Deployment, config: DeploymentConfig) -> None:
    """A deploy of ``config``: when its ``health_check_period_s`` or ``health_check_timeout_s``
    differ from the deployment's, its replicas are checked at the new ones from their next check
    (``UpdateHealthChecks``; Ray Serve's lightweight update: none is restarted)."""
    old, new = dep.config.health, config.health
    if (old.health_check_period_s, old.health_check_timeout_s) != (new.health_check_period_s,
                                                                    new.health_check_timeout_s):
        tx.emit(UpdateHealthChecks(deployment=dep.name, health_check_period_s=new.health_check_period_s,
                                   health_check_timeout_s=new.health_check_timeout_s))

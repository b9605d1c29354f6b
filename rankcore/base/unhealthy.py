"""Ray Serve's UNHEALTHY after a serving replica dies (issue 64, "a replica crash shows the status
Serve shows for it").

Serve marks a deployment ``UNHEALTHY`` (its status trigger ``HEALTH_CHECK_FAILED``) when a replica of
the version it deploys fails its health check, which a dead actor does too, with the message "A
replica's health check failed. This deployment will be UNHEALTHY until the replica recovers or a
new deploy happens.". The same here, from the facts the core is told: a serving replica of the
deployed revision crashes (``ReplicaCrashed``, ``restarts.failed_start``), is lost with its node
(``NodeLost``) or fails ``health_check_failure_threshold`` checks in a row (``health.checked``),
while its deployment is healthy (or already marked: each later death is named too). A replica of
an outgoing revision (a rollout replaces it anyway), or one dying while the deployment updates or
scales, leaves the status to the counts (``UPDATING``). The mark names the last ``SHOWN`` deaths
and why, and goes once the deployment is healthy again (``Tx.put``) or a new deploy changes its
revision or ``user_config`` (``DeploymentApplied``).

Internal module: import its public names from ``rankcore`` (docs/embedding.md, "What you may import").
"""

from __future__ import annotations

from ..base.lifecycle import Phase
from ..base.records import unchecked_copy
from ..base.state import UNTIL_RECOVERED, Deployment, Replica

__all__ = ["died", "recovered", "settled", "UNTIL_RECOVERED", "SHOWN"]

#: how many deaths the status message names (the last ones; the count of the rest is said)
SHOWN = 3


def died(dep: Deployment, rep: Replica, why: str) -> Deployment:
    """``dep`` once its replica ``rep`` died (``why``: "died: <reason>", "failed its health check:
    <detail>"), before the step replaces it: marked UNHEALTHY when ``rep`` served the deployed
    revision and the deployment was healthy or marked already (``healthy`` reads every replica:
    asked only for a serving replica's death)."""
    if (rep.phase is not Phase.RUNNING and rep.phase is not Phase.RECONFIGURING) or rep.revision != dep.revision:
        return dep
    marks = dep.health_failed
    if any(rid == rep.replica_id for rid, _ in marks):
        return dep  # (an unhealthy replica drained beside its successor is checked again)
    if not marks and not dep.healthy:
        return dep  # (dying while it updates or scales: the counts' UPDATING stays)
    kept = (*marks, (rep.replica_id, why))
    return unchecked_copy(dep, health_failed=kept[-SHOWN:],
                          health_failed_more=dep.health_failed_more + max(0, len(kept) - SHOWN))


def recovered(dep: Deployment) -> Deployment:
    """``dep`` without its mark (healthy again, or redeployed)."""
    return unchecked_copy(dep, health_failed=(), health_failed_more=0) if dep.health_failed else dep



def settled(dep: Deployment) -> Deployment:
    """``dep`` as a step leaves it: a marked deployment healthy again loses its mark (``Tx.put`` and
    the fast paths ask; ``healthy`` reads every replica only while it is marked)."""
    return recovered(dep) if dep.health_failed and dep.healthy else dep

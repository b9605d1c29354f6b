"""A new ``user_config`` reaches the serving replicas a few at a time (issue 64).

A ``user_config`` change is lightweight (``rankcore.control.rollouts``): a replica keeps running and
its ``reconfigure`` is called. That call can be slow (a model reload), so, as Ray Serve does, no more
than the rollout's ``max_unavailable`` (``rollouts.budget``: 20% of the target, at least one) are
reconfiguring at once; the next ones are told as those answer (``ReplicaReconfigured``), lowest
rank first. ``pace_touched`` is an end-of-step pass: ``DeploymentApplied`` raises the deployment's
``config_version`` and tells nobody itself; this pass, run at the end of that step and of every step
that touches the deployment later (an answer, a crash, a replica ready), sends what the budget allows.

A replica that starts meanwhile gets the config with its start (``StartReplica``) or at ``ReplicaReady``;
one stopping, retiring, of an outgoing revision (a rollout replaces it: Ray Serve's rule) or a
blue-green's blue (leaving: its reconfigure would carry ranks it is not told) is never
reconfigured for a config. A deployment is fully on its config when no serving
replica is behind it and none is reconfiguring (``config_applied``): what ``rankcore deploy`` waits for.

Internal module: import its public names from ``rankcore`` (docs/embedding.md, "What you may import").
"""

from __future__ import annotations

from ..base.lifecycle import Phase
from ..base.records import unchecked_copy
from ..base.state import Deployment, Replica
from ..base.transaction import Tx, by_rank, reconfigure, recount
from .rollouts import budget

__all__ = ["pace_touched", "behind", "config_applied", "settled"]


def _behind(dep: Deployment, r: Replica) -> bool:
    """A serving replica to tell the new ``user_config``: not one of an outgoing revision (a rollout
    replaces it, its successor starting with the config: Ray Serve never reconfigures a replica it
    is replacing), nor one leaving."""
    return (r.phase is Phase.RUNNING and r.config_version < dep.config_version and r.blue_ranks is None
            and not r.retiring and r.revision == dep.revision)


def behind(dep: Deployment) -> list[Replica]:
    """The serving replicas still on an older ``user_config`` and not being told it, lowest rank first."""
    return by_rank(dep, [r for r in dep.replicas.values() if _behind(dep, r)])


def settled(dep: Deployment) -> bool:
    """No serving replica of ``dep`` waits for its new ``user_config``: nothing for ``pace_touched``
    to do in any step (the fast paths, which run no pass, ask it)."""
    return not any(_behind(dep, r) for r in dep.replicas.values())


def _reconfiguring(dep: Deployment) -> int:
    return sum(1 for r in dep.replicas.values() if r.phase is Phase.RECONFIGURING)


def config_applied(dep: Deployment) -> bool:
    """Every serving replica runs the deployment's ``user_config`` (none behind, none reconfiguring)."""
    return not behind(dep) and _reconfiguring(dep) == 0


def pace_touched(tx: Tx) -> None:
    """End of step: each touched deployment whose serving replicas are behind its config tells the
    lowest-ranked of them, while no more than ``rollouts.budget`` are reconfiguring."""
    for name in sorted(tx.touched):
        dep = tx.deps.get(name)
        if dep is None or dep.deleting:
            continue
        late = behind(dep)
        room = budget(dep) - _reconfiguring(dep)
        if not late or room <= 0:
            continue
        replicas, counts = dep.replicas, dep.counts
        for rep in late[:room]:
            new, cmd = reconfigure(dep, rep, "user_config")
            replicas = replicas.set(new.replica_id, new)
            counts = recount(counts, rep.phase, new.phase)
            tx.emit(cmd)
        tx.put(unchecked_copy(dep, replicas=replicas, counts=counts))

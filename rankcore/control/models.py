"""What a replica's multiplexed models are, kept on its record (issue 39).

A replica that serves many models (``@multiplexed``) reports the set it holds or is loading
(``ModelsReported``) whenever it changes. The core keeps it on the replica's record
(``Replica.models``), so the status, the metrics and a recovered controller (``ReplicaReport.models``)
see it, and tells the request path (``ReplicaModels`` in ``Step.pool``, ``rankcore.control.pool``),
whose machine sends a model's requests to its holders (``rankcore.requests.route_model``). Which
models a replica keeps is the replica's own rule (``rankcore.requests.ModelCache``); the core only
records what it says.

Internal module: import its public names from ``rankcore``.
"""

from __future__ import annotations

from ..base.lifecycle import Phase
from ..base.records import unchecked_copy
from ..base.state import Deployment, Replica
from ..base.transaction import put_replica

__all__ = ["reported"]

#: a replica that has begun to stop keeps what it said (it drains), but its news is no longer taken
_LEAVING = (Phase.STOPPING, Phase.FAILED)


def reported(dep: Deployment, rep: Replica, models: tuple[str, ...]) -> Deployment | None:
    """``dep`` with ``rep`` holding ``models``; None when that is stale (the same set again, or a
    replica that is stopping)."""
    if rep.models == models or rep.phase in _LEAVING:
        return None
    return put_replica(dep, rep, unchecked_copy(rep, models=models))

"""Which event answers which command (the executor's side of the protocol).

| command              | answered by                                   |
|----------------------|-----------------------------------------------|
| StartReplica         | ReplicaPlaced (or ReplicaCrashed)             |
| InitializeReplica    | ReplicaReady (or ReplicaCrashed)              |
| ReconfigureReplica   | ReplicaReconfigured(version) (or ReplicaCrashed) |
| StopReplica          | ReplicaStopped (or ReplicaCrashed)            |
| UpdateWorldSize      | nothing                                       |
| UpdateHealthChecks   | nothing                                       |
| PlaceReplica         | ReplicaPlaced (or PlacementFailed, ReplicaCrashed) |
| GangChanged          | nothing                                       |
| ReformGroup          | nothing                                       |
| KeepSpareProcesses   | nothing                                       |
| OffloadReplica       | TierMoved(tier="warm") (or TierMoveFailed)    |
| LoadReplica          | TierMoved(tier="hot") (or TierMoveFailed)     |
| UpdateWeights        | WeightsUpdated(version)                       |
| EvictReplica         | ReplicaStopped (or ReplicaCrashed)            |
| DropWarmCopy         | nothing                                       |
| RequestResources     | nothing (nodes may join: NodeJoined)          |
| ScheduleTick         | a Tick with ``now >= at``                     |
| StartProxy           | ProxyStarted (or ProxyCrashed)                |
| DrainProxy           | nothing (its health checks: ProxyHealthChecked) |
| StopProxy            | nothing                                       |
| PoolChanged          | nothing (the request path's, ``Step.pool``)   |
| PoolReset            | nothing (the request path's, ``Step.pool``)   |
| PoolComing           | nothing (the request path's, ``Step.pool``)   |
| ReplicaModels        | nothing (the request path's, ``Step.pool``)   |

Every command type has its row (tests/unit/test_dispatch_tables.py); ``answers`` gives a healthy
executor's answer to the replica commands, for drivers that answer in-process.
"""

from __future__ import annotations

from .base.commands import (
    EvictReplica,
    InitializeReplica,
    LoadReplica,
    OffloadReplica,
    ReconfigureReplica,
    StartReplica,
    StopReplica,
    UpdateWeights,
)
from .base.events import ReplicaPlaced, ReplicaReady, ReplicaReconfigured, ReplicaStopped, TierMoved, WeightsUpdated

__all__ = ["answers"]


def answers(command: object, node: str = "node-a") -> list:
    """The events a healthy executor answers ``command`` with (placing on ``node``)."""
    if isinstance(command, StartReplica):
        return [ReplicaPlaced(replica_id=command.replica_id, node_id=node)]
    if isinstance(command, InitializeReplica):
        return [ReplicaReady(replica_id=command.replica_id)]
    if isinstance(command, ReconfigureReplica):
        return [ReplicaReconfigured(replica_id=command.replica_id, version=command.version)]
    if isinstance(command, (StopReplica, EvictReplica)):
        return [ReplicaStopped(replica_id=command.replica_id)]
    if isinstance(command, OffloadReplica):
        return [TierMoved(replica_id=command.replica_id, tier="warm")]
    if isinstance(command, LoadReplica):
        return [TierMoved(replica_id=command.replica_id, tier="hot")]
    if isinstance(command, UpdateWeights):
        return [WeightsUpdated(replica_id=command.replica_id, version=command.version)]
    return []

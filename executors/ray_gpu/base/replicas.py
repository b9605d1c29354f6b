"""One record per replica: everything the Ray controller knows about it.

What the controller holds about a replica (its actor handle, its placement
group, the placement under way, whether ``initialize`` returned, its health
checks, and what the checkpoint keeps of it) is one ``ReplicaRecord`` in
``Ledger.replicas``, so letting a replica go is one ``pop``
(``Ledger.forget``) and no table can keep a replica that another dropped.
Executor-side bookkeeping only: every decision about a replica is the core's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs

NAMESPACE = "rankcore"
#: the controller actor's name in ``NAMESPACE`` (here, not in controller.py: a replica finds its
#: controller by it without importing the controller)
CONTROLLER_NAME = "rankcore-controller"
#: Ray leaves ``CUDA_VISIBLE_DEVICES`` alone in a process with this set (its own switch): a
#: replica booked by memory reserves no Ray GPU, sees every GPU and uses the core's indices
NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"

#: a checkpointed replica's start: no actor yet (waiting for a node, or for its group)
RESERVING = "reserving"
#: its actor was created: from then on a missing actor means a dead replica
CREATED = "created"


def actor_name(deployment: str, replica_id: str) -> str:
    """The replica actor's name in ``NAMESPACE`` (how a restarted controller finds it)."""
    return f"ModelActor:{deployment}:{replica_id}"


@attrs.define(eq=False)
class ReplicaRecord:
    """What the controller holds about one replica, from its ``StartReplica``
    (or its adoption by a recovery) until the controller lets it go."""

    deployment: str
    #: kept in the checkpoint (``persist.save_replicas``): a replica of an applied
    #: deployment that a controller started. False: an actor a recovery found alive
    #: that is not ours (its deployment is not applied) or that did not report
    checkpointed: bool = True
    global_rank: int | None = None
    lineage: int | None = None
    world_size: int | None = None
    gang: Any = None  # its StartReplica's gang (``rc.GangContext``), members kept up to date
    #: the deployment revision its StartReplica named (``rankcore.control.rollouts``): its actor holds
    #: it and reports it to a recovering controller. (Not checkpointed: one with no actor yet is
    #: reported without it, taken as current: it starts on the specs a recovery reads, the current ones.)
    revision: str = ""
    stage: str = RESERVING  # RESERVING, then CREATED
    actor: Any = None  # its actor handle, once created
    pg: Any = None  # its own placement group (``rankcore:<deployment>:<id>``), if it reserves one
    #: (node, task): a PlaceReplica under way, until ReplicaPlaced or PlacementFailed is fed
    placing: tuple[str, asyncio.Task] | None = None
    initialized: bool = False  # initialize() returned: it may hold calls, so it is drained on stop
    #: its initialize() was sent and its class has a ``__del__``: a stop before it is ready asks it to run
    #: the user's ``__del__`` on the object being constructed before the kill (``Carrier.stop_now``)
    del_on_abort: bool = False
    #: (period, timeout) of its health checks, from its InitializeReplica
    check_every: tuple[float, float] | None = None
    checks: asyncio.Task | None = None  # its health checks (started once it is ready)
    #: booked by memory: its PlaceReplica's GPU indices and source, and (source "warm") the ObjectRef
    #: of the copy taken from the node's cache when it was placed (passed to its initialize)
    devices: tuple[int, ...] = ()
    source: str = ""
    warm: Any = None

    def checkpoint(self) -> dict:
        """What the checkpoint keeps of it (a restarted controller adopts the
        starts under way and knows which replicas died while it was down)."""
        return {"deployment": self.deployment, "global_rank": self.global_rank, "lineage": self.lineage,
                "world_size": self.world_size, "stage": self.stage, "gang": self.gang}

    @classmethod
    def from_checkpoint(cls, k: dict) -> ReplicaRecord:
        return cls(deployment=k["deployment"], global_rank=k["global_rank"], lineage=k["lineage"],
                   world_size=k["world_size"], stage=k["stage"], gang=k.get("gang"))

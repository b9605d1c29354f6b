"""Commands: imperatives the core hands to an executor.

Ordering rule: carry out a step's commands in the order given. Every command
about a replica is answered by an event (start [-> PlaceReplica when the core
places] -> ReplicaPlaced or PlacementFailed, then
ReplicaReady after InitializeReplica, or ReplicaCrashed; stop ->
ReplicaStopped; reconfigure -> ReplicaReconfigured or ReplicaCrashed); the core
never assumes success before the answer arrives. ``UpdateWorldSize`` needs no
answer.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from typing import Any, Union

import attrs

from . import fields as f
from .errors import InvalidConfig
from .gangmap import GangContext
from .groupmap import GroupContext
from .options import (
    GRACEFUL_SHUTDOWN_TIMEOUT_S,
    GRACEFUL_SHUTDOWN_WAIT_LOOP_S,
    HEALTH_CHECK_PERIOD_S,
    HEALTH_CHECK_TIMEOUT_S,
)
from .ranks import ReplicaRank

__all__ = [
    "StartReplica",
    "InitializeReplica",
    "ReconfigureReplica",
    "StopReplica",
    "UpdateWorldSize",
    "UpdateHealthChecks",
    "PlaceReplica",
    "ScheduleTick",
    "GangChanged",
    "ReformGroup",
    "KeepSpareProcesses",
    "OffloadReplica",
    "LoadReplica",
    "UpdateWeights",
    "PoolChanged",
    "PoolReset",
    "PoolComing",
    "ReplicaModels",
    "POOL_MEMBERSHIPS",
    "PoolCommand",
    "EvictReplica",
    "DropWarmCopy",
    "RequestResources",
    "StartProxy",
    "DrainProxy",
    "StopProxy",
    "PROXY_STOP_REASONS",
    "Command",
]



@attrs.frozen(kw_only=True)
class StartReplica:
    """Create replica ``replica_id`` and place it; it holds ``global_rank``.

    Only the global rank exists before placement (node and local ranks come
    with the node): hence an int here and a full ``ReplicaRank`` on
    ``InitializeReplica.rank`` / ``ReconfigureReplica.rank``.

    ``replaces`` names the replica whose rank it inherits, if any (crashed, or retired by a rollout);
    ``lineage`` numbers the chain of replicas that replaced one another (a
    replacement has its predecessor's lineage).
    """

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    global_rank: int = attrs.field(validator=f.count)
    world_size: int = attrs.field(validator=f.count)
    replaces: str | None = attrs.field(default=None, validator=f.optional_name)
    lineage: int | None = attrs.field(default=None, validator=attrs.validators.optional(f.count))
    #: a gang member: its gang, its rank in it, the gang's size and members
    gang: GangContext | None = None
    #: the deployment's revision it runs (rankcore.control.rollouts): the executor starts the code and
    #: options of that revision, and reports it back to a recovering controller (``ReplicaReport.revision``)
    revision: str = ""


@attrs.frozen(kw_only=True)
class InitializeReplica:
    """Run the user's ``__init__`` with the full rank, then ``reconfigure``
    with ``user_config`` when ``call_reconfigure`` (the seed's startup rule),
    passing the rank too when ``pass_rank``. Answer: ReplicaReady."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    rank: ReplicaRank
    world_size: int = attrs.field(validator=f.count)
    user_config: Any = attrs.field(hash=False)
    call_reconfigure: bool = attrs.field(validator=f.flag)
    pass_rank: bool = attrs.field(default=False, validator=f.flag)
    #: once it is ready, check it every ``health_check_period_s``, each check bounded by
    #: ``health_check_timeout_s``, and report each outcome (``HealthChecked``)
    health_check_period_s: float = HEALTH_CHECK_PERIOD_S
    health_check_timeout_s: float = HEALTH_CHECK_TIMEOUT_S
    #: the weights version to load (the last ``WeightsPushed``; 0: the initial weights)
    weights_version: int = 0


@attrs.frozen(kw_only=True)
class ReconfigureReplica:
    """Tell a running replica its new rank / user_config.

    The replica's context must show ``rank`` and ``world_size`` before the
    user's ``reconfigure`` runs. ``call_user`` says whether to call it (the
    seed's rules), ``pass_rank`` whether it takes ``rank``. ``reason`` is
    ``"user_config"`` or ``"rank"``. Answer: ReplicaReconfigured(version).
    """

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    rank: ReplicaRank
    world_size: int = attrs.field(validator=f.count)
    user_config: Any = attrs.field(hash=False)
    version: int = attrs.field(validator=f.count)
    reason: str = attrs.field(validator=attrs.validators.in_(("user_config", "rank")))
    call_user: bool = attrs.field(validator=f.flag)
    pass_rank: bool = attrs.field(validator=f.flag)


@attrs.frozen(kw_only=True)
class StopReplica:
    """Stop the replica gracefully: take no new calls, let those in flight finish
    (looking every ``graceful_shutdown_wait_loop_s``) for up to
    ``graceful_shutdown_timeout_s``, then kill it. 0 s: kill it now (a replica the
    core gave up on: hung, unhealthy, never placed; its room goes to its
    replacement at once). Answer: ReplicaStopped."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    graceful_shutdown_wait_loop_s: float = attrs.field(default=GRACEFUL_SHUTDOWN_WAIT_LOOP_S, validator=f.seconds)
    graceful_shutdown_timeout_s: float = attrs.field(default=GRACEFUL_SHUTDOWN_TIMEOUT_S, validator=f.seconds)


@attrs.frozen(kw_only=True)
class UpdateWorldSize:
    """Every live replica of ``deployment`` now has ``world_size`` (the target)."""

    deployment: str = attrs.field(validator=f.name)
    world_size: int = attrs.field(validator=f.count)


@attrs.frozen(kw_only=True)
class UpdateHealthChecks:
    """Check every live replica of ``deployment`` every ``health_check_period_s``, each check
    bounded by ``health_check_timeout_s``, from its next check on (a new deploy changed them: as
    Ray Serve's controller, the running replicas are checked at the new period, none restarted;
    one starting gets them with its ``InitializeReplica``). Answer: none."""

    deployment: str = attrs.field(validator=f.name)
    health_check_period_s: float
    health_check_timeout_s: float


@attrs.frozen(kw_only=True)
class PlaceReplica:
    """Put started replica ``replica_id`` on ``node_id``, reserving ``resources``
    there (only when the core places: it knows nodes from ``NodeJoined``).
    ``rank`` is the full rank it will hold there. Answer: ReplicaPlaced on
    that node, or PlacementFailed (the core then chooses again)."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    node_id: str = attrs.field(validator=f.name)
    rank: ReplicaRank
    resources: tuple[tuple[str, float], ...] = ()
    #: static placement: the caller's placement group and this rank's bundles
    #: (the replica runs on the first; the rest are for its own workers)
    group: str | None = None
    bundles: tuple[int, ...] = ()
    capture_child_tasks: bool = True
    #: a deployment with ``model_bytes`` on a node with devices: the GPUs (indices)
    #: its weights go on, and where they come from: "warm" (the node's cache, the
    #: copy an evicted replica left) or "cold" (disk); "" for any other replica
    devices: tuple[int, ...] = ()
    source: str = ""


@attrs.frozen(kw_only=True)
class ScheduleTick:
    """Feed the core a ``Tick`` with ``now >= at`` (a start deadline or a
    suspect node's end falls then). No answer besides the Tick."""

    at: float


@attrs.frozen(kw_only=True)
class GangChanged:
    """A gang's members changed (``restart_replica`` replaced one): tell every
    member (``members`` in gang-rank order). No answer."""

    deployment: str = attrs.field(validator=f.name)
    gang_id: str = attrs.field(validator=f.name)
    members: tuple[str, ...] = attrs.field(converter=f.to_tuple, validator=f.names)


@attrs.frozen(kw_only=True)
class ReformGroup:
    """Replica ``replica_id`` is a member of its collective group's new epoch (``group``: the epoch,
    its rank, the world size, the members): it leaves its group of any older epoch and joins this
    one (rankcore.control.groups). Sent once per member per epoch, and only when every member of
    the epoch is running. No answer: a member that cannot join fails its own way (a crash)."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    group: GroupContext


@attrs.frozen(kw_only=True)
class KeepSpareProcesses:
    """Keep ``count`` started, idle worker processes on ``node_id`` for
    ``deployment``'s replicas from now on (0: none any more), refilled after a
    replica there takes one, so a replacement placed there runs in a process
    that already exists (rankcore.placement.spares). A node keeps the largest count any
    deployment asks of it. No answer."""

    deployment: str = attrs.field(validator=f.name)
    node_id: str = attrs.field(validator=f.name)
    count: int = attrs.field(validator=f.count)


@attrs.frozen(kw_only=True)
class OffloadReplica:
    """Put a running replica to sleep: its weights from its GPU to CPU memory
    (pinned where it can), its process, ranks and bundle kept, its GPU memory
    given up. Answer: ``TierMoved(tier="warm")`` or ``TierMoveFailed``."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)


@attrs.frozen(kw_only=True)
class LoadReplica:
    """Wake a sleeping replica: its weights from CPU memory back to its GPU.
    Answer: ``TierMoved(tier="hot")`` or ``TierMoveFailed``."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)


@attrs.frozen(kw_only=True)
class UpdateWeights:
    """Give a replica the weights of ``version`` (wherever they are: on its GPU,
    in its CPU copy while it sleeps, or once it is ready if it is starting).
    It does not serve until it answers ``WeightsUpdated(version)``."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    version: int = attrs.field(validator=f.count)




@attrs.frozen(kw_only=True)
class EvictReplica:
    """Stop ``replica_id`` to give its GPU memory to another model (rankcore.tiers.devices):
    drain like a ``StopReplica`` (finish the calls in flight, at most
    ``graceful_shutdown_timeout_s``), then keep its weights in the node's CPU
    cache (``to="warm"``: the core counted them in the budget) or drop them
    (``"cold"``). Answer: ``ReplicaStopped`` (or ``ReplicaCrashed``), as for a stop."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    node_id: str = attrs.field(validator=f.name)
    to: str = attrs.field(validator=attrs.validators.in_(("warm", "cold")))
    #: the replica it makes room for
    for_replica: str = attrs.field(validator=f.name)
    graceful_shutdown_wait_loop_s: float = attrs.field(default=GRACEFUL_SHUTDOWN_WAIT_LOOP_S, validator=f.seconds)
    graceful_shutdown_timeout_s: float = attrs.field(default=GRACEFUL_SHUTDOWN_TIMEOUT_S, validator=f.seconds)


@attrs.frozen(kw_only=True)
class DropWarmCopy:
    """Free the WARM copy of ``deployment``'s weights that ``replica_id`` left in
    ``node_id``'s CPU cache: the core dropped it to make room for another (smallest
    first). No answer: the core's books already say it is gone (COLD)."""

    node_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    replica_id: str = attrs.field(validator=f.name)


@attrs.frozen(kw_only=True)
class RequestResources:
    """The demand a cluster autoscaler must see (``rankcore.placement.demand``):
    ``waiting``, the replicas no live node has room for, as (shape, count)
    pairs; ``held``, while any wait, what the core has booked on each live node
    (one bundle per node). The full demand each time it changes: it replaces the
    previous one; both empty clears it. No answer (the executor may add nodes,
    which join as ``NodeJoined``)."""

    waiting: tuple[tuple[tuple[tuple[str, float], ...], int], ...] = ()
    held: tuple[tuple[tuple[str, float], ...], ...] = ()

    def bundles(self) -> list[dict[str, float]]:
        """What ``request_resources(bundles=...)`` takes: every held bundle, then
        one bundle per waiting replica (the cluster must fit them all at once)."""
        out = [{k: v for k, v in b if v > 0} for b in self.held]
        for need, n in self.waiting:
            out.extend({k: v for k, v in need if v > 0} for _ in range(n))
        return [b for b in out if b]


#: where a replica stands in its deployment's request pool (``PoolChanged``)
POOL_MEMBERSHIPS = ("serving", "draining", "gone")


def _membership(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if value not in POOL_MEMBERSHIPS:
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be one of {', '.join(POOL_MEMBERSHIPS)}, "
                            f"got {f.shown(value)}")


@attrs.frozen(kw_only=True)
class PoolChanged:
    """Tell the request path (``rankcore.requests``) where ``replica_id`` now
    stands in ``deployment``'s pool: ``"serving"`` (it takes new requests),
    ``"draining"`` (alive, finishing what it holds, taking nothing new:
    stopping, asleep, waiting for weights), ``"gone"`` (stopped, crashed or
    lost: what it held will never be answered by it). Sent when that changes,
    so the pool follows the core's state with no polling. No answer."""

    deployment: str = attrs.field(validator=f.name)
    replica_id: str = attrs.field(validator=f.name)
    membership: str = attrs.field(validator=_membership)


@attrs.frozen(kw_only=True)
class ReplicaModels:
    """Tell the request path which multiplexed models ``replica_id`` of ``deployment`` holds (or
    is loading): the whole set, replacing what it believed (``rankcore.requests.route_model`` sends
    a model's requests to its holders). Sent when a replica's report (``ModelsReported``) changes
    it, when a replica joins its pool holding some, and after a recovery for every replica of a
    pool holding some. For a replica not in its pool the
    request machine changes nothing (a late report). No answer."""

    deployment: str = attrs.field(validator=f.name)
    replica_id: str = attrs.field(validator=f.name)
    model_ids: tuple[str, ...] = attrs.field(converter=f.to_tuple, validator=f.model_ids)


@attrs.frozen(kw_only=True)
class PoolReset:
    """``deployment``'s whole pool at once: the ``serving`` and ``draining``
    replicas (every other one is gone) and whether replicas are ``coming``
    (as ``PoolComing``). Sent for every deployment after a controller
    recovery: the request path may have missed changes while it was down.
    No answer."""

    deployment: str = attrs.field(validator=f.name)
    serving: tuple[str, ...] = attrs.field(converter=f.to_tuple, validator=f.names)
    draining: tuple[str, ...] = attrs.field(converter=f.to_tuple, validator=f.names)
    coming: bool = attrs.field(validator=f.flag)


@attrs.frozen(kw_only=True)
class PoolComing:
    """Whether ``deployment`` will have serving replicas without anyone asking
    (its target is above zero: replicas are starting, waking, loading their
    weights or being replaced): a request waits while they come; with none
    serving and none coming every waiting request fails at once with a clear
    error. Sent when that changes. No answer."""

    deployment: str = attrs.field(validator=f.name)
    coming: bool = attrs.field(validator=f.flag)


@attrs.frozen(kw_only=True)
class StartProxy:
    """Start proxy ``proxy_id`` on ``node_id`` (HTTP, and gRPC where configured). Answer:
    ProxyStarted once it passed its ready check, or ProxyCrashed."""

    proxy_id: str = attrs.field(validator=f.name)
    node_id: str = attrs.field(validator=f.name)


@attrs.frozen(kw_only=True)
class DrainProxy:
    """``draining`` True: proxy ``proxy_id`` answers ``/-/healthz`` with 503 (an outside load
    balancer moves away) and lets in-flight requests finish; False: it is wanted again and
    answers 200. No answer (its health checks report what it has in flight)."""

    proxy_id: str = attrs.field(validator=f.name)
    node_id: str = attrs.field(validator=f.name)
    draining: bool = attrs.field(default=True, validator=f.flag)


#: why the core stops a proxy
PROXY_STOP_REASONS = ("drained", "unhealthy", "ready_timeout", "node_lost", "not_needed")


@attrs.frozen(kw_only=True)
class StopProxy:
    """Stop proxy ``proxy_id`` (``reason``: one of ``PROXY_STOP_REASONS``; a drained one has
    nothing in flight). No answer: the core has forgotten it already."""

    proxy_id: str = attrs.field(validator=f.name)
    node_id: str = attrs.field(validator=f.name)
    reason: str = attrs.field(validator=attrs.validators.in_(PROXY_STOP_REASONS))


Command = Union[StartReplica, InitializeReplica, ReconfigureReplica, StopReplica, UpdateWorldSize, UpdateHealthChecks,
                PlaceReplica,
                ScheduleTick, GangChanged, ReformGroup, KeepSpareProcesses, OffloadReplica, LoadReplica, UpdateWeights,
                EvictReplica, DropWarmCopy, RequestResources, StartProxy, DrainProxy, StopProxy]
#: what ``Step.pool`` holds: the request path's commands (``rankcore.control.pool``), apart from the replicas'
PoolCommand = Union[PoolChanged, PoolReset, PoolComing, ReplicaModels]

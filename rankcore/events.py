"""Events: past-tense facts an executor (or a user) tells the core.

Frozen, slotted, keyword-only attrs records that validate on construction;
their reprs are valid Python, so a failing hypothesis run prints a replayable
program. ``step`` dispatches on ``type(event)``.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from typing import Any, Union

import attrs

from . import fields as f
from .bundles import StaticPlacement
from .errors import InvalidConfig
from .gangmap import GANG_FAILURES, GANG_PLACEMENTS
from .lifecycle import Phase
from .options import (
    GRACEFUL_SHUTDOWN_TIMEOUT_S,
    GRACEFUL_SHUTDOWN_WAIT_LOOP_S,
    HEALTH_CHECK_FAILURE_THRESHOLD,
    HEALTH_CHECK_PERIOD_S,
    HEALTH_CHECK_TIMEOUT_S,
    MAX_CONSTRUCTOR_RETRY_COUNT,
    PLACEMENT_TIMEOUT_S,
    RESTART_BACKOFF_MAX_S,
    RESTART_BACKOFF_S,
    SPARE_PROCESSES,
)
from .placement import POLICIES
from .ranks import MAX_RANKS, ReportedRank

__all__ = [
    "DEFAULT_MAX_REPLICAS",
    "UNKNOWN",
    "OUTDATED",
    "DeploymentApplied",
    "ScaleRequested",
    "ReplicaPlaced",
    "ReplicaReady",
    "ReplicaReconfigured",
    "ReplicaCrashed",
    "HealthChecked",
    "CRASH_CAUSES",
    "ReplicaStopped",
    "NodeLost",
    "BundlesPlaced",
    "NodeJoined",
    "NodeCapacityChanged",
    "PlacementFailed",
    "Tick",
    "ReplicaReport",
    "ControllerRecovered",
    "UnresponsiveReplica",
    "Event",
]



class _Marker:
    """A named placeholder value with a valid-Python repr (for replayable output)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: ReplicaReport.user_config when the replica did not say what it runs
UNKNOWN: Any = _Marker("UNKNOWN")
#: ReplicaReport.user_config when the replica runs an older user_config than
#: the deployment's, whose value the reporter does not have
OUTDATED: Any = _Marker("OUTDATED")


#: What an executor observed when a replica died (``ReplicaCrashed.cause``): facts, not
#: conclusions; the core derives its rules from them (``rankcore.restarts``):
#: ``error``: the user's code raised (``__init__``, ``reconfigure``); ``exited``: the process
#: vanished on its own (its node may be going down: the core avoids it for a while);
#: ``killed``: killed from outside on purpose (a user's kill, the OOM killer); ``node_lost``:
#: its node is gone; ``unknown``: not said. The core itself records ``health_check``,
#: ``start_timeout`` and ``placement_timeout`` for the replicas it gives up on.
CRASH_CAUSES = ("error", "exited", "killed", "node_lost", "unknown")

#: The default ceiling on a deployment's replica count. A typo such as
#: ``num_replicas=10**7`` would otherwise run for minutes and gigabytes before
#: anything visible happens; a caller who means it raises
#: ``DeploymentApplied.max_replicas``.
DEFAULT_MAX_REPLICAS = 100_000


def _check_max_replicas(inst: DeploymentApplied, attribute: attrs.Attribute, value: int) -> None:
    if type(value) is not int or value < 1:
        raise InvalidConfig(f"DeploymentApplied.max_replicas must be a positive int, got {value!r}")
    if value > MAX_RANKS:
        raise InvalidConfig(f"DeploymentApplied.max_replicas={f.shown(value)} is above the rank space ({MAX_RANKS})")
    if inst.num_replicas > value:
        raise InvalidConfig(
            f"DeploymentApplied({inst.name!r}).num_replicas={f.shown(inst.num_replicas)} is above "
            f"max_replicas={f.shown(value)} (raise max_replicas if you mean it)"
        )


def _check_reconfigure(inst: DeploymentApplied, attribute: attrs.Attribute, value: bool) -> None:
    f.flag(inst, attribute, value)
    if value and not inst.has_reconfigure:
        raise InvalidConfig(
            f"DeploymentApplied({inst.name!r}): reconfigure_takes_rank=True needs has_reconfigure=True"
        )


def _check_policy(inst: DeploymentApplied, attribute: attrs.Attribute, value: str) -> None:
    if value not in POLICIES:
        raise InvalidConfig(f"DeploymentApplied({inst.name!r}).placement must be one of {', '.join(POLICIES)}, "
                            f"got {value!r}")


def _check_static(inst: DeploymentApplied, attribute: attrs.Attribute, value: StaticPlacement | None) -> None:
    if value is None:
        return
    if not isinstance(value, StaticPlacement):
        raise InvalidConfig(f"DeploymentApplied({inst.name!r}).static_placement must be a "
                            f"rankcore.StaticPlacement, got {type(value).__name__}")
    if inst.num_replicas not in (0, value.replicas):
        raise InvalidConfig(
            f"DeploymentApplied({inst.name!r}): num_replicas={f.shown(inst.num_replicas)}, but static placement maps "
            f"{value.replicas} ranks (the replica count is fixed to the mapping's length, or 0 to shut it down)")


def _check_gang_size(inst: DeploymentApplied, attribute: attrs.Attribute, value: int) -> None:
    if type(value) is not int or value < 1:
        raise InvalidConfig(f"DeploymentApplied({inst.name!r}).gang_size must be an int >= 1, got {value!r}")
    if value > 1 and inst.num_replicas % value:
        raise InvalidConfig(f"DeploymentApplied({inst.name!r}): num_replicas={f.shown(inst.num_replicas)} is not a "
                            f"multiple of gang_size={value} (gangs start and stop whole)")
    if value > 1 and inst.static_placement is not None:
        raise InvalidConfig(f"DeploymentApplied({inst.name!r}): static_placement and gang_size > 1 do not mix "
                            f"(a static mapping already fixes where every rank runs)")


def _check_cause(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value not in CRASH_CAUSES:
        raise InvalidConfig(f"ReplicaCrashed({inst.replica_id!r}).cause must be one of {', '.join(CRASH_CAUSES)}, "
                            f"got {value!r}")


def _check_choice(choices: tuple[str, ...]):  # type: ignore[no-untyped-def]
    def check(inst: DeploymentApplied, attribute: attrs.Attribute, value: str) -> None:
        if value not in choices:
            raise InvalidConfig(f"DeploymentApplied({inst.name!r}).{attribute.name} must be one of "
                                f"{', '.join(choices)}, got {value!r}")
    return check


@attrs.frozen(kw_only=True, weakref_slot=False)
class DeploymentApplied:
    """A deployment was created or its config changed (Ray Serve's ``serve.run``).

    ``user_config`` is any value; ``None`` means "no user_config" (then, as in
    Ray Serve, the user's ``reconfigure`` is not called at startup or for rank
    changes). ``has_reconfigure``/``reconfigure_takes_rank`` describe the
    user's class, so the core can apply the seed's rules.
    """

    name: str = attrs.field(validator=f.name)
    num_replicas: int = attrs.field(validator=f.count)
    user_config: Any = attrs.field(default=None, hash=False)
    has_reconfigure: bool = attrs.field(default=False, validator=f.flag)
    reconfigure_takes_rank: bool = attrs.field(default=False, validator=_check_reconfigure)
    #: the most replicas this deployment may ever be scaled to (ScaleRequested too)
    max_replicas: int = attrs.field(default=DEFAULT_MAX_REPLICAS, validator=_check_max_replicas)
    #: what one replica reserves on its node (``{"GPU": 1, "CPU": 4}``), when the
    #: core places replicas (after a ``NodeJoined``; see docs/architecture.md)
    resources: tuple[tuple[str, float], ...] = attrs.field(default=(), converter=f.to_resources,
                                                           validator=f.resources)
    #: the placement policy: ``spread``, ``pack`` or ``rank_packed`` (rankcore.placement)
    placement: str = attrs.field(default="spread", validator=_check_policy)
    #: a replica not ready this many seconds (core clock: ``Tick``) after its
    #: InitializeReplica is declared crashed and replaced; None: wait forever
    start_timeout_s: float | None = attrs.field(default=None,
                                               validator=attrs.validators.optional(f.seconds))
    #: run on the caller's placement group: rank N on the bundles ``mapping[N]``
    #: (rankcore.static; num_replicas must equal the mapping's length)
    static_placement: StaticPlacement | None = attrs.field(default=None, validator=_check_static)
    #: gangs of this many replicas (rankcore.gangs): placed all or nothing on
    #: consecutive ranks, failing and scaling whole
    gang_size: int = attrs.field(default=1, validator=_check_gang_size)
    #: ``pack`` (one node when it fits) or ``spread`` (distinct nodes)
    gang_placement: str = attrs.field(default="pack", validator=_check_choice(GANG_PLACEMENTS))
    #: ``restart_gang`` (every member on its rank) or ``restart_replica`` (that member only)
    gang_failure: str = attrs.field(default="restart_gang", validator=_check_choice(GANG_FAILURES))
    # -- health, restarts, shutdown (rankcore.health, rankcore.restarts): Ray Serve's names and defaults
    #: how often the executor checks a running replica, and how long one check may take
    #: (a check not answered in time is reported failed: ``HealthChecked(healthy=False)``)
    health_check_period_s: float = attrs.field(default=HEALTH_CHECK_PERIOD_S, validator=f.positive_seconds)
    health_check_timeout_s: float = attrs.field(default=HEALTH_CHECK_TIMEOUT_S, validator=f.positive_seconds)
    #: this many failed checks in a row: the core stops the replica and replaces it on its rank
    health_check_failure_threshold: int = attrs.field(default=HEALTH_CHECK_FAILURE_THRESHOLD,
                                                      validator=f.positive_int)
    #: a stop drains calls in flight, looking every ``wait_loop`` s, for up to ``timeout`` s, then kills
    graceful_shutdown_wait_loop_s: float = attrs.field(default=GRACEFUL_SHUTDOWN_WAIT_LOOP_S,
                                                       validator=f.seconds)
    graceful_shutdown_timeout_s: float = attrs.field(default=GRACEFUL_SHUTDOWN_TIMEOUT_S, validator=f.seconds)
    #: a PlaceReplica not answered this many seconds (core clock) after it was sent: the core gives
    #: up on that node (the incarnation is stopped; a replacement avoids the node); None: wait forever
    placement_timeout_s: float | None = attrs.field(default=PLACEMENT_TIMEOUT_S, validator=f.optional_positive_seconds)
    #: after the k-th consecutive failed start (its ``__init__`` raised or timed out; k >= 2: the
    #: first is retried at once), the replacement waits ``min(restart_backoff_s * 2**(k-2),
    #: restart_backoff_max_s)`` on the core clock
    restart_backoff_s: float = attrs.field(default=RESTART_BACKOFF_S, validator=f.seconds)
    restart_backoff_max_s: float = attrs.field(default=RESTART_BACKOFF_MAX_S, validator=f.seconds)
    #: the deployment is UNHEALTHY ("failing to start") after ``min(this, 3 * num_replicas)``
    #: consecutive failed starts; it keeps retrying (with the backoff)
    max_constructor_retry_count: int = attrs.field(default=MAX_CONSTRUCTOR_RETRY_COUNT, validator=f.positive_int)
    #: keep this many started, idle worker processes on every node that holds a replica of this
    #: deployment (``KeepSpareProcesses``), so a replacement there runs in one instead of waiting
    #: for a process to start (on Ray, most of crash -> serving); 0: none (rankcore.spares)
    spare_processes: int = attrs.field(default=SPARE_PROCESSES, validator=f.count)

    @restart_backoff_max_s.validator
    def _check_backoff(self, attribute: attrs.Attribute, value: float) -> None:
        if value < self.restart_backoff_s:
            raise InvalidConfig(f"DeploymentApplied({self.name!r}).restart_backoff_max_s={value!r} is below "
                                f"restart_backoff_s={self.restart_backoff_s!r}")


@attrs.frozen(kw_only=True, weakref_slot=False)
class ScaleRequested:
    """Someone (a user, an autoscaler) asked for a new replica count.

    ``victims`` optionally names replicas to stop first on a downscale (in
    order); the core picks the rest: not-yet-running ones first, then the
    highest ranks, so that fewer ranks have to be compacted afterwards.
    ``num_replicas`` above the deployment's ``max_replicas`` raises
    ``InvalidConfig`` in ``step``.
    """

    deployment: str = attrs.field(validator=f.name)
    num_replicas: int = attrs.field(validator=f.count)
    victims: tuple[str, ...] = attrs.field(default=(), converter=f.to_tuple, validator=f.names)


@attrs.frozen(kw_only=True, weakref_slot=False)
class ReplicaPlaced:
    """The executor put a started replica on a node (answers StartReplica)."""

    replica_id: str = attrs.field(validator=f.name)
    node_id: str = attrs.field(validator=f.name)
    #: the executor's clock when this happened (optional): the core first
    #: moves its clock there, as a ``Tick(now)`` would, in this same step, so
    #: the start deadline this answer arms counts from now without a Tick step
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True, weakref_slot=False)
class ReplicaReady:
    """The replica finished initialising (answers InitializeReplica)."""

    replica_id: str = attrs.field(validator=f.name)


@attrs.frozen(kw_only=True, weakref_slot=False)
class ReplicaReconfigured:
    """The replica applied reconfigure number ``version`` (answers ReconfigureReplica)."""

    replica_id: str = attrs.field(validator=f.name)
    version: int = attrs.field(validator=f.count)


@attrs.frozen(kw_only=True, weakref_slot=False)
class ReplicaCrashed:
    """The replica died, failed to start, failed a health check or a reconfigure."""

    replica_id: str = attrs.field(validator=f.name)
    reason: str = attrs.field(default="", validator=f.text)
    #: what was observed (``CRASH_CAUSES``): ``exited`` (the process vanished on its own) makes the
    #: core avoid its node for ``State.cluster.suspect_s``; ``error`` while starting is a failed
    #: start (restart backoff, ``Deployment.status``)
    cause: str = attrs.field(default="unknown", validator=_check_cause)
    #: the executor's clock when this happened (optional): the core first
    #: moves its clock there, as a ``Tick(now)`` would, in this same step, so
    #: a suspect node's time counts from now without a Tick step
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True, weakref_slot=False)
class HealthChecked:
    """The outcome of one health check of a running replica (the executor checks every
    ``health_check_period_s``; no answer within ``health_check_timeout_s`` is a failure).
    A fact: the core counts consecutive failures and decides (``rankcore.health``)."""

    replica_id: str = attrs.field(validator=f.name)
    healthy: bool = attrs.field(validator=f.flag)
    detail: str = attrs.field(default="", validator=f.text)
    #: the executor's clock when the check ended (optional), as on the other answers
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True, weakref_slot=False)
class ReplicaStopped:
    """The replica has fully stopped (answers StopReplica); its ranks are released."""

    replica_id: str = attrs.field(validator=f.name)
    #: the executor's clock when this happened (optional), as on the other answers: the
    #: room it frees may go to a waiting replica, whose placement deadline counts from now
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True, weakref_slot=False)
class NodeLost:
    """A node is gone: every replica placed on it has crashed."""

    node_id: str = attrs.field(validator=f.name)


def _bundle_nodes(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _check_bundle_nodes(inst: BundlesPlaced, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, tuple) or not value or not all(n is None or (isinstance(n, str) and n) for n in value):
        raise InvalidConfig(f"BundlesPlaced({inst.deployment!r}).bundle_nodes must list a node id (or None) for "
                            f"every bundle of the group, got {value!r}")


@attrs.frozen(kw_only=True, weakref_slot=False)
class BundlesPlaced:
    """Where the bundles of a static deployment's placement group are now (the
    caller's group was rescheduled after a node loss, say). A FAILED replica
    whose bundles are all on nodes again is restarted on them, on its rank."""

    deployment: str = attrs.field(validator=f.name)
    bundle_nodes: tuple[str | None, ...] = attrs.field(converter=_bundle_nodes, validator=_check_bundle_nodes)


def _parse_rank(value: Any) -> ReportedRank:
    return ReportedRank.parse(value)


def _report_phase(value: Any) -> Phase:
    try:
        phase = Phase(value)
    except ValueError:
        live = ", ".join(repr(p.value) for p in Phase if p not in (Phase.STOPPED, Phase.CRASHED))
        raise InvalidConfig(f"ReplicaReport.phase must be one of {live}, got {value!r}") from None
    if phase in (Phase.STOPPED, Phase.CRASHED):
        raise InvalidConfig(f"ReplicaReport.phase: a live replica cannot report {phase.value!r}")
    return phase


def _check_report(inst: ReplicaReport, attribute: attrs.Attribute, value: Any) -> None:
    if inst.phase is not Phase.PENDING and inst.node_id is None and inst.phase is not Phase.STOPPING:
        raise InvalidConfig(
            f"ReplicaReport({inst.replica_id!r}) is {inst.phase.value} but names no node_id"
        )


@attrs.frozen(kw_only=True, weakref_slot=False)
class NodeJoined:
    """A node joined the cluster: from now on the core places replicas (see
    docs/architecture.md, "Placement"). ``order`` breaks placement ties (lower
    first; default: the order nodes joined in)."""

    node_id: str = attrs.field(validator=f.name)
    resources: tuple[tuple[str, float], ...] = attrs.field(converter=f.to_resources, validator=f.resources)
    labels: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=f.to_labels, validator=f.labels)
    order: int | None = attrs.field(default=None, validator=attrs.validators.optional(f.order))


@attrs.frozen(kw_only=True, weakref_slot=False)
class NodeCapacityChanged:
    """A node's total resources changed. Replicas already there stay (even if
    they no longer fit); new ones go there only while they fit. Also clears
    the node from every replica's failed-placement list: it may fit now."""

    node_id: str = attrs.field(validator=f.name)
    resources: tuple[tuple[str, float], ...] = attrs.field(converter=f.to_resources, validator=f.resources)


@attrs.frozen(kw_only=True, weakref_slot=False)
class PlacementFailed:
    """The executor could not put a replica on the node a PlaceReplica named
    (no room there after all, the node refused it). The core frees what it
    reserved, avoids that node for this replica, and places it again."""

    replica_id: str = attrs.field(validator=f.name)
    node_id: str = attrs.field(validator=f.name)
    reason: str = attrs.field(default="", validator=f.text)
    #: the executor's clock when this happened (optional): the core first
    #: moves its clock there, as a ``Tick(now)`` would, in this same step, so
    #: the retry it arms counts from now without a Tick step
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True, weakref_slot=False)
class Tick:
    """Time passed: the core's clock is now ``now`` (seconds, any origin, never
    going back). Start timeouts and suspect nodes run on it; a ScheduleTick
    command says when the core next needs one."""

    now: float = attrs.field(validator=f.seconds)


@attrs.frozen(kw_only=True, weakref_slot=False)
class ReplicaReport:
    """What one live replica tells a recovering controller.

    ``rank`` may be a ``ReplicaRank``, a bare int (the global rank) or a dict
    with ``rank`` / ``node_rank`` / ``local_rank``: all three reach real
    controllers (ray#64636 is this confusion), so all three are accepted.

    ``phase`` is the last step the replica itself went through (a ``Phase``
    or its name), and says what the core does with it:

    * ``pending`` without ``node_id``: started (id and global rank given) but
      on no node yet; the core places it again;
    * ``pending`` with ``node_id``: placed there, but never initialised (no
      ``InitializeReplica`` reached it: the answer was lost with the old
      controller); the core sends ``InitializeReplica``;
    * ``starting``: ``InitializeReplica`` received, ``__init__`` not done; the
      core waits for its ``ReplicaReady`` (with a fresh start timeout);
    * ``running``: ready and serving;
    * ``reconfiguring``: serving, a reconfigure (number ``version``) not yet
      acknowledged; the core waits for its ``ReplicaReconfigured``;
    * ``stopping``: told to stop, still draining (``node_id`` optional); it
      keeps its ranks until its ``ReplicaStopped``, which the executor still owes;
    * ``failed``: static placement only (a bundle of its rank has no node);
      the core stops its process and keeps the rank FAILED (or restarts it on
      its bundles if the spec places them). Refused for any other deployment.

    ``node_id`` is required except for ``pending`` and ``stopping``.
    """

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    rank: ReportedRank = attrs.field(converter=_parse_rank)
    node_id: str | None = attrs.field(default=None, validator=f.optional_name)
    phase: Phase = attrs.field(default=Phase.RUNNING, converter=_report_phase, validator=_check_report)
    world_size: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(f.count)
    )
    lineage: int | None = attrs.field(default=None, validator=attrs.validators.optional(f.count))
    #: number of the last reconfigure it received (so a pending answer still matches)
    version: int = attrs.field(default=0, validator=f.count)
    #: the user_config it runs (UNKNOWN if not said; OUTDATED if older than the
    #: deployment's): an outdated replica is reconfigured after recovery
    user_config: Any = attrs.field(default=UNKNOWN, hash=False)


@attrs.frozen(kw_only=True, weakref_slot=False)
class UnresponsiveReplica:
    """A live replica process a recovering controller found but that did not
    answer its report call in time: its rank is unknown. The core stops it
    (``StopReplica`` with ``graceful_shutdown_timeout_s=0``) and gives no rank
    of its deployment (no gap refilled, no compaction) until the answer to
    that stop, ``ReplicaStopped`` (or ``ReplicaCrashed``), arrives: it may hold
    any free rank, and must not run next to a replacement on it. The executor
    owes that answer even when the node is gone (``ReplicaCrashed``)."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    #: where the process runs, if the executor knows (None: unknown)
    node_id: str | None = attrs.field(default=None, validator=f.optional_name)


@attrs.frozen(kw_only=True, weakref_slot=False)
class ControllerRecovered:
    """A restarted controller learnt the deployments' configs and the replicas' reports.

    Feed it to a fresh ``State()`` (a ``Tick`` first is fine): it replaces
    everything, so a state that already has deployments or nodes is refused.
    Ranks are not checkpointed (as in Ray Serve): they are rebuilt from the
    reports alone. ``deployments`` is every deployment as it is meant to be
    now: what ``rankcore.desired_specs(state)`` returned after the last step
    that changed it, which the embedder persists (a scale since the first
    ``DeploymentApplied`` is folded in). ``reports`` and ``unresponsive``:
    every live replica process the executor found, including those of
    deployments ``deployments`` does not name (the core decides what to stop,
    see ``stop_unknown``); the executor kills nothing on its own.
    ``next_replica_number`` / ``next_lineage``, when the executor
    knows them (every id it ever started), keep the core from handing out the
    id of a replica that died while the controller was down (its late news
    would then hit the new replica); without them the core continues after
    the highest reported id.
    """

    deployments: tuple[DeploymentApplied, ...] = attrs.field(converter=f.to_tuple)
    reports: tuple[ReplicaReport, ...] = attrs.field(converter=f.to_tuple)
    next_replica_number: int = attrs.field(default=0, validator=f.count)
    next_lineage: int = attrs.field(default=0, validator=f.count)
    #: stop live replicas of deployments ``deployments`` does not name. False
    #: (the default) makes such reports raise InvalidEvent instead: a
    #: forgotten spec must not silently stop a fleet.
    stop_unknown: bool = attrs.field(default=False, validator=f.flag)
    #: the cluster's nodes now (what ``NodeJoined`` said of each): the core
    #: rebuilds its cluster view from them and the reports' node ids
    nodes: tuple[NodeJoined, ...] = attrs.field(default=(), converter=f.to_tuple)
    #: live processes that did not answer their report call in time: each is
    #: stopped at once, and its deployment's free ranks stay free until it has
    #: stopped (see ``UnresponsiveReplica``); an id may not also report
    unresponsive: tuple[UnresponsiveReplica, ...] = attrs.field(default=(), converter=f.to_tuple)

    @unresponsive.validator
    def _check_unresponsive(self, attribute: attrs.Attribute, value: tuple) -> None:
        _check_records("unresponsive", value, UnresponsiveReplica, lambda u: u.replica_id, "names {!r} twice")
        reported = {r.replica_id for r in self.reports}
        both = sorted(u.replica_id for u in value if u.replica_id in reported)
        if both:
            raise InvalidConfig(f"ControllerRecovered: {both[0]!r} is both in reports and in unresponsive "
                                f"(a replica that answered reports; one that did not is unresponsive)")

    @nodes.validator
    def _check_nodes(self, attribute: attrs.Attribute, value: tuple) -> None:
        _check_records("nodes", value, NodeJoined, lambda n: n.node_id, "names {!r} twice")

    def unknown_ids(self) -> list[str]:
        """The replicas found (answering or not) of deployments the event does
        not name, sorted: what ``stop_unknown`` stops (an executor's trace says so)."""
        named = {d.name for d in self.deployments}
        return sorted([r.replica_id for r in self.reports if r.deployment not in named]
                      + [u.replica_id for u in self.unresponsive if u.deployment not in named])

    @deployments.validator
    def _check_deployments(self, attribute: attrs.Attribute, value: tuple) -> None:
        _check_records("deployments", value, DeploymentApplied, lambda d: d.name, "names {!r} twice")

    @reports.validator
    def _check_reports(self, attribute: attrs.Attribute, value: tuple) -> None:
        _check_records("reports", value, ReplicaReport, lambda r: r.replica_id, "has two reports from {!r}")


def _check_records(field: str, value: Any, cls: type, key: Any, twice: str) -> None:
    """A ControllerRecovered tuple field: only ``cls`` records, no key twice."""
    if not isinstance(value, tuple):
        raise InvalidConfig(f"ControllerRecovered.{field} must be an iterable of {cls.__name__}, got {value!r}")
    seen = set()
    for x in value:
        if not isinstance(x, cls):
            raise InvalidConfig(f"ControllerRecovered.{field} holds {x!r}, not a {cls.__name__}")
        k = key(x)
        if k in seen:
            raise InvalidConfig(f"ControllerRecovered.{field} " + twice.format(k))
        seen.add(k)

Event = Union[
    BundlesPlaced,
    DeploymentApplied,
    ScaleRequested,
    ReplicaPlaced,
    ReplicaReady,
    ReplicaReconfigured,
    ReplicaCrashed,
    HealthChecked,
    ReplicaStopped,
    NodeLost,
    NodeJoined,
    NodeCapacityChanged,
    PlacementFailed,
    Tick,
    ControllerRecovered,
]

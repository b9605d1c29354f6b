"""Events: past-tense facts an executor (or a user) tells the core.

Frozen, slotted, keyword-only attrs records that validate on construction;
their reprs are valid Python, so a failing hypothesis run prints a replayable
program. ``step`` dispatches on ``type(event)``.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Union

import attrs

from . import fields as f
from .errors import InvalidConfig
from .lifecycle import Phase
from .options import DEFAULTS, OPTION_NAMES, DeploymentConfig, flat_reads
from .proxybook import ProxyOptions
from .ranks import MAX_RANKS, ReportedRank

__all__ = [
    "DEFAULT_MAX_REPLICAS",
    "UNKNOWN",
    "OUTDATED",
    "DeploymentApplied",
    "ScaleRequested",
    "DeploymentDeleted",
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
    "WarmCopy",
    "SleepRequested",
    "WakeRequested",
    "WeightsPushed",
    "TierMoved",
    "TierMoveFailed",
    "WeightsUpdated",
    "AutoscalingMetrics",
    "ProxiesConfigured",
    "ProxyStarted",
    "ProxyCrashed",
    "ProxyHealthChecked",
    "NodeDraining",
    "ModelsReported",
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
#: conclusions; the core derives its rules from them (``rankcore.placement.restarts``):
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
        raise InvalidConfig(f"DeploymentApplied.max_replicas must be a positive int, got {f.shown(value)}")
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


def _check_cause(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value not in CRASH_CAUSES:
        raise InvalidConfig(f"ReplicaCrashed({inst.replica_id!r}).cause must be one of {', '.join(CRASH_CAUSES)}, "
                            f"got {f.shown(value)}")


def _check_config(inst: DeploymentApplied, attribute: attrs.Attribute, value: DeploymentConfig) -> None:
    """What the options must agree on with the replica count."""
    if not isinstance(value, DeploymentConfig):
        raise InvalidConfig(f"DeploymentApplied({inst.name!r}).config must be a rankcore.base.options.DeploymentConfig, "
                            f"got {type(value).__name__}")
    static, k = value.static.static_placement, value.gang.gang_size
    if static is not None and inst.num_replicas not in (0, static.replicas):
        raise InvalidConfig(
            f"DeploymentApplied({inst.name!r}): num_replicas={f.shown(inst.num_replicas)}, but static placement maps "
            f"{static.replicas} ranks (the replica count is fixed to the mapping's length, or 0 to shut it down)")
    if k > 1 and inst.num_replicas % k:
        raise InvalidConfig(f"DeploymentApplied({inst.name!r}): num_replicas={f.shown(inst.num_replicas)} is not a "
                            f"multiple of gang_size={k} (gangs start and stop whole)")
    _check_autoscaling_bounds(inst, value)


def _check_autoscaling_bounds(inst: DeploymentApplied, config: DeploymentConfig) -> None:
    """The autoscaler's bounds, ``min_replicas`` and ``initial_replicas`` against ``max_replicas``
    (Ray Serve's AutoscalingConfig checks), and room for a whole gang between them (at least one
    gang below max_replicas, min_replicas 0 included)."""
    auto, top, k = config.autoscaler, inst.max_replicas, config.gang.gang_size
    where = f"DeploymentApplied({inst.name!r})"
    if type(top) is not int:
        return  # (max_replicas' own check names it)
    if auto.min_replicas > top:
        raise InvalidConfig(f"{where}: min_replicas={auto.min_replicas} is above max_replicas={f.shown(top)}")
    if auto.initial_replicas is not None and auto.initial_replicas > top:
        raise InvalidConfig(f"{where}: initial_replicas={auto.initial_replicas} is above max_replicas={f.shown(top)}")
    if auto.autoscaling and k > 1 and -(-auto.min_replicas // k) * k > top // k * k:
        raise InvalidConfig(f"{where}: no whole number of gangs of {k} lies between min_replicas="
                            f"{auto.min_replicas} and max_replicas={f.shown(top)} (the autoscaler scales by gangs)")
    if auto.autoscaling and k > 1 and top < k:
        raise InvalidConfig(f"{where}: max_replicas={f.shown(top)} is below gang_size={k}: the autoscaler scales "
                            f"by whole gangs, so this deployment could never run a replica")


@attrs.frozen(kw_only=True, init=False, repr=False)
class DeploymentApplied:
    """A deployment was created or its config changed (Ray Serve's ``serve.run``).

    ``user_config`` is any value; ``None`` means "no user_config" (then, as in
    Ray Serve, the user's ``reconfigure`` is not called at startup or for rank
    changes). ``has_reconfigure``/``reconfigure_takes_rank`` describe the
    user's class, so the core can apply the seed's rules.

    The deployment's options (``rankcore.base.options``: placement, starts, health checks,
    shutdown, static placement, gangs, spare processes) are its ``config``, given as a
    ``DeploymentConfig`` or by their flat names (``DeploymentApplied(name="llm",
    num_replicas=4, gang_size=2)``; both: the names change that config) and read flat
    too (``e.gang_size``). An unknown name raises ``InvalidConfig`` listing the options.
    """

    name: str = attrs.field(validator=f.name)
    num_replicas: int = attrs.field(validator=f.count)
    user_config: Any = attrs.field(default=None, hash=False)
    has_reconfigure: bool = attrs.field(default=False, validator=f.flag)
    reconfigure_takes_rank: bool = attrs.field(default=False, validator=_check_reconfigure)
    #: the most replicas this deployment may ever be scaled to (ScaleRequested too)
    max_replicas: int = attrs.field(default=DEFAULT_MAX_REPLICAS, validator=_check_max_replicas)
    #: the options (rankcore.base.options), each declared there once
    config: DeploymentConfig = attrs.field(default=DEFAULTS, validator=_check_config)

    if TYPE_CHECKING:  # the flat reads of the options, generated below
        def __getattr__(self, name: str) -> Any: ...

    def __init__(self, *, name: str, num_replicas: int, user_config: Any = None, has_reconfigure: bool = False,
                 reconfigure_takes_rank: bool = False, max_replicas: int = DEFAULT_MAX_REPLICAS,
                 config: DeploymentConfig = DEFAULTS, **options: Any) -> None:
        if options:
            config = DeploymentConfig.of(options, config if isinstance(config, DeploymentConfig) else None,
                                         owner=f"DeploymentApplied({f.shown(name)})")
        self.__attrs_init__(name=name, num_replicas=num_replicas, user_config=user_config,
                            has_reconfigure=has_reconfigure, reconfigure_takes_rank=reconfigure_takes_rank,
                            max_replicas=max_replicas, config=config)

    def replace(self, **changes: Any) -> DeploymentApplied:
        """A copy with fields or options (by their flat names) changed, checked as a new one is
        (``attrs.evolve`` does the same at run time, but type checkers know only the fields)."""
        fields = {a.name: getattr(self, a.name) for a in attrs.fields(DeploymentApplied)}
        return DeploymentApplied(**{**fields, **changes})

    def flat(self) -> dict[str, Any]:
        """Its fields and every option by its flat name: ``DeploymentApplied(**e.flat()) == e``
        (what a trace writes)."""
        return {"name": self.name, "num_replicas": self.num_replicas, "user_config": self.user_config,
                "has_reconfigure": self.has_reconfigure, "reconfigure_takes_rank": self.reconfigure_takes_rank,
                "max_replicas": self.max_replicas, **self.config.flat()}

    def __repr__(self) -> str:
        """Valid Python: the options that differ from their defaults, by their flat names."""
        fields = {"name": self.name, "num_replicas": self.num_replicas, "user_config": self.user_config,
                  "has_reconfigure": self.has_reconfigure, "reconfigure_takes_rank": self.reconfigure_takes_rank,
                  "max_replicas": self.max_replicas, **self.config.changed()}
        return f"DeploymentApplied({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


flat_reads(DeploymentApplied, "config.")
if {a.name for a in attrs.fields(DeploymentApplied)} & set(OPTION_NAMES):
    raise TypeError("DeploymentApplied: a field and an option share a name (rankcore.base.options)")


@attrs.frozen(kw_only=True)
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


@attrs.frozen(kw_only=True)
class DeploymentDeleted:
    """Delete one deployment (Ray Serve's ``serve.delete``), leaving the others be.

    Its target goes to 0 at once (requests waiting for it fail: nothing is
    coming) and its replicas drain and stop as on a downscale; its record, and
    the WARM copies its replicas left in the nodes' CPU caches, go once the last
    one has stopped (``rankcore.control.deletion``). A ``DeploymentApplied`` of the same
    name before then takes it back (a new target; the replicas already stopping
    still stop). A ``ScaleRequested`` meanwhile is refused.
    """

    deployment: str = attrs.field(validator=f.name)


@attrs.frozen(kw_only=True)
class ReplicaPlaced:
    """The executor put a started replica on a node (answers StartReplica)."""

    replica_id: str = attrs.field(validator=f.name)
    node_id: str = attrs.field(validator=f.name)
    #: the executor's clock when this happened (optional): the core first
    #: moves its clock there, as a ``Tick(now)`` would, in this same step, so
    #: the start deadline this answer arms counts from now without a Tick step
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True)
class ReplicaReady:
    """The replica finished initialising (answers InitializeReplica)."""

    replica_id: str = attrs.field(validator=f.name)


@attrs.frozen(kw_only=True)
class ReplicaReconfigured:
    """The replica applied reconfigure number ``version`` (answers ReconfigureReplica)."""

    replica_id: str = attrs.field(validator=f.name)
    version: int = attrs.field(validator=f.order)


@attrs.frozen(kw_only=True)
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


@attrs.frozen(kw_only=True)
class HealthChecked:
    """The outcome of one health check of a running replica (the executor checks every
    ``health_check_period_s``; no answer within ``health_check_timeout_s`` is a failure).
    A fact: the core counts consecutive failures and decides (``rankcore.control.health``)."""

    replica_id: str = attrs.field(validator=f.name)
    healthy: bool = attrs.field(validator=f.flag)
    detail: str = attrs.field(default="", validator=f.text)
    #: the executor's clock when the check ended (optional), as on the other answers
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True)
class ReplicaStopped:
    """The replica has fully stopped (answers StopReplica); its ranks are released."""

    replica_id: str = attrs.field(validator=f.name)
    #: the executor's clock when this happened (optional), as on the other answers: the
    #: room it frees may go to a waiting replica, whose placement deadline counts from now
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True)
class NodeLost:
    """A node is gone: every replica placed on it has crashed."""

    node_id: str = attrs.field(validator=f.name)


def _bundle_nodes(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _check_bundle_nodes(inst: BundlesPlaced, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, tuple) or not value or not all(n is None or (type(n) is str and n) for n in value):
        bad = next((n for n in value if isinstance(n, str) and type(n) is not str), value) \
            if isinstance(value, tuple) else value
        raise InvalidConfig(f"BundlesPlaced({inst.deployment!r}).bundle_nodes must list a node id (or None) for "
                            f"every bundle of the group, got {f.shown_id(bad)}")


@attrs.frozen(kw_only=True)
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
        raise InvalidConfig(f"ReplicaReport.phase must be one of {live}, got {f.shown(value)}") from None
    if phase in (Phase.STOPPED, Phase.CRASHED):
        raise InvalidConfig(f"ReplicaReport.phase: a live replica cannot report {phase.value!r}")
    return phase


def _check_report(inst: ReplicaReport, attribute: attrs.Attribute, value: Any) -> None:
    if inst.phase is not Phase.PENDING and inst.node_id is None and inst.phase is not Phase.STOPPING:
        raise InvalidConfig(
            f"ReplicaReport({inst.replica_id!r}) is {inst.phase.value} but names no node_id"
        )


@attrs.frozen(kw_only=True)
class NodeJoined:
    """A node joined the cluster: from now on the core places replicas (see
    docs/architecture.md, "Placement"). ``order`` breaks placement ties (lower
    first; default: the order nodes joined in)."""

    node_id: str = attrs.field(validator=f.name)
    resources: tuple[tuple[str, float], ...] = attrs.field(converter=f.to_resources, validator=f.resources)
    labels: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=f.to_labels, validator=f.labels)
    order: int | None = attrs.field(default=None, validator=attrs.validators.optional(f.order))
    #: its GPUs' memory in bytes, one entry per device (index = position): replicas of
    #: deployments with ``model_bytes`` are booked on these by memory (rankcore.tiers.devices)
    devices: tuple[int, ...] = attrs.field(default=(), converter=f.to_tuple)
    #: CPU memory for WARM copies of evicted models, in bytes (rankcore.tiers.choice.make_room)
    cpu_cache_bytes: int = attrs.field(default=0)

    @devices.validator
    def _check_devices(self, attribute: attrs.Attribute, value: tuple) -> None:
        if not isinstance(value, tuple) or any(type(b) is not int or b < 1 for b in value):
            raise InvalidConfig(f"NodeJoined({self.node_id!r}).devices must be each GPU's memory in bytes "
                                f"(ints >= 1), got {f.shown(value)}")
        gpus = dict(self.resources).get("GPU")
        if value and gpus is not None and gpus != len(value):
            raise InvalidConfig(f"NodeJoined({self.node_id!r}): resources say GPU={gpus:g} but devices lists "
                                f"{len(value)} (one entry per GPU)")

    @cpu_cache_bytes.validator
    def _check_cache(self, attribute: attrs.Attribute, value: object) -> None:
        if type(value) is not int or value < 0:
            raise InvalidConfig(f"NodeJoined({self.node_id!r}).cpu_cache_bytes must be a number of bytes "
                                f"(an int >= 0), got {f.shown(value)}")


@attrs.frozen(kw_only=True)
class NodeCapacityChanged:
    """A node's total resources changed. Replicas already there stay (even if
    they no longer fit); new ones go there only while they fit. Also clears
    the node from every replica's failed-placement list: it may fit now."""

    node_id: str = attrs.field(validator=f.name)
    resources: tuple[tuple[str, float], ...] = attrs.field(converter=f.to_resources, validator=f.resources)


@attrs.frozen(kw_only=True)
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


@attrs.frozen(kw_only=True)
class Tick:
    """Time passed: the core's clock is now ``now`` (seconds, any origin, never
    going back). Start timeouts and suspect nodes run on it; a ScheduleTick
    command says when the core next needs one."""

    now: float = attrs.field(validator=f.seconds)


def _to_versions(value: Any) -> tuple[tuple[str, int], ...]:
    """(deployment, weights version) pairs, from pairs or a mapping; sorted."""
    items = value.items() if hasattr(value, "items") else value
    out = []
    for item in items:
        try:
            name, version = item
        except (TypeError, ValueError):
            raise InvalidConfig(f"ControllerRecovered.weights_versions: {f.shown(item)} is not a "
                                f"(deployment, version) pair") from None
        if type(name) is not str or type(version) is not int or version < 0:
            raise InvalidConfig(f"ControllerRecovered.weights_versions: {f.shown(item)} is not a "
                                f"(deployment, version >= 0) pair (deployment: {f.shown_id(name)})")
        out.append((name, version))
    return tuple(sorted(out))


def _tier_name(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if type(value) is not str or value not in ("hot", "warm"):  # (a str subclass may equal anything)
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be 'hot' or 'warm', got {f.shown(value)}")


@attrs.frozen(kw_only=True)
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
      controller); the core sends ``InitializeReplica``. Its ``rank`` may
      carry the node and local ranks its ``PlaceReplica`` reserved there:
      claimed like a running replica's, so the recovered controller keeps the
      old one's choice (an executor's recovery waits for a placement under
      way to land, and reports it so);
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
        default=None, validator=attrs.validators.optional(f.order)
    )
    lineage: int | None = attrs.field(default=None, validator=attrs.validators.optional(f.order))
    #: number of the last reconfigure it received (so a pending answer still matches)
    version: int = attrs.field(default=0, validator=f.order)
    #: the user_config it runs (UNKNOWN if not said; OUTDATED if older than the
    #: deployment's): an outdated replica is reconfigured after recovery
    user_config: Any = attrs.field(default=UNKNOWN, hash=False)
    #: where its weights are now (``"hot"``: on its GPU; ``"warm"``: asleep; a move in
    #: progress: where they still are) and the version it holds (or is being given)
    tier: str = attrs.field(default="hot", validator=_tier_name)
    weights_version: int = attrs.field(default=0, validator=f.order)
    #: the GPUs of its node its weights are on (a deployment with ``model_bytes``, HOT):
    #: the core books them again (rankcore.tiers.devices)
    devices: tuple[int, ...] = attrs.field(default=(), converter=f.to_tuple)
    #: the deployment revision it was started with (``StartReplica.revision``); None: not said (taken
    #: as current). Another one is outdated: the rollout goes on (rankcore.control.rollouts)
    revision: str | None = attrs.field(default=None, validator=attrs.validators.optional(f.text))
    #: the multiplexed models it holds or loads (``ModelsReported``): kept on its record again
    models: tuple[str, ...] = attrs.field(default=(), converter=f.to_tuple, validator=f.model_ids)
    #: the collective group's epoch it was last told (``ReformGroup``; rankcore.control.groups): its
    #: group's id, the epoch (0: none) and that epoch's members in rank order
    group_id: str | None = attrs.field(default=None, validator=f.optional_name)
    group_epoch: int = attrs.field(default=0, validator=f.order)
    group_members: tuple[str, ...] = attrs.field(default=(), converter=f.to_tuple, validator=f.names)

    @devices.validator
    def _check_devices(self, attribute: attrs.Attribute, value: Any) -> None:
        if not isinstance(value, tuple) or any(type(i) is not int or i < 0 for i in value):
            raise InvalidConfig(f"ReplicaReport({self.replica_id!r}).devices must be the indices of its node's GPUs "
                                f"(ints >= 0), got {f.shown(value)}")

    @tier.validator
    def _check_tier(self, attribute: attrs.Attribute, value: str) -> None:
        if value == "warm" and self.phase in (Phase.PENDING, Phase.STARTING):
            raise InvalidConfig(f"ReplicaReport({self.replica_id!r}): a {self.phase.value} replica cannot be warm "
                                f"(a replica sleeps only once it runs)")


@attrs.frozen(kw_only=True)
class WarmCopy:
    """A WARM copy a node's CPU cache holds (an evicted replica's weights), as the
    executor tells a recovering controller (``ControllerRecovered.warm_copies``)."""

    node_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    replica_id: str = attrs.field(validator=f.name)
    nbytes: int = attrs.field(validator=f.order)


@attrs.frozen(kw_only=True)
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


@attrs.frozen(kw_only=True)
class ControllerRecovered:
    """A restarted controller learnt the deployments' configs and the replicas' reports.

    Feed it to a fresh ``State()`` (a ``Tick`` first is fine): it replaces
    everything, so a state that already has deployments or nodes, or has handed out
    replica ids (a repeated or late recovery), is refused.
    Ranks are not checkpointed (as in Ray Serve): they are rebuilt from the
    reports alone. ``deployments`` is every deployment as it is meant to be
    now: what ``rankcore.query.desired_specs(state)`` returned after the last step
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
    next_replica_number: int = attrs.field(default=0, validator=f.order)
    next_lineage: int = attrs.field(default=0, validator=f.order)
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
    #: the deployments meant to be asleep (``SleepRequested``) and the weights version last
    #: pushed to each (``WeightsPushed``): persist ``rankcore.query.desired_asleep(state)`` and
    #: ``rankcore.query.desired_weights(state)`` beside the specs (docs/tiers.md)
    asleep: tuple[str, ...] = attrs.field(default=(), converter=f.to_tuple, validator=f.names)
    weights_versions: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_to_versions)
    #: the WARM copies the nodes' CPU caches hold (rankcore.tiers.devices), in the order they came
    warm_copies: tuple[WarmCopy, ...] = attrs.field(default=(), converter=f.to_tuple)
    #: ``rankcore.query.desired_no_evict(state)`` beside the specs: the evicted replicas'
    #: replacements still waiting, which wait for room and never evict
    no_evict: tuple[str, ...] = attrs.field(default=(), converter=f.to_tuple, validator=f.names)
    #: ``rankcore.query.desired_deleted(state)`` beside the specs: the deployments deleted
    #: (``DeploymentDeleted``). One that ``deployments`` still names (at 0 replicas) is
    #: still being deleted; the others are gone, and late news about their replicas is stale
    deleted: tuple[str, ...] = attrs.field(default=(), converter=f.to_tuple, validator=f.names)
    #: the proxies (rankcore.control.proxies): the last ``ProxiesConfigured`` the core was
    #: told (None: it ran none), the proxies alive now (each answered), and the number the
    #: next proxy id takes (one above any id handed out, so that late news of a proxy that
    #: died meanwhile is stale, not taken for a new one)
    proxies: ProxiesConfigured | None = attrs.field(default=None)

    @proxies.validator
    def _check_proxies(self, attribute: attrs.Attribute, value: object) -> None:
        if value is not None and type(value).__name__ != "ProxiesConfigured":
            raise InvalidConfig(f"ControllerRecovered.proxies must be the last ProxiesConfigured (or None), "
                                f"got {f.shown(value)}")
    proxy_ids: tuple[str, ...] = attrs.field(default=(), converter=f.to_tuple, validator=f.names)
    next_proxy_number: int = attrs.field(default=0, validator=f.order)

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

    @warm_copies.validator
    def _check_warm_copies(self, attribute: attrs.Attribute, value: tuple) -> None:
        if not isinstance(value, tuple) or not all(isinstance(c, WarmCopy) for c in value):
            raise InvalidConfig(f"ControllerRecovered.warm_copies must be an iterable of WarmCopy, "
                                f"got {f.shown(value)}")

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
        raise InvalidConfig(f"ControllerRecovered.{field} must be an iterable of {cls.__name__}, got {f.shown(value)}")
    seen = set()
    for x in value:
        if not isinstance(x, cls):
            raise InvalidConfig(f"ControllerRecovered.{field} holds {f.shown(x)}, not a {cls.__name__}")
        k = key(x)
        if k in seen:
            raise InvalidConfig(f"ControllerRecovered.{field} " + twice.format(k))
        seen.add(k)


@attrs.frozen(kw_only=True)
class SleepRequested:
    """Put a deployment's replicas to sleep (RL: the trainer needs the GPUs):
    each running replica's weights go to CPU memory, its process, ranks and
    bundle kept (``OffloadReplica``); a replica that becomes ready meanwhile
    sleeps once it is ready. ``world_size`` and the ranks do not change."""

    deployment: str = attrs.field(validator=f.name)


@attrs.frozen(kw_only=True)
class WakeRequested:
    """Wake a sleeping deployment (``LoadReplica`` for each sleeper). With
    ``weights_version``, the replicas wake with those weights: the same as a
    ``WeightsPushed`` of that version first."""

    deployment: str = attrs.field(validator=f.name)
    weights_version: int | None = attrs.field(default=None, validator=attrs.validators.optional(f.order))


@attrs.frozen(kw_only=True)
class WeightsPushed:
    """New weights, ``version`` (greater than any before), for every replica of
    the deployment: one starting or asleep included. Each gets
    ``UpdateWeights``; a replica not yet initialised loads them at start."""

    deployment: str = attrs.field(validator=f.name)
    version: int = attrs.field(validator=f.order)


@attrs.frozen(kw_only=True)
class TierMoved:
    """A replica's weights arrived: ``tier`` ``"warm"`` answers ``OffloadReplica``,
    ``"hot"`` answers ``LoadReplica``."""

    replica_id: str = attrs.field(validator=f.name)
    tier: str = attrs.field(validator=_tier_name)
    #: what moved, for the metrics (optional)
    nbytes: int = attrs.field(default=0, validator=f.order)


@attrs.frozen(kw_only=True)
class TierMoveFailed:
    """An ``OffloadReplica`` or ``LoadReplica`` could not be carried out: the
    weights are where they were (on its GPU, or in CPU memory)."""

    replica_id: str = attrs.field(validator=f.name)
    reason: str = attrs.field(default="", validator=f.text)


@attrs.frozen(kw_only=True)
class WeightsUpdated:
    """The replica holds the weights of ``version`` (answers ``UpdateWeights``)."""

    replica_id: str = attrs.field(validator=f.name)
    version: int = attrs.field(validator=f.order)


def _to_ongoing(value: Any) -> Any:
    """(replica id, requests in flight) pairs, from pairs or a mapping; sorted by id."""
    if isinstance(value, Mapping):
        value = value.items()
    value = f.to_tuple(value)
    if not isinstance(value, tuple):
        return value
    try:
        return tuple(sorted((tuple(p) for p in value), key=lambda p: str(p[0])))
    except (TypeError, IndexError):
        return value  # (the validator names it)


_in_flight = itemgetter(1)  # an ongoing pair's count


def _check_ongoing(inst: AutoscalingMetrics, attribute: attrs.Attribute, value: Any) -> None:
    where = f"AutoscalingMetrics({inst.deployment!r}).ongoing"
    if not isinstance(value, tuple):
        raise InvalidConfig(f"{where} must be (replica id, requests in flight) pairs, got {f.shown(value)}")
    seen: set[str] = set()
    for pair in value:
        if (not isinstance(pair, tuple) or len(pair) != 2 or type(pair[0]) is not str or not pair[0]
                or type(pair[1]) is not int or not 0 <= pair[1] <= f.MAX_ORDER):
            raise InvalidConfig(f"{where} holds {f.shown(pair)}, not a (replica id, int >= 0) pair (a plain str "
                                f"and at most 2**63 - 1)")
        if pair[0] in seen:
            raise InvalidConfig(f"{where} names {pair[0]!r} twice")
        seen.add(pair[0])


@attrs.frozen(kw_only=True)
class AutoscalingMetrics:
    """What the request path saw of one autoscaled deployment at ``now`` (an executor sends one
    every ``metrics_interval_s``; Ray Serve's handles and replicas push the same two metrics):
    ``queued``, requests waiting in its handles' queues for a replica; ``ongoing``, the requests
    in flight on each replica, as (replica id, n) pairs (or a mapping). Facts only: the window,
    the aggregation and the decision are the core's (``rankcore.control.autoscaling``)."""

    deployment: str = attrs.field(validator=f.name)
    now: float = attrs.field(validator=f.seconds)
    queued: int = attrs.field(default=0, validator=f.order)
    ongoing: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_to_ongoing, validator=_check_ongoing)

    @property
    def total(self) -> int:
        """Every request this deployment holds now: queued and in flight (Ray Serve's total_num_requests)."""
        return self.queued + sum(map(_in_flight, self.ongoing))  # (no generator: read once a sample, O(replicas))


def _check_proxy_options(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, ProxyOptions):
        raise InvalidConfig(f"ProxiesConfigured.options must be a rankcore.ProxyOptions, got {f.shown(value)}")


@attrs.frozen(kw_only=True)
class ProxiesConfigured:
    """From now on the core runs the proxies (``rankcore.control.proxies``): where
    (``options.proxy_location``) and which node is the head (Serve: the controller's node).
    Sent again, it changes where they run (proxies no longer wanted drain)."""

    options: ProxyOptions = attrs.field(factory=ProxyOptions, validator=_check_proxy_options)
    head_node: str | None = attrs.field(default=None, validator=f.optional_name)
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True)
class ProxyStarted:
    """Proxy ``proxy_id`` (``StartProxy``) is up and passed its ready check: it serves."""

    proxy_id: str = attrs.field(validator=f.name)
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True)
class ProxyCrashed:
    """Proxy ``proxy_id`` died (its process, its start, or a ``StopProxy`` cut short)."""

    proxy_id: str = attrs.field(validator=f.name)
    reason: str = attrs.field(default="", validator=f.text)
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True)
class ProxyHealthChecked:
    """One health check of a proxy, and how many requests it had in flight then (facts: the
    core counts failures in a row, and ends a drain only when none is in flight)."""

    proxy_id: str = attrs.field(validator=f.name)
    healthy: bool = attrs.field(validator=f.flag)
    ongoing: int = attrs.field(default=0, validator=f.order)
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True)
class NodeDraining:
    """The cluster is draining ``node_id`` (Ray's autoscaler takes it away soon): its proxy
    drains (``/-/healthz`` answers 503 so an outside load balancer moves away). Replicas on it
    are not moved by this event (NodeLost ends them when it goes)."""

    node_id: str = attrs.field(validator=f.name)
    now: float | None = attrs.field(default=None, validator=f.optional_seconds)


@attrs.frozen(kw_only=True)
class ModelsReported:
    """Replica ``replica_id`` holds (or is loading) the multiplexed models ``model_ids``, the
    whole set, as it reported them (issue 39: ``@multiplexed``). Kept on its record
    (``Replica.models``: status, metrics, a recovery) and told to the request path
    (``ReplicaModels`` in ``Step.pool``), which routes a model's requests to its holders. The
    same set again, or news of a replica that has left, is stale."""

    replica_id: str = attrs.field(validator=f.name)
    model_ids: tuple[str, ...] = attrs.field(converter=f.to_tuple, validator=f.model_ids)


Event = Union[
    ModelsReported,
    ProxiesConfigured,
    ProxyStarted,
    ProxyCrashed,
    ProxyHealthChecked,
    NodeDraining,
    BundlesPlaced,
    DeploymentApplied,
    ScaleRequested,
    DeploymentDeleted,
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
    SleepRequested,
    WakeRequested,
    WeightsPushed,
    TierMoved,
    TierMoveFailed,
    WeightsUpdated,
    AutoscalingMetrics,
]

"""State records: frozen attrs over persistent maps, so one event costs O(log N).

A ``State`` holds any number of deployments, each with its own rank space
(its own :class:`~rankcore.base.ranks.RankTable`). Nothing here is ever mutated;
``step`` returns a new ``State`` and the old one stays valid.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs
import immutables

from . import fields as f
from .bundles import StaticPlacement
from .cluster import Cluster, packing_gap
from .errors import UnknownDeployment
from .events import DEFAULT_MAX_REPLICAS, DeploymentApplied
from .lifecycle import LIVE, Phase, Residency
from .options import DEFAULTS, MAX_PER_REPLICA_RETRY_COUNT, DeploymentConfig, StaticOptions, flat_reads
from .proxybook import ProxyBook
from .ranks import LowerBound, RankTable, Reassignments, ReplicaRank

__all__ = ["Replica", "Autoscaler", "Deployment", "State", "Step", "Compaction", "RecoveryOutcome", "replica_id", "desired_specs",
           "desired_deleted", "desired_asleep", "desired_weights", "desired_no_evict"]

_PHASE_INDEX = {p: i for i, p in enumerate(LIVE)}
# where counts keeps running and stopping replicas (an enum member read off its
# class is ~10x slower than a global: these are read at every step)
_RUNNING_AT, _STOPPING_AT = _PHASE_INDEX[Phase.RUNNING], _PHASE_INDEX[Phase.STOPPING]
_FAILED_AT = _PHASE_INDEX[Phase.FAILED]


#: ``Deployment.status`` values (Ray Serve's DeploymentStatus names)
STATUSES = ("HEALTHY", "UPDATING", "UNHEALTHY")
#: Ray Serve's words once a serving replica died (its ``DeploymentStatusInfo`` message; rankcore.base.unhealthy)
UNTIL_RECOVERED = "This deployment will be UNHEALTHY until the replica recovers or a new deploy happens."


def replica_id(deployment: str, n: int) -> str:
    """The id the core gives the n-th replica it creates: ``"<deployment>#<n>"``."""
    return f"{deployment}#{n}"


def parse_replica_number(rid: str) -> int | None:
    """``n`` of an id made by :func:`replica_id`, or None for a foreign id.

    ASCII digits only (``str.isdigit`` also accepts ``"١"``, which ``int``
    reads as 1: ``"llm#١"`` is not ``"llm#1"``); a number with more digits
    than Python converts (``sys.get_int_max_str_digits``) is no id the core
    made either."""
    _, sep, tail = rid.rpartition("#")
    if not sep or not tail.isascii() or not tail.isdigit() or (len(tail) > 1 and tail[0] == "0"):
        return None
    try:
        return int(tail)
    except ValueError:
        return None


@attrs.frozen(kw_only=True)
class Replica:
    """One incarnation of a replica. A replacement is a new Replica (new id)
    of the same ``lineage``; events about an older incarnation are stale."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    phase: Phase
    lineage: int = attrs.field(validator=f.count)
    node_id: str | None = attrs.field(default=None, validator=f.optional_name)
    #: number of the last ReconfigureReplica sent (0: none yet)
    version: int = attrs.field(default=0, validator=f.count)
    #: the deployment's config_version this replica was given
    config_version: int = attrs.field(default=0, validator=f.count)
    #: a recovered, still-starting replica whose rank changed: tell it once ready
    rank_update_due: bool = attrs.field(default=False, validator=f.flag)
    #: failed health checks in a row (rankcore.control.health)
    health_failures: int = attrs.field(default=0, validator=f.count)
    #: where its weights are (docs/tiers.md: asleep is WARM, process and ranks kept)
    residency: Residency = Residency.HOT
    #: the weights version it was last given (InitializeReplica, UpdateWeights), and whether
    #: that UpdateWeights is still unanswered (it does not serve until it is: rankcore.tiers.residency)
    weights_version: int = attrs.field(default=0, validator=f.count)
    weights_pending: bool = attrs.field(default=False, validator=f.flag)
    #: the deployment's revision it was started with (rankcore.control.rollouts: another one is outdated)
    revision: str = ""
    #: stopping because a rollout replaced it: when it has stopped (or died), its successor takes its
    #: ranks (rankcore.control.moves.succeed_retired); it counts towards the target until then
    retiring: bool = False
    #: blue-green (rankcore.control.bluegreen): set on a *blue*, an old-revision replica still serving
    #: while the new set starts: the (global, node, local) ranks it was told, which its green twin holds
    #: now (it is on a spare entry it is not told); None: not a blue
    blue_ranks: tuple | None = None
    #: the multiplexed models it holds or is loading, as it last reported them (``ModelsReported``;
    #: rankcore.control.models): status, metrics and a recovery see them; the request path is told
    models: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class Autoscaler:
    """An autoscaled deployment's autoscaler (rankcore.control.autoscaling): plain data, so the state stays
    picklable and a step deterministic. Not persisted: a recovered controller starts from fresh
    metrics, as Ray Serve's does."""

    #: (time, requests queued, requests in flight) per AutoscalingMetrics, oldest first, within
    #: ``look_back_period_s`` of the newest
    window: tuple[tuple[float, int, int], ...] = ()
    #: the direction a change has been wanted in without a break (1 up, -1 down, 0 none) and since when
    wanted: int = 0
    since: float | None = None
    #: burst mode (``burst``): when load last crossed 200% of the target; None: not in it
    burst_since: float | None = None


def _empty_counts() -> tuple[int, ...]:
    return (0,) * len(LIVE)


@attrs.frozen(kw_only=True)
class Deployment:
    """A deployment's config, replicas and rank table."""

    name: str = attrs.field(validator=f.name)
    target: int = attrs.field(validator=f.count)
    user_config: Any = attrs.field(default=None, hash=False)
    has_reconfigure: bool = False
    reconfigure_takes_rank: bool = False
    max_replicas: int = DEFAULT_MAX_REPLICAS
    #: the options, as the last ``DeploymentApplied`` gave them (rankcore.base.options); read flat
    #: too: ``dep.gang_size``, ``dep.resources``, ``dep.health_check_period_s``
    config: DeploymentConfig = DEFAULTS
    #: the static placement as it is now: the applied mapping, its bundles on the nodes
    #: last reported (``BundlesPlaced``, ``NodeLost``); ``config`` keeps it as applied
    static: StaticPlacement | None = None
    #: starts that failed in a row (``__init__`` raised or timed out; reset by any ReplicaReady):
    #: the restart backoff and the UNHEALTHY status follow from it (rankcore.placement.restarts)
    start_failures: int = 0
    #: why the last of those failed (``ReplicaCrashed.reason``, cut to ``MAX_FAILURE_SHOWN``): the
    #: status message says it, as Ray Serve's shows the constructor's error
    last_start_failure: str = ""
    #: serving replicas of the deployed revision that died (their id, and why), the last
    #: ``unhealthy.SHOWN``: UNHEALTHY until the deployment is healthy again or a new deploy comes (Ray
    #: Serve's rule: rankcore.base.unhealthy); ``health_failed_more``: how many died before those
    health_failed: tuple[tuple[str, str], ...] = ()
    health_failed_more: int = 0
    config_version: int = 0
    replicas: immutables.Map = attrs.field(factory=immutables.Map)
    ranks: RankTable = attrs.field(factory=RankTable)
    #: replicas per live phase, in ``lifecycle.LIVE`` order
    counts: tuple[int, ...] = attrs.field(factory=_empty_counts)
    #: replica id -> node id (or None) of each unresponsive replica a recovery
    #: stopped whose ReplicaStopped has not come: its rank is unknown, so no
    #: rank is handed out (``transaction.reconcile``) nor compacted (not
    #: ``healthy``) until it has gone (``rankcore.control.recovery``)
    unresponsive: immutables.Map = attrs.field(factory=immutables.Map)
    #: the weights version last pushed (``WeightsPushed``) and whether the deployment is meant
    #: to sleep (``SleepRequested`` / ``WakeRequested``): rankcore.tiers.residency
    weights_version: int = 0
    asleep: bool = False
    #: ``DeploymentDeleted``: its target is 0 and its record goes once its last replica
    #: has stopped (``rankcore.control.deletion``); a ``DeploymentApplied`` takes it back
    deleting: bool = False
    #: the autoscaler's window and timers (``autoscaling`` on, after its first AutoscalingMetrics);
    #: the target it decides is ``target`` itself, which ``desired_specs`` persists
    autoscaler: Autoscaler | None = None
    #: what its replicas must run (``rankcore.control.rollouts.revision`` of its config): one started
    #: with another is outdated; ``rolling`` while any may be (cleared by the rollout pass that finds
    #: none), ``retiring`` counts the outdated replicas stopping to be succeeded on their ranks
    revision: str = ""
    rolling: bool = False
    retiring: int = 0
    #: a rollout's list of the replicas it found outdated (lowest rank first; None: not listed yet)
    #: and how far down it has gone (rankcore.control.rollouts: one walk per rollout)
    roll_order: tuple[str, ...] | None = None
    roll_next: int = 0
    #: blue-green: the blue replicas (``Replica.blue_ranks``) still serving; while there are any, only they serve
    #: (the new set stands by: rankcore.tiers.residency.serving) and none counts towards the target
    blues: int = 0
    #: collective groups (``collective_group``; rankcore.control.groups): group id (the deployment's
    #: name, or a gang's id) -> its ``Group``, the epoch and the members it was formed with
    groups: immutables.Map = attrs.field(factory=immutables.Map)

    if TYPE_CHECKING:  # the flat reads of the options, generated below
        def __getattr__(self, name: str) -> Any: ...

    @classmethod
    def applied(cls, spec: Any, **more: Any) -> Deployment:
        """A deployment as a ``DeploymentApplied`` declares it (``more``: the rest)."""
        return cls(name=spec.name, target=spec.num_replicas, user_config=spec.user_config,
                   has_reconfigure=spec.has_reconfigure, reconfigure_takes_rank=spec.reconfigure_takes_rank,
                   max_replicas=spec.max_replicas, config=spec.config, static=spec.config.static.static_placement,
                   **more)

    def spec(self) -> DeploymentApplied:
        """The ``DeploymentApplied`` that declares this deployment as it is now
        (its current target and static placement, not those it was first applied with)."""
        config = self.config
        if self.static != config.static.static_placement:
            config = attrs.evolve(config, static=StaticOptions(static_placement=self.static))
        return DeploymentApplied(name=self.name, num_replicas=self.target, user_config=self.user_config,
                                 has_reconfigure=self.has_reconfigure,
                                 reconfigure_takes_rank=self.reconfigure_takes_rank, max_replicas=self.max_replicas,
                                 config=config)

    @property
    def options(self) -> DeploymentConfig:
        """The options (``config``; an earlier name): ``dep.options.placement_timeout_s``."""
        return self.config

    def count(self, phase: Phase) -> int:
        return self.counts[_PHASE_INDEX[phase]]

    @property
    def world_size(self) -> int:
        """Always the target (updated the moment the target changes)."""
        return self.target

    @property
    def active(self) -> int:
        """Replicas not being stopped, and those a rollout stops to be succeeded on their ranks:
        what counts towards the target."""
        return len(self.replicas) - self.counts[_STOPPING_AT] + self.retiring - self.blues

    @property
    def healthy(self) -> bool:
        """Target replicas running, none pending, starting, reconfiguring or stopping
        (nor an unresponsive one still to stop), and every one on the deployment's ``user_config``:
        one still waiting for its turn (``rankcore.control.configs`` paces them) keeps it
        ``UPDATING``, as Ray Serve's config update does."""
        return (self.counts[_RUNNING_AT] == self.target == len(self.replicas) and not self.unresponsive
                and all(r.config_version >= self.config_version for r in self.replicas.values()))

    @property
    def failing_to_start(self) -> bool:
        """Ray Serve's rule: ``min(max_constructor_retry_count, 3 x target)`` failed starts in a
        row (rankcore.placement.restarts counts them)."""
        return self.target > 0 and self.start_failures >= min(self.config.start.max_constructor_retry_count,
                                                              MAX_PER_REPLICA_RETRY_COUNT * self.target)

    @property
    def status(self) -> str:
        """Ray Serve's deployment status: ``UNHEALTHY`` while its starts keep failing
        (``min(max_constructor_retry_count, 3 x target)`` in a row; it keeps retrying), a
        static rank is FAILED, or since a serving replica died (rankcore.base.unhealthy: until
        the deployment is healthy again or a new deploy comes), ``HEALTHY`` when healthy, else
        ``UPDATING``."""
        if self.failing_to_start or self.counts[_FAILED_AT] or self.health_failed:
            return "UNHEALTHY"
        return "HEALTHY" if self.healthy else "UPDATING"

    @property
    def status_message(self) -> str:
        """Why the status is what it is (empty when HEALTHY); while starts fail (UPDATING before
        ``failing_to_start``), the last failure's reason too."""
        if self.failing_to_start:
            last = f"; the last: {self.last_start_failure}" if self.last_start_failure else ""
            return (f"failing to start: {self.start_failures} starts in a row failed; retrying with a "
                    f"backoff of up to {self.config.start.restart_backoff_max_s:g} s{last}")
        if self.counts[_FAILED_AT]:
            return f"{self.counts[_FAILED_AT]} rank(s) FAILED: a bundle of theirs has no node"
        if self.health_failed:  # (which replicas died, then Ray Serve's words)
            named = "; ".join(f"replica {rid} {why}" for rid, why in self.health_failed)
            more = f" (and {self.health_failed_more} more before)" if self.health_failed_more else ""
            return f"{named}{more}. {UNTIL_RECOVERED}"
        if self.healthy:
            if not self.asleep:
                return ""
            warm = sum(r.residency is Residency.WARM for r in self.replicas.values())  # (O(N): a status read)
            return (f"asleep: {warm} of {len(self.replicas)} replicas' weights in CPU memory, ranks kept "
                    f"(WakeRequested wakes it)")
        running = f"{self.counts[_RUNNING_AT]} of {self.target} replicas running"
        if self.start_failures and self.last_start_failure:  # (retrying: the error shown now, as Ray Serve's)
            return f"{running}; {self.start_failures} start(s) failed in a row, the last: {self.last_start_failure}"
        return running

    def rank_of(self, rid: str) -> ReplicaRank | None:
        return self.ranks.rank_of(rid)

    def packing_gap(self) -> int:
        """How far from rank-packed the placed replicas are (``placement.packing_gap``):
        0 when every node holds one block of consecutive global ranks. O(N)."""

        ranks = self.ranks
        return packing_gap([ranks.node_of(rid) for rid in ranks])  # (iteration is in global-rank order)


# dep.<option> reads dep.config.<group>.<option>; the static placement reads as dep.static (live)
flat_reads(Deployment, "config.", skip=("static_placement",))


@attrs.frozen(kw_only=True)
class State:
    """Everything the core knows. Build the first one with ``State()``."""

    deployments: immutables.Map = attrs.field(factory=immutables.Map)
    #: replica id -> deployment name, for events that name only the replica
    index: immutables.Map = attrs.field(factory=immutables.Map)
    next_replica: int = 0
    next_lineage: int = 0
    #: foreign replica ids (from recovery reports) that have left: later
    #: events about them are stale, not invalid
    retired: immutables.Map = attrs.field(factory=immutables.Map)
    #: nodes, reservations, the waiting queue, the clock (rankcore.base.cluster)
    cluster: Cluster = attrs.field(factory=Cluster)
    #: deployment name -> None for each deployment deleted whose record has gone
    #: (``DeploymentDeleted``): late news about its replicas is stale, not unknown
    deleted: immutables.Map = attrs.field(factory=immutables.Map)
    #: the proxies, one a node (rankcore.control.proxies; ``options`` None: the core runs none)
    proxies: ProxyBook = attrs.field(factory=ProxyBook)

    def deployment(self, name: str) -> Deployment:
        """The deployment ``name``; :class:`UnknownDeployment` (a ``KeyError``) names the known ones."""
        try:
            return self.deployments[name]
        except KeyError:
            known = ", ".join(repr(n) for n in sorted(self.deployments.keys())) or "none"
            raise UnknownDeployment(f"unknown deployment {name!r} (known: {known})") from None

    def replica(self, rid: str) -> Replica | None:
        name = self.index.get(rid)
        return None if name is None else self.deployments[name].replicas[rid]

    def replicas(self) -> Iterator[Replica]:
        for dep in self.deployments.values():
            yield from dep.replicas.values()

    def ranks(self, deployment: str) -> dict[str, ReplicaRank | None]:
        """replica id -> rank (None while not placed) for one deployment."""
        return {str(rid): rank for rid, rank in self.deployment(deployment).ranks.items()}


def desired_specs(state: State) -> tuple[DeploymentApplied, ...]:
    """What an embedder persists to recover a controller: every deployment as
    it is meant to be now (scales folded in), sorted by name. Pass it as
    ``ControllerRecovered.deployments``."""
    return tuple(state.deployments[name].spec() for name in sorted(state.deployments.keys()))


def desired_deleted(state: State) -> tuple[str, ...]:
    """The deployments deleted (``DeploymentDeleted``), those still stopping their
    replicas and those gone, sorted: persist it with ``desired_specs`` (which still
    names the first kind, at 0 replicas) and pass it as ``ControllerRecovered.deleted``."""
    deleting = [name for name, dep in state.deployments.items() if dep.deleting]
    return tuple(sorted({*deleting, *state.deleted.keys()}))


def desired_weights(state: State) -> tuple[tuple[str, int], ...]:
    """(deployment, the weights version last pushed) for each deployment that has one: persist
    it with ``desired_specs`` and pass it as ``ControllerRecovered.weights_versions`` (a push
    no replica holds yet is not lost with the controller)."""
    return tuple((name, state.deployments[name].weights_version) for name in sorted(state.deployments.keys())
                 if state.deployments[name].weights_version)


def desired_asleep(state: State) -> tuple[str, ...]:
    """The deployments meant to be asleep (``SleepRequested``), sorted: persist it with
    ``desired_specs`` and pass it as ``ControllerRecovered.asleep``."""
    return tuple(name for name in sorted(state.deployments.keys()) if state.deployments[name].asleep)


def desired_no_evict(state: State) -> tuple[str, ...]:
    """The evicted replicas' replacements still waiting for room, which never evict
    (rankcore.tiers.devices), sorted: persist it with ``desired_specs`` and pass it as
    ``ControllerRecovered.no_evict``, or a restarted controller lets them evict."""
    return tuple(sorted(state.cluster.no_evict.keys()))


@attrs.frozen(kw_only=True)
class RecoveryOutcome:
    """What a ``ControllerRecovered`` step did to the fleet, so that a
    destructive outcome (replicas stopped) cannot pass unnoticed.

    ``stopped``: reported replicas of named deployments stopped (more were
    reported than the target, their claims conflicted, a gang cut short, a
    static replica reported failed); ``unknown_stopped``: replicas of
    deployments the event did not name, reported or unresponsive (only with
    ``stop_unknown=True``); ``unresponsive_stopped``: unresponsive replicas
    of named deployments (always stopped: their rank is unknown);
    ``started``: replicas started for ranks nobody reported (none while an
    unresponsive replica of the deployment is still to stop); ``reconfigured``:
    replicas told a new rank or user_config. The three ``*stopped`` are disjoint.
    """

    started: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    unknown_stopped: tuple[str, ...] = ()
    reconfigured: tuple[str, ...] = ()
    unresponsive_stopped: tuple[str, ...] = ()

    @property
    def destructive(self) -> bool:
        """True when the recovery stopped any live process (an unresponsive one
        too: it may still have been serving)."""
        return bool(self.stopped or self.unknown_stopped or self.unresponsive_stopped)


@attrs.frozen(kw_only=True)
class Compaction:
    """One compaction inside a step: the lower bound it had to meet and what it changed."""

    deployment: str
    lower_bound: LowerBound
    changes: Reassignments


@attrs.frozen(kw_only=True)
class Step:
    """The result of one ``step``: the new state and what to do, in order.

    ``stale`` is true when the event was about an older incarnation (or an
    already finished replica, or an unknown node) and so changed nothing.
    ``recovery`` says what a ``ControllerRecovered`` did (None otherwise).
    ``pool``: the commands for the request path (``PoolChanged``,
    ``PoolComing``, ``PoolReset``; ``rankcore.control.pool``), kept apart from the
    replicas' commands: whoever routes requests reads these, whoever runs
    replicas reads ``commands``; neither is answered.
    """

    state: State
    commands: tuple = ()
    stale: bool = False
    compactions: tuple[Compaction, ...] = ()
    recovery: RecoveryOutcome | None = None
    pool: tuple = ()

"""State records: frozen attrs over persistent maps, so one event costs O(log N).

A ``State`` holds any number of deployments, each with its own rank space
(its own :class:`~rankcore.ranks.RankTable`). Nothing here is ever mutated;
``step`` returns a new ``State`` and the old one stays valid.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import immutables

from . import fields as f
from .cluster import Cluster
from .errors import UnknownDeployment
from .events import DEFAULT_MAX_REPLICAS, DeploymentApplied
from .lifecycle import LIVE, Phase
from .ranks import LowerBound, RankTable, Reassignments, ReplicaRank
from .static import StaticPlacement

__all__ = ["Replica", "Deployment", "State", "Step", "Compaction", "RecoveryOutcome", "replica_id", "desired_specs"]

_PHASE_INDEX = {p: i for i, p in enumerate(LIVE)}
# where counts keeps running and stopping replicas (an enum member read off its
# class is ~10x slower than a global: these are read at every step)
_RUNNING_AT, _STOPPING_AT = _PHASE_INDEX[Phase.RUNNING], _PHASE_INDEX[Phase.STOPPING]


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


@attrs.frozen(kw_only=True, weakref_slot=False)
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


def _empty_counts() -> tuple[int, ...]:
    return (0,) * len(LIVE)


@attrs.frozen(kw_only=True, weakref_slot=False)
class Deployment:
    """A deployment's config, replicas and rank table."""

    name: str = attrs.field(validator=f.name)
    target: int = attrs.field(validator=f.count)
    user_config: Any = attrs.field(default=None, hash=False)
    has_reconfigure: bool = False
    reconfigure_takes_rank: bool = False
    max_replicas: int = DEFAULT_MAX_REPLICAS
    #: what one replica reserves, the placement policy, the start timeout (see DeploymentApplied)
    resources: tuple[tuple[str, float], ...] = ()
    placement: str = "spread"
    start_timeout_s: float | None = None
    #: static placement, gangs (see DeploymentApplied)
    static: StaticPlacement | None = None
    gang_size: int = 1
    gang_placement: str = "pack"
    gang_failure: str = "restart_gang"
    config_version: int = 0
    replicas: immutables.Map = attrs.field(factory=immutables.Map)
    ranks: RankTable = attrs.field(factory=RankTable)
    #: replicas per live phase, in ``lifecycle.LIVE`` order
    counts: tuple[int, ...] = attrs.field(factory=_empty_counts)

    @classmethod
    def applied(cls, spec: Any, **more: Any) -> Deployment:
        """A deployment as a ``DeploymentApplied`` declares it (``more``: the rest)."""
        return cls(name=spec.name, target=spec.num_replicas, user_config=spec.user_config,
                   has_reconfigure=spec.has_reconfigure, reconfigure_takes_rank=spec.reconfigure_takes_rank,
                   max_replicas=spec.max_replicas, resources=spec.resources, placement=spec.placement,
                   start_timeout_s=spec.start_timeout_s, static=spec.static_placement, gang_size=spec.gang_size,
                   gang_placement=spec.gang_placement, gang_failure=spec.gang_failure, **more)

    def spec(self) -> DeploymentApplied:
        """The ``DeploymentApplied`` that declares this deployment as it is now
        (its current target, not the count it was first applied with)."""
        return DeploymentApplied(name=self.name, num_replicas=self.target, user_config=self.user_config,
                                 has_reconfigure=self.has_reconfigure,
                                 reconfigure_takes_rank=self.reconfigure_takes_rank, max_replicas=self.max_replicas,
                                 resources=self.resources, placement=self.placement,
                                 start_timeout_s=self.start_timeout_s, static_placement=self.static,
                                 gang_size=self.gang_size, gang_placement=self.gang_placement,
                                 gang_failure=self.gang_failure)

    def count(self, phase: Phase) -> int:
        return self.counts[_PHASE_INDEX[phase]]

    @property
    def world_size(self) -> int:
        """Always the target (updated the moment the target changes)."""
        return self.target

    @property
    def active(self) -> int:
        """Replicas not being stopped: what counts towards the target."""
        return len(self.replicas) - self.counts[_STOPPING_AT]

    @property
    def healthy(self) -> bool:
        """Target replicas running, none pending, starting, reconfiguring or stopping."""
        return self.counts[_RUNNING_AT] == self.target == len(self.replicas)

    def rank_of(self, rid: str) -> ReplicaRank | None:
        return self.ranks.rank_of(rid)

    def packing_gap(self) -> int:
        """How far from rank-packed the placed replicas are (``placement.packing_gap``):
        0 when every node holds one block of consecutive global ranks. O(N)."""
        from .placement import packing_gap

        ranks = self.ranks
        return packing_gap([ranks.node_of(rid) for rid in ranks])  # (iteration is in global-rank order)


@attrs.frozen(kw_only=True, weakref_slot=False)
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
    #: nodes, reservations, the waiting queue, the clock (rankcore.cluster)
    cluster: Cluster = attrs.field(factory=Cluster)

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


@attrs.frozen(kw_only=True, weakref_slot=False)
class RecoveryOutcome:
    """What a ``ControllerRecovered`` step did to the fleet, so that a
    destructive outcome (replicas stopped) cannot pass unnoticed.

    ``stopped``: live replicas stopped because more were reported than the
    target (or their claims conflicted); ``unknown_stopped``: replicas of
    deployments the event did not name (only with ``stop_unknown=True``);
    ``started``: replicas started for ranks nobody reported; ``reconfigured``:
    replicas told a new rank or user_config.
    """

    started: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    unknown_stopped: tuple[str, ...] = ()
    reconfigured: tuple[str, ...] = ()

    @property
    def destructive(self) -> bool:
        """True when the recovery stopped any live replica."""
        return bool(self.stopped or self.unknown_stopped)


@attrs.frozen(kw_only=True, weakref_slot=False)
class Compaction:
    """One compaction inside a step: the lower bound it had to meet and what it changed."""

    deployment: str
    lower_bound: LowerBound
    changes: Reassignments


@attrs.frozen(kw_only=True, weakref_slot=False)
class Step:
    """The result of one ``step``: the new state and what to do, in order.

    ``stale`` is true when the event was about an older incarnation (or an
    already finished replica, or an unknown node) and so changed nothing.
    ``recovery`` says what a ``ControllerRecovered`` did (None otherwise).
    """

    state: State
    commands: tuple = ()
    stale: bool = False
    compactions: tuple[Compaction, ...] = ()
    recovery: RecoveryOutcome | None = None

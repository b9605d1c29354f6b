"""Model tiers on GPU memory: HOT / WARM / COLD, placement by preference,
eviction under pressure and the CPU cache, as pure functions over a node's
devices (issue 21; NDIF's rules, ``shared/seeds/ndif-deployment-replica-support.md``).

A node has GPU *devices*, each with its memory in bytes, and a CPU budget for
WARM copies. A replica that is HOT holds ``model_bytes / gpus`` bytes on each
of ``gpus`` devices of its node (a device may hold several replicas while its
memory allows); a WARM copy is a cache entry in the node's CPU memory (an
evicted replica's weights, kept to reload), or the weights of a replica put
to sleep (its process, rank and bundle kept); COLD is disk.

Everything here is a choice, made the same way every time (no random
tie-break, no hash order): the node and devices a replica becomes HOT on,
the replicas evicted for it, the cache entries dropped for a new one. The
step (``rankcore.core``) and both executors take these choices; nothing here
reads a clock or a cluster of its own: the caller passes ``now`` and the
nodes as :class:`NodeTiers` views.

Placement by preference, best first (:data:`PREFERENCE`):

1. ``hot_here``: the replica is already HOT on the node (nothing to move);
2. ``warm_free``: the node holds a WARM copy of the model and has room;
3. ``free``: the node has room (a load from disk);
4. ``warm_full``: the node holds a WARM copy but needs evictions;
5. ``full``: room only after evictions;
6. no node: :class:`Refusal`, which says why, never a silent drop.

Within a class: the fewest replicas evicted, then the fewest bytes evicted,
then the node's order. Devices on a node: those with the least free memory
that still fit (best fit, so the large holes stay whole), then the lowest
index.

Eviction (:func:`victims`): only replicas of other deployments that are not
``dedicated`` (nor already leaving), and only for a ``Want`` that ``may_evict``; a replica HOT for less than ``min_deployment_time_s`` is spared
unless the incoming deployment is dedicated; victims using the fewest GPUs
go first (then the youngest HOT, then the replica id), as NDIF does, until the
incoming replica fits. An evicted replica drains (finishes the request it
holds), then its weights go WARM when the node's CPU budget allows, after
dropping cache entries smallest first, none more than needed
(:func:`make_room`), else COLD.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import attrs

from ..base import fields as f
from ..base.errors import InvalidConfig, InvariantViolation

__all__ = [
    "Tier", "Device", "Resident", "CacheEntry", "NodeTiers", "Want", "Choice", "PREFERENCE",
    "TierPlacement", "Refusal", "choose", "fit_devices", "victims", "evictable", "make_room", "CacheOutcome",
    "apply",
    "DEFAULT_MIN_DEPLOYMENT_TIME_S",
]

#: NDIF's minimum deployment time: a replica HOT for less is not evicted for
#: another model (unless that model is dedicated)
DEFAULT_MIN_DEPLOYMENT_TIME_S = 3600.0


class Tier(str, enum.Enum):
    """Where a model's weights are."""

    HOT = "hot"  # on GPU, serving
    WARM = "warm"  # in CPU memory, ready to reload
    COLD = "cold"  # on disk

    __str__ = enum.Enum.__str__


def _ints(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _devices(value: Iterable[Device]) -> tuple[Device, ...]:
    return tuple(value)


def _residents(value: Iterable[Resident]) -> tuple[Resident, ...]:
    return tuple(value)


def _entries(value: Iterable[CacheEntry]) -> tuple[CacheEntry, ...]:
    return tuple(value)


def _nonneg_bytes(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if type(value) is not int or value < 0:
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be a number of bytes "
                            f"(an int >= 0), got {f.shown(value)}")


def _positive_int(inst: object, attribute: attrs.Attribute, value: object) -> None:
    if type(value) is not int or value < 1:
        raise InvalidConfig(f"{type(inst).__name__}.{attribute.name} must be an int >= 1, got {f.shown(value)}")


@attrs.frozen(kw_only=True)
class Device:
    """One GPU of a node: its index there and its memory."""

    index: int = attrs.field(validator=f.count)
    memory: int = attrs.field(validator=_nonneg_bytes)


@attrs.frozen(kw_only=True)
class Resident:
    """A HOT replica: what it holds on which devices of its node."""

    replica_id: str = attrs.field(validator=f.name)
    deployment: str = attrs.field(validator=f.name)
    devices: tuple[int, ...] = attrs.field(converter=_ints)
    #: bytes it holds on each of its devices
    bytes_per_device: int = attrs.field(validator=_nonneg_bytes)
    dedicated: bool = attrs.field(default=False, validator=f.flag)
    #: when it became HOT (the core's clock)
    hot_since: float = 0.0
    #: being evicted already (draining): its memory is not free yet, and it is no victim twice
    leaving: bool = attrs.field(default=False, validator=f.flag)
    #: its own deployment's minimum deployment time (None: the newcomer's ``Want`` says)
    min_deployment_time_s: float | None = None
    #: not HOT yet: the room a replica claimed while the replicas evicted for it drain
    #: (it holds the bytes; it is never a victim)
    claim: bool = attrs.field(default=False, validator=f.flag)

    def __attrs_post_init__(self) -> None:
        if not self.devices or len(set(self.devices)) != len(self.devices):
            raise InvalidConfig(f"Resident {self.replica_id!r}: devices must be distinct and at least one, "
                                f"got {self.devices!r}")

    @property
    def nbytes(self) -> int:
        return self.bytes_per_device * len(self.devices)


@attrs.frozen(kw_only=True)
class CacheEntry:
    """A WARM copy in a node's CPU memory. ``pinned``: the weights of a
    sleeping replica (its process holds them): never dropped to make room."""

    deployment: str = attrs.field(validator=f.name)
    nbytes: int = attrs.field(validator=_nonneg_bytes)
    #: the replica whose weights these are (a sleeper's id; an evicted replica's)
    replica_id: str | None = None
    pinned: bool = attrs.field(default=False, validator=f.flag)


@attrs.frozen(kw_only=True)
class NodeTiers:
    """A node as the tier rules see it."""

    node_id: str = attrs.field(validator=f.name)
    devices: tuple[Device, ...] = attrs.field(converter=_devices)
    residents: tuple[Resident, ...] = attrs.field(default=(), converter=_residents)
    #: CPU memory for WARM copies, in bytes
    cache_budget: int = attrs.field(default=0, validator=_nonneg_bytes)
    cache: tuple[CacheEntry, ...] = attrs.field(default=(), converter=_entries)
    #: tie-break order (smaller first)
    order: object = ()

    def __attrs_post_init__(self) -> None:
        idx = [d.index for d in self.devices]
        if len(set(idx)) != len(idx):
            raise InvalidConfig(f"node {self.node_id!r}: device indices repeat: {idx}")
        for r in self.residents:
            missing = sorted(set(r.devices) - set(idx))
            if missing:
                raise InvalidConfig(f"node {self.node_id!r}: replica {r.replica_id!r} is HOT on device(s) "
                                    f"{missing}, which the node does not have (devices {idx})")

    def used(self) -> dict[int, int]:
        """device index -> bytes the residents hold on it."""
        out = {d.index: 0 for d in self.devices}
        for r in self.residents:
            for i in r.devices:
                out[i] = out.get(i, 0) + r.bytes_per_device
        return out

    def free(self) -> dict[int, int]:
        """device index -> free bytes (negative: over-committed)."""
        used = self.used()
        return {d.index: d.memory - used[d.index] for d in self.devices}

    def cached(self) -> int:
        return sum(e.nbytes for e in self.cache)


@attrs.frozen(kw_only=True)
class Want:
    """A replica that must become HOT: its model's size, the GPUs it spans and
    the deployment's eviction options."""

    deployment: str = attrs.field(validator=f.name)
    model_bytes: int = attrs.field(validator=_nonneg_bytes)
    gpus: int = attrs.field(default=1, validator=_positive_int)
    dedicated: bool = attrs.field(default=False, validator=f.flag)
    #: the replica, when it exists already (a wake, a reload): ``hot_here`` applies
    replica_id: str | None = None
    #: the core's clock, and how long a replica must have been HOT to be evictable
    now: float = 0.0
    min_deployment_time_s: float = DEFAULT_MIN_DEPLOYMENT_TIME_S
    #: only these nodes (a sleeping replica wakes where its process is); None: any
    nodes: frozenset[str] | None = None
    #: False: only where it fits without evicting anyone (the replacement of an evicted
    #: replica waits for room rather than evicting in turn)
    may_evict: bool = attrs.field(default=True, validator=f.flag)

    @property
    def per_device(self) -> int:
        """Bytes on each device: the model split evenly, rounded up."""
        return -(-self.model_bytes // self.gpus)


class Choice(str, enum.Enum):
    """Why a node was chosen (the preference classes, best first)."""

    HOT_HERE = "hot_here"
    WARM_FREE = "warm_free"
    FREE = "free"
    WARM_FULL = "warm_full"
    FULL = "full"

    __str__ = enum.Enum.__str__


#: the preference order, best first
PREFERENCE: tuple[Choice, ...] = tuple(Choice)
_RANK = {c: i for i, c in enumerate(PREFERENCE)}


@attrs.frozen(kw_only=True)
class TierPlacement:
    """Where a replica becomes HOT: the node, its devices, the replicas to evict
    first (in order) and where its weights come from."""

    node_id: str
    choice: Choice
    devices: tuple[int, ...]
    evict: tuple[str, ...] = ()
    evicted_bytes: int = 0
    #: HOT (already there), WARM (the node's cache) or COLD (disk)
    source: Tier = Tier.COLD


@attrs.frozen(kw_only=True)
class Refusal:
    """No node can take the replica, even after every allowed eviction: why."""

    deployment: str
    reason: str

    def __bool__(self) -> bool:  # (``if choose(...)`` reads as "placed")
        return False


def fit_devices(free: dict[int, int], per_device: int, gpus: int) -> tuple[int, ...] | None:
    """``gpus`` devices with ``per_device`` bytes free each: the tightest fits
    first (best fit), then the lowest index; None when fewer fit."""
    fits = sorted((room, i) for i, room in free.items() if room >= per_device)
    if len(fits) < gpus:
        return None
    return tuple(sorted(i for _, i in fits[:gpus]))


def evictable(resident: Resident, want: Want) -> bool:
    """May ``resident`` be evicted to make room for ``want``? Never one of the
    same deployment, never a dedicated one; one HOT for less than the minimum
    deployment time only for a dedicated newcomer."""
    if (resident.deployment == want.deployment or resident.dedicated or resident.leaving or resident.claim
            or not want.may_evict):
        return False
    least = want.min_deployment_time_s if resident.min_deployment_time_s is None else resident.min_deployment_time_s
    return want.dedicated or want.now - resident.hot_since >= least


def _victim_order(r: Resident) -> tuple:
    # fewest GPUs first (NDIF), then the youngest HOT (the least settled), then the id
    return (len(r.devices), -r.hot_since, r.replica_id)


def victims(node: NodeTiers, want: Want) -> tuple[Resident, ...] | None:
    """The replicas to evict from ``node`` so that ``want`` fits, in eviction
    order (fewest GPUs first), stopping as soon as it fits; () when it fits
    already, None when even every evictable replica is not enough."""
    free = node.free()
    if fit_devices(free, want.per_device, want.gpus) is not None:
        return ()
    chosen = []
    for r in sorted((r for r in node.residents if evictable(r, want)), key=_victim_order):
        chosen.append(r)
        for i in r.devices:
            free[i] += r.bytes_per_device
        if fit_devices(free, want.per_device, want.gpus) is not None:
            return _needed(node, want, chosen)
    return None


def _needed(node: NodeTiers, want: Want, chosen: list[Resident]) -> tuple[Resident, ...]:
    """Drop victims (latest first) whose eviction turned out not to be needed."""
    kept = list(chosen)
    for r in reversed(chosen[:-1]):
        trial = [x for x in kept if x is not r]
        free = node.free()
        for x in trial:
            for i in x.devices:
                free[i] += x.bytes_per_device
        if fit_devices(free, want.per_device, want.gpus) is not None:
            kept = trial
    return tuple(kept)


def _classify(node: NodeTiers, want: Want) -> tuple[tuple, TierPlacement] | None:
    if want.nodes is not None and node.node_id not in want.nodes:
        return None
    if want.replica_id is not None:
        for r in node.residents:
            if r.replica_id == want.replica_id:
                p = TierPlacement(node_id=node.node_id, choice=Choice.HOT_HERE, devices=r.devices, source=Tier.HOT)
                return (_RANK[Choice.HOT_HERE], 0, 0, node.order, node.node_id), p
    # a WARM copy of the model here: an evicted replica's, or this replica's own while it sleeps
    warm = any(e.deployment == want.deployment and (not e.pinned or e.replica_id == want.replica_id)
               for e in node.cache)
    out = victims(node, want)
    if out is None:
        return None
    free = node.free()
    for r in out:
        for i in r.devices:
            free[i] += r.bytes_per_device
    devices = fit_devices(free, want.per_device, want.gpus)
    if devices is None:  # pragma: no cover - victims() returns only once it fits
        raise InvariantViolation(f"tiers: {want.deployment} does not fit {node.node_id} after its victims")
    if out:
        choice = Choice.WARM_FULL if warm else Choice.FULL
    else:
        choice = Choice.WARM_FREE if warm else Choice.FREE
    evicted = sum(r.nbytes for r in out)
    p = TierPlacement(node_id=node.node_id, choice=choice, devices=devices,
                      evict=tuple(r.replica_id for r in out), evicted_bytes=evicted,
                      source=Tier.WARM if warm else Tier.COLD)
    return (_RANK[choice], len(out), evicted, node.order, node.node_id), p


def choose(nodes: Iterable[NodeTiers], want: Want) -> TierPlacement | Refusal:
    """Where ``want`` becomes HOT, by the preference order (module docstring),
    or a :class:`Refusal` naming why no node can take it."""
    nodes = list(nodes)
    best: tuple[tuple, TierPlacement] | None = None
    for node in nodes:
        c = _classify(node, want)
        if c is not None and (best is None or c[0] < best[0]):
            best = c
    if best is not None:
        return best[1]
    return Refusal(deployment=want.deployment, reason=_why_not(nodes, want))


def _why_not(nodes: Sequence[NodeTiers], want: Want) -> str:
    need = f"{want.gpus} device(s) with {want.per_device:,} bytes each"
    if want.nodes is not None:
        nodes = [n for n in nodes if n.node_id in want.nodes]
        where = f"on node(s) {', '.join(sorted(want.nodes))}"
    else:
        where = "on any node"
    if not nodes:
        return f"{want.deployment}: needs {need}; no node {where}"
    biggest = max((d.memory for n in nodes for d in n.devices), default=0)
    if biggest < want.per_device:
        return (f"{want.deployment}: needs {need}; the largest device has {biggest:,} bytes "
                f"(the model can never be HOT {where})")
    if max(len(n.devices) for n in nodes) < want.gpus:
        return f"{want.deployment}: needs {need}; no node has {want.gpus} devices"
    return (f"{want.deployment}: needs {need}; none is free {where}, even after evicting every "
            f"replica that may be evicted (not dedicated, HOT for {want.min_deployment_time_s:g} s or more)")


@attrs.frozen(kw_only=True)
class CacheOutcome:
    """What :func:`make_room` decided: the cache after it, the entries dropped
    (their weights go COLD), and whether the newcomer went WARM."""

    cache: tuple[CacheEntry, ...]
    dropped: tuple[CacheEntry, ...]
    warm: bool


def make_room(node: NodeTiers, entry: CacheEntry) -> CacheOutcome:
    """``entry`` (an evicted replica's weights, or a sleeper's) goes WARM in the
    node's CPU budget when it can, dropping unpinned entries smallest first
    (then oldest: earlier in the cache) until it fits, and keeping back any of
    those that need not go after all; else it goes COLD and nothing is
    dropped. The cache never exceeds the budget; a sleeper's weights stay."""
    budget, used = node.cache_budget, node.cached()
    if entry.nbytes > budget:
        return CacheOutcome(cache=node.cache, dropped=(), warm=False)
    if used + entry.nbytes <= budget:
        return CacheOutcome(cache=(*node.cache, entry), dropped=(), warm=True)
    order = sorted((e.nbytes, i) for i, e in enumerate(node.cache) if not e.pinned)
    dropped: list[tuple[int, int]] = []
    for nbytes, i in order:
        dropped.append((nbytes, i))
        used -= nbytes
        if used + entry.nbytes <= budget:
            # the last one made room: those before it that need not go after all stay (largest first)
            for back in reversed(dropped[:-1]):
                if used + back[0] + entry.nbytes <= budget:
                    dropped.remove(back)
                    used += back[0]
            gone = {i for _, i in dropped}
            return CacheOutcome(cache=(*(e for i, e in enumerate(node.cache) if i not in gone), entry),
                                dropped=tuple(node.cache[i] for i in sorted(gone)), warm=True)
    return CacheOutcome(cache=node.cache, dropped=(), warm=False)


def apply(nodes: Sequence[NodeTiers], placement: TierPlacement, want: Want, replica_id: str) -> tuple[NodeTiers, ...]:
    """The nodes once ``placement`` is carried out: its victims gone from their
    devices (their weights into the node's cache by :func:`make_room`, or
    COLD), ``replica_id`` HOT on the chosen devices since ``want.now`` (a WARM
    copy it came from leaves the cache). What an executor's answers will
    confirm; the simulator's model of a node follows it."""
    out = []
    for node in nodes:
        if node.node_id != placement.node_id or placement.choice is Choice.HOT_HERE:
            out.append(node)
            continue
        cache = node.cache
        if placement.source is Tier.WARM:  # the copy it loads from (its own, asleep; else the smallest)
            mine = [i for i, e in enumerate(cache) if e.deployment == want.deployment and e.replica_id == replica_id]
            other = sorted((e.nbytes, i) for i, e in enumerate(cache) if e.deployment == want.deployment
                           and not e.pinned)
            at = mine[0] if mine else other[0][1] if other else None
            if at is not None:  # (leaves first: the victims' copies then find its room)
                cache = cache[:at] + cache[at + 1:]
        gone = set(placement.evict)
        leaving = [r for r in node.residents if r.replica_id in gone]
        node = attrs.evolve(node, residents=[r for r in node.residents if r.replica_id not in gone], cache=cache)
        for r in leaving:
            node = attrs.evolve(node, cache=make_room(node, CacheEntry(deployment=r.deployment, nbytes=r.nbytes,
                                                                       replica_id=r.replica_id)).cache)
        hot = Resident(replica_id=replica_id, deployment=want.deployment, devices=placement.devices,
                       bytes_per_device=want.per_device, dedicated=want.dedicated, hot_since=want.now)
        out.append(attrs.evolve(node, residents=(*node.residents, hot)))
    return tuple(out)

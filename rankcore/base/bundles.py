"""Static placement on a caller's placement group (Ray RFC #59857), as plain data.

The caller made a placement group (RL post-training colocates trainers and
inference engines on the same GPUs this way) and says which bundles each
rank gets: ``replica_bundle_mapping = {0: [0, 1], 1: [2, 3]}``. Rank N runs
on the first bundle of ``mapping[N]``; its context tells it all of them, so it
can put its own workers there. The replica count is the mapping's length.
The group is the caller's: the core never creates, resizes or removes it, and
books nothing for it on the cluster model (the group already holds its
resources). It only needs to know which node each bundle is on, so it can give
node ranks and tell which replicas a lost node takes down.

``consecutive_mapping`` gives a deterministic mapping whatever order the
bundles landed in (Ray does not promise one across nodes, ray#51117).

The rules that act on it are in ``rankcore.placement.static``, which re-exports these names
(``rankcore.placement.static.StaticPlacement``).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from .errors import InvalidConfig
from .fields import shown, shown_id

__all__ = ["StaticPlacement", "consecutive_mapping"]


def _to_mapping(value: Any) -> Any:
    """``{rank: [bundle, ...]}`` (keys any order) or a list by rank, as a tuple of tuples by rank.
    What cannot be read that way is left for the validator to name."""
    if isinstance(value, Mapping):
        keys = list(value.keys())
        if not all(type(k) is int for k in keys):
            return value
        if sorted(keys) != list(range(len(keys))):
            return value
        value = [value[k] for k in range(len(keys))]
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            if isinstance(v, (list, tuple)):
                out.append(tuple(v))
            else:
                return value
        return tuple(out)
    return value


def _to_nodes(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


@attrs.frozen(kw_only=True)
class StaticPlacement:
    """The caller's placement group and which bundles each rank gets.

    ``group``: the group's id or name (opaque to the core; an executor maps it
    to its handle). ``bundle_nodes[i]``: the node bundle ``i`` is on (its
    length is the group's bundle count; ``None`` while a bundle is not placed,
    e.g. after its node was lost). ``mapping[N]``: rank N's bundle indices
    (a ``{rank: [indices]}`` dict is accepted). ``capture_child_tasks``: the
    replica's own tasks and actors land in the group too (Ray's option).
    """

    group: str
    bundle_nodes: tuple[str | None, ...] = attrs.field(converter=_to_nodes)
    mapping: tuple[tuple[int, ...], ...] = attrs.field(converter=_to_mapping)
    capture_child_tasks: bool = True

    def __attrs_post_init__(self) -> None:
        where = "StaticPlacement"
        if type(self.group) is not str or not self.group:
            raise InvalidConfig(f"{where}.group must be a non-empty str (the placement group's id), "
                                f"got {shown_id(self.group)}")
        if type(self.capture_child_tasks) is not bool:
            raise InvalidConfig(f"{where}.capture_child_tasks must be a bool, got {shown(self.capture_child_tasks)}")
        nodes = self.bundle_nodes
        if not isinstance(nodes, tuple) or not nodes:
            raise InvalidConfig(f"{where}.bundle_nodes must list the node of every bundle of group "
                                f"{self.group!r} (one entry per bundle), got {shown(nodes)}")
        for i, n in enumerate(nodes):
            if n is not None and (type(n) is not str or not n):
                raise InvalidConfig(f"{where}.bundle_nodes[{i}] must be a node id (or None while not placed), "
                                    f"got {shown_id(n)}")
        m = self.mapping
        if isinstance(m, Mapping):
            keys = list(m.keys())
            bad = [k for k in keys if type(k) is not int]
            if bad:
                raise InvalidConfig(f"{where}.replica_bundle_mapping: rank {bad[0]!r} is not an int")
            missing = sorted(set(range(len(keys))) - set(keys))
            raise InvalidConfig(f"{where}.replica_bundle_mapping: ranks must be contiguous from 0, got "
                                f"{sorted(keys)} (missing rank {missing[0] if missing else len(keys)})")
        if not isinstance(m, tuple):
            raise InvalidConfig(f"{where}.replica_bundle_mapping must map rank -> list of bundle indices, "
                                f"got {shown(m)}")
        if not m:
            raise InvalidConfig(f"{where}.replica_bundle_mapping is empty: a static deployment needs a replica")
        owner: dict[int, int] = {}
        for rank, bundles in enumerate(m):
            if not isinstance(bundles, tuple):
                raise InvalidConfig(f"{where}.replica_bundle_mapping[{rank}] must be a list of bundle indices, "
                                    f"got {shown(bundles)}")
            if not bundles:
                raise InvalidConfig(f"{where}.replica_bundle_mapping[{rank}] is empty: rank {rank} needs a bundle")
            for b in bundles:
                if type(b) is not int or b < 0:
                    raise InvalidConfig(f"{where}.replica_bundle_mapping[{rank}] holds {shown(b)}: bundle indices "
                                        f"are non-negative ints")
                if b >= len(nodes):
                    raise InvalidConfig(f"{where}.replica_bundle_mapping[{rank}] holds bundle {shown(b)}, but group "
                                        f"{self.group!r} has {len(nodes)} bundles (0..{len(nodes) - 1})")
                if b in owner and owner[b] == rank:
                    raise InvalidConfig(f"{where}.replica_bundle_mapping: rank {rank} lists bundle {b} twice")
                if b in owner:
                    raise InvalidConfig(f"{where}.replica_bundle_mapping: bundle {b} is given to rank "
                                        f"{owner[b]} and to rank {rank}")
                owner[b] = rank

    @classmethod
    def from_mapping(cls, group: str, bundle_nodes: Iterable[str | None],
                     replica_bundle_mapping: Mapping[int, Sequence[int]] | Sequence[Sequence[int]],
                     capture_child_tasks: bool = True) -> StaticPlacement:
        """The RFC's names: ``replica_bundle_mapping`` is ``{rank: [bundle indices]}``."""
        return cls(group=group, bundle_nodes=tuple(bundle_nodes), mapping=replica_bundle_mapping,
                   capture_child_tasks=capture_child_tasks)

    @property
    def replicas(self) -> int:
        """The replica count, fixed to the mapping's length."""
        return len(self.mapping)

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_nodes)

    def bundles_of(self, rank: int) -> tuple[int, ...]:
        return self.mapping[rank]

    def node_of(self, rank: int) -> str | None:
        """Where rank ``rank``'s replica runs: the node of its first bundle (None: not placed)."""
        return self.bundle_nodes[self.mapping[rank][0]]

    def placed(self, rank: int) -> bool:
        """Every bundle of ``rank`` is on a node (a replica there can serve)."""
        return all(self.bundle_nodes[b] is not None for b in self.mapping[rank])

    def ranks_on(self, node_id: str) -> list[int]:
        """Ranks with a bundle on ``node_id`` (a lost node fails them)."""
        return [r for r, bs in enumerate(self.mapping) if any(self.bundle_nodes[b] == node_id for b in bs)]

    def with_nodes(self, bundle_nodes: Iterable[str | None]) -> StaticPlacement:
        return attrs.evolve(self, bundle_nodes=tuple(bundle_nodes))

    def lose(self, node_id: str) -> StaticPlacement:
        """The bundles on ``node_id`` are no longer placed."""
        return self.with_nodes(None if n == node_id else n for n in self.bundle_nodes)

    def same_layout(self, other: StaticPlacement) -> bool:
        """The same group and mapping (where the bundles are may differ)."""
        return (self.group, self.mapping, self.capture_child_tasks) == (
            other.group, other.mapping, other.capture_child_tasks)


def consecutive_mapping(bundles: Sequence[tuple[str, Any]], per_replica: int) -> dict[int, list[int]]:
    """A ``replica_bundle_mapping`` giving consecutive ranks to bundles sorted by
    (node, GPU id), ``per_replica`` bundles (the TP size) to each rank.

    ``bundles[i]`` is ``(node_id, gpu_id)`` for bundle ``i``: where it landed
    (``executors.ray_gpu.bundle_locations`` reads it from Ray). Bundles of one
    node get consecutive ranks, so a TP group never straddles nodes when a
    node's bundle count is a multiple of ``per_replica``.
    """
    if type(per_replica) is not int or per_replica < 1:
        raise InvalidConfig(f"consecutive_mapping: per_replica must be an int >= 1, got {per_replica!r}")
    if len(bundles) % per_replica:
        raise InvalidConfig(f"consecutive_mapping: {len(bundles)} bundles do not split into replicas of "
                            f"{per_replica}")
    for i, b in enumerate(bundles):
        if not (isinstance(b, tuple) and len(b) == 2 and isinstance(b[0], str) and b[0]):
            raise InvalidConfig(f"consecutive_mapping: bundle {i} must be (node_id, gpu_id), got {b!r}")
    order = sorted(range(len(bundles)), key=lambda i: (bundles[i][0], _gpu_key(bundles[i][1]), i))
    return {r: order[r * per_replica:(r + 1) * per_replica] for r in range(len(bundles) // per_replica)}


def _gpu_key(gpu: Any) -> tuple:
    """GPU ids sort numerically when they are numbers ("10" after "9"); None (no GPU) first."""
    if gpu is None:
        return (0, 0, "")
    try:
        return (1, int(gpu), "")
    except (TypeError, ValueError):
        return (2, 0, str(gpu))

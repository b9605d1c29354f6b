"""Static placement on the caller's placement group (Ray RFC #59857), on Ray.

The caller makes a placement group (RL post-training puts trainers and
inference engines on the same GPUs this way) and says which bundles each rank
gets::

    pg = placement_group([{"GPU": 1, "CPU": 0.25}] * 4); ray.get(pg.ready())
    @deployment(static_placement=StaticPlacementConfig(pg, {0: [0, 1], 1: [2, 3]}))
    class Engine: ...

Rank N's replica actor runs on the first bundle of ``mapping[N]``;
``get_replica_context().bundle_indices`` is ``mapping[N]`` and
``.placement_group`` the group, so the replica can start its own workers on
its bundles. The group stays the caller's: rankcore never creates, resizes or
removes it. The core (``rankcore.StaticPlacement``) holds which node each
bundle is on; the controller reads it from ``ray.util.placement_group_table``.

``bundle_locations`` says where every bundle landed (node, GPU id) and
``sorted_bundle_mapping`` turns that into a mapping giving consecutive ranks
to bundles sorted by (node, GPU id) (``rankcore.consecutive_mapping``), since
Ray promises no bundle order across nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import rankcore as rc

__all__ = ["StaticPlacementConfig", "bundle_locations", "sorted_bundle_mapping", "bundle_nodes", "core_static"]

_EPS = 1e-9


def _is_pg(value: Any) -> bool:
    from ray.util.placement_group import PlacementGroup

    return isinstance(value, PlacementGroup)


@dataclasses.dataclass(frozen=True)
class StaticPlacementConfig:
    """The caller's placement group and ``replica_bundle_mapping`` (rank ->
    bundle indices; the replica runs on the first), as in the RFC.

    Checked here, with the core's rules (``rankcore.StaticPlacement``): ranks
    contiguous from 0, every list non-empty, indices ints in
    ``0..pg.bundle_count - 1``, no bundle given twice; a violation raises
    ``rankcore.InvalidConfig`` naming it. ``capture_child_tasks``: the
    replica's own tasks and actors land in the group too (Ray's option)."""

    placement_group: Any
    replica_bundle_mapping: Mapping[int, Sequence[int]]
    capture_child_tasks: bool = True

    def __post_init__(self) -> None:
        pg = self.placement_group
        if not _is_pg(pg):
            raise rc.InvalidConfig(f"StaticPlacementConfig.placement_group must be a ray PlacementGroup "
                                   f"(ray.util.placement_group(...)), got {pg!r:.80}")
        if pg.is_empty:
            raise rc.InvalidConfig("StaticPlacementConfig.placement_group is the empty placement group: "
                                   "make one with ray.util.placement_group(bundles)")
        mapping = self.replica_bundle_mapping
        if isinstance(mapping, Mapping):  # a copy, with lists as tuples: frozen like the rest
            mapping = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in mapping.items()}
            object.__setattr__(self, "replica_bundle_mapping", mapping)
        self.to_core(None)  # every rule of the mapping, as the core checks it

    @property
    def group(self) -> str:
        """The group's id (hex): what the core calls it."""
        return str(self.placement_group.id.hex())

    @property
    def num_replicas(self) -> int:
        return len(self.replica_bundle_mapping)

    def bundles_of(self, rank: int) -> tuple[int, ...]:
        return tuple(self.replica_bundle_mapping[rank])

    def to_core(self, nodes: Sequence[str | None] | None) -> rc.StaticPlacement:
        """The core's record, with ``nodes`` (bundle -> node id, None when not
        placed; None: not known yet, as at ``@deployment``)."""
        count = self.placement_group.bundle_count
        where = tuple(nodes) if nodes is not None else (None,) * count
        try:
            return rc.StaticPlacement.from_mapping(self.group, where, self.replica_bundle_mapping,
                                                   self.capture_child_tasks)
        except rc.InvalidConfig as exc:
            raise rc.InvalidConfig(str(exc).replace("StaticPlacement.", "StaticPlacementConfig.")) from None

    def check_actor_fits(self, need: Mapping[str, float]) -> None:
        """Raise ``rankcore.InvalidConfig`` if a replica actor asking for ``need``
        does not fit in the first bundle of some rank (it would wait forever)."""
        specs = self.placement_group.bundle_specs
        for rank in range(self.num_replicas):
            b = self.bundles_of(rank)[0]
            have = specs[b]
            for res, amount in sorted(need.items()):
                if amount > have.get(res, 0.0) + _EPS:
                    raise rc.InvalidConfig(
                        f"the replica of rank {rank} runs in bundle {b} of the placement group, which has "
                        f"{have.get(res, 0.0):g} {res}, but ray_actor_options asks for {amount:g} (a static "
                        f"replica's num_cpus defaults to 0)")


def core_static(config: StaticPlacementConfig) -> rc.StaticPlacement:
    """The core's record with where every bundle is now (``bundle_nodes``)."""
    return config.to_core(bundle_nodes(config.placement_group))


def bundle_nodes(pg: Any, alive: Any = None) -> tuple[str | None, ...]:
    """Where each bundle of ``pg`` is now, from ``ray.util.placement_group_table``
    (None: not placed, e.g. its node was lost and Ray is rescheduling it).
    ``alive``: if given, a node not in it counts as not placed (Ray may still
    list a dead node for a moment)."""
    import ray

    table = ray.util.placement_group_table(pg)
    count = pg.bundle_count
    if table.get("state") == "REMOVED":  # the caller removed its group: no bundle anywhere
        return (None,) * count
    where = table.get("bundles_to_node_id") or {}
    out = []
    for i in range(count):
        node = where.get(i) or None
        if node is not None and alive is not None and node not in alive:
            node = None
        out.append(node)
    return tuple(out)


def bundle_locations(pg: Any, timeout: float = 60.0) -> list[tuple[str, str | None]]:
    """Where every bundle of ``pg`` landed: ``[(node_id, gpu_id), ...]`` by
    bundle index (``gpu_id`` None for a bundle without GPUs).

    Runs one tiny task per bundle (``num_cpus=0``, ``num_gpus=0.0001`` where
    the bundle has GPUs) that reads ``get_accelerator_ids()``: call it before
    the bundles' GPUs are all taken (right after ``pg.ready()``), or it waits
    (``timeout``, then ``TimeoutError``)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.get(pg.ready(), timeout=timeout)

    @ray.remote(num_cpus=0)
    def where() -> tuple[str, str | None]:
        ctx = ray.get_runtime_context()
        gpus = ctx.get_accelerator_ids().get("GPU") or []
        return ctx.get_node_id(), (str(gpus[0]) if gpus else None)

    refs = []
    for i, spec in enumerate(pg.bundle_specs):
        gpu = 0.0001 if spec.get("GPU", 0) > 0 else 0
        refs.append(where.options(num_gpus=gpu, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i, placement_group_capture_child_tasks=False)).remote())
    try:
        return [tuple(x) for x in ray.get(refs, timeout=timeout)]  # type: ignore[misc]
    except ray.exceptions.GetTimeoutError:
        for r in refs:
            ray.cancel(r, force=True)
        raise TimeoutError(f"bundle_locations: the bundles of {pg.id.hex()} did not answer within {timeout:g}s "
                           f"(are their GPUs all taken?)") from None


def sorted_bundle_mapping(pg: Any, per_replica: int, timeout: float = 60.0) -> dict[int, list[int]]:
    """A ``replica_bundle_mapping`` for ``pg``: ``per_replica`` bundles per rank,
    consecutive ranks on bundles sorted by (node, GPU id)
    (``rankcore.consecutive_mapping`` of ``bundle_locations(pg)``)."""
    return rc.consecutive_mapping(bundle_locations(pg, timeout), per_replica)

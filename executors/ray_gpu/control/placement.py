"""Placement groups for replicas, and what the core is told about nodes and needs.

Each replica reserves its resources in its own detached placement group, named
``rankcore:<deployment>:<replica_id>``, and runs in bundle 0 (the other
bundles are for its child tasks and actors, e.g. tensor-parallel workers).
The core chooses every replica's node (``PlaceReplica``); the controller pins
the group there (the ``ray.io/node-id`` label selector). What the core needs to
choose is built here from Ray's own records: a node as a ``NodeJoined``
(``node_joined``), a replica's need on its node (``replica_need``).

Pure (no Ray calls), so it is unit-tested on its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import rankcore as rc
from rankcore import InvalidConfig
from rankcore.placement import POLICIES

__all__ = ["ORDER_LABEL", "PLACEMENTS", "PG_STRATEGIES", "pg_name", "actor_resources", "replica_bundles",
           "actor_options_in_group", "static_actor_options", "without_gpus", "with_env", "bundle_sum", "single_node", "replica_need", "order_label", "node_joined"]

#: A node label that fixes the order of nodes for tie-breaks (an int >= 0; lower
#: first). Nodes without it come after, in the order they joined the core.
ORDER_LABEL = "rankcore.io/node-order"
PLACEMENTS = POLICIES  # rankcore.placement's, one list for both executors
PG_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_EPS = 1e-9


def pg_name(deployment: str, replica_id: str) -> str:
    return f"rankcore:{deployment}:{replica_id}"


def actor_resources(actor_options: Mapping[str, Any]) -> dict[str, float]:
    """The resources named in ``ray_actor_options`` as Ray resource keys (only those given)."""
    out: dict[str, float] = {}
    for key, res in (("num_cpus", "CPU"), ("num_gpus", "GPU"), ("memory", "memory")):
        if actor_options.get(key) is not None:
            out[res] = float(actor_options[key])
    for res, amount in (actor_options.get("resources") or {}).items():
        out[str(res)] = float(amount)
    return out


def replica_bundles(actor_options: Mapping[str, Any], bundles: Sequence[Mapping[str, float]] | None) -> list[dict]:
    """The placement group bundles of one replica.

    Without explicit ``placement_group_bundles``: one bundle holding what the
    actor asks for (``num_cpus`` defaults to 1, as for a Ray actor's
    scheduling). Zero amounts are dropped; an empty list means nothing to
    reserve (Ray refuses empty bundles), so the replica gets no group.
    """
    if bundles is None:
        want = {"CPU": 1.0, **actor_resources(actor_options)}
        bundles = [want]
    out = [{k: float(v) for k, v in b.items() if float(v) > 0} for b in bundles]
    return [] if not any(out) else out


def actor_options_in_group(actor_options: Mapping[str, Any], bundles: Sequence[Mapping[str, float]]) -> dict:
    """The replica actor's options inside its group: what ``ray_actor_options``
    asks for (``num_cpus`` defaulting to 1, at most bundle 0's CPUs), or, when
    it names no resource, the whole of bundle 0."""
    opts = dict(actor_options)
    if actor_resources(opts):
        opts.setdefault("num_cpus", min(1.0, bundles[0].get("CPU", 0.0)))
        return opts
    b0 = dict(bundles[0])
    opts.update(num_cpus=b0.pop("CPU", 0.0), num_gpus=b0.pop("GPU", 0.0))
    if "memory" in b0:
        opts["memory"] = b0.pop("memory")
    if b0:
        opts["resources"] = b0
    return opts


def without_gpus(bundles: Sequence[Mapping[str, float]], actor_options: Mapping[str, Any]) -> tuple[list[dict], dict]:
    """A replica booked by memory (``PlaceReplica.devices``): the core holds its GPUs (bytes on
    devices), so its group and its actor reserve no Ray ``GPU`` (two models may share one GPU;
    a Ray GPU count would refuse the second). Bundles left empty are dropped."""
    left = [{k: v for k, v in b.items() if k != "GPU"} for b in bundles]
    opts = {k: v for k, v in actor_options.items() if k != "num_gpus"}
    return [b for b in left if b], opts


def with_env(runtime_env: Mapping[str, Any] | None, env_vars: Mapping[str, str]) -> dict:
    """``runtime_env`` with ``env_vars`` added to its own (the user's win where both name one)."""
    env = dict(runtime_env or {})
    env["env_vars"] = {**env_vars, **(env.get("env_vars") or {})}
    return env


def static_actor_options(actor_options: Mapping[str, Any]) -> dict:
    """A static replica's actor options in the caller's bundle: as given, with
    ``num_cpus`` defaulting to 0 (the group holds what its owner planned; a
    default actor would need a whole CPU there)."""
    opts = dict(actor_options)
    if opts.get("num_cpus") is None:
        opts["num_cpus"] = 0
    return opts


def bundle_sum(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            total[k] = total.get(k, 0.0) + v
    return total


class _TypeInvalid(InvalidConfig, TypeError):
    """A placement option of the wrong type (a ``TypeError`` too, as Ray Serve's: ``validate``'s caller
    names the deployment)."""


def validate(actor_options: Mapping[str, Any], bundles: Sequence[Mapping[str, float]] | None,
             strategy: str, placement: str) -> None:
    """Raise ``rankcore.InvalidConfig`` (a ``ValueError``) naming what is wrong with a
    deployment's placement options and the value."""
    if placement not in PLACEMENTS:
        raise InvalidConfig(f"replica_placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if strategy not in PG_STRATEGIES:
        raise InvalidConfig(f"placement_group_strategy must be one of {', '.join(PG_STRATEGIES)}, got {strategy!r}")
    if "scheduling_strategy" in actor_options or "placement_group" in actor_options:
        raise InvalidConfig("ray_actor_options may not set scheduling_strategy or placement_group: rankcore places "
                         "each replica on its own placement group (use replica_placement='spread'|'pack' "
                         "and placement_group_bundles)")
    for key in ("num_cpus", "num_gpus", "memory"):
        v = actor_options.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise _TypeInvalid(f"ray_actor_options[{key!r}] must be a number >= 0, got {v!r}")
        if v is not None and (v < 0 or not math.isfinite(v)):
            raise InvalidConfig(f"ray_actor_options[{key!r}] must be a number >= 0, got {v!r}")
        if v is not None and 0 < v < 1e-4:
            raise InvalidConfig(f"ray_actor_options[{key!r}] is {v!r}: Ray counts resources in units of 0.0001")
    if bundles is None:
        return
    if not isinstance(bundles, (list, tuple)) or not bundles:
        raise InvalidConfig(f"placement_group_bundles must be a non-empty list of dicts, got {bundles!r}")
    for i, b in enumerate(bundles):
        if not isinstance(b, Mapping) or not b:
            raise InvalidConfig(f"placement_group_bundles[{i}] must be a non-empty dict of resources, got {b!r}")
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0 for v in b.values()):
            raise InvalidConfig(f"placement_group_bundles[{i}] is {b!r}: a bundle of only zero resources reserves "
                                f"nothing (Ray refuses such a placement group)")
        for k, v in b.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or not math.isfinite(v):
                raise InvalidConfig(f"placement_group_bundles[{i}][{k!r}] must be a number >= 0, got {v!r}")
            if 0 < v < 1e-4:
                raise InvalidConfig(f"placement_group_bundles[{i}][{k!r}] is {v!r}: Ray counts resources in "
                                 f"units of 0.0001")
    first = {k: float(v) for k, v in bundles[0].items()}
    for res, amount in actor_resources(actor_options).items():
        if amount > first.get(res, 0.0) + _EPS:
            raise InvalidConfig(f"the replica actor runs in placement_group_bundles[0], which has {first.get(res, 0.0):g} "
                             f"{res}, but ray_actor_options asks for {amount:g}")


def single_node(bundles: Sequence[Mapping[str, float]], strategy: str) -> bool:
    """Whether a replica's whole group lands on one node (one bundle, or ``STRICT_PACK``)."""
    return len(bundles) == 1 or strategy == "STRICT_PACK"


def replica_need(actor_options: Mapping[str, Any], bundles: Sequence[Mapping[str, float]] | None,
                 strategy: str) -> dict[str, float]:
    """What one replica reserves on the node the core places it on
    (``DeploymentApplied.resources``): its whole group when the group is on one
    node, else bundle 0 only (where the replica actor runs; the other bundles
    go where Ray puts them and are not modelled by the core until bundle maps,
    issue 10). Nothing for a replica that reserves nothing (no group)."""
    placed = replica_bundles(actor_options, bundles)
    if not placed:
        return {}
    return bundle_sum(placed) if single_node(placed, strategy) else dict(placed[0])


def order_label(labels: Mapping[str, str]) -> int | None:
    """The node's ``ORDER_LABEL`` as an int (None if absent or not an int >= 0)."""
    raw = labels.get(ORDER_LABEL)
    try:
        order = int(raw) if raw is not None else None
    except ValueError:
        return None
    return order if order is not None and order >= 0 else None


def node_joined(info: Mapping[str, Any]) -> rc.NodeJoined:
    """A node from ``ray.nodes()`` as the core's ``NodeJoined``: its total
    resources, its labels, and its order label."""
    labels = {str(k): str(v) for k, v in (info.get("Labels") or {}).items()}
    return rc.NodeJoined(node_id=info["NodeID"], labels=labels, order=order_label(labels),
                         resources={str(k): float(v) for k, v in (info.get("Resources") or {}).items()})

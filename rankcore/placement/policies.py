"""Which node a replica goes to: the placement rules, written once, pure.

Both executors take their node choice from :func:`choose_node` (the
simulator for its simulated nodes, the Ray controller to pin a replica's
placement group), so a scenario places replicas the same way on both.
Settled here where the two used to differ: *spread* breaks a tie on free
units by the **deployment's own** replicas on each node (Ray Serve spreads
a deployment's replicas; other deployments' replicas already show as less
free room), then by node order.

Policies (per deployment):

* ``spread``: the node with the most free units of the main resource (GPU if
  the replica asks for any, else CPU), then the fewest of the deployment's
  replicas, then node order.
* ``pack``: the node with the fewest free units that still fit, then order.
* ``rank_packed``: consecutive global ranks on the same node (ranks 0..k-1 on
  one node, k..2k-1 on the next, with k replicas fitting a node), as data and
  expert-parallel users ask of Ray Serve (ray#57059): the node holding rank
  r - 1 when it has room, else the ``pack`` choice. Node ranks then follow
  global ranks, so a top-rank downscale compacts nothing at any level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from ..base.cluster import packing_gap
from ..base.errors import InvalidConfig
from ..base.options import POLICIES

__all__ = ["POLICIES", "NodeView", "choose_node", "choose_gang", "packing_gap"]

_EPS = 1e-9


@attrs.frozen(kw_only=True)
class NodeView:
    """A live node as placement sees it."""

    node_id: str
    #: tie-break order (smaller first); any comparable value, e.g. (label, first seen, id)
    order: object
    #: free units per resource after what is already reserved on it
    free: Mapping[str, float]
    #: this deployment's replicas on the node
    replicas: int = 0


def choose_node(
    nodes: Sequence[NodeView],
    need: Mapping[str, float],
    policy: str,
    *,
    rank: int | None = None,
    rank_nodes: Mapping[int, str] | None = None,
) -> str | None:
    """The node for a replica needing ``need``, or None when none has room.

    ``rank`` and ``rank_nodes`` (global rank -> node of the deployment's placed
    replicas) are what ``rank_packed`` follows; the other policies ignore them.
    """
    if policy not in POLICIES:
        raise InvalidConfig(f"placement policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    main = "GPU" if need.get("GPU", 0) > 0 else "CPU"
    if len(need) == 1:  # the common case, without a generator per node
        ((res, amount),) = need.items()
        fits = [n for n in nodes if n.free.get(res, 0.0) + _EPS >= amount]
    else:
        fits = [n for n in nodes if all(n.free.get(k, 0.0) + _EPS >= v for k, v in need.items())]
    if not fits:
        return None

    def pack_key(n: NodeView) -> tuple:
        return (n.free.get(main, 0.0), n.order)

    if policy == "spread":
        return min(fits, key=lambda n: (-n.free.get(main, 0.0), n.replicas, n.order)).node_id
    if policy == "rank_packed" and rank is not None and rank > 0 and rank_nodes:
        prev = rank_nodes.get(rank - 1)
        for n in fits:
            if n.node_id == prev:
                return n.node_id
    return min(fits, key=pack_key).node_id


def _room(free: Mapping[str, float], need: Mapping[str, float], cap: int) -> int:
    """How many replicas needing ``need`` fit in ``free`` (at most ``cap``)."""
    room = cap
    for k, v in need.items():
        have = free.get(k, 0.0) + _EPS
        if have < 0:
            return 0  # over-committed: nothing more fits, as in choose_node
        if v > 0:
            room = min(room, int(have // v))
    return max(room, 0)


def choose_gang(nodes: Sequence[NodeView], need: Mapping[str, float], size: int, strategy: str) -> list[str] | None:
    """Nodes for a gang of ``size`` members needing ``need`` each, in gang-rank
    order, or None when the whole gang does not fit (all or nothing).

    ``pack``: one node when one has room for all (the one with the least room
    that fits, as ``pack``), else the nodes with the most room first, filled in
    turn, so consecutive ranks share a node and the gang uses few nodes.
    ``spread``: each member on a different node while there are enough (most
    room first, then node order), then round again.
    """
    if strategy not in ("pack", "spread"):
        raise InvalidConfig(f"gang placement must be pack or spread, got {strategy!r}")
    room = {n.node_id: _room(n.free, need, size) for n in nodes}
    main = "GPU" if need.get("GPU", 0) > 0 else "CPU"
    if sum(room.values()) < size:
        return None
    most_first = sorted((n for n in nodes if room[n.node_id] > 0),
                        key=lambda n: (-room[n.node_id], -n.free.get(main, 0.0), n.order))
    if strategy == "pack":
        whole = [n for n in nodes if room[n.node_id] >= size]
        if whole:
            best = min(whole, key=lambda n: (room[n.node_id], n.free.get(main, 0.0), n.order))
            return [best.node_id] * size
        out: list[str] = []
        for n in most_first:
            out.extend([n.node_id] * min(room[n.node_id], size - len(out)))
            if len(out) == size:
                break
        return out
    out = []
    left = dict(room)
    while len(out) < size:
        for n in most_first:
            if left[n.node_id] > 0 and len(out) < size:
                out.append(n.node_id)
                left[n.node_id] -= 1
    return out

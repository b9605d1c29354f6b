"""GPU memory in the cluster model: the tier choices of ``rankcore.tiers``
booked in the step (issue 21; docs/tiers.md).

A node that joins with ``devices`` (each GPU's memory in bytes) and
``cpu_cache_bytes`` is a *device node*. A deployment with ``model_bytes > 0``
is *tiered* once the cluster has a device node: its replicas are placed only
on device nodes, by ``tiers.choose`` (preference order, evictions), and book
``model_bytes / GPUs`` bytes on each of their devices (``Cluster.hot``)
instead of a GPU count; other deployments that need GPUs keep off device
nodes (a GPU is counted or booked by memory, never both). CPU, memory and
custom resources are booked as always.

The books kept here, one record each:

* ``Cluster.hot``: replica id -> (node id, ``tiers.Resident``): booked from the
  moment the core places it (or wakes it) until it has left (stopped, crashed,
  asleep): two replicas never count on the same bytes;
* ``Cluster.caches``: node id -> its WARM copies (``tiers.CacheEntry``): an
  evicted replica's weights, kept when the node's ``cpu_cache_bytes`` allow
  (``tiers.make_room``, decided when the eviction is sent);
* ``Cluster.evicting``: a replica waiting for the victims evicted for it;
* ``Cluster.no_evict``: the replacement of an evicted replica, which waits
  for room instead of evicting in turn (two models never evict each other
  back and forth).

A sleeping replica's weights are in its own process's CPU memory: its device
booking is freed once it is WARM (``TierMoved``) and booked again before its
``LoadReplica``; they are not a cache entry, and outside the cache budget.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from . import tiers
from .cluster import Cluster, Need, Node
from .clustertx import ClusterTx
from .state import Deployment
from .tiers import CacheEntry, NodeTiers, Resident, TierPlacement, Want

__all__ = ["tiered", "gpus_of", "host_need", "off_device_nodes", "want", "node_views", "choose", "book",
           "take_cache", "evict", "start_evictions", "wake_room", "release", "joined", "node_lost", "freed_asleep",
           "views_of"]


def tiered(cl: Cluster | ClusterTx, dep: Deployment) -> bool:
    """``dep``'s replicas are booked by memory on device nodes (module docstring)."""
    return dep.config.tier.model_bytes > 0 and bool(cl.devices)


def gpus_of(dep: Deployment) -> int:
    """The GPUs one replica spans (its ``GPU`` resource, 1 when it names none)."""
    gpus = dict(dep.resources).get("GPU")
    return int(gpus) if gpus else 1


def host_need(dep: Deployment) -> Need:
    """What a tiered replica books besides its GPU memory."""
    return tuple((k, v) for k, v in dep.resources if k != "GPU")


def off_device_nodes(cl: Cluster | ClusterTx, dep: Deployment) -> bool:
    """A deployment that counts GPUs keeps off device nodes (module docstring)."""
    return bool(cl.devices) and dep.config.tier.model_bytes == 0 and any(k == "GPU" for k, _ in dep.resources)


def want(cl: Cluster | ClusterTx, dep: Deployment, rid: str | None = None,
         nodes: frozenset[str] | None = None) -> Want:
    t = dep.config.tier
    return Want(deployment=dep.name, model_bytes=t.model_bytes, gpus=gpus_of(dep), dedicated=t.dedicated,
                replica_id=rid, now=cl.now, min_deployment_time_s=t.min_deployment_time_s, nodes=nodes,
                may_evict=rid is None or rid not in cl.no_evict)


def views_of(cl: Cluster | ClusterTx) -> dict[str, NodeTiers]:
    """Every device node as the tier rules see it (its residents from ``hot``)."""
    residents: dict[str, list[Resident]] = {}
    for node_id, r in cl.hot.values():
        residents.setdefault(node_id, []).append(r)
    out = {}
    for node_id, devs in cl.devices.items():
        node = cl.nodes.get(node_id)
        out[node_id] = NodeTiers(node_id=node_id, devices=devs, residents=residents.get(node_id, ()),
                                 cache_budget=cl.cache_budget.get(node_id, 0), cache=cl.caches.get(node_id, ()),
                                 order=node.order if node is not None else ())
    return out


def _fits(node: Node, need: Need) -> bool:
    free = node.free
    return all(free.get(k, 0.0) + 1e-9 >= v for k, v in need)


def node_views(cl: Cluster | ClusterTx, dep: Deployment, avoid: Iterable[str] = ()) -> list[NodeTiers]:
    """The live device nodes ``dep`` may use: not avoided, room for its host need."""
    need, skip = host_need(dep), set(avoid)
    views = views_of(cl)
    return [views[n.node_id] for n in cl.nodes.values()
            if n.node_id in views and n.node_id not in skip and _fits(n, need)]


def choose(cl: Cluster | ClusterTx, dep: Deployment, rid: str, avoid: tuple = ()) -> TierPlacement | tiers.Refusal:
    """Where waiting replica ``rid`` becomes HOT (healthy nodes first while one will do)."""
    views = node_views(cl, dep, avoid)
    w = want(cl, dep)
    w = attrs.evolve(w, may_evict=rid not in cl.no_evict)
    if cl.suspects:
        healthy = [v for v in views if not cl.suspect(v.node_id)]
        if len(healthy) < len(views):
            chosen = tiers.choose(healthy, w)
            if chosen:
                return chosen
    return tiers.choose(views, w)


def book(cl: ClusterTx, dep: Deployment, rid: str, node_id: str, devices: tuple[int, ...]) -> None:
    """``rid``'s weights go on ``devices`` of ``node_id`` from now (HOT since now)."""
    w = want(cl, dep)
    cl.hot = cl.hot.set(rid, (node_id, Resident(replica_id=rid, deployment=dep.name, devices=devices,
                                                bytes_per_device=w.per_device, dedicated=w.dedicated,
                                                hot_since=cl.now)))
    cl.changed = True


def take_cache(cl: ClusterTx, dep: Deployment, node_id: str) -> None:
    """A placement from the node's WARM copy of ``dep``'s model uses it up (the smallest, then the oldest)."""
    cache = cl.caches.get(node_id, ())
    mine = sorted((e.nbytes, i) for i, e in enumerate(cache) if e.deployment == dep.name and not e.pinned)
    if mine:
        at = mine[0][1]
        cl.caches = cl.caches.set(node_id, cache[:at] + cache[at + 1:])
        cl.changed = True


def evict(cl: ClusterTx, victim: str) -> tuple[str, str, tuple[CacheEntry, ...]]:
    """Mark ``victim`` leaving and decide where its weights go: (node id, "warm" or
    "cold", the cache entries dropped to make room)."""
    node_id, r = cl.hot[victim]
    cl.hot = cl.hot.set(victim, (node_id, attrs.evolve(r, leaving=True)))
    view = views_of(cl)[node_id]
    out = tiers.make_room(view, CacheEntry(deployment=r.deployment, nbytes=r.nbytes, replica_id=victim))
    if out.warm:
        cl.caches = cl.caches.set(node_id, out.cache)
    cl.changed = True
    return node_id, "warm" if out.warm else "cold", out.dropped


def start_evictions(tx: Any, rid: str, victims: tuple[str, ...]) -> None:
    """``victims`` leave for ``rid`` (placed, or woken, once they are gone): each is
    marked leaving now (no other replica counts on it), where its weights go is
    decided now, and the end-of-step pass sends the evictions (``rankcore.evictions``)."""
    cl = tx.cl
    cl.evicting = cl.evicting.set(rid, victims)
    if tx.evictions is None:
        tx.evictions = []
    for v in victims:
        tx.evictions.append((v, rid, *evict(cl, v)))


def wake_room(tx: Any, dep: Deployment, rid: str, node_id: str | None) -> bool:
    """Book GPU memory for sleeping ``rid`` on its own node before its ``LoadReplica``:
    True when booked (or nothing to book: not tiered); False when it must wait,
    for victims evicted for it now, or for room (``Cluster.evicting``)."""
    view = tx.view
    if not tiered(view, dep) or node_id is None or node_id not in view.devices or rid in view.hot:
        return True
    cl = tx.cl
    victims = cl.evicting.get(rid)
    if victims is not None and any(v in cl.hot for v in victims):
        return False  # still draining
    chosen = tiers.choose([views_of(cl)[node_id]], want(cl, dep, rid, frozenset((node_id,))))
    if not isinstance(chosen, TierPlacement):
        cl.evicting = cl.evicting.set(rid, ())  # waits for room (retried as bookings go)
        cl.changed = True
        return False
    if chosen.evict:
        start_evictions(tx, rid, chosen.evict)
        return False
    if rid in cl.evicting:
        cl.evicting = cl.evicting.delete(rid)
    book(cl, dep, rid, node_id, chosen.devices)
    return True


def release(cl: ClusterTx, rid: str) -> None:
    """``rid`` left: its device booking, its wait for victims, its no-evict mark go."""
    if rid in cl.hot:
        cl.hot = cl.hot.delete(rid)
        cl.blocked = None
    if rid in cl.evicting:
        cl.evicting = cl.evicting.delete(rid)
    if rid in cl.no_evict:
        cl.no_evict = cl.no_evict.delete(rid)
    cl.changed = True


def freed_asleep(cl: ClusterTx, rid: str) -> None:
    """``rid`` is WARM (asleep): its GPU memory is free for others."""
    if rid in cl.hot:
        cl.hot = cl.hot.delete(rid)
        cl.blocked = None
        cl.changed = True


def joined(cl: ClusterTx, node_id: str, devices: tuple[int, ...], cache_bytes: int) -> None:
    """A node declared its GPUs' memory and its CPU cache."""
    if devices:
        cl.devices = cl.devices.set(node_id, tuple(tiers.Device(index=i, memory=m) for i, m in enumerate(devices)))
        cl.cache_budget = cl.cache_budget.set(node_id, cache_bytes)
        cl.changed = True


def node_lost(cl: ClusterTx, node_id: str) -> None:
    """A node left: its devices and its WARM copies with it (its replicas' bookings
    go as each of them crashes)."""
    for m in ("devices", "cache_budget", "caches"):
        book: Any = getattr(cl, m)
        if node_id in book:
            setattr(cl, m, book.delete(node_id))
            cl.changed = True

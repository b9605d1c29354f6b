"""GPU memory in the cluster model: the tier choices of ``rankcore.tiers.choice``
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

import math
from collections.abc import Iterable
from typing import Any

import attrs

from ..base.books import host_need, tiered
from ..base.cluster import Cluster, Need, fits
from ..base.clustertx import ClusterTx
from ..base.errors import InvalidEvent
from ..base.lifecycle import Phase
from ..base.state import Deployment
from . import choice as tiers
from .choice import CacheEntry, NodeTiers, Resident, TierPlacement, Want

__all__ = ["gpus_of", "device_bytes", "want", "node_views", "choose", "book",
           "take_cache", "evict", "start_evictions", "wake_room", "warm_here", "comes_of_age", "stopping", "adopt", "forget_copy",
           "check_same_model", "joined", "node_lost",
           "views_of", "recovered"]


def gpus_of(dep: Deployment | Any) -> int:
    """The GPUs one replica spans (its ``GPU`` resource, 1 when it names none)."""
    gpus = dict(dep.resources).get("GPU")
    return int(gpus) if gpus else 1


def device_bytes(t: Any) -> int:
    """What one replica of a deployment with tier options ``t`` books on its devices: its model,
    and the memory it sets aside for its multiplexed models (``multiplexed_bytes``, issue 39)."""
    return int(t.model_bytes + t.multiplexed_bytes)


def want(cl: Cluster | ClusterTx, dep: Deployment, rid: str | None = None,
         nodes: frozenset[str] | None = None) -> Want:
    t = dep.config.tier
    return Want(deployment=dep.name, model_bytes=device_bytes(t), gpus=gpus_of(dep), dedicated=t.dedicated,
                replica_id=rid, now=cl.now, min_deployment_time_s=t.min_deployment_time_s, nodes=nodes,
                may_evict=rid is None or rid not in cl.no_evict)


def check_same_model(dep: Deployment, model_bytes: int, resources: Need, multiplexed_bytes: int) -> None:
    """A deployment with replicas keeps its model's size (and what it sets aside for
    multiplexed models) and GPUs (what each replica holds is booked by them, and a
    recovering controller books them again from the size it is told): scale to 0
    first, or deploy under another name."""
    if not dep.replicas:
        return
    old, gpus = dep.config.tier.model_bytes, dict(dep.resources).get("GPU")
    if multiplexed_bytes != dep.config.tier.multiplexed_bytes:
        raise InvalidEvent(f"DeploymentApplied({dep.name!r}): multiplexed_bytes cannot change while it has replicas "
                           f"({dep.config.tier.multiplexed_bytes} -> {multiplexed_bytes}); scale it to 0 first")
    if model_bytes != old or (old and dict(resources).get("GPU") != gpus):
        raise InvalidEvent(f"DeploymentApplied({dep.name!r}): model_bytes or GPUs cannot change while it has replicas "
                           f"(model_bytes {old} -> {model_bytes}, GPU {gpus} -> {dict(resources).get('GPU')}); "
                           f"scale it to 0 first")


def views_of(cl: Cluster | ClusterTx, stopping: frozenset[str] = frozenset()) -> dict[str, NodeTiers]:
    """Every device node as the tier rules see it (its residents from ``hot``;
    those in ``stopping`` leave already: no victim)."""
    residents: dict[str, list[Resident]] = {}
    for node_id, r in cl.hot.values():
        if r.replica_id in stopping and not r.leaving:
            r = attrs.evolve(r, leaving=True)
        residents.setdefault(node_id, []).append(r)
    out = {}
    if cl.evicting:  # (a claim is no victim)
        for node_id, rs in residents.items():
            residents[node_id] = [attrs.evolve(r, claim=True) if r.replica_id in cl.evicting else r for r in rs]
    for node_id, devs in cl.devices.items():
        node = cl.nodes.get(node_id)
        out[node_id] = NodeTiers(node_id=node_id, devices=devs, residents=residents.get(node_id, ()),
                                 cache_budget=cl.cache_budget.get(node_id, 0), cache=cl.caches.get(node_id, ()),
                                 order=node.order if node is not None else ())
    return out


def stopping(tx: Any) -> frozenset[str]:
    """The replicas holding GPU memory that are being stopped already (no victims)."""
    view = tx.view
    out = []
    for rid in view.hot:
        dep = tx.deps.get(tx.index.get(rid))  # (a recovery rebuilds one deployment at a time)
        rep = dep.replicas.get(rid) if dep is not None else None
        if rep is not None and rep.phase is Phase.STOPPING:
            out.append(rid)
    return frozenset(out)


def node_views(cl: Cluster | ClusterTx, dep: Deployment, avoid: Iterable[str] = (),
               leaving: frozenset[str] = frozenset()) -> list[NodeTiers]:
    """The live device nodes ``dep`` may use: not avoided, room for its host need."""
    need, skip = host_need(dep), set(avoid)
    views = views_of(cl, leaving)
    return [views[n.node_id] for n in cl.nodes.values()
            if n.node_id in views and n.node_id not in skip and fits(n, need)]


def choose(cl: Cluster | ClusterTx, dep: Deployment, rid: str, avoid: tuple = (),
           leaving: frozenset[str] = frozenset()) -> TierPlacement | tiers.Refusal:
    """Where waiting replica ``rid`` becomes HOT (healthy nodes first while one will do;
    ``leaving``: replicas being stopped already, no victims)."""
    views = node_views(cl, dep, avoid, leaving)
    w = want(cl, dep, rid)
    if cl.suspects:
        healthy = [v for v in views if not cl.suspect(v.node_id)]
        if len(healthy) < len(views):
            chosen = tiers.choose(healthy, w)
            if chosen:
                return chosen
    return tiers.choose(views, w)


def adopt(cl: ClusterTx, dep: Deployment, rid: str, node_id: str) -> bool:
    """A replica the executor placed before the core placed (or before its node
    declared devices) runs HOT on ``node_id``: book it on the devices that fit
    best (True), or False when none fit (the caller stops and replaces it: the
    core books no more than a device holds)."""
    view = views_of(cl).get(node_id)
    if view is None:
        return True
    w = want(cl, dep)
    chosen = tiers.fit_devices(view.free(), w.per_device, w.gpus)
    if chosen is None:
        return False
    book(cl, dep, rid, node_id, chosen)
    return True


def comes_of_age(cl: Cluster | ClusterTx, dep: Deployment) -> float:
    """The earliest time a replica on a device node that ``dep`` could evict but for
    its youth (``min_deployment_time_s``) may be evicted (inf: none)."""
    w = want(cl, dep)
    if w.dedicated or not w.may_evict:
        return math.inf
    at = math.inf
    for _, r in cl.hot.values():
        if r.deployment == dep.name or r.dedicated or r.leaving or r.replica_id in cl.evicting:
            continue
        least = w.min_deployment_time_s if r.min_deployment_time_s is None else r.min_deployment_time_s
        t = r.hot_since + least
        if cl.now < t < at:
            at = t
    return at


def book(cl: ClusterTx, dep: Deployment, rid: str, node_id: str, devices: tuple[int, ...]) -> None:
    """``rid``'s weights go on ``devices`` of ``node_id`` from now (HOT since now)."""
    w = want(cl, dep)
    cl.hot = cl.hot.set(rid, (node_id, Resident(replica_id=rid, deployment=dep.name, devices=devices,
                                                bytes_per_device=w.per_device, dedicated=w.dedicated,
                                                hot_since=cl.now, min_deployment_time_s=w.min_deployment_time_s)))
    cl.changed = True


def warm_here(cl: Cluster | ClusterTx, dep: Deployment, node_id: str) -> bool:
    """The node holds a WARM copy of ``dep``'s model that a placement may load from."""
    return any(e.deployment == dep.name and not e.pinned and (e.replica_id is None or e.replica_id not in cl.hot)
               for e in cl.caches.get(node_id, ()))


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
    "cold", the cache entries dropped to make room; never the copy of a replica
    still draining, which does not exist yet)."""
    node_id, r = cl.hot[victim]
    cl.hot = cl.hot.set(victim, (node_id, attrs.evolve(r, leaving=True)))
    view = views_of(cl)[node_id]
    cache = view.cache
    coming = [i for i, e in enumerate(cache) if e.replica_id is not None and e.replica_id in cl.hot]
    if coming:
        view = attrs.evolve(view, cache=[attrs.evolve(e, pinned=True) if i in coming else e
                                         for i, e in enumerate(cache)])
    out = tiers.make_room(view, CacheEntry(deployment=r.deployment, nbytes=r.nbytes, replica_id=victim))
    if out.warm:
        if coming:  # (back as they were: pinned only for this choice)
            pinned = {e.replica_id for e in cache if e.pinned}
            out = attrs.evolve(out, cache=tuple(attrs.evolve(e, pinned=e.replica_id in pinned) for e in out.cache))
        cl.caches = cl.caches.set(node_id, out.cache)
    cl.changed = True
    return node_id, "warm" if out.warm else "cold", out.dropped


def start_evictions(tx: Any, dep: Deployment, rid: str, chosen: TierPlacement) -> None:
    """``chosen.evict`` leave for ``rid``, which claims its devices now (placed, or
    woken, there once they are gone: the room they free is nobody else's). Each
    victim is marked leaving (no other replica counts on it), where its weights go
    is decided now, and the end-of-step pass sends the evictions (``rankcore.control.evictions``)."""
    cl = tx.cl
    victims = chosen.evict
    cl.evicting = cl.evicting.set(rid, victims)
    book(cl, dep, rid, chosen.node_id, chosen.devices)
    if tx.evictions is None:
        tx.evictions = []
    for v in victims:
        tx.evictions.append((v, rid, *evict(cl, v)))


def wake_room(tx: Any, dep: Deployment, rid: str, node_id: str | None) -> bool:
    """Book GPU memory for sleeping ``rid`` on its own node before its ``LoadReplica``:
    True when booked (or nothing to book: not tiered); False when it must wait,
    for victims evicted for it now, or for room (``Cluster.evicting``)."""
    view = tx.view
    if not tiered(view, dep) or node_id is None or node_id not in view.devices:
        return True
    victims = view.evicting.get(rid)
    if victims is not None and any(v in view.hot for v in victims):
        return False  # still draining
    if rid in view.hot:  # booked (its claim, its victims gone)
        if victims is not None:
            tx.cl.evicting = tx.cl.evicting.delete(rid)
            tx.cl.changed = True
        return True
    cl = tx.cl
    chosen = tiers.choose([views_of(cl, stopping(tx))[node_id]], want(cl, dep, rid, frozenset((node_id,))))
    if not isinstance(chosen, TierPlacement):
        cl.evicting = cl.evicting.set(rid, ())  # waits for room (retried as bookings go)
        cl.changed = True
        return False
    if chosen.evict:
        start_evictions(tx, dep, rid, chosen)
        return False
    if rid in cl.evicting:
        cl.evicting = cl.evicting.delete(rid)
    book(cl, dep, rid, node_id, chosen.devices)
    return True


def forget_copy(cl: ClusterTx, node_id: str, rid: str) -> None:
    """The WARM copy ``rid`` was to leave on ``node_id`` will not exist (it was not evicted after all)."""
    cache = cl.caches.get(node_id, ())
    kept = tuple(e for e in cache if e.replica_id != rid)
    if len(kept) != len(cache):
        cl.caches = cl.caches.set(node_id, kept)
        cl.changed = True


def joined(cl: ClusterTx, node_id: str, devices: tuple[int, ...], cache_bytes: int) -> None:
    """A node declared its GPUs' memory and its CPU cache."""
    if devices:
        cl.devices = cl.devices.set(node_id, tuple(tiers.Device(index=i, memory=m) for i, m in enumerate(devices)))
        cl.cache_budget = cl.cache_budget.set(node_id, cache_bytes)
        cl.changed = True


def check_capacity(cl: Cluster | ClusterTx, node_id: str, resources: Need) -> None:
    """A device node's GPUs are its devices (``NodeJoined`` checks it): a new capacity naming
    another number of GPUs is refused (its devices would be unknown, and the state could no
    longer be told to a recovering controller)."""
    declared = cl.devices.get(node_id)
    gpus = dict(resources).get("GPU")
    if declared and gpus is not None and gpus != len(declared):
        raise InvalidEvent(f"NodeCapacityChanged({node_id!r}): resources say GPU={gpus:g} but the node declared "
                           f"{len(declared)} devices (a device node's GPUs are its devices: send NodeLost, then "
                           f"NodeJoined with the new ones)")


def node_lost(cl: ClusterTx, node_id: str) -> None:
    """A node left: its devices and its WARM copies with it (its replicas' bookings
    go as each of them crashes)."""
    for rid in [rid for rid, (n, _) in cl.hot.items() if n == node_id and rid in cl.evicting]:
        cl.hot = cl.hot.delete(rid)  # a claim there: it chooses again
        cl.evicting = cl.evicting.delete(rid)
        cl.changed = True
    for m in ("devices", "cache_budget", "caches"):
        book: Any = getattr(cl, m)
        if node_id in book:
            setattr(cl, m, book.delete(node_id))
            cl.changed = True


def recovered(cl: ClusterTx, specs: dict[str, Any], reports: Iterable[Any], warm: Iterable[Any] = (),
              no_evict: Iterable[str] = ()) -> None:
    """A recovering controller's books of GPU memory, from the reports: each HOT
    replica of a model booked by memory, on a device node, on the devices it names
    (``ReplicaReport.devices``). A report that names no such devices, or reports
    that put more on a device than it holds, are refused (``InvalidEvent``): the
    executor knows where the weights are, and must say so. The WARM copies the
    executor reports (``warm_copies``) are the nodes' caches again, those on a
    device node of a deployment that still exists; none reported: none (COLD).
    The replacements of evicted replicas (``no_evict``, persisted) that still
    wait keep waiting for room."""
    for w in warm:
        if w.node_id in cl.devices and w.deployment in specs:
            entry = CacheEntry(deployment=w.deployment, nbytes=w.nbytes, replica_id=w.replica_id or None)
            cl.caches = cl.caches.set(w.node_id, (*cl.caches.get(w.node_id, ()), entry))
    waiting = {r.replica_id for r in reports if r.node_id is None and r.phase.value == "pending"}
    for rid in no_evict:  # (persisted: rankcore.query.desired_no_evict) those still waiting wait for room
        if rid in waiting:
            cl.no_evict = cl.no_evict.set(rid, None)
    for r in sorted(reports, key=lambda r: r.replica_id):
        spec = specs.get(r.deployment)
        if spec is None or not spec.config.tier.model_bytes or r.node_id not in cl.devices or r.tier != "hot":
            continue
        if r.phase.value in ("failed", "stopped", "crashed"):
            continue
        gpus = gpus_of(spec)
        have = {d.index for d in cl.devices[r.node_id]}
        if len(r.devices) != gpus or len(set(r.devices)) != gpus or not set(r.devices) <= have:
            raise InvalidEvent(f"ControllerRecovered: replica {r.replica_id!r} of {r.deployment!r} ({gpus} GPU(s), "
                               f"model_bytes) is HOT on device node {r.node_id!r} but reports devices "
                               f"{tuple(r.devices)!r} (that node has {sorted(have)})")
        t = spec.config.tier
        cl.hot = cl.hot.set(r.replica_id, (r.node_id, Resident(
            replica_id=r.replica_id, deployment=r.deployment, devices=tuple(sorted(r.devices)),
            bytes_per_device=-(-device_bytes(t) // gpus), dedicated=t.dedicated, hot_since=cl.now,
            min_deployment_time_s=t.min_deployment_time_s)))
    for node in views_of(cl).values():
        for i, room in node.free().items():
            if room < 0:
                raise InvalidEvent(f"ControllerRecovered: the reports put {-room:,} bytes more on device {i} of node "
                                   f"{node.node_id!r} than it holds")
    cl.changed = True

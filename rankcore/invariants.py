"""The rules of ranks as plain check functions an embedder can call anywhere.

State checks look at one state; step checks look at a state, an event and
the ``Step`` it produced. Each raises :class:`InvariantViolation` naming the
deployment, replica and values involved, and returns None when all is well.
``check_state`` / ``check_step`` run them all. ``reports_from`` builds the
recovery event a state's own live replicas would send.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .base.commands import (
    DrainProxy,
    EvictReplica,
    GangChanged,
    InitializeReplica,
    KeepSpareProcesses,
    LoadReplica,
    OffloadReplica,
    PlaceReplica,
    ReconfigureReplica,
    ReformGroup,
    RequestResources,
    ScheduleTick,
    StartProxy,
    StartReplica,
    StopProxy,
    StopReplica,
    UpdateWorldSize,
)
from .base.errors import InvariantViolation
from .base.events import (
    OUTDATED,
    ControllerRecovered,
    DeploymentApplied,
    NodeCapacityChanged,
    NodeJoined,
    NodeLost,
    ProxiesConfigured,
    ReplicaPlaced,
    ReplicaReport,
    ScaleRequested,
    Tick,
    WarmCopy,
)
from .base.lifecycle import LIVE, Phase, Residency
from .base.proxybook import ProxyPhase
from .base.ranks import ReplicaRank
from .base.state import (
    Deployment,
    Replica,
    State,
    Step,
    desired_asleep,
    desired_deleted,
    desired_no_evict,
    desired_specs,
    desired_weights,
)
from .control import autoscaling
from .control.proxies import parse_proxy_id, wanted
from .control.rollouts import budget, gang_budget, surge_budget
from .placement import spares
from .tiers.devices import views_of
from .tiers.residency import serving

__all__ = [
    "check_state",
    "check_step",
    "check_tiers",
    "check_residency",
    "check_devices",
    "check_cluster",
    "check_placements",
    "check_rollouts",
    "check_rollout_pace",
    "check_ranks_unique",
    "check_every_replica_ranked",
    "check_counts",
    "check_contiguous_when_healthy",
    "check_contiguity_counters",
    "check_world_size_commands",
    "check_crash_inherits_rank",
    "check_gangs_told",
    "check_gang_downscale_whole",
    "check_spares_told",
    "check_new_replicas_take_lowest_free",
    "check_crash_replacement_inherits_all_ranks",
    "check_compact_only_when_healthy",
    "check_command_order",
    "check_touched",
    "touched_replicas",
    "check_upscale_keeps_ranks",
    "check_rank_changes_reconfigured",
    "check_compaction_minimal",
    "check_recovery_roundtrip",
    "check_snapshot",
    "reports_from",
    "rank_view",
]


def _fail(msg: str) -> None:
    raise InvariantViolation(msg)


def rank_view(dep: Deployment) -> dict[str, tuple[int, int | None, int | None]]:
    """replica id -> (rank, node_rank, local_rank); node parts None until placed."""
    out: dict[str, tuple[int, int | None, int | None]] = {}
    for rid, (r, _node, nr, local) in dep.ranks.to_dict().items():
        out[str(rid)] = (r, nr, local)
    return out


# ------------------------------------------------------------ state checks
def check_ranks_unique(state: State) -> None:
    """At each level, no two live replicas (or nodes) share a rank."""
    for dep in state.deployments.values():
        snap = dep.ranks.to_dict()
        dup = [r for r, c in Counter(v[0] for v in snap.values()).items() if c > 1]
        if dup:
            _fail(f"{dep.name}: global rank {dup[0]} is held by more than one replica")
        node_ranks: dict[Any, int] = {}
        for _, node, nr, _l in snap.values():
            if node is not None and node_ranks.setdefault(node, nr) != nr:
                _fail(f"{dep.name}: node {node!r} has two node ranks ({node_ranks[node]}, {nr})")
        dup = [nr for nr, c in Counter(node_ranks.values()).items() if c > 1]
        if dup:
            _fail(f"{dep.name}: node rank {dup[0]} is held by more than one node")
        locals_ = Counter((node, local) for _, node, _nr, local in snap.values() if node is not None)
        dup = [k for k, c in locals_.items() if c > 1]
        if dup:
            _fail(f"{dep.name}: local rank {dup[0][1]} on node {dup[0][0]!r} is held twice")


def _on_its_bundle(dep: Deployment, rid: str, node: object) -> bool:
    """A static replica placed by the core on its rank's first bundle (nothing booked for it)."""
    if dep.static is None:
        return False
    g = dep.ranks.global_rank(rid)
    return g < len(dep.static.mapping) and dep.static.node_of(g) == node


def _check_static_rank(dep: Deployment, rid: str, rep: Any, g: int) -> None:
    """A static replica that is not leaving, or is leaving to be replaced on its rank (``retiring``),
    holds a rank of the mapping (one beyond it has no bundles)."""
    if dep.static is not None and (rep.phase is not Phase.STOPPING or rep.retiring) \
            and g >= len(dep.static.mapping):
        _fail(f"{dep.name}: {rep.phase.value} replica {rid!r} holds global rank {g}, beyond the static "
              f"mapping's {len(dep.static.mapping)} ranks")


def _check_node_ranks(dep: Deployment, rid: str, rep: Any, node: object, held: Any) -> None:
    """The node-rank rules of one replica ranked on ``node`` (None: no node ranks), for the whole
    state and for what a step touched alike (``held``: the replicas the core reserved a node for):
    ranked where it is when it holds node ranks, a placed live one has node ranks, a
    pending one has them only on a node reserved for it or its static bundle, a FAILED one none."""
    if node is not None and node != rep.node_id:  # (a stopping one may have given its node ranks on)
        _fail(f"{dep.name}: replica {rid!r} is on {rep.node_id!r} but ranked on {node!r}")
    if rep.phase in (Phase.STARTING, Phase.RUNNING, Phase.RECONFIGURING) and node is None:
        _fail(f"{dep.name}: {rep.phase.value} replica {rid!r} has no node rank")
    if rep.phase is Phase.PENDING and node is not None and rid not in held and not _on_its_bundle(dep, rid, node):
        _fail(f"{dep.name}: pending replica {rid!r} already has node ranks, and the core reserved no node")
    if rep.phase is Phase.FAILED and node is not None:
        _fail(f"{dep.name}: FAILED replica {rid!r} still holds node ranks on {node!r}")


def check_every_replica_ranked(state: State) -> None:
    """Every live replica holds exactly one rank; a placed one all three levels."""
    for dep in state.deployments.values():
        snap = dep.ranks.to_dict()
        if set(snap) != set(dep.replicas.keys()):
            extra = sorted(set(snap) - set(dep.replicas.keys()))[:3]
            missing = sorted(set(dep.replicas.keys()) - set(snap))[:3]
            _fail(f"{dep.name}: ranks held by non-replicas {extra}, replicas without rank {missing}")
        for rid, rep in dep.replicas.items():
            if state.index.get(rid) != dep.name:
                _fail(f"{dep.name}: replica {rid!r} is missing from the replica index")
            _check_node_ranks(dep, rid, rep, snap[rid][1], state.cluster.held)
            _check_static_rank(dep, rid, rep, snap[rid][0])
    if len(state.index) != sum(len(d.replicas) for d in state.deployments.values()):
        _fail("the replica index names replicas that no deployment holds")


def check_counts(state: State) -> None:
    for dep in state.deployments.values():
        seen = Counter(r.phase for r in dep.replicas.values())
        want = tuple(seen.get(p, 0) for p in LIVE)
        if want != dep.counts:
            _fail(f"{dep.name}: phase counts {dep.counts} do not match the replicas {want}")


def check_contiguous_when_healthy(state: State) -> None:
    """A healthy deployment's ranks are exactly 0..N-1 / 0..M-1 / 0..K-1."""
    for dep in state.deployments.values():
        if not dep.healthy:
            continue
        snap = dep.ranks.to_dict()
        ranks = sorted(v[0] for v in snap.values())
        if ranks != list(range(len(ranks))):
            _fail(f"{dep.name} is healthy but its global ranks are {ranks}")
        nodes: dict[Any, int] = {v[1]: v[2] for v in snap.values()}
        if sorted(nodes.values()) != list(range(len(nodes))):
            _fail(f"{dep.name} is healthy but its node ranks are {sorted(nodes.values())}")
        per_node: dict[Any, list[int]] = {}
        for v in snap.values():
            per_node.setdefault(v[1], []).append(v[3])
        for node, ls in per_node.items():
            if sorted(ls) != list(range(len(ls))):
                _fail(f"{dep.name} is healthy but local ranks on {node!r} are {sorted(ls)}")


def check_contiguity_counters(state: State) -> None:
    """The O(1) ``RankTable.is_contiguous`` agrees with a full scan."""
    for dep in state.deployments.values():
        fast, lb = dep.ranks.is_contiguous(), dep.ranks.lower_bound()
        if fast != (lb.replicas == 0):
            _fail(f"{dep.name}: is_contiguous() says {fast}, but {lb.replicas} replicas are off ({lb})")


def check_cluster(state: State) -> None:
    """The cluster view adds up: every replica on a node (reserved or placed)
    holds that node's resources in the book and nothing else does; each node's
    free resources are its total less what is booked there; the waiting queue
    is exactly the pending replicas with no node, each once; no replica waits
    while the core places nothing (unmanaged: no book, no queue)."""
    cl = state.cluster
    if not cl.managed:
        if len(cl.held) or len(cl.queued):
            _fail("an unmanaged cluster (no node joined) holds reservations or a queue")
        return
    on_nodes = {}
    waiting = set()
    for dep in state.deployments.values():
        if dep.static is not None:
            continue  # the caller's group holds its resources; its replicas never wait for a node
        for rid, rep in dep.replicas.items():
            if rep.node_id is not None:
                on_nodes[rid] = (rep.node_id, dep.resources)
            elif rep.phase is Phase.PENDING and rid not in cl.delayed:  # (delayed: its restart backoff runs)
                waiting.add(rid)
    held = {rid: tuple(v) for rid, v in cl.held.items()}
    for rid, (node, _need) in on_nodes.items():
        if rid not in held:
            _fail(f"replica {rid!r} is on {node!r} but the cluster holds nothing for it")
        if held[rid][0] != node:
            _fail(f"replica {rid!r} is on {node!r} but the cluster holds its resources on {held[rid][0]!r}")
    extra = sorted(set(held) - set(on_nodes))[:3]
    if extra:
        _fail(f"the cluster holds resources for replicas on no node: {extra}")
    booked: dict[str, Counter] = {}
    for node, need in held.values():
        c = booked.setdefault(node, Counter())
        for k, v in need:
            c[k] += v
    for node_id, node in cl.nodes.items():
        for k in set(node.resources.keys()) | set(booked.get(node_id, {})):
            want = node.resources.get(k, 0.0) - booked.get(node_id, Counter())[k]
            if abs(node.free.get(k, 0.0) - want) > 1e-6:
                _fail(f"node {node_id!r}: {k} free {node.free.get(k, 0.0)}, but total less booked is {want}")
    if set(cl.queued.keys()) != waiting:
        _fail(f"waiting queue {sorted(cl.queued.keys())[:5]} is not the pending replicas with no node "
              f"{sorted(waiting)[:5]}")
    live = [rid for rid in cl.queue if rid in cl.queued]
    if len(live) != len(set(live)) or set(live) != waiting:
        _fail(f"the queue order {list(cl.queue)[:5]} does not name each waiting replica once")
    kinds = Counter(cl.queued.values())
    if dict(kinds) != dict(cl.queue_kinds.items()):
        _fail("the queue's kind counts do not match the waiting replicas")
    tenants = Counter(node for node, _ in held.values())
    for node_id, node in cl.nodes.items():
        if node.tenants != tenants[node_id]:
            _fail(f"node {node_id!r} counts {node.tenants} replicas booked on it, the book {tenants[node_id]}")


def check_proxies(state: State) -> None:
    """One proxy a node at most (the book is keyed by node), none on a lost node; every
    node that should have one has one, and a proxy on a node that should not is draining
    (or waiting out a backoff: ``rankcore.control.proxies.reconcile`` forgets those); the
    deadlines' minimum is kept, in the book and in the cluster's mirror."""
    book, cl = state.proxies, state.cluster
    if book.options is None:
        if len(book.proxies):
            _fail("the core runs no proxies (no ProxiesConfigured) but its book holds some")
        return
    want = wanted(book, cl.nodes)
    for node_id, p in book.proxies.items():
        parsed = parse_proxy_id(p.proxy_id)
        if p.node_id != node_id or parsed is None or parsed[0] != node_id or parsed[1] >= book.started:
            _fail(f"proxy {p.proxy_id!r} is booked under node {node_id!r}")
        if node_id not in cl.nodes:
            _fail(f"proxy {p.proxy_id!r} is on {node_id!r}, a node the cluster lost")
        if node_id not in want and p.phase is not ProxyPhase.DRAINING:
            _fail(f"proxy {p.proxy_id!r} is {p.phase.value} on {node_id!r}, which needs none: it should drain")
        if node_id in want and p.phase is ProxyPhase.DRAINING:
            _fail(f"proxy {p.proxy_id!r} drains on {node_id!r}, which needs one")
        if cl.clock and p.phase is ProxyPhase.BACKOFF and p.deadline > cl.now + book.options.restart_backoff_max_s:
            _fail(f"proxy {p.proxy_id!r} restarts at {p.deadline}, later than the longest backoff from {cl.now}")
    missing = sorted(want - set(book.proxies.keys()))
    if missing:
        _fail(f"nodes {missing[:3]} should run a proxy and have none")
    nxt = min((p.deadline for p in book.proxies.values()), default=math.inf)
    if cl.proxies_at != nxt:
        _fail(f"the proxies' next deadline is {nxt}, the cluster says {cl.proxies_at}")
    if not book.draining <= set(cl.nodes.keys()):
        _fail(f"nodes draining {sorted(book.draining - set(cl.nodes.keys()))[:3]} are not in the cluster")


def check_tiers(nodes: Iterable[Any]) -> None:
    """Model tiers on ``rankcore.tiers.choice.NodeTiers`` views: no device over-committed,
    no replica HOT twice (on two nodes or two sets of devices), the CPU cache
    within its budget."""
    seen: dict[str, str] = {}
    for node in nodes:
        # (a replica being evicted still holds its bytes, and the one it makes room for may hold its
        # claim already: a device is over-committed when what stays does not fit)
        staying = attrs.evolve(node, residents=[r for r in node.residents if not r.leaving])
        for i, room in sorted(staying.free().items()):
            if room < 0:
                _fail(f"tiers: device {i} of node {node.node_id!r} is over-committed by {-room:,} bytes")
        for r in node.residents:
            if r.replica_id in seen:
                _fail(f"tiers: replica {r.replica_id!r} is HOT twice (node {seen[r.replica_id]!r} and "
                      f"node {node.node_id!r})")
            seen[r.replica_id] = node.node_id
        if node.cached() > node.cache_budget:
            _fail(f"tiers: node {node.node_id!r} caches {node.cached():,} bytes over its budget of "
                  f"{node.cache_budget:,}")


def check_residency(state: State) -> None:
    """Sleep and weights (rankcore.tiers.residency): a replica not yet running is on its
    GPU (it sleeps once ready) and has no weights update in flight before it is
    initialised; no replica holds a version newer than its deployment's."""
    for name, dep in state.deployments.items():
        for rid, rep in dep.replicas.items():
            if rep.phase in (Phase.PENDING, Phase.STARTING) and rep.residency is not Residency.HOT:
                _fail(f"{name}: replica {rid!r} is {rep.phase.value} but {rep.residency.value}")
            if rep.phase is Phase.PENDING and rep.weights_pending:
                _fail(f"{name}: replica {rid!r} is pending with a weights update in flight")
            if rep.weights_version > dep.weights_version:
                _fail(f"{name}: replica {rid!r} holds weights version {rep.weights_version}, newer than the "
                      f"deployment's {dep.weights_version}")


def check_devices(state: State) -> None:
    """GPU memory booked in the cluster model (rankcore.tiers.devices): the tier views
    hold (``check_tiers``); every booking is a live replica's on the node it
    runs on, never one asleep; a node's WARM copies and their budget are on a
    device node."""
    cl = state.cluster
    if not cl.devices and not cl.hot and not cl.caches:
        return

    check_tiers(views_of(cl).values())
    for rid, (node_id, r) in cl.hot.items():
        name = state.index.get(rid)
        if name is None or rid not in state.deployments[name].replicas:
            _fail(f"devices: {rid!r} holds GPU memory on node {node_id!r} but is no live replica")
        rep = state.deployments[name].replicas[rid]
        if rid in cl.evicting:  # a claim: it waits for the replicas evicted for it
            if rep.node_id is not None and rep.node_id != node_id:
                _fail(f"devices: {rid!r} claims GPU memory on node {node_id!r} but runs on {rep.node_id!r}")
            continue
        if rep.node_id != node_id:
            _fail(f"devices: {rid!r} holds GPU memory on node {node_id!r} but runs on {rep.node_id!r}")
        if rep.residency is Residency.WARM:
            _fail(f"devices: {rid!r} is asleep (WARM) but holds GPU memory")
        if r.deployment != name:
            _fail(f"devices: {rid!r}'s booking names deployment {r.deployment!r}, not {name!r}")
    for name, dep in state.deployments.items():
        if not dep.config.tier.model_bytes:
            continue
        for rid, rep in dep.replicas.items():
            if (rep.node_id in cl.devices and rep.residency is not Residency.WARM and rid not in cl.hot
                    and rep.phase in LIVE and rep.phase is not Phase.STOPPING):  # (one leaving may be unbooked:
                # found on a node that declared its devices after it was placed, with no room)
                _fail(f"devices: {name}: replica {rid!r} is {rep.phase.value} on device node {rep.node_id!r} "
                      f"but books no GPU memory")
    for node_id in cl.caches:
        if node_id not in cl.devices:
            _fail(f"devices: node {node_id!r} holds WARM copies but declared no devices")


def check_deletions(state: State) -> None:
    """A deployment being deleted is at target 0 and still has replicas to stop (with none
    left its record is gone, ``rankcore.control.deletion``); a deleted name is not also a live one."""
    for name, dep in state.deployments.items():
        if dep.deleting and dep.target:
            _fail(f"{name}: being deleted with target {dep.target}")
        if dep.deleting and not dep.replicas and not dep.unresponsive:
            _fail(f"{name}: being deleted with no replica left, but its record is still there")
        if name in state.deleted:
            _fail(f"{name}: both a live deployment and a deleted one")


def check_autoscaling(state: State) -> None:
    """An autoscaled deployment's target is whole gangs within its bounds (unless it is being
    deleted: 0); its autoscaler's window is in time order within ``look_back_period_s`` of its
    newest sample, a change is wanted since a time iff one is wanted; a deployment that is not
    autoscaled has no autoscaler state."""
    for name, dep in state.deployments.items():
        auto, a = dep.config.autoscaler, dep.autoscaler
        if not auto.autoscaling:
            if a is not None:
                _fail(f"{name}: not autoscaled, but holds autoscaler state {a!r}")
            continue
        lo, hi = autoscaling.bounds(dep.config, dep.max_replicas)
        if not dep.deleting and not (lo <= dep.target <= hi and dep.target % dep.gang_size == 0):
            _fail(f"{name}: autoscaled target {dep.target} is not whole gangs of {dep.gang_size} within [{lo}, {hi}]")
        if a is None:
            continue
        times = [t for t, _, _ in a.window]
        if times != sorted(times) or (times and times[0] < times[-1] - auto.look_back_period_s):
            _fail(f"{name}: autoscaler window {a.window!r} is out of order or longer than "
                  f"look_back_period_s={auto.look_back_period_s}")
        if a.wanted not in (-1, 0, 1) or (a.since is None) != (a.wanted == 0) or (
                a.since is not None and times and a.since > times[-1]):
            _fail(f"{name}: autoscaler wants {a.wanted} since {a.since} (newest sample {times[-1:]})")


def check_rollouts(state: State) -> None:
    """Rolling updates (rankcore.control.rollouts): ``Deployment.retiring`` counts the retiring
    replicas, each of them stopping; a deployment not rolling has no live replica of another
    revision (stopping ones aside)."""
    for name, dep in state.deployments.items():
        retiring = [r for r in dep.replicas.values() if r.retiring]
        if len(retiring) != dep.retiring:
            _fail(f"{name}: Deployment.retiring={dep.retiring} but {len(retiring)} replicas are retiring")
        for r in retiring:
            if r.phase is not Phase.STOPPING:
                _fail(f"{name}: retiring replica {r.replica_id!r} is {r.phase.value}, not stopping")
        if not dep.rolling:
            old = sorted(r.replica_id for r in dep.replicas.values()
                         if r.revision != dep.revision and r.phase is not Phase.STOPPING)
            if old:
                _fail(f"{name}: not rolling, but {old} run revision(s) other than {dep.revision!r}")
        if dep.gang_size > 1:
            _check_gangs_roll_whole(state, name, dep)
        _check_blue_green(name, dep)


def _check_blue_green(name: str, dep: Deployment) -> None:
    """Blue-green (rankcore.control.bluegreen): ``Deployment.blues`` counts the blues, each running on
    a spare entry whose told global rank a green holds; in a blue-green deployment, replicas of the
    current revision never serve beside older ones (no request reaches an old replica once the pool
    has switched, nor a new one before)."""
    blues = [r for r in dep.replicas.values() if r.blue_ranks is not None]
    if len(blues) != dep.blues:
        _fail(f"{name}: Deployment.blues={dep.blues} but {len(blues)} replicas are blue")
    for r in blues:
        holder = dep.ranks.holder_of(r.blue_ranks[0])
        if r.phase not in (Phase.RUNNING, Phase.RECONFIGURING) or holder is None or dep.replicas[holder].blue_ranks is not None \
                or r.revision == dep.revision or dep.ranks.global_rank(r.replica_id) < dep.target:
            _fail(f"{name}: blue {r.replica_id!r} ({r.phase.value}, told {r.blue_ranks}, on "
                  f"{dep.ranks.rank_tuple(r.replica_id)}) is not a running old replica on a spare entry "
                  f"whose told rank a green holds (held by {holder!r})")
    if dep.config.rollout.update_mode == "blue_green":
        up = [r for r in dep.replicas.values() if serving(dep, r)]
        new = sorted(r.replica_id for r in up if r.revision == dep.revision)
        old = sorted(r.replica_id for r in up if r.revision != dep.revision)
        if new and old:
            _fail(f"{name}: blue-green, but the current revision's {new} serve beside the old {old}")


def _check_gangs_roll_whole(state: State, name: str, dep: Deployment) -> None:
    """A gang rolls whole (rankcore.control.rollouts): its members with a process, stopping ones aside,
    run one revision; while a member is retiring every other member is stopping or held for the new
    gang (``moves.hold``: pending, on no node, in ``Cluster.delayed`` with no deadline), and a held
    member's gang has a member retiring or still on an old revision."""
    cl = state.cluster
    k = dep.gang_size
    gangs: dict[int, list[Replica]] = {}
    for rid, rep in dep.replicas.items():
        gangs.setdefault(dep.ranks.global_rank(rid) // k, []).append(rep)
    for g, members in sorted(gangs.items()):
        held = {r.replica_id for r in members if cl.deadlines.get(r.replica_id) == float("inf")}
        for rid in sorted(held):
            rep = dep.replicas[rid]
            if rid not in cl.delayed or rep.phase is not Phase.PENDING or rep.node_id is not None:
                _fail(f"{name}: {rid} is held for its gang but is {rep.phase.value} on {rep.node_id!r}"
                      f"{'' if rid in cl.delayed else ', not in Cluster.delayed'}")
        retiring = sorted(r.replica_id for r in members if r.retiring)
        old = [r for r in members if r.revision != dep.revision and r.phase is not Phase.STOPPING
               and r.replica_id not in cl.delayed]
        if held and not retiring and not old:
            _fail(f"{name}: gang {g}'s {sorted(held)} are held, but no member of it is retiring or on an old revision")
        if retiring:
            started = sorted(r.replica_id for r in members if r.phase is not Phase.STOPPING and r.replica_id not in held)
            if started:
                _fail(f"{name}: gang {g} has {retiring} retiring but {started} started (a gang rolls whole)")
        revisions = {r.revision for r in members if r.phase is not Phase.STOPPING and r.replica_id not in cl.delayed}
        if len(revisions) > 1:
            _fail(f"{name}: gang {g} runs revisions {sorted(revisions)} at once (a gang rolls whole): "
                  f"{[(r.replica_id, r.phase.value, r.revision, r.replica_id in cl.delayed) for r in members]}")


def _surged(old: Replica | None, new: Replica | None) -> bool:
    """A serving replica stopped with its successor started beside it (``rollouts.surge``): its
    lineage went to the successor."""
    return (old is not None and new is not None and new.phase is Phase.STOPPING and new.lineage != old.lineage
            and old.phase in (Phase.RUNNING, Phase.RECONFIGURING))


def _blue_green_move(old: Deployment, rid: str, new: Deployment) -> bool:
    """``rid``'s entry moved by blue-green (rankcore.control.bluegreen), not a rank change it is told:
    it became a blue (onto a spare entry) or was one (back on its ranks when the switch is called off:
    ``_check_rank_change`` asks whether they are what it was told), or a green stopped then."""
    r0, r1 = old.replicas.get(rid), new.replicas.get(rid)
    if r0 is None or r1 is None:
        return False
    return (r0.blue_ranks is not None or r1.blue_ranks is not None
            or (old.blues > 0 and r1.phase is Phase.STOPPING and r0.phase is not Phase.STOPPING))


def _retired_serving(old: Replica | None, new: Replica | None) -> bool:
    return (old is not None and new is not None and new.retiring and not old.retiring
            and old.phase in (Phase.RUNNING, Phase.RECONFIGURING)) or _surged(old, new)


def check_rollout_pace(before: State, event: object, result: Step) -> None:
    """A step that retires a serving replica leaves at least ``target - budget`` serving
    (``rollouts.budget``: max_unavailable; a gang deployment's ``gang_budget``: rounded up to whole
    gangs); a retired replica's successor never takes the deployment past its target, nor a
    surge's (started beside its draining predecessor) past ``target + surge_budget`` replicas
    alive (draining ones included)."""
    after = result.state
    for name, dep in after.deployments.items():
        old = before.deployments.get(name)
        if old is None or old is dep or (dep.retiring <= 0 and old.retiring <= 0 and not dep.rolling
                                         and not old.rolling):
            continue
        surged = [c.replica_id for c in result.commands if type(c) is StartReplica and c.deployment == name
                  and c.replaces is not None and _surged(old.replicas.get(c.replaces), dep.replicas.get(c.replaces))]
        if surged and len(dep.replicas) > dep.target + surge_budget(dep):
            _fail(f"{name}: surged successors {surged} take it to {len(dep.replicas)} replicas alive, past its "
                  f"target {dep.target} + max_surge {surge_budget(dep)}")
        # (a retirement sends its StopReplica: the step's stops are where to look, not every replica)
        retired = [c.replica_id for c in result.commands if type(c) is StopReplica and c.deployment == name
                   and _retired_serving(old.replicas.get(c.replica_id), dep.replicas.get(c.replica_id))]
        serving = dep.count(Phase.RUNNING) + dep.count(Phase.RECONFIGURING)
        allowed = budget(dep) if dep.gang_size <= 1 else gang_budget(dep)  # (a gang: rounded up to whole gangs)
        if retired and serving < dep.target - allowed:
            _fail(f"{name}: {type(event).__name__} retired serving {retired}, leaving {serving} serving of "
                  f"{dep.target} (max_unavailable allows {allowed} short)")
        succeeded = [c for c in result.commands if type(c) is StartReplica and c.deployment == name
                     and c.replaces is not None and c.replaces in old.replicas and old.replicas[c.replaces].retiring]
        if succeeded and dep.active > dep.target:
            _fail(f"{name}: successors {[c.replica_id for c in succeeded]} take it to {dep.active} active, "
                  f"past its target {dep.target}")


def check_state(state: State) -> None:
    """All state invariants."""
    check_rollouts(state)
    check_deletions(state)
    check_autoscaling(state)
    check_contiguity_counters(state)
    check_ranks_unique(state)
    check_every_replica_ranked(state)
    check_counts(state)
    check_contiguous_when_healthy(state)
    check_cluster(state)
    check_residency(state)
    check_devices(state)
    check_proxies(state)


# ------------------------------------------------------------- step checks
def _views(state: State) -> dict[str, dict[str, tuple]]:
    return {name: rank_view(dep) for name, dep in state.deployments.items()}


def check_world_size_commands(before: State, event: object, result: Step) -> None:
    """world_size is the target, announced the moment the target changes (at a
    recovery: once, when any replica reported another world_size)."""
    if isinstance(event, ControllerRecovered):
        for spec in event.deployments:
            stale = any(r.deployment == spec.name and r.world_size is not None and r.world_size != spec.num_replicas
                        for r in event.reports)
            sent = [c.world_size for c in result.commands
                    if isinstance(c, UpdateWorldSize) and c.deployment == spec.name]
            if sent != ([spec.num_replicas] if stale else []):
                _fail(f"{spec.name}: recovery with {'a stale' if stale else 'no stale'} reported world_size "
                      f"sent UpdateWorldSize {sent}, target {spec.num_replicas}")
    for name, dep in result.state.deployments.items():
        old = before.deployments.get(name)
        if old is not None and old.target != dep.target and not isinstance(event, ControllerRecovered):
            sizes = [c.world_size for c in result.commands if isinstance(c, UpdateWorldSize) and c.deployment == name]
            if sizes != [dep.target]:
                _fail(f"{name}: target {old.target} -> {dep.target} but UpdateWorldSize sent {sizes}")
    for c in result.commands:
        ws = getattr(c, "world_size", None)
        dep = result.state.deployments.get(getattr(c, "deployment", None))
        if ws is not None and dep is not None and ws != dep.target:
            _fail(f"{type(c).__name__} for {c.deployment} carries world_size {ws}, target is {dep.target}")


def check_crash_inherits_rank(before: State, event: object, result: Step) -> None:
    """A crashed replica's replacement starts with the same global rank (at a
    recovery, the rank the reports settled on: checked by the roundtrip; a replica a compaction
    moved and ``rank_moves="restart"`` replaces: its new rank)."""
    if isinstance(event, ControllerRecovered):
        return
    # (``rank_moves="restart"``: one this step's compaction moved is replaced on its new rank)
    moved_to = {(comp.deployment, ch.replica): ch.new.rank for comp in result.compactions for ch in comp.changes}
    for c in result.commands:
        if isinstance(c, StartReplica) and c.replaces is not None:
            dep = before.deployments[c.deployment]
            if c.replica_id in before.cluster.delayed:  # its backoff is over: it already held the rank
                if dep.ranks.global_rank(c.replica_id) != c.global_rank:
                    _fail(f"{c.replica_id} waited out its backoff on rank {dep.ranks.global_rank(c.replica_id)} "
                          f"but starts with rank {c.global_rank}")
                continue
            gone = dep.replicas[c.replaces]
            # (a blue called off and given a twin again in one step: the rank it was told and took back)
            old = dep.ranks.global_rank(c.replaces) if gone.blue_ranks is None else gone.blue_ranks[0]
            old = moved_to.get((c.deployment, c.replaces), old)
            if c.global_rank != old:
                _fail(f"{c.replica_id} replaces {c.replaces} (rank {old}) but starts with rank {c.global_rank}")
            if result.state.deployments[c.deployment].replicas[c.replica_id].lineage != dep.replicas[c.replaces].lineage:
                _fail(f"{c.replica_id} replaces {c.replaces} but is not of its lineage")


def check_upscale_keeps_ranks(before: State, event: object, result: Step) -> None:
    """Scaling up never changes an existing replica's rank, at any level."""
    if not isinstance(event, (ScaleRequested, DeploymentApplied)):
        return
    name = event.deployment if isinstance(event, ScaleRequested) else event.name
    old, new = before.deployments.get(name), result.state.deployments.get(name)
    if old is None or new is None or new.target <= old.target:
        return
    was, now = rank_view(old), rank_view(new)
    for rid, rk in was.items():
        placed = rk[1] is None and old.replicas[rid].phase is Phase.PENDING and now.get(rid, rk)[0] == rk[0]
        if _surged(old.replicas.get(rid), new.replicas.get(rid)) or _blue_green_move(old, rid, new):
            continue  # (a rollout's surged predecessor: its successor took its ranks, it drains on a spare one)
        if rid in now and now[rid] != rk and not placed:  # (a waiting replica may get its node meanwhile)
            _fail(f"{name}: upscale {old.target}->{new.target} changed {rid} from {rk} to {now[rid]}")


def check_rank_changes_reconfigured(before: State, event: object, result: Step) -> None:
    """Every placed replica whose rank changed (any level) gets exactly one
    rank reconfigure, carrying the new rank; nobody else gets one, except a
    replica whose rank update was due since a recovery (it gets it when ready)."""
    if isinstance(event, ControllerRecovered):
        return
    was, now = _views(before), _views(result.state)
    sent = Counter(
        (c.deployment, c.replica_id) for c in result.commands if isinstance(c, ReconfigureReplica) and c.reason == "rank"
    )
    for (dep, rid), n in sent.items():
        if n != 1:
            _fail(f"{dep}/{rid} got {n} rank reconfigures in one step")
    for name, ranks in now.items():
        before_dep, dep = before.deployments.get(name), result.state.deployments[name]
        for rid, rk in ranks.items():
            old = was.get(name, {}).get(rid)
            _check_rank_change(before_dep, dep, rid, old is not None and old[1] is not None and old != rk,
                               sent, old, rk)
    for c in result.commands:
        if isinstance(c, ReconfigureReplica):
            rep = result.state.deployments[c.deployment].replicas[c.replica_id]
            # (a blue made in the same step keeps what its reconfigure told it: rankcore.control.bluegreen)
            r, nr, lr = rep.blue_ranks if rep.blue_ranks is not None else now[c.deployment][c.replica_id]
            if c.rank.as_tuple() != (r, nr, lr):
                _fail(f"reconfigure of {c.replica_id} carries {c.rank}, its rank is {(r, nr, lr)}")


def _check_rank_change(old: Deployment | None, new: Deployment, rid: str, changed: bool, sent: Counter,
                       was: object, now: object) -> None:
    """The one rule of both rank-change checks (whole state and touched
    replicas): a placed replica whose rank ``changed`` in the step gets one
    rank reconfigure, and one that did not change gets none. Except: a
    replica that was only reserved (PENDING, never initialised) was not told
    its rank yet; a FAILED one has no process (it was stopped; it is told its
    rank when restarted); a replica whose rank update was due since a
    recovery may get it without a change; a rollout's surged predecessor
    (stopping, its lineage handed to the successor that took its ranks:
    ``rankcore.control.rollouts.surge``) drains on a spare rank it is not told; a blue-green's
    blue serves on a spare entry what it was told (``Replica.blue_ranks``), and is told again
    only if taking its ranks back moved it; a green stopped then drains on a spare entry
    (``rankcore.control.bluegreen``)."""
    rep_before = old.replicas.get(rid) if old is not None else None
    if rep_before is not None and rep_before.phase is Phase.PENDING:
        changed = False
    rep = new.replicas.get(rid)
    if rep is not None and rep.phase is Phase.FAILED:
        changed = False
    if _surged(rep_before, rep):
        changed = False
    if rep is not None and rep.blue_ranks is not None:
        changed = False  # a blue-green's blue: it serves the ranks it was told, on a spare entry
    elif rep_before is not None and rep_before.blue_ranks is not None and rep is not None:
        # back on its ranks when the switch is called off (told if they moved, unless stopped in the same
        # step), or stopped by the switch on its spare entry (not told)
        changed = was != now and now != rep_before.blue_ranks and rep.phase is not Phase.STOPPING
    elif old is not None and old.blues and rep_before is not None and rep is not None \
            and rep.phase is Phase.STOPPING and rep_before.phase is not Phase.STOPPING:
        changed = False  # a green stopped as the switch is called off: it drains on a spare entry
    due = rep_before is not None and rep_before.rank_update_due
    if changed != ((new.name, rid) in sent) and not (due and not changed):
        _fail(f"{new.name}/{rid}: rank {was} -> {now}, rank reconfigures sent: {sent.get((new.name, rid), 0)}")


def check_compaction_minimal(before: State, event: object, result: Step) -> None:
    """A compaction changes exactly the lower-bound number of ranks, per level."""
    for comp in result.compactions:
        lb = comp.lower_bound
        moved = list(comp.changes)
        per = (
            sum(a.old.rank != a.new.rank for a in moved),
            sum(a.old.node_rank != a.new.node_rank for a in moved),
            sum(a.old.local_rank != a.new.local_rank for a in moved),
        )
        if len(moved) != lb.replicas or per != (lb.rank, lb.node_rank, lb.local_rank):
            _fail(f"{comp.deployment}: compaction changed {len(moved)} replicas {per}, lower bound {lb}")
        dep = result.state.deployments[comp.deployment]
        # (``rank_moves="restart"``: a moved replica's successor waiting for a node holds only its global
        # rank until it is placed; the global ranks are contiguous already)
        waiting = any(dep.ranks.node_of(rid) is None for rid in _successors_of_moved(comp, result))
        if not (dep.ranks.lower_bound().rank == 0 if waiting else dep.ranks.is_contiguous()):
            _fail(f"{comp.deployment}: still not contiguous after compaction")


def check_new_replicas_take_lowest_free(before: State, event: object, result: Step) -> None:
    """New replicas (not crash replacements) take the lowest free global rank,
    and, once placed, the lowest free node rank (a node new to the deployment)
    and local rank on their node."""
    new_ranks: dict[str, list[int]] = {}
    held = before.cluster.delayed  # (held for its gang, rankcore.control.moves.hold: it took its rank then)
    for c in result.commands:
        if isinstance(c, StartReplica) and c.replaces is None and c.replica_id not in held:
            new_ranks.setdefault(c.deployment, []).append(c.global_rank)
    for name, ranks in new_ranks.items():
        free = result.state.deployments[name].ranks.lowest_free()
        if free < max(ranks):
            _fail(f"{name}: new replicas took global ranks {sorted(ranks)} while rank {free} was free")
    placed = _placement(before, event, result)
    if placed is None or placed.inherits:
        return
    if placed.rank.node_rank != placed.node_rank_allowed:
        _fail(f"{placed.name}: {placed.rid} placed on {placed.node!r} got node rank {placed.rank.node_rank}, "
              f"expected {placed.node_rank_allowed}")
    if placed.rank.local_rank != placed.lowest_local:
        _fail(f"{placed.name}: {placed.rid} placed on {placed.node!r} got local rank {placed.rank.local_rank}, "
              f"the lowest free is {placed.lowest_local}")


def check_crash_replacement_inherits_all_ranks(before: State, event: object, result: Step) -> None:
    """A crash replacement placed on its predecessor's node inherits all three
    ranks: the global rank (at the crash, ``check_crash_inherits_rank``), and
    the node and local ranks where still free (the seed: a restarted replica
    keeps its rank). On another node it is placed like any new replica."""
    placed = _placement(before, event, result)
    if placed is None or placed.preference is None:
        return
    _node, want_nr, want_local = placed.preference
    if not placed.inherits:
        if placed.rank.local_rank != placed.lowest_local:
            _fail(f"{placed.name}: replacement {placed.rid} placed on another node {placed.node!r} got local rank "
                  f"{placed.rank.local_rank}, the lowest free is {placed.lowest_local}")
        return
    if want_local not in placed.taken_locals and placed.rank.local_rank != want_local:
        _fail(f"{placed.name}: replacement {placed.rid} placed back on {placed.node!r} got local rank "
              f"{placed.rank.local_rank}, its predecessor's was {want_local} and is free")
    if not placed.node_held and want_nr not in placed.node_ranks and placed.rank.node_rank != want_nr:
        _fail(f"{placed.name}: replacement {placed.rid} placed back on {placed.node!r} got node rank "
              f"{placed.rank.node_rank}, its predecessor's was {want_nr} and is free")


@attrs.frozen
class _Placed:
    """What a ReplicaPlaced step did, for the placement rules."""

    name: str
    rid: str
    node: str
    rank: ReplicaRank
    preference: tuple | None
    inherits: bool
    taken_locals: frozenset
    node_ranks: frozenset
    node_held: bool
    lowest_local: int
    node_rank_allowed: int


def _placement(before: State, event: object, result: Step) -> _Placed | None:
    if not isinstance(event, ReplicaPlaced) or result.stale:
        return None
    name = before.index.get(event.replica_id)
    if name is None:
        return None
    dep_before, dep = before.deployments[name], result.state.deployments.get(name)
    if dep is None or event.replica_id not in dep.replicas:
        return None
    rank = dep.ranks.rank_of(event.replica_id)
    if rank is None or event.replica_id not in dep_before.ranks or dep_before.ranks.rank_of(event.replica_id):
        return None  # not placed by this step
    table = dep_before.ranks
    taken = table.local_ranks_on(event.node_id)
    held = table.node_rank(event.node_id)
    node_ranks = frozenset(table.nodes().values()) if held is None else frozenset()
    pref = table.preferences().get(event.replica_id)
    lowest_node = min(set(range(len(node_ranks) + 1)) - node_ranks) if held is None else held
    return _Placed(
        name=name, rid=event.replica_id, node=event.node_id, rank=rank, preference=pref,
        inherits=pref is not None and pref[0] == event.node_id, taken_locals=taken, node_ranks=node_ranks,
        node_held=held is not None, lowest_local=min(set(range(len(taken) + 1)) - taken),
        node_rank_allowed=held if held is not None else lowest_node,
    )


def check_placements(before: State, event: object, result: Step) -> None:
    """Every PlaceReplica names a live node the replica fits on (its needed
    resources still >= 0 free there after the step) and has not failed on,
    gives the rank the replica now holds, and no replica of the same kind that
    waited longer is still waiting (first come, first served)."""
    places = [c for c in result.commands if isinstance(c, PlaceReplica)]
    if not places:
        return
    cl = result.state.cluster
    order = [rid for rid in before.cluster.queue if rid in before.cluster.queued]
    order += [c.replica_id for c in result.commands if isinstance(c, StartReplica)]
    pos = {rid: i for i, rid in enumerate(order)}
    for c in places:
        if c.group is not None:  # static placement: on its rank's bundles, whatever the cluster model says
            dep = result.state.deployments[c.deployment]
            g = c.rank.rank
            if dep.static is None or (c.group, c.bundles, c.node_id) != (
                    dep.static.group, dep.static.bundles_of(g), dep.static.node_of(g)):
                _fail(f"{c.replica_id}: PlaceReplica on {c.group!r} bundles {c.bundles} at {c.node_id!r} is not "
                      f"rank {g}'s static placement")
            if dep.ranks.rank_of(c.replica_id) != c.rank:
                _fail(f"{c.replica_id}: PlaceReplica says rank {c.rank}, the table {dep.ranks.rank_of(c.replica_id)}")
            continue
        node = cl.nodes.get(c.node_id)
        if node is None:
            raise InvariantViolation(f"{c.replica_id} placed on {c.node_id!r}, which is not a live node")
        for k, _v in c.resources:
            if node.free.get(k, 0.0) < -1e-6:
                _fail(f"{c.replica_id} placed on {c.node_id!r}, which has {node.free.get(k, 0.0)} {k} left")
        if c.node_id in cl.avoid.get(c.replica_id, ()):
            _fail(f"{c.replica_id} placed on {c.node_id!r}, where its placement failed")
        dep = result.state.deployments[c.deployment]
        if dep.ranks.rank_of(c.replica_id) != c.rank:
            _fail(f"{c.replica_id}: PlaceReplica says rank {c.rank}, the table {dep.ranks.rank_of(c.replica_id)}")
        p = pos.get(c.replica_id)
        if p is not None and dep.gang_size > 1:  # a gang's place in line is its first waiting member's
            k = dep.gang_size
            g = c.rank.rank // k
            mates = (dep.ranks.holder_of(r) for r in range(g * k, (g + 1) * k))
            p = min(pos[m] for m in mates if m in pos)
        if p is None or isinstance(event, ControllerRecovered):
            continue  # re-placed after a failure (first in line on purpose), or a new queue (recovery)
        kind = (dep.resources, cl.avoid.get(c.replica_id, ()))
        for rid in cl.queued:
            q = pos.get(rid)
            if q is not None and q < p and cl.queued[rid] == kind:
                _fail(f"{c.replica_id} was placed while {rid}, of the same need and waiting longer, still waits")


def _successors_of_moved(comp: Any, result: Step) -> set[str]:
    """``rank_moves="restart"``: the replicas this step started in place of those ``comp`` moved (each
    on its predecessor's new ranks, rankcore.control.moves.compact); none otherwise."""
    moved = {a.replica for a in comp.changes}
    return {c.replica_id for c in result.commands if isinstance(c, StartReplica) and c.replaces in moved}


def check_compact_only_when_healthy(before: State, event: object, result: Step) -> None:
    """Ranks are compacted only once the deployment is healthy: every other
    replica running and the count at the target (the seed's rule)."""
    for comp in result.compactions:
        dep = result.state.deployments[comp.deployment]
        moved = {str(a.replica) for a in comp.changes}
        successors = _successors_of_moved(comp, result)
        if len(dep.replicas) != dep.target:
            _fail(f"{comp.deployment}: compacted with {len(dep.replicas)} replicas, target {dep.target}")
        for rid, rep in dep.replicas.items():
            if rep.phase is not Phase.RUNNING and not (rep.phase is Phase.RECONFIGURING and rid in moved) and not (
                    rep.phase in (Phase.PENDING, Phase.STARTING) and rid in successors):
                _fail(f"{comp.deployment}: compacted while {rid} was {rep.phase.value}")


def check_command_order(before: State, event: object, result: Step) -> None:
    """Within one step, per deployment: replicas are started in ascending global
    rank (a lost node's replicas are replaced in rank order; the replacements of
    replicas evicted at the end of the step are a batch of their own, and so are
    a rollout's surged successors, started by its end-of-step pass beside their
    draining predecessors, and what that pass starts after the retirements it
    sends: the held gangs it releases, ``moves.start_waiting``), and reconfigured
    and initialised in ascending rank.
    Executors carry commands out in order, so a wrapper that reorders them
    changes who gets what first."""
    last: dict[tuple[str, str], int] = {}
    evicting = False
    surging: set[str] = set()
    after = result.state
    for c in result.commands:
        if isinstance(c, EvictReplica) and not evicting:
            # the evictions the step chose come after its own work (rankcore.control.evictions): their
            # victims' replacements are a batch of their own, in ascending rank too
            evicting = True
            last = {k: v for k, v in last.items() if k[0] != "start"}
        if (isinstance(c, StartReplica) and c.deployment not in surging and c.replaces is not None
                and after.replica(c.replaces) is not None):  # (rankcore.control.rollouts.surge)
            surging.add(c.deployment)
            last.pop(("start", c.deployment), None)
        if isinstance(c, StopReplica) and (gone := after.replica(c.replica_id)) is not None and gone.retiring:
            last.pop(("start", c.deployment), None)  # (the rollout's pass: rollouts.advance_touched)
        if isinstance(c, StartReplica):
            key, r = ("start", c.deployment), c.global_rank
        elif isinstance(c, (ReconfigureReplica, InitializeReplica)):
            key, r = (type(c).__name__, c.deployment), c.rank.rank
        else:
            continue
        if r <= last.get(key, -1):
            _fail(f"{key[1]}: {type(c).__name__} for rank {r} comes after one for rank {last[key]} in one step")
        last[key] = r


def check_gangs_told(before: State, event: object, result: Step) -> None:
    """A gang member started while others of its gang keep running: those are
    told the new members (``GangChanged``, as the new member's ``gang`` lists
    them), or they would talk to a member that is gone."""
    started: dict[tuple[str, str], tuple[set[str], tuple[str, ...]]] = {}
    for c in result.commands:
        if isinstance(c, StartReplica) and c.gang is not None:
            ids, _ = started.get((c.deployment, c.gang.gang_id), (set(), ()))
            started[c.deployment, c.gang.gang_id] = ({*ids, c.replica_id}, c.gang.members)
    told = {(c.deployment, c.gang_id): c.members for c in result.commands if isinstance(c, GangChanged)}
    for key, (ids, members) in sorted(started.items()):
        if set(members) - ids and told.get(key) != members:
            _fail(f"{key[0]}: gang {key[1]} got new members {sorted(ids)}, but its others were not told "
                  f"(GangChanged with members {list(members)}; sent: {told.get(key)})")


def check_groups(before: State, event: object, result: Step) -> None:
    """Collective groups (rankcore.control.groups): an epoch never falls, and members never change
    without it rising; a rise tells every member of the new epoch once (``ReformGroup``), all
    agreeing on the epoch, world size and ranks, each on its own rank, each up (running) and holding
    that rank; the previous epoch and rank each is told are the group's before the step. (A
    recovery rebuilds its groups from the reports: it may start at any epoch without telling.)"""
    sent: dict[tuple[str, str], list[ReformGroup]] = {}
    for c in result.commands:
        if isinstance(c, ReformGroup):
            sent.setdefault((c.deployment, c.group.group_id), []).append(c)
    recovering = isinstance(event, ControllerRecovered)
    for name, dep in result.state.deployments.items():
        old = before.deployments.get(name)
        old_groups = old.groups if old is not None else None
        if dep.groups is old_groups or (not dep.groups and not old_groups):
            continue
        for gid, g in dep.groups.items():
            prior = old_groups.get(gid) if old_groups is not None else None
            if prior is not None and not recovering:
                if g.epoch < prior.epoch:
                    _fail(f"{name}: group {gid}'s epoch fell {prior.epoch} -> {g.epoch}")
                if g.epoch == prior.epoch and (g.members, g.told) != (prior.members, prior.told):
                    _fail(f"{name}: group {gid}'s members changed within epoch {g.epoch}: "
                          f"{list(prior.members)} -> {list(g.members)}")
            rose = g.epoch > (prior.epoch if prior is not None else 0)
            if rose and not recovering and (name, gid) not in sent:
                _fail(f"{name}: group {gid} rose to epoch {g.epoch} and no member was told (ReformGroup)")
    for (name, gid), cmds in sorted(sent.items()):
        dep = result.state.deployments.get(name)
        g = dep.groups.get(gid) if dep is not None else None
        if dep is None or g is None:
            _fail(f"{name}: ReformGroup for group {gid}, which the state does not hold")
            return
        old = before.deployments.get(name)
        prior = old.groups.get(gid) if old is not None else None
        if prior is not None and g.epoch <= prior.epoch:
            _fail(f"{name}: ReformGroup for group {gid} at epoch {g.epoch}, not above {prior.epoch}")
        told = [c.replica_id for c in cmds]
        if sorted(told) != sorted(g.members) or len(set(told)) != len(told):
            _fail(f"{name}: group {gid} epoch {g.epoch} told {told}; its members are {list(g.members)} (each once)")
        base = min((dep.ranks.global_rank(m) for m in g.members), default=0)
        for c in cmds:
            ctx = c.group
            if (ctx.epoch, ctx.members, ctx.world_size) != (g.epoch, g.members, len(g.members)):
                _fail(f"{name}: {c.replica_id} told epoch {ctx.epoch} of {list(ctx.members)} (world "
                      f"{ctx.world_size}); the group's epoch {g.epoch} has {list(g.members)}")
            if g.members[ctx.rank] != c.replica_id:
                _fail(f"{name}: {c.replica_id} told rank {ctx.rank} in group {gid}, held by {g.members[ctx.rank]}")
            rep = dep.replicas.get(c.replica_id)
            if rep is None or rep.phase not in (Phase.RUNNING, Phase.RECONFIGURING):
                _fail(f"{name}: {c.replica_id} told group {gid}'s epoch {g.epoch} while not running "
                      f"({rep.phase.value if rep is not None else 'gone'}): a re-form waits for every member")
                return
            if dep.ranks.global_rank(c.replica_id) != base + ctx.rank:
                _fail(f"{name}: {c.replica_id} holds global rank {dep.ranks.global_rank(c.replica_id)}, told rank "
                      f"{ctx.rank} of group {gid} (from {base})")
            was = prior.members.index(c.replica_id) if prior is not None and c.replica_id in prior.members else None
            if recovering:  # (the group before the re-form is the one rebuilt from the reports, not ``before``'s)
                was = ctx.previous_rank
            if (ctx.previous_epoch, ctx.previous_rank) != (g.epoch - 1, was):
                _fail(f"{name}: {c.replica_id} told previous epoch/rank ({ctx.previous_epoch}, {ctx.previous_rank}); "
                      f"the group's were ({g.epoch - 1}, {was})")


def check_gang_downscale_whole(before: State, event: object, result: Step) -> None:
    """A step that lowers a gang deployment's target takes whole gangs out of service
    (``moves.stop``), or a member would wait on mates that are gone: of each gang's members
    active before (not stopping), it stops or removes all or none. Not taken: a member retired
    by a rollout, or succeeded on its rank (a crash's or restart's replacement: its lineage
    lives on). A recovery settles its stops from the reports (``recovery``): not checked here.
    Costs O(replicas) of such a deployment only, as the core's choice of them does."""
    if isinstance(event, ControllerRecovered):
        return
    for name, dep in result.state.deployments.items():
        old = before.deployments.get(name)
        if old is None or old is dep or old.gang_size <= 1 or dep.target >= old.target:
            continue
        k = old.gang_size
        lives_on = {r.lineage for rid, r in dep.replicas.items() if rid not in old.replicas}
        taken: dict[int, list[str]] = {}
        kept: dict[int, list[str]] = {}
        for rid, rep in old.replicas.items():
            if rep.phase is Phase.STOPPING:
                continue
            now = dep.replicas.get(rid)
            g = old.ranks.global_rank(rid) // k
            if now is not None and now.phase is not Phase.STOPPING:
                kept.setdefault(g, []).append(rid)
            elif not (now is not None and now.retiring) and rep.lineage not in lives_on:
                taken.setdefault(g, []).append(rid)
        for g in sorted(taken.keys() & kept.keys()):
            _fail(f"{name}: {type(event).__name__} lowered the target {old.target} -> {dep.target} and took "
                  f"{sorted(taken[g])} of gang {g} out of service, but kept {sorted(kept[g])} (gangs stop whole)")


def check_spares_told(before: State, event: object, result: Step) -> None:
    """An executor that carried out every ``KeepSpareProcesses`` so far keeps
    spare processes exactly where each deployment wants them
    (``spare_processes`` on every node holding one of its replicas, none
    elsewhere): the step's commands take the counts wanted before to those
    wanted after (``rankcore.placement.spares.wanted``: O(nodes) per deployment the step
    changed), and none repeats a count already told."""
    cmds: dict[str, list[KeepSpareProcesses]] = {}
    for c in result.commands:
        if isinstance(c, KeepSpareProcesses):
            cmds.setdefault(c.deployment, []).append(c)
    after_deps = result.state.deployments
    for name in sorted(set(before.deployments.keys()) | set(after_deps.keys())):
        old, new = before.deployments.get(name), after_deps.get(name)
        if old is new and name not in cmds:
            continue
        told = spares.wanted(old)
        for c in cmds.get(name, ()):
            if told.get(c.node_id, 0) == c.count:
                _fail(f"{name}: KeepSpareProcesses(node_id={c.node_id!r}, count={c.count}) repeats what "
                      f"the executor was already told")
            if c.count:
                told[c.node_id] = c.count
            else:
                told.pop(c.node_id, None)
        want = spares.wanted(new)
        if told != want:
            _fail(f"{name}: spare processes wanted {dict(sorted(want.items()))}, but the executor was told "
                  f"{dict(sorted(told.items()))} after {type(event).__name__}")


def touched_replicas(event: object, result: Step) -> dict[str, set[str]]:
    """Deployment -> replica ids the step may have changed: the event's replica,
    every replica a command or a compaction names (a crash replacement's
    predecessor included)."""
    out: dict[str, set[str]] = {}
    for c in result.commands:
        rid = getattr(c, "replica_id", None)
        if rid is not None:
            out.setdefault(c.deployment, set()).add(rid)
        if isinstance(c, StartReplica) and c.replaces is not None:
            out[c.deployment].add(c.replaces)
    for comp in result.compactions:
        out.setdefault(comp.deployment, set()).update(str(a.replica) for a in comp.changes)
    rid = getattr(event, "replica_id", None)
    if rid is not None:
        in_dep = result.state.index.get(rid)
        if in_dep is not None:
            out.setdefault(in_dep, set()).add(rid)
    return out


def check_touched(before: State, event: object, result: Step) -> None:
    """The state invariants, for what the step touched (cost: the step's size,
    not the deployment's): touched replicas are ranked consistently, removed
    ones hold nothing, the phase counts and sizes add up, a healthy deployment
    is contiguous (O(1) counters)."""
    after = result.state
    touched = touched_replicas(event, result)
    rid = getattr(event, "replica_id", None)
    if rid is not None and rid in before.index:
        touched.setdefault(before.index[rid], set()).add(rid)
    if before.cluster.delayed is not after.cluster.delayed:  # waiting out a restart backoff: no command names them
        for st in (before, after):
            for rid in st.cluster.delayed:
                touched.setdefault(st.index[rid], set()).add(rid)
    for name, dep in after.deployments.items():
        old = before.deployments.get(name)
        if old is dep:
            continue
        if len(dep.ranks) != len(dep.replicas):
            _fail(f"{name}: {len(dep.ranks)} ranks held by {len(dep.replicas)} replicas")
        if sum(dep.counts) != len(dep.replicas) or min(dep.counts) < 0:
            _fail(f"{name}: phase counts {dep.counts} do not add up to {len(dep.replicas)} replicas")
        if dep.healthy and not dep.ranks.is_contiguous():
            _fail(f"{name} is healthy but its ranks are not contiguous")
        ids = touched.get(name, set())
        delta = [0] * len(LIVE)
        for rid in ids:
            if old is not None and rid in old.replicas:
                delta[LIVE.index(old.replicas[rid].phase)] -= 1
            rep = dep.replicas.get(rid)
            if rep is None:
                if rid in dep.ranks or after.index.get(rid) == name:
                    _fail(f"{name}: {rid} left but still holds a rank or an index entry")
                continue
            delta[LIVE.index(rep.phase)] += 1
            if after.index.get(rid) != name:
                _fail(f"{name}: replica {rid!r} is missing from the replica index")
            if rid not in dep.ranks:
                _fail(f"{name}: replica {rid!r} holds no rank")
            g = dep.ranks.global_rank(rid)
            if dep.ranks.holder_of(g) != rid:
                _fail(f"{name}: {rid} holds global rank {g}, which the table gives {dep.ranks.holder_of(g)!r}")
            _check_static_rank(dep, rid, rep, g)
            _check_node_ranks(dep, rid, rep, dep.ranks.node_of(rid), after.cluster.held)
        if old is not None:
            want = tuple(a + d for a, d in zip(old.counts, delta))
            if want != dep.counts:
                _fail(f"{name}: phase counts {old.counts} -> {dep.counts}, but the touched replicas say {want}")


def _check_rank_changes_touched(before: State, event: object, result: Step) -> None:
    """``check_rank_changes_reconfigured`` restricted to the touched replicas."""
    if isinstance(event, ControllerRecovered):
        return
    sent = Counter(
        (c.deployment, c.replica_id) for c in result.commands if isinstance(c, ReconfigureReplica) and c.reason == "rank"
    )
    for (name, rid), n in sent.items():
        if n != 1:
            _fail(f"{name}/{rid} got {n} rank reconfigures in one step")
    for name, ids in touched_replicas(event, result).items():
        old, new = before.deployments.get(name), result.state.deployments.get(name)
        if old is None or new is None or old is new:
            continue
        for rid in ids:
            if rid not in old.ranks or rid not in new.ranks:
                continue
            was, now = old.ranks.rank_of(rid), new.ranks.rank_of(rid)
            _check_rank_change(old, new, rid, was is not None and was != now, sent, was, now)
    for c in result.commands:
        if isinstance(c, ReconfigureReplica):
            rk = result.state.deployments[c.deployment].ranks.rank_of(c.replica_id)
            if c.rank != rk:
                _fail(f"reconfigure of {c.replica_id} carries {c.rank}, its rank is {rk}")


def check_step(before: State, event: object, result: Step, *, full: bool = False) -> None:
    """Every step invariant.

    By default the checks cost what the step touched (the replicas its event,
    commands and compactions name, O(1) aggregates for the rest), so they can
    stay on in a real controller. ``full=True`` adds every state invariant over
    the whole new state and the whole-deployment comparisons (what the
    property machines run); a recovery and a node loss (which already cost the
    core a whole scan, and may remove replicas no command names) are always
    checked in full.
    """
    now = getattr(event, "now", None)
    if now is not None and not isinstance(event, Tick):
        from .base.cluster import clock_work_due
        from .core import step as core_step

        cl = before.cluster
        if (not cl.clock or now > cl.now) and clock_work_due(cl, now):
            # The step is Tick(now) then the event: check each part as the step it is.
            first = core_step(before, Tick(now=now))
            k = len(first.commands)
            if tuple(result.commands[:k]) != first.commands:
                _fail(f"{type(event).__name__} with now={now}: its first commands are not those of Tick(now={now})")
            check_step(before, Tick(now=now), first, full=full)
            second = attrs.evolve(result, commands=tuple(result.commands[k:]),
                                  compactions=tuple(result.compactions[len(first.compactions):]))
            check_step(first.state, event, second, full=full)  # (the clock is at ``now``: no split again)
            return
    full = full or isinstance(event, (ControllerRecovered, NodeLost, NodeJoined, NodeCapacityChanged))
    if full:
        check_state(result.state)
    else:
        check_touched(before, event, result)
        if result.state.proxies is not before.proxies:
            check_proxies(result.state)  # (O(nodes): only where the step changed them)
    check_world_size_commands(before, event, result)
    check_rollout_pace(before, event, result)
    check_crash_inherits_rank(before, event, result)
    check_new_replicas_take_lowest_free(before, event, result)
    check_crash_replacement_inherits_all_ranks(before, event, result)
    check_compact_only_when_healthy(before, event, result)
    check_command_order(before, event, result)
    check_gangs_told(before, event, result)
    check_groups(before, event, result)
    check_gang_downscale_whole(before, event, result)
    check_spares_told(before, event, result)
    check_placements(before, event, result)
    if full:
        check_upscale_keeps_ranks(before, event, result)
        check_rank_changes_reconfigured(before, event, result)
    else:
        _check_rank_changes_touched(before, event, result)
    check_compaction_minimal(before, event, result)


# ----------------------------------------------------------------- recovery
def reports_from(state: State) -> ControllerRecovered:
    """The recovery event this state's own live replicas and configs would give
    (a pending replica reports no node: a reservation is not a placement)."""
    deployments = desired_specs(state)
    reports = []
    for name in sorted(state.deployments.keys()):
        dep = state.deployments[name]
        snap = dep.ranks.to_dict()
        told = _group_reports(dep)
        for rid in sorted(dep.replicas.keys()):
            rep = dep.replicas[rid]
            if rep.phase is Phase.FAILED:
                continue  # no process: its bundles' node is gone
            r, node, nr, lr = snap[rid]
            if rep.blue_ranks is not None:  # (a blue-green's blue says what it was told)
                r, nr, lr = rep.blue_ranks
            if rep.phase is Phase.PENDING:
                node = None
            rank: Any = r if node is None else ReplicaRank(rank=r, node_rank=nr, local_rank=lr)
            reports.append(
                ReplicaReport(
                    replica_id=rid,
                    deployment=name,
                    rank=rank,
                    node_id=node,
                    phase=rep.phase,
                    world_size=dep.target,
                    lineage=rep.lineage,
                    version=rep.version,
                    user_config=dep.user_config if rep.config_version >= dep.config_version else OUTDATED,
                    # where its weights are (a move in flight: where they were) and the version it was given
                    tier="warm" if rep.residency in (Residency.WARM, Residency.LOADING) else "hot",
                    weights_version=rep.weights_version,
                    devices=state.cluster.hot[rid][1].devices if rid in state.cluster.hot else (),
                    revision=rep.revision,
                    models=rep.models,
                    **told.get(rid, {}),
                )
            )
    nodes = sorted(state.cluster.nodes.values(), key=lambda n: n.order)
    return ControllerRecovered(
        deployments=tuple(deployments), reports=tuple(reports), next_replica_number=state.next_replica,
        asleep=desired_asleep(state), weights_versions=desired_weights(state), no_evict=desired_no_evict(state),
        deleted=desired_deleted(state),
        warm_copies=tuple(WarmCopy(node_id=n, deployment=e.deployment, replica_id=e.replica_id or "",
                                   nbytes=e.nbytes) for n, cache in state.cluster.caches.items() for e in cache),
        next_lineage=state.next_lineage,
        nodes=tuple(NodeJoined(node_id=n.node_id, resources=tuple(n.resources.items()), labels=n.labels,
                               order=n.order[0] if n.order[0] != float("inf") else None,
                               devices=tuple(d.memory for d in state.cluster.devices.get(n.node_id, ())),
                               cpu_cache_bytes=state.cluster.cache_budget.get(n.node_id, 0)) for n in nodes),
        **proxies_from(state))


def _group_reports(dep: Deployment) -> dict[str, dict[str, Any]]:
    """What each member of ``dep``'s collective groups reports: the epoch it was last told."""
    return {rid: {"group_id": gid, "group_epoch": g.epoch, "group_members": g.members}
            for gid, g in dep.groups.items() for rid in g.members}


def proxies_from(state: State) -> dict[str, Any]:
    """``ControllerRecovered``'s proxy fields this state gives: its config, the proxies that
    run (not those waiting out a backoff: nothing runs) and the next proxy number."""
    book = state.proxies
    if book.options is None:
        return {}
    return {"proxies": ProxiesConfigured(options=book.options, head_node=book.head),
            "proxy_ids": tuple(p.proxy_id for _, p in sorted(book.proxies.items()) if p.phase is not ProxyPhase.BACKOFF),
            "next_proxy_number": book.started}


def check_recovery_roundtrip(state: State, step_fn: Any = None) -> None:
    """Recovering from the state's own reports gives the same ranks, phases and
    targets, and no command but placing again the pending replicas the core
    had reserved a node for (their reservation is not a placement), asking
    for a Tick (the starting ones get a fresh start timeout), telling the
    new controller where to keep spare processes (it knows none yet) and
    sending again a sleep or a wake that was in flight or failed."""
    from .core import step as core_step

    result = (step_fn or core_step)(State(cluster=attrs.evolve(State().cluster, now=state.cluster.now,
                                                              clock=state.cluster.clock)),
                                    reports_from(state))

    cl = state.cluster
    if cl.devices and any(dep.config.tier.model_bytes and r.phase is Phase.PENDING
                          for dep in state.deployments.values() for r in dep.replicas.values()):
        # a replica of a model booked by memory (rankcore.tiers.devices) waits or is not placed yet: the new
        # controller chooses its room again with what it knows (no claims, no failed placements, every
        # replica just HOT), maybe elsewhere or by evicting: a new decision, not a round trip
        # (check_step checks the result)
        for name, dep in state.deployments.items():
            if result.state.deployments[name].target != dep.target:
                _fail(f"{name}: recovery changed the target {dep.target} -> {result.state.deployments[name].target}")
        return

    def settled(s: State) -> dict:
        # (a blue's spare entry is the controller's own: it is known by the ranks it was told)
        return {name: {rid: (("blue", dep.replicas[rid].blue_ranks) if dep.replicas[rid].blue_ranks is not None
                             else v if dep.replicas[rid].phase is not Phase.PENDING else (v[0], None, None))
                       for rid, v in rank_view(dep).items()} for name, dep in s.deployments.items()}

    if settled(result.state) != settled(state):
        _fail(f"recovery from own reports changed ranks: {_views(state)} -> {_views(result.state)}")
    for name, dep in state.deployments.items():
        got = result.state.deployments[name]
        if got.target != dep.target:
            _fail(f"{name}: recovery changed the target {dep.target} -> {got.target}")
        phases = {rid: r.phase for rid, r in got.replicas.items()}
        if phases != {rid: r.phase for rid, r in dep.replicas.items()}:
            _fail(f"{name}: recovery changed phases")
        if (got.asleep, got.weights_version) != (dep.asleep, dep.weights_version):
            _fail(f"{name}: recovery changed asleep/weights version ({dep.asleep}, {dep.weights_version}) -> "
                  f"({got.asleep}, {got.weights_version})")
    # a sleep or a wake in flight, or one that failed, is sent again: the replica reported where its
    # weights were, and its deployment is still meant to sleep (or to be awake)
    moving = {(r.replica_id, OffloadReplica if dep.asleep else LoadReplica)
              for dep in state.deployments.values() for r in dep.replicas.values()
              if r.residency is not (Residency.WARM if dep.asleep else Residency.HOT)}
    # (a RequestResources re-tells the demand of the queue rebuilt: it replaces whatever was asked before)
    # the proxies: each that ran is the core's again on its node, told whether it serves or drains
    # (``DrainProxy``), a node whose proxy waited out a backoff starts one (nothing ran there to report). (A
    # pending replica placed anew may land elsewhere: where proxies are wanted may change with it,
    # and check_proxies holds the result to that.)
    book, got = state.proxies, result.state.proxies
    moved = wanted(book, state.cluster.nodes) ^ wanted(got, result.state.cluster.nodes)
    for n, p in book.proxies.items():
        q = got.proxies.get(n)
        if p.phase is not ProxyPhase.BACKOFF and q is not None and q.proxy_id != p.proxy_id:
            _fail(f"recovery from own reports replaced proxy {p.proxy_id!r} by {q.proxy_id!r}")
    again: set[tuple[Any, type]] = {(p.proxy_id, DrainProxy) for p in book.proxies.values()}  # (told again)
    again |= {(n, StartProxy) for n, p in book.proxies.items() if p.phase is ProxyPhase.BACKOFF}
    again |= {(n, c) for n in moved for c in (StartProxy, DrainProxy, StopProxy)}
    others = [c for c in result.commands
              if not isinstance(c, (PlaceReplica, ScheduleTick, KeepSpareProcesses, RequestResources))
              and (getattr(c, "replica_id", None), type(c)) not in moving
              and (getattr(c, "proxy_id", None), type(c)) not in again
              and (getattr(c, "node_id", None), type(c)) not in again]
    if others:
        _fail(f"recovery from own reports sent commands: {others[:3]}")


# ---------------------------------------------------------------- snapshots
def check_snapshot(snapshot: Mapping[str, Any]) -> None:
    """State invariants over a trace snapshot (the documented JSON form).

    ``snapshot["deployments"]``: name -> {"target", "healthy", "replicas":
    {id: {"phase", "node", "rank": [rank, node_rank, local_rank] or None}}}.
    """
    for name, dep in snapshot["deployments"].items():
        reps = dep["replicas"]
        triples = [(rid, r["node"], r["rank"]) for rid, r in reps.items() if r.get("rank") is not None]
        _check_levels(name, triples, healthy=bool(dep.get("healthy")))
        for rid, r in reps.items():
            if r["phase"] in ("starting", "running", "reconfiguring") and r.get("rank") is None:
                _fail(f"{name}: {r['phase']} replica {rid} has no rank in the snapshot")
        if dep.get("healthy"):
            running = sum(r["phase"] == "running" for r in reps.values())
            if running != dep["target"] or len(reps) != dep["target"]:
                _fail(f"{name}: marked healthy with {running} running of {len(reps)}, target {dep['target']}")


def _check_levels(name: str, triples: Iterable[tuple], healthy: bool) -> None:
    triples = list(triples)
    g = Counter(t[2][0] for t in triples)
    dup = [r for r, c in g.items() if c > 1]
    if dup:
        _fail(f"{name}: global rank {dup[0]} held twice")
    nodes: dict[Any, int] = {}
    for _, node, rk in triples:
        if node is not None and nodes.setdefault(node, rk[1]) != rk[1]:
            _fail(f"{name}: node {node!r} has two node ranks")
    if len(set(nodes.values())) != len(nodes):
        _fail(f"{name}: a node rank is held by two nodes")
    loc = Counter((node, rk[2]) for _, node, rk in triples if node is not None)
    if any(c > 1 for c in loc.values()):
        _fail(f"{name}: a local rank is held twice on one node")
    if healthy:
        if sorted(g) != list(range(len(g))):
            _fail(f"{name}: healthy but global ranks {sorted(g)}")
        if sorted(nodes.values()) != list(range(len(nodes))):
            _fail(f"{name}: healthy but node ranks {sorted(nodes.values())}")
        per: dict[Any, list[int]] = {}
        for _, node, rk in triples:
            per.setdefault(node, []).append(rk[2])
        for node, ls in per.items():
            if sorted(ls) != list(range(len(ls))):
                _fail(f"{name}: healthy but local ranks on {node!r} are {sorted(ls)}")

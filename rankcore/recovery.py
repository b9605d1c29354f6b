"""Controller recovery: rebuild every rank from what live replicas report.

Ranks are not checkpointed (as in Ray Serve); a restarted controller learns
them from the replicas. Reports can disagree (two replicas claiming one rank,
a node reported under two node ranks, more replicas than the target), so
every conflict is resolved by one deterministic rule, and resolved with
commands, never by dropping a replica:

* a rank claimed twice stays with the claimant whose replica id sorts first;
  the others get the lowest free ranks (ReconfigureReplica once running);
* replicas beyond the target are stopped: conflicting ones first, then
  not-yet-running ones, then the highest ranks;
* gaps left by replicas that died meanwhile are the lowest free ranks, so the
  missing replicas are started on them (Ray Serve instead hands out ranks
  above the highest recovered one);
* ranks at or above the target are compacted once the deployment is healthy,
  by the same rule as after a downscale (fewest changes).

Recovering from a state's own reports gives back the same ranks and no
reconfigure (checked by ``rankcore.invariants``).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import attrs

from .commands import InitializeReplica, StopReplica, UpdateWorldSize
from .events import ControllerRecovered, DeploymentApplied, ReplicaReport
from .lifecycle import LIVE, Phase, Trigger, advance
from .ranks import RankTable, ReplicaRank
from .state import Deployment, Replica, parse_replica_number

if TYPE_CHECKING:
    from .core import _Tx

__all__ = ["rebuild"]

_PHASE_ORDER = {Phase.PENDING: 0, Phase.STARTING: 1, Phase.RUNNING: 2, Phase.RECONFIGURING: 2}


def _lowest_free(used: set[int], start: int = 0) -> int:
    r = start
    while r in used:
        r += 1
    return r


def _resolve_global(spec: DeploymentApplied, reports: list[ReplicaReport]) -> tuple[dict[str, int], list[str]]:
    """Final global rank of every report, and the active replicas to stop."""
    active = [r for r in reports if r.phase is not Phase.STOPPING]
    leaving = [r for r in reports if r.phase is Phase.STOPPING]
    final: dict[str, int] = {}
    used: set[int] = set()
    losers: set[str] = set()
    for r in sorted(active, key=lambda r: (r.rank.rank, r.replica_id)):
        if r.rank.rank in used:
            losers.add(r.replica_id)
        else:
            used.add(r.rank.rank)
            final[r.replica_id] = r.rank.rank
    target = spec.num_replicas
    extra = max(0, len(active) - target)

    def victim_key(r: ReplicaReport) -> tuple:
        bad = 0 if r.replica_id in losers else 1 if r.rank.rank >= target else 2
        return (bad, _PHASE_ORDER[r.phase], -r.rank.rank, r.replica_id)

    to_stop = [r.replica_id for r in sorted(active, key=victim_key)[:extra]]
    # Leaving replicas keep their claim when nobody active holds it.
    late = []
    for r in sorted(leaving, key=lambda r: (r.rank.rank, r.replica_id)):
        if r.rank.rank in used:
            late.append(r.replica_id)
        else:
            used.add(r.rank.rank)
            final[r.replica_id] = r.rank.rank
    # Losers that stay get the lowest free ranks, in id order; then the rest.
    stopping = set(to_stop)
    order = sorted(losers - stopping) + sorted(losers & stopping) + late
    nxt = 0
    for rid in order:
        nxt = _lowest_free(used, nxt)
        used.add(nxt)
        final[rid] = nxt
    return final, to_stop


def _resolve_nodes(placed: list[ReplicaReport]) -> dict[str, int]:
    """Final node rank of every node: the rank most of its replicas report."""
    by_node: dict[str, list[ReplicaReport]] = {}
    for r in placed:
        by_node.setdefault(r.node_id, []).append(r)  # type: ignore[arg-type]
    claims: dict[str, int | None] = {}
    for node, rs in by_node.items():
        votes = Counter(r.rank.node_rank for r in rs if r.rank.node_rank is not None)
        claims[node] = min(votes, key=lambda nr: (-votes[nr], nr)) if votes else None
    final: dict[str, int] = {}
    used: set[int] = set()
    unresolved = []
    for node in sorted(by_node, key=lambda n: (claims[n] is None, claims[n] or 0, n)):
        c = claims[node]
        if c is None or c in used:
            unresolved.append(node)
        else:
            used.add(c)
            final[node] = c
    nxt = 0
    for node in unresolved:
        nxt = _lowest_free(used, nxt)
        used.add(nxt)
        final[node] = nxt
    return final


def _resolve_locals(placed: list[ReplicaReport]) -> dict[str, int]:
    by_node: dict[str, list[ReplicaReport]] = {}
    for r in placed:
        by_node.setdefault(r.node_id, []).append(r)  # type: ignore[arg-type]
    final: dict[str, int] = {}
    for rs in by_node.values():
        used: set[int] = set()
        unresolved = []
        for r in sorted(rs, key=lambda r: (r.rank.local_rank is None, r.rank.local_rank or 0, r.replica_id)):
            lr = r.rank.local_rank
            if lr is None or lr in used:
                unresolved.append(r.replica_id)
            else:
                used.add(lr)
                final[r.replica_id] = lr
        nxt = 0
        for rid in unresolved:
            nxt = _lowest_free(used, nxt)
            used.add(nxt)
            final[rid] = nxt
    return final


def _rebuild_deployment(tx: "_Tx", spec: DeploymentApplied, reports: list[ReplicaReport]) -> Deployment:
    from .core import _reconcile, _reconfigure

    final_rank, to_stop = _resolve_global(spec, reports)
    placed = [r for r in reports if r.node_id is not None]
    node_rank = _resolve_nodes(placed)
    local_rank = _resolve_locals(placed)
    ranks = RankTable().recover_many(
        (r.replica_id, r.node_id, ReplicaRank(rank=final_rank[r.replica_id], node_rank=node_rank[r.node_id], local_rank=local_rank[r.replica_id]))  # type: ignore[index]
        for r in placed
    )
    for r in reports:
        if r.node_id is None:
            ranks = ranks.assign(r.replica_id, rank=final_rank[r.replica_id])
    dep = Deployment(
        name=spec.name,
        target=spec.num_replicas,
        user_config=spec.user_config,
        has_reconfigure=spec.has_reconfigure,
        reconfigure_takes_rank=spec.reconfigure_takes_rank,
        ranks=ranks,
        dirty=True,
    )
    counts = [0] * len(LIVE)
    replicas = {}
    stop = set(to_stop)
    changed: list[Replica] = []
    placed_unstarted: list[str] = []
    for r in reports:
        lineage = r.lineage if r.lineage is not None else tx.new_lineage()
        phase = r.phase
        if phase is Phase.PENDING and r.node_id is not None:
            # Placed, but the answer was lost with the old controller: it has
            # not been initialised yet, so initialise it now (as on ReplicaPlaced).
            phase = Phase.STARTING
            if r.replica_id not in stop:
                placed_unstarted.append(r.replica_id)
        rep = Replica(
            replica_id=r.replica_id,
            deployment=spec.name,
            phase=phase,
            lineage=lineage,
            node_id=r.node_id,
            version=r.version,
        )
        if r.node_id is not None and r.phase is not Phase.STOPPING and r.replica_id not in placed_unstarted:
            now = (final_rank[r.replica_id], node_rank[r.node_id], local_rank[r.replica_id])
            said = (r.rank.rank, r.rank.node_rank, r.rank.local_rank)
            if now != said and r.replica_id not in stop:
                if r.phase is Phase.STARTING:
                    rep = attrs.evolve(rep, rank_update_due=True)
                else:
                    changed.append(rep)
        replicas[r.replica_id] = rep
        counts[LIVE.index(rep.phase)] += 1
        tx.index = tx.index.set(r.replica_id, spec.name)
    import immutables

    dep = attrs.evolve(dep, replicas=immutables.Map(replicas), counts=tuple(counts))
    for rep in sorted(changed, key=lambda x: (final_rank[x.replica_id], x.replica_id)):
        new, cmd = _reconfigure(dep, rep, "rank")
        dep = attrs.evolve(
            dep,
            replicas=dep.replicas.set(new.replica_id, new),
            counts=_shift(dep.counts, rep.phase, new.phase),
        )
        tx.emit(cmd)
    for rid in sorted(to_stop, key=lambda x: (final_rank[x], x)):
        rep = dep.replicas[rid]
        new = attrs.evolve(rep, phase=advance(rep.phase, Trigger.STOP, rid))
        dep = attrs.evolve(
            dep, replicas=dep.replicas.set(rid, new), counts=_shift(dep.counts, rep.phase, new.phase)
        )
        tx.emit(StopReplica(replica_id=rid, deployment=spec.name))
    for rid in sorted(placed_unstarted, key=lambda x: (final_rank[x], x)):
        tx.emit(
            InitializeReplica(
                replica_id=rid,
                deployment=spec.name,
                rank=dep.ranks.rank_of(rid),
                world_size=dep.target,
                user_config=dep.user_config,
                call_reconfigure=dep.has_reconfigure and dep.user_config is not None,
                pass_rank=dep.reconfigure_takes_rank,
            )
        )
    if any(r.world_size is not None and r.world_size != spec.num_replicas for r in reports):
        tx.emit(UpdateWorldSize(deployment=spec.name, world_size=spec.num_replicas))
    return _reconcile(tx, dep)


def _shift(counts: tuple[int, ...], old: Phase, new: Phase) -> tuple[int, ...]:
    c = list(counts)
    c[LIVE.index(old)] -= 1
    c[LIVE.index(new)] += 1
    return tuple(c)


def rebuild(tx: "_Tx", e: ControllerRecovered) -> None:
    """Replace everything in ``tx`` by what ``e`` says (the reports are the truth)."""
    import immutables

    specs = {d.name: d for d in e.deployments}
    by_dep: dict[str, list[ReplicaReport]] = {name: [] for name in specs}
    orphans = []
    numbers = [tx.next_replica - 1, e.next_replica_number - 1]
    lineages = [tx.next_lineage - 1, e.next_lineage - 1]
    for r in e.reports:
        n = parse_replica_number(r.replica_id)
        if n is not None:
            numbers.append(n)
        if r.lineage is not None:
            lineages.append(r.lineage)
        (by_dep[r.deployment] if r.deployment in by_dep else orphans).append(r)
    tx.next_replica = max(numbers) + 1
    tx.next_lineage = max(lineages) + 1
    tx.deps = immutables.Map()
    tx.index = immutables.Map()
    tx.touched = set()
    for name in sorted(specs):
        reports = sorted(by_dep[name], key=lambda r: r.replica_id)
        tx.put(_rebuild_deployment(tx, specs[name], reports))
    for r in sorted(orphans, key=lambda r: r.replica_id):
        # A replica of a deployment that no longer exists: stop it, and treat
        # later news about it as stale.
        tx.emit(StopReplica(replica_id=r.replica_id, deployment=r.deployment))
        if parse_replica_number(r.replica_id) is None:
            tx.retired = tx.retired.set(r.replica_id, None)

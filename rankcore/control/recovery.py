"""Controller recovery: rebuild every rank from what live replicas report.

Ranks are not checkpointed (as in Ray Serve); a restarted controller learns
them from the replicas. Reports can disagree (two replicas claiming one rank,
a node reported under two node ranks, more replicas than the target), so
every conflict is resolved by one deterministic rule, and resolved with
commands, never by dropping a replica:

* at every level a claim is kept by the first claimant in (serving before
  leaving, claimed value, id) order; the others, and replicas that did not
  report that level (a bare int), get the lowest free value, and a
  ReconfigureReplica once they serve;
* claims beyond any plausible value (``>= MAX_RANKS``, or a local rank beyond
  ``MAX_LOCAL``) count as no claim; for a static placement, a global rank
  beyond its mapping too, and its serving replicas' claims come before its
  leaving ones' (a serving replica gets a rank of the mapping);
* replicas beyond the target are stopped: conflicting ones first, then
  not-yet-running ones, then the highest ranks;
* gaps left by replicas that died meanwhile are the lowest free ranks, so the
  missing replicas are started on them (Ray Serve instead hands out ranks
  above the highest recovered one);
* ranks at or above the target are compacted once the deployment is healthy,
  by the same rule as after a downscale (fewest changes);
* a replica that reports an older user_config than the deployment's is
  reconfigured (if serving: ``max_unavailable`` at a time, by the end-of-step pass
  ``rankcore.control.configs``, counting those that report they are reconfiguring; when
  ready if still starting; at once, with its new rank, if its rank changes); one placed
  but never initialised (its answer was lost) is initialised;
* a live process that did not report (``ControllerRecovered.unresponsive``)
  is stopped at once, and its deployment hands out no rank (no gap refilled,
  no compaction) until it has gone: it may hold any free rank;
* a static-placement replica that reports ``failed`` is FAILED (its process
  stopped), restarted on its bundles if the spec places them; ``failed`` in a
  report of any other deployment is refused.

Recovery starts from a fresh ``State()``: a state that already has
deployments or nodes is refused (rebuilding would drop them without a command).

Recovering from a state's own reports gives back the same ranks and no
command (checked by ``rankcore.invariants.check_recovery_roundtrip``).

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from typing import cast

import attrs
import immutables

from ..base.commands import ScheduleTick, StopReplica, UpdateWorldSize
from ..base.errors import InvalidEvent
from ..base.events import UNKNOWN, ControllerRecovered, DeploymentApplied, ReplicaReport, UnresponsiveReplica
from ..base.lifecycle import LIVE, Phase, Residency
from ..base.ranks import MAX_LOCAL, MAX_RANKS, RankTable, ReplicaRank
from ..base.state import Deployment, Replica, parse_replica_number
from ..base.transaction import Tx, by_rank, initialize, put_replica, reconfigure, recount, stop_command
from ..base.victims import VICTIM_ORDER
from ..placement import deadlines, gangs, static
from ..placement.scheduling import adopt, new_node
from ..tiers import devices, residency
from . import autoscaling, bluegreen, groups, proxies, rollouts
from .moves import hold_waiting_gangs, reconcile, restart_together, start, stop

__all__ = ["rebuild", "unresponsive_gone"]


def _settle_claims(claims: Iterable[tuple[tuple, Hashable, int | None]], bound: int,
                   taken: Iterable[int] = ()) -> dict[Hashable, int]:
    """Give every claimant a distinct value: claims kept in ``order`` order, the
    rest (no claim, a taken one, or one ``>= bound``) the lowest free values.

    ``claims``: (order key, claimant, claimed value or None); ``taken``: values
    already given to others.
    """
    final: dict[Hashable, int] = {}
    used: set[int] = set(taken)
    unresolved = []
    for _, who, value in sorted(claims, key=lambda c: (c[2] is None or c[2] >= bound, c[0], c[2] or 0)):
        if value is None or value >= bound or value in used:
            unresolved.append(who)
        else:
            used.add(value)
            final[who] = value
    nxt = 0
    for who in unresolved:
        while nxt in used:
            nxt += 1
        used.add(nxt)
        final[who] = nxt
    return final


def _leaving(r: ReplicaReport) -> bool:
    return r.phase is Phase.STOPPING


def _resolve_global(spec: DeploymentApplied, reports: list[ReplicaReport]) -> tuple[dict[str, int], list[str]]:
    """Final global rank of every report, and the serving replicas to stop."""
    active = [r for r in reports if not _leaving(r)]
    target = spec.num_replicas
    mapping = spec.static_placement.mapping if spec.static_placement is not None else None
    if mapping is None:
        final: dict[str, int] = _settle_claims(  # type: ignore[assignment]
            (((_leaving(r), r.replica_id), r.replica_id, r.rank.rank) for r in reports), MAX_RANKS
        )
    else:
        # A static placement's ranks are its mapping's, and the serving replicas take them first:
        # a claim beyond it (the mapping shrank, or a report is wrong) or one a leaving replica
        # also makes is settled on the lowest free rank; one replica more than the mapping ends
        # beyond it, and is stopped (below). The leaving ones take what is left, within the
        # mapping too: one beyond it only when every rank of it is taken (a leaving replica the
        # deployment is short of is replaced on its rank, which must have bundles).
        final = _settle_claims(  # type: ignore[assignment]
            (((False, r.replica_id), r.replica_id, r.rank.rank) for r in active), len(mapping))
        final.update(_settle_claims(  # type: ignore[arg-type]
            (((True, r.replica_id), r.replica_id, r.rank.rank) for r in reports if _leaving(r)), len(mapping),
            taken=final.values()))

    def victim_key(r: ReplicaReport) -> tuple:
        moved = final[r.replica_id] != r.rank.rank
        beyond = mapping is not None and final[r.replica_id] >= len(mapping)  # (no bundles: stopped first)
        bad = 0 if moved else 1 if r.rank.rank >= target else 2
        return (not beyond, bad, VICTIM_ORDER[r.phase], -final[r.replica_id], r.replica_id)

    to_stop = [r.replica_id for r in sorted(active, key=victim_key)[: max(0, len(active) - target)]]
    return final, to_stop


def _resolve_nodes(placed: list[ReplicaReport]) -> dict[str, int]:
    """Final node rank of every node: the rank most of its replicas report."""
    by_node: dict[str, list[ReplicaReport]] = {}
    for r in placed:
        by_node.setdefault(r.node_id, []).append(r)  # type: ignore[arg-type]
    claims = []
    for node, rs in by_node.items():
        votes = Counter(r.rank.node_rank for r in rs if r.rank.node_rank is not None)
        claim = min(votes, key=lambda nr: (-votes[nr], nr)) if votes else None
        claims.append(((all(_leaving(r) for r in rs), node), node, claim))
    return _settle_claims(claims, MAX_RANKS)  # type: ignore[return-value]


def _resolve_locals(placed: list[ReplicaReport]) -> dict[str, int]:
    by_node: dict[str, list[ReplicaReport]] = {}
    for r in placed:
        by_node.setdefault(r.node_id, []).append(r)  # type: ignore[arg-type]
    final: dict[str, int] = {}
    for rs in by_node.values():
        final.update(
            _settle_claims((((_leaving(r), r.replica_id), r.replica_id, r.rank.local_rank) for r in rs), MAX_LOCAL)  # type: ignore[arg-type]
        )
    return final


def _config_outdated(r: ReplicaReport, spec: DeploymentApplied) -> bool:
    return r.user_config is not UNKNOWN and r.user_config != spec.user_config


def _retiring(dep: Deployment, extras: set[str]) -> Deployment:
    """Replicas reported stopping (not extras) while the deployment is short of its target were
    retired by a rollout (or their successor is wanted anyway): each is succeeded on its ranks when
    it has stopped (``moves.succeed_retired``), lowest rank first, rather than a new replica started
    on another rank now. Recovering from a state's own reports gives the same replicas retiring."""
    short = dep.target - dep.active
    if short <= 0 or dep.deleting:
        return dep
    stopping = [r for r in dep.replicas.values() if r.phase is Phase.STOPPING and r.replica_id not in extras]
    if dep.gang_size > 1:  # a gang retires whole: not one whose other members run (conflicting claims mixed it)
        stopping = [r for r in stopping if _gang_stopped(dep, dep.ranks.global_rank(r.replica_id) // dep.gang_size)]
    replicas = dep.replicas
    chosen = by_rank(dep, stopping)[:short]
    for rep in chosen:
        replicas = replicas.set(rep.replica_id, attrs.evolve(rep, retiring=True))
    return attrs.evolve(dep, replicas=replicas, retiring=len(chosen))


def _gang_stopped(dep: Deployment, g: int) -> bool:
    """Every member of gang ``g`` is stopping or pending on no node (none runs)."""
    for r in gangs.gang_ranks(g, dep.gang_size):
        rid = dep.ranks.holder_of(r)
        rep = dep.replicas.get(rid) if rid is not None else None
        if rep is not None and rep.phase is not Phase.STOPPING and not (rep.phase is Phase.PENDING and rep.node_id is None):
            return False
    return True


def _record(tx: Tx, name: str, r: ReplicaReport, phase: Phase, node_id: str | None, old_config: bool,
            current: str) -> Replica:
    """The core's record of reported replica ``r`` (in ``phase``, on ``node_id``; ``old_config``: behind
    the spec's user_config; ``current``: the revision an unsaid one is taken to run)."""
    return Replica(replica_id=r.replica_id, deployment=name, phase=phase,
                   lineage=r.lineage if r.lineage is not None else tx.new_lineage(), node_id=node_id,
                   version=r.version, config_version=0 if old_config else 1, residency=Residency(r.tier),
                   weights_version=r.weights_version, revision=current if r.revision is None else r.revision,
                   models=r.models)


def _blues(spec: DeploymentApplied, reports: list[ReplicaReport]) -> dict[str, ReplicaReport]:
    """A blue-green deployment switching when its controller stopped (rankcore.control.bluegreen): each
    serving replica of an older revision whose global rank a replica of the current revision also
    claims is a blue (its green twin keeps the rank); by id."""
    if spec.config.rollout.update_mode != bluegreen.BLUE_GREEN:
        return {}
    current = rollouts.revision(spec.config)
    green = {r.rank.rank for r in reports if r.revision in (None, current) and not _leaving(r)
             and r.phase is not Phase.FAILED}
    return {r.replica_id: r for r in reports
            if r.revision not in (None, current) and r.phase in (Phase.RUNNING, Phase.RECONFIGURING)
            and r.node_id is not None and r.rank.rank in green}


def _with_blues(tx: Tx, dep: Deployment, spec: DeploymentApplied, blues: list[ReplicaReport]) -> Deployment:
    """``dep`` with its blues back, each serving on a spare entry (``bluegreen.spare``, in the order of
    the ranks they claim) what it reports it was told."""
    replicas, ranks, counts = dep.replicas, dep.ranks, list(dep.counts)
    for r in sorted(blues, key=lambda r: (r.rank.rank, r.replica_id)):
        ranks = ranks.assign(r.replica_id, r.node_id, rank=bluegreen.spare(ranks, dep.target))
        rep = _record(tx, dep.name, r, r.phase, r.node_id, _config_outdated(r, spec), dep.revision)
        replicas = replicas.set(r.replica_id, attrs.evolve(rep, blue_ranks=(r.rank.rank, r.rank.node_rank,
                                                                           r.rank.local_rank)))
        counts[LIVE.index(r.phase)] += 1
        tx.index = tx.index.set(r.replica_id, dep.name)
    return attrs.evolve(dep, replicas=replicas, ranks=ranks, counts=tuple(counts), blues=len(blues))


def _rebuild_deployment(tx: Tx, spec: DeploymentApplied, reports: list[ReplicaReport],
                        unresponsive: list[UnresponsiveReplica], asleep: bool = False, weights: int = 0,
                        deleting: bool = False) -> Deployment:
    blues = _blues(spec, reports)
    if blues:
        reports = [r for r in reports if r.replica_id not in blues]
    final_rank, to_stop = _resolve_global(spec, reports)
    # a FAILED replica holds its global rank only (its process is stopped below)
    placed = [r for r in reports if r.node_id is not None and r.phase is not Phase.FAILED]
    node_rank = _resolve_nodes(placed)
    local_rank = _resolve_locals(placed)
    ranks = RankTable().recover_many(
        (r.replica_id, r.node_id,
         ReplicaRank(rank=final_rank[r.replica_id], node_rank=node_rank[r.node_id], local_rank=local_rank[r.replica_id]))  # type: ignore[index]
        for r in placed
    )
    for r in reports:
        if r.node_id is None or r.phase is Phase.FAILED:
            ranks = ranks.assign(r.replica_id, rank=final_rank[r.replica_id])
    # config_version 1 is the spec's user_config; 0 marks a replica behind it.
    counts = [0] * len(LIVE)
    replicas: dict[str, Replica] = {}
    changed: list[Replica] = []
    unstarted: set[str] = set()
    failed: list[str] = []
    stopping = set(to_stop)
    current = rollouts.revision(spec.config)
    for r in reports:
        phase = r.phase
        node_id = r.node_id
        if phase is Phase.FAILED:
            node_id = None
            failed.append(r.replica_id)
        if phase is Phase.PENDING and r.node_id is not None:
            # Placed, but the answer was lost with the old controller: it was
            # never initialised, so it is initialised now (as on ReplicaPlaced).
            phase = Phase.STARTING
            if r.replica_id not in stopping:
                unstarted.add(r.replica_id)
        old_config = _config_outdated(r, spec)
        rep = _record(tx, spec.name, r, phase, node_id, old_config, current)
        serving_or_starting = node_id is not None and not _leaving(r) and r.replica_id not in stopping
        if serving_or_starting and r.replica_id not in unstarted:
            now = (final_rank[r.replica_id], node_rank[r.node_id], local_rank[r.replica_id])  # type: ignore[index]
            if now != (r.rank.rank, r.rank.node_rank, r.rank.local_rank):
                if phase is Phase.STARTING:
                    rep = attrs.evolve(rep, rank_update_due=True)
                else:
                    changed.append(rep)
        replicas[r.replica_id] = rep
        counts[LIVE.index(rep.phase)] += 1
        tx.index = tx.index.set(r.replica_id, spec.name)
    # The weights version is the newest of what was persisted and what a replica reports;
    # the deployment is asleep as persisted (docs/tiers.md); settle() below brings every
    # replica to both.
    dep = Deployment.applied(
        spec,
        weights_version=max([weights, *(r.weights_version for r in reports)]),
        asleep=asleep,
        deleting=deleting,
        config_version=1,
        replicas=immutables.Map(replicas),
        ranks=ranks,
        counts=tuple(counts),
        unresponsive=immutables.Map({u.replica_id: u.node_id for u in unresponsive}),
        revision=current,
        rolling=True,  # (the rollout pass clears it when no replica is outdated)
        groups=groups.recovered(reports),  # (the groups pass re-forms a group whose epoch the crash cut short)
    )
    dep = _retiring(dep, stopping)
    if blues:
        dep = _with_blues(tx, dep, spec, list(blues.values()))
    hold_waiting_gangs(tx, dep)  # (a gang being retired starts whole, once its retiring members have stopped)
    # Processes to stop before anything else: those that did not report (their
    # rank is unknown: reconcile gives no rank until they have gone), and the
    # FAILED ones (a FAILED replica has no process to keep).
    for rid in sorted(failed, key=lambda x: (final_rank[x], x)):
        tx.emit(stop_command(dep, rid, now=True))
    for u in unresponsive:
        tx.emit(stop_command(dep, u.replica_id, now=True))
    # One reconfigure each for a new rank, carrying the user_config too: reason user_config
    # when the replica's config is outdated (so its reconfigure is called), else rank. One
    # whose rank stays but whose config is outdated waits for the configs pass (paced).
    todo = [(rep, "user_config" if rep.config_version == 0 else "rank") for rep in changed]
    for rep, reason in sorted(todo, key=lambda x: (final_rank[x[0].replica_id], x[0].replica_id)):
        new, cmd = reconfigure(dep, rep, reason)
        dep = attrs.evolve(dep, replicas=dep.replicas.set(new.replica_id, new),
                           counts=recount(dep.counts, rep.phase, new.phase))
        tx.emit(cmd)
    for rid in sorted(unstarted, key=lambda x: (final_rank[x], x)):
        tx.emit(initialize(dep, rid))
        dep = put_replica(dep, dep.replicas[rid], residency.at_start(dep, dep.replicas[rid]))
        deadlines.start(tx, dep, rid)
    if to_stop:
        dep = stop(tx, dep, len(to_stop), sorted(to_stop, key=lambda x: (final_rank[x], x)))
    dep = residency.settle_all(tx, dep)  # (after the stops: a replica stopped now is sent nothing)
    if any(r.world_size is not None and r.world_size != spec.num_replicas for r in reports):
        tx.emit(UpdateWorldSize(deployment=spec.name, world_size=spec.num_replicas))
    return reconcile(tx, _static_on_bundles(tx, dep))


def _static_on_bundles(tx: Tx, dep: Deployment) -> Deployment:
    """A static deployment's ranks in order: a replica reported before its
    placement goes on its bundles, a FAILED one restarts there, and a rank nobody
    holds gets a new replica while fewer than the target are active (what
    ``reconcile`` would start), so the step's starts keep global-rank order."""
    mapping = dep.static
    if mapping is None:
        return dep
    for g in range(len(mapping.mapping)):  # (a rank beyond the mapping: leaving, stopped above)
        rid = cast("str | None", dep.ranks.holder_of(g))
        if rid is None:
            if dep.active < dep.target and not dep.unresponsive:
                dep = start(tx, dep, 1)  # (the lowest free rank: g)
        elif mapping.placed(g):
            rep = dep.replicas[rid]
            if rep.phase is Phase.PENDING and rep.node_id is None:
                dep = static.place(tx, dep, rid)
            elif rep.phase is Phase.FAILED:
                dep = static.restart_failed(tx, dep, rep)
    return dep


def _rebuild_cluster(tx: Tx, e: ControllerRecovered) -> None:
    """The cluster view is what the event says now (nodes), the clock goes on."""
    cl = tx.cl
    cl.changed = True
    cl.nodes = immutables.Map({n.node_id: new_node(n.node_id, n.resources, n.labels, n.order, i)
                               for i, n in enumerate(e.nodes)})
    cl.joined = len(e.nodes)
    for table in ("held", "queued", "queue_kinds", "avoid", "deadlines", "suspects", "devices", "cache_budget",
                  "hot", "caches", "evicting", "no_evict"):
        setattr(cl, table, immutables.Map())
    cl.queue, cl.blocked, cl.next_deadline = (), None, float("inf")
    for n in e.nodes:
        devices.joined(cl, n.node_id, n.devices, n.cpu_cache_bytes)
    devices.recovered(cl, {d.name: d for d in e.deployments}, e.reports, e.warm_copies, e.no_evict)


def _check_fresh(tx: Tx) -> None:
    """A recovery rebuilds everything from the event: on a state that already
    knows deployments or nodes it would drop them without a command; on one that has
    handed out replica ids or deleted deployments (all gone since) it would bring back
    replicas that have left (a repeated or late ``ControllerRecovered``)."""
    cl = tx.view
    if tx.deps or cl.nodes or cl.joined:
        raise InvalidEvent(
            f"ControllerRecovered needs a fresh State(); this state has {len(tx.deps)} deployments and "
            f"{len(cl.nodes)} nodes, which a recovery would drop without a command. A restarted controller "
            f"feeds it to rankcore.State() (a Tick first is fine)"
        )
    if tx.next_replica or tx.deleted:  # (not fresh either: a late or repeated ControllerRecovered)
        raise InvalidEvent(
            f"ControllerRecovered needs a fresh State(); this state has handed out {tx.next_replica} replica ids "
            f"and deleted {len(tx.deleted)} deployments: a recovery would bring back replicas that have left. A "
            f"restarted controller feeds it to rankcore.State() (a Tick first is fine)"
        )


def _check_failed(specs: dict[str, DeploymentApplied], reports: Iterable[ReplicaReport]) -> None:
    """``failed`` is a static-placement phase (a bundle of the rank has no node)."""
    for r in reports:
        spec = specs.get(r.deployment)
        if r.phase is Phase.FAILED and spec is not None and spec.static_placement is None:
            raise InvalidEvent(
                f"ControllerRecovered: replica {r.replica_id!r} of deployment {r.deployment!r} reports phase "
                f"'failed', which only a static-placement replica can be in (a bundle of its rank lost its "
                f"node); {r.deployment!r} has no static placement: report what the process does "
                f"(pending, starting, running, reconfiguring or stopping)"
            )


def _check_deleted(specs: dict[str, DeploymentApplied], deleted: set[str]) -> None:
    """A deployment still being deleted is persisted at 0 replicas (``desired_specs``)."""
    for name in sorted(deleted & set(specs)):
        if specs[name].num_replicas:
            raise InvalidEvent(f"ControllerRecovered: deployment {name!r} is in deleted but its spec asks for "
                               f"{specs[name].num_replicas} replicas (a deployment being deleted is persisted "
                               f"at 0: persist rankcore.query.desired_specs and desired_deleted after the same step)")


def _check_autoscaled(specs: dict[str, DeploymentApplied], deleted: set[str]) -> None:
    """An autoscaled deployment not being deleted is persisted at its autoscaler's target, which lies
    within its bounds (``desired_specs``): a spec outside them is not one the core persisted."""
    for name in sorted(set(specs) - deleted):
        spec = specs[name]
        if not spec.config.autoscaler.autoscaling:
            continue
        lo, hi = autoscaling.bounds(spec.config, spec.max_replicas)
        if not lo <= spec.num_replicas <= hi:
            raise InvalidEvent(f"ControllerRecovered: deployment {name!r} is autoscaled within [{lo}, {hi}] but its "
                               f"spec asks for {spec.num_replicas} replicas (an autoscaled deployment is persisted "
                               f"at its autoscaler's target: persist rankcore.query.desired_specs after each step)")


def rebuild(tx: Tx, e: ControllerRecovered) -> None:
    """Replace everything in ``tx`` (a fresh state) by what ``e`` says (the reports are the truth)."""
    _check_fresh(tx)
    specs = {d.name: d for d in e.deployments}
    _check_failed(specs, e.reports)
    by_dep: dict[str, list[ReplicaReport]] = {name: [] for name in specs}
    silent: dict[str, list[UnresponsiveReplica]] = {name: [] for name in specs}
    orphans: list[ReplicaReport] = []
    silent_orphans: list[UnresponsiveReplica] = []
    numbers = [tx.next_replica - 1, e.next_replica_number - 1]
    lineages = [tx.next_lineage - 1, e.next_lineage - 1]
    for r in e.reports:
        n = parse_replica_number(r.replica_id)
        if n is not None:
            numbers.append(n)
        if r.lineage is not None:
            lineages.append(r.lineage)
        by_dep.get(r.deployment, orphans).append(r)
    for u in e.unresponsive:
        n = parse_replica_number(u.replica_id)
        if n is not None:
            numbers.append(n)  # (its id is never handed out again)
        silent.get(u.deployment, silent_orphans).append(u)
    deleted = set(e.deleted)
    _check_deleted(specs, deleted)
    _check_autoscaled(specs, deleted)
    if not e.stop_unknown and (any(r.deployment not in deleted for r in orphans)
                               or any(u.deployment not in deleted for u in silent_orphans)):
        # (a deleted deployment's replicas are stopped: the deletion said so)
        names = sorted({r.deployment for r in orphans} | {u.deployment for u in silent_orphans} - deleted)
        raise InvalidEvent(
            f"ControllerRecovered: {len(orphans) + len(silent_orphans)} live replicas are of deployments the "
            f"event does not name ({', '.join(map(repr, names))}); include their DeploymentApplied "
            f"(rankcore.query.desired_specs(state) gives them all), or pass stop_unknown=True to stop those replicas"
        )
    weights = dict(e.weights_versions)
    for field, named in (("asleep", set(e.asleep)), ("weights_versions", set(weights))):
        unknown = sorted(named - set(specs))
        if unknown:
            raise InvalidEvent(f"ControllerRecovered.{field} names {', '.join(map(repr, unknown))}, which the "
                               f"event's deployments do not")
    tx.deleted = immutables.Map(dict.fromkeys(sorted(deleted - set(specs))))  # (gone: their news is stale)
    tx.next_replica = max(numbers) + 1
    tx.next_lineage = max(lineages) + 1
    tx.deps = immutables.Map()
    tx.index = immutables.Map()
    tx.touched = set()
    _rebuild_cluster(tx, e)
    for name in sorted(specs):
        reports = sorted(by_dep[name], key=lambda r: r.replica_id)
        tx.put(_rebuild_deployment(tx, specs[name], reports, sorted(silent[name], key=lambda u: u.replica_id),
                                   name in e.asleep, weights.get(name, 0), deleting=name in deleted))
        for u in silent[name]:
            if not _named_after(u.replica_id, name):
                tx.retired = tx.retired.set(u.replica_id, None)  # (news about it: stale, not unknown)
    if tx.cl.clock:  # replicas still starting get a fresh start timeout
        for name in sorted(specs):
            dep = tx.deps[name]
            if dep.start_timeout_s is not None:
                for rid in dep.ranks:
                    if dep.replicas[rid].phase is Phase.STARTING:
                        tx.cl.deadlines = tx.cl.deadlines.set(rid, tx.cl.now + dep.start_timeout_s)
                        tx.cl.next_deadline = min(tx.cl.next_deadline, tx.cl.now + dep.start_timeout_s)
        if tx.cl.next_deadline < float("inf"):
            tx.emit(ScheduleTick(at=tx.cl.next_deadline))
    if tx.managed:  # what the replicas hold where they run, and who still waits for a node
        adopt(tx, sorted(specs))
    proxies.adopt(tx, e.proxies, e.proxy_ids, e.next_proxy_number)  # (after the bookings: where they are wanted)
    for r in sorted(orphans, key=lambda r: r.replica_id):
        # A replica of a deployment that no longer exists: stop it, and treat
        # later news about it as stale.
        tx.emit(StopReplica(replica_id=r.replica_id, deployment=r.deployment))
        tx.retired = tx.retired.set(r.replica_id, None)
    for u in sorted(silent_orphans, key=lambda u: u.replica_id):  # (and one that did not even answer: at once)
        tx.emit(StopReplica(replica_id=u.replica_id, deployment=u.deployment, graceful_shutdown_timeout_s=0.0))
        tx.retired = tx.retired.set(u.replica_id, None)
    _restart_cut_short(tx, sorted(specs))


def _unfence(tx: Tx, dep: Deployment, gone: Iterable[str]) -> None:
    """Unresponsive replicas of ``dep`` have gone: once none is left, its free
    ranks are given (the gaps refilled, a gang cut short restarted whole)."""
    left = dep.unresponsive
    for rid in gone:
        left = left.delete(rid)
    dep = attrs.evolve(dep, unresponsive=left)
    if not left:
        dep = reconcile(tx, dep)
    tx.put(dep)
    if not left:
        _restart_cut_short(tx, [dep.name])


def _restart_cut_short(tx: Tx, names: Iterable[str]) -> None:
    """After a recovery: a gang whose start was cut short (some members being started again now)
    restarts whole, on its ranks (``gangs.cut_short`` names the others; each is stopped at once
    and replaced), its starts in rank order."""
    for name in names:
        dep = tx.deps[name]
        if dep.gang_size <= 1:
            continue
        tx.put(restart_together(tx, dep, ((rep, True) for rep in gangs.cut_short(tx, dep))))
        gangs.starts_in_rank_order(tx, name)


def _named_after(rid: str, name: str) -> bool:
    """Whether ``rid`` is an id the core gives replicas of ``name``."""
    return parse_replica_number(rid) is not None and rid.rpartition("#")[0] == name


def unresponsive_gone(tx: Tx, rid: str) -> bool:
    """A ReplicaStopped / ReplicaCrashed about a replica the core does not hold:
    True (and handled) when it is an unresponsive one a recovery stopped."""
    own = rid.rpartition("#")[0]
    if own in tx.deps and _named_after(rid, own):
        names = [own]
    elif rid in tx.retired:  # (an id not of the core's form)
        names = sorted(tx.deps.keys())
    else:
        return False
    for name in names:
        dep = tx.deps[name]
        if dep.unresponsive and rid in dep.unresponsive:
            _unfence(tx, dep, [rid])
            return True
    return False


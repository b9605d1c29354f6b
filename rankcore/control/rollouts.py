"""Rolling updates: a heavyweight change replaces every replica, each by one on its ranks.

Ray Serve keeps a running replica on a *lightweight* change (user_config, num_replicas,
autoscaling, request limits, graceful shutdown, health checks: reconfigured or scaled in
place, ``rankcore.core``) and replaces it on a *heavyweight* one: its code's ``version``,
what it reserves (``resources``), where it goes (``placement``). Those three make the
deployment's :func:`revision`; a replica started under another revision is outdated.

The rule (``advance``, an end-of-step pass over the deployments the step touched):

* an outdated replica that serves nothing yet (pending, starting, FAILED) is stopped at once;
* an outdated serving one is stopped (drained, as any stop) only while no more than
  ``max_unavailable`` of the target (Ray Serve's 20%, at least one) would be short of serving,
  lowest rank first;
* either way it is *retiring*: it still counts towards the target, and when it has stopped (or
  died) its successor starts on its three ranks, on its node and booking where the core places
  replicas (``rankcore.control.moves.succeed_retired``), as a crash's replacement would. A rollout
  reassigns no rank and changes no world size; it never runs more replicas than the target, but
  with ``max_surge``: then, where the node has room, the successor starts in the step its
  predecessor starts draining, on its ranks (``surge``).

A rollback is applying the old config: the replicas still on the old revision are current again,
those already replaced are replaced once more. A crash's replacement starts on the current revision.
A deployment being deleted rolls nothing. After a controller restart the reports say which revision
each replica runs (``ReplicaReport.revision``), and the rollout goes on from there; a replica reported
stopping while its deployment is short of its target is succeeded on its ranks
(``rankcore.control.recovery``).

A gang deployment rolls whole gangs (``_advance_gangs``): every member of a gang is retired in the
same step, lowest gang first, while no more than ``max_unavailable`` rounded up to whole gangs
(``gang_budget``) would be short of serving, so one whole gang always may be. Each member's successor
takes its global rank but waits (``moves.hold``: no StartReplica) until no member of its gang is
retiring or on an old revision; then the whole new gang starts at once (``moves._start_gang``; the
end-of-step pass starts one whose old members left another way, ``moves.start_waiting``), placed all or
nothing by its gang placement (gangs and static placement do not mix: ``DeploymentApplied`` refuses it).

``update_mode="blue_green"`` replaces the other way round, a whole new set first (``_advance_blue_green``,
the rule in ``rankcore.control.bluegreen``).

Internal module: import its public names from ``rankcore`` (docs/embedding.md, "What you may import").
"""

from __future__ import annotations

import math

from ..base.books import release
from ..base.gangmap import gang_ranks
from ..base.lifecycle import Phase, Trigger, advance
from ..base.options import DeploymentConfig
from ..base.records import unchecked_copy
from ..base.state import Deployment, Replica
from ..base.transaction import Tx, recount, stop_command
from .bluegreen import is_blue_green, switch, switch_due, twin
from .moves import hold, start_beside, start_waiting

__all__ = ["revision", "applied", "budget", "surge_budget", "gang_budget", "outdated", "advance_touched", "retire",
           "surge"]


_copy = unchecked_copy
_SERVING = (Phase.RUNNING, Phase.RECONFIGURING)


def revision(config: DeploymentConfig) -> str:
    """What a replica must have been started with to be current: the code's ``version`` and what it
    reserves and where (the heavyweight options: for gangs, their ``gang_placement`` too). Plain
    text, so a report can carry it."""
    s = config.scheduling
    res = ",".join(f"{k}={v:g}" for k, v in s.resources)
    g = config.gang
    gang = f";g={g.gang_placement}" if g.gang_size > 1 else ""
    return f"v={config.rollout.version or ''};r={res};p={s.placement}{gang}"


def applied(dep: Deployment, config: DeploymentConfig) -> Deployment:
    """``dep`` under ``config``: a new revision starts a rollout (the next ``advance`` pass)."""
    rev = revision(config)
    if rev == dep.revision:
        return dep
    return _copy(dep, revision=rev, rolling=True, roll_order=None, roll_next=0)  # (a rollback lists anew)


def budget(dep: Deployment) -> int:
    """How many replicas a rollout may have short of serving at once (``max_unavailable``: a count,
    or a fraction of the target, at least one)."""
    m = dep.config.rollout.max_unavailable
    return m if type(m) is int else max(1, int(m * dep.target))


def surge_budget(dep: Deployment) -> int:
    """How many replicas a rollout may run above the target (``max_surge``: a count, or a fraction of
    the target rounded up, as Ray Serve rounds its ``max_surge_percent``; 0: none, each successor
    waits for its predecessor's drain)."""
    m = dep.config.rollout.max_surge
    return m if type(m) is int else math.ceil(round(m * dep.target, 9))  # (0.2 x 5 is 1, not 1.0000000000000002)


def gang_budget(dep: Deployment) -> int:
    """A gang deployment's ``budget`` rounded up to whole gangs: one whole gang may always be short."""
    k = dep.gang_size
    return -(-budget(dep) // k) * k


def outdated(dep: Deployment, rep: Replica) -> bool:
    """Started under another revision, and not yet retiring (nor a blue-green's blue: its twin is started)."""
    return (rep.revision != dep.revision and not rep.retiring and rep.phase is not Phase.STOPPING
            and rep.blue_ranks is None)


def advance_touched(tx: Tx) -> None:
    """End of step: each touched deployment with a rollout under way retires what it may now; a
    touched gang deployment starts each gang whose held successors wait for nothing any more."""
    for name in sorted(tx.touched):
        dep = tx.deps.get(name)
        if dep is None:
            continue
        if dep.rolling:
            dep = _advance(tx, dep)
            tx.put(dep)
        if dep.gang_size > 1 and tx.view.delayed:
            started = start_waiting(tx, dep)
            if started is not dep:
                tx.put(started)


def _advance(tx: Tx, dep: Deployment) -> Deployment:
    """Retire what the budget allows now. The first pass of a rollout lists the outdated replicas
    once, lowest rank first (``Deployment.roll_order``), and retires those serving nothing yet; each
    later pass goes on down that list from ``roll_next`` (a listed replica gone meanwhile, or no longer
    outdated, is passed over), so a whole rollout walks its deployment once, not once a step."""
    if dep.deleting:  # (rolling until its retiring replicas have gone: the fast paths skip it until then)
        return _copy(dep, rolling=dep.retiring > 0, roll_order=None, roll_next=0)
    if dep.gang_size > 1:
        return _advance_gangs(tx, dep)
    if dep.blues or is_blue_green(dep):
        return _advance_blue_green(tx, dep)
    if dep.roll_order is None:
        dep = _first_pass(tx, dep)
    order, i = dep.roll_order or (), dep.roll_next
    short = dep.target - (dep.count(Phase.RUNNING) + dep.count(Phase.RECONFIGURING))
    room = budget(dep) - max(short, 0)
    replicas = dep.replicas
    while room > 0 and i < len(order):
        rep = replicas.get(order[i])
        i += 1
        if rep is None or not outdated(dep, rep):
            continue
        if rep.phase in _SERVING:
            dep = surge(tx, dep, rep) or retire(tx, dep, rep)
            room -= 1
        elif rep.phase is Phase.FAILED:  # (its bundle lost its node meanwhile)
            dep = _current(dep, rep)
        replicas = dep.replicas
    if i >= len(order) and not dep.retiring:
        return _copy(dep, rolling=False, roll_order=None, roll_next=0)
    return dep if i == dep.roll_next else _copy(dep, roll_next=i)


def _advance_blue_green(tx: Tx, dep: Deployment) -> Deployment:
    """``_advance`` for ``update_mode="blue_green"`` (rankcore.control.bluegreen): every serving outdated
    replica gets its green twin at once, the others are retired as ``_first_pass`` does; once the green
    set is whole and running, the pool switches. Each pass walks the deployment (only while it switches)."""
    for rep in _outdated(dep):
        dep = twin(tx, dep, rep) if rep.phase in _SERVING else _replace_unserving(tx, dep, rep)
    if switch_due(dep):
        dep = switch(tx, dep)
    if not dep.blues and not dep.retiring:
        return _copy(dep, rolling=False, roll_order=None, roll_next=0)
    return dep


def _first_pass(tx: Tx, dep: Deployment) -> Deployment:
    """List the outdated replicas (lowest rank first); retire at once those serving nothing yet."""
    old = _outdated(dep)
    for rep in old:
        if rep.phase not in _SERVING:
            dep = _replace_unserving(tx, dep, rep)
    return _copy(dep, roll_order=tuple(r.replica_id for r in old if r.phase in _SERVING), roll_next=0)


def _outdated(dep: Deployment) -> list[Replica]:
    """``dep``'s outdated replicas, lowest rank first."""
    ranks = dep.ranks
    return sorted((r for r in dep.replicas.values() if outdated(dep, r)),
                  key=lambda r: (ranks.global_rank(r.replica_id), r.replica_id))


def _replace_unserving(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """Outdated ``rep``, serving nothing yet, is retired; one with no process (FAILED, or waiting out a
    restart backoff) just starts current."""
    if rep.phase is Phase.FAILED or rep.replica_id in tx.view.delayed:
        return _current(dep, rep)
    return retire(tx, dep, rep)


def _advance_gangs(tx: Tx, dep: Deployment) -> Deployment:
    """``_advance`` for a gang deployment: whole gangs, lowest first. The first pass lists the outdated
    members (lowest rank first) and retires at once each gang none of whose members serves; each pass
    then retires the gang of the next listed member while the replicas short of serving, with that
    gang's serving members added, stay within ``gang_budget``."""
    k = dep.gang_size
    if dep.roll_order is None:
        ranks = dep.ranks
        old = _outdated(dep)
        listed: list[str] = []
        for g in sorted({ranks.global_rank(r.replica_id) // k for r in old}):
            members = _outdated_members(dep, g)
            if any(m.phase in _SERVING for m in members):
                listed.extend(m.replica_id for m in members)
            else:
                dep = _retire_gang(tx, dep, members)
        dep = _copy(dep, roll_order=tuple(listed), roll_next=0)
    order, i = dep.roll_order or (), dep.roll_next
    whole = gang_budget(dep)
    short = max(dep.target - (dep.count(Phase.RUNNING) + dep.count(Phase.RECONFIGURING)), 0)
    while i < len(order):
        rep = dep.replicas.get(order[i])
        if rep is None or not outdated(dep, rep):
            i += 1
            continue
        members = _outdated_members(dep, dep.ranks.global_rank(rep.replica_id) // k)
        cost = sum(1 for m in members if m.phase in _SERVING)
        if cost and short + cost > whole:
            break
        dep = _retire_gang(tx, dep, members)
        short += cost
        i += 1
    if i >= len(order) and not dep.retiring:
        return _copy(dep, rolling=False, roll_order=None, roll_next=0)
    return dep if i == dep.roll_next else _copy(dep, roll_next=i)


def _outdated_members(dep: Deployment, g: int) -> list[Replica]:
    """The members of gang ``g`` on another revision, not yet retiring nor stopping, in rank order."""
    out = []
    for r in gang_ranks(g, dep.gang_size):
        rid = dep.ranks.holder_of(r)
        rep = dep.replicas.get(rid) if rid is not None else None
        if rep is not None and outdated(dep, rep):
            out.append(rep)
    return out


def _retire_gang(tx: Tx, dep: Deployment, members: list[Replica]) -> Deployment:
    """Retire every member of a gang with a process; one with none yet (waiting out a restart backoff)
    just becomes current, and waits for the gang's successors (``moves.hold``) when any was retired."""
    delayed = tx.view.delayed
    waiting = [m for m in members if m.replica_id in delayed]
    retired = False
    for rep in members:
        if rep.replica_id not in delayed and rep.phase is not Phase.FAILED:
            dep = retire(tx, dep, rep)
            retired = True
    for rep in waiting:
        dep = _current(dep, rep)
        if retired:
            hold(tx, rep.replica_id, delayed[rep.replica_id])
    return dep


def _current(dep: Deployment, rep: Replica) -> Deployment:
    """``rep`` has no process yet (FAILED, or waiting out a restart backoff): it will start on the
    current revision, so it is current already; nothing to stop."""
    return _copy(dep, replicas=dep.replicas.set(rep.replica_id, _copy(rep, revision=dep.revision)))


def surge(tx: Tx, dep: Deployment, rep: Replica) -> Deployment | None:
    """Serving ``rep`` is stopped (drained) and its successor starts at once, in the same step, on
    its three ranks and node (Ray Serve's order: the new replica starts as the old one starts
    draining), while the replicas alive, draining ones included, stay within ``surge_budget`` above
    the target: ``moves.start_beside`` (the successor takes ``rep``'s place in the rank table and its
    lineage, ``rep`` drains on a spare entry, booked beside it; a gang rolls whole, a static replica
    in its bundle and a model booked by GPU memory where the tiers place it: ``retire``). None where
    the rule does not apply: ``retire`` then."""
    allowed = surge_budget(dep)
    if allowed <= 0 or len(dep.replicas) + 1 > dep.target + allowed:
        return None
    return start_beside(tx, dep, rep)


def retire(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """Stop ``rep`` (drained, as any stop) to be succeeded on its ranks when it has stopped."""
    rid = rep.replica_id
    if tx.managed and rep.node_id is None and rid in tx.cl.queued:
        release(tx, rid)  # it was waiting for a node: it waits no more
    new = _copy(rep, phase=advance(rep.phase, Trigger.STOP, rid), retiring=True)
    tx.emit(stop_command(dep, rid))
    return _copy(dep, replicas=dep.replicas.set(rid, new), counts=recount(dep.counts, rep.phase, new.phase),
                 retiring=dep.retiring + 1)

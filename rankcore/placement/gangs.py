"""Gangs: replicas that start, stop and fail together, on consecutive ranks: every move.

A deployment with ``gang_size = k`` has gangs of k replicas: gang g holds the
global ranks ``g*k .. g*k+k-1`` (``rankcore.base.gangmap``: the numbering and the
``GangContext`` record). Its target is a multiple of k (``check_scale``), a
downscale removes whole gangs from the top (``moves.stop``), and the core
places a gang all or nothing (``placing.place_waiting`` with
``placement.choose_gang``). The rules here, each in one function:

* ``restarted_with``: who dies with a member (``rankcore.control.moves.fail``
  asks, then replaces each): under ``restart_gang`` every member on its rank
  (the others are stopped at once); under ``restart_replica`` only that member
  (unless it runs an outdated revision during a rollout: then its whole gang,
  as under ``restart_gang``);
* ``held`` / ``is_held``: a rolled gang's new members waiting for its retiring
  ones to stop (``rankcore.control.moves.hold``);
* ``tell`` (an end-of-step pass): each StartReplica of a member carries its
  gang as the step leaves it, and a gang that got a new member while others
  kept running is told its members (``GangChanged``);
* ``cut_short`` / ``starts_in_rank_order``: after a recovery, a gang whose start a
  controller crash cut short is restarted whole on its ranks
  (``rankcore.control.recovery`` replaces the members named);
* ``check_scale`` / ``check_same_shape``: what a gang deployment refuses.

A gang is named by its position, which never changes: ``"<deployment>/gang-<g>"``.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import"); the numbering is re-exported here for ``rankcore.placement.gangs.gang_id``.
"""

from __future__ import annotations

import math
from typing import cast

from ..base.cluster import Cluster
from ..base.clustertx import ClusterTx
from ..base.commands import GangChanged, StartReplica
from ..base.errors import InvalidConfig, InvalidEvent
from ..base.fields import shown
from ..base.gangmap import GANG_FAILURES, GANG_PLACEMENTS, GangContext, gang_id, gang_index, gang_ranks
from ..base.lifecycle import Phase
from ..base.records import unchecked_copy
from ..base.state import Deployment, Replica
from ..base.transaction import Tx

__all__ = ["GangContext", "GANG_PLACEMENTS", "GANG_FAILURES", "gang_id", "gang_index", "gang_ranks",
           "restarted_with", "held", "is_held", "tell", "cut_short", "starts_in_rank_order", "check_scale",
           "check_same_shape"]

_copy = unchecked_copy  # rankcore.base.records: not validated, no per-call introspection


def restarted_with(tx: Tx, dep: Deployment, rep: Replica) -> list[tuple[Replica, bool]] | None:
    """Who dies with ``rep`` (a crash, a start timeout, a lost node, failed health checks), in rank
    order, each with whether it is alive and is stopped first; None when ``rep`` goes alone. Under
    ``restart_gang`` its whole gang; under ``restart_replica`` only ``rep``, unless it runs an old
    revision during a rollout (its gang is being replaced anyway, and its successor on the new
    revision must not join members of the old one). Members held for a rolled gang (``held``) have
    no process: they start with it."""
    if dep.gang_size <= 1 or rep.phase is Phase.STOPPING or (
            dep.gang_failure != "restart_gang" and (rep.revision == dep.revision or dep.deleting)):
        return None
    k = dep.gang_size
    g = dep.ranks.global_rank(rep.replica_id) // k
    waiting = set(held(tx, dep, g))
    out = []
    for rid in [cast("str | None", dep.ranks.holder_of(r)) for r in gang_ranks(g, k)]:  # (as it was)
        member = dep.replicas.get(rid) if rid is not None else None
        if member is None or member.phase is Phase.STOPPING or (rid in waiting and rid != rep.replica_id):
            continue
        # (a delayed member never started: nothing to stop)
        out.append((member, rid != rep.replica_id and rid not in tx.view.delayed))
    return out


def held(tx: Tx, dep: Deployment, g: int) -> list[str]:
    """The members of gang ``g`` waiting for their gang's retiring members to stop (``hold``), in rank order."""
    cl = tx.view
    if not cl.delayed:
        return []
    holders = (cast("str | None", dep.ranks.holder_of(r)) for r in gang_ranks(g, dep.gang_size))
    return [rid for rid in holders if rid is not None and is_held(cl, rid)]


def is_held(cl: Cluster | ClusterTx, rid: str) -> bool:
    """``rid`` is a gang member's rollout successor held until its gang's retiring members have
    stopped (``hold``: a restart backoff with no end), not one waiting out a restart backoff
    (``rankcore.query.is_held``: an executor's metrics tell the two apart)."""
    return rid in cl.delayed and cl.deadlines.get(rid) == math.inf


def _members(dep: Deployment, g: int) -> tuple[str, ...]:
    holders = (cast("str | None", dep.ranks.holder_of(r)) for r in gang_ranks(g, dep.gang_size))
    return tuple(h for h in holders if h is not None)


def tell(tx: Tx) -> None:
    """Each StartReplica of a gang member carries its gang (members as the step
    leaves them); a gang that got a new member while others kept running is
    told its new members (GangChanged)."""
    if not tx.gangs:
        return  # (the pass is skipped: no gang deployment started replicas this step)
    started: dict[tuple[str, int], set[str]] = {}
    out = []
    for c in tx.commands:
        if type(c) is StartReplica and c.deployment in tx.gangs:
            dep = tx.deps.get(c.deployment)
            if dep is not None and c.replica_id in dep.replicas:
                k = dep.gang_size
                g = c.global_rank // k
                c = _copy(c, gang=GangContext(gang_id=gang_id(dep.name, g), rank_in_gang=c.global_rank % k,
                                                gang_size=k, members=_members(dep, g)))
                started.setdefault((dep.name, g), set()).add(c.replica_id)
        out.append(c)
    for (name, g), new in sorted(started.items()):
        members = _members(tx.deps[name], g)
        if set(members) - new:
            out.append(GangChanged(deployment=name, gang_id=gang_id(name, g), members=members))
    tx.commands = out


def cut_short(tx: Tx, dep: Deployment) -> list[Replica]:
    """After a recovery: the members of ``dep``'s gangs whose start was cut short (some members
    being started again in this step), in rank order, to be stopped and replaced whole, on their ranks."""
    if dep.gang_size <= 1:
        return []
    fresh = {c.replica_id for c in tx.commands if type(c) is StartReplica and c.deployment == dep.name}
    k = dep.gang_size
    out = []
    for g in range(dep.target // k):
        members = [cast("str | None", dep.ranks.holder_of(r)) for r in gang_ranks(g, k)]
        if not any(m in fresh for m in members):
            continue
        for rid in members:
            rep = dep.replicas.get(rid) if rid is not None else None
            if rep is not None and rid not in fresh and rep.phase is not Phase.STOPPING:
                out.append(rep)
    return out


def starts_in_rank_order(tx: Tx, name: str) -> None:
    """Re-order ``name``'s StartReplica commands of this step by global rank
    (each keeps a start's slot), as every batch of starts is."""
    slots = [i for i, c in enumerate(tx.commands) if type(c) is StartReplica and c.deployment == name]
    ordered = sorted((tx.commands[i] for i in slots), key=lambda c: c.global_rank)
    for i, c in zip(slots, ordered):
        tx.commands[i] = c


def check_scale(dep: Deployment, num_replicas: int, victims: tuple[str, ...]) -> None:
    """A gang deployment scales by whole gangs, from the top ranks (no victims named)."""
    if num_replicas % dep.gang_size:
        raise InvalidConfig(f"ScaleRequested({dep.name!r}).num_replicas={shown(num_replicas)} is not a multiple of "
                            f"its gang_size={dep.gang_size} (gangs start and stop whole)")
    if victims:
        raise InvalidEvent(f"ScaleRequested({dep.name!r}): a gang deployment removes whole gangs from the "
                           f"top ranks; victims cannot be named")


def check_same_shape(dep: Deployment, gang_size: int) -> None:
    """A live deployment keeps its gang size."""
    if gang_size != dep.gang_size:
        raise InvalidConfig(f"DeploymentApplied({dep.name!r}) changes gang_size from {dep.gang_size} to "
                            f"{gang_size}: a live deployment keeps its gang size")

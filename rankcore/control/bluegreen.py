"""Blue-green updates: a whole new set starts beside the old one, the pool switches at once.

``update_mode="blue_green"`` (SkyServe's name; ``RolloutOptions``) replaces a heavyweight change's
replicas the other way round from a rolling update (``rankcore.control.rollouts``): nothing old stops
until everything new is ready, and old and new never serve side by side.

* **Twins.** The rollout's pass gives every serving outdated replica (the *blue*) a *green* twin at
  once: the green takes the blue's entry in the rank table (its global rank; its node and local rank
  too when it is booked on the blue's node, where there is room and no replica waits for a node
  before it: else it waits in line) and its lineage, as a crash's
  replacement would; the blue moves to a spare entry it is never told and goes on serving what it
  was told (``Replica.blue_ranks``). So the green set holds global ranks ``0..n-1`` from its start and is told
  them (world size ``n``): two sets with the same ranks, two worlds, never one collective group
  (gangs and static placement are refused: ``DeploymentConfig``). An outdated replica serving
  nothing yet is replaced the rolling way (its successor is green too).
* **Standby.** While any blue serves (``Deployment.blues``), only blues serve: a green that is ready
  stands by (``rankcore.tiers.residency.serving``); blues do not count towards the target.
* **The switch** (``switch_due``): once every green runs and they are the target's number, one step
  stops (drains) every blue; greens serve from that step on. A request is never sent to a blue after it.
* **Faults.** A green that dies is replaced as any crash (standing by too). A blue that dies is gone,
  not replaced: its green already holds its ranks (``moves.crash``; ``transaction.remove`` counts it out). A scale request waits for no switch: it is refused
  until the switch (``refuse_scale``).
* **A new revision before the switch** (a rollback, or a third one; or a new ``num_replicas``, or
  ``update_mode``): ``call_off`` gives each blue back the ranks it was told (told again only where a
  green had moved them) and its green is stopped; the blues are the serving set again, and the new revision rolls
  from there (a rollback rolls nothing: the blues are current again).
* **A controller restart** finds blue and green reporting the same global rank; recovery gives it to
  the current revision's replica and marks the other blue (``rankcore.control.recovery``).

Internal module: import its public names from ``rankcore`` (docs/embedding.md, "What you may import").
"""

from __future__ import annotations

from ..base.cluster import fits
from ..base.errors import InvalidEvent, RankConflict
from ..base.lifecycle import Phase, Trigger, advance
from ..base.ranks import RankTable, ReplicaRank
from ..base.records import unchecked_copy
from ..base.state import Deployment, Replica
from ..base.transaction import Tx, by_rank, recount, stop_command, successor
from ..placement.scheduling import announce_booking, enqueue
from ..placement.scheduling import hold as book
from .moves import reconcile, retell_ranks, stop

__all__ = ["BLUE_GREEN", "is_blue_green", "twin", "switch_due", "switch", "calls_off", "call_off", "called_off", "disband", "refuse_scale", "blues", "spare",
           "role", "shown_ranks"]

_copy = unchecked_copy
_SERVING = (Phase.RUNNING, Phase.RECONFIGURING)
BLUE_GREEN = "blue_green"


def is_blue_green(dep: Deployment) -> bool:
    return dep.config.rollout.update_mode == BLUE_GREEN


def twin(tx: Tx, dep: Deployment, rep: Replica) -> Deployment:
    """Serving outdated ``rep`` becomes blue: its green twin starts on its ranks (beside it where its
    node has room, else wherever the core finds room), and ``rep`` keeps serving on a spare entry."""
    rid, node_id = rep.replica_id, rep.node_id
    (new_id,) = tx.new_ids(dep.name, 1)
    beside = None
    if tx.managed and node_id is not None and not tx.view.queued:  # (none waits longer for a node: first come)
        node = tx.view.nodes.get(node_id)
        if node is not None and not tx.view.suspect(node_id) and fits(node, dep.resources):
            beside = node_id
    ranks = dep.ranks.replace(rid, new_id, beside) if beside is not None else dep.ranks.replace(rid, new_id)
    told = dep.ranks.rank_tuple(rid)
    ranks = ranks.assign(rid, node_id, rank=spare(ranks, dep.target))
    blue = _copy(rep, blue_ranks=told, lineage=tx.new_lineage())
    green = successor(tx, dep, rep, new_id, beside, ranks)
    dep = _copy(dep, replicas=dep.replicas.set(rid, blue).set(new_id, green), ranks=ranks,
                counts=recount(dep.counts, None, Phase.PENDING), blues=dep.blues + 1)
    if beside is not None:
        book(tx, new_id, beside, dep.resources)
        announce_booking(tx, dep, new_id, beside)
    elif tx.managed:
        enqueue(tx, dep, [new_id])
    return dep


def spare(ranks: RankTable, target: int) -> int:
    """The lowest free global rank at or above ``target``: a blue's entry (below it, a vacant rank is
    the target's own, to be started again)."""
    k = target
    while ranks.holder_of(k) is not None:
        k += 1
    return k


def switch_due(dep: Deployment) -> bool:
    """The green set is whole: the target's number of replicas other than the blues (stopping ones
    aside), every one serving-ready on the current revision; none stopping to be succeeded, no
    unresponsive process of unknown rank."""
    if not dep.blues or dep.retiring or dep.unresponsive:
        return False
    greens = [r for r in dep.replicas.values() if r.blue_ranks is None and r.phase is not Phase.STOPPING]
    return len(greens) == dep.target and all(r.phase in _SERVING and r.revision == dep.revision for r in greens)


def switch(tx: Tx, dep: Deployment) -> Deployment:
    """The pool switches: every blue stops (drained, on its spare entry, as a surged predecessor does)."""
    replicas, counts = dep.replicas, dep.counts
    for rep in by_rank(dep, blues(dep)):
        new = _copy(rep, phase=advance(rep.phase, Trigger.STOP, rep.replica_id), blue_ranks=None)
        replicas = replicas.set(rep.replica_id, new)
        counts = recount(counts, rep.phase, new.phase)
        tx.emit(stop_command(dep, rep.replica_id))
    return _copy(dep, replicas=replicas, counts=counts, blues=0)


def calls_off(dep: Deployment, revision: str, n: int, update_mode: str) -> bool:
    """Whether a ``DeploymentApplied`` of ``revision`` (``rollouts.revision``), ``n`` replicas and
    ``update_mode`` calls off the blue-green switch under way: a new revision, size or mode before
    the switch. The old set then serves on (told its new world size, if any) and the rollout pass
    starts over from it (``call_off``)."""
    return bool(dep.blues) and (revision != dep.revision or n != dep.target or update_mode != BLUE_GREEN)


def call_off(dep: Deployment) -> tuple[Deployment, list[str], list[Replica]]:
    """A new revision, size or mode before the switch: each blue takes back the ranks it was told from
    the green holding them and serves on as any replica; the greens move to spare entries. Returns the
    deployment, the greens (for the caller to stop: ``moves.stop``, which removes one with no process
    yet) and the blues whose ranks could not be given back as told (a green had moved their node's
    ranks): the caller tells them, with any other reconfigure of its step, in rank order."""
    if not dep.blues:
        return dep, [], []
    replicas, ranks = dep.replicas, dep.ranks
    back = by_rank(dep, blues(dep))
    greens = [str(ranks.holder_of(b.blue_ranks[0])) for b in back]  # type: ignore[index]
    # every blue and green leaves its entry first, so that each blue's told ranks are free again
    ranks = ranks.release_many([b.replica_id for b in back] + greens)
    moved: list[Replica] = []
    for b in back:
        told = b.blue_ranks
        try:
            ranks = ranks.recover(b.replica_id, b.node_id, ReplicaRank(rank=told[0], node_rank=told[1],  # type: ignore[index]
                                                                       local_rank=told[2]))  # type: ignore[index]
        except (RankConflict, ValueError, TypeError):
            ranks = ranks.assign(b.replica_id, b.node_id, rank=told[0])  # type: ignore[index]
            moved.append(b)
        replicas = replicas.set(b.replica_id, _copy(b, blue_ranks=None))
    for gid in greens:
        ranks = ranks.assign(gid, replicas[gid].node_id, rank=spare(ranks, dep.target))
    dep = _copy(dep, replicas=replicas, ranks=ranks, blues=0)
    return dep, greens, [dep.replicas[b.replica_id] for b in moved]


def called_off(tx: Tx, dep: Deployment) -> Deployment:
    """A blue-green update called off (``calls_off`` said so): the greens stop (``moves.stop``), the
    blues take their ranks back (``call_off``), the deployment is reconciled to its target, and the
    blues given other ranks than they were told are told them again (``moves.retell_ranks``)."""
    dep, greens, retell = call_off(dep)
    dep = stop(tx, dep, len(greens), greens)
    dep = reconcile(tx, dep)
    return retell_ranks(tx, dep, retell) if retell else dep


def disband(dep: Deployment) -> Deployment:
    """Deleted before the switch: the blues are plain replicas on their spare entries again, so the
    deletion's downscale stops them with the rest."""
    if not dep.blues:
        return dep
    replicas = dep.replicas
    for rep in blues(dep):
        replicas = replicas.set(rep.replica_id, _copy(rep, blue_ranks=None))
    return _copy(dep, replicas=replicas, blues=0)


def role(dep: Deployment, rep: Replica) -> str | None:
    """What a status page says of ``rep`` during a switch: ``"blue"`` (an old replica serving the
    ranks it was told, ``Replica.blue_ranks``), ``"standby"`` (a new one, not serving yet), else None."""
    if rep.blue_ranks is not None:
        return "blue"
    return "standby" if dep.blues else None


def shown_ranks(dep: Deployment, rid: str) -> tuple:
    """``rid``'s (global, node, local) ranks as the replica knows them: a blue's are those it was told,
    not its spare entry's; node and local None while it holds only a global rank."""
    rep = dep.replicas[rid]
    return tuple(rep.blue_ranks) if rep.blue_ranks is not None else dep.ranks.rank_tuple(rid)


def blues(dep: Deployment) -> list[Replica]:
    """``dep``'s blues (none when it is not switching)."""
    return [r for r in dep.replicas.values() if r.blue_ranks is not None] if dep.blues else []


def refuse_scale(dep: Deployment) -> None:
    """A scale request before the switch is refused: the new set is the size the switch began with."""
    if dep.blues:
        raise InvalidEvent(
            f"ScaleRequested: {dep.name!r} is switching blue-green ({dep.blues} old replica(s) still serve while "
            f"its new set starts); scale it once the switch is done, or apply the old config to call it off")

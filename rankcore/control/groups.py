"""Collective groups: an epoch per group, raised when its members change, each member told once.

A deployment with ``collective_group`` is one group of replicas (a gang deployment: one group per
gang, named by the gang's id). Its members are the replicas holding the ranks ``0 .. world_size - 1``
(the target; a gang: its size), in rank order. One rule, ``reform_touched`` (an end-of-step pass,
after compaction): for each group of a deployment the step touched, when every rank is held by a
running replica and that tuple of members is not the one its epoch was formed with, the epoch rises
by one and each member gets one ``ReformGroup`` naming it. So a crash's survivors hear nothing until
the replacement is up, then re-form with it in place (same process, same rank); a downscale's
compaction re-forms once the moved members hold their new ranks; an upscale once the new members run;
a rollout's successor, a lost node's replacements, a gang restarted whole the same way (every member
then joins, none re-forms in place: ``GroupContext.previous_rank`` is None).

A recovered controller rebuilds each group from what the replicas report (``ReplicaReport.group_epoch``:
``rankcore.control.recovery``): the highest epoch any member reports, with the members that report it.
A re-form the crash cut short (some members told, some not) then finds those members incomplete and
raises the epoch again: epochs only rise, and every member of the newest epoch is told it.

Internal module: import its public names from ``rankcore`` (docs/embedding.md,
"What you may import").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import cast

import immutables

from ..base.commands import ReformGroup
from ..base.events import ReplicaReport
from ..base.gangmap import gang_id, gang_ranks
from ..base.groupmap import Group, GroupContext
from ..base.lifecycle import Phase
from ..base.records import maker, updater
from ..base.state import Deployment
from ..base.transaction import Tx

__all__ = ["reform_touched", "groups_of", "formed", "recovered"]

_IN_GROUP = (Phase.RUNNING, Phase.RECONFIGURING)  # up, and told its rank (a rank move's reconfigure is under way)
_Reform = maker(ReformGroup)  # (the contexts are built checked: a re-form is rare)
_with_groups = updater(Deployment, "groups")


def groups_of(dep: Deployment) -> Iterator[tuple[str, range]]:
    """Each group of ``dep`` (a ``collective_group`` deployment) as (group id, the global ranks it
    spans): the deployment's one group of ``target`` ranks, or one per gang of ``gang_size``."""
    k = dep.gang_size
    if k > 1:
        for g in range(dep.target // k):
            yield gang_id(dep.name, g), gang_ranks(g, k)
    elif dep.target:
        yield dep.name, range(dep.target)


def formed(dep: Deployment, ranks: range) -> tuple[str, ...] | None:
    """The members holding ``ranks`` in rank order, when each rank is held by a running replica that
    will stay (not a rollout's retiring one, not a blue); None while any is missing."""
    members: list[str] = []
    for r in ranks:
        rid = cast("str | None", dep.ranks.holder_of(r))
        rep = dep.replicas.get(rid) if rid is not None else None
        if rid is None or rep is None or rep.phase not in _IN_GROUP or rep.retiring or rep.blue_ranks is not None:
            return None
        members.append(rid)
    return tuple(members)


def reform_touched(tx: Tx) -> None:
    """End of step: each group of a deployment this step touched whose members changed, once all are
    up, gets a new epoch, and each member one ``ReformGroup``."""
    for name in sorted(tx.touched):
        dep = tx.deps.get(name)
        if dep is None or not dep.collective_group:
            continue
        groups = dep.groups
        for gid, ranks in groups_of(dep):
            members = formed(dep, ranks)
            old = groups.get(gid)
            if members is None or (old is not None and old.members == members and old.told):
                continue
            groups = groups.set(gid, _reform(tx, dep, gid, old, members))
        if groups is not dep.groups:
            tx.put(_with_groups(dep, groups))


def _reform(tx: Tx, dep: Deployment, gid: str, old: Group | None, members: tuple[str, ...]) -> Group:
    """The group's next epoch with ``members``; each member told (in rank order)."""
    before = old.members if old is not None else ()
    epoch = (old.epoch if old is not None else 0) + 1
    where = {rid: i for i, rid in enumerate(before)}
    for rank, rid in enumerate(members):
        ctx = GroupContext(group_id=gid, epoch=epoch, rank=rank, world_size=len(members), members=members,
                       previous_epoch=epoch - 1, previous_rank=where.get(rid))
        tx.emit(_Reform(replica_id=rid, deployment=dep.name, group=ctx))
    return Group(epoch=epoch, members=members)


def recovered(reports: Iterable[ReplicaReport]) -> immutables.Map:
    """The groups a recovered controller starts from, by group id: the highest epoch its live members
    report, with the members that epoch was formed with; ``told`` only when every one of them
    reported it (else the re-form was cut short, or a member died meanwhile: the next pass raises
    the epoch again, so every member is told the newest epoch)."""
    told: dict[str, list[ReplicaReport]] = {}
    for r in reports:
        if r.group_id is not None and r.group_epoch:
            told.setdefault(r.group_id, []).append(r)
    out = {}
    for gid, rs in told.items():
        epoch = max(r.group_epoch for r in rs)
        at = [r for r in rs if r.group_epoch == epoch]
        members = at[0].group_members
        whole = all(r.group_members == members for r in at) and {r.replica_id for r in at} == set(members)
        out[gid] = Group(epoch=epoch, members=members, told=whole)
    return immutables.Map(out)

"""Collective groups (issue 67): the core's epoch per group, raised once the new members are all
up, each member told once, survivors re-forming in place; every invariant checked after every step."""

from __future__ import annotations

import attrs
import pytest

import rankcore as rc
from rankcore.base.lifecycle import Phase
from rankcore.invariants import check_recovery_roundtrip, check_step, reports_from
from tests.helpers import of, placed_answers


class Exec:
    """Answers every command at once (placed, ready, reconfigured, stopped), unless held."""

    def __init__(self, nodes: int = 2, gpus: float = 8) -> None:
        self.state = rc.State()
        for i in range(nodes):
            self.run(rc.NodeJoined(node_id=f"n{i}", resources={"GPU": gpus}))

    def step(self, event: object) -> rc.Step:
        result = rc.step(self.state, event)
        check_step(self.state, event, result, full=True)
        self.state = result.state
        return result

    def run(self, event: object, hold: tuple[type, ...] = ()) -> list[object]:
        out: list[object] = []
        queue = [event]
        while queue:
            for c in self.step(queue.pop(0)).commands:
                out.append(c)
                if not isinstance(c, hold):
                    queue.extend(placed_answers(c))
        return out

    def dep(self, name: str = "dp") -> rc.Deployment:
        return self.state.deployments[name]

    def members(self, name: str = "dp", gid: str | None = None) -> tuple[str, ...]:
        return self.dep(name).groups[gid or name].members

    def epoch(self, name: str = "dp", gid: str | None = None) -> int:
        return self.dep(name).groups[gid or name].epoch


def deploy(n: int = 4, **options: object) -> tuple[Exec, list[object]]:
    ex = Exec()
    out = ex.run(rc.DeploymentApplied(name="dp", num_replicas=n, resources={"GPU": 1}, collective_group=True,
                                      **options))
    return ex, out


def test_a_group_forms_once_every_member_runs_and_each_is_told_once():
    ex, out = deploy(4)
    told = of(rc.ReformGroup, out)
    assert [c.replica_id for c in told] == list(ex.members()) and len(told) == 4
    assert all(c.group.epoch == 1 and c.group.world_size == 4 and c.group.previous_epoch == 0 for c in told)
    assert [c.group.rank for c in told] == [0, 1, 2, 3]
    assert all(c.group.previous_rank is None and not c.group.in_place for c in told)
    # every ReformGroup comes after every member's ReplicaReady: the last InitializeReplica precedes them
    assert out.index(told[0]) > max(i for i, c in enumerate(out) if isinstance(c, rc.InitializeReplica))


def test_no_group_without_the_option():
    ex = Exec()
    out = ex.run(rc.DeploymentApplied(name="dp", num_replicas=3, resources={"GPU": 1}))
    assert not of(rc.ReformGroup, out) and not ex.dep().groups


def test_a_crash_re_forms_the_survivors_in_place_once_the_replacement_runs():
    ex, _ = deploy(4)
    old = ex.members()
    # the replacement's placement is held: the survivors hear nothing yet (their epoch is broken)
    out = ex.run(rc.ReplicaCrashed(replica_id=old[2], reason="boom"), hold=(rc.PlaceReplica,))
    assert not of(rc.ReformGroup, out) and ex.epoch() == 1
    (place,) = of(rc.PlaceReplica, out)
    out = ex.run(rc.ReplicaPlaced(replica_id=place.replica_id, node_id=place.node_id))
    told = of(rc.ReformGroup, out)
    new = ex.members()
    assert ex.epoch() == 2 and new[2] == place.replica_id and new[:2] + new[3:] == old[:2] + old[3:]
    assert [c.replica_id for c in told] == list(new)
    kept = {c.replica_id: c.group for c in told if c.replica_id != place.replica_id}
    assert all(g.in_place and g.previous_epoch == 1 for g in kept.values())
    (joined,) = [c.group for c in told if c.replica_id == place.replica_id]
    assert joined.previous_rank is None and joined.rank == 2
    assert not of(rc.StopReplica, out)  # no survivor restarted


def test_a_downscale_re_forms_at_the_smaller_world_once_the_moved_member_has_its_rank():
    ex, _ = deploy(4)
    old = ex.members()
    # stop rank 1: rank 3's holder moves down to 1 (compaction), and the group re-forms at 3
    out = ex.run(rc.ScaleRequested(deployment="dp", num_replicas=3, victims=(old[1],)))
    told = of(rc.ReformGroup, out)
    assert ex.epoch() == 2 and ex.members() == (old[0], old[3], old[2])
    assert [(c.replica_id, c.group.rank, c.group.previous_rank, c.group.world_size) for c in told] == [
        (old[0], 0, 0, 3), (old[3], 1, 3, 3), (old[2], 2, 2, 3)]
    # the moved member was told its new rank (ReconfigureReplica) before its new group
    moved = [i for i, c in enumerate(out) if isinstance(c, rc.ReconfigureReplica) and c.replica_id == old[3]]
    assert moved and moved[0] < out.index(told[1])


def test_an_upscale_re_forms_when_the_new_members_run():
    ex, _ = deploy(3)
    old = ex.members()
    out = ex.run(rc.ScaleRequested(deployment="dp", num_replicas=5), hold=(rc.InitializeReplica,))
    assert not of(rc.ReformGroup, out) and ex.epoch() == 1  # the old group keeps working meanwhile
    starting = [c.replica_id for c in of(rc.InitializeReplica, out)]
    ex.run(rc.ReplicaReady(replica_id=starting[0]))
    assert ex.epoch() == 1
    out = ex.run(rc.ReplicaReady(replica_id=starting[1]))
    assert ex.epoch() == 2 and ex.members()[:3] == old and len(ex.members()) == 5
    assert sorted(c.replica_id for c in of(rc.ReformGroup, out)) == sorted(ex.members())


def test_a_rollout_re_forms_with_its_successors():
    ex, _ = deploy(2, max_unavailable=0.5)
    old = ex.members()
    out = ex.run(rc.DeploymentApplied(name="dp", num_replicas=2, resources={"GPU": 1}, collective_group=True,
                                      max_unavailable=0.5, version="v2"))
    told = of(rc.ReformGroup, out)
    # one replica at a time; a successor up while the next member already retires forms nothing (a
    # retiring member is no member): here the group re-forms once, with both successors
    assert ex.epoch() == 2 and [c.group.epoch for c in told] == [2, 2]
    assert not set(ex.members()) & set(old)
    assert all(ex.dep().replicas[m].revision == ex.dep().revision for m in ex.members())


def test_a_node_lost_re_forms_with_the_replacements():
    ex = Exec(nodes=2, gpus=2)
    ex.run(rc.DeploymentApplied(name="dp", num_replicas=4, resources={"GPU": 1}, collective_group=True))
    ex.run(rc.NodeJoined(node_id="n2", resources={"GPU": 2}))
    old = ex.members()
    lost = ex.dep().replicas[old[0]].node_id
    out = ex.run(rc.NodeLost(node_id=lost))
    assert ex.epoch() == 2
    new = ex.members()
    kept = [m for m in old if ex.dep().replicas.get(m) is not None]
    assert len(kept) == 2 and set(kept) <= set(new)
    assert {c.replica_id: c.group.in_place for c in of(rc.ReformGroup, out)} == {m: m in kept for m in new}


def test_a_gang_deployment_has_a_group_per_gang_and_restart_gang_joins_every_member_fresh():
    ex, _ = deploy(4, gang_size=2, gang_failure="restart_gang")
    g0, g1 = "dp/gang-0", "dp/gang-1"
    assert ex.epoch(gid=g0) == ex.epoch(gid=g1) == 1
    out = ex.run(rc.ReplicaCrashed(replica_id=ex.members(gid=g1)[0], reason="boom"))
    told = of(rc.ReformGroup, out)
    assert ex.epoch(gid=g1) == 2 and ex.epoch(gid=g0) == 1
    assert {c.group.group_id for c in told} == {g1} and not any(c.group.in_place for c in told)


def test_restart_replica_gang_survivor_re_forms_in_place():
    ex, _ = deploy(4, gang_size=2, gang_failure="restart_replica")
    survivor, dead = ex.members(gid="dp/gang-0")
    out = ex.run(rc.ReplicaCrashed(replica_id=dead, reason="boom"))
    told = {c.replica_id: c.group for c in of(rc.ReformGroup, out)}
    assert told[survivor].in_place and told[survivor].epoch == 2 and len(told) == 2


def test_recovery_from_own_reports_re_forms_nothing():
    ex, _ = deploy(4)
    check_recovery_roundtrip(ex.state)
    got = rc.step(rc.State(), reports_from(ex.state))
    assert got.state.deployments["dp"].groups == ex.dep().groups and not of(rc.ReformGroup, got.commands)


def test_recovery_in_the_middle_of_a_re_form_raises_the_epoch_again():
    ex, _ = deploy(4)
    old = ex.members()
    told = of(rc.ReformGroup, ex.run(rc.ReplicaCrashed(replica_id=old[1], reason="boom")))
    assert ex.epoch() == 2
    # the controller died after telling two members of epoch 2: the others still report epoch 1
    event = reports_from(ex.state)
    reached = {c.replica_id for c in told[:2]}
    reports = tuple(r if r.replica_id in reached else attrs.evolve(r, group_epoch=1, group_members=old)
                    for r in event.reports)
    event = attrs.evolve(event, reports=reports)
    result = rc.step(rc.State(), event)
    check_step(rc.State(), event, result, full=True)
    assert result.state.deployments["dp"].groups["dp"].epoch == 3
    assert sorted(c.replica_id for c in of(rc.ReformGroup, result.commands)) == sorted(ex.members())


def test_the_option_is_checked():
    with pytest.raises(rc.InvalidConfig, match="collective_group must be a bool"):
        rc.DeploymentApplied(name="dp", num_replicas=1, collective_group="yes")


def test_a_running_member_not_in_a_complete_epoch_is_never_told():
    ex, _ = deploy(3)
    # a member stuck starting keeps the group from forming: nobody is told
    out = ex.run(rc.ReplicaCrashed(replica_id=ex.members()[0], reason="boom"), hold=(rc.InitializeReplica,))
    assert not of(rc.ReformGroup, out)
    assert sum(r.phase is Phase.STARTING for r in ex.dep().replicas.values()) == 1


# ------------------------------------------------------------------ the invariants catch a wrong step
def _crash_step() -> tuple[rc.State, object, rc.Step]:
    ex, _ = deploy(3)
    before = ex.state
    event = rc.ReplicaCrashed(replica_id=ex.members()[1], reason="boom")
    ex.run(event, hold=(rc.InitializeReplica,))
    (new,) = [r for r in ex.dep().replicas.values() if r.phase is Phase.STARTING]
    before, event = ex.state, rc.ReplicaReady(replica_id=new.replica_id)
    return before, event, rc.step(before, event)


def test_the_invariants_accept_the_core_s_re_form():
    before, event, result = _crash_step()
    assert len(of(rc.ReformGroup, result.commands)) == 3
    check_step(before, event, result, full=True)


@pytest.mark.parametrize("wrong, words", [
    ("drop one", r"told .*; its members are"),
    ("tell twice", r"told .*; its members are"),
    ("wrong rank", r"told rank 0 in group dp, held by"),
    ("no news", r"rose to epoch 2 and no member was told"),
    ("epoch falls", r"epoch fell 1 -> 0"),
    ("members without epoch", r"members changed within epoch 1"),
    ("previous rank", r"told previous epoch/rank"),
])
def test_the_invariants_catch_a_wrong_re_form(wrong, words):
    before, event, result = _crash_step()
    cmds = list(result.commands)
    told = of(rc.ReformGroup, cmds)
    state = result.state
    dep = state.deployments["dp"]
    if wrong == "drop one":
        cmds.remove(told[-1])
    elif wrong == "tell twice":
        cmds.append(told[0])
    elif wrong == "wrong rank":
        cmds[cmds.index(told[1])] = attrs.evolve(told[1], group=attrs.evolve(told[1].group, rank=0))
    elif wrong == "no news":
        cmds = [c for c in cmds if not isinstance(c, rc.ReformGroup)]
    elif wrong == "previous rank":
        cmds[cmds.index(told[0])] = attrs.evolve(told[0], group=attrs.evolve(told[0].group, previous_rank=2))
    else:
        old = before.deployments["dp"].groups["dp"]
        group = (attrs.evolve(old, epoch=0) if wrong == "epoch falls"
                 else attrs.evolve(old, members=tuple(reversed(old.members))))
        dep = attrs.evolve(dep, groups=dep.groups.set("dp", group))
        state = attrs.evolve(state, deployments=state.deployments.set("dp", dep))
        cmds = [c for c in cmds if not isinstance(c, rc.ReformGroup)]
    with pytest.raises(rc.InvariantViolation, match=words):
        check_step(before, event, attrs.evolve(result, state=state, commands=tuple(cmds)), full=True)


def test_the_invariants_refuse_telling_a_member_that_is_not_running():
    ex, _ = deploy(3)
    out = ex.run(rc.ReplicaCrashed(replica_id=ex.members()[1], reason="boom"), hold=(rc.InitializeReplica,))
    (init,) = of(rc.InitializeReplica, out)
    dep = ex.dep()
    members = (ex.members()[0], init.replica_id, ex.members()[2])
    group = rc.GroupContext(group_id="dp", epoch=2, rank=1, world_size=3, members=members, previous_epoch=1)
    wrong = rc.step(ex.state, rc.Tick(now=1.0))
    state = attrs.evolve(wrong.state, deployments=wrong.state.deployments.set(
        "dp", attrs.evolve(dep, groups=dep.groups.set("dp", attrs.evolve(dep.groups["dp"], epoch=2, members=members)))))
    cmds = tuple(rc.ReformGroup(replica_id=m, deployment="dp", group=attrs.evolve(group, rank=i, previous_rank=(
        None if i == 1 else i))) for i, m in enumerate(members))
    with pytest.raises(rc.InvariantViolation, match=r"while not running \(starting\)"):
        check_step(ex.state, rc.Tick(now=1.0), attrs.evolve(wrong, state=state, commands=cmds), full=True)


def test_a_member_whose_code_cannot_follow_a_rank_move_is_restarted_on_its_new_rank():
    ex, _ = deploy(4, rank_moves="restart")
    old = ex.members()
    out = ex.run(rc.ScaleRequested(deployment="dp", num_replicas=3, victims=(old[1],)))
    # rank 3's holder is not reconfigured to rank 1: it is stopped, a new replica starts on rank 1
    assert not [c for c in of(rc.ReconfigureReplica, out) if c.rank.rank != ex.dep().ranks.global_rank(c.replica_id)]
    assert {c.replica_id for c in of(rc.StopReplica, out)} == {old[1], old[3]}
    (start,) = of(rc.StartReplica, out)
    assert start.global_rank == 1 and start.replaces == old[3]
    new = ex.members()
    assert ex.epoch() == 2 and new == (old[0], start.replica_id, old[2])
    told = {c.replica_id: c.group for c in of(rc.ReformGroup, out)}
    assert told[old[0]].in_place and told[old[2]].in_place and told[start.replica_id].previous_rank is None


def test_rank_moves_is_checked():
    with pytest.raises(rc.InvalidConfig, match="rank_moves must be one of reconfigure, restart"):
        rc.DeploymentApplied(name="dp", num_replicas=1, rank_moves="move")

"""The invariant checks catch broken implementations (so a green suite means something)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

import rankcore as rc
from rankcore import invariants as inv
from rankcore.testing import CoreSubject, make_machine
from tests.helpers import Driver, of

#: for a machine that must find a bug: every phase but ``explain``, which adds 20-40 s to a
#: stateful failure and tells these tests nothing (they assert the failure, not its report)
FIND = tuple(p for p in Phase if p is not Phase.explain)


def healthy(n=4, nodes=("n0", "n1")):
    d = Driver(nodes=nodes)
    d.run(rc.DeploymentApplied(name="app", num_replicas=n, user_config={}, has_reconfigure=True, reconfigure_takes_rank=True))
    return d


def test_crash_replacement_with_another_rank_is_caught():
    d = healthy()
    before = d.state
    victim = d.by_rank()[1]
    result = rc.step(before, rc.ReplicaCrashed(replica_id=victim))
    start = result.commands[0]
    forged = attrs.evolve(result, commands=(attrs.evolve(start, global_rank=3),))
    with pytest.raises(rc.InvariantViolation, match="replaces"):
        inv.check_crash_inherits_rank(before, None, forged)


def test_missing_rank_reconfigure_is_caught():
    d = healthy(3, nodes=("n0",))
    before = d.state
    result = rc.step(before, rc.ScaleRequested(deployment="app", num_replicas=2, victims=(d.by_rank()[0],)))
    d.state = result.state
    stop = [c for c in result.commands if isinstance(c, rc.StopReplica)][0]
    before = d.state
    result = rc.step(before, rc.ReplicaStopped(replica_id=stop.replica_id))
    assert any(isinstance(c, rc.ReconfigureReplica) for c in result.commands)
    inv.check_rank_changes_reconfigured(before, None, result)
    dropped = attrs.evolve(result, commands=tuple(c for c in result.commands if not isinstance(c, rc.ReconfigureReplica)))
    with pytest.raises(rc.InvariantViolation, match="rank reconfigures sent: 0"):
        inv.check_rank_changes_reconfigured(before, None, dropped)


def test_non_minimal_compaction_is_caught():
    d = healthy(4, nodes=("n0",))
    before = d.state
    d.run(rc.ScaleRequested(deployment="app", num_replicas=3, victims=(d.by_rank()[0],)),
          hold=lambda c: isinstance(c, rc.StopReplica))
    (stop,) = d.held
    before = d.state
    result = rc.step(before, rc.ReplicaStopped(replica_id=stop.replica_id))
    (comp,) = result.compactions
    inv.check_compaction_minimal(before, None, result)
    bigger = attrs.evolve(comp, lower_bound=attrs.evolve(comp.lower_bound, replicas=0, rank=0))
    with pytest.raises(rc.InvariantViolation, match="lower bound"):
        inv.check_compaction_minimal(before, None, attrs.evolve(result, compactions=(bigger,)))


def test_recovery_that_loses_a_rank_is_caught():
    d = healthy()

    def lossy_step(state, event):
        if isinstance(event, rc.ControllerRecovered):
            event = attrs.evolve(event, reports=event.reports[1:])
        return rc.step(state, event)

    inv.check_recovery_roundtrip(d.state)
    with pytest.raises(rc.InvariantViolation, match="recovery"):
        inv.check_recovery_roundtrip(d.state, lossy_step)


def test_snapshot_checks():
    ok = {"deployments": {"a": {"target": 2, "healthy": True, "replicas": {
        "a#0": {"phase": "running", "node": "n0", "rank": [0, 0, 0]},
        "a#1": {"phase": "running", "node": "n0", "rank": [1, 0, 1]}}}}}
    inv.check_snapshot(ok)
    dup = {"deployments": {"a": {"target": 2, "healthy": False, "replicas": {
        "a#0": {"phase": "running", "node": "n0", "rank": [0, 0, 0]},
        "a#1": {"phase": "running", "node": "n1", "rank": [0, 1, 0]}}}}}
    with pytest.raises(rc.InvariantViolation, match="global rank 0 held twice"):
        inv.check_snapshot(dup)
    gap = {"deployments": {"a": {"target": 2, "healthy": True, "replicas": {
        "a#0": {"phase": "running", "node": "n0", "rank": [0, 0, 0]},
        "a#1": {"phase": "running", "node": "n0", "rank": [2, 0, 1]}}}}}
    with pytest.raises(rc.InvariantViolation, match="healthy but global ranks"):
        inv.check_snapshot(gap)


class ForgetfulCore(CoreSubject):
    """A wrapper bug: crash replacements start on the lowest free rank instead."""

    def step(self, state, event):
        result = rc.step(state, event)
        cmds = tuple(attrs.evolve(c, global_rank=c.global_rank + 1) if isinstance(c, rc.StartReplica) and c.replaces else c
                     for c in result.commands)
        return attrs.evolve(result, commands=cmds)


def test_the_machine_finds_a_broken_wrapper():
    machine = make_machine(ForgetfulCore)
    with pytest.raises(rc.InvariantViolation):
        run_state_machine_as_test(machine, settings=settings(max_examples=300, deadline=None, database=None, phases=FIND))


# ------------------------------------------- rules added by issue 8, point 12
def test_new_replicas_on_a_higher_rank_than_the_lowest_free_are_caught():
    d = healthy(4, nodes=("n0",))
    d.run(rc.ScaleRequested(deployment="app", num_replicas=3, victims=(d.by_rank()[1],)),
          hold=lambda c: isinstance(c, rc.StopReplica))
    (stop,) = d.held
    d.step(rc.ReplicaStopped(replica_id=stop.replica_id))  # rank 1 free, deployment not yet compacted?
    before = d.state
    result = rc.step(before, rc.ScaleRequested(deployment="app", num_replicas=5))
    inv.check_new_replicas_take_lowest_free(before, None, result)
    starts = [c for c in result.commands if isinstance(c, rc.StartReplica)]
    # The same step, claiming the new replicas took ranks above a free one.
    high = attrs.evolve(result, state=rc.step(before, rc.ScaleRequested(deployment="app", num_replicas=3)).state,
                        commands=tuple(attrs.evolve(c, global_rank=c.global_rank + 7) for c in starts))
    with pytest.raises(rc.InvariantViolation, match=r"new replicas took global ranks .* while rank \d+ was free"):
        inv.check_new_replicas_take_lowest_free(before, None, high)


def test_placing_on_a_higher_local_rank_than_the_lowest_free_is_caught():
    d = healthy(2, nodes=("n0",))
    d.run(rc.ScaleRequested(deployment="app", num_replicas=3), hold=lambda c: isinstance(c, rc.StartReplica))
    (start,) = d.held
    before = d.state
    event = rc.ReplicaPlaced(replica_id=start.replica_id, node_id="n0")
    result = rc.step(before, event)
    inv.check_new_replicas_take_lowest_free(before, event, result)
    # A core that gave it local rank 5: replay on a table built that way.
    dep = result.state.deployments["app"]
    snap = dep.ranks.to_dict()
    r, node, nr, _ = snap[start.replica_id]
    snap[start.replica_id] = (r, node, nr, 5)
    bad_dep = attrs.evolve(dep, ranks=rc.RankTable.from_dict(snap))
    bad = attrs.evolve(result, state=attrs.evolve(result.state, deployments=result.state.deployments.set("app", bad_dep)))
    with pytest.raises(rc.InvariantViolation, match="got local rank 5, the lowest free is 2"):
        inv.check_new_replicas_take_lowest_free(before, event, bad)


def test_compacting_an_unhealthy_deployment_is_caught():
    d = healthy(4, nodes=("n0",))
    d.run(rc.ScaleRequested(deployment="app", num_replicas=3, victims=(d.by_rank()[0],)),
          hold=lambda c: isinstance(c, rc.StopReplica))
    (stop,) = d.held
    before = d.state
    result = rc.step(before, rc.ReplicaStopped(replica_id=stop.replica_id))
    assert result.compactions
    inv.check_compact_only_when_healthy(before, None, result)
    # The same compaction, in a deployment that still has a replica starting.
    dep = result.state.deployments["app"]
    moved = {a.replica for a in result.compactions[0].changes}
    rid = next(r for r in dep.replicas if r not in moved)
    starting = attrs.evolve(dep, replicas=dep.replicas.set(rid, attrs.evolve(dep.replicas[rid], phase=rc.Phase.STARTING)))
    bad = attrs.evolve(result, state=attrs.evolve(result.state, deployments=result.state.deployments.set("app", starting)))
    with pytest.raises(rc.InvariantViolation, match=f"compacted while {rid} was starting"):
        inv.check_compact_only_when_healthy(before, None, bad)


class ReversingWrapper(CoreSubject):
    """A wrapper bug: each step's commands come out in reverse order."""

    def step(self, state, event):
        result = rc.step(state, event)
        return attrs.evolve(result, commands=tuple(reversed(result.commands)))


def test_the_machine_finds_a_wrapper_that_reorders_commands():
    machine = make_machine(ReversingWrapper)
    # (the replicas' command order, or the proxies': a node's next proxy started before the last one stopped)
    with pytest.raises(rc.InvariantViolation, match=r"comes after one for rank|a proxy already runs on"):
        run_state_machine_as_test(machine, settings=settings(max_examples=300, deadline=None, database=None, phases=FIND,
                                                             report_multiple_bugs=False))


def test_reversed_node_loss_replacements_are_caught():
    d = healthy(6, nodes=("n0", "n1"))
    before = d.state
    result = rc.step(before, rc.NodeLost(node_id="n0"))
    inv.check_command_order(before, None, result)
    with pytest.raises(rc.InvariantViolation, match=r"StartReplica for rank 2 comes after one for rank 4"):
        inv.check_command_order(before, None, attrs.evolve(result, commands=tuple(reversed(result.commands))))


def test_incremental_checks_catch_a_broken_touched_replica():
    """check_step's default (cost of what the step touched) still sees a
    replica the step changed but left unranked or miscounted."""
    d = healthy(3, nodes=("n0",))
    before = d.state
    event = rc.ReplicaCrashed(replica_id=d.by_rank()[1])
    result = rc.step(before, event)
    inv.check_step(before, event, result)
    dep = result.state.deployments["app"]
    miscounted = attrs.evolve(dep, counts=(0,) + dep.counts[1:])
    bad = attrs.evolve(result, state=attrs.evolve(result.state, deployments=result.state.deployments.set("app", miscounted)))
    with pytest.raises(rc.InvariantViolation, match="phase counts"):
        inv.check_step(before, event, bad)


class OwnStateWrapper:
    """An embedder's wrapper with a state type of its own (rankcore's inside)."""

    @attrs.frozen
    class Mine:
        core: rc.State
        steps: int = 0

    def initial(self):
        return self.Mine(core=rc.State())

    def step(self, state, event):
        result = rc.step(state.core, event)
        return attrs.evolve(result, state=self.Mine(core=result.state, steps=state.steps + 1))

    def core_state(self, state):
        return state.core


def test_the_machine_drives_a_wrapper_with_its_own_state_type():
    machine = make_machine(OwnStateWrapper, settings=settings(max_examples=15, stateful_step_count=20,
                                                             deadline=None, database=None))
    assert machine.TestCase.settings.max_examples == 15
    run_state_machine_as_test(machine, settings=machine.TestCase.settings)


def test_profiles_are_registered_by_rankcore_testing():
    from rankcore.testing import PROFILES

    for name, kw in PROFILES.items():
        assert settings.get_profile(name).max_examples == kw["max_examples"]


class SwallowingWrapper(CoreSubject):
    """A wrapper bug: it answers a refused event with an empty step."""

    def step(self, state, event):
        try:
            return rc.step(state, event)
        except rc.InvalidEvent:
            return rc.Step(state=state)


def test_the_machine_finds_a_wrapper_that_swallows_errors():
    machine = make_machine(SwallowingWrapper)
    with pytest.raises(AssertionError, match="was accepted"):
        run_state_machine_as_test(machine, settings=settings(max_examples=100, deadline=None, database=None,
                                                             report_multiple_bugs=False, phases=FIND))


def test_a_crash_replacement_back_on_its_node_keeps_its_local_rank():
    """The seed: a restarted replica keeps its rank at every level, also when a
    lower local rank was freed by a downscale still under way (issue 8, point 1)."""
    d = Driver(nodes=["n0"])
    d.run(rc.DeploymentApplied(name="app", num_replicas=4))
    by_local = {d.dep().ranks.rank_of(rid).local_rank: rid for rid in d.dep().replicas}
    d.run(rc.ScaleRequested(deployment="app", num_replicas=2, victims=(by_local[0], by_local[1])),
          hold=lambda c: isinstance(c, rc.StopReplica))
    d.step(rc.ReplicaStopped(replica_id=by_local[0]))  # local rank 0 is free; by_local[1] still stopping
    crashed = by_local[3]
    (start,) = of(rc.StartReplica, d.step(rc.ReplicaCrashed(replica_id=crashed)).commands)
    before = d.state
    event = rc.ReplicaPlaced(replica_id=start.replica_id, node_id="n0")
    result = d.step(event)  # check_step(full=True) runs the invariant
    assert result.state.deployments["app"].ranks.rank_of(start.replica_id).as_tuple() == (3, 0, 3)
    # A core that gave the replacement the lowest free local rank instead is caught.
    dep = result.state.deployments["app"]
    snap = dep.ranks.to_dict()
    snap[start.replica_id] = (3, "n0", 0, 0)
    moved = attrs.evolve(dep, ranks=rc.RankTable.from_dict(snap))
    bad = attrs.evolve(result, state=attrs.evolve(result.state, deployments=result.state.deployments.set("app", moved)))
    with pytest.raises(rc.InvariantViolation, match="its predecessor's was 3 and is free"):
        inv.check_crash_replacement_inherits_all_ranks(before, event, bad)


def test_check_residency_catches_a_sleeping_starter_and_a_version_from_the_future():
    """``check_residency``: a replica not yet running is on its GPU, a pending one has no
    weights update in flight, none holds a version newer than its deployment's."""
    from rankcore.invariants import check_residency

    state, _ = rc.run([rc.DeploymentApplied(name="llm", num_replicas=2)])
    check_residency(state)
    dep = state.deployments["llm"]
    rid = sorted(dep.replicas.keys())[0]

    def with_replica(**changes):
        rep = attrs.evolve(dep.replicas[rid], **changes)
        return attrs.evolve(state, deployments=state.deployments.set(
            "llm", attrs.evolve(dep, replicas=dep.replicas.set(rid, rep))))

    with pytest.raises(rc.InvariantViolation, match="is pending but warm"):
        check_residency(with_replica(residency=rc.Residency.WARM))
    with pytest.raises(rc.InvariantViolation, match="pending with a weights update in flight"):
        check_residency(with_replica(weights_pending=True))
    with pytest.raises(rc.InvariantViolation, match="newer than the deployment's 0"):
        check_residency(with_replica(weights_version=3))


def test_the_held_gangs_a_rollouts_pass_releases_are_a_batch_of_their_own() -> None:
    """The falsifying example of a thorough property run (tests/data/gang-rollout-held-gang-order.events,
    the events' reprs): a gang deployment scaled 4 -> 6 onto a new revision while a member of its
    gang 2 waits out a restart backoff. The handler starts the new gang 3 (rank 6) and holds gang 2's
    new member (rank 5, its gang on an old revision); the rollout's end-of-step pass retires the old
    gangs and then releases gang 2 (``moves.start_waiting``). Rank 5 starts after rank 6, each in its
    own batch: the order check allows it, as it does a rollout's surged successors."""
    names = {k: getattr(rc, k) for k in dir(rc)}
    lines = (Path(__file__).parents[1] / "data" / "gang-rollout-held-gang-order.events").read_text().splitlines()
    driver = Driver(nodes=())
    for line in lines:
        result = driver.step(eval(line, names))  # (reprs of rankcore's own events; every invariant checked)
    order = [(type(c).__name__, getattr(c, "global_rank", None)) for c in result.commands
             if isinstance(c, (rc.StartReplica, rc.StopReplica)) and c.deployment == "llm"]
    assert order == [("StartReplica", 6), ("StopReplica", None), ("StopReplica", None), ("StopReplica", None),
                     ("StartReplica", 5)]


def test_a_gang_downscale_that_stops_a_single_member_is_caught() -> None:
    """Three gangs of two scaled to two: the core stops gang 2 whole, which passes; a step that
    stops rank 5 alone (the rule for lone replicas, or one that counts members, not gangs) leaves
    rank 4 waiting on a mate that is gone."""
    d = Driver()
    d.run(rc.DeploymentApplied(name="app", num_replicas=6, gang_size=2))
    before, top = d.state, d.by_rank()
    event = rc.ScaleRequested(deployment="app", num_replicas=4)
    result = rc.step(before, event)
    assert sorted(c.replica_id for c in of(rc.StopReplica, result.commands)) == [top[4], top[5]]
    inv.check_gang_downscale_whole(before, event, result)
    dep = result.state.deployments["app"]
    kept = attrs.evolve(dep, replicas=dep.replicas.set(top[4], before.deployments["app"].replicas[top[4]]))
    forged = attrs.evolve(result, state=attrs.evolve(result.state, deployments=result.state.deployments.set("app", kept)),
                          commands=tuple(c for c in result.commands if getattr(c, "replica_id", None) != top[4]))
    with pytest.raises(rc.InvariantViolation, match=rf"took \['{top[5]}'\] of gang 2 .* kept \['{top[4]}'\]"):
        inv.check_gang_downscale_whole(before, event, forged)

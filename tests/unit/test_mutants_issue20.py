"""Tests added for mutants of tools/mutate.py that survived the suites (issue 20).

Each test kills one mutant the unit, property and golden suites let through
(named in its docstring; docs/mutation-testing.md has the run): mostly a
check of ``rankcore.invariants`` made a no-op, which nothing fed a broken
state or step. Each feeds the check one thing it exists to refuse and asserts
it does, and that the real, unbroken step passes it.
"""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest

import rankcore as rc
from rankcore import invariants as inv


def _steps(events, state=None):
    """Run ``events``, answering every PlaceReplica / InitializeReplica at once;
    returns the last state."""
    state = state or rc.State()
    todo = list(events)
    while todo:
        result = rc.step(state, todo.pop(0))
        inv.check_step(state, None, result, full=True)
        state = result.state
        for c in result.commands:
            if isinstance(c, rc.PlaceReplica):
                todo.append(rc.ReplicaPlaced(replica_id=c.replica_id, node_id=c.node_id))
            elif isinstance(c, rc.InitializeReplica):
                todo.append(rc.ReplicaReady(replica_id=c.replica_id))
    return state


def _managed(n=2, **more):
    return _steps([rc.NodeJoined(node_id="n0", resources={"GPU": 2}), rc.NodeJoined(node_id="n1", resources={"GPU": 2}),
                   rc.DeploymentApplied(name="app", num_replicas=n, resources={"GPU": 1}, **more)])


def _fake_dep(table, healthy=False, name="a"):
    """A deployment as the state checks read it, with a rank table (rid -> (rank, node, node_rank, local))."""
    ranks = SimpleNamespace(to_dict=lambda: dict(table), is_contiguous=lambda: True,
                            lower_bound=lambda: SimpleNamespace(replicas=1))
    return SimpleNamespace(name=name, ranks=ranks, healthy=healthy)


def test_check_ranks_unique_refuses_a_global_rank_held_twice():
    """Kills invariant-noop-check-ranks-unique."""
    dep = _fake_dep({"a#0": (0, "n0", 0, 0), "a#1": (0, "n1", 1, 0)})
    with pytest.raises(rc.InvariantViolation, match="global rank 0 is held by more than one replica"):
        inv.check_ranks_unique(SimpleNamespace(deployments={"a": dep}))
    inv.check_ranks_unique(_managed())


def test_check_every_replica_ranked_refuses_a_replica_missing_from_the_index():
    """Kills invariant-noop-check-every-replica-ranked."""
    state = _managed()
    inv.check_every_replica_ranked(state)
    broken = attrs.evolve(state, index=state.index.delete("app#1"))
    with pytest.raises(rc.InvariantViolation, match="missing from the replica index"):
        inv.check_every_replica_ranked(broken)


def test_check_counts_refuses_phase_counts_that_do_not_match():
    """Kills invariant-noop-check-counts."""
    state = _managed()
    inv.check_counts(state)
    dep = state.deployments["app"]
    wrong = attrs.evolve(dep, counts=tuple(c + 1 if i == 0 else c for i, c in enumerate(dep.counts)))
    with pytest.raises(rc.InvariantViolation, match="phase counts"):
        inv.check_counts(attrs.evolve(state, deployments=state.deployments.set("app", wrong)))


def test_check_state_runs_the_state_checks():
    """Kills invariant-noop-check-state."""
    state = _managed()
    inv.check_state(state)
    with pytest.raises(rc.InvariantViolation, match="missing from the replica index"):
        inv.check_state(attrs.evolve(state, index=state.index.delete("app#0")))


def test_check_contiguous_when_healthy_refuses_a_gap():
    """Kills invariant-noop-check-contiguous-when-healthy."""
    dep = _fake_dep({"a#0": (0, "n0", 0, 0), "a#1": (2, "n0", 0, 1)}, healthy=True)
    with pytest.raises(rc.InvariantViolation, match=r"healthy but its global ranks are \[0, 2\]"):
        inv.check_contiguous_when_healthy(SimpleNamespace(deployments={"a": dep}))


def test_check_contiguity_counters_refuses_a_counter_that_disagrees_with_the_scan():
    """Kills invariant-noop-check-contiguity-counters."""
    dep = _fake_dep({})
    with pytest.raises(rc.InvariantViolation, match="is_contiguous"):
        inv.check_contiguity_counters(SimpleNamespace(deployments={"a": dep}))
    inv.check_contiguity_counters(_managed())


def test_check_cluster_refuses_free_room_that_does_not_add_up():
    """Kills invariant-noop-check-cluster."""
    state = _managed()
    inv.check_cluster(state)
    cl = state.cluster
    node = cl.nodes["n0"]
    wrong = attrs.evolve(node, free=node.free.set("GPU", node.free["GPU"] + 1))
    with pytest.raises(rc.InvariantViolation, match="total less booked"):
        inv.check_cluster(attrs.evolve(state, cluster=attrs.evolve(cl, nodes=cl.nodes.set("n0", wrong))))


def _without(result, kind):
    return attrs.evolve(result, commands=tuple(c for c in result.commands if not isinstance(c, kind)))


def test_check_world_size_commands_refuses_a_target_change_not_announced():
    """Kills invariant-noop-check-world-size-commands."""
    before = _managed()
    event = rc.ScaleRequested(deployment="app", num_replicas=3)
    result = rc.step(before, event)
    inv.check_world_size_commands(before, event, result)
    with pytest.raises(rc.InvariantViolation, match=r"target 2 -> 3 but UpdateWorldSize sent \[\]"):
        inv.check_world_size_commands(before, event, _without(result, rc.UpdateWorldSize))


def test_check_step_runs_the_step_checks():
    """Kills invariant-noop-check-step."""
    before = _managed()
    event = rc.ScaleRequested(deployment="app", num_replicas=3)
    result = rc.step(before, event)
    inv.check_step(before, event, result)
    with pytest.raises(rc.InvariantViolation, match="UpdateWorldSize"):
        inv.check_step(before, event, _without(result, rc.UpdateWorldSize))


def test_check_upscale_keeps_ranks_refuses_an_upscale_that_moves_a_replica():
    """Kills invariant-noop-check-upscale-keeps-ranks."""
    before = _managed()
    event = rc.ScaleRequested(deployment="app", num_replicas=3)
    result = rc.step(before, event)
    inv.check_upscale_keeps_ranks(before, event, result)
    dep = result.state.deployments["app"]
    # app#0 and app#1 swap global ranks (and nodes), as a broken upscale could
    moved = dep.ranks.release("app#0").release("app#1").assign("app#1", "n0", rank=0).assign("app#0", "n1", rank=1)
    forged = attrs.evolve(result, state=attrs.evolve(result.state, deployments=result.state.deployments.set(
        "app", attrs.evolve(dep, ranks=moved))))
    with pytest.raises(rc.InvariantViolation, match="upscale 2->3 changed app#"):
        inv.check_upscale_keeps_ranks(before, event, forged)


def test_check_gangs_told_refuses_a_member_restart_the_gang_is_not_told():
    """Kills invariant-noop-check-gangs-told."""
    before = _managed(2, gang_size=2, gang_failure="restart_replica")
    event = rc.ReplicaCrashed(replica_id="app#0")
    result = rc.step(before, event)
    assert any(isinstance(c, rc.GangChanged) for c in result.commands)
    inv.check_gangs_told(before, event, result)
    with pytest.raises(rc.InvariantViolation, match="its others were not told"):
        inv.check_gangs_told(before, event, _without(result, rc.GangChanged))


def test_check_snapshot_refuses_a_node_with_two_node_ranks():
    """Kills invariant-noop-check-levels."""
    two = {"deployments": {"a": {"target": 2, "healthy": False, "replicas": {
        "a#0": {"phase": "running", "node": "n0", "rank": [0, 0, 0]},
        "a#1": {"phase": "running", "node": "n0", "rank": [1, 1, 1]}}}}}
    with pytest.raises(rc.InvariantViolation, match="node 'n0' has two node ranks"):
        inv.check_snapshot(two)


# ----------------------------------------------- the scenario timeline's two rules (executors/scenarios)
def test_crash_rank_n_hits_the_live_holder_with_the_lowest_id():
    """Kills crash-rank-n-highest-id and crash-rank-n-hits-stopping (docs/architecture.md, "crash rank N")."""
    from executors.scenarios.timeline import rank_holder

    assert rank_holder([("llm#5", 1, "running"), ("llm#3", 1, "running"), ("llm#0", 0, "running")], 1) == "llm#3"
    assert rank_holder([("llm#1", 1, "stopping"), ("llm#4", 1, "starting")], 1) == "llm#4"
    assert rank_holder([("llm#1", 1, "stopping")], 1) is None


def test_a_scale_of_a_deployment_never_deployed_deploys_it():
    """Kills scale-never-deployed-refused (docs/architecture.md, "scale of a never-deployed deployment")."""
    from executors.scenarios.timeline import Desired, Scale

    calls: list[tuple] = []

    class Target:
        def apply(self, event):
            calls.append(("apply", event.name, event.num_replicas))

        def scale(self, deployment, replicas, victims):
            calls.append(("scale", deployment, replicas))

        def deployed(self, deployment):
            return any(c[0] == "apply" and c[1] == deployment for c in calls)

    spec = SimpleNamespace(name="llm", applied=lambda **kw: rc.DeploymentApplied(name="llm", num_replicas=kw.get("replicas", 1)))
    desired = Desired({"llm": spec})
    Scale(deployment="llm", replicas=3).perform(desired, Target())
    assert calls == [("apply", "llm", 3)]
    Scale(deployment="llm", replicas=2).perform(desired, Target())
    assert calls[-1] == ("scale", "llm", 2)


def test_check_placements_refuses_a_place_on_no_live_node_or_with_another_rank():
    """Kills invariant-noop-check-placements."""
    before = _managed()
    event = rc.ScaleRequested(deployment="app", num_replicas=3)
    result = rc.step(before, event)
    (place,) = [c for c in result.commands if isinstance(c, rc.PlaceReplica)]
    inv.check_placements(before, event, result)

    def forged(**changes):
        return attrs.evolve(result, commands=tuple(attrs.evolve(c, **changes) if c is place else c
                                                   for c in result.commands))

    with pytest.raises(rc.InvariantViolation, match="not a live node"):
        inv.check_placements(before, event, forged(node_id="n9"))
    with pytest.raises(rc.InvariantViolation, match="PlaceReplica says rank"):
        inv.check_placements(before, event, forged(rank=attrs.evolve(place.rank, local_rank=place.rank.local_rank + 1)))

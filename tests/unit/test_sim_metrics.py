"""The simulator's metrics count what happened, controller downtime included."""

from __future__ import annotations

import pytest

import rankcore as rc
from executors.sim import Simulation, load_scenario


def test_crashes_while_the_controller_is_down_are_counted():
    res = Simulation(load_scenario("examples/scenarios/controller-crash.yaml")).run()
    assert res.metrics["deployments"]["llm"]["crashes"] == 2


def test_crash_to_ready_of_a_crash_the_controller_never_heard_runs_to_the_recoverys_start_on_its_rank(tmp_path):
    """controller-crash.yaml: ranks 2 and 5 die at t=35 and t=36 while the controller is down; the
    recovery (t=50) starts llm#6 on rank 2 and llm#7 on rank 5: those are their replacements."""
    import json

    trace = tmp_path / "run.jsonl"
    with trace.open("w") as f:
        res = Simulation(load_scenario("examples/scenarios/controller-crash.yaml"), trace=f).run()
    ready = {r["replica"]: r["t"] for r in map(json.loads, trace.read_text().splitlines())
             if r.get("type") == "ReplicaReady"}
    m = res.metrics["deployments"]["llm"]
    assert m["replacements_ready"] == 2
    want = sorted([ready["llm#6"] - 35.0, ready["llm#7"] - 36.0])  # 2 replacements: p50 the one, p99 the other
    assert [m["crash_to_ready_p50"], m["crash_to_ready_p99"]] == pytest.approx(want, abs=1e-6)


def test_an_unheard_crash_pairs_with_the_recoverys_start_on_its_rank_and_no_other():
    from executors.scenarios import Metrics

    m = Metrics()
    m.crashed(1.0, "app", True, rank=0)  # heard: the core's own replacement (replaces=...) is timed
    assert m._unheard == {}
    m.crashed(2.0, "app", True, rank=0, heard=False)
    m.crashed(2.5, "app", True, rank=1, heard=False)
    spec = rc.DeploymentApplied(name="app", num_replicas=1)
    event = rc.ControllerRecovered(deployments=(spec,), reports=())
    res = rc.step(rc.State(), event)
    m(3.0, event, rc.State(), res)
    starts = [c for c in res.commands if isinstance(c, rc.StartReplica)]
    assert [c.global_rank for c in starts] == [0]
    # rank 0's start is its replacement, timed from its crash; rank 1 was not started again: forgotten
    assert m._crashed_at == {("app", starts[0].lineage): 2.0} and m._unheard == {}


def test_reassignments_compares_with_what_a_replica_said(tmp_path):
    """A replica whose local rank alone moved at recovery counts once, at that level."""
    from executors.scenarios import Metrics

    spec = rc.DeploymentApplied(name="app", num_replicas=2)
    reports = (
        rc.ReplicaReport(replica_id="app#0", deployment="app", node_id="n0",
                         rank=rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
        rc.ReplicaReport(replica_id="app#1", deployment="app", node_id="n0", phase="starting",
                         rank=rc.ReplicaRank(rank=1, node_rank=0, local_rank=0)),
    )
    event = rc.ControllerRecovered(deployments=(spec,), reports=reports)
    m = Metrics()
    m(0.0, event, rc.State(), rc.step(rc.State(), event))
    assert m.deployments["app"].reassignments == {"rank": 0, "node_rank": 0, "local_rank": 1, "any": 1}


def test_crash_to_ready_counts_from_the_failure_not_from_a_backed_off_start():
    """Once starts keep failing, a replica's first failure already holds its
    replacement back (the backoff is the deployment's): its wait begins with
    the failure, not with the later StartReplica."""
    from executors.scenarios import Metrics

    m = Metrics()
    st = rc.State()

    def feed(t: float, event: object) -> tuple:
        nonlocal st
        res = rc.step(st, event)
        m(t, event, st, res)
        st = res.state
        return res.commands

    def holder(rank: int) -> str:
        dep = st.deployments["app"]
        return next(r for r in dep.replicas if dep.ranks.global_rank(r) == rank)

    feed(0.0, rc.Tick(now=0.0))
    feed(0.0, rc.NodeJoined(node_id="n0", resources={"GPU": 2}))
    feed(0.0, rc.DeploymentApplied(name="app", num_replicas=2, resources={"GPU": 1}))
    for t in (1.0, 2.0):  # rank 0 fails to start twice: the second waits 1 s
        feed(t, rc.ReplicaPlaced(replica_id=holder(0), node_id="n0", now=t))
        feed(t, rc.ReplicaCrashed(replica_id=holder(0), cause="error", now=t))
    feed(3.0, rc.Tick(now=3.0))
    feed(3.0, rc.ReplicaPlaced(replica_id=holder(1), node_id="n0", now=3.0))
    cmds = feed(3.0, rc.ReplicaCrashed(replica_id=holder(1), cause="error", now=3.0))  # its first failure
    assert [type(c) for c in cmds] == [rc.ScheduleTick] and cmds[0].at == 5.0  # the third in a row: 2 s
    feed(5.0, rc.Tick(now=5.0))
    feed(5.5, rc.ReplicaPlaced(replica_id=holder(1), node_id="n0", now=5.5))
    feed(6.0, rc.ReplicaReady(replica_id=holder(1)))
    assert m.deployments["app"].crash_to_ready == [3.0]  # 3.0 -> 6.0 (not 5.0 -> 6.0)

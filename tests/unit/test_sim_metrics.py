"""The simulator's metrics count what happened, controller downtime included."""

from __future__ import annotations

import rankcore as rc
from executors.sim import Simulation, load_scenario


def test_crashes_while_the_controller_is_down_are_counted():
    res = Simulation(load_scenario("examples/scenarios/controller-crash.yaml")).run()
    assert res.metrics["deployments"]["llm"]["crashes"] == 2


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

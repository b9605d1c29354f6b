"""Regressions for bugs found in review (each test failed before its fix)."""

from __future__ import annotations

import time

import pytest

import rankcore as rc
from executors.sim import Simulation, load_scenario
from rankcore.invariants import check_recovery_roundtrip, reports_from
from rankcore.ranks import MAX_RANKS, RankTable
from tests.helpers import Driver, of


def test_user_config_update_survives_controller_recovery():
    """A replica still starting with the old user_config is reconfigured when ready,
    also after a controller recovery in between."""
    d = Driver(nodes=["n0"])
    d.run(rc.DeploymentApplied(name="app", num_replicas=2, user_config={"v": 1}, has_reconfigure=True),
          hold=lambda c: isinstance(c, rc.InitializeReplica) and c.replica_id == "app#1")
    d.run(rc.DeploymentApplied(name="app", num_replicas=2, user_config={"v": 2}, has_reconfigure=True))
    check_recovery_roundtrip(d.state)
    recovered = Driver(nodes=["n0"], state=rc.step(rc.State(), reports_from(d.state)).state)
    out = recovered.run(rc.ReplicaReady(replica_id="app#1"))
    (rec,) = of(rc.ReconfigureReplica, out)
    assert rec.user_config == {"v": 2} and rec.reason == "user_config"


def test_running_replica_reporting_an_old_config_is_reconfigured_at_recovery():
    spec = rc.DeploymentApplied(name="app", num_replicas=1, user_config={"v": 2}, has_reconfigure=True)
    rep = rc.ReplicaReport(replica_id="app#0", deployment="app", node_id="n0",
                           rank=rc.ReplicaRank(rank=0, node_rank=0, local_rank=0), user_config={"v": 1})
    r = rc.step(rc.State(), rc.ControllerRecovered(deployments=(spec,), reports=(rep,)))
    (rec,) = of(rc.ReconfigureReplica, r.commands)
    assert rec.user_config == {"v": 2} and rec.call_user


def test_failed_release_many_leaves_the_table_unchanged():
    t = RankTable().assign_many([("a", "n0"), ("c", "n1")])
    before = t.to_dict()
    with pytest.raises(rc.UnknownReplica):
        t.release_many(["a", "b"])
    assert t.to_dict() == before and t.holder_of(0) == "a"


def test_arguments_reading_another_version_do_not_corrupt():
    """An iterable argument that reads another version of the same table."""
    t1 = RankTable().assign("x", "n0")
    t2 = t1.assign("y", "n0")

    def reports():
        t1.to_dict()  # reroots the store to t1
        yield ("z", "n9", rc.ReplicaRank(rank=0, node_rank=5, local_rank=0))

    with pytest.raises(rc.RankConflict, match="rank 0"):
        t2.recover_many(reports())
    assert t2.to_dict() == {"x": (0, "n0", 0, 0), "y": (1, "n0", 0, 1)}


def test_absurd_claims_neither_block_recovery_nor_take_long():
    spec = rc.DeploymentApplied(name="app", num_replicas=2)
    reports = (
        rc.ReplicaReport(replica_id="app#0", deployment="app", node_id="n0",
                         rank=rc.ReplicaRank(rank=0, node_rank=10**8, local_rank=0)),
        rc.ReplicaReport(replica_id="app#1", deployment="app", node_id="n1",
                         rank={"rank": MAX_RANKS + 5, "node_rank": 0, "local_rank": 10**7}),
    )
    t0 = time.perf_counter()
    d = Driver(nodes=["n0"])
    d.run(rc.ControllerRecovered(deployments=(spec,), reports=reports))
    assert time.perf_counter() - t0 < 5  # generous: was 4 s of scanning for one report
    # n1's plausible node-rank claim stands; the absurd ones get the lowest free values
    assert d.ranks() == {"app#0": (0, 1, 0), "app#1": (1, 0, 0)}


def test_a_leaving_replica_loses_node_and_local_claims_to_a_serving_one():
    spec = rc.DeploymentApplied(name="app", num_replicas=1)
    reports = (
        rc.ReplicaReport(replica_id="app#0", deployment="app", node_id="n0", phase="stopping",
                         rank=rc.ReplicaRank(rank=1, node_rank=0, local_rank=0)),
        rc.ReplicaReport(replica_id="app#2", deployment="app", node_id="n0",
                         rank=rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
    )
    r = rc.step(rc.State(), rc.ControllerRecovered(deployments=(spec,), reports=reports))
    assert of(rc.ReconfigureReplica, r.commands) == []
    assert r.state.deployments["app"].ranks.rank_of("app#2") == rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)


def test_an_id_of_no_deployment_is_invalid_not_stale():
    d = Driver()
    d.run(rc.DeploymentApplied(name="app", num_replicas=2))
    with pytest.raises(rc.InvalidEvent, match="unknown replica 'nosuch#1'"):
        rc.step(d.state, rc.ReplicaReady(replica_id="nosuch#1"))


def test_crashes_while_the_controller_is_down_are_counted():
    res = Simulation(load_scenario("examples/scenarios/controller-crash.yaml")).run()
    assert res.metrics["deployments"]["llm"]["crashes"] == 2


def test_reassignments_compares_with_what_a_replica_said(tmp_path):
    """A replica whose local rank alone moved at recovery counts once, at that level."""
    from executors.sim.metrics import Metrics

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

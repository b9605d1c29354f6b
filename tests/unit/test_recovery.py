"""Controller recovery: ranks rebuilt from the replicas' reports alone."""

from __future__ import annotations

import attrs
import pytest

import rankcore as rc
from rankcore.base.ranks import MAX_RANKS
from rankcore.invariants import check_recovery_roundtrip, reports_from
from tests.helpers import Driver, of

SPEC = rc.DeploymentApplied(name="app", num_replicas=4, user_config={"m": 1}, has_reconfigure=True,
                            reconfigure_takes_rank=True)


def report(rid, rank, node="n0", **kw):
    return rc.ReplicaReport(replica_id=rid, deployment="app", rank=rank, node_id=node, **kw)


def healthy_driver(n=4, nodes=("n0", "n1")):
    d = Driver(nodes=nodes)
    d.run(rc.DeploymentApplied(name="app", num_replicas=n, user_config={"m": 1}, has_reconfigure=True,
                               reconfigure_takes_rank=True))
    return d


def test_recovery_from_own_reports_gives_same_ranks_and_no_commands():
    d = healthy_driver(6, nodes=("n0", "n1", "n2"))
    check_recovery_roundtrip(d.state)
    r = rc.step(rc.State(), reports_from(d.state))
    assert r.commands == ()
    assert r.state.ranks("app") == d.state.ranks("app")


def test_all_three_rank_forms_are_accepted():
    """A record, a bare int and a dict all recover (ray#64636 is this confusion)."""
    d = Driver(nodes=["n9"])
    cmds = d.run(rc.ControllerRecovered(deployments=(SPEC,), reports=(
        report("app#0", rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
        report("app#1", {"rank": 1, "node_rank": 0, "local_rank": 1}),
        report("app#2", {"rank": 2}),
        report("app#3", 3, node="n1"),
    )))
    assert d.ranks() == {"app#0": (0, 0, 0), "app#1": (1, 0, 1), "app#2": (2, 0, 2), "app#3": (3, 1, 0)}
    # the replicas that did not report their node/local ranks are told them
    assert sorted(c.replica_id for c in of(rc.ReconfigureReplica, cmds)) == ["app#2", "app#3"]


def test_gaps_left_by_dead_replicas_are_the_lowest_free_ranks():
    """Ray Serve hands out ranks above the highest recovered one; we refill the gap."""
    d = Driver(nodes=["n9"])
    cmds = d.run(rc.ControllerRecovered(deployments=(SPEC,), reports=(
        report("app#0", rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
        report("app#2", rc.ReplicaRank(rank=2, node_rank=0, local_rank=1)),
        report("app#3", rc.ReplicaRank(rank=3, node_rank=0, local_rank=2)),
    )))
    (start,) = of(rc.StartReplica, cmds)
    assert start.global_rank == 1
    assert sorted(r[0] for r in d.ranks().values()) == [0, 1, 2, 3]
    assert of(rc.ReconfigureReplica, cmds) == []


def test_duplicate_claims_are_resolved_deterministically():
    """Two replicas claiming rank 1: the one whose id sorts first keeps it; the other
    gets the lowest free rank and a reconfigure."""
    d = Driver(nodes=["n9"])
    cmds = d.run(rc.ControllerRecovered(deployments=(SPEC,), reports=(
        report("app#7", rc.ReplicaRank(rank=1, node_rank=0, local_rank=1)),
        report("app#5", rc.ReplicaRank(rank=1, node_rank=0, local_rank=0)),
        report("app#6", rc.ReplicaRank(rank=0, node_rank=0, local_rank=2)),
    )))
    assert d.ranks()["app#5"][0] == 1 and d.ranks()["app#6"][0] == 0
    assert d.ranks()["app#7"][0] == 2
    assert [c.replica_id for c in of(rc.ReconfigureReplica, cmds)][0] == "app#7"
    assert len(of(rc.StartReplica, cmds)) == 1


def test_replicas_beyond_target_are_stopped_conflicting_first():
    d = Driver(nodes=["n9"])
    spec = rc.DeploymentApplied(name="app", num_replicas=2)
    cmds = d.run(rc.ControllerRecovered(deployments=(spec,), reports=(
        report("app#0", rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
        report("app#1", rc.ReplicaRank(rank=0, node_rank=0, local_rank=1)),
        report("app#2", rc.ReplicaRank(rank=1, node_rank=0, local_rank=2)),
    )))
    assert [c.replica_id for c in of(rc.StopReplica, cmds)] == ["app#1"]
    assert d.ranks() == {"app#0": (0, 0, 0), "app#2": (1, 0, 1)}


def test_ranks_at_or_above_target_are_compacted_once_healthy():
    d = Driver(nodes=["n9"])
    spec = rc.DeploymentApplied(name="app", num_replicas=2, user_config={}, has_reconfigure=True,
                                reconfigure_takes_rank=True)
    cmds = d.run(rc.ControllerRecovered(deployments=(spec,), reports=(
        report("app#0", rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
        report("app#3", rc.ReplicaRank(rank=5, node_rank=0, local_rank=1)),
    )))
    (rec,) = of(rc.ReconfigureReplica, cmds)
    assert rec.replica_id == "app#3" and rec.rank.rank == 1 and rec.call_user


def test_node_rank_claims_majority_wins_and_conflicts_move():
    d = Driver(nodes=["n9"])
    d.run(rc.ControllerRecovered(deployments=(SPEC,), reports=(
        report("app#0", rc.ReplicaRank(rank=0, node_rank=1, local_rank=0), node="a"),
        report("app#1", rc.ReplicaRank(rank=1, node_rank=1, local_rank=1), node="a"),
        report("app#2", rc.ReplicaRank(rank=2, node_rank=0, local_rank=2), node="a"),
        report("app#3", rc.ReplicaRank(rank=3, node_rank=1, local_rank=0), node="b"),
    )))
    ranks = d.ranks()
    assert {ranks[r][1] for r in ("app#0", "app#1", "app#2")} == {ranks["app#0"][1]}
    assert ranks["app#0"][1] != ranks["app#3"][1]
    assert sorted({v[1] for v in ranks.values()}) == [0, 1]


def test_reports_of_unknown_deployments_are_stopped_not_dropped():
    d = Driver(nodes=["n9"])
    orphan = rc.ReplicaReport(replica_id="old-x", deployment="gone", rank=0, node_id="n0")
    cmds = d.run(rc.ControllerRecovered(deployments=(SPEC,), reports=(orphan,), stop_unknown=True))
    assert rc.StopReplica(replica_id="old-x", deployment="gone") in cmds
    assert rc.step(d.state, rc.ReplicaStopped(replica_id="old-x")).stale


def test_starting_replica_with_changed_rank_is_told_when_ready():
    d = Driver(nodes=["n9"])
    r = d.step(rc.ControllerRecovered(deployments=(SPEC,), reports=(
        report("app#0", rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
        report("app#1", rc.ReplicaRank(rank=0, node_rank=0, local_rank=1), phase="starting"),
    )))
    assert of(rc.ReconfigureReplica, r.commands) == []
    assert r.state.deployments["app"].replicas["app#1"].rank_update_due
    out = d.run(rc.ReplicaReady(replica_id="app#1"))
    (rec,) = of(rc.ReconfigureReplica, out)
    assert rec.replica_id == "app#1" and rec.rank.rank == 1


def test_recovery_sets_id_counter_past_reported_ids():
    d = Driver(nodes=["n9"])
    cmds = d.run(rc.ControllerRecovered(deployments=(SPEC,), reports=(
        report("app#41", rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
    )))
    assert sorted(c.replica_id for c in of(rc.StartReplica, cmds)) == ["app#42", "app#43", "app#44"]


def test_recovery_mid_downscale_keeps_stopping_replicas_ranked():
    d = healthy_driver(4)
    d.run(rc.ScaleRequested(deployment="app", num_replicas=2), hold=lambda c: isinstance(c, rc.StopReplica))
    check_recovery_roundtrip(d.state)
    r = rc.step(rc.State(), reports_from(d.state))
    stopping = [rid for rid, rep in r.state.deployments["app"].replicas.items() if rep.phase.value == "stopping"]
    assert len(stopping) == 2


@pytest.mark.parametrize("bad", [[], "x", 1.5, {"rank": -1}, {"rank": 0, "extra": 1}, True])
def test_malformed_rank_in_report_raises_invalid_config(bad):
    with pytest.raises(rc.InvalidConfig):
        report("app#0", bad)


def test_recovery_never_reuses_the_id_of_a_replica_that_died_meanwhile():
    """With the executor's id high-water mark, a dead replica's id is not handed out
    again, so its late news stays stale instead of hitting a new replica."""
    d = healthy_driver(3, nodes=("n0",))
    exact = reports_from(d.state)
    dead = exact.reports[-1].replica_id
    survivors = tuple(r for r in exact.reports if r.replica_id != dead)
    r = rc.step(rc.State(), rc.ControllerRecovered(deployments=exact.deployments, reports=survivors,
                                                   next_replica_number=d.state.next_replica))
    (start,) = of(rc.StartReplica, r.commands)
    assert start.replica_id != dead
    assert rc.step(r.state, rc.ReplicaCrashed(replica_id=dead)).stale


def test_news_about_a_departed_foreign_id_is_stale():
    """Ids not made by the core (from reports) are remembered once they leave."""
    spec = rc.DeploymentApplied(name="app", num_replicas=1)
    r = rc.step(rc.State(), rc.ControllerRecovered(deployments=(spec,), reports=(
        report("uuid-1", rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
        report("uuid-2", rc.ReplicaRank(rank=1, node_rank=0, local_rank=1)),
    )))
    (stop,) = of(rc.StopReplica, r.commands)
    after = rc.step(r.state, rc.ReplicaStopped(replica_id=stop.replica_id))
    assert rc.step(after.state, rc.ReplicaCrashed(replica_id=stop.replica_id)).stale
    with pytest.raises(rc.InvalidEvent, match="unknown replica 'uuid-9'"):
        rc.step(after.state, rc.ReplicaCrashed(replica_id="uuid-9"))


# ------------------------------------------- what to persist; destructive outcomes
def test_desired_specs_fold_scales_in_so_recovery_keeps_the_scaled_count():
    """Recovering with the first DeploymentApplied after a scale 6 -> 3 scales back
    to 6, and the step says so; desired_specs(state) keeps 3 (issue 8, point 11)."""
    first = rc.DeploymentApplied(name="app", num_replicas=6, user_config={"v": 1}, has_reconfigure=True)
    d = Driver(nodes=["n0", "n1"])
    d.run(first)
    d.run(rc.ScaleRequested(deployment="app", num_replicas=3))
    (spec,) = rc.query.desired_specs(d.state)
    assert spec == attrs.evolve(first, num_replicas=3)
    live = reports_from(d.state).reports
    good = rc.step(rc.State(), rc.ControllerRecovered(deployments=rc.query.desired_specs(d.state), reports=live))
    assert good.commands == () and good.recovery == rc.RecoveryOutcome()
    assert not good.recovery.destructive
    stale = rc.step(rc.State(), rc.ControllerRecovered(deployments=(first,), reports=live))
    assert len(stale.recovery.started) == 3 and stale.state.deployments["app"].target == 6


def test_recovery_naming_no_deployment_refuses_to_stop_the_fleet():
    d = Driver(nodes=["n0"])
    d.run(SPEC)
    live = reports_from(d.state).reports
    with pytest.raises(rc.InvalidEvent, match=r"4 live replicas are of deployments the event does not name \('app'\)"):
        rc.step(rc.State(), rc.ControllerRecovered(deployments=(), reports=live))
    r = rc.step(rc.State(), rc.ControllerRecovered(deployments=(), reports=live, stop_unknown=True))
    assert r.recovery.unknown_stopped == ("app#0", "app#1", "app#2", "app#3") and r.recovery.destructive
    assert [c.replica_id for c in of(rc.StopReplica, r.commands)] == ["app#0", "app#1", "app#2", "app#3"]


def test_recovery_outcome_names_replicas_stopped_beyond_the_target():
    d = Driver(nodes=["n0"])
    d.run(SPEC)
    live = reports_from(d.state).reports
    r = rc.step(rc.State(), rc.ControllerRecovered(deployments=(attrs.evolve(SPEC, num_replicas=3),), reports=live))
    assert r.recovery.stopped == ("app#3",) and r.recovery.destructive
    assert r.recovery.started == () and r.recovery.unknown_stopped == ()


def test_a_contested_node_rank_goes_to_the_majority_claim():
    """Node a's replicas claim node rank 1 twice and 0 once: a keeps 1 (the
    majority), and b, which also claims 1, moves to the free 0."""
    r = rc.step(rc.State(), rc.ControllerRecovered(deployments=(SPEC,), reports=(
        report("app#0", rc.ReplicaRank(rank=0, node_rank=1, local_rank=0), node="a"),
        report("app#1", rc.ReplicaRank(rank=1, node_rank=1, local_rank=1), node="a"),
        report("app#2", rc.ReplicaRank(rank=2, node_rank=0, local_rank=2), node="a"),
        report("app#3", rc.ReplicaRank(rank=3, node_rank=1, local_rank=0), node="b"),
    )))
    ranks = {rid: rk.as_tuple() for rid, rk in r.state.ranks("app").items()}
    assert ranks == {"app#0": (0, 1, 0), "app#1": (1, 1, 1), "app#2": (2, 1, 2), "app#3": (3, 0, 0)}
    assert [c.replica_id for c in of(rc.ReconfigureReplica, r.commands)] == ["app#2", "app#3"]


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


def test_absurd_claims_count_as_no_claim():
    spec = rc.DeploymentApplied(name="app", num_replicas=2)
    reports = (
        rc.ReplicaReport(replica_id="app#0", deployment="app", node_id="n0",
                         rank=rc.ReplicaRank(rank=0, node_rank=10**8, local_rank=0)),
        rc.ReplicaReport(replica_id="app#1", deployment="app", node_id="n1",
                         rank={"rank": MAX_RANKS + 5, "node_rank": 0, "local_rank": 10**7}),
    )
    d = Driver(nodes=["n0"])
    d.run(rc.ControllerRecovered(deployments=(spec,), reports=reports))  # was 4 s of scanning for one report
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


def test_a_serving_replica_keeps_a_rank_a_leaving_one_also_claims():
    """Claims are kept serving-first: the stopping replica gives way, the running
    one keeps its rank and needs no reconfigure."""
    spec = rc.DeploymentApplied(name="app", num_replicas=2, user_config={"m": 1}, has_reconfigure=True)
    r = rc.step(rc.State(), rc.ControllerRecovered(deployments=(spec,), reports=(
        report("app#0", rc.ReplicaRank(rank=0, node_rank=0, local_rank=0)),
        report("app#5", rc.ReplicaRank(rank=1, node_rank=0, local_rank=1), phase="stopping"),
        report("app#7", rc.ReplicaRank(rank=1, node_rank=1, local_rank=0), node="n1"),
    )))
    ranks = r.state.deployments["app"].ranks
    assert ranks.global_rank("app#7") == 1 and ranks.global_rank("app#5") == 2
    assert [c.replica_id for c in of(rc.ReconfigureReplica, r.commands)] == []


def test_recovery_announces_the_world_size_to_replicas_that_missed_it():
    spec = rc.DeploymentApplied(name="app", num_replicas=2)
    reports = (report("app#0", rc.ReplicaRank(rank=0, node_rank=0, local_rank=0), world_size=3),
               report("app#1", rc.ReplicaRank(rank=1, node_rank=0, local_rank=1), world_size=2))
    r = rc.step(rc.State(), rc.ControllerRecovered(deployments=(spec,), reports=reports))
    assert of(rc.UpdateWorldSize, r.commands) == [rc.UpdateWorldSize(deployment="app", world_size=2)]
    same = tuple(attrs.evolve(x, world_size=2) for x in reports)
    assert of(rc.UpdateWorldSize, rc.step(rc.State(), rc.ControllerRecovered(deployments=(spec,), reports=same)).commands) == []


# ------------------------------------------------ issue 19: refused inputs, unresponsive replicas
def placed_report(rid, rank, node="n0", local=None, **kw):
    return report(rid, rc.ReplicaRank(rank=rank, node_rank=0 if node == "n0" else 1,
                                      local_rank=rank if local is None else local), node=node, **kw)


def test_failed_report_without_static_placement_is_refused_naming_replica_and_deployment():
    """Bug 3: ``failed`` is a static-placement phase; elsewhere it used to give a
    state failing check_state ("FAILED replica ... still holds node ranks")."""
    spec = rc.DeploymentApplied(name="app", num_replicas=2)
    event = rc.ControllerRecovered(deployments=(spec,), reports=(
        placed_report("app#0", 0, phase="failed"), placed_report("app#1", 1)))
    with pytest.raises(rc.InvalidEvent, match=r"replica 'app#0' of deployment 'app' reports phase 'failed'.*"
                                              r"no static placement"):
        rc.step(rc.State(), event)


def static_spec(bundle_nodes=("n0", "n0", "n1", "n1")):
    return rc.DeploymentApplied(name="s", num_replicas=2, static_placement=rc.StaticPlacement.from_mapping(
        "pg-1", bundle_nodes, {0: [0, 1], 1: [2, 3]}))


def static_report(rid, rank, node, **kw):
    return rc.ReplicaReport(replica_id=rid, deployment="s", node_id=node,
                            rank=rc.ReplicaRank(rank=rank, node_rank=rank, local_rank=0), **kw)


def test_failed_static_report_keeps_the_rank_failed_and_stops_its_process():
    """A static replica reporting ``failed`` while its bundles have no node: FAILED
    (global rank only, no node ranks), its process stopped at once; the answer
    to that stop is stale, as after any FAILED replica's stop."""
    d = Driver(nodes=["n9"])
    cmds = d.run(rc.ControllerRecovered(deployments=(static_spec(("n0", "n0", "n1", None)),), reports=(
        static_report("s#0", 0, "n0"), static_report("s#1", 1, "n1", phase="failed"))),
        hold=lambda c: isinstance(c, rc.StopReplica))
    (stop,) = of(rc.StopReplica, cmds)
    assert stop.replica_id == "s#1" and stop.graceful_shutdown_timeout_s == 0
    rep = d.dep("s").replicas["s#1"]
    assert rep.phase is rc.Phase.FAILED and rep.node_id is None and d.ranks("s")["s#1"] is None
    assert d.dep("s").ranks.global_rank("s#1") == 1
    assert rc.step(d.state, rc.ReplicaStopped(replica_id="s#1")).stale


def test_failed_static_report_whose_bundles_are_placed_restarts_on_them():
    d = Driver(nodes=["n9"])
    r = d.step(rc.ControllerRecovered(deployments=(static_spec(),), reports=(
        static_report("s#0", 0, "n0", phase="failed"), static_report("s#1", 1, "n1"))))
    assert [type(c).__name__ for c in r.commands] == ["StopReplica", "StartReplica", "PlaceReplica"]
    start, place = r.commands[1:]
    assert (start.replaces, start.global_rank, place.node_id, place.bundles) == ("s#0", 0, "n0", (0, 1))


def test_recovery_on_a_live_state_is_refused():
    """Bug 4: it used to drop every deployment and node with no command and a
    non-destructive outcome."""
    d = healthy_driver(2)
    d.step(rc.NodeJoined(node_id="n5", resources={"GPU": 1}))
    with pytest.raises(rc.InvalidEvent, match=r"ControllerRecovered needs a fresh State\(\); this state has "
                                              r"1 deployments and 1 nodes"):
        rc.step(d.state, rc.ControllerRecovered(deployments=(), reports=()))
    ticked = rc.step(rc.State(), rc.Tick(now=5.0)).state  # a fresh state with a clock is fine
    assert rc.step(ticked, reports_from(d.state)).state.deployments["app"].target == 2


def unresponsive(rid="app#1", node="n0", deployment="app"):
    return rc.UnresponsiveReplica(replica_id=rid, deployment=deployment, node_id=node)


def recover_with_unresponsive(**kw):
    """app at 4: ranks 0, 2 report; app#1 (rank 1, unknown to the core) does not answer; rank 3 died."""
    d = Driver(nodes=["n0"])
    result = d.step(rc.ControllerRecovered(deployments=(SPEC,), reports=(
        placed_report("app#0", 0), placed_report("app#2", 2)), unresponsive=(unresponsive(),), **kw))
    return d, result


def test_unresponsive_replica_is_stopped_at_once_and_no_rank_is_given_until_it_has_gone():
    """A replica that did not answer its report call used to be a gap refilled at
    once while it lived on: it could run next to its replacement on its rank."""
    d, r = recover_with_unresponsive()
    assert r.commands == (rc.StopReplica(replica_id="app#1", deployment="app", graceful_shutdown_timeout_s=0.0),)
    assert r.recovery.unresponsive_stopped == ("app#1",) and r.recovery.stopped == ()
    assert r.recovery.destructive  # it stopped a live process
    assert not d.dep().healthy and dict(d.dep().unresponsive) == {"app#1": "n0"}
    # a scale up while it lives gives no rank either
    up = d.step(rc.ScaleRequested(deployment="app", num_replicas=5))
    assert of(rc.StartReplica, up.commands) == []
    gone = d.step(rc.ReplicaStopped(replica_id="app#1"))
    assert not gone.stale
    assert [c.global_rank for c in of(rc.StartReplica, gone.commands)] == [1, 3, 4]
    assert dict(d.dep().unresponsive) == {}
    assert rc.step(d.state, rc.ReplicaStopped(replica_id="app#1")).stale  # (its answer again)


def test_unresponsive_replica_that_crashes_lifts_the_hold_too():
    d, _ = recover_with_unresponsive()
    out = d.run(rc.ReplicaCrashed(replica_id="app#1", cause="killed"))
    assert [c.global_rank for c in of(rc.StartReplica, out)] == [1, 3]
    assert d.dep().healthy and sorted(r[0] for r in d.ranks().values()) == [0, 1, 2, 3]


def test_no_compaction_into_a_rank_an_unresponsive_replica_may_hold():
    """Scaled down to the reporting replicas (ranks 0 and 2): rank 2 is not moved
    to 1 until the replica that may hold rank 1 has gone."""
    d, _ = recover_with_unresponsive()
    down = d.step(rc.ScaleRequested(deployment="app", num_replicas=2))
    assert down.compactions == () and of(rc.ReconfigureReplica, down.commands) == []
    gone = d.step(rc.ReplicaStopped(replica_id="app#1"))
    (rec,) = of(rc.ReconfigureReplica, gone.commands)
    assert (rec.replica_id, rec.rank.rank) == ("app#2", 1)


def test_unresponsive_ids_are_never_handed_out_again_and_foreign_ones_are_remembered():
    d = Driver(nodes=["n0"])
    d.step(rc.ControllerRecovered(deployments=(SPEC,), reports=(placed_report("app#0", 0),),
                                  unresponsive=(unresponsive("app#7"), unresponsive("uuid-x", node=None))))
    assert d.state.next_replica == 8
    d.step(rc.ReplicaStopped(replica_id="uuid-x"))
    assert dict(d.dep().unresponsive) == {"app#7": "n0"}
    assert rc.step(d.state, rc.ReplicaReady(replica_id="uuid-x")).stale
    out = d.run(rc.ReplicaStopped(replica_id="app#7"))
    assert [c.replica_id for c in of(rc.StartReplica, out)] == ["app#8", "app#9", "app#10"]


def test_unresponsive_replicas_of_unknown_deployments_follow_stop_unknown():
    silent = unresponsive("old#3", deployment="old")
    with pytest.raises(rc.InvalidEvent, match=r"1 live replicas are of deployments the event does not name \('old'\)"):
        rc.step(rc.State(), rc.ControllerRecovered(deployments=(SPEC,), reports=(), unresponsive=(silent,)))
    r = rc.step(rc.State(), rc.ControllerRecovered(deployments=(SPEC,), reports=(), unresponsive=(silent,),
                                                   stop_unknown=True))
    assert rc.StopReplica(replica_id="old#3", deployment="old", graceful_shutdown_timeout_s=0.0) in r.commands
    assert r.recovery.unknown_stopped == ("old#3",) and r.recovery.unresponsive_stopped == ()
    assert rc.step(r.state, rc.ReplicaStopped(replica_id="old#3")).stale


def test_a_replica_cannot_both_report_and_be_unresponsive():
    with pytest.raises(rc.InvalidConfig, match="'app#0' is both in reports and in unresponsive"):
        rc.ControllerRecovered(deployments=(SPEC,), reports=(placed_report("app#0", 0),),
                               unresponsive=(unresponsive("app#0"),))
    with pytest.raises(rc.InvalidConfig, match="unresponsive names 'app#1' twice"):
        rc.ControllerRecovered(deployments=(SPEC,), reports=(), unresponsive=(unresponsive(), unresponsive()))


# ------------------------------------------------------- sleep and weights (issue 21)
def _fed(events):
    state = rc.State()
    for ev in events:
        result = rc.step(state, ev)
        state = result.state
    return state, result


def _restart(state, **changes):
    event = attrs.evolve(reports_from(state), **changes)
    return rc.step(rc.State(), event)


def test_a_push_no_replica_holds_yet_survives_a_controller_restart():
    """The version is persisted beside the specs (``desired_weights``): a replacement
    placed after the restart starts with it (found in review: it started with 0)."""
    state, _ = _fed([rc.DeploymentApplied(name="d", num_replicas=1), rc.ReplicaPlaced(replica_id="d#0", node_id="n"),
                     rc.ReplicaReady(replica_id="d#0"), rc.ReplicaCrashed(replica_id="d#0"),
                     rc.WeightsPushed(deployment="d", version=1)])
    assert rc.query.desired_weights(state) == (("d", 1),)
    after = _restart(state)
    assert after.state.deployments["d"].weights_version == 1
    placed = rc.step(after.state, rc.ReplicaPlaced(replica_id="d#1", node_id="n"))
    assert [c.weights_version for c in placed.commands if isinstance(c, rc.InitializeReplica)] == [1]
    lost = _restart(state, weights_versions=())  # (an embedder that did not persist it: the reports' newest)
    assert lost.state.deployments["d"].weights_version == 0


def test_a_restart_settles_every_replica_a_failed_sleep_and_an_update_not_held():
    state, _ = _fed([rc.DeploymentApplied(name="d", num_replicas=2), rc.ReplicaPlaced(replica_id="d#0", node_id="n"),
                     rc.ReplicaPlaced(replica_id="d#1", node_id="n"), rc.ReplicaReady(replica_id="d#0"),
                     rc.ReplicaReady(replica_id="d#1"), rc.WeightsPushed(deployment="d", version=2),
                     rc.SleepRequested(deployment="d"), rc.TierMoveFailed(replica_id="d#0")])
    event = reports_from(state)
    # a real replica reports the version it holds: d#1 never answered its UpdateWeights
    reports = tuple(attrs.evolve(r, weights_version=0) if r.replica_id == "d#1" else r for r in event.reports)
    result = rc.step(rc.State(), attrs.evolve(event, reports=reports))
    sent = [(type(c).__name__, c.replica_id) for c in result.commands if isinstance(
        c, (rc.OffloadReplica, rc.LoadReplica, rc.UpdateWeights))]
    assert ("OffloadReplica", "d#0") in sent and ("UpdateWeights", "d#1") in sent
    assert result.state.deployments["d"].asleep and result.state.deployments["d"].weights_version == 2


def test_a_late_answer_after_a_restart_is_what_happened():
    """A move the previous controller sent lands after the restart: the weights are
    where the answer says, and the replica is settled from there."""
    state, _ = _fed([rc.DeploymentApplied(name="d", num_replicas=1), rc.ReplicaPlaced(replica_id="d#0", node_id="n"),
                     rc.ReplicaReady(replica_id="d#0"), rc.SleepRequested(deployment="d"),
                     rc.WakeRequested(deployment="d")])  # offloading, meant to be awake
    after = _restart(state)
    assert after.state.deployments["d"].replicas["d#0"].residency is rc.Residency.HOT
    late = rc.step(after.state, rc.TierMoved(replica_id="d#0", tier="warm"))
    assert not late.stale and [type(c).__name__ for c in late.commands] == ["LoadReplica"]


def test_recovery_refuses_names_it_does_not_know_and_a_warm_starter():
    spec = rc.DeploymentApplied(name="d", num_replicas=1)
    with pytest.raises(rc.InvalidEvent, match="asleep names 'x'"):
        rc.step(rc.State(), rc.ControllerRecovered(deployments=[spec], reports=[], asleep=["x"]))
    with pytest.raises(rc.InvalidEvent, match="weights_versions names 'x'"):
        rc.step(rc.State(), rc.ControllerRecovered(deployments=[spec], reports=[], weights_versions={"x": 2}))
    with pytest.raises(rc.InvalidConfig, match="a starting replica cannot be warm"):
        rc.ReplicaReport(replica_id="d#0", deployment="d", rank=0, node_id="n", phase="starting", tier="warm")
    with pytest.raises(rc.InvalidConfig, match=r"is not a \(deployment, version >= 0\) pair"):
        rc.ControllerRecovered(deployments=[spec], reports=[], weights_versions=[("d", -1)])


def test_a_placed_never_initialised_replica_keeps_the_local_rank_its_placement_reserved():
    """(provision-4-to-16 crashed while 12 placements were under way.) A ``pending`` report on a node
    that carries the node and local ranks its PlaceReplica reserved keeps them, and is initialised with
    them; without them the free local ranks go by replica id (``app#10`` before ``app#9``)."""
    spec = attrs.evolve(SPEC, num_replicas=3)
    reserved = [report("app#9", {"rank": 0, "node_rank": 0, "local_rank": 0}, phase="pending"),
                report("app#10", {"rank": 1, "node_rank": 0, "local_rank": 1}, phase="pending"),
                report("app#11", {"rank": 2, "node_rank": 0, "local_rank": 2}, phase="pending")]
    d = Driver(nodes=["n0"])
    cmds = d.run(rc.ControllerRecovered(deployments=(spec,), reports=tuple(reserved)))
    assert d.ranks() == {"app#9": (0, 0, 0), "app#10": (1, 0, 1), "app#11": (2, 0, 2)}
    assert {c.replica_id: c.rank.as_tuple() for c in of(rc.InitializeReplica, cmds)} == d.ranks()
    bare = Driver(nodes=["n0"])
    bare.run(rc.ControllerRecovered(deployments=(spec,), reports=tuple(
        report(r.replica_id, r.rank.rank, phase="pending") for r in reserved)))
    assert bare.ranks()["app#9"] != (0, 0, 0)  # (the case the reserved ranks are told for)

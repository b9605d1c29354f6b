"""Directed tests of static placement on a caller's placement group (Ray RFC
#59857) and of gangs (issue 10), in the pure core, with every invariant
checked after every step."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.base.lifecycle import Phase
from rankcore.invariants import check_recovery_roundtrip, check_step
from tests.helpers import placed_answers


class Exec:
    """Answers every command at once: StartReplica waits for its PlaceReplica
    (managed or static), PlaceReplica -> ReplicaPlaced on that node,
    InitializeReplica -> ready, StopReplica -> stopped."""

    def __init__(self, *nodes: tuple[str, float]) -> None:
        self.state = rc.State()
        self.log: list[object] = []
        for node, gpus in nodes:
            self.run(rc.NodeJoined(node_id=node, resources={"GPU": gpus}))

    def step(self, event: object) -> rc.Step:
        before = self.state
        result = rc.step(before, event)
        check_step(before, event, result, full=True)
        self.state = result.state
        return result

    def run(self, event: object, hold: type | None = None) -> list[object]:
        out: list[object] = []
        queue = [event]
        while queue:
            for c in self.step(queue.pop(0)).commands:
                out.append(c)
                if hold is not None and isinstance(c, hold):
                    continue
                queue.extend(placed_answers(c))
        self.log.extend(out)
        return out

    def dep(self, name: str = "app") -> rc.Deployment:
        return self.state.deployments[name]

    def by_rank(self, name: str = "app") -> dict[int, rc.Replica]:
        d = self.dep(name)
        return {d.ranks.global_rank(r): d.replicas[r] for r in d.replicas}


def of(kind: type, cmds: list[object]) -> list:
    return [c for c in cmds if isinstance(c, kind)]


def static(nodes=("n0", "n0", "n1", "n1"), mapping=None) -> rc.StaticPlacement:
    return rc.StaticPlacement.from_mapping("pg-1", nodes, mapping or {0: [0, 1], 1: [2, 3]})


# ------------------------------------------------------------- validation
@pytest.mark.parametrize("mapping, words", [
    ({0: [0], 2: [1]}, "contiguous from 0"),
    ({1: [0]}, "contiguous from 0"),
    ({0: []}, "rank 0 needs a bundle"),
    ({0: [-1]}, "non-negative"),
    ({0: [True]}, "non-negative ints"),
    ({0: [4]}, "has 4 bundles"),
    ({0: [0, 1], 1: [1, 2]}, "bundle 1 is given to rank 0 and to rank 1"),
    ({"0": [0]}, "not an int"),
    ({}, "empty"),
])
def test_static_mapping_validation_names_the_culprit(mapping, words):
    with pytest.raises(rc.InvalidConfig, match=words):
        rc.StaticPlacement.from_mapping("pg", ["n0"] * 4, mapping)


def test_static_replica_count_is_the_mapping_length():
    with pytest.raises(rc.InvalidConfig, match="fixed to the mapping's length"):
        rc.DeploymentApplied(name="app", num_replicas=3, static_placement=static())
    with pytest.raises(rc.InvalidConfig, match=r"must be a rankcore\.StaticPlacement"):
        rc.DeploymentApplied(name="app", num_replicas=2, static_placement={0: [0]})


# ------------------------------------------------------------- static placement
@pytest.mark.parametrize("managed", [False, True])
def test_static_ranks_run_on_their_first_bundle(managed):
    ex = Exec(("n0", 8), ("n1", 8)) if managed else Exec()
    cmds = ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static(), resources={"GPU": 1}))
    places = {c.rank.rank: c for c in of(rc.PlaceReplica, cmds)}
    assert {r: (c.node_id, c.bundles, c.group) for r, c in places.items()} == {
        0: ("n0", (0, 1), "pg-1"), 1: ("n1", (2, 3), "pg-1")}
    assert ex.dep().healthy
    if managed:  # the group holds the resources: nothing booked on the cluster model
        assert {n: node.free["GPU"] for n, node in ex.state.cluster.nodes.items()} == {"n0": 8.0, "n1": 8.0}


def test_static_scale_is_rejected_and_mapping_is_fixed():
    ex = Exec()
    ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static()))
    with pytest.raises(rc.InvalidConfig, match="fixes the replica count"):
        rc.step(ex.state, rc.ScaleRequested(deployment="app", num_replicas=3))
    other = rc.StaticPlacement.from_mapping("pg-1", ["n0"] * 4, {0: [1, 0], 1: [2, 3]})
    with pytest.raises(rc.InvalidConfig, match="changes its static placement"):
        rc.step(ex.state, rc.DeploymentApplied(name="app", num_replicas=2, static_placement=other))
    with pytest.raises(rc.InvalidConfig, match="changes its static placement"):
        rc.step(ex.state, rc.DeploymentApplied(name="app", num_replicas=2))


def test_static_shuts_down_to_zero_and_comes_back_on_its_bundles():
    """0 is the one other count: it shuts the deployment down (a FAILED replica,
    with no process, leaves at once) and the mapping's length brings it back."""
    ex = Exec()
    ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static()))
    ex.run(rc.NodeLost(node_id="n1"))
    cmds = ex.run(rc.ScaleRequested(deployment="app", num_replicas=0), hold=rc.StopReplica)
    (stop,) = of(rc.StopReplica, cmds)  # the running one; the FAILED one just leaves
    with pytest.raises(rc.InvalidEvent, match="still has 1 replicas stopping"):
        rc.step(ex.state, rc.ScaleRequested(deployment="app", num_replicas=2))
    ex.run(rc.ReplicaStopped(replica_id=stop.replica_id))
    assert len(ex.dep().replicas) == 0 and ex.dep().target == 0
    cmds = ex.run(rc.ScaleRequested(deployment="app", num_replicas=2))
    assert [c.global_rank for c in of(rc.StartReplica, cmds)] == [0]  # rank 1's bundles are still lost
    assert ex.by_rank()[1].phase is Phase.FAILED
    assert rc.DeploymentApplied(name="app", num_replicas=0, static_placement=static()).num_replicas == 0


def test_static_comeback_is_refused_while_a_replica_stops_even_when_an_unresponsive_one_holds_starts_back():
    """Found by the property machine (issue 20): after a recovery that reports one
    replica still stopping and another unresponsive, scaling a static deployment
    back up started nothing (an unresponsive replica holds every start back) and
    was silently accepted; the rule refuses it at the scale, like any comeback
    while its bundles are busy."""
    sp = static(nodes=("n0", "n0", "n0", "n0"))
    recovered = rc.ControllerRecovered(
        deployments=(rc.DeploymentApplied(name="app", num_replicas=0, static_placement=sp),),
        reports=(rc.ReplicaReport(replica_id="app#1", deployment="app", rank=rc.ReportedRank(rank=1, node_rank=0,
                                  local_rank=1), node_id="n0", phase=Phase.STOPPING, world_size=0, lineage=1),),
        unresponsive=(rc.UnresponsiveReplica(replica_id="app#0", deployment="app", node_id="n0"),),
        next_replica_number=2, next_lineage=2, nodes=(rc.NodeJoined(node_id="n0", resources={"GPU": 4}),))
    state = rc.step(rc.State(), recovered).state
    assert state.deployments["app"].count(Phase.STOPPING) == 1 and state.deployments["app"].unresponsive
    with pytest.raises(rc.InvalidEvent, match="still has 1 replicas stopping"):
        rc.step(state, rc.ScaleRequested(deployment="app", num_replicas=2))


def test_static_crash_restarts_on_the_same_bundles_and_rank():
    ex = Exec()
    ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static()))
    old = ex.by_rank()[1]
    cmds = ex.run(rc.ReplicaCrashed(replica_id=old.replica_id, reason="killed"))
    (start,) = of(rc.StartReplica, cmds)
    (place,) = of(rc.PlaceReplica, cmds)
    assert (start.global_rank, start.replaces, start.lineage) == (1, old.replica_id, old.lineage)
    assert (place.node_id, place.bundles) == ("n1", (2, 3))
    assert ex.dep().healthy and ex.by_rank()[1].replica_id == start.replica_id


def test_static_node_loss_fails_that_replica_only_and_bundles_back_restart_it():
    ex = Exec(("n0", 8), ("n1", 8), ("n2", 8))
    ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static()))
    r0, r1 = ex.by_rank()[0], ex.by_rank()[1]
    cmds = ex.run(rc.NodeLost(node_id="n1"))
    assert [c.replica_id for c in of(rc.StopReplica, cmds)] == [r1.replica_id]
    assert of(rc.StartReplica, cmds) == [] and of(rc.PlaceReplica, cmds) == []  # nothing moved elsewhere
    dep = ex.dep()
    assert dep.replicas[r1.replica_id].phase is Phase.FAILED and dep.count(Phase.FAILED) == 1
    assert dep.replicas[r0.replica_id].phase is Phase.RUNNING and not dep.healthy
    assert dep.ranks.global_rank(r1.replica_id) == 1  # it keeps its rank
    assert dep.static.bundle_nodes == ("n0", "n0", None, None)
    # news about the failed replica is stale; a crash of it does not replace it
    assert rc.step(ex.state, rc.ReplicaCrashed(replica_id=r1.replica_id)).stale
    # the caller's group got its bundles back on n2: the FAILED rank restarts there
    cmds = ex.run(rc.BundlesPlaced(deployment="app", bundle_nodes=("n0", "n0", "n2", "n2")))
    (start,) = of(rc.StartReplica, cmds)
    (place,) = of(rc.PlaceReplica, cmds)
    assert (start.global_rank, start.lineage, place.node_id, place.bundles) == (1, r1.lineage, "n2", (2, 3))
    assert ex.dep().healthy


def test_static_worker_bundle_loss_fails_the_replica_on_another_node():
    """Rank 0 runs on n0 (bundle 0) but its second bundle is on n1: losing n1 fails it."""
    ex = Exec()
    ex.run(rc.DeploymentApplied(name="app", num_replicas=2,
                                static_placement=static(("n0", "n1", "n2", "n2"))))
    r0 = ex.by_rank()[0]
    ex.run(rc.NodeLost(node_id="n1"))
    assert ex.dep().replicas[r0.replica_id].phase is Phase.FAILED
    assert ex.by_rank()[1].phase is Phase.RUNNING


def test_static_with_an_unplaced_bundle_starts_failed_and_recovers_when_placed():
    ex = Exec()
    cmds = ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static(("n0", "n0", None, "n1"))))
    assert [c.global_rank for c in of(rc.StartReplica, cmds)] == [0]
    assert ex.by_rank()[1].phase is Phase.FAILED
    with pytest.raises(rc.InvalidEvent, match="lists 3 bundles"):
        rc.step(ex.state, rc.BundlesPlaced(deployment="app", bundle_nodes=("n0", "n0", "n1")))
    cmds = ex.run(rc.BundlesPlaced(deployment="app", bundle_nodes=("n0", "n0", "n1", "n1")))
    assert [c.global_rank for c in of(rc.StartReplica, cmds)] == [1] and ex.dep().healthy


def test_static_recovery_keeps_ranks_and_bundles():
    ex = Exec()
    ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static()))
    check_recovery_roundtrip(ex.state)


def test_consecutive_mapping_sorts_by_node_then_gpu():
    # bundles landed out of order: 0 on nB gpu 1, 1 on nA gpu 10, 2 on nA gpu 9, 3 on nB gpu 0
    got = rc.consecutive_mapping([("nB", 1), ("nA", "10"), ("nA", "9"), ("nB", 0)], 2)
    assert got == {0: [2, 1], 1: [3, 0]}
    with pytest.raises(rc.InvalidConfig, match="do not split"):
        rc.consecutive_mapping([("n", 0)] * 3, 2)


# ------------------------------------------------------------- gangs
def gangs(size=2, n=4, **kw) -> rc.DeploymentApplied:
    return rc.DeploymentApplied(name="app", num_replicas=n, gang_size=size, resources={"GPU": 1}, **kw)


def test_gang_validation():
    with pytest.raises(rc.InvalidConfig, match="not a multiple of gang_size=2"):
        gangs(n=3)
    with pytest.raises(rc.InvalidConfig, match="gang_placement must be one of"):
        gangs(gang_placement="strict")
    with pytest.raises(rc.InvalidConfig, match="gang_failure must be one of"):
        gangs(gang_failure="ignore")
    with pytest.raises(rc.InvalidConfig, match="do not mix"):
        rc.DeploymentApplied(name="app", num_replicas=2, gang_size=2, static_placement=static())


def test_gangs_get_consecutive_ranks_on_one_node_and_their_context():
    ex = Exec(("n0", 3), ("n1", 3))
    cmds = ex.run(gangs())
    places = {c.rank.rank: c.node_id for c in of(rc.PlaceReplica, cmds)}
    assert places[0] == places[1] and places[2] == places[3]  # each gang on one node
    starts = {c.global_rank: c for c in of(rc.StartReplica, cmds)}
    g1 = starts[3].gang
    assert (g1.gang_id, g1.rank_in_gang, g1.gang_size) == ("app/gang-1", 1, 2)
    assert g1.members == (starts[2].replica_id, starts[3].replica_id)
    ranks = ex.dep().ranks
    node_ranks = [ranks.rank_of(starts[r].replica_id) for r in (2, 3)]
    assert node_ranks[0].node_rank == node_ranks[1].node_rank  # node-contiguous
    assert [r.local_rank for r in node_ranks] == [0, 1]


def test_gang_waits_whole_until_it_fits():
    ex = Exec(("n0", 1), ("n1", 0))
    cmds = ex.run(gangs(n=2))
    assert of(rc.PlaceReplica, cmds) == []  # 1 GPU free: neither member is placed
    cmds = ex.run(rc.NodeCapacityChanged(node_id="n1", resources={"GPU": 1}))
    assert sorted(c.node_id for c in of(rc.PlaceReplica, cmds)) == ["n0", "n1"]  # all at once, across nodes
    assert ex.dep().healthy


def test_gang_spread_puts_members_on_distinct_nodes():
    ex = Exec(("n0", 4), ("n1", 4))
    cmds = ex.run(gangs(n=2, gang_placement="spread"))
    assert sorted(c.node_id for c in of(rc.PlaceReplica, cmds)) == ["n0", "n1"]


def test_restart_gang_restarts_every_member_on_its_rank():
    ex = Exec(("n0", 4), ("n1", 4))
    ex.run(gangs())
    before = ex.by_rank()
    cmds = ex.run(rc.ReplicaCrashed(replica_id=before[2].replica_id, reason="killed"))
    assert [c.replica_id for c in of(rc.StopReplica, cmds)] == [before[3].replica_id]
    starts = {c.global_rank: c for c in of(rc.StartReplica, cmds)}
    assert sorted(starts) == [2, 3]
    assert {r: starts[r].replaces for r in starts} == {2: before[2].replica_id, 3: before[3].replica_id}
    assert starts[2].gang.members == (starts[2].replica_id, starts[3].replica_id)
    after = ex.by_rank()
    assert after[0] == before[0] and after[1] == before[1]  # the other gang untouched
    assert {after[r].node_id for r in (2, 3)} == {before[2].node_id}  # back on their node
    assert ex.dep().healthy and not of(rc.GangChanged, cmds)


def test_restart_replica_restarts_only_that_member_and_tells_the_gang():
    ex = Exec(("n0", 4), ("n1", 4))
    ex.run(gangs(gang_failure="restart_replica"))
    before = ex.by_rank()
    cmds = ex.run(rc.ReplicaCrashed(replica_id=before[3].replica_id, reason="killed"))
    (start,) = of(rc.StartReplica, cmds)
    assert of(rc.StopReplica, cmds) == [] and start.global_rank == 3
    (changed,) = of(rc.GangChanged, cmds)
    assert changed.gang_id == "app/gang-1" and changed.members == (before[2].replica_id, start.replica_id)
    assert start.gang.members == changed.members


def test_gang_downscale_removes_whole_top_gangs():
    ex = Exec(("n0", 4), ("n1", 4))
    ex.run(gangs(n=6))
    before = ex.by_rank()
    with pytest.raises(rc.InvalidConfig, match="not a multiple"):
        rc.step(ex.state, rc.ScaleRequested(deployment="app", num_replicas=3))
    with pytest.raises(rc.InvalidEvent, match="victims cannot be named"):
        rc.step(ex.state, rc.ScaleRequested(deployment="app", num_replicas=4, victims=(before[0].replica_id,)))
    cmds = ex.run(rc.ScaleRequested(deployment="app", num_replicas=2))
    assert sorted(c.replica_id for c in of(rc.StopReplica, cmds)) == sorted(before[r].replica_id for r in (2, 3, 4, 5))
    assert of(rc.ReconfigureReplica, cmds) == []  # nothing compacted
    assert ex.by_rank() == {0: before[0], 1: before[1]}


def test_gang_downscale_stops_the_top_gang_whole_not_a_lower_gangs_member_still_starting():
    """A lone replica's downscale stops one not yet serving first; a gang's may not (it would
    split two gangs, each member left waiting on a mate that is gone): the top gang goes whole."""
    ex = Exec(("n0", 4), ("n1", 4))
    ex.run(gangs(n=6, gang_failure="restart_replica"))
    ex.run(rc.ReplicaCrashed(replica_id=ex.by_rank()[1].replica_id, reason="killed"), hold=rc.InitializeReplica)
    before = ex.by_rank()
    assert before[1].phase is Phase.STARTING  # gang 0's new member, not ready yet
    cmds = ex.run(rc.ScaleRequested(deployment="app", num_replicas=4))
    assert sorted(c.replica_id for c in of(rc.StopReplica, cmds)) == sorted(before[r].replica_id for r in (4, 5))
    assert {r: rep.replica_id for r, rep in ex.by_rank().items()} == {r: before[r].replica_id for r in range(4)}


def test_gang_node_loss_restarts_the_gang_once():
    ex = Exec(("n0", 2), ("n1", 2), ("n2", 2))
    ex.run(gangs())
    lost = ex.by_rank()[0].node_id
    cmds = ex.run(rc.NodeLost(node_id=lost))
    starts = of(rc.StartReplica, cmds)
    assert sorted(c.global_rank for c in starts) == [0, 1]  # one gang, each rank once
    places = {c.rank.rank: c.node_id for c in of(rc.PlaceReplica, cmds)}
    assert places[0] == places[1] != lost
    assert ex.dep().healthy


def test_controller_crash_during_gang_start_restarts_incomplete_gangs_whole():
    ex = Exec(("n0", 4), ("n1", 4))
    ex.run(gangs(n=2))
    full = ex.by_rank()
    # a second gang starts; the controller dies after one member reported placed
    cmds = ex.run(rc.ScaleRequested(deployment="app", num_replicas=4), hold=rc.PlaceReplica)
    held = of(rc.PlaceReplica, cmds)
    first = held[0]
    ex.run(rc.ReplicaPlaced(replica_id=first.replica_id, node_id=first.node_id))
    reports = []
    for rid, rep in ex.dep().replicas.items():
        if rid in {c.replica_id for c in held[1:]}:
            continue  # never created before the crash
        rank = ex.dep().ranks.rank_of(rid)
        reports.append(rc.ReplicaReport(replica_id=rid, deployment="app", phase=rep.phase.value,
                                        node_id=rep.node_id, rank=rank,
                                        lineage=rep.lineage))
    event = rc.ControllerRecovered(deployments=rc.query.desired_specs(ex.state), reports=tuple(reports),
                                   nodes=tuple(rc.NodeJoined(node_id=n, resources={"GPU": 4}) for n in ("n0", "n1")))
    ex.state = rc.State()  # the controller restarted
    cmds = ex.run(event)
    starts = of(rc.StartReplica, cmds)
    assert sorted(c.global_rank for c in starts) == [2, 3]  # the incomplete gang, whole, on its ranks
    assert [c.replica_id for c in of(rc.StopReplica, cmds)] == [first.replica_id]
    assert all(c.gang is not None and c.gang.gang_id == "app/gang-1" for c in starts)
    after = ex.by_rank()
    assert after[0].replica_id == full[0].replica_id and after[1].replica_id == full[1].replica_id
    assert ex.dep().healthy


def test_static_replica_running_off_its_bundles_node_is_restarted_on_them_when_that_node_goes():
    """A recovery can adopt a replica where its group no longer has its bundle
    (the group moved meanwhile). Losing that node is not a bundle loss: the
    rank restarts on its bundles, it is not FAILED."""
    ex = Exec()
    ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static()))
    moved = static(("n0", "n0", "n2", "n2"))
    dep = ex.dep()
    reports = tuple(
        rc.ReplicaReport(replica_id=rid, deployment="app", phase=rep.phase.value, node_id=rep.node_id,
                         rank=dep.ranks.rank_of(rid), lineage=rep.lineage)
        for rid, rep in dep.replicas.items())
    ex.state = rc.State()  # the controller restarted
    ex.run(rc.ControllerRecovered(deployments=(rc.DeploymentApplied(name="app", num_replicas=2,
                                                                    static_placement=moved),), reports=reports))
    r1 = ex.by_rank()[1]
    assert r1.node_id == "n1" and ex.dep().static.node_of(1) == "n2"  # adopted where it runs
    cmds = ex.run(rc.NodeLost(node_id="n1"))
    (place,) = of(rc.PlaceReplica, cmds)
    assert (place.rank.rank, place.node_id, place.bundles) == (1, "n2", (2, 3))
    assert ex.dep().count(Phase.FAILED) == 0 and ex.dep().healthy


@pytest.mark.parametrize("claim, extra", [(7, False), (2, False), (2, True), (7, True)])
def test_a_recovery_report_beyond_the_static_mapping_is_settled_on_its_ranks(claim, extra):
    """A static replica that reports a rank the mapping does not have (``claim``; the
    hostile-events campaign's find: an IndexError from inside the recovery) is settled as a
    taken claim is, on the lowest free rank; one replica more than the mapping (``extra``) is
    stopped, and once it has stopped the deployment is whole on its bundles."""
    ex = Exec()
    ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static()))
    dep = ex.dep()
    reports = [rc.ReplicaReport(replica_id=rid, deployment="app", phase=rep.phase.value, node_id=rep.node_id,
                                rank=dep.ranks.rank_of(rid), lineage=rep.lineage)
               for rid, rep in sorted(dep.replicas.items())]
    moved = reports[0]
    claimed = rc.ReplicaRank(rank=claim, node_rank=moved.rank.node_rank, local_rank=moved.rank.local_rank)
    if extra:
        reports.append(rc.ReplicaReport(replica_id="app#9", deployment="app", phase="running",
                                        node_id=moved.node_id, rank=claimed, lineage=9))
    else:
        reports[0] = rc.ReplicaReport(replica_id=moved.replica_id, deployment="app", phase="running",
                                      node_id=moved.node_id, rank=claimed, lineage=moved.lineage)
    ex.state = rc.State()  # the controller restarted
    cmds = ex.run(rc.ControllerRecovered(deployments=(rc.DeploymentApplied(name="app", num_replicas=2,
                                                                           static_placement=static()),),
                                         reports=tuple(reports)))
    assert [c.replica_id for c in of(rc.StopReplica, cmds)] == (["app#9"] if extra else [])
    assert not of(rc.StartReplica, cmds)  # (both of the mapping's replicas kept)
    assert sorted(ex.by_rank()) == [0, 1] and ex.dep().healthy
    assert {r.replica_id for r in ex.by_rank().values()} == {r.replica_id for r in reports[:2]}


def test_a_bundle_count_that_changed_is_refused_naming_the_event_that_said_it():
    """Re-applied with a group of another size, or a ``BundlesPlaced`` listing another count: the
    refusal names that event (the re-apply's used to say ``BundlesPlaced``)."""
    ex = Exec()
    ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static()))
    before = ex.state
    six = static(("n0", "n0", "n1", "n1", "n2", "n2"))
    with pytest.raises(rc.InvalidEvent, match=r"^DeploymentApplied\('app'\)\.static_placement lists 6 bundles, "
                                              r"but group 'pg-1' has 4"):
        rc.step(before, rc.DeploymentApplied(name="app", num_replicas=2, static_placement=six))
    with pytest.raises(rc.InvalidEvent, match=r"^BundlesPlaced\('app'\) lists 6 bundles, but group 'pg-1' has 4"):
        rc.step(before, rc.BundlesPlaced(deployment="app", bundle_nodes=six.bundle_nodes))


def _report(rid, phase, node, rank, node_rank=0, local_rank=0, lineage=0):
    return rc.ReplicaReport(replica_id=rid, deployment="app", phase=phase, node_id=node, lineage=lineage,
                            rank=rc.ReplicaRank(rank=rank, node_rank=node_rank, local_rank=local_rank))


def test_a_static_recovery_gives_the_mappings_ranks_to_serving_replicas_before_leaving_ones():
    """A stopping replica claims rank 0 and two serving ones both claim rank 1 (mapping of 2): a
    serving one takes rank 0, the stopping one a rank beyond the mapping (it had kept 0, and a
    serving replica was left beyond the mapping with no bundles: a later crash, node loss or
    bundle move raised IndexError). Then each of those events is taken."""
    ex = Exec()
    ex.run(rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static()))
    spec = rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static())
    reports = (_report("app#0", "stopping", "n0", 0, 0, 0), _report("app#1", "running", "n1", 1, 1, 0, lineage=1),
               _report("app#2", "running", "n0", 1, 0, 1, lineage=2))
    ex.state = rc.State()  # the controller restarted
    cmds = ex.run(rc.ControllerRecovered(deployments=(spec,), reports=reports))
    assert not of(rc.StopReplica, cmds)  # (two serving replicas for a mapping of two: none is surplus)
    assert {g: (r.replica_id, r.phase.value) for g, r in ex.by_rank().items()} == {
        0: ("app#2", "running"), 1: ("app#1", "running"), 2: ("app#0", "stopping")}
    recovered = ex.state
    for event in (rc.ReplicaCrashed(replica_id="app#2", cause="error"), rc.NodeLost(node_id="n0"),
                  rc.BundlesPlaced(deployment="app", bundle_nodes=("n2", "n2", "n1", "n1"))):
        ex.state = recovered
        ex.run(event)  # (check_step(full=True) on each step: every static replica on a rank of the mapping)


def test_a_static_replica_not_yet_placed_that_claims_a_rank_beyond_the_mapping_is_placed_on_a_free_one():
    """A pending replica (no node) claims rank 7 of a mapping of 2, beside one running on rank 0: it
    is settled on rank 1 and placed on rank 1's bundles (kept on rank 7, nothing would place it)."""
    ex = Exec()
    spec = rc.DeploymentApplied(name="app", num_replicas=2, static_placement=static())
    reports = (_report("app#0", "running", "n0", 0, 0, 0), _report("app#1", "pending", None, 7, lineage=1))  # (unplaced: its node ranks unused)
    cmds = ex.run(rc.ControllerRecovered(deployments=(spec,), reports=reports))
    (place,) = of(rc.PlaceReplica, cmds)
    assert (place.replica_id, place.rank.rank, place.node_id, place.bundles) == ("app#1", 1, "n1", (2, 3))
    assert sorted(ex.by_rank()) == [0, 1] and ex.dep().healthy


@pytest.mark.parametrize("failed, missing", [(0, 1), (1, 0), (1, (0, 2))])
def test_a_static_recovery_starts_its_failed_and_missing_ranks_in_rank_order(failed, missing):
    """A FAILED replica on one rank and nobody on another: its restart on its bundles and the new
    replica are started in global-rank order (the FAILED one was restarted after the recovery's
    reconcile had started the missing ranks: StartReplica for rank 0 after one for rank 1)."""
    mapping = {0: [0, 1], 1: [2, 3], 2: [4, 5]}
    nodes = ("n0", "n0", "n1", "n1", "n2", "n2")
    ex = Exec()
    spec = rc.DeploymentApplied(name="app", num_replicas=3, static_placement=static(nodes, mapping))
    missing = missing if isinstance(missing, tuple) else (missing,)
    reports = [_report("app#0", "failed", f"n{failed}", failed, failed, 0, lineage=0)]
    for g in sorted({0, 1, 2} - {failed, *missing}):  # (the rest: running on their bundles)
        reports.append(_report(f"app#{g + 4}", "running", f"n{g}", g, g, 0, lineage=g + 4))
    cmds = ex.run(rc.ControllerRecovered(deployments=(spec,), reports=tuple(reports)))
    starts = of(rc.StartReplica, cmds)
    assert [s.global_rank for s in starts] == sorted([failed, *missing])
    places = {c.replica_id: c.bundles for c in of(rc.PlaceReplica, cmds)}
    assert [places[s.replica_id] for s in starts] == [tuple(mapping[s.global_rank]) for s in starts]
    assert [c.replica_id for c in of(rc.StopReplica, cmds)] == ["app#0"]  # (a FAILED one has no process to keep)
    assert sorted(ex.by_rank()) == [0, 1, 2] and ex.dep().healthy


def test_gang_downscale_stops_as_many_as_asked_while_replicas_still_stopping_hold_the_low_ranks():
    """Found by the property suite (a Groups machine's recovery round trip): a scale to 0 whose
    replicas have not stopped yet keeps their ranks 0-1 held (a rank is released once its replica has
    stopped), so a scale to 4 ranks the new gangs 2-5; a scale to 2 then stopped all four, every one
    being at or above the target, and none came back: target 2, no replica. It stops the top gang
    only, and the gang kept is compacted onto ranks 0-1 once the old ones stopped."""
    ex = Exec(("n0", 4), ("n1", 4))
    ex.run(gangs(n=2))
    old = [rep.replica_id for rep in ex.by_rank().values()]
    ex.run(rc.ScaleRequested(deployment="app", num_replicas=0), hold=rc.StopReplica)
    up = ex.run(rc.ScaleRequested(deployment="app", num_replicas=4), hold=rc.StartReplica)
    new = sorted((c.global_rank, c.replica_id) for c in of(rc.StartReplica, up))
    assert [r for r, _ in new] == [2, 3, 4, 5]
    down = ex.run(rc.ScaleRequested(deployment="app", num_replicas=2), hold=rc.StopReplica)
    assert sorted(c.replica_id for c in of(rc.StopReplica, down)) == sorted(rid for r, rid in new if r >= 4)
    assert ex.dep().active == 2
    for rid in old + [rid for r, rid in new if r >= 4]:
        ex.run(rc.ReplicaStopped(replica_id=rid))
    kept = {rid for r, rid in new if r < 4}
    for rid in kept:  # (the kept gang was held before it started: it starts now)
        rep = ex.dep().replicas[rid]
        if rep.phase is Phase.PENDING:
            ex.run(rc.ReplicaPlaced(replica_id=rid, node_id=rep.node_id or "n0"))
    assert set(ex.dep().replicas) == kept

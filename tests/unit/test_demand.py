"""The demand the cluster autoscaler sees (rankcore.placement.demand): ``RequestResources``
names what waits for room and, while anything waits, what each node holds; told only when
it changes, cleared once nothing waits."""

from __future__ import annotations

import rankcore as rc
from rankcore.invariants import check_step
from rankcore.placement import demand

GPU1 = (("GPU", 1.0),)


class Core:
    """The core under test, every invariant checked after every step; ``asked``: each
    RequestResources it emitted, in order."""

    def __init__(self, *nodes: tuple[str, float]) -> None:
        self.state = rc.State()
        self.asked: list[rc.RequestResources] = []
        for node, gpus in nodes:
            self(rc.NodeJoined(node_id=node, resources={"GPU": gpus}))

    def __call__(self, event: object) -> tuple:
        before = self.state
        result = rc.step(before, event)
        check_step(before, event, result, full=True)
        self.state = result.state
        asked = [c for c in result.commands if isinstance(c, rc.RequestResources)]
        assert len(asked) <= 1, "one RequestResources a step at most"
        self.asked += asked
        # the rule: what was told last is always the demand of the state now
        told = (self.asked[-1].waiting, self.asked[-1].held) if self.asked else ((), ())
        assert told == demand.demand(self.state.cluster)
        return result.commands

    def up(self, commands: tuple) -> None:
        """Every PlaceReplica is carried out and its replica gets ready."""
        for c in commands:
            if isinstance(c, rc.PlaceReplica):
                self(rc.ReplicaPlaced(replica_id=c.replica_id, node_id=c.node_id))
                self(rc.ReplicaReady(replica_id=c.replica_id))

    def stop(self, commands: tuple) -> None:
        for c in commands:
            if isinstance(c, rc.StopReplica):
                self(rc.ReplicaStopped(replica_id=c.replica_id))


def deploy(name: str, n: int, gpus: float = 1, **kw) -> rc.DeploymentApplied:
    kw.setdefault("placement_timeout_s", None)
    return rc.DeploymentApplied(name=name, num_replicas=n, resources={"GPU": gpus}, **kw)


def test_a_full_cluster_asks_for_the_waiting_replicas_and_what_the_nodes_hold():
    """2 GPUs, 3 one-GPU replicas: one waits. The request names it and the 2 GPUs n0
    holds (request_resources counts existing usage: asking for 1 GPU alone adds nothing)."""
    c = Core(("n0", 2))
    c.up(c(deploy("a", 3)))
    assert c.asked == [rc.RequestResources(waiting=((GPU1, 1),), held=((("GPU", 2.0),),))]
    assert c.asked[0].bundles() == [{"GPU": 2.0}, {"GPU": 1.0}]


def test_told_once_then_cleared_when_a_new_node_takes_the_waiting_replica():
    c = Core(("n0", 2))
    c.up(c(deploy("a", 3)))
    assert len(c.asked) == 1  # the answers (placed, ready) changed nothing it names
    cmds = c(rc.NodeJoined(node_id="n1", resources={"GPU": 2}))
    assert any(isinstance(x, rc.PlaceReplica) and x.node_id == "n1" for x in cmds)
    assert c.asked[-1] == rc.RequestResources() and c.asked[-1].bundles() == []
    c.up(cmds)
    assert len(c.asked) == 2


def test_cleared_when_the_waiting_replica_is_no_longer_wanted():
    c = Core(("n0", 2))
    c.up(c(deploy("a", 4)))
    assert c.asked[-1].waiting == ((GPU1, 2),)
    c.stop(c(rc.ScaleRequested(deployment="a", num_replicas=3)))  # the newest, still waiting, goes
    assert c.asked[-1].waiting == ((GPU1, 1),) and len(c.asked) == 2
    c.stop(c(rc.ScaleRequested(deployment="a", num_replicas=2)))
    assert c.asked[-1] == rc.RequestResources() and len(c.asked) == 3


def test_a_replica_bigger_than_any_node_is_demand_of_its_own_shape():
    c = Core(("n0", 2), ("n1", 2))
    c.up(c(deploy("small", 1)))
    assert c.asked == []  # everything fits: never a request
    c(deploy("big", 1, gpus=4))
    assert c.asked == [rc.RequestResources(waiting=(((("GPU", 4.0),), 1),), held=((("GPU", 1.0),),))]


def test_a_growing_deployment_updates_the_whole_request_each_time():
    """request_resources replaces the previous request: each command carries everything."""
    c = Core(("n0", 1))
    c.up(c(deploy("a", 2)))
    c(rc.ScaleRequested(deployment="a", num_replicas=4))
    assert [r.waiting for r in c.asked] == [((GPU1, 1),), ((GPU1, 3),)]
    assert c.asked[-1].bundles() == [{"GPU": 1.0}] * 4


def test_each_shape_waiting_is_counted_apart_and_sorted():
    c = Core(("n0", 1))
    c.up(c(deploy("a", 1)))
    c(deploy("b", 2, gpus=2))
    c(deploy("h", 1, gpus=0.5))
    assert c.asked[-1].waiting == (((("GPU", 0.5),), 1), (((("GPU", 2.0),), 2)))
    assert c.asked[-1].bundles() == [{"GPU": 1.0}, {"GPU": 0.5}, {"GPU": 2.0}, {"GPU": 2.0}]


def test_gang_members_waiting_are_each_a_bundle():
    c = Core(("n0", 1))
    c(deploy("g", 2, gang_size=2))
    assert c.asked == [rc.RequestResources(waiting=((GPU1, 2),), held=())]


def test_no_nodes_known_no_demand():
    """Unmanaged (the executor places): the core has no queue, so it never asks."""
    c = Core()
    c(deploy("a", 3))
    assert c.asked == []


def test_a_lost_node_makes_its_replicas_demand():
    c = Core(("n0", 2), ("n1", 2))
    c.up(c(deploy("a", 4)))
    assert c.asked == []
    c(rc.NodeLost(node_id="n1"))
    assert c.asked[-1].waiting == ((GPU1, 2),) and c.asked[-1].held == ((("GPU", 2.0),),)


def test_a_resource_a_node_no_longer_reports_still_counts_where_a_replica_holds_it():
    """A capacity drop leaves the replicas there (``NodeCapacityChanged``). n1 loses its GPUs while a
    stopping replica still holds one: the request counts that GPU as held on n1 (found by the
    hostile-input campaign; only the resources n1 still reported were counted)."""
    c = Core(("n0", 1), ("n1", 2))
    c.up(c(deploy("a", 2, placement="spread")))
    on = {r.replica_id: r.node_id for r in c.state.deployments["a"].replicas.values()}
    assert sorted(on.values()) == ["n0", "n1"]
    c(rc.ScaleRequested(deployment="a", num_replicas=1))  # (the one on n1 stops; not stopped yet)
    c(rc.NodeCapacityChanged(node_id="n1", resources={"CPU": 8}))
    c(rc.ScaleRequested(deployment="a", num_replicas=2))
    assert c.asked[-1] == rc.RequestResources(waiting=((GPU1, 1),), held=(GPU1, GPU1))


def test_a_recovery_that_reports_nodes_tells_the_demand_anew_even_empty():
    """The failed controller's request still stands in the GCS: the recovered core replaces it."""
    spec = rc.DeploymentApplied(name="a", num_replicas=3, resources={"GPU": 1}, placement_timeout_s=None)
    report = rc.ReplicaReport(replica_id="a#0", deployment="a", node_id="n0",
                              rank=rc.ReplicaRank(rank=0, node_rank=0, local_rank=0))
    nodes = [rc.NodeJoined(node_id="n0", resources={"GPU": 1})]
    full = rc.step(rc.State(), rc.ControllerRecovered(deployments=[spec], reports=[report], nodes=nodes,
                                                      next_replica_number=1))
    asked = [c for c in full.commands if isinstance(c, rc.RequestResources)]
    assert asked == [rc.RequestResources(waiting=((GPU1, 2),), held=(GPU1,))]  # a#0 on n0; two more wait
    fits = rc.step(rc.State(), rc.ControllerRecovered(deployments=[rc.DeploymentApplied(
        name="a", num_replicas=1, resources={"GPU": 1}, placement_timeout_s=None)], reports=[report], nodes=nodes,
        next_replica_number=1))
    assert [c for c in fits.commands if isinstance(c, rc.RequestResources)] == [rc.RequestResources()]
    unmanaged = rc.step(rc.State(), rc.ControllerRecovered(deployments=[spec], reports=[], next_replica_number=1))
    assert not any(isinstance(c, rc.RequestResources) for c in unmanaged.commands)  # no node: nothing to tell

"""Spare processes (rankcore.placement.spares): the core tells the executor where to keep
started, idle worker processes (every node holding a replica of a deployment
that asks for them), and only when that changes. Events in, commands out,
every invariant checked after every step."""

from __future__ import annotations

import attrs
import pytest

import rankcore as rc
from rankcore.invariants import check_recovery_roundtrip, check_spares_told, check_step, reports_from


def keeps(commands: tuple) -> list[tuple[str, str, int]]:
    return [(c.deployment, c.node_id, c.count) for c in commands if isinstance(c, rc.KeepSpareProcesses)]


class Core:
    def __init__(self, nodes: int = 3, gpus: float = 2, managed: bool = True) -> None:
        self.state = rc.State()
        if managed:
            for i in range(nodes):
                self(rc.NodeJoined(node_id=f"n{i}", resources={"GPU": gpus}, order=i))
            self(rc.Tick(now=1.0))

    def __call__(self, event: object) -> tuple:
        result = rc.step(self.state, event)
        check_step(self.state, event, result, full=True)
        self.state = result.state
        return result.commands

    def settle(self, commands: tuple, node: str = "n0") -> list:
        """Answer every command (placing where PlaceReplica says, else on ``node``)
        until none is owed; returns every command sent meanwhile."""
        sent, todo = [], list(commands)
        while todo:
            c = todo.pop(0)
            if isinstance(c, rc.PlaceReplica):
                out = self(rc.ReplicaPlaced(replica_id=c.replica_id, node_id=c.node_id))
            elif isinstance(c, rc.StartReplica) and not self.state.cluster.joined:
                out = self(rc.ReplicaPlaced(replica_id=c.replica_id, node_id=node))
            elif isinstance(c, rc.InitializeReplica):
                out = self(rc.ReplicaReady(replica_id=c.replica_id))
            elif isinstance(c, rc.StopReplica):
                out = self(rc.ReplicaStopped(replica_id=c.replica_id))
            else:
                continue
            sent.extend(out)
            todo.extend(out)
        return sent


def spec(n: int, k: int = 1, **more: object) -> rc.DeploymentApplied:
    return rc.DeploymentApplied(name="llm", num_replicas=n, resources={"GPU": 1}, placement="pack",
                                spare_processes=k, **more)


def test_default_is_none_and_no_command_is_ever_sent() -> None:
    assert rc.options.SPARE_PROCESSES == 0 == rc.DeploymentApplied(name="a", num_replicas=1).spare_processes
    assert "spare_processes" in rc.options.OPTION_NAMES
    core = Core()
    sent = list(core(spec(3, k=0)))
    sent += core.settle(tuple(sent))
    sent += core(rc.NodeLost(node_id="n1"))
    assert keeps(tuple(sent)) == []


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1", None])
def test_a_bad_count_is_refused_naming_the_option(bad: object) -> None:
    with pytest.raises(rc.InvalidConfig, match="spare_processes"):
        spec(1, k=bad)  # type: ignore[arg-type]


def test_every_node_holding_a_replica_is_told_once_with_its_placement() -> None:
    core = Core()
    cmds = core(spec(3))  # pack: n0 takes two, n1 one
    assert keeps(cmds) == [("llm", "n0", 1), ("llm", "n1", 1)]
    kinds = [type(c).__name__ for c in cmds]
    assert kinds.index("KeepSpareProcesses") > max(i for i, k in enumerate(kinds) if k == "PlaceReplica")
    assert keeps(tuple(core.settle(cmds))) == []  # placed, ready: nothing new


def test_a_replacement_on_the_same_node_says_nothing_and_a_moved_one_moves_the_count() -> None:
    core = Core()
    core.settle(core(spec(3)))
    cmds = core(rc.ReplicaCrashed(replica_id="llm#0", cause="killed"))
    assert keeps(cmds) == [] and any(isinstance(c, rc.PlaceReplica) and c.node_id == "n0" for c in cmds)
    core.settle(cmds)
    cmds = core(rc.NodeLost(node_id="n1"))  # llm#2 moves to n2
    assert keeps(cmds) == [("llm", "n1", 0), ("llm", "n2", 1)]


def test_a_node_left_by_a_downscale_is_told_zero_once_its_replica_has_stopped() -> None:
    core = Core()
    core.settle(core(spec(3)))
    cmds = core(rc.ScaleRequested(deployment="llm", num_replicas=2))
    assert keeps(cmds) == []  # still draining on n1
    assert keeps(tuple(core.settle(cmds))) == [("llm", "n1", 0)]


def test_changing_the_option_retells_every_node_and_the_deployment_going_tells_zero() -> None:
    core = Core()
    core.settle(core(spec(3)))
    assert keeps(core(spec(3, k=2))) == [("llm", "n0", 2), ("llm", "n1", 2)]
    assert keeps(core(spec(3, k=2))) == []  # the same again: nothing
    assert keeps(core(spec(3, k=0))) == [("llm", "n0", 0), ("llm", "n1", 0)]
    assert keeps(core(spec(3, k=1))) == [("llm", "n0", 1), ("llm", "n1", 1)]
    assert sorted(keeps(tuple(core.settle(core(rc.ScaleRequested(deployment="llm", num_replicas=0)))))) == [
        ("llm", "n0", 0), ("llm", "n1", 0)]


def test_without_a_cluster_model_the_reported_nodes_are_used() -> None:
    core = Core(managed=False)
    cmds = core(rc.DeploymentApplied(name="llm", num_replicas=2, spare_processes=1))
    assert keeps(cmds) == []  # nowhere yet: the executor places
    assert keeps(core(rc.ReplicaPlaced(replica_id="llm#0", node_id="a"))) == [("llm", "a", 1)]
    assert keeps(core(rc.ReplicaPlaced(replica_id="llm#1", node_id="a"))) == []
    core(rc.ReplicaReady(replica_id="llm#0"))
    core(rc.ReplicaReady(replica_id="llm#1"))
    cmds = core(rc.ReplicaCrashed(replica_id="llm#1", cause="killed"))
    assert keeps(cmds) == []  # llm#0 still holds "a"
    new = next(c.replica_id for c in cmds if isinstance(c, rc.StartReplica))
    assert keeps(core(rc.ReplicaPlaced(replica_id=new, node_id="b"))) == [("llm", "b", 1)]


def test_two_deployments_are_told_apart() -> None:
    core = Core()
    core.settle(core(spec(1)))
    cmds = core(rc.DeploymentApplied(name="emb", num_replicas=1, resources={"GPU": 1}, spare_processes=2))
    assert keeps(cmds) == [("emb", "n1", 2)]  # spread: the emptiest node


def test_a_recovering_controller_is_told_every_node() -> None:
    core = Core()
    core.settle(core(spec(3)))
    fresh = rc.State(cluster=attrs.evolve(rc.State().cluster, now=core.state.cluster.now, clock=True))
    result = rc.step(fresh, reports_from(core.state))
    assert keeps(result.commands) == [("llm", "n0", 1), ("llm", "n1", 1)]
    check_recovery_roundtrip(core.state)


def test_static_placement_and_gangs_are_told_their_nodes() -> None:
    core = Core()
    cmds = core(rc.DeploymentApplied(name="tr", num_replicas=2, spare_processes=1,
                                     static_placement=rc.StaticPlacement(group="pg", bundle_nodes=("n2", "n1"),
                                                                         mapping=((0,), (1,)))))
    assert keeps(cmds) == [("tr", "n1", 1), ("tr", "n2", 1)]
    cmds = core(rc.DeploymentApplied(name="g", num_replicas=2, gang_size=2, resources={"GPU": 1},
                                     spare_processes=1))
    assert keeps(cmds) == [("g", "n0", 1)]  # pack: one node


def test_the_invariant_catches_a_dropped_or_repeated_count() -> None:
    core = Core()
    before = core.state
    good = rc.step(before, spec(3))
    check_spares_told(before, spec(3), good)
    dropped = attrs.evolve(good, commands=tuple(c for c in good.commands if not (
        isinstance(c, rc.KeepSpareProcesses) and c.node_id == "n1")))
    with pytest.raises(rc.InvariantViolation, match="spare processes wanted"):
        check_spares_told(before, spec(3), dropped)
    repeated = attrs.evolve(good, commands=(*good.commands, rc.KeepSpareProcesses(deployment="llm", node_id="n1",
                                                                                    count=1)))
    with pytest.raises(rc.InvariantViolation, match="repeats"):
        check_spares_told(before, spec(3), repeated)

"""Issue 19, bugs in the pure core (1, 2, 5, 6, 8) and the scenario warnings (7).
Each test failed before its fix."""

from __future__ import annotations

import rankcore as rc
from rankcore.invariants import check_step

GPU1 = {"GPU": 1}


def _step(state: rc.State, event: object) -> rc.Step:
    result = rc.step(state, event)
    check_step(state, event, result, full=True)
    return result


def _node_ranks(state: rc.State, name: str) -> list[int]:
    """The node ranks the deployment's placed replicas hold, one per node, sorted."""
    dep = state.deployments[name]
    return sorted(dep.ranks.nodes().values())


def _contiguous_node_ranks(state: rc.State, name: str) -> None:
    ranks = _node_ranks(state, name)
    assert ranks == list(range(len(ranks))), f"node ranks not contiguous: {ranks}"


def _carry_out(state: rc.State, commands: tuple, name: str, log: list) -> rc.State:
    """An executor that carries every PlaceReplica out where asked and every
    replica gets ready; checks node-rank contiguity after every step."""
    todo = list(commands)
    while todo:
        c = todo.pop(0)
        if isinstance(c, rc.PlaceReplica):
            event: object = rc.ReplicaPlaced(replica_id=c.replica_id, node_id=c.node_id)
        elif isinstance(c, rc.InitializeReplica):
            event = rc.ReplicaReady(replica_id=c.replica_id)
        else:
            log.append(c)
            continue
        result = _step(state, event)
        state = result.state
        log.extend(result.commands)
        log.extend(result.compactions)
        _contiguous_node_ranks(state, name)
        todo.extend(result.commands)
    return state


# ------------------------------------------------------------------ bug 1
def test_node_loss_replacements_take_the_lost_nodes_node_rank() -> None:
    """3 nodes x 2 GPUs, pack, 4 replicas; node-0 lost: the two replacements
    land on the empty node-2, which takes node-0's freed node rank 0 (the
    lowest free once both replicas of node-0 left), so node ranks stay
    contiguous and nothing is reassigned or reconfigured."""
    state = rc.State()
    for i in range(3):
        state = _step(state, rc.NodeJoined(node_id=f"node-{i}", resources={"GPU": 2})).state
    first = _step(state, rc.DeploymentApplied(name="llm", num_replicas=4, placement="pack", resources=GPU1))
    state = _carry_out(first.state, first.commands, "llm", [])
    before = {rid: (r.rank, r.node_rank) for rid, r in state.ranks("llm").items() if r is not None}
    assert sorted(before.values()) == [(0, 0), (1, 0), (2, 1), (3, 1)]

    lost = _step(state, rc.NodeLost(node_id="node-0"))
    _contiguous_node_ranks(lost.state, "llm")
    places = [c for c in lost.commands if isinstance(c, rc.PlaceReplica)]
    assert [(c.node_id, c.rank.as_tuple()) for c in places] == [("node-2", (0, 0, 0)), ("node-2", (1, 0, 1))]
    log: list = []
    state = _carry_out(lost.state, lost.commands, "llm", log)
    assert state.deployments["llm"].healthy
    assert [c for c in log if isinstance(c, rc.ReconfigureReplica)] == []
    assert [c for c in log if isinstance(c, rc.Compaction)] == []
    after = {r.as_tuple() for r in state.ranks("llm").values() if r is not None}
    assert after == {(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)}


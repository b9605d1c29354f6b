"""Directed tests of core-owned placement (issue 9): nodes, reservations, the
waiting queue, failed placements, suspect nodes, start timeouts and recovery."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.base.lifecycle import Phase
from rankcore.invariants import check_recovery_roundtrip, check_step

GPU1 = (("GPU", 1.0),)


class Core:
    """The core under test: applies events, checks every invariant after every step."""

    def __init__(self, *nodes: tuple[str, float]) -> None:
        self.state = rc.State()
        for node, gpus in nodes:
            assert self(rc.NodeJoined(node_id=node, resources={"GPU": gpus})) == []

    def step(self, event: object) -> rc.Step:
        before = self.state
        result = rc.step(before, event)
        check_step(before, event, result, full=True)
        for c in result.commands:  # a PlaceReplica reserves what its deployment needs
            if isinstance(c, rc.PlaceReplica):
                assert c.resources == result.state.deployments[c.deployment].resources
        self.state = result.state
        return result

    def __call__(self, event: object) -> list[tuple]:
        return brief(self.step(event).commands)

    def up(self, commands: list[tuple]) -> None:
        """The executor carries out every PlaceReplica in ``commands``; the replicas get ready."""
        for c in commands:
            if c[0] == "place":
                assert self(rc.ReplicaPlaced(replica_id=c[1], node_id=c[2])) == [("init", c[1], c[3])]
                assert self(rc.ReplicaReady(replica_id=c[1])) == []

    def rep(self, rid: str) -> rc.Replica:
        rep = self.state.replica(rid)
        assert rep is not None
        return rep

    def rank(self, rid: str) -> tuple | None:
        rank = self.state.deployments[self.rep(rid).deployment].ranks.rank_of(rid)
        return None if rank is None else rank.as_tuple()

    def free(self) -> dict[str, float]:
        return {n: node.free["GPU"] for n, node in self.state.cluster.nodes.items()}

    def held(self) -> dict[str, str]:
        return {rid: node for rid, (node, _need) in self.state.cluster.held.items()}


def brief(commands: tuple) -> list[tuple]:
    """Commands as short tuples (every field a test here cares about)."""
    out: list[tuple] = []
    for c in commands:
        if isinstance(c, rc.StartReplica):
            out.append(("start", c.replica_id, c.global_rank, c.replaces))
        elif isinstance(c, rc.PlaceReplica):
            out.append(("place", c.replica_id, c.node_id, c.rank.as_tuple()))
        elif isinstance(c, rc.InitializeReplica):
            out.append(("init", c.replica_id, c.rank.as_tuple()))
        elif isinstance(c, rc.ReconfigureReplica):
            out.append(("reconfigure", c.replica_id, c.reason))
        elif isinstance(c, rc.StopReplica):
            out.append(("stop", c.replica_id))
        elif isinstance(c, rc.ScheduleTick):
            out.append(("tick", c.at))
        elif isinstance(c, rc.RequestResources):
            continue  # (the autoscaler's demand: tests/unit/test_demand.py)
        else:
            out.append(("world", c.deployment, c.world_size))
    return out


def deploy(name: str, n: int, gpus: float = 1, **kw) -> rc.DeploymentApplied:
    """(No placement deadline unless a test asks: tests/unit/test_policies.py has theirs.)"""
    kw.setdefault("placement_timeout_s", None)
    return rc.DeploymentApplied(name=name, num_replicas=n, resources={"GPU": gpus}, **kw)


# ------------------------------------------------------------------ unmanaged
def test_unmanaged_core_only_starts_and_the_executor_places_anywhere():
    """No NodeJoined: StartReplica alone, ReplicaPlaced on any node initialises; no books."""
    c = Core()
    assert c(deploy("a", 2)) == [("start", "a#0", 0, None), ("start", "a#1", 1, None)]
    assert c(rc.ReplicaPlaced(replica_id="a#1", node_id="anywhere")) == [("init", "a#1", (1, 0, 0))]
    assert c(rc.ReplicaPlaced(replica_id="a#0", node_id="elsewhere")) == [("init", "a#0", (0, 1, 0))]
    cl = c.state.cluster
    assert not cl.managed and len(cl.held) == 0 and len(cl.queued) == 0 and len(cl.nodes) == 0


# ----------------------------------------------------------------- policies
def test_spread_places_each_new_replica_in_rank_order_in_the_same_step():
    """Spread: most free GPUs, then node order; PlaceReplica follows the StartReplicas
    in rank order with the full rank; the replica stays PENDING on its node until
    ReplicaPlaced, whose InitializeReplica carries the same rank."""
    c = Core(("n0", 4), ("n1", 4))
    cmds = c.step(deploy("a", 3)).commands
    assert cmds[3] == rc.PlaceReplica(replica_id="a#0", deployment="a", node_id="n0",
                                      rank=rc.ReplicaRank(rank=0, node_rank=0, local_rank=0), resources=GPU1)
    assert brief(cmds) == [("start", "a#0", 0, None), ("start", "a#1", 1, None), ("start", "a#2", 2, None),
                           ("place", "a#0", "n0", (0, 0, 0)), ("place", "a#1", "n1", (1, 1, 0)),
                           ("place", "a#2", "n0", (2, 0, 1))]  # n0/n1 tie at 3 free, one each: order
    assert [(c.rep(r).phase, c.rep(r).node_id) for r in ("a#0", "a#1", "a#2")] == [
        (Phase.PENDING, "n0"), (Phase.PENDING, "n1"), (Phase.PENDING, "n0")]
    assert c.held() == {"a#0": "n0", "a#1": "n1", "a#2": "n0"} and c.free() == {"n0": 2.0, "n1": 3.0}
    assert c(rc.ReplicaPlaced(replica_id="a#2", node_id="n0")) == [("init", "a#2", (2, 0, 1))]
    assert c.rep("a#2").phase is Phase.STARTING


def test_spread_breaks_a_free_tie_by_the_deployments_own_replicas_before_node_order():
    c = Core(("n0", 4), ("n1", 4))
    assert c(deploy("a", 1))[-1] == ("place", "a#0", "n0", (0, 0, 0))
    assert c(deploy("o", 1))[-1] == ("place", "o#1", "n1", (0, 0, 0))
    # both nodes 3 free; n0 holds one of a's replicas, n1 none (o's do not count)
    assert c(rc.ScaleRequested(deployment="a", num_replicas=2))[-1] == ("place", "a#2", "n1", (1, 1, 0))


def test_pack_takes_the_node_with_the_fewest_free_that_fits():
    c = Core(("n0", 4), ("n1", 2))
    assert c(deploy("a", 3, placement="pack"))[3:] == [
        ("place", "a#0", "n1", (0, 0, 0)), ("place", "a#1", "n1", (1, 0, 1)), ("place", "a#2", "n0", (2, 1, 0))]


def test_rank_packed_follows_the_node_of_the_previous_rank():
    """rank_packed: rank r goes where rank r-1 is when it has room (pack would pick
    the fuller n1 here), else the pack choice."""
    c = Core(("n0", 4), ("n1", 4))
    assert c(deploy("a", 1, placement="rank_packed"))[-1] == ("place", "a#0", "n0", (0, 0, 0))
    assert c(deploy("o", 1, gpus=2))[-1] == ("place", "o#1", "n1", (0, 0, 0))  # n1: 2 free, n0: 3
    assert c(rc.ScaleRequested(deployment="a", num_replicas=2))[-1] == ("place", "a#2", "n0", (1, 0, 1))
    assert c(deploy("p", 1, placement="pack"))[-1] == ("place", "p#3", "n0", (0, 0, 0))  # 2 free each: order


# -------------------------------------------------------------- waiting queue
@pytest.mark.parametrize("freed_by", ["stop", "join", "capacity"])
def test_a_replica_that_fits_nowhere_waits_and_the_longest_waiting_goes_first(freed_by):
    """No room: StartReplica with its global rank, no PlaceReplica; when one GPU
    frees, the replica that waited longest is placed first (w#3, though a#4 comes
    first by name, id and global rank)."""
    c = Core(("n0", 3))
    c.up(c(deploy("b", 1)))
    assert c(deploy("w", 3)) == [("start", "w#1", 0, None), ("start", "w#2", 1, None), ("start", "w#3", 2, None),
                                 ("place", "w#1", "n0", (0, 0, 0)), ("place", "w#2", "n0", (1, 0, 1))]
    assert c(deploy("a", 1)) == [("start", "a#4", 0, None)]
    assert c.rank("w#3") is None and c.state.deployments["w"].ranks.global_rank("w#3") == 2
    assert set(c.state.cluster.queued) == {"w#3", "a#4"} and c.rep("w#3").phase is Phase.PENDING
    if freed_by == "stop":
        assert c(rc.ScaleRequested(deployment="b", num_replicas=0)) == [("world", "b", 0), ("stop", "b#0")]
        assert c(rc.ReplicaStopped(replica_id="b#0")) == [("place", "w#3", "n0", (2, 0, 2))]
    elif freed_by == "join":
        assert c(rc.NodeJoined(node_id="n1", resources={"GPU": 1})) == [("place", "w#3", "n1", (2, 1, 0))]
    else:
        assert c(rc.NodeCapacityChanged(node_id="n0", resources={"GPU": 4})) == [("place", "w#3", "n0", (2, 0, 2))]
    assert set(c.state.cluster.queued) == {"a#4"} and c.rep("a#4").node_id is None


def test_a_resources_change_replaces_replicas_not_yet_serving_at_once_on_their_ranks():
    """Resources are a heavyweight option (rankcore.control.rollouts): a replica started
    under the old need is outdated. Neither serves yet, so both are stopped at once (no
    availability to keep); each one's successor takes its ranks when it has stopped, and
    reserves the new need (the placed one's booking passes on at the new size)."""
    c = Core(("n0", 3))
    assert c(deploy("a", 2, gpus=2))[2:] == [("place", "a#0", "n0", (0, 0, 0))]
    assert c(deploy("a", 2, gpus=1)) == [("stop", "a#0"), ("stop", "a#1")]
    assert c(rc.ReplicaStopped(replica_id="a#0")) == [("start", "a#2", 0, "a#0"), ("place", "a#2", "n0", (0, 0, 0))]
    assert c(rc.ReplicaStopped(replica_id="a#1")) == [("start", "a#3", 1, "a#1"), ("place", "a#3", "n0", (1, 0, 1))]
    assert dict(c.state.cluster.held) == {"a#2": ("n0", GPU1), "a#3": ("n0", GPU1)}
    assert c.free() == {"n0": 1.0} and not c.state.deployments["a"].rolling


# ---------------------------------------------------------- failed placements
def test_placement_failed_places_again_on_another_node_in_the_same_step():
    c = Core(("n0", 2), ("n1", 1))
    assert c(deploy("a", 1))[-1] == ("place", "a#0", "n0", (0, 0, 0))
    assert c(rc.PlacementFailed(replica_id="a#0", node_id="n0")) == [("place", "a#0", "n1", (0, 0, 0))]
    assert c.held() == {"a#0": "n1"} and c.free() == {"n0": 2.0, "n1": 0.0}
    assert c.rep("a#0").node_id == "n1" and c.state.cluster.avoid["a#0"] == ("n0",)


def test_placement_failed_with_no_other_node_waits_until_retry_s_on_the_clock():
    """The failed node is avoided; the core asks for a Tick at now + retry_s and
    then may use that node again."""
    c = Core(("n0", 2))
    assert c(rc.Tick(now=100)) == []
    assert c(deploy("a", 1))[-1] == ("place", "a#0", "n0", (0, 0, 0))
    assert c.state.cluster.retry_s == 30.0
    assert c(rc.PlacementFailed(replica_id="a#0", node_id="n0", reason="no room")) == [("tick", 130.0)]
    assert c.rep("a#0").node_id is None and c.rank("a#0") is None and "a#0" in c.state.cluster.queued
    assert c.state.deployments["a"].ranks.global_rank("a#0") == 0
    assert c.held() == {} and c.free() == {"n0": 2.0}
    assert c(rc.Tick(now=129.5)) == []
    assert c(rc.Tick(now=130)) == [("place", "a#0", "n0", (0, 0, 0))]


def test_placement_failed_naming_a_node_it_is_not_reserved_on_is_stale():
    c = Core(("n0", 2), ("n1", 1))
    c(deploy("a", 1))
    before = c.state
    result = c.step(rc.PlacementFailed(replica_id="a#0", node_id="n1"))
    assert result.stale and result.commands == () and result.state == before


def test_replica_placed_on_another_node_than_reserved_moves_there():
    """What the executor did wins: ranks and the cluster books follow the replica."""
    c = Core(("n0", 4), ("n1", 4))
    assert c(deploy("a", 2))[2:] == [("place", "a#0", "n0", (0, 0, 0)), ("place", "a#1", "n1", (1, 1, 0))]
    assert c(rc.ReplicaPlaced(replica_id="a#0", node_id="n1")) == [("init", "a#0", (0, 1, 1))]
    assert c.rep("a#0").node_id == "n1" and c.rep("a#0").phase is Phase.STARTING
    assert c.held() == {"a#0": "n1", "a#1": "n1"} and c.free() == {"n0": 4.0, "n1": 2.0}


# ---------------------------------------------------------------- crashes
def test_crash_replacement_goes_back_to_its_predecessors_node_with_all_three_ranks():
    """Even though spread would now pick the empty n2."""
    c = Core(("n0", 4), ("n1", 4))
    c.up(c(deploy("a", 3)))
    assert c.rank("a#1") == (1, 1, 0) and c.rank("a#2") == (2, 0, 1)
    assert c(rc.NodeJoined(node_id="n2", resources={"GPU": 8})) == []
    assert c(rc.ReplicaCrashed(replica_id="a#2")) == [("start", "a#3", 2, "a#2"), ("place", "a#3", "n0", (2, 0, 1))]
    assert c(rc.ReplicaPlaced(replica_id="a#3", node_id="n0")) == [("init", "a#3", (2, 0, 1))]


def test_an_exited_replica_makes_its_node_suspect_avoided_for_suspect_s_while_another_node_fits():
    c = Core(("n0", 4), ("n1", 4))
    assert c(rc.Tick(now=100)) == []
    c.up(c(deploy("a", 1)))
    assert c.rep("a#0").node_id == "n0" and c.state.cluster.suspect_s == 15.0
    assert c(rc.ReplicaCrashed(replica_id="a#0", cause="exited")) == [
        ("start", "a#1", 0, "a#0"), ("place", "a#1", "n1", (0, 0, 0))]
    assert c(rc.Tick(now=114)) == []
    assert c(rc.ScaleRequested(deployment="a", num_replicas=2))[-1] == ("place", "a#2", "n1", (1, 0, 1))
    assert c(rc.Tick(now=116)) == []
    assert c(rc.ScaleRequested(deployment="a", num_replicas=3))[-1] == ("place", "a#3", "n0", (2, 1, 0))


@pytest.mark.parametrize("clock", [True, False])
def test_a_suspect_node_is_used_when_nothing_else_fits_or_without_a_clock(clock):
    c = Core(("n0", 4), ("n1", 1))
    if clock:
        c(rc.Tick(now=5))
    assert c(deploy("f", 1, placement="pack"))[-1] == ("place", "f#0", "n1", (0, 0, 0))  # n1 full
    c.up(c(deploy("a", 1)))
    assert c(rc.ReplicaCrashed(replica_id="a#1", cause="exited")) == [
        ("start", "a#2", 0, "a#1"), ("place", "a#2", "n0", (0, 0, 0))]
    assert dict(c.state.cluster.suspects) == ({"n0": 20.0} if clock else {})


# ------------------------------------------------------------- start timeout
def test_start_timeout_is_armed_when_placed_where_reserved():
    c = Core(("n0", 4))
    c(rc.Tick(now=100))
    c(deploy("a", 1, start_timeout_s=10))
    assert c(rc.ReplicaPlaced(replica_id="a#0", node_id="n0")) == [("init", "a#0", (0, 0, 0)), ("tick", 110.0)]
    assert c(rc.Tick(now=110)) == [("stop", "a#0"), ("start", "a#1", 0, "a#0"), ("place", "a#1", "n0", (0, 0, 0))]


def test_start_timeout_replaces_a_replica_still_starting_and_spares_a_ready_one():
    """(Placed on the node the other was reserved on, the path that arms a deadline today.)"""
    c = Core(("n0", 4), ("n1", 4))
    c(rc.Tick(now=100))
    assert c(deploy("a", 2, start_timeout_s=10))[2:] == [
        ("place", "a#0", "n0", (0, 0, 0)), ("place", "a#1", "n1", (1, 1, 0))]
    assert c(rc.ReplicaPlaced(replica_id="a#0", node_id="n1")) == [("init", "a#0", (0, 1, 1)), ("tick", 110.0)]
    assert c(rc.Tick(now=104)) == []
    assert c(rc.ReplicaPlaced(replica_id="a#1", node_id="n0")) == [("init", "a#1", (1, 0, 0)), ("tick", 114.0)]
    assert c(rc.ReplicaReady(replica_id="a#1")) == []
    assert c(rc.Tick(now=109)) == []
    assert c(rc.Tick(now=110)) == [("stop", "a#0"), ("start", "a#2", 0, "a#0"), ("place", "a#2", "n1", (0, 1, 1))]
    assert c.rep("a#1").phase is Phase.RUNNING and c(rc.Tick(now=120)) == []
    assert c.rep("a#1").phase is Phase.RUNNING and "a#0" not in c.state.index


def test_ready_of_the_earliest_deadline_moves_next_deadline_so_no_tick_is_needed():
    c = Core(("n0", 4))
    c(rc.Tick(now=100))
    c(deploy("a", 2, start_timeout_s=10))
    c(rc.ReplicaPlaced(replica_id="a#0", node_id="n0"))
    c(rc.Tick(now=103))
    c(rc.ReplicaPlaced(replica_id="a#1", node_id="n0"))
    assert c.state.cluster.next_deadline == 110.0
    c(rc.ReplicaReady(replica_id="a#0"))
    assert c.state.cluster.next_deadline == 113.0  # exact, not a stale lower bound
    c(rc.ReplicaReady(replica_id="a#1"))
    assert c.state.cluster.next_deadline == float("inf") and not c.state.cluster.deadlines


# ------------------------------------------------- answers that carry the clock
def test_replica_placed_with_now_is_a_tick_then_the_event_in_one_step():
    """The deadline counts from the event's now, as after Tick(now) + ReplicaPlaced."""
    merged, split = Core(("n0", 4)), Core(("n0", 4))
    for c in (merged, split):
        c(rc.Tick(now=100))
        c(deploy("a", 1, start_timeout_s=10))
    assert merged(rc.ReplicaPlaced(replica_id="a#0", node_id="n0", now=105)) == [
        ("init", "a#0", (0, 0, 0)), ("tick", 115.0)]
    assert split(rc.Tick(now=105)) == []
    assert split(rc.ReplicaPlaced(replica_id="a#0", node_id="n0")) == [("init", "a#0", (0, 0, 0)), ("tick", 115.0)]
    assert merged.state == split.state and merged.state.cluster.now == 105.0


def test_an_event_whose_now_passes_a_deadline_times_the_start_out_first():
    c = Core(("n0", 4))
    c(rc.Tick(now=100))
    c(deploy("a", 2, start_timeout_s=10))
    c(rc.ReplicaPlaced(replica_id="a#0", node_id="n0"))  # deadline 110
    # a#1 is placed at 111: a#0's start timed out at 110, replaced in this same step
    assert c(rc.ReplicaPlaced(replica_id="a#1", node_id="n0", now=111)) == [
        ("stop", "a#0"), ("start", "a#2", 0, "a#0"), ("place", "a#2", "n0", (0, 0, 0)),
        ("init", "a#1", (1, 0, 1)), ("tick", 121.0)]
    assert c.state.cluster.now == 111.0
    # exactly Tick(now) then the event: the same state, the same commands, in two batches
    before = c.state
    tick = rc.step(before, rc.Tick(now=130))  # a#1's start (deadline 121) times out
    crash = rc.step(tick.state, rc.ReplicaCrashed(replica_id="a#2"))
    merged = c.step(rc.ReplicaCrashed(replica_id="a#2", now=130))
    assert tick.commands and crash.commands
    assert merged.state == crash.state and merged.commands == tick.commands + crash.commands


def test_now_that_does_not_move_the_clock_is_ignored_and_a_stale_event_still_moves_it():
    c = Core(("n0", 4))
    c(rc.Tick(now=100))
    c.up(c(deploy("a", 1)))
    r = c.step(rc.ReplicaCrashed(replica_id="a#0", now=50))  # an old clock reading: time never goes back
    assert not r.stale and c.state.cluster.now == 100.0
    r = c.step(rc.ReplicaCrashed(replica_id="a#0", now=120))  # news of a replica that left: stale
    assert r.stale and r.commands == () and c.state.cluster.now == 120.0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "5"])
def test_now_on_an_event_is_checked_and_named(bad):
    with pytest.raises(rc.InvalidConfig, match=r"ReplicaPlaced.now must be a finite number of seconds"):
        rc.ReplicaPlaced(replica_id="a#0", node_id="n0", now=bad)


# ------------------------------------------------------------------ node loss
def test_node_lost_replaces_placed_and_reserved_replicas_and_the_node_leaves():
    c = Core(("n0", 4), ("n1", 4))
    cmds = c(deploy("a", 3))
    c.up(cmds[3:5])  # a#0 (n0) and a#1 (n1) run; a#2 is only reserved on n0
    assert c.rep("a#2").phase is Phase.PENDING and c.rep("a#2").node_id == "n0"
    assert c(rc.NodeLost(node_id="n0")) == [
        # (replacements are placed by the end-of-step pass, in rank order, once all of n0 is released)
        ("start", "a#3", 0, "a#0"), ("start", "a#4", 2, "a#2"),
        ("place", "a#3", "n1", (0, 1, 1)), ("place", "a#4", "n1", (2, 1, 2))]
    assert "n0" not in c.state.cluster.nodes and c.free() == {"n1": 1.0}
    assert c.held() == {"a#1": "n1", "a#3": "n1", "a#4": "n1"}


def test_node_lost_for_an_unknown_node_while_unmanaged_is_stale():
    c = Core()
    c(deploy("a", 1))
    c(rc.ReplicaPlaced(replica_id="a#0", node_id="n0"))
    result = c.step(rc.NodeLost(node_id="n9"))
    assert result.stale and result.commands == () and c.rep("a#0").node_id == "n0"


# ----------------------------------------------------------------- rank_packed
def test_rank_packed_top_rank_downscale_reassigns_nothing_at_any_level():
    """12 replicas on 3 nodes x 4 GPUs, scaled to 8: node rank = rank // 4 and
    local rank = rank % 4 before and after, and no rank reconfigure at all."""
    c = Core(("n0", 4), ("n1", 4), ("n2", 4))
    c.up(c(deploy("a", 12, placement="rank_packed")))
    ranks = c.state.ranks("a")
    assert sorted(r.as_tuple() for r in ranks.values()) == [(g, g // 4, g % 4) for g in range(12)]
    assert [c.rep(c.state.deployments["a"].ranks.holder_of(g)).node_id for g in (0, 4, 8)] == ["n0", "n1", "n2"]
    cmds = c(rc.ScaleRequested(deployment="a", num_replicas=8))
    assert cmds == [("world", "a", 8), ("stop", "a#11"), ("stop", "a#10"), ("stop", "a#9"), ("stop", "a#8")]
    for rid in ("a#11", "a#10", "a#9", "a#8"):
        result = c.step(rc.ReplicaStopped(replica_id=rid))
        assert result.commands == () and all(not comp.changes for comp in result.compactions)
    assert c.state.deployments["a"].healthy
    assert {rid: r.as_tuple() for rid, r in c.state.ranks("a").items()} == {
        rid: ranks[rid].as_tuple() for rid in [f"a#{i}" for i in range(8)]}
    assert c.free() == {"n0": 0.0, "n1": 0.0, "n2": 4.0}


# -------------------------------------------------------------------- recovery
def test_recovery_rebuilds_the_cluster_books_and_places_the_pending_replica():
    c = Core()
    report = rc.ReplicaReport
    cmds = c(rc.ControllerRecovered(
        deployments=[deploy("a", 3)],
        reports=[report(replica_id="a#0", deployment="a", rank=rc.ReplicaRank(rank=0, node_rank=0, local_rank=0),
                        node_id="n0"),
                 report(replica_id="a#1", deployment="a", rank=rc.ReplicaRank(rank=1, node_rank=0, local_rank=1),
                        node_id="n0"),
                 report(replica_id="a#2", deployment="a", rank=2, phase="pending")],
        nodes=[rc.NodeJoined(node_id="n0", resources={"GPU": 4}), rc.NodeJoined(node_id="n1", resources={"GPU": 4})],
        next_replica_number=3))
    assert cmds == [("place", "a#2", "n1", (2, 1, 0))]
    assert c.state.cluster.managed and c.held() == {"a#0": "n0", "a#1": "n0", "a#2": "n1"}
    assert c.free() == {"n0": 2.0, "n1": 3.0}


def test_recovery_roundtrip_with_a_reserved_but_unconfirmed_replica():
    c = Core(("n0", 4))
    cmds = c(deploy("a", 2))
    c.up(cmds[2:3])
    assert c.rep("a#1").phase is Phase.PENDING and c.rep("a#1").node_id == "n0"
    check_recovery_roundtrip(c.state)


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize("gpus", [-1, "four", float("nan")])
def test_node_joined_refuses_a_bad_resource_amount(gpus):
    with pytest.raises(rc.InvalidConfig, match=r"NodeJoined\.resources"):
        rc.NodeJoined(node_id="n0", resources={"GPU": gpus})


def test_deployment_applied_refuses_an_unknown_placement_policy():
    with pytest.raises(rc.InvalidConfig, match=r"spread, pack, rank_packed.*'bogus'"):
        deploy("a", 1, placement="bogus")


def test_node_joined_again_is_stale_when_the_same_and_invalid_when_different():
    c = Core(("n0", 4))
    before = c.state
    result = c.step(rc.NodeJoined(node_id="n0", resources={"GPU": 4}))
    assert result.stale and result.commands == () and result.state == before
    with pytest.raises(rc.InvalidEvent, match="n0"):
        rc.step(c.state, rc.NodeJoined(node_id="n0", resources={"GPU": 8}))


def test_node_joined_again_with_several_resources_is_stale():
    res = {"CPU": 16, "GPU": 4, "memory": 64e9, "object_store_memory": 8e9, "accelerator_type:H100": 1,
           "node:10.0.0.1": 1, "custom_a": 2, "custom_b": 3}
    c = Core()
    c(rc.NodeJoined(node_id="n0", resources=res))
    assert c.step(rc.NodeJoined(node_id="n0", resources=res)).stale


def test_packing_gap_counts_node_changes_beyond_one_block_per_node():
    """How far from rank-packed: 0 for blocks, one per extra change of node."""
    from rankcore.placement.policies import packing_gap

    assert packing_gap(["a", "a", "b", "b", "c"]) == 0
    assert packing_gap(["a", "b", "a", "b"]) == 2  # 3 changes, 2 nodes
    assert packing_gap(["a", None, "a", "b"]) == 0  # an unplaced rank is skipped
    assert packing_gap([]) == 0
    c = Core(("n0", 2), ("n1", 2))
    c.up(c(deploy("a", 4, placement="rank_packed")))
    assert c.state.deployments["a"].packing_gap() == 0
    s = Core(("n0", 2), ("n1", 2))
    s.up(s(deploy("a", 4, placement="spread")))
    assert s.state.deployments["a"].packing_gap() == 2  # dealt n0, n1, n0, n1

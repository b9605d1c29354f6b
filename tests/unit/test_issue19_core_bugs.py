"""Issue 19, bugs in the pure core (1, 2, 5, 6, 8) and the scenario warnings (7).
Each test failed before its fix."""

from __future__ import annotations

import pytest

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


# ------------------------------------------------------------------ bug 2
def _static_running() -> rc.State:
    """A static deployment, 2 ranks on a caller's group (bundles 0,1 on n0; 2,3 on n1), both running."""
    placement = rc.StaticPlacement.from_mapping("pg-1", ("n0", "n0", "n1", "n1"), {0: [0, 1], 1: [2, 3]})
    first = _step(rc.State(), rc.DeploymentApplied(name="app", num_replicas=2, static_placement=placement))
    return _carry_out(first.state, first.commands, "app", [])


def _failed_by(event: object, full: bool) -> rc.Step:
    state = _static_running()
    rank1 = state.deployments["app"].ranks.holder_of(1)
    result = rc.step(state, event)
    check_step(state, event, result, full=full)  # no InvariantViolation, in either mode
    rep = result.state.deployments["app"].replicas[rank1]
    assert rep.phase is rc.Phase.FAILED and rep.node_id is None
    assert result.state.deployments["app"].ranks.rank_of(rank1) is None  # node ranks gone, not told: FAILED
    assert [c for c in result.commands if isinstance(c, rc.ReconfigureReplica)] == []
    assert [(type(c).__name__, c.replica_id) for c in result.commands] == [("StopReplica", rank1)]
    return result


def test_bundles_placed_that_takes_a_static_ranks_node_away_passes_the_step_checks() -> None:
    """A BundlesPlaced that leaves rank 1's bundles unplaced fails rank 1 (its
    node ranks go, no reconfigure: its process is stopped). The cheap checks
    (``full=False``) agreed with ``full=True`` and with the same change via NodeLost."""
    lose = rc.BundlesPlaced(deployment="app", bundle_nodes=("n0", "n0", None, None))
    _failed_by(lose, full=False)
    _failed_by(lose, full=True)
    _failed_by(rc.NodeLost(node_id="n1"), full=False)


def test_a_rank_change_without_its_reconfigure_is_still_caught_by_the_cheap_checks() -> None:
    """The exemption is for FAILED replicas only: a running replica whose rank
    changes with no reconfigure still fails ``check_step`` (full or not)."""
    import attrs
    import pytest

    state = _static_running()
    event = rc.ReplicaReady(replica_id="app#1")  # a repeated answer: nothing changes
    result = rc.step(state, event)
    dep = result.state.deployments["app"]
    moved = dep.ranks.unplace("app#1").place("app#1", "n0")  # app#1 (running) moved, say, by a buggy wrapper
    bad = attrs.evolve(result, state=attrs.evolve(result.state, deployments=result.state.deployments.set(
        "app", attrs.evolve(dep, ranks=moved, replicas=dep.replicas.set(
            "app#1", attrs.evolve(dep.replicas["app#1"], node_id="n0"))))))
    for full in (False, True):
        with pytest.raises(rc.InvariantViolation, match="rank reconfigures sent: 0"):
            check_step(state, event, bad, full=full)


# ------------------------------------------------------------------ bug 5
HUGE = 10**400  # an int too large for a float


def _deployed() -> rc.State:
    return _step(rc.State(), rc.DeploymentApplied(name="llm", num_replicas=2)).state


@pytest.mark.parametrize("rid", ["llm#" + "1" * 5000, "llm#" + "9" * 4400], ids=["5000-digits", "4400-digits"])
def test_a_replica_id_with_a_huge_number_is_an_unknown_replica(rid: str) -> None:
    """More digits than Python converts: InvalidEvent naming the id, cut short (was ValueError)."""
    state = _deployed()
    for event in (rc.ReplicaPlaced(replica_id=rid, node_id="n0"), rc.ReplicaCrashed(replica_id=rid),
                  rc.ReplicaReady(replica_id=rid), rc.ReplicaStopped(replica_id=rid)):
        with pytest.raises(rc.InvalidEvent, match=r"unknown replica 'llm#1{10}|unknown replica 'llm#9{10}") as err:
            rc.step(state, event)
        assert len(str(err.value)) < 200 and "characters" in str(err.value)


@pytest.mark.parametrize("rid", ["llm#١", "llm#１", "llm#1\u0663"])
def test_a_replica_id_with_unicode_digits_is_refused_not_stale(rid: str) -> None:
    """``"llm#١"`` is not ``"llm#1"`` (int() reads it as 1, so it looked like an
    earlier incarnation of the core's own, and the event was taken as stale)."""
    state = _deployed()
    assert rc.base.state.parse_replica_number(rid) is None
    with pytest.raises(rc.InvalidEvent, match="unknown replica"):
        rc.step(state, rc.ReplicaPlaced(replica_id=rid, node_id="n0"))
    assert rc.base.state.parse_replica_number("llm#1") == 1  # (ASCII digits still parse)


@pytest.mark.parametrize("make, field", [
    (lambda: rc.Tick(now=HUGE), "Tick.now"),
    (lambda: rc.ReplicaPlaced(replica_id="llm#0", node_id="n0", now=HUGE), "ReplicaPlaced.now"),
    (lambda: rc.ReplicaCrashed(replica_id="llm#0", now=HUGE), "ReplicaCrashed.now"),
    (lambda: rc.DeploymentApplied(name="x", num_replicas=1, start_timeout_s=HUGE),
     "DeploymentApplied('x').start_timeout_s"),  # (an option's error names its deployment)
    (lambda: rc.DeploymentApplied(name="x", num_replicas=1, resources={"GPU": HUGE}),
     "DeploymentApplied('x').resources['GPU']"),
    (lambda: rc.NodeJoined(node_id="n", resources={"GPU": HUGE}), "NodeJoined.resources['GPU']"),
    (lambda: rc.NodeCapacityChanged(node_id="n", resources={"GPU": HUGE}), "NodeCapacityChanged.resources['GPU']"),
])
def test_an_int_too_large_for_a_float_is_invalid_config_at_construction(make, field) -> None:
    """Was OverflowError from float()/math.isfinite; now InvalidConfig naming the
    field and the value, cut short."""
    with pytest.raises(rc.InvalidConfig) as err:
        make()
    msg = str(err.value)
    assert field in msg and "an int of about 401 digits" in msg and len(msg) < 200


@pytest.mark.parametrize("make", [
    lambda v: rc.Tick(now=v),
    lambda v: rc.DeploymentApplied(name="x", num_replicas=1, start_timeout_s=v),
    lambda v: rc.DeploymentApplied(name="x", num_replicas=1, resources={"GPU": v}),
])
@pytest.mark.parametrize("bad", [True, float("nan"), float("inf"), -1, "1", pytest.param(HUGE, id="huge")])
def test_every_number_field_refuses_bools_non_finite_and_huge_values_by_name(make, bad) -> None:
    with pytest.raises(rc.InvalidConfig, match="must be a finite number"):
        make(bad)


def test_fine_numbers_still_pass() -> None:
    assert rc.Tick(now=10**300).now == 10**300  # (an int a float can hold)
    assert rc.DeploymentApplied(name="x", num_replicas=1, resources={"GPU": 2}).resources == (("GPU", 2.0),)
    assert rc.DeploymentApplied(name="x", num_replicas=1, start_timeout_s=0).start_timeout_s == 0


def test_error_messages_cut_huge_values_short() -> None:
    from rankcore.base.fields import shown

    assert shown("x" * 1000).endswith("... (1002 characters)") and len(shown("x" * 1000)) < 120
    assert shown(10**5000) == "an int of about 5001 digits"  # (repr itself would raise: over the digit limit)
    assert shown((10**5000,)) == "a tuple too large to show"
    assert shown("llm#0") == "'llm#0'"
    with pytest.raises(rc.InvalidConfig, match=r"must be a non-negative int, got an int of about 5001 digits"):
        rc.ReplicaRank(rank=-(10**5000), node_rank=0, local_rank=0)


@pytest.mark.parametrize("n", [10**400, 10**5000], ids=["400-digits", "5000-digits"])
def test_a_huge_replica_count_is_refused_with_a_short_message(n: int) -> None:
    """num_replicas over max_replicas named, cut short (a 5,000-digit int made
    the message itself raise ValueError; a 400-digit one flooded it)."""
    with pytest.raises(rc.InvalidConfig, match="is above max_replicas") as info:
        rc.DeploymentApplied(name="x", num_replicas=n)
    assert "num_replicas=an int of about" in str(info.value) and len(str(info.value)) < 200
    with pytest.raises(rc.InvalidConfig, match="is above the rank space") as info:
        rc.DeploymentApplied(name="x", num_replicas=1, max_replicas=n)
    assert len(str(info.value)) < 200
    st = rc.step(rc.State(), rc.DeploymentApplied(name="x", num_replicas=0)).state
    with pytest.raises(rc.InvalidConfig, match="above the deployment's max_replicas") as info:
        rc.step(st, rc.ScaleRequested(deployment="x", num_replicas=n))
    assert len(str(info.value)) < 200


def test_a_node_order_beyond_64_bits_is_refused() -> None:
    assert rc.NodeJoined(node_id="n", resources={}, order=2**63 - 1).order == 2**63 - 1
    with pytest.raises(rc.InvalidConfig, match=r"NodeJoined.order must be at most 2\*\*63 - 1, got an int of about"):
        rc.NodeJoined(node_id="n", resources={}, order=10**400)


# ------------------------------------------------------------------ bug 7
def _scenario_warnings(start: float, ready: float, timeout: float) -> tuple[str, ...]:
    from executors.scenarios.format import parse_scenario

    return parse_scenario(f"""
name: t
cluster: {{nodes: 1, gpus_per_node: 2}}
latency: {{start: {start}, ready: {ready}}}
faults: {{start_timeout: {timeout}}}
deployments:
  m: {{replicas: 1}}
timeline:
  - deploy: m
""").warnings


def test_a_start_latency_equal_to_the_start_timeout_warns() -> None:
    """start + ready == start_timeout races the deadline: warned (only "above" warned)."""
    (at,) = _scenario_warnings(4, 1, 5)
    assert "deployments.m: starts take up to ~5 s" in at and "at faults.start_timeout=5 s" in at
    (above,) = _scenario_warnings(4, 1.5, 5)
    assert "beyond faults.start_timeout=5 s" in above
    assert _scenario_warnings(4, 0.9, 5) == ()


# ------------------------------------------------------------------ bug 8
def _count_choices(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every node choice the queue pass makes (``placing._choose``), by replica."""
    from rankcore.control import placing

    seen: list[str] = []
    real = placing._choose

    def counting(cl, dep, rid, *rest):  # type: ignore[no-untyped-def]
        seen.append(rid)
        return real(cl, dep, rid, *rest)

    monkeypatch.setattr(placing, "_choose", counting)
    return seen


def test_the_queue_is_not_walked_when_nothing_that_could_unblock_it_changed(monkeypatch) -> None:
    """A blocked queue (nothing fits) stays blocked through a Tick that forgets
    failed placements when no waiting replica had any: no pass, no node choice
    (it used to reset ``Cluster.blocked`` and walk the whole queue)."""
    state = rc.State()
    for n in ("n0", "n1"):
        state = _step(state, rc.NodeJoined(node_id=n, resources=GPU1)).state
    state = _step(state, rc.Tick(now=0.0)).state
    state = _step(state, rc.DeploymentApplied(name="a", num_replicas=4, resources=GPU1,
                                                      placement_timeout_s=None)).state  # a#2, a#3 wait
    state = _step(state, rc.PlacementFailed(replica_id="a#0", node_id="n0")).state  # a#2 takes n0; retry at 30
    state = _step(state, rc.ReplicaPlaced(replica_id="a#0", node_id="n1")).state  # placed anyway: waits no more
    assert list(state.cluster.queued) == ["a#3"] and state.cluster.blocked is not None
    assert state.cluster.retry_at == 30.0 and not state.cluster.avoid
    seen = _count_choices(monkeypatch)
    result = _step(state, rc.Tick(now=31.0))
    assert seen == [] and result.commands == () and result.state.cluster.blocked is not None


def test_a_release_still_unblocks_the_longest_waiting(monkeypatch) -> None:
    """A crash frees its booking: the longest-waiting replica takes the room (one
    node choice for it, one for the next, which no longer fits: the pass stops),
    and the queue is blocked again after."""
    state = rc.State()
    state = _step(state, rc.NodeJoined(node_id="n0", resources=GPU1)).state
    first = _step(state, rc.DeploymentApplied(name="a", num_replicas=50, resources=GPU1))
    state = first.state
    state = _step(state, rc.ReplicaPlaced(replica_id="a#0", node_id="n0")).state
    state = _step(state, rc.ReplicaReady(replica_id="a#0")).state
    assert len(state.cluster.queued) == 49 and state.cluster.blocked is not None
    seen = _count_choices(monkeypatch)
    result = _step(state, rc.ReplicaCrashed(replica_id="a#0"))
    places = [c for c in result.commands if isinstance(c, rc.PlaceReplica)]
    assert [(c.replica_id, c.node_id) for c in places] == [("a#1", "n0")]  # first come, first served
    assert seen == ["a#1", "a#2"]  # a#2 (and so everyone of its kind) no longer fits: stop
    after = result.state.cluster
    assert after.blocked is not None and "a#50" in after.queued and "a#1" not in after.queued
    assert [rid for rid in after.queue if rid in after.queued] == [f"a#{i}" for i in range(2, 51)]
    seen.clear()
    assert _step(result.state, rc.Tick(now=1.0)).commands == () and seen == []  # blocked: no walk


# ------------------------------------------------------------------ bug 6
def _managed_one(placement_timeout_s=None):
    state = rc.State()
    for n in ("n0", "n1"):
        state = rc.step(state, rc.NodeJoined(node_id=n, resources={"GPU": 1})).state
    return rc.step(state, rc.DeploymentApplied(name="a", num_replicas=1, resources={"GPU": 1},
                                               placement_timeout_s=placement_timeout_s)).state


def test_replica_placed_on_a_node_that_never_joined_is_refused_and_the_state_kept():
    state = _managed_one()
    with pytest.raises(rc.InvalidEvent, match=r"'a#0' placed on node 'ghost', which never joined .*NodeJoined first"):
        rc.step(state, rc.ReplicaPlaced(replica_id="a#0", node_id="ghost"))
    assert state.replica("a#0").phase is rc.Phase.PENDING and state.replica("a#0").node_id == "n0"


def test_replica_placed_on_a_node_reported_lost_died_with_it_and_is_replaced():
    state = _managed_one()
    state = rc.step(state, rc.NodeLost(node_id="n1")).state  # the executor raced: it was placed on n1 as n1 went
    result = rc.step(state, rc.ReplicaPlaced(replica_id="a#0", node_id="n1"))
    check_step(state, rc.ReplicaPlaced(replica_id="a#0", node_id="n1"), result, full=True)
    starts = [c for c in result.commands if isinstance(c, rc.StartReplica)]
    assert [(c.replaces, c.global_rank) for c in starts] == [("a#0", 0)]
    assert "a#0" not in result.state.index
    places = [c.node_id for c in result.commands if isinstance(c, rc.PlaceReplica)]
    assert places == ["n0"]
    # the node joins again: it is no longer lost, and placing there is an ordinary answer
    state = rc.step(result.state, rc.NodeJoined(node_id="n1", resources={"GPU": 1})).state
    assert "n1" not in state.cluster.lost

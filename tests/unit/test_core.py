"""Example-based tests of every rank rule of the core (the seed's semantics and ours)."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.base.lifecycle import Phase
from tests.helpers import Driver, of


def deploy(d: Driver, n: int, **kw) -> list:
    kw.setdefault("user_config", {"model": "v1"})
    kw.setdefault("has_reconfigure", True)
    kw.setdefault("reconfigure_takes_rank", True)
    return d.run(rc.DeploymentApplied(name="app", num_replicas=n, **kw))


# ----------------------------------------------------------- the seed's examples
def test_seed_four_replicas_get_ranks_0_to_3_and_world_size_4():
    """The seed's first example: 4 replicas report ranks {0,1,2,3}, world_size 4."""
    d = Driver()
    deploy(d, 4)
    assert sorted(r[0] for r in d.ranks().values()) == [0, 1, 2, 3]
    assert d.dep().world_size == 4 and d.dep().healthy


def test_seed_rank_aware_model_reconfigured_at_startup():
    """The seed's second example: with a user_config and reconfigure(rank),
    reconfigure follows __init__ at startup with model_v1 and the rank."""
    d = Driver()
    cmds = deploy(d, 2, user_config={"model_name": "model_v1"})
    inits = of(rc.InitializeReplica, cmds)
    assert len(inits) == 2
    assert all(c.call_reconfigure and c.user_config == {"model_name": "model_v1"} for c in inits)
    assert sorted(c.rank.rank for c in inits) == [0, 1]


@pytest.mark.parametrize(
    "user_config, has_reconfigure, expected",
    [({"m": 1}, True, True), (None, True, False), ({}, True, True), ({"m": 1}, False, False)],
)
def test_startup_reconfigure_rule(user_config, has_reconfigure, expected):
    """Startup reconfigure needs both a user_config (even {}) and a reconfigure method."""
    d = Driver()
    cmds = deploy(d, 1, user_config=user_config, has_reconfigure=has_reconfigure, reconfigure_takes_rank=False)
    assert of(rc.InitializeReplica, cmds)[0].call_reconfigure is expected


@pytest.mark.parametrize("user_config", [None, {"m": 1}])
def test_reconfigure_taking_rank_is_called_at_start_without_user_config(user_config):
    """Ray Serve 2.60's rule: a reconfigure(user_config, rank) is called at start
    whenever it takes rank, with or without a user_config (issue 8, point 10)."""
    d = Driver()
    cmds = deploy(d, 2, user_config=user_config, has_reconfigure=True, reconfigure_takes_rank=True)
    inits = of(rc.InitializeReplica, cmds)
    assert [(c.call_reconfigure, c.pass_rank, c.user_config) for c in inits] == [(True, True, user_config)] * 2


def test_seed_lifecycle_table():
    """The seed's table: upscale leaves ranks, world size up; downscale may change
    ranks, world size down; another replica dying, or this one: no change."""
    d = Driver(nodes=["n0"])
    deploy(d, 4)
    before = d.ranks()
    d.run(rc.ScaleRequested(deployment="app", num_replicas=6))
    assert {k: v for k, v in d.ranks().items() if k in before} == before
    assert d.dep().world_size == 6
    # another replica dies (and is replaced on the same node): others unchanged
    victim = d.by_rank()[2]
    others = {k: v for k, v in d.ranks().items() if k != victim}
    d.node_for = lambda cmd: "n0"
    d.run(rc.ReplicaCrashed(replica_id=victim))
    assert {k: v for k, v in d.ranks().items() if k in others} == others
    assert d.by_rank()[2] != victim and d.dep().world_size == 6
    # downscale: world size drops, ranks become contiguous 0..3
    d.run(rc.ScaleRequested(deployment="app", num_replicas=4, victims=(d.by_rank()[0], d.by_rank()[1])))
    assert d.dep().world_size == 4
    assert sorted(r[0] for r in d.ranks().values()) == [0, 1, 2, 3]


# ------------------------------------------------------------------ scaling
def test_world_size_is_announced_the_moment_the_target_changes():
    """UpdateWorldSize(8) comes before any new replica starts; new ones carry 8."""
    d = Driver()
    deploy(d, 4)
    result = d.step(rc.ScaleRequested(deployment="app", num_replicas=8))
    assert isinstance(result.commands[0], rc.UpdateWorldSize) and result.commands[0].world_size == 8
    assert [c.world_size for c in of(rc.StartReplica, result.commands)] == [8] * 4
    assert result.state.deployments["app"].world_size == 8


def test_upscale_gives_lowest_free_at_each_level_and_keeps_existing():
    """New replicas take the lowest free rank, node rank and local rank."""
    d = Driver(nodes=["n0", "n1"])
    deploy(d, 2)
    assert d.ranks() == {"app#0": (0, 0, 0), "app#1": (1, 1, 0)}
    d.nodes = ["n2", "n0"]
    d.turn = 0
    d.run(rc.ScaleRequested(deployment="app", num_replicas=4))
    assert d.ranks() == {"app#0": (0, 0, 0), "app#1": (1, 1, 0), "app#2": (2, 2, 0), "app#3": (3, 0, 1)}


def test_downscale_prefers_not_yet_running_then_highest_ranks():
    """Victims: pending/starting replicas first, then the highest ranks (fewer compactions)."""
    d = Driver()
    deploy(d, 4)
    d.run(rc.ScaleRequested(deployment="app", num_replicas=6), hold=lambda c: isinstance(c, rc.InitializeReplica))
    starting = sorted(c.replica_id for c in d.held)
    cmds = d.run(rc.ScaleRequested(deployment="app", num_replicas=3), hold=lambda c: isinstance(c, rc.StopReplica))
    stopped = [c.replica_id for c in of(rc.StopReplica, cmds)]
    assert sorted(stopped[:2]) == starting
    assert stopped[2] == d.by_rank()[3]


def test_named_victims_are_stopped_first():
    """ScaleRequested.victims are honoured in order."""
    d = Driver()
    deploy(d, 4)
    v = (d.by_rank()[0], d.by_rank()[2])
    cmds = d.run(rc.ScaleRequested(deployment="app", num_replicas=2, victims=v))
    assert [c.replica_id for c in of(rc.StopReplica, cmds)] == list(v)


def test_bad_victims_raise_and_leave_state():
    """A victim that is unknown, stopping or one too many raises InvalidEvent naming it."""
    d = Driver()
    deploy(d, 3)
    s = d.state
    with pytest.raises(rc.InvalidEvent, match="nope#9"):
        rc.step(s, rc.ScaleRequested(deployment="app", num_replicas=2, victims=("nope#9",)))
    with pytest.raises(rc.InvalidEvent, match="2 victims"):
        rc.step(s, rc.ScaleRequested(deployment="app", num_replicas=2, victims=("app#0", "app#1")))
    assert d.state is s and d.ranks() == {"app#0": (0, 0, 0), "app#1": (1, 1, 0), "app#2": (2, 0, 1)}


# -------------------------------------------------------------------- release
def test_ranks_are_released_only_when_fully_stopped():
    """A stopping replica keeps its rank; an upscale meanwhile does not reuse it."""
    d = Driver()
    deploy(d, 4)
    top = d.by_rank()[3]
    d.run(rc.ScaleRequested(deployment="app", num_replicas=3), hold=lambda c: isinstance(c, rc.StopReplica))
    assert d.dep().replicas[top].phase is Phase.STOPPING
    assert d.dep().ranks.global_rank(top) == 3
    cmds = d.run(rc.ScaleRequested(deployment="app", num_replicas=4))
    (start,) = of(rc.StartReplica, cmds)
    assert start.global_rank == 4
    out = d.release()
    assert top not in d.dep().replicas
    # once healthy, the newcomer is compacted from 4 down to the freed 3
    assert d.dep().ranks.holder_of(3) == start.replica_id
    assert [c.replica_id for c in of(rc.ReconfigureReplica, out)] == [start.replica_id]


def test_compaction_waits_for_healthy_and_changes_fewest_ranks():
    """After a downscale nothing is reassigned while a replica is still stopping;
    once healthy, only the ranks that must move do, each with one reconfigure."""
    d = Driver(nodes=["n0"])
    deploy(d, 6)
    v = (d.by_rank()[0], d.by_rank()[2], d.by_rank()[4])
    keep_lo = d.by_rank()[1]
    d.run(rc.ScaleRequested(deployment="app", num_replicas=3, victims=v), hold=lambda c: isinstance(c, rc.StopReplica))
    first = d.held[0]
    out = d.release(lambda c: c is first)
    assert of(rc.ReconfigureReplica, out) == []  # two still stopping: not healthy
    out = d.release()
    recs = of(rc.ReconfigureReplica, out)
    # ranks {1, 3, 5} -> {0, 1, 2}: 1 stays; 3 and 5 move to holes 0 and 2
    assert sorted(c.rank.rank for c in recs) == [0, 2]
    assert keep_lo not in {c.replica_id for c in recs}
    assert len({c.replica_id for c in recs}) == len(recs)
    assert all(c.reason == "rank" for c in recs)
    assert sorted(r[0] for r in d.ranks().values()) == [0, 1, 2]
    assert d.dep().healthy


def test_compaction_covers_node_and_local_ranks():
    """Node and local ranks are compacted too; a replica whose only change is its
    node rank still gets exactly one reconfigure."""
    d = Driver(nodes=["n0", "n1", "n2"])
    deploy(d, 6)  # n0: ranks 0,3  n1: 1,4  n2: 2,5
    v = (d.by_rank()[0], d.by_rank()[3])  # empty node n0 entirely (node rank 0)
    cmds = d.run(rc.ScaleRequested(deployment="app", num_replicas=4, victims=v))
    recs = of(rc.ReconfigureReplica, cmds)
    ranks = d.ranks()
    assert sorted(r[1] for r in ranks.values()) == [0, 0, 1, 1]
    assert sorted(r[0] for r in ranks.values()) == [0, 1, 2, 3]
    # n2 (node rank 2) moves to node rank 0: both its replicas change
    moved = {c.replica_id for c in recs}
    on_n2 = {rid for rid, rep in d.dep().replicas.items() if rep.node_id == "n2"}
    assert on_n2 <= moved


def test_rank_reconfigure_call_rules():
    """Rank-change reconfigures always update the context; the user's method is
    called whenever it takes rank, with or without a user_config (issue 8 point 10
    changed the None case: Ray Serve 2.60 calls it then too)."""
    for user_config, takes_rank, call in [({"a": 1}, True, True), (None, True, True), ({"a": 1}, False, False),
                                          (None, False, False)]:
        d = Driver(nodes=["n0"])
        deploy(d, 3, user_config=user_config, reconfigure_takes_rank=takes_rank)
        cmds = d.run(rc.ScaleRequested(deployment="app", num_replicas=2, victims=(d.by_rank()[0],)))
        (rec,) = of(rc.ReconfigureReplica, cmds)
        assert rec.reason == "rank" and rec.rank.rank == 0 and rec.world_size == 2
        assert rec.call_user is call and rec.pass_rank is takes_rank


# ---------------------------------------------------------------- user_config
def test_user_config_update_reconfigures_every_running_replica():
    """A new user_config reaches every running replica, in rank order; a replica
    still starting gets it as soon as it is ready."""
    d = Driver()
    deploy(d, 3)
    d.run(rc.ScaleRequested(deployment="app", num_replicas=4), hold=lambda c: isinstance(c, rc.InitializeReplica))
    cmds = d.run(rc.DeploymentApplied(name="app", num_replicas=4, user_config={"model": "v2"},
                                      has_reconfigure=True, reconfigure_takes_rank=True))
    recs = of(rc.ReconfigureReplica, cmds)
    assert [c.rank.rank for c in recs] == [0, 1, 2]
    assert all(c.user_config == {"model": "v2"} and c.reason == "user_config" and c.call_user for c in recs)
    late = d.release()
    (rec,) = of(rc.ReconfigureReplica, late)
    assert rec.rank.rank == 3 and rec.user_config == {"model": "v2"}


def test_user_config_update_without_reconfigure_method_does_not_call_user():
    d = Driver()
    deploy(d, 2, has_reconfigure=False, reconfigure_takes_rank=False)
    cmds = d.run(rc.DeploymentApplied(name="app", num_replicas=2, user_config={"model": "v2"}))
    assert [c.call_user for c in of(rc.ReconfigureReplica, cmds)] == [False, False]


# ---------------------------------------------------------------------- crash
def test_crash_replacement_reuses_rank_and_follows_new_node():
    """A crashed replica's replacement gets the same global rank; its node and
    local ranks are those of the node it lands on."""
    d = Driver(nodes=["n0", "n1"])
    deploy(d, 4)
    victim = d.by_rank()[1]  # on n1
    d.node_for = lambda cmd: "n0"
    cmds = d.run(rc.ReplicaCrashed(replica_id=victim, reason="oom"))
    (start,) = of(rc.StartReplica, cmds)
    assert start.global_rank == 1 and start.replaces == victim
    new = d.by_rank()[1]
    assert d.dep().replicas[new].lineage == 1
    assert d.ranks()[new] == (1, 0, 2)


def test_node_lost_replaces_every_replica_on_it_and_recompacts():
    """Losing a node crashes its replicas; replacements keep their global ranks and,
    once healthy, node and local ranks are contiguous again."""
    d = Driver(nodes=["n0", "n1", "n2"])
    deploy(d, 6)
    old = d.by_rank()
    d.node_for = lambda cmd: "n0"
    cmds = d.run(rc.NodeLost(node_id="n1"))
    assert sorted(c.global_rank for c in of(rc.StartReplica, cmds)) == [1, 4]
    assert d.dep().healthy
    ranks = d.ranks()
    assert sorted(r[0] for r in ranks.values()) == list(range(6))
    assert sorted({r[1] for r in ranks.values()}) == [0, 1]
    assert old[0] == d.by_rank()[0]


def test_crash_of_a_stopping_replica_is_not_replaced():
    d = Driver()
    deploy(d, 3)
    d.run(rc.ScaleRequested(deployment="app", num_replicas=2), hold=lambda c: isinstance(c, rc.StopReplica))
    (stop,) = d.held
    d.held.clear()
    cmds = d.run(rc.ReplicaCrashed(replica_id=stop.replica_id))
    assert of(rc.StartReplica, cmds) == []
    assert len(d.dep().replicas) == 2


# ----------------------------------------------------------------- stale/errors
def test_stale_events_change_nothing():
    """News about a replica that already left is stale: no commands, same state."""
    d = Driver()
    deploy(d, 2)
    gone = d.by_rank()[1]
    d.run(rc.ScaleRequested(deployment="app", num_replicas=1))
    for ev in (rc.ReplicaCrashed(replica_id=gone), rc.ReplicaStopped(replica_id=gone),
               rc.ReplicaReady(replica_id=gone), rc.ReplicaPlaced(replica_id=gone, node_id="n0")):
        r = rc.step(d.state, ev)
        assert r.stale and r.commands == () and r.state.deployments == d.state.deployments


def test_old_reconfigure_answer_is_stale_and_future_one_invalid():
    """A config applied while a replica still reconfigures for the one before reaches it once it
    answers (one reconfigure in flight per replica); that answer repeated is then stale."""
    d = Driver(nodes=["n0"])
    deploy(d, 2)
    d.run(rc.DeploymentApplied(name="app", num_replicas=2, user_config={"model": "v2"}, has_reconfigure=True),
          hold=lambda c: isinstance(c, rc.ReconfigureReplica))
    rid = d.held[0].replica_id
    r = rc.step(d.state, rc.DeploymentApplied(name="app", num_replicas=2, user_config={"model": "v3"},
                                              has_reconfigure=True))
    assert r.commands == ()  # (app#0 still reconfigures, and only one may at once of 2)
    d.state = r.state
    r = rc.step(d.state, rc.ReplicaReconfigured(replica_id=rid, version=1))
    assert not r.stale
    (again,) = [c for c in r.commands if isinstance(c, rc.ReconfigureReplica)]
    assert (again.replica_id, again.version, again.user_config) == (rid, 2, {"model": "v3"})
    d.state = r.state
    assert rc.step(d.state, rc.ReplicaReconfigured(replica_id=rid, version=1)).stale
    with pytest.raises(rc.InvalidEvent, match="acknowledges reconfigure 9"):
        rc.step(d.state, rc.ReplicaReconfigured(replica_id=rid, version=9))


@pytest.mark.parametrize(
    "event, match",
    [
        (rc.ReplicaReady(replica_id="app#0"), "is pending: 'ready' is not allowed"),
        (rc.ReplicaStopped(replica_id="app#0"), "is pending: 'stopped' is not allowed"),
        (rc.ScaleRequested(deployment="other", num_replicas=1), "unknown deployment 'other'"),
        (rc.ReplicaReady(replica_id="foreign-id"), "unknown replica 'foreign-id'"),
        (rc.ReplicaReady(replica_id="app#99"), "unknown replica 'app#99'"),
    ],
)
def test_illegal_events_raise_naming_what_was_wrong_and_keep_state(event, match):
    d = Driver()
    d.run(rc.DeploymentApplied(name="app", num_replicas=1), hold=lambda c: True)
    before = d.state
    snap = (dict(before.index), before.deployments["app"].ranks.to_dict(), before.deployments["app"].counts)
    with pytest.raises(rc.InvalidEvent, match=match):
        rc.step(before, event)
    assert snap == (dict(before.index), before.deployments["app"].ranks.to_dict(), before.deployments["app"].counts)


def test_not_an_event_is_rejected():
    with pytest.raises(rc.InvalidEvent, match="not a rankcore event"):
        rc.step(rc.State(), {"kind": "scale"})


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: rc.DeploymentApplied(name="a", num_replicas=-1), "DeploymentApplied.num_replicas.*-1"),
        (lambda: rc.DeploymentApplied(name="a", num_replicas=True), "num_replicas.*True"),
        (lambda: rc.DeploymentApplied(name="", num_replicas=1), "DeploymentApplied.name"),
        (lambda: rc.DeploymentApplied(name="a", num_replicas=1, reconfigure_takes_rank=True), "needs has_reconfigure"),
        (lambda: rc.ScaleRequested(deployment="a", num_replicas=1, victims=("x", "x")), "twice"),
        (lambda: rc.ReplicaPlaced(replica_id="a#0", node_id=3), "ReplicaPlaced.node_id"),
        (lambda: rc.ReplicaReport(replica_id="a#0", deployment="a", rank="zero", node_id="n"), "'zero'"),
        (lambda: rc.ReplicaReport(replica_id="a#0", deployment="a", rank={"rnk": 0}, node_id="n"), "needs 'rank'"),
        (lambda: rc.ReplicaReport(replica_id="a#0", deployment="a", rank=0, phase="running"), "names no node_id"),
        (lambda: rc.ReplicaReport(replica_id="a#0", deployment="a", rank=0, phase="dead", node_id="n"), "phase"),
    ],
)
def test_malformed_records_are_rejected_where_built(make, match):
    with pytest.raises(rc.InvalidConfig, match=match):
        make()


def test_records_have_valid_python_reprs():
    """Events and commands round-trip through repr (replayable hypothesis output)."""
    d = Driver()
    cmds = deploy(d, 2)
    events = [
        rc.DeploymentApplied(name="a", num_replicas=2, user_config={"k": [1]}, has_reconfigure=True),
        rc.ScaleRequested(deployment="a", num_replicas=1, victims=("a#0",)),
        rc.ReplicaPlaced(replica_id="a#0", node_id="n"),
        rc.ReplicaReconfigured(replica_id="a#0", version=2),
        rc.NodeLost(node_id="n"),
        rc.ReplicaReport(replica_id="a#0", deployment="a", rank={"rank": 1, "node_rank": 0, "local_rank": 0}, node_id="n"),
    ]
    ns = {name: getattr(rc, name) for name in rc.__all__}
    ns.update(Phase=Phase)
    for obj in events + cmds:
        assert eval(repr(obj), ns) == obj


# ------------------------------------------------------------ several deployments
def test_deployments_have_independent_rank_spaces():
    d = Driver()
    d.run(rc.DeploymentApplied(name="a", num_replicas=2))
    d.run(rc.DeploymentApplied(name="b", num_replicas=3))
    assert sorted(r[0] for r in d.ranks("a").values()) == [0, 1]
    assert sorted(r[0] for r in d.ranks("b").values()) == [0, 1, 2]
    d.run(rc.ReplicaCrashed(replica_id=d.by_rank("a")[0]))
    assert sorted(r[0] for r in d.ranks("b").values()) == [0, 1, 2]
    assert d.state.deployments["a"].world_size == 2


def test_scale_to_zero_and_back():
    d = Driver()
    deploy(d, 3)
    d.run(rc.ScaleRequested(deployment="app", num_replicas=0))
    assert len(d.dep().replicas) == 0 and d.dep().healthy
    d.run(rc.ScaleRequested(deployment="app", num_replicas=2))
    assert sorted(r[0] for r in d.ranks().values()) == [0, 1]


def test_step_is_pure():
    """The input state is unchanged and still usable after step."""
    d = Driver()
    deploy(d, 3)
    s = d.state
    snap = s.deployments["app"].ranks.to_dict()
    r1 = rc.step(s, rc.ScaleRequested(deployment="app", num_replicas=1))
    r2 = rc.step(s, rc.ScaleRequested(deployment="app", num_replicas=1))
    assert s.deployments["app"].ranks.to_dict() == snap
    assert r1.commands == r2.commands and r1.state == r2.state


def test_repeated_answers_are_stale_contradicting_ones_invalid():
    """At-least-once delivery: the same ReplicaPlaced/ReplicaReady again is stale;
    a placement on another node contradicts what the core knows and raises."""
    d = Driver(nodes=["n0"])
    deploy(d, 1)
    rid = d.by_rank()[0]
    assert rc.step(d.state, rc.ReplicaPlaced(replica_id=rid, node_id="n0")).stale
    assert rc.step(d.state, rc.ReplicaReady(replica_id=rid)).stale
    with pytest.raises(rc.InvalidEvent, match="'placed' is not allowed"):
        rc.step(d.state, rc.ReplicaPlaced(replica_id=rid, node_id="n1"))


def test_initialize_says_whether_reconfigure_takes_the_rank():
    for takes_rank in (True, False):
        d = Driver()
        (init,) = of(rc.InitializeReplica, deploy(d, 1, reconfigure_takes_rank=takes_rank))
        assert init.pass_rank is takes_rank


def test_run_applies_events_in_order():
    state, commands = rc.run([rc.DeploymentApplied(name="app", num_replicas=2),
                              rc.ScaleRequested(deployment="app", num_replicas=1)])
    assert [type(c).__name__ for c in commands] == ["StartReplica", "StartReplica", "UpdateWorldSize", "StopReplica"]
    assert state.deployments["app"].target == 1


# ------------------------------------------------------------ replica ceiling
def test_replica_count_above_the_ceiling_is_refused_at_once():
    """num_replicas=10**7 is a typo until the caller raises max_replicas (issue 8, point 6)."""
    with pytest.raises(rc.InvalidConfig, match=r"num_replicas=10000000 is above max_replicas=100000"):
        rc.DeploymentApplied(name="llm", num_replicas=10**7)
    assert rc.DEFAULT_MAX_REPLICAS == 100_000
    big = rc.DeploymentApplied(name="llm", num_replicas=2, max_replicas=200_000)
    state = rc.step(rc.State(), big).state
    assert state.deployments["llm"].max_replicas == 200_000
    with pytest.raises(rc.InvalidConfig, match=r"ScaleRequested\('llm'\).num_replicas=300000 .* max_replicas=200000"):
        rc.step(state, rc.ScaleRequested(deployment="llm", num_replicas=300_000))
    small = rc.step(state, rc.DeploymentApplied(name="llm", num_replicas=2, max_replicas=4)).state
    with pytest.raises(rc.InvalidConfig, match="max_replicas=4"):
        rc.step(small, rc.ScaleRequested(deployment="llm", num_replicas=5))
    assert len(rc.step(small, rc.ScaleRequested(deployment="llm", num_replicas=4)).commands) == 3
    for bad in (0, -1, "4", True):
        with pytest.raises(rc.InvalidConfig, match="max_replicas"):
            rc.DeploymentApplied(name="llm", num_replicas=0, max_replicas=bad)


def test_a_lost_nodes_replicas_are_replaced_in_rank_order():
    """Replacements start lowest rank first, so an executor that places them in
    command order gives them local ranks in global-rank order (issue 8, point 12)."""
    d = Driver(nodes=["n0", "n1"])
    deploy(d, 6)
    on_n0 = sorted(d.dep().ranks.global_rank(rid) for rid, rep in d.dep().replicas.items() if rep.node_id == "n0")
    assert len(on_n0) == 3
    result = d.step(rc.NodeLost(node_id="n0"))
    starts = of(rc.StartReplica, result.commands)
    assert [c.global_rank for c in starts] == on_n0
    assert [c.replica_id for c in starts] == [f"app#{n}" for n in range(6, 9)]


def test_an_id_of_no_deployment_is_invalid_not_stale():
    d = Driver()
    d.run(rc.DeploymentApplied(name="app", num_replicas=2))
    with pytest.raises(rc.InvalidEvent, match="unknown replica 'nosuch#1'"):
        rc.step(d.state, rc.ReplicaReady(replica_id="nosuch#1"))

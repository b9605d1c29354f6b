"""The policies that moved from the executors into the core (issue 19): health
checks, the placement timeout, failures as facts, the restart backoff and the
deployment status, graceful shutdown on StopReplica. Events in, commands out,
every invariant checked after every step."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.base.lifecycle import Phase
from rankcore.invariants import check_step


class Core:
    def __init__(self, *nodes: tuple[str, float], now: float | None = 100.0) -> None:
        self.state = rc.State()
        if now is not None:
            self(rc.Tick(now=now))
        for node, gpus in nodes:
            self(rc.NodeJoined(node_id=node, resources={"GPU": gpus}))

    def step(self, event: object) -> rc.Step:
        result = rc.step(self.state, event)
        check_step(self.state, event, result, full=True)
        self.state = result.state
        return result

    def __call__(self, event: object) -> tuple:
        return self.step(event).commands

    def dep(self, name: str = "a") -> rc.Deployment:
        return self.state.deployments[name]

    def rep(self, rid: str) -> rc.Replica:
        r = self.state.replica(rid)
        assert r is not None, rid
        return r

    def up(self, commands: tuple, node: str | None = None) -> None:
        """Answer every start/place in ``commands`` with placed + ready."""
        for c in commands:
            if isinstance(c, rc.PlaceReplica):
                self(rc.ReplicaPlaced(replica_id=c.replica_id, node_id=c.node_id))
                self(rc.ReplicaReady(replica_id=c.replica_id))
            elif isinstance(c, rc.StartReplica) and not self.state.cluster.managed:
                self(rc.ReplicaPlaced(replica_id=c.replica_id, node_id=node or "n0"))
                self(rc.ReplicaReady(replica_id=c.replica_id))


def deploy(n: int = 1, **kw: object) -> rc.DeploymentApplied:
    return rc.DeploymentApplied(name="a", num_replicas=n, resources={"GPU": 1}, **kw)


def kinds(commands: tuple) -> list[str]:
    return [type(c).__name__ for c in commands]


# ------------------------------------------------------------------ options
def test_options_default_to_ray_serves_and_travel_on_the_commands():
    c = Core(("n0", 2))
    cmds = c(deploy(1))
    place = next(x for x in cmds if isinstance(x, rc.PlaceReplica))
    init = c(rc.ReplicaPlaced(replica_id=place.replica_id, node_id="n0"))[0]
    assert isinstance(init, rc.InitializeReplica)
    assert (init.health_check_period_s, init.health_check_timeout_s) == (10.0, 30.0)
    c(rc.ReplicaReady(replica_id="a#0"))
    stop = c(rc.ScaleRequested(deployment="a", num_replicas=0))[-1]
    assert isinstance(stop, rc.StopReplica)
    assert (stop.graceful_shutdown_wait_loop_s, stop.graceful_shutdown_timeout_s) == (2.0, 20.0)
    spec = c.dep().spec()
    assert (spec.health_check_failure_threshold, spec.placement_timeout_s, spec.restart_backoff_s,
            spec.restart_backoff_max_s, spec.max_constructor_retry_count) == (3, 10.0, 1.0, 64.0, 20)


def test_a_changed_option_applies_to_the_next_commands():
    c = Core(("n0", 2))
    c.up(c(deploy(1)))
    c(deploy(1, graceful_shutdown_timeout_s=5.0, graceful_shutdown_wait_loop_s=0.5))
    stop = c(rc.ScaleRequested(deployment="a", num_replicas=0))[-1]
    assert (stop.graceful_shutdown_wait_loop_s, stop.graceful_shutdown_timeout_s) == (0.5, 5.0)


@pytest.mark.parametrize("field, value, match", [
    ("health_check_period_s", 0, "health_check_period_s must be > 0"),
    ("health_check_timeout_s", -1, "health_check_timeout_s must be a finite number"),
    ("health_check_failure_threshold", 0, "health_check_failure_threshold must be an int >= 1"),
    ("placement_timeout_s", 0.0, "placement_timeout_s must be > 0"),
    ("graceful_shutdown_timeout_s", float("nan"), "graceful_shutdown_timeout_s must be a finite"),
    ("restart_backoff_max_s", 0.5, "restart_backoff_max_s=0.5 is below restart_backoff_s=1.0"),
    ("max_constructor_retry_count", True, "max_constructor_retry_count must be an int >= 1"),
])
def test_a_bad_option_is_refused_naming_it(field, value, match):
    with pytest.raises(rc.InvalidConfig, match=match):
        deploy(1, **{field: value})


# ------------------------------------------------------------------ health checks
def test_failed_health_checks_in_a_row_stop_and_replace_the_replica_on_its_rank():
    """Under ``force_stop_unhealthy_replicas``: killed at once, its room its successor's in the same step."""
    c = Core(("n0", 2))
    c.up(c(deploy(2, force_stop_unhealthy_replicas=True)))
    rank = c.dep().rank_of("a#0")
    assert c(rc.HealthChecked(replica_id="a#0", healthy=False, detail="timed out")) == ()
    assert c.rep("a#0").health_failures == 1
    assert c(rc.HealthChecked(replica_id="a#0", healthy=True)) == ()  # a pass resets the count
    assert c.rep("a#0").health_failures == 0
    c(rc.HealthChecked(replica_id="a#0", healthy=False))
    c(rc.HealthChecked(replica_id="a#0", healthy=False))
    cmds = c(rc.HealthChecked(replica_id="a#0", healthy=False, now=130.0))
    assert kinds(cmds)[:3] == ["StopReplica", "StartReplica", "PlaceReplica"]
    stop, start, place = cmds[:3]
    assert stop.replica_id == "a#0" and stop.graceful_shutdown_timeout_s == 0.0  # killed at once
    assert start.replaces == "a#0" and start.global_rank == rank.rank
    assert place.node_id == "n0" and place.rank == rank  # its room, on its node, all three ranks
    assert "a#0" not in c.state.index and c.state.cluster.now == 130.0


def test_an_unhealthy_replica_is_drained_while_its_successor_waits_for_its_room():
    """By default (Ray Serve 2.60's): a graceful stop; its node full, its successor takes its ranks at
    once and is placed in its room, all three ranks, once it has stopped."""
    c = Core(("n0", 2))
    c.up(c(deploy(2, health_check_failure_threshold=1)))
    rank = c.dep().rank_of("a#0")
    cmds = c(rc.HealthChecked(replica_id="a#0", healthy=False, now=130.0))
    stop, start = cmds[:2]
    assert kinds(cmds)[:2] == ["StopReplica", "StartReplica"] and "PlaceReplica" not in kinds(cmds)
    assert stop.replica_id == "a#0" and stop.graceful_shutdown_timeout_s == 20.0  # drained
    assert start.replaces == "a#0" and start.global_rank == rank.rank
    assert c.rep("a#0").phase is rc.Phase.STOPPING and c.dep().ranks.global_rank(start.replica_id) == rank.rank
    placed = [x for x in c(rc.ReplicaStopped(replica_id="a#0", now=131.0)) if isinstance(x, rc.PlaceReplica)]
    assert [(p.replica_id, p.node_id, p.rank) for p in placed] == [(start.replica_id, "n0", rank)]


def test_the_failure_threshold_is_the_deployments():
    c = Core(("n0", 2))
    c.up(c(deploy(1, health_check_failure_threshold=1)))
    assert kinds(c(rc.HealthChecked(replica_id="a#0", healthy=False)))[:2] == ["StopReplica", "StartReplica"]


def test_health_checks_of_a_replica_not_serving_change_nothing():
    c = Core(("n0", 2))
    c(deploy(1, health_check_failure_threshold=1))
    c(rc.ReplicaPlaced(replica_id="a#0", node_id="n0"))  # starting
    before = c.state
    result = c.step(rc.HealthChecked(replica_id="a#0", healthy=False))
    assert result.stale and result.commands == () and result.state == before


def test_a_gang_member_failing_its_checks_restarts_its_gang():
    c = Core(("n0", 4))
    c.up(c(deploy(2, gang_size=2, health_check_failure_threshold=1)))
    cmds = c(rc.HealthChecked(replica_id="a#1", healthy=False))
    stops = [x.replica_id for x in cmds if isinstance(x, rc.StopReplica)]
    assert sorted(stops) == ["a#0", "a#1"]
    assert all(x.graceful_shutdown_timeout_s == 0.0 for x in cmds if isinstance(x, rc.StopReplica))


# ------------------------------------------------------------------ placement timeout
def test_an_unanswered_placement_is_given_up_and_the_replacement_avoids_the_node():
    c = Core(("n0", 1), ("n1", 1))
    cmds = c(deploy(1))
    place = cmds[-2]
    assert isinstance(place, rc.PlaceReplica) and place.node_id == "n0"
    assert cmds[-1] == rc.ScheduleTick(at=110.0)
    assert c(rc.Tick(now=109.9)) == ()
    cmds = tuple(x for x in c(rc.Tick(now=110.0)) if not isinstance(x, rc.ScheduleTick))
    assert kinds(cmds)[:3] == ["StopReplica", "StartReplica", "PlaceReplica"]
    assert cmds[0].replica_id == "a#0" and cmds[0].graceful_shutdown_timeout_s == 0.0
    assert cmds[1].replaces == "a#0" and cmds[1].global_rank == 0
    assert cmds[2].replica_id == cmds[1].replica_id
    assert cmds[2].node_id == "n1"  # not n0 again
    assert c.state.cluster.avoid[cmds[1].replica_id] == ("n0",)
    assert c(rc.ReplicaPlaced(replica_id="a#0", node_id="n0")) == ()  # late news of the old incarnation: stale


def test_a_placement_answered_in_time_disarms_its_deadline():
    c = Core(("n0", 1))
    c(deploy(1))
    assert "a#0" in c.state.cluster.deadlines
    c(rc.ReplicaPlaced(replica_id="a#0", node_id="n0", now=105.0))
    assert "a#0" not in c.state.cluster.deadlines
    assert c(rc.Tick(now=120.0)) == ()  # nothing times out
    assert c.rep("a#0").phase is Phase.STARTING


def test_placement_failed_disarms_the_deadline_and_places_again():
    c = Core(("n0", 1), ("n1", 1))
    c(deploy(1))
    cmds = c(rc.PlacementFailed(replica_id="a#0", node_id="n0", now=101.0))
    assert [x.node_id for x in cmds if isinstance(x, rc.PlaceReplica)] == ["n1"]
    assert c.state.cluster.deadlines["a#0"] == 111.0  # the new placement's deadline


def test_no_placement_deadline_without_a_clock_or_with_none():
    c = Core(("n0", 1), now=None)
    assert not any(isinstance(x, rc.ScheduleTick) for x in c(deploy(1)))
    c2 = Core(("n0", 1))
    assert not any(isinstance(x, rc.ScheduleTick) for x in c2(deploy(1, placement_timeout_s=None)))


# ------------------------------------------------------------------ failures as facts
def test_only_an_exited_process_makes_its_node_suspect():
    for cause, suspect in [("exited", True), ("killed", False), ("error", False), ("unknown", False),
                           ("node_lost", False)]:
        c = Core(("n0", 2), ("n1", 2))
        c.up(c(deploy(1)))
        c(rc.ReplicaCrashed(replica_id="a#0", cause=cause))
        assert ("n0" in c.state.cluster.suspects) is suspect, cause


def test_a_crash_cause_outside_the_list_is_refused():
    with pytest.raises(rc.InvalidConfig, match="cause"):
        rc.ReplicaCrashed(replica_id="a#0", cause="oom")


# ------------------------------------------------------------------ restart backoff
def _fail_start(c: Core, cmds: tuple, now: float) -> tuple:
    """Place the replica ``cmds`` started and let its __init__ raise at ``now``."""
    start = next(x for x in cmds if isinstance(x, rc.StartReplica))
    place = next(x for x in cmds if isinstance(x, rc.PlaceReplica))
    c(rc.ReplicaPlaced(replica_id=place.replica_id, node_id=place.node_id, now=now))
    return c(rc.ReplicaCrashed(replica_id=start.replica_id, cause="error", reason="boom", now=now))


def test_a_crash_loop_backs_off_exponentially_capped_and_marks_the_deployment_unhealthy():
    c = Core(("n0", 1))
    cmds = c(deploy(1, restart_backoff_s=1.0, restart_backoff_max_s=4.0, max_constructor_retry_count=20))
    now = 100.0
    waits = []
    for k in range(1, 6):
        cmds = _fail_start(c, cmds, now)
        assert c.dep().start_failures == k
        if k < 3:  # (retrying, not yet UNHEALTHY: the error is shown already, as Ray Serve shows it)
            assert c.dep().status == "UPDATING"
            assert c.dep().status_message == f"0 of 1 replicas running; {k} start(s) failed in a row, the last: boom"
        if not any(isinstance(x, rc.StartReplica) for x in cmds):  # held back: only a Tick is asked for
            tick = next(x for x in cmds if isinstance(x, rc.ScheduleTick))
            waits.append(tick.at - now)
            assert c.dep().replicas  # the replacement exists and holds the rank
            (rid,) = c.dep().replicas.keys()
            assert c.dep().ranks.global_rank(rid) == 0 and c.rep(rid).node_id is None
            assert c(rc.Tick(now=tick.at - 0.01)) == ()
            now = tick.at
            cmds = c(rc.Tick(now=now))
            assert kinds(cmds)[:2] == ["StartReplica", "PlaceReplica"]
        else:
            waits.append(0.0)
    assert waits == [0.0, 1.0, 2.0, 4.0, 4.0]
    assert c.dep().status == "UNHEALTHY" and "failing to start" in c.dep().status_message  # 3 x 1 replica
    assert c.dep().status_message.endswith("; the last: boom")  # (the constructor's error, as Serve shows it)
    place = next(x for x in cmds if isinstance(x, rc.PlaceReplica))
    c(rc.ReplicaPlaced(replica_id=place.replica_id, node_id="n0", now=now))
    c(rc.ReplicaReady(replica_id=place.replica_id))
    assert c.dep().start_failures == 0 and c.dep().status == "HEALTHY"


def test_a_start_timeout_counts_as_a_failed_start_and_a_kill_does_not():
    c = Core(("n0", 1))
    cmds = c(deploy(1, start_timeout_s=5.0))
    c(rc.ReplicaPlaced(replica_id="a#0", node_id="n0", now=100.0))
    c(rc.Tick(now=105.0))
    assert c.dep().start_failures == 1
    c2 = Core(("n0", 1))
    c2(deploy(1))
    c2(rc.ReplicaPlaced(replica_id="a#0", node_id="n0"))
    c2(rc.ReplicaCrashed(replica_id="a#0", cause="killed"))
    assert c2.dep().start_failures == 0
    assert cmds  # (deploy answered)


def test_a_downscale_drops_a_replacement_waiting_out_its_backoff_without_a_stop():
    c = Core(("n0", 2))
    cmds = c(deploy(1))
    cmds = _fail_start(c, cmds, 100.0)
    cmds = _fail_start(c, cmds, 100.0)  # the second failure: backoff
    (rid,) = c.dep().replicas.keys()
    assert rid in c.state.cluster.delayed
    cmds = c(rc.ScaleRequested(deployment="a", num_replicas=0))
    assert not any(isinstance(x, rc.StopReplica) for x in cmds)  # it never existed for the executor
    assert not c.dep().replicas and rid not in c.state.cluster.delayed and rid not in c.state.cluster.deadlines


def _crash_all_starting(c: Core, cmds: tuple, now: float) -> tuple:
    """Place every replica ``cmds`` placed, then let the first one's __init__ raise at ``now``."""
    places = [x for x in cmds if isinstance(x, rc.PlaceReplica)]
    for p in places:
        c(rc.ReplicaPlaced(replica_id=p.replica_id, node_id=p.node_id, now=now))
    return c(rc.ReplicaCrashed(replica_id=places[0].replica_id, cause="error", reason="boom", now=now))


def test_a_gang_that_keeps_failing_to_start_backs_off_whole_and_is_placed_whole():
    """restart_gang: the second failed start in a row holds every member's
    replacement back the same backoff; they come due in one Tick, carry their
    gang, and are placed together (pack: one node)."""
    c = Core(("n0", 2), ("n1", 2))
    cmds = c(rc.DeploymentApplied(name="a", num_replicas=2, gang_size=2, resources={"GPU": 1}))
    cmds = _crash_all_starting(c, cmds, 100.0)  # the first failure: the gang restarts at once
    assert kinds(cmds).count("StartReplica") == 2
    cmds = _crash_all_starting(c, cmds, 100.0)  # the second: both members wait 1 s
    assert sorted(kinds(cmds)) == ["ScheduleTick", "StopReplica"]  # the member still starting is stopped
    assert rc.ScheduleTick(at=101.0) in cmds
    waiting = set(c.dep().replicas)
    assert len(waiting) == 2 and waiting <= set(c.state.cluster.delayed)
    assert sorted(c.dep().ranks.global_rank(r) for r in waiting) == [0, 1]
    assert all(c.rep(r).node_id is None for r in waiting)
    assert c.state.cluster.nodes["n0"].free["GPU"] == 2.0  # their room is free while they wait
    cmds = c(rc.Tick(now=101.0))
    starts = [x for x in cmds if isinstance(x, rc.StartReplica)]
    assert sorted(s.replica_id for s in starts) == sorted(waiting)
    assert all(s.gang is not None and set(s.gang.members) == waiting for s in starts)
    places = [x for x in cmds if isinstance(x, rc.PlaceReplica)]
    assert len(places) == 2 and len({p.node_id for p in places}) == 1
    assert not c.state.cluster.delayed


def test_a_gang_member_under_restart_replica_backs_off_alone_and_its_gang_is_told():
    c = Core(("n0", 2))
    cmds = c(rc.DeploymentApplied(name="a", num_replicas=2, gang_size=2, gang_failure="restart_replica",
                                  resources={"GPU": 1}))
    places = [x for x in cmds if isinstance(x, rc.PlaceReplica)]
    c.up(cmds)  # both ready
    other = places[1].replica_id
    cmds = c(rc.ReplicaCrashed(replica_id=places[0].replica_id, cause="error", reason="boom", now=100.0))
    for _ in range(2):  # its replacement fails to start twice more: the second waits
        place = next(x for x in cmds if isinstance(x, rc.PlaceReplica))
        c(rc.ReplicaPlaced(replica_id=place.replica_id, node_id=place.node_id, now=100.0))
        cmds = c(rc.ReplicaCrashed(replica_id=place.replica_id, cause="error", reason="boom", now=100.0))
    # (the first crash hit a ready replica: not a failed start; then two failed starts in a row)
    assert kinds(cmds) == ["ScheduleTick"] and c.rep(other).phase is Phase.RUNNING
    cmds = c(rc.Tick(now=cmds[0].at))
    (start,) = [x for x in cmds if isinstance(x, rc.StartReplica)]
    (changed,) = [x for x in cmds if isinstance(x, rc.GangChanged)]
    assert start.gang is not None and start.gang.members == changed.members and other in changed.members


def _static_app(**kw: object) -> rc.DeploymentApplied:
    sp = rc.StaticPlacement.from_mapping("pg-1", ("n0", "n1"), {0: [0], 1: [1]})
    return rc.DeploymentApplied(name="a", num_replicas=2, static_placement=sp, resources={"GPU": 1}, **kw)


@pytest.mark.parametrize("managed", [False, True])
def test_a_static_rank_that_keeps_failing_to_start_backs_off_on_its_bundles(managed):
    c = Core(("n0", 1), ("n1", 1)) if managed else Core()
    cmds = c(_static_app())
    now = 100.0
    for k in (1, 2, 3):
        place = next(x for x in cmds if isinstance(x, rc.PlaceReplica) and x.rank.rank == 1)
        c(rc.ReplicaPlaced(replica_id=place.replica_id, node_id=place.node_id, now=now))
        cmds = c(rc.ReplicaCrashed(replica_id=place.replica_id, cause="error", reason="boom", now=now))
        assert c.dep().start_failures == k
        if k == 1:
            assert kinds(cmds) == ["StartReplica", "PlaceReplica"]
            continue
        assert kinds(cmds) == ["ScheduleTick"] and cmds[0].at == now + 2.0 ** (k - 2)
        now = cmds[0].at
        (rid,) = [r for r in c.dep().replicas if c.dep().ranks.global_rank(r) == 1]
        assert rid in c.state.cluster.delayed and c.rep(rid).node_id is None
        cmds = c(rc.Tick(now=cmds[0].at))
        assert kinds(cmds)[:2] == ["StartReplica", "PlaceReplica"]
        assert (cmds[1].node_id, cmds[1].bundles, cmds[1].group) == ("n1", (1,), "pg-1")


def test_a_static_rank_waiting_out_its_backoff_fails_without_a_stop_when_its_bundle_goes():
    c = Core()
    cmds = c(_static_app())
    for _ in range(2):
        place = next(x for x in cmds if isinstance(x, rc.PlaceReplica) and x.rank.rank == 1)
        c(rc.ReplicaPlaced(replica_id=place.replica_id, node_id=place.node_id, now=100.0))
        cmds = c(rc.ReplicaCrashed(replica_id=place.replica_id, cause="error", reason="boom", now=100.0))
    (rid,) = c.state.cluster.delayed.keys()
    cmds = c(rc.BundlesPlaced(deployment="a", bundle_nodes=("n0", None)))
    assert not any(isinstance(x, rc.StopReplica) for x in cmds)  # nothing was started
    assert c.rep(rid).phase is Phase.FAILED
    assert rid not in c.state.cluster.delayed and rid not in c.state.cluster.deadlines
    assert c(rc.Tick(now=200.0)) == ()  # no start comes due
    cmds = c(rc.BundlesPlaced(deployment="a", bundle_nodes=("n0", "n1")))
    assert kinds(cmds) == ["StartReplica", "PlaceReplica"]  # back with its bundles, no backoff


def test_without_a_cluster_model_a_downscale_drops_the_backoff_too():
    c = Core()
    cmds = c(deploy(1))
    for _ in range(2):
        c(rc.ReplicaPlaced(replica_id=cmds[0].replica_id, node_id="n0", now=100.0))
        cmds = c(rc.ReplicaCrashed(replica_id=cmds[0].replica_id, cause="error", reason="boom", now=100.0))
        cmds = tuple(x for x in cmds if isinstance(x, rc.StartReplica)) or cmds
    assert len(c.state.cluster.delayed) == 1
    c(rc.ScaleRequested(deployment="a", num_replicas=0))
    assert not c.dep().replicas and not c.state.cluster.delayed and not c.state.cluster.deadlines


def test_status_is_updating_while_not_healthy_and_unhealthy_for_a_failed_static_rank():
    c = Core(("n0", 2))
    c(deploy(1))
    assert c.dep().status == "UPDATING" and "0 of 1" in c.dep().status_message

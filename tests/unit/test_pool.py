"""The pool commands the core pushes to the request path (rankcore/control/pool.py, issue 22): each rule, in
the step that changes the pool, and ``PoolView`` following them."""

from __future__ import annotations

import rankcore as rc


def _pool(step: rc.Step) -> list[tuple]:
    out: list[tuple] = []
    for c in step.pool:
        if isinstance(c, rc.PoolChanged):
            out.append((c.replica_id, c.membership))
        elif isinstance(c, rc.PoolComing):
            out.append((c.deployment, "coming" if c.coming else "not coming"))
        else:
            out.append(("reset", c.deployment, c.serving, c.draining, c.coming))
    return out


class Run:
    """Steps events, keeping a PoolView of every step's pool commands, checked against the state."""

    def __init__(self) -> None:
        self.state = rc.State()
        self.view = rc.PoolView()

    def __call__(self, event: object) -> rc.Step:
        result = rc.step(self.state, event)
        assert not any(isinstance(c, (rc.PoolChanged, rc.PoolComing, rc.PoolReset)) for c in result.commands)
        self.state = result.state
        for c in result.pool:
            assert self.view.apply(c)
        assert self.view.mismatch(self.state) is None, self.view.mismatch(self.state)
        return result

    def up(self, name: str = "llm", n: int = 2, node: str = "a") -> list[str]:
        first = self(rc.DeploymentApplied(name=name, num_replicas=n))
        assert (name, "coming") in _pool(first)
        rids = [c.replica_id for c in first.commands if isinstance(c, rc.StartReplica)]
        for rid in rids:
            assert _pool(self(rc.ReplicaPlaced(replica_id=rid, node_id=node))) == []  # starting: not in the pool
            assert _pool(self(rc.ReplicaReady(replica_id=rid))) == [(rid, "serving")]
        return rids


def test_a_replica_serves_once_ready_and_is_gone_when_it_crashes_and_its_replacement_serves() -> None:
    run = Run()
    a, b = run.up()
    assert run.view.serving("llm") == [a, b]
    crash = run(rc.ReplicaCrashed(replica_id=a))
    assert _pool(crash) == [(a, "gone")]
    new = next(c.replica_id for c in crash.commands if isinstance(c, rc.StartReplica))
    run(rc.ReplicaPlaced(replica_id=new, node_id="a"))
    assert _pool(run(rc.ReplicaReady(replica_id=new))) == [(new, "serving")]
    assert run.view.serving("llm") == sorted([b, new])


def test_scale_down_drains_then_goes_and_zero_replicas_is_not_coming() -> None:
    run = Run()
    a, b = run.up()
    down = run(rc.ScaleRequested(deployment="llm", num_replicas=0))
    assert _pool(down) == [(b, "draining"), (a, "draining"), ("llm", "not coming")]
    assert _pool(run(rc.ReplicaStopped(replica_id=b))) == [(b, "gone")]
    assert _pool(run(rc.ReplicaStopped(replica_id=a))) == [(a, "gone")]
    assert _pool(run(rc.ScaleRequested(deployment="llm", num_replicas=1))) == [("llm", "coming")]


def test_a_replica_stopped_before_it_served_is_never_announced_as_draining() -> None:
    """(its end may be announced, ``gone``: the request path ignores a replica it does not hold)"""
    run = Run()
    first = run(rc.DeploymentApplied(name="llm", num_replicas=1))
    (rid,) = [c.replica_id for c in first.commands if isinstance(c, rc.StartReplica)]
    run(rc.ReplicaPlaced(replica_id=rid, node_id="a"))
    assert _pool(run(rc.ScaleRequested(deployment="llm", num_replicas=0))) == [("llm", "not coming")]
    assert rid not in run.view.members.get("llm", {})
    assert _pool(run(rc.ReplicaStopped(replica_id=rid))) == [(rid, "gone")]


def test_new_weights_take_every_replica_out_until_it_holds_them_and_a_sleep_drains() -> None:
    run = Run()
    a, b = run.up()
    push = run(rc.WeightsPushed(deployment="llm", version=1))
    assert _pool(push) == [(a, "draining"), (b, "draining")]
    assert _pool(run(rc.WeightsUpdated(replica_id=a, version=1))) == [(a, "serving")]
    assert run.view.serving("llm") == [a]
    run(rc.WeightsUpdated(replica_id=b, version=1))
    assert _pool(run(rc.SleepRequested(deployment="llm"))) == [(a, "draining"), (b, "draining")]
    run(rc.TierMoved(replica_id=a, tier="warm"))
    run(rc.TierMoved(replica_id=b, tier="warm"))
    assert _pool(run(rc.WakeRequested(deployment="llm"))) == []  # (still asleep until each load is done)
    assert _pool(run(rc.TierMoved(replica_id=a, tier="hot"))) == [(a, "serving")]


def test_a_lost_node_takes_its_replicas_out_of_the_pool_draining_ones_too() -> None:
    run = Run()
    a, b = run.up(node="a")
    (c,) = run.up(name="other", n=1, node="b")
    run(rc.ScaleRequested(deployment="llm", num_replicas=1))  # b drains (on node a)
    lost = run(rc.NodeLost(node_id="a"))
    assert sorted(_pool(lost)) == [(a, "gone"), (b, "gone")]
    assert run.view.serving("other") == [c] and run.view.members["llm"] == {}


def test_a_recovery_resets_every_pool() -> None:
    run = Run()
    a, b = run.up()
    run(rc.ScaleRequested(deployment="llm", num_replicas=1))  # b drains
    reports = rc.invariants.reports_from(run.state)
    fresh = Run()
    fresh.view = run.view  # the request path's view survives the controller
    result = fresh(reports)
    assert _pool(result) == [("reset", "llm", (a,), (b,), True)]
    assert fresh.view.members["llm"] == {a: "serving", b: "draining"}


def test_an_answer_with_the_clock_that_brings_a_tick_keeps_each_parts_pool_commands_in_order() -> None:
    run = Run()
    run(rc.NodeJoined(node_id="n1", resources={"GPU": 2}))
    run(rc.Tick(now=1.0))
    first = run(rc.DeploymentApplied(name="llm", num_replicas=2, resources={"GPU": 1}, start_timeout_s=5.0))
    places = [c for c in first.commands if isinstance(c, rc.PlaceReplica)]
    for p in places:
        run(rc.ReplicaPlaced(replica_id=p.replica_id, node_id=p.node_id, now=2.0))
    run(rc.ReplicaReady(replica_id=places[0].replica_id))
    # at 10.0 the second one's start deadline is past: the Tick replaces it, then the first crashes
    late = run(rc.ReplicaCrashed(replica_id=places[0].replica_id, now=10.0))
    assert _pool(late) == [(places[0].replica_id, "gone")]
    assert run.view.serving("llm") == []


def test_pool_view_reports_what_differs() -> None:
    run = Run()
    a, _b = run.up()
    view = rc.PoolView()
    assert "serving told []" in (view.mismatch(run.state) or "")
    view.apply(rc.PoolReset(deployment="llm", serving=(a,), draining=(), coming=True))
    assert "serving told" in (view.mismatch(run.state) or "")
    assert not view.apply(rc.ScheduleTick(at=1.0))  # not a pool command


def test_a_pool_command_with_an_unknown_membership_is_refused_naming_it() -> None:
    import pytest

    with pytest.raises(rc.InvalidConfig, match=r"PoolChanged\.membership must be one of serving, draining, gone"):
        rc.PoolChanged(deployment="llm", replica_id="llm#0", membership="asleep")


def test_a_lost_node_that_ends_a_static_groups_replica_on_another_node_announces_it_gone() -> None:
    """Found by the thorough property machine: a static deployment asleep and scaled to 0 has a
    replica stopping on node-b (its bundle moved there); losing node-a ends it too, with no command
    naming it. The pool must say it is gone (a node's event looks at every replica)."""
    run = Run()
    for event in (
        rc.NodeJoined(node_id='node-a', resources=(('CPU', 8.0), ('GPU', 1.0)), labels=(), order=0, devices=(), cpu_cache_bytes=0),
        rc.NodeJoined(node_id='node-b', resources=(('CPU', 8.0), ('GPU', 1.0)), labels=(), order=1, devices=(), cpu_cache_bytes=0),
        rc.NodeJoined(node_id='node-c', resources=(('CPU', 8.0), ('GPU', 1.0)), labels=(), order=2, devices=(), cpu_cache_bytes=0),
        rc.Tick(now=1.0),
        rc.DeploymentApplied(name='embed', num_replicas=3, user_config=None, has_reconfigure=True, reconfigure_takes_rank=True, max_replicas=100000, resources=(('GPU', 0.0),), static_placement=rc.StaticPlacement(group='pg', bundle_nodes=('node-a', 'node-a', 'node-a', 'node-a'), mapping=((0,), (1, 2), (3,)), capture_child_tasks=True)),
        rc.ReplicaPlaced(replica_id='embed#1', node_id='node-a', now=None),
        rc.ReplicaPlaced(replica_id='embed#0', node_id='node-a', now=None),
        rc.ReplicaReady(replica_id='embed#0'),
        rc.ReplicaReady(replica_id='embed#1'),
        rc.ReplicaPlaced(replica_id='embed#2', node_id='node-a', now=None),
        rc.ReplicaReady(replica_id='embed#2'),
        rc.ReplicaCrashed(replica_id='embed#0', reason='test', cause='error', now=None),
        rc.ReplicaPlaced(replica_id='embed#3', node_id='node-a', now=None),
        rc.ReplicaReady(replica_id='embed#3'),
        rc.ReplicaCrashed(replica_id='embed#1', reason='test', cause='error', now=None),
        rc.ReplicaPlaced(replica_id='embed#4', node_id='node-a', now=None),
        rc.ReplicaReady(replica_id='embed#4'),
        rc.ReplicaCrashed(replica_id='embed#2', reason='test', cause='error', now=None),
        rc.ReplicaPlaced(replica_id='embed#5', node_id='node-a', now=None),
        rc.ReplicaReady(replica_id='embed#5'),
        rc.BundlesPlaced(deployment='embed', bundle_nodes=('node-a', 'node-b', 'node-a', 'node-a')),
        rc.ReplicaPlaced(replica_id='embed#6', node_id='node-b', now=None),
        rc.ReplicaReady(replica_id='embed#6'),
        rc.SleepRequested(deployment='embed'),
        rc.ReplicaReconfigured(replica_id='embed#5', version=1),
        rc.TierMoved(replica_id='embed#3', tier='warm', nbytes=0),
        rc.TierMoved(replica_id='embed#5', tier='warm', nbytes=0),
        rc.TierMoved(replica_id='embed#6', tier='warm', nbytes=0),
        rc.ReplicaCrashed(replica_id='embed#3', reason='test', cause='error', now=None),
        rc.ReplicaPlaced(replica_id='embed#7', node_id='node-a', now=None),
        rc.DeploymentApplied(name='llm', num_replicas=0, user_config=None, has_reconfigure=False, reconfigure_takes_rank=False, max_replicas=100000, resources=(('GPU', 0.0),), gang_size=2),
        rc.ReplicaReady(replica_id='embed#7'),
        rc.TierMoved(replica_id='embed#7', tier='warm', nbytes=0),
        rc.ReplicaCrashed(replica_id='embed#5', reason='test', cause='error', now=None),
        rc.ScaleRequested(deployment='embed', num_replicas=0, victims=()),
        rc.NodeLost(node_id='node-a'),
    ):
        run(event)  # (Run checks the view against the core's pools after every step)
    assert "embed#6" not in run.view.members.get("embed", {})


def test_an_autoscaling_sample_that_changes_no_replica_walks_none_of_them(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Issue 36: announce compares only the replicas a step can have moved. A sample that scales nothing
    # keeps every replica record (and the weights version): the replicas looked at must not grow with
    # the deployment (counted, not timed). Before, every replica of the deployment was a candidate.
    from rankcore.control import pool

    looked: list[int] = []
    candidates = pool._candidates
    monkeypatch.setattr(pool, "_candidates", lambda *a: looked.append(len(got := candidates(*a))) or got)
    for n in (4, 64):
        run = Run()
        first = run(rc.DeploymentApplied(name="m", num_replicas=n, autoscaling=True, initial_replicas=n,
                                         max_replicas=n, target_ongoing_requests=2))
        for rid in (c.replica_id for c in first.commands if isinstance(c, rc.StartReplica)):
            run(rc.ReplicaPlaced(replica_id=rid, node_id="a"))
            run(rc.ReplicaReady(replica_id=rid))
        replicas = tuple(run.state.deployment("m").replicas)
        looked.clear()
        for t in (1.0, 2.0, 3.0):  # exactly the target's load: nothing to scale
            kept = run.state.deployment("m").replicas
            result = run(rc.AutoscalingMetrics(deployment="m", now=t, ongoing=tuple((r, 2) for r in replicas)))
            assert result.commands == () and result.pool == ()
            assert result.state.deployment("m").replicas is kept
        assert run.state.deployment("m").target == n
        assert looked == [0, 0, 0], (n, looked)


def test_a_deployment_whose_starts_keep_failing_is_not_coming_until_a_replica_starts() -> None:
    """Serve's DEPLOY_FAILED answers a request 503 at once: once ``failing_to_start`` (``min(
    max_constructor_retry_count, 3 x target)`` failed starts in a row) the deployment wants no
    replica a request could wait for; the core keeps retrying, and the first replica that starts
    makes it coming again. The first failure is retried at once (the fast path), the next after a
    backoff (the general path, a Tick): the view follows the state at every step."""
    run = Run()
    run(rc.Tick(now=0.0))
    run(rc.DeploymentApplied(name="llm", num_replicas=1))
    said = []
    for i in range(3):  # (3 x target: the threshold)
        run(rc.Tick(now=100.0 * i))  # (a backoff waited out: the replacement starts)
        (rid,) = run.state.deployments["llm"].replicas
        run(rc.ReplicaPlaced(replica_id=rid, node_id="a"))
        crash = run(rc.ReplicaCrashed(replica_id=rid, cause="error", reason=f"ZeroDivisionError {i}",
                                      now=100.0 * i + 1))
        said += [p for p in _pool(crash) if p[0] == "llm"]
        assert run.state.deployments["llm"].failing_to_start is (i == 2) and run.view.wanted["llm"] is (i < 2)
    assert said == [("llm", "not coming")]
    assert run.state.deployments["llm"].status == "UNHEALTHY"
    run(rc.Tick(now=1000.0))
    (rid,) = run.state.deployments["llm"].replicas
    run(rc.ReplicaPlaced(replica_id=rid, node_id="a"))
    ready = run(rc.ReplicaReady(replica_id=rid))
    assert ("llm", "coming") in _pool(ready) and (rid, "serving") in _pool(ready)
    assert run.state.deployments["llm"].status == "HEALTHY"

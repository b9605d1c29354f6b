"""Proxies, one a node, as the core's rule (rankcore/control/proxies.py, issue 38)."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore import core
from rankcore.invariants import check_state, check_step


class Run:
    """Steps events through the core, checking every step, and keeps the commands."""

    def __init__(self) -> None:
        self.state = rc.State()
        self.commands: list = []

    def __call__(self, event: object) -> rc.Step:
        result = rc.step(self.state, event)
        check_step(self.state, event, result, full=True)
        self.state = result.state
        self.commands.extend(result.commands)
        return result

    def of(self, *kinds: type) -> list:
        return [c for c in self.commands if isinstance(c, kinds)]


def proxy_cmds(step: rc.Step) -> list:
    return [c for c in step.commands if isinstance(c, (rc.StartProxy, rc.DrainProxy, rc.StopProxy))]


def cluster(run: Run, workers: int = 2, location: str = "EveryNode", drain: float = 30.0) -> None:
    run(rc.Tick(now=0.0))
    run(rc.NodeJoined(node_id="head", resources={"CPU": 4}))
    for i in range(workers):
        run(rc.NodeJoined(node_id=f"w{i}", resources={"CPU": 4, "GPU": 1}))
    run(rc.ProxiesConfigured(options=rc.ProxyOptions(proxy_location=location, min_draining_period_s=drain),
                             head_node="head"))


def ready_all(run: Run, now: float | None = None) -> None:
    for p in list(run.state.proxies.proxies.values()):
        if p.phase is rc.ProxyPhase.STARTING:
            run(rc.ProxyStarted(proxy_id=p.proxy_id, now=now))


def deploy(run: Run, n: int) -> None:
    run(rc.DeploymentApplied(name="llm", num_replicas=n, resources={"GPU": 1}))
    for c in run.of(rc.PlaceReplica):
        if c.replica_id in run.state.index and run.state.replica(c.replica_id).phase is rc.Phase.PENDING:
            run(rc.ReplicaPlaced(replica_id=c.replica_id, node_id=c.node_id))
            run(rc.ReplicaReady(replica_id=c.replica_id))


def test_every_node_is_the_default_the_head_and_each_node_holding_a_replica_get_one() -> None:
    run = Run()
    cluster(run)
    assert rc.ProxyOptions().proxy_location is rc.ProxyLocation.EveryNode
    assert [(c.proxy_id, c.node_id) for c in run.of(rc.StartProxy)] == [("proxy:head#0", "head")]
    deploy(run, 1)  # one GPU replica: on one worker only
    nodes = sorted(c.node_id for c in run.of(rc.StartProxy))
    (worker,) = [n for n in nodes if n != "head"]
    assert run.state.replica("llm#0").node_id == worker
    assert rc.query.proxy_nodes(run.state.proxies, run.state.cluster.nodes) == {"head", worker}


def test_head_only_and_disabled() -> None:
    run = Run()
    cluster(run, location="HeadOnly")
    deploy(run, 2)
    assert [c.node_id for c in run.of(rc.StartProxy)] == ["head"]
    ready_all(run)
    step = run(rc.ProxiesConfigured(options=rc.ProxyOptions(proxy_location="Disabled"), head_node="head"))
    assert proxy_cmds(step) == [rc.DrainProxy(proxy_id="proxy:head#0", node_id="head", draining=True)]
    with pytest.raises(rc.InvalidEvent, match="HeadOnly needs head_node"):
        rc.step(run.state, rc.ProxiesConfigured(options=rc.ProxyOptions(proxy_location="HeadOnly")))
    with pytest.raises(rc.InvalidConfig, match="proxy_location must be one of HeadOnly, EveryNode, Disabled"):
        rc.ProxyOptions(proxy_location="everywhere")
    assert rc.ProxyOptions(proxy_location="every_node").proxy_location is rc.ProxyLocation.EveryNode


def test_a_node_left_without_replicas_drains_its_proxy_which_stops_only_with_nothing_in_flight() -> None:
    run = Run()
    cluster(run, workers=1)
    deploy(run, 1)
    ready_all(run)
    run(rc.Tick(now=10.0))
    run(rc.ScaleRequested(deployment="llm", num_replicas=0))
    step = run(rc.ReplicaStopped(replica_id="llm#0", now=12.0))  # (the general path: its node is empty now)
    assert proxy_cmds(step) == [rc.DrainProxy(proxy_id="proxy:w0#1", node_id="w0", draining=True)]
    assert rc.ScheduleTick(at=42.0) in step.commands  # the drain may end after min_draining_period_s
    # before the period, nothing in flight does not end it
    assert proxy_cmds(run(rc.ProxyHealthChecked(proxy_id="proxy:w0#1", healthy=True, ongoing=0, now=20.0))) == []
    run(rc.Tick(now=42.0))
    # a failed check says nothing of what is in flight: it does not end the drain
    assert proxy_cmds(run(rc.ProxyHealthChecked(proxy_id="proxy:w0#1", healthy=False, ongoing=0, now=43.0))) == []
    # after it: a request still in flight keeps it ...
    assert proxy_cmds(run(rc.ProxyHealthChecked(proxy_id="proxy:w0#1", healthy=True, ongoing=2, now=45.0))) == []
    # ... and the first report of none ends it
    step = run(rc.ProxyHealthChecked(proxy_id="proxy:w0#1", healthy=True, ongoing=0, now=50.0))
    assert proxy_cmds(step) == [rc.StopProxy(proxy_id="proxy:w0#1", node_id="w0", reason="drained")]
    assert "w0" not in run.state.proxies.proxies
    assert rc.query.serving_proxies(run.state.proxies) == ("proxy:head#0",)


def test_a_draining_proxy_whose_node_is_wanted_again_serves_again() -> None:
    run = Run()
    cluster(run, workers=1)
    deploy(run, 1)
    ready_all(run)
    run(rc.ScaleRequested(deployment="llm", num_replicas=0))
    run(rc.ReplicaStopped(replica_id="llm#0"))
    step = run(rc.ScaleRequested(deployment="llm", num_replicas=1))  # booked on w0 again
    assert proxy_cmds(step) == [rc.DrainProxy(proxy_id="proxy:w0#1", node_id="w0", draining=False)]
    assert run.state.proxies.proxies["w0"].phase is rc.ProxyPhase.HEALTHY


def test_a_proxy_that_dies_restarts_at_once_then_after_a_doubling_backoff_until_it_is_ready() -> None:
    run = Run()
    cluster(run, workers=0)
    waits = []
    for _ in range(5):
        pid = run.state.proxies.proxies["head"].proxy_id
        now = run.state.cluster.now
        step = run(rc.ProxyCrashed(proxy_id=pid, reason="killed", now=now))
        starts = [c for c in proxy_cmds(step) if isinstance(c, rc.StartProxy)]
        if not starts:  # waits out its backoff
            at = run.state.proxies.proxies["head"].deadline
            step = run(rc.Tick(now=at))
            starts = [c for c in proxy_cmds(step) if isinstance(c, rc.StartProxy)]
        else:
            at = now
        assert len(starts) == 1 and starts[0].node_id == "head"
        waits.append(at - now)
    assert waits == [0.0, 1.0, 2.0, 4.0, 8.0]
    ready_all(run)
    pid = run.state.proxies.proxies["head"].proxy_id
    step = run(rc.ProxyCrashed(proxy_id=pid, now=run.state.cluster.now))  # ready once: the count starts again
    assert [c.node_id for c in proxy_cmds(step)] == ["head"]
    # late news of an older incarnation is stale; an id the core never made is refused
    assert run(rc.ProxyCrashed(proxy_id="proxy:head#0")).stale
    with pytest.raises(rc.InvalidEvent, match="unknown proxy 'proxy:head#99'"):
        rc.step(run.state, rc.ProxyStarted(proxy_id="proxy:head#99"))
    with pytest.raises(rc.InvalidEvent, match="unknown proxy 'nginx'"):
        rc.step(run.state, rc.ProxyStarted(proxy_id="nginx"))


def test_three_failed_health_checks_in_a_row_stop_a_proxy_and_start_another() -> None:
    run = Run()
    cluster(run, workers=0)
    ready_all(run, now=1.0)
    pid = "proxy:head#0"
    for healthy in (False, False, True, False, False):  # (a pass in between starts the count again)
        assert proxy_cmds(run(rc.ProxyHealthChecked(proxy_id=pid, healthy=healthy, now=2.0))) == []
    step = run(rc.ProxyHealthChecked(proxy_id=pid, healthy=False, now=3.0))
    assert proxy_cmds(step) == [rc.StopProxy(proxy_id=pid, node_id="head", reason="unhealthy"),
                                rc.StartProxy(proxy_id="proxy:head#1", node_id="head")]


def test_a_proxy_not_ready_in_time_is_started_again_with_a_longer_ready_timeout() -> None:
    run = Run()
    cluster(run, workers=0)  # StartProxy at t=0: ready deadline 15 s (three ready checks of 5 s, as Serve's)
    assert proxy_cmds(run(rc.Tick(now=14.0))) == []
    step = run(rc.Tick(now=15.0))
    assert proxy_cmds(step) == [rc.StopProxy(proxy_id="proxy:head#0", node_id="head", reason="ready_timeout"),
                                rc.StartProxy(proxy_id="proxy:head#1", node_id="head")]
    assert run.state.proxies.proxies["head"].deadline == 45.0  # 15 + 3 x 5 s x (1 restart + 1): Serve's growing timeout


def test_a_lost_node_takes_its_proxy_and_a_draining_node_drains_its_own() -> None:
    run = Run()
    cluster(run, workers=2)
    deploy(run, 2)
    ready_all(run)
    step = run(rc.NodeDraining(node_id="w0"))
    assert proxy_cmds(step) == [rc.DrainProxy(proxy_id=run.state.proxies.proxies["w0"].proxy_id, node_id="w0")]
    assert run(rc.NodeDraining(node_id="w0")).stale  # (told twice)
    pid = run.state.proxies.proxies["w1"].proxy_id
    step = run(rc.NodeLost(node_id="w1"))
    assert rc.StopProxy(proxy_id=pid, node_id="w1", reason="node_lost") in step.commands
    assert "w1" not in run.state.proxies.proxies
    assert all(c.node_id != "w1" for c in proxy_cmds(step) if isinstance(c, rc.StartProxy))


def test_a_recovered_controller_adopts_the_live_proxies_and_drains_what_is_not_needed() -> None:
    run = Run()
    cluster(run, workers=1)
    ready_all(run)
    config = rc.ProxiesConfigured(options=rc.ProxyOptions(), head_node="head")
    event = rc.ControllerRecovered(deployments=(), reports=(), proxies=config, next_proxy_number=7,
                                   proxy_ids=("proxy:head#0", "proxy:w0#3", "proxy:head#5"),
                                   nodes=(rc.NodeJoined(node_id="head", resources={"CPU": 4}),
                                          rc.NodeJoined(node_id="w0", resources={"CPU": 4, "GPU": 1})))
    result = rc.step(rc.State(), event)
    check_state(result.state)
    assert proxy_cmds(result) == [rc.StopProxy(proxy_id="proxy:head#0", node_id="head", reason="not_needed"),
                                  rc.DrainProxy(proxy_id="proxy:head#5", node_id="head", draining=False),
                                  rc.DrainProxy(proxy_id="proxy:w0#3", node_id="w0")]  # (w0 holds no replica)
    # whether a proxy drained before is not known: each is told what it is now
    assert result.state.proxies.proxies["head"].proxy_id == "proxy:head#5"
    assert result.state.proxies.started == 7
    # (the refusal names the field that was wrong, whatever the id: a hostile test's find, 2026-11-27)
    for ids in (("proxy:head#0",), ("node-a",)):
        with pytest.raises(rc.InvalidEvent, match=r"ControllerRecovered\.proxy_ids .* proxies is None: no proxies config"):
            rc.step(rc.State(), rc.ControllerRecovered(deployments=(), reports=(), proxy_ids=ids))


def test_without_proxies_configured_the_core_runs_none_and_the_fast_paths_stay() -> None:
    run = Run()
    run(rc.Tick(now=0.0))
    run(rc.NodeJoined(node_id="w0", resources={"GPU": 1}))
    deploy(run, 1)
    assert run.of(rc.StartProxy) == [] and not run.state.proxies.managed
    run(rc.ScaleRequested(deployment="llm", num_replicas=0))
    assert core.fast_step(run.state, rc.ReplicaStopped(replica_id="llm#0")) is not None


def test_where_proxies_run_has_a_rule_for_each_location_and_refuses_any_other() -> None:
    """``proxies.wanted``: every ``ProxyLocation`` its own arm (a ``match`` mypy checks whole, ``assert_never``); a value ProxyOptions could not have
    taken (forced past its converter) is an invariant broken, not read as EveryNode (issue 66)."""
    from rankcore.control import proxies

    nodes = {"head": type("N", (), {"tenants": 0})(), "w1": type("N", (), {"tenants": 1})()}
    want = {"HeadOnly": {"head"}, "EveryNode": {"head", "w1"}, "Disabled": set()}
    for location in rc.PROXY_LOCATIONS:
        book = rc.ProxyBook(options=rc.ProxyOptions(proxy_location=location), head="head")
        assert proxies.wanted(book, nodes) == want[location]
    options = rc.ProxyOptions()
    object.__setattr__(options, "proxy_location", "Everywhere")
    with pytest.raises(rc.InvariantViolation, match="no rule for 'Everywhere'"):
        proxies.wanted(rc.ProxyBook(options=options, head="head"), nodes)

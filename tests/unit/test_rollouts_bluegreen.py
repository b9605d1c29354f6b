"""Blue-green updates (issue 37, ``update_mode="blue_green"``; rankcore.control.bluegreen): a whole new
set starts on the old set's ranks while the old one serves, the pool switches in one step when every
new replica is ready, then the old set drains. Every invariant is checked after every step
(``check_step(full=True)``), and the pool the steps' pool commands describe is followed."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import rankcore as rc
from rankcore.invariants import check_recovery_roundtrip, reports_from
from tests.helpers import placed_answers
from tests.unit.test_rollouts_surge import GPU
from tests.unit.test_rollouts_surge import Cluster as _Cluster

BG = {"update_mode": "blue_green"}


class Cluster(_Cluster):
    """The surge tests' managed core, answering at once except the commands ``hold`` keeps back (any
    kind), following the pool commands (``pools``) and recording the revisions serving after every
    step (``mixed``: a step after which two revisions served)."""

    def __init__(self, nodes: dict[str, float]) -> None:
        self.pools = rc.PoolView()
        self.mixed: list[tuple[str, ...]] = []
        super().__init__(nodes)

    def step(self, event: object) -> rc.Step:
        result = super().step(event)
        for cmd in result.pool:
            self.pools.apply(cmd)
        assert self.pools.mismatch(self.state) is None
        dep = self.state.deployments.get("m")
        if dep is not None:
            revs = tuple(sorted({dep.replicas[r].revision for r in self.pools.serving("m")}))
            if len(revs) > 1:
                self.mixed.append(revs)
        return result

    def run(self, event: object, hold: Callable[[object], bool] | None = None) -> list[object]:
        hold = hold or self.hold
        out: list[object] = []
        queue = [event]
        while queue:
            for cmd in self.step(queue.pop(0)).commands:
                out.append(cmd)
                if hold(cmd):
                    self.held.append(cmd)
                else:
                    queue.extend(placed_answers(cmd))
        return out

    def answer_held(self, pred: Callable[[object], bool]) -> list[object]:
        todo = [c for c in self.held if pred(c)]
        self.held = [c for c in self.held if not pred(c)]
        out: list[object] = []
        for cmd in todo:
            for ev in placed_answers(cmd):
                out.extend(self.run(ev))
        return out

    def serving(self) -> list[str]:
        return self.pools.serving("m")


def deployed(n: int, nodes: dict[str, float], **options: object) -> Cluster:
    c = Cluster(nodes)
    c.run(rc.DeploymentApplied(name="m", num_replicas=n, resources=GPU, version="v1", **{**BG, **options}))
    assert c.dep().healthy
    return c


def apply(c: Cluster, version: str, n: int = 4, **options: object) -> list[object]:
    return c.run(rc.DeploymentApplied(name="m", num_replicas=n, resources=GPU, version=version, **{**BG, **options}))


def hold_ready(cmd: object) -> bool:
    return isinstance(cmd, rc.InitializeReplica)


def test_the_new_set_starts_on_the_old_ranks_and_the_pool_switches_in_one_step() -> None:
    """4 replicas on two 4-GPU nodes: the apply starts 4 greens at once, each beside its blue on its
    three ranks; while any green is not ready, only the 4 blues serve (none stops); the step the last
    green is ready, every blue stops and every green serves; no rank was told twice, no step mixed."""
    c = deployed(4, {"a": 4, "b": 4})
    blues = {c.dep().ranks.global_rank(r): (r, c.dep().ranks.rank_of(r).as_tuple(), rep.node_id)  # type: ignore[union-attr]
             for r, rep in c.dep().replicas.items()}
    c.hold = hold_ready
    cmds = apply(c, "v2")
    starts = [x for x in cmds if isinstance(x, rc.StartReplica)]
    assert len(starts) == 4 and not any(isinstance(x, rc.StopReplica) for x in cmds)
    dep = c.dep()
    assert dep.blues == 4 and dep.rolling
    for s in starts:
        rid, told, node = blues[s.global_rank]
        assert s.replaces == rid and dep.ranks.rank_of(s.replica_id).as_tuple() == told  # type: ignore[union-attr]
        assert dep.replicas[s.replica_id].node_id == node
        assert dep.replicas[rid].blue_ranks == told
    assert c.serving() == sorted(r for r, _, _ in blues.values())
    greens = [s.replica_id for s in starts]
    for g in greens[:3]:
        c.answer_held(lambda x, g=g: isinstance(x, rc.InitializeReplica) and x.replica_id == g)
        assert c.serving() == sorted(r for r, _, _ in blues.values())  # (ready greens stand by)
        assert not any(isinstance(x, rc.StopReplica) for x in c.commands if getattr(x, "replica_id", "") in
                       {r for r, _, _ in blues.values()})
    c.hold = lambda x: isinstance(x, rc.StopReplica)
    last = c.answer_held(lambda x: isinstance(x, rc.InitializeReplica))
    stops = [x.replica_id for x in last if isinstance(x, rc.StopReplica)]
    assert sorted(stops) == sorted(r for r, _, _ in blues.values())
    assert c.serving() == sorted(greens)
    assert c.dep().blues == 0 and not c.mixed
    c.answer_held(lambda x: True)
    dep = c.dep()
    assert dep.healthy and not dep.rolling and {r.revision for r in dep.replicas.values()} == {dep.revision}
    assert {dep.ranks.global_rank(g): dep.ranks.rank_of(g).as_tuple() for g in greens} == \
        {k: told for k, (_, told, _) in blues.items()}  # type: ignore[union-attr]
    assert not any(isinstance(x, rc.ReconfigureReplica) and x.reason == "rank" for x in c.commands)


def test_without_room_beside_the_greens_wait_for_a_node_and_the_blues_serve_on() -> None:
    """Full nodes: the greens wait in line (no node fits); the blues serve, none stops; a new node
    lets them start, and the switch follows."""
    c = deployed(2, {"a": 1, "b": 1})
    blues = sorted(c.dep().replicas)
    apply(c, "v2", n=2)
    dep = c.dep()
    assert dep.blues == 2 and c.serving() == blues and len(dep.replicas) == 4
    assert not any(isinstance(x, rc.StopReplica) for x in c.commands)
    c.run(rc.NodeJoined(node_id="c", resources={"GPU": 4, "CPU": 64}))
    dep = c.dep()
    assert dep.blues == 0 and dep.healthy and not set(blues) & set(dep.replicas) and not c.mixed


def test_a_blue_that_dies_is_not_replaced_and_a_green_that_dies_is() -> None:
    c = deployed(2, {"a": 4, "b": 4})
    c.hold = hold_ready
    apply(c, "v2", n=2)
    blue, other = sorted(r for r, rep in c.dep().replicas.items() if rep.blue_ranks is not None)
    n = len(c.commands)
    c.run(rc.ReplicaCrashed(replica_id=blue))
    assert c.dep().blues == 1 and blue not in c.dep().replicas
    assert not any(isinstance(x, rc.StartReplica) for x in c.commands[n:])
    assert c.serving() == [other]
    green = next(x.replica_id for x in c.held if isinstance(x, rc.InitializeReplica))
    c.held = [x for x in c.held if getattr(x, "replica_id", None) != green]
    k = c.dep().ranks.global_rank(green)
    c.run(rc.ReplicaCrashed(replica_id=green))
    new = [x for x in c.commands[n:] if isinstance(x, rc.StartReplica)]
    assert [(x.replaces, x.global_rank) for x in new] == [(green, k)]
    assert c.serving() == [other]
    c.hold = lambda x: False
    c.answer_held(lambda x: True)
    assert c.dep().healthy and c.dep().blues == 0 and not c.mixed


def test_a_new_revision_before_the_switch_gives_the_blues_their_ranks_back() -> None:
    """A rollback before the switch: every green stops, the blues serve on, on the ranks they were
    told (no rank reconfigure), and nothing rolls; a third revision starts over from the blues."""
    c = deployed(3, {"a": 4, "b": 4})
    before, ids = dict(c.ranks()), sorted(c.dep().replicas)
    c.hold = hold_ready
    apply(c, "v2", n=3)
    greens = [r for r, rep in c.dep().replicas.items() if rep.blue_ranks is None]
    c.hold = lambda x: False
    c.held = []
    apply(c, "v1", n=3)
    dep = c.dep()
    assert dep.blues == 0 and not dep.rolling and not set(greens) & set(dep.replicas)
    assert c.ranks() == before
    assert not any(isinstance(x, rc.ReconfigureReplica) for x in c.commands)
    c.hold = hold_ready
    apply(c, "v3", n=3)
    assert c.dep().blues == 3 and c.serving() == ids
    c.hold = lambda x: False
    c.answer_held(lambda x: True)
    assert c.dep().healthy and {r.revision for r in c.dep().replicas.values()} == {c.dep().revision}
    assert not c.mixed


def test_a_scale_request_before_the_switch_is_refused_and_changes_nothing() -> None:
    c = deployed(2, {"a": 4, "b": 4})
    c.hold = hold_ready
    apply(c, "v2", n=2)
    state = c.state
    with pytest.raises(rc.InvalidEvent, match="switching blue-green"):
        rc.step(state, rc.ScaleRequested(deployment="m", num_replicas=3))


def test_a_controller_restart_before_the_switch_keeps_each_blue_serving_its_ranks() -> None:
    """Blues and greens report the same global ranks: recovery gives each to the green and keeps the
    blue serving on a spare entry; recovering from a state's own reports changes nothing."""
    c = deployed(3, {"a": 4, "b": 4})
    c.hold = hold_ready
    apply(c, "v2", n=3)
    c.answer_held(lambda x: isinstance(x, rc.InitializeReplica) and x.replica_id == c.held[0].replica_id)
    check_recovery_roundtrip(c.state)
    ev = reports_from(c.state)
    r = rc.step(rc.State(), ev)
    dep = r.state.deployments["m"]
    assert dep.blues == 3
    assert {rid for rid, rep in dep.replicas.items() if rep.blue_ranks is not None} == \
        {rid for rid, rep in c.dep().replicas.items() if rep.blue_ranks is not None}
    assert not any(isinstance(x, (rc.StopReplica, rc.ReconfigureReplica)) for x in r.commands)


@pytest.mark.parametrize("options, says", [
    ({"gang_size": 2}, "gang_size"),
    ({"autoscaling": True, "min_replicas": 1}, "autoscaling"),
])
def test_blue_green_is_refused_where_two_sets_cannot_be(options: dict, says: str) -> None:
    with pytest.raises(rc.InvalidConfig, match=f"update_mode='blue_green' and {says}"):
        rc.step(rc.State(), rc.DeploymentApplied(name="m", num_replicas=2, **BG, **options))


def test_the_simulator_runs_a_blue_green_rollout_with_every_invariant_checked() -> None:
    """rollout-8.yaml with room for the second set (4 nodes): the version change completes with no
    rank moved and full availability; with the nodes full (as written) the greens wait for room and
    the blues serve on, so the rollout does not end (its wait_until_healthy fails), nothing lost."""
    import pathlib

    from executors.sim import Simulation, load_scenario

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "rollout-8.yaml"
    room = Simulation(load_scenario(path, overrides={"cluster.nodes": 4, "deployments.model.update_mode": "blue_green"}),
                      check=True).run()
    m = room.metrics["deployments"]["model"]
    assert all(e.passed for e in room.expectations)
    assert m["rollouts_done"] == 1 and m["rollout_replacements"] == 8 and m["reassignments"]["any"] == 0
    assert m["availability_pct"] == 100.0
    full = Simulation(load_scenario(path, overrides={"deployments.model.update_mode": "blue_green"}), check=True).run()
    m = full.metrics["deployments"]["model"]
    assert m["rollouts_done"] == 0 and m["availability_pct"] == 100.0
    assert not all(e.passed for e in full.expectations)


def test_a_rollout_action_may_ask_for_blue_green_and_a_bad_mode_is_refused_naming_its_key() -> None:
    import pathlib

    from executors.sim import ScenarioError, Simulation, parse_scenario

    text = (pathlib.Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "rollout-8.yaml").read_text()
    text = text.replace("nodes: 2", "nodes: 4")
    bg = text.replace("rollout: {deployment: model, version: v2}",
                      "rollout: {deployment: model, version: v2, update_mode: blue_green}")
    assert bg != text
    seen: list[int] = []

    def blues(t: float, event: object, before: rc.State, result: rc.Step) -> None:
        seen.append(result.state.deployments["model"].blues if "model" in result.state.deployments else 0)

    sim = Simulation(parse_scenario(bg), check=True)
    sim.driver.observers.append(blues)
    r = sim.run()
    assert all(e.passed for e in r.expectations) and max(seen) == 8 and seen[-1] == 0
    with pytest.raises(ScenarioError, match=r"timeline\[2\]\.rollout\.update_mode: must be one of rolling, blue_green"):
        parse_scenario(bg.replace("update_mode: blue_green", "update_mode: purple"))


def test_status_shows_each_blue_with_the_ranks_it_serves_and_each_green_standing_by() -> None:
    c = deployed(2, {"a": 4, "b": 4})
    told = {r: c.dep().ranks.rank_tuple(r) for r in c.dep().replicas}
    c.hold = hold_ready
    apply(c, "v2", n=2)
    dep = c.dep()
    roles = {r: rc.query.blue_green_role(dep, rep) for r, rep in dep.replicas.items()}
    assert sorted(roles.values()) == ["blue", "blue", "standby", "standby"]
    for r, t in told.items():
        assert roles[r] == "blue" and rc.query.shown_ranks(dep, r) == t != dep.ranks.rank_tuple(r)
    c.hold = lambda x: False
    c.answer_held(lambda x: True)
    dep = c.dep()
    assert {rc.query.blue_green_role(dep, rep) for rep in dep.replicas.values()} == {None}
    assert all(rc.query.shown_ranks(dep, r) == dep.ranks.rank_tuple(r) for r in dep.replicas)


def test_the_simulators_availability_counts_only_the_blues_while_the_new_set_stands_by() -> None:
    """The scenario metrics (``executors.scenarios.metrics``) count as serving what serves: during a
    switch, the blues. A green ready and standing by does not make up for a blue lost meanwhile."""
    from executors.scenarios.metrics import Metrics

    c = deployed(2, {"a": 4, "b": 4})
    m, clock = Metrics(), [0.0]
    plain = Cluster.step

    def observed(self: Cluster, event: object) -> rc.Step:
        before = self.state
        result = plain(self, event)
        clock[0] += 1.0
        m(clock[0], event, before, result)
        return result

    c.step = observed.__get__(c)  # type: ignore[method-assign]
    c.run(rc.ScaleRequested(deployment="m", num_replicas=2))  # (the observer's first sight of it: healthy)
    c.hold = hold_ready
    apply(c, "v2", n=2)
    first = c.held[0].replica_id
    c.answer_held(lambda x: isinstance(x, rc.InitializeReplica) and x.replica_id == first)  # one green stands by
    blue = sorted(r for r, rep in c.dep().replicas.items() if rep.blue_ranks is not None)[0]
    c.run(rc.ReplicaCrashed(replica_id=blue))
    t0 = clock[0]
    m.advance(t0 + 10.0)
    assert c.dep().blues == 1 and m.deployments["m"].unavailable_replica_seconds >= 10.0



"""Rolling updates of gang deployments (issue 37, rankcore.control.rollouts): whole gangs, lowest
first; each member's successor takes its global rank and waits until its gang's last retiring member
has stopped, then the whole new gang starts together. Every invariant is checked after every step."""

from __future__ import annotations

import math

import attrs
import pytest

import rankcore as rc
from rankcore.control.rollouts import gang_budget
from rankcore.invariants import check_recovery_roundtrip, check_state, reports_from
from tests.helpers import Driver, of

V1 = dict(name="m", num_replicas=4, gang_size=2, version="v1")


def gangs(**options: object) -> Driver:
    """Deployment ``m``: two gangs of two on v1, every command answered; an unmanaged core (the
    executor chooses nodes: each successor lands where its rank ran before, so node ranks can be kept)."""
    d = Driver()
    where: dict[int, str] = {}

    def node_for(c: rc.StartReplica) -> str:
        return where.setdefault(c.global_rank, d.nodes[c.global_rank % 2])

    d.node_for = node_for
    d.run(rc.DeploymentApplied(**{**V1, **options}))  # type: ignore[arg-type]
    return d


def ranks(d: Driver) -> dict[int, tuple[int, int, int]]:
    dep = d.dep("m")
    return {dep.ranks.global_rank(r): dep.ranks.rank_of(r).as_tuple() for r in dep.replicas}  # type: ignore[union-attr]


def held_stops(d: Driver, event: object) -> list[rc.StopReplica]:
    """Step ``event`` and answer what follows but the StopReplicas, which are returned."""
    d.held = []
    d.run(event, hold=lambda c: isinstance(c, rc.StopReplica))
    return list(d.held)  # type: ignore[arg-type]


def stopped(d: Driver, stop: rc.StopReplica) -> list[object]:
    """``stop``'s replica has stopped: the step's commands and all that follows (stops held again)."""
    d.held = [c for c in d.held if c is not stop]
    return d.run(rc.ReplicaStopped(replica_id=stop.replica_id), hold=lambda c: isinstance(c, rc.StopReplica))


def gang_of(d: Driver, rid: str) -> int:
    return d.dep("m").ranks.global_rank(rid) // 2


def held_ids(d: Driver) -> set[str]:
    cl = d.state.cluster
    return {rid for rid in cl.delayed if cl.deadlines.get(rid) == math.inf}


def test_two_gangs_of_two_roll_one_gang_at_a_time_on_their_ranks_each_started_as_one_batch() -> None:
    d = gangs()
    before, old = ranks(d), set(d.dep("m").replicas)
    first = held_stops(d, rc.DeploymentApplied(**{**V1, "version": "v2", "max_unavailable": 1}))  # type: ignore[arg-type]
    # max_unavailable 1 < gang size 2: still one whole gang, the lowest, and only it
    assert sorted(gang_of(d, s.replica_id) for s in first) == [0, 0]
    dep = d.dep("m")
    assert dep.retiring == 2 and dep.count(rc.Phase.RUNNING) == 2
    batches = []
    for _ in range(2):  # gang 0, then gang 1
        a, b = d.held
        assert {gang_of(d, a.replica_id), gang_of(d, b.replica_id)} in ({0}, {1})  # type: ignore[attr-defined]
        cmds = stopped(d, a)  # type: ignore[arg-type]
        assert of(rc.StartReplica, cmds) == [] and len(held_ids(d)) == 1  # its successor waits for the gang
        assert not of(rc.StopReplica, cmds)  # the other gang still serves: not retired meanwhile
        step = d.step(rc.ReplicaStopped(replica_id=b.replica_id))  # type: ignore[attr-defined]
        d.held = []
        starts = of(rc.StartReplica, list(step.commands))
        assert len(starts) == 2 and not of(rc.GangChanged, list(step.commands))  # the whole new gang at once
        assert sorted(s.replaces for s in starts) == sorted([a.replica_id, b.replica_id])  # type: ignore[attr-defined]
        members = tuple(s.replica_id for s in starts)
        assert [s.gang.members for s in starts] == [members, members]  # type: ignore[union-attr]
        assert all(s.revision == d.dep("m").revision for s in starts)
        batches.append(starts)
        for c in step.commands:  # the new gang is placed and becomes ready: the next gang is retired
            for ev in d.answer(c):
                d.run(ev, hold=lambda c: isinstance(c, rc.StopReplica))
    assert [sorted(s.global_rank for s in b) for b in batches] == [[0, 1], [2, 3]]
    dep = d.dep("m")
    assert ranks(d) == before and not old & set(dep.replicas)  # every replica new, every rank kept
    assert dep.healthy and not dep.rolling and {r.revision for r in dep.replicas.values()} == {dep.revision}


def test_a_budget_of_three_retires_two_gangs_of_two_at_once_rounded_up_to_whole_gangs() -> None:
    d = gangs(num_replicas=6)
    first = held_stops(d, rc.DeploymentApplied(**{**V1, "num_replicas": 6, "version": "v2", "max_unavailable": 3}))  # type: ignore[arg-type]
    assert sorted(gang_of(d, s.replica_id) for s in first) == [0, 0, 1, 1]
    assert gang_budget(d.dep("m")) == 4


class Placed(Driver):
    """The core places replicas (nodes joined): a StartReplica waits for its PlaceReplica, answered on that node."""

    def answer(self, cmd: object) -> list[object]:
        if isinstance(cmd, rc.StartReplica):
            return []
        if isinstance(cmd, rc.PlaceReplica):
            return [rc.ReplicaPlaced(replica_id=cmd.replica_id, node_id=cmd.node_id)]
        return super().answer(cmd)


def test_the_core_placing_gets_the_whole_new_gang_placed_in_one_step_by_its_gang_placement() -> None:
    d = Placed()
    for node in ("n0", "n1"):
        d.run(rc.NodeJoined(node_id=node, resources={"GPU": 2}))
    spec = {**V1, "resources": {"GPU": 1}, "gang_placement": "pack"}
    d.run(rc.DeploymentApplied(**spec))  # type: ignore[arg-type]
    before = ranks(d)
    a, b = held_stops(d, rc.DeploymentApplied(**{**spec, "version": "v2"}))  # type: ignore[arg-type]
    assert of(rc.PlaceReplica, stopped(d, a)) == []
    step = d.step(rc.ReplicaStopped(replica_id=b.replica_id))
    places = of(rc.PlaceReplica, list(step.commands))
    assert len(places) == 2 and len({p.node_id for p in places}) == 1  # pack: both on one node, together
    d.held = []
    for c in step.commands:
        for ev in d.answer(c):
            d.run(ev)
    dep = d.dep("m")
    assert dep.healthy and not dep.rolling and ranks(d) == before


@pytest.mark.parametrize("failure", ["restart_gang", "restart_replica"])
def test_a_crash_in_a_gang_not_yet_retired_restarts_that_gang_whole_on_the_new_revision(failure: str) -> None:
    d = gangs(gang_failure=failure)
    held_stops(d, rc.DeploymentApplied(**{**V1, "version": "v2", "gang_failure": failure}))  # type: ignore[arg-type]
    dep = d.dep("m")
    victim = next(r for r in dep.replicas if gang_of(d, r) == 1 and r == dep.ranks.holder_of(2))
    mate = dep.ranks.holder_of(3)
    step = d.step(rc.ReplicaCrashed(replica_id=victim, cause="exited"))
    stops = of(rc.StopReplica, list(step.commands))
    starts = of(rc.StartReplica, list(step.commands))
    assert [s.replica_id for s in stops] == [mate]  # its gang-mate stopped too, under either policy
    assert sorted(s.global_rank for s in starts) == [2, 3]
    assert {s.revision for s in starts} == {d.dep("m").revision}  # (not a half-old gang)
    assert starts[0].gang.members == starts[1].gang.members  # type: ignore[union-attr]
    check_state(d.state)


def test_a_crash_of_a_retiring_member_counts_as_its_stop_and_a_crash_of_a_held_one_keeps_it_held() -> None:
    d = gangs()
    a, b = held_stops(d, rc.DeploymentApplied(**{**V1, "version": "v2"}))  # type: ignore[arg-type]
    step = d.step(rc.ReplicaCrashed(replica_id=a.replica_id, cause="exited"))
    assert of(rc.StartReplica, list(step.commands)) == []
    (waiting,) = held_ids(d)
    rank = d.dep("m").ranks.global_rank(waiting)
    step = d.step(rc.ReplicaCrashed(replica_id=waiting, cause="error"))  # (never started: no StopReplica)
    assert of(rc.StopReplica, list(step.commands)) == [] and of(rc.StartReplica, list(step.commands)) == []
    (again,) = held_ids(d)
    assert again != waiting and d.dep("m").ranks.global_rank(again) == rank
    step = d.step(rc.ReplicaCrashed(replica_id=b.replica_id, cause="exited"))
    assert sorted(s.global_rank for s in of(rc.StartReplica, list(step.commands))) == [0, 1]


def test_a_replica_placed_that_was_never_started_is_refused_and_the_state_kept() -> None:
    """A held gang successor has had no StartReplica: a ReplicaPlaced naming it is an executor's
    error, refused naming the replica and why (the caller keeps its state); the same for a
    replacement waiting out a restart backoff."""
    d = gangs()
    a, _ = held_stops(d, rc.DeploymentApplied(**{**V1, "version": "v2"}))  # type: ignore[arg-type]
    d.step(rc.ReplicaCrashed(replica_id=a.replica_id, cause="exited"))  # its successor held for b
    (waiting,) = held_ids(d)
    before = d.state
    with pytest.raises(rc.InvalidEvent, match=rf"{waiting!r} was never started \(held until its gang"):
        rc.step(before, rc.ReplicaPlaced(replica_id=waiting, node_id=d.nodes[0]))
    assert waiting in before.cluster.delayed and before.replica(waiting).phase is rc.Phase.PENDING

    # a replacement waiting out a restart backoff (two failed starts in a row) has no process either
    s = rc.step(rc.step(rc.State(), rc.Tick(now=1.0)).state, rc.DeploymentApplied(name="x", num_replicas=1)).state
    for _ in range(2):
        (rid,) = s.deployment("x").replicas
        s = rc.step(s, rc.ReplicaPlaced(replica_id=rid, node_id="n1")).state
        s = rc.step(s, rc.ReplicaCrashed(replica_id=rid, cause="error")).state
    (backoff,) = s.cluster.delayed
    with pytest.raises(rc.InvalidEvent, match=rf"{backoff!r} was never started \(waiting out a restart backoff"):
        rc.step(s, rc.ReplicaPlaced(replica_id=backoff, node_id="n1"))


def test_a_gang_placement_change_alone_rolls_every_gang() -> None:
    """``gang_placement`` is where a gang goes, a heavyweight option like ``placement``: changing it
    alone replaces every gang (on its ranks); applying it again changes nothing."""
    d = gangs()
    before = ranks(d)
    spread = rc.DeploymentApplied(**{**V1, "gang_placement": "spread"})  # type: ignore[arg-type]
    stops = held_stops(d, spread)
    assert len(stops) == 2 and d.dep("m").rolling and d.dep("m").revision.endswith(";g=spread")
    for stop in stops:
        stopped(d, stop)
    stops = list(d.held)
    for stop in stops:
        stopped(d, stop)
    dep = d.dep("m")
    assert not dep.rolling and dep.healthy and {r.revision for r in dep.replicas.values()} == {dep.revision}
    assert ranks(d) == before
    assert held_stops(d, spread) == [] and not d.dep("m").rolling


def test_a_rollback_mid_gang_starts_the_held_gang_on_the_old_revision_and_leaves_old_gangs_alone() -> None:
    d = gangs()
    v1 = d.dep("m").revision
    a, b = held_stops(d, rc.DeploymentApplied(**{**V1, "version": "v2"}))  # type: ignore[arg-type]
    stopped(d, a)
    assert len(held_ids(d)) == 1
    cmds = d.run(rc.DeploymentApplied(**V1), hold=lambda c: isinstance(c, rc.StopReplica))  # type: ignore[arg-type]
    assert of(rc.StopReplica, cmds) == [] and d.dep("m").revision == v1  # gang 1 is on v1: current again
    step = d.step(rc.ReplicaStopped(replica_id=b.replica_id))
    starts = of(rc.StartReplica, list(step.commands))
    assert sorted(s.global_rank for s in starts) == [0, 1] and {s.revision for s in starts} == {v1}
    d.held = []
    for c in step.commands:
        for ev in d.answer(c):
            d.run(ev)
    dep = d.dep("m")
    assert dep.healthy and not dep.rolling and {r.revision for r in dep.replicas.values()} == {v1}


def test_a_controller_restart_mid_gang_resumes_it_from_the_reports() -> None:
    d = gangs()
    a, b = held_stops(d, rc.DeploymentApplied(**{**V1, "version": "v2"}))  # type: ignore[arg-type]
    stopped(d, a)
    (waiting,) = held_ids(d)
    check_recovery_roundtrip(d.state)  # reported as it is (the held one too): the same ranks, no command
    # an executor reports what runs: the held successor never started, so it is not reported
    event = reports_from(d.state)
    event = attrs.evolve(event, reports=tuple(r for r in event.reports if r.replica_id != waiting))
    recovered = rc.step(rc.State(), event)
    check_state(recovered.state)
    assert of(rc.StartReplica, list(recovered.commands)) == []  # the gap waits with its gang: held again
    d.state = recovered.state
    assert len(held_ids(d)) == 1 and d.dep("m").retiring == 1
    step = d.step(rc.ReplicaStopped(replica_id=b.replica_id))
    starts = of(rc.StartReplica, list(step.commands))
    assert sorted(s.global_rank for s in starts) == [0, 1]
    d.held = []
    for c in step.commands:
        for ev in d.answer(c):
            d.run(ev)
    dep = d.dep("m")
    assert dep.healthy and not dep.rolling and {r.revision for r in dep.replicas.values()} == {dep.revision}



def test_the_simulator_rolls_the_gang_example_whole_gangs_with_no_rank_moved() -> None:
    """examples/scenarios/rollout-gangs.yaml: 2 gangs of 2 rolled at max_unavailable 1."""
    import io
    import json

    from executors.history import rank_history
    from executors.sim import Simulation, load_scenario

    buf = io.StringIO()
    result = Simulation(load_scenario("examples/scenarios/rollout-gangs.yaml"), trace=buf).run()
    assert result.passed
    m = result.metrics["deployments"]["engine"] if "deployments" in result.metrics else result.metrics["engine"]
    assert m["rollout_replacements"] == 4 and m["rollouts_done"] == 1 and m["reassignments"]["any"] == 0
    assert m["crashes"] == 0 and m["crash_to_ready_p50"] is None  # (held successors are no crash replacements)
    records = [json.loads(line) for line in buf.getvalue().splitlines()]
    history = rank_history(records)
    assert sorted(history.values()) == [[0], [1], [2], [3]]  # each lineage (a rank's replicas) kept its rank
    starts = [r["fields"] for r in records if r.get("kind") == "command" and r["type"] == "StartReplica"
              and r["fields"].get("replaces")]
    assert [sorted(s["global_rank"] for s in starts[i:i + 2]) for i in (0, 2)] == [[0, 1], [2, 3]]
    assert all(s["gang"]["members"] == starts[i // 2 * 2]["gang"]["members"] for i, s in enumerate(starts))


def test_a_downscale_while_the_top_gang_retires_stops_that_gang_whole_and_keeps_the_ones_below() -> None:
    """Three gangs of two roll one gang at a time; once the top gang retires (its stops held), a scale
    to 4 must take that gang whole and nothing below it: its retiring members get no successors, gangs
    0 and 1 run on. (It counted the retiring members as active but picked from the others, so it
    reached down and stopped gang 1's members, and gang 2's members got successors above the target.)"""
    d = gangs(num_replicas=6)
    d.held = []
    d.run(rc.DeploymentApplied(**{**V1, "num_replicas": 6, "version": "v2", "max_unavailable": 1}),  # type: ignore[arg-type]
          hold=lambda c: isinstance(c, rc.StopReplica) and gang_of(d, c.replica_id) == 2)
    dep = d.dep("m")
    retiring = {s.replica_id for s in d.held}  # type: ignore[attr-defined]
    assert len(retiring) == 2 and {gang_of(d, r) for r in retiring} == {2}
    below = {r for r in dep.replicas if r not in retiring}
    step = d.step(rc.ScaleRequested(deployment="m", num_replicas=4))
    assert not [c for c in step.commands if isinstance(c, rc.StopReplica) and c.replica_id in below], step.commands
    out = []
    for stop in list(d.held):
        d.held.remove(stop)
        out += d.run(rc.ReplicaStopped(replica_id=stop.replica_id))  # type: ignore[attr-defined]
    assert not of(rc.StartReplica, out)  # no successor above the target
    dep = d.dep("m")
    assert sorted(ranks(d)) == [0, 1, 2, 3] and set(dep.replicas) == below and dep.healthy
    assert {r.revision for r in dep.replicas.values()} == {dep.revision}

"""Surge (issue 37, ``max_surge``; rankcore.control.rollouts.surge): a rollout starts each successor
on its predecessor's three ranks and node as the predecessor starts draining, while the replicas
alive stay within the surge bound above the target and the node has room. Every invariant is
checked after every step (``check_step(full=True)``)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

import rankcore as rc
from rankcore.invariants import check_recovery_roundtrip, reports_from
from tests.helpers import Driver, placed_answers

GPU = (("GPU", 1.0),)


class Cluster(Driver):
    """A managed core (nodes joined: the core places) whose commands are answered at once, except
    the StopReplicas ``hold`` keeps back (in ``held``: a drain still running); every invariant is
    checked after every step (``Driver.step``)."""

    def __init__(self, nodes: dict[str, float]) -> None:
        super().__init__()
        self.hold: Callable[[object], bool] = lambda c: False
        self.alive_max = 0  # the most replicas alive at once (draining ones included)
        self.serving_min: int | None = None  # the fewest serving once healthy
        for name, gpus in nodes.items():
            self.run(rc.NodeJoined(node_id=name, resources={"GPU": gpus, "CPU": 64}))

    def step(self, event: object) -> rc.Step:
        result = super().step(event)
        dep = self.state.deployments.get("m")
        if dep is not None:
            self.alive_max = max(self.alive_max, len(dep.replicas))
            if dep.healthy or self.serving_min is not None:
                serving = sum(1 for r in dep.replicas.values() if rc.query.is_serving(dep, r))
                self.serving_min = serving if self.serving_min is None else min(self.serving_min, serving)
        return result

    def run(self, event: object, hold: Callable[[object], bool] | None = None) -> list[object]:
        out: list[object] = []
        queue = [event]
        while queue:
            for cmd in self.step(queue.pop(0)).commands:
                out.append(cmd)
                if isinstance(cmd, rc.StopReplica) and self.hold(cmd):
                    self.held.append(cmd)
                else:
                    queue.extend(placed_answers(cmd))
        return out

    def drained(self, stop: rc.StopReplica) -> list[object]:
        self.held.remove(stop)
        return self.run(rc.ReplicaStopped(replica_id=stop.replica_id))

    def dep(self, name: str = "m") -> rc.Deployment:
        return self.state.deployments[name]

    def ranks(self) -> dict[int, tuple[tuple[int, int, int], str | None]]:
        """global rank -> (three ranks, node) of every replica not stopping."""
        d = self.dep()
        return {d.ranks.global_rank(r): (d.ranks.rank_of(r).as_tuple(), rep.node_id)  # type: ignore[union-attr]
                for r, rep in d.replicas.items() if rep.phase is not rc.Phase.STOPPING}


def deployed(n: int, nodes: dict[str, float], **options: object) -> Cluster:
    c = Cluster(nodes)
    c.run(rc.DeploymentApplied(name="m", num_replicas=n, resources=GPU, version="v1", **options))
    assert c.dep().healthy
    c.alive_max, c.serving_min = n, n
    return c


def test_with_room_each_successor_starts_beside_its_draining_predecessor_on_its_ranks() -> None:
    """4 replicas on two 4-GPU nodes (two free GPUs each), ``max_surge=2``, ``max_unavailable=2``:
    the apply's step stops two replicas and starts their successors at once, each on its
    predecessor's node and three ranks, while the two drain; 6 alive at most, never fewer than 2
    serving; at the end every replica is new, on its old ranks."""
    c = deployed(4, {"n0": 4, "n1": 4}, max_surge=2, max_unavailable=2)
    before = c.ranks()
    c.hold = lambda cmd: True  # every drain runs until the test ends it
    step = c.step(rc.DeploymentApplied(name="m", num_replicas=4, resources=GPU, version="v2", max_surge=2,
                                       max_unavailable=2))
    starts = [x for x in step.commands if isinstance(x, rc.StartReplica)]
    stops = [x for x in step.commands if isinstance(x, rc.StopReplica)]
    places = [x for x in step.commands if isinstance(x, rc.PlaceReplica)]
    assert len(stops) == 2 and len(starts) == 2 and len(places) == 2
    assert {s.replaces for s in starts} == {s.replica_id for s in stops}
    dep = c.dep()
    old = {r: dep.replicas[r] for r in (s.replica_id for s in stops)}
    for s, p in zip(starts, places):  # on the ranks and node of the one still draining
        assert p.replica_id == s.replica_id and (p.rank.as_tuple(), p.node_id) == before[s.global_rank]
        assert old[s.replaces].phase is rc.Phase.STOPPING and old[s.replaces].node_id == p.node_id
    assert len(dep.replicas) == 6 and dep.active == 4
    for cmd in step.commands:  # answered: the successors become ready while their predecessors drain
        if isinstance(cmd, rc.StopReplica):
            c.held.append(cmd)
        elif isinstance(cmd, rc.PlaceReplica):
            c.run(rc.ReplicaPlaced(replica_id=cmd.replica_id, node_id=cmd.node_id))
    dep = c.dep()
    assert sum(rc.query.is_serving(dep, dep.replicas[s.replica_id]) for s in starts) == 2
    while c.held:
        c.drained(c.held[0])
    dep = c.dep()
    assert dep.healthy and not dep.rolling and {r.revision for r in dep.replicas.values()} == {dep.revision}
    assert c.ranks() == before
    assert c.alive_max == 6 and c.serving_min == 2
    assert dep.ranks.is_contiguous()


def test_without_room_on_its_node_a_successor_waits_for_the_drain() -> None:
    """Full nodes: no surge whatever ``max_surge`` says; each successor starts once its
    predecessor has stopped (the plain rollout), never above the target."""
    c = deployed(4, {"n0": 2, "n1": 2}, max_surge=4)
    before = c.ranks()
    c.hold = lambda cmd: True
    first = c.run(rc.DeploymentApplied(name="m", num_replicas=4, resources=GPU, version="v2", max_surge=4))
    assert [type(x) for x in first] == [rc.StopReplica]
    while c.held:
        c.drained(c.held[0])
    assert c.ranks() == before and c.alive_max == 4 and c.dep().healthy


def test_max_surge_bounds_the_replicas_above_the_target() -> None:
    """Room for all, ``max_surge=1``: one successor at a time starts beside its draining
    predecessor; the next surge waits until that drain is over (5 alive at most)."""
    c = deployed(4, {"n0": 8}, max_surge=1, max_unavailable=3)
    c.hold = lambda cmd: True
    first = c.step(rc.DeploymentApplied(name="m", num_replicas=4, resources=GPU, version="v2", max_surge=1,
                                        max_unavailable=3)).commands
    assert sum(isinstance(x, rc.StartReplica) for x in first) == 1  # one surged ...
    assert sum(isinstance(x, rc.StopReplica) for x in first) == 3  # ... two more retired the plain way
    c.held.extend(x for x in first if isinstance(x, rc.StopReplica))
    for x in first:
        if isinstance(x, rc.PlaceReplica):
            c.run(rc.ReplicaPlaced(replica_id=x.replica_id, node_id=x.node_id))
    while c.held:
        c.drained(c.held[0])
    assert c.alive_max == 5 and c.dep().healthy and not c.dep().rolling


def test_a_fraction_rounds_up_as_ray_serves_percent_does() -> None:
    """``max_surge`` 0.25 of 10 allows 3 above the target, of 3 allows 1 (Ray Serve rounds its
    ``max_surge_percent`` up to whole replicas); 0.2 of 5 is exactly 1; 1.0 is the whole target."""
    from rankcore.control.rollouts import surge_budget

    def budget(n: int, m: float) -> int:
        return surge_budget(rc.Deployment.applied(rc.DeploymentApplied(name="m", num_replicas=n, max_surge=m)))

    assert (budget(10, 0.25), budget(3, 0.25), budget(5, 0.2), budget(4, 1.0), budget(0, 0.5)) == (3, 1, 1, 4, 0)
    for bad in (1.5, -1, 0.0, True, "2"):
        with pytest.raises(rc.InvalidConfig, match="max_surge must be"):
            rc.DeploymentApplied(name="m", num_replicas=3, max_surge=bad)


@pytest.mark.parametrize("who", ["successor", "predecessor"])
def test_a_crash_during_the_overlap_is_a_plain_crash_of_that_replica(who: str) -> None:
    """The successor crashing while its predecessor drains is replaced on its ranks (it holds
    them); the draining predecessor crashing just leaves (its successor runs on)."""
    c = deployed(2, {"n0": 4}, max_surge=1, max_unavailable=1)
    before = c.ranks()
    c.hold = lambda cmd: True
    first = c.run(rc.DeploymentApplied(name="m", num_replicas=2, resources=GPU, version="v2", max_surge=1,
                                       max_unavailable=1))
    (start,) = [x for x in first if isinstance(x, rc.StartReplica)]
    victim = start.replica_id if who == "successor" else start.replaces
    c.hold = lambda cmd: False
    c.run(rc.ReplicaCrashed(replica_id=victim, cause="error"))
    if who == "predecessor":
        c.held = [s for s in c.held if s.replica_id != victim]
    while c.held:
        c.drained(c.held[0])
    dep = c.dep()
    assert dep.healthy and not dep.rolling and c.ranks() == before
    assert {r.revision for r in dep.replicas.values()} == {dep.revision}


def test_a_controller_restart_during_the_overlap_resumes_with_no_rank_moved() -> None:
    """A recovery from the replicas' own reports mid-surge (the draining predecessor and its
    successor both say the same rank): the successor keeps the rank; the predecessor goes on
    draining on a spare one; the rollout finishes with every rank where it was."""
    c = deployed(4, {"n0": 4, "n1": 4}, max_surge=2, max_unavailable=2)
    before = c.ranks()
    c.hold = lambda cmd: True
    c.run(rc.DeploymentApplied(name="m", num_replicas=4, resources=GPU, version="v2", max_surge=2, max_unavailable=2))
    check_recovery_roundtrip(c.state)  # (from the core's own table: the spare ranks)
    # what the replicas themselves say: a surged predecessor still says the rank it was given
    successor_of = {x.replaces: x for x in c.commands if isinstance(x, rc.StartReplica) and x.replaces}
    table = c.dep().ranks
    recovered = reports_from(c.state)
    said = []
    for r in recovered.reports:
        s = successor_of.get(r.replica_id)
        if s is not None and s.replica_id in table:
            r = attrs.evolve(r, rank=rc.ReportedRank.parse(table.rank_of(s.replica_id)))
        said.append(r)
    assert len(said) == 6
    fresh = Cluster({})
    fresh.hold = lambda cmd: True
    nodes = tuple(rc.NodeJoined(node_id=n, resources={"GPU": 4, "CPU": 64}) for n in ("n0", "n1"))
    fresh.run(attrs.evolve(recovered, reports=tuple(said), nodes=nodes))
    dep = fresh.dep()
    # two surged predecessors (their successors ready, on their ranks) and two retired the plain way
    # once those were ready (no successor yet): the recovery keeps the ranks with the serving ones and
    # has the two short of the target succeeded on theirs when they have stopped
    stopping = [r for r, rep in dep.replicas.items() if rep.phase is rc.Phase.STOPPING]
    assert len(stopping) == 4 and dep.retiring == 2
    assert sum(rc.query.is_serving(dep, rep) for rep in dep.replicas.values()) == 2
    for rid in stopping:  # (their StopReplica was sent before the restart: the drain goes on)
        fresh.run(rc.ReplicaStopped(replica_id=rid))
    for stop in list(fresh.held):
        fresh.drained(stop)
    assert fresh.dep().healthy and fresh.ranks() == before

"""The fast paths (rankcore.fastpaths) are an optimisation only: wherever one
takes an event, it must give exactly the general path's step."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import event as hyp_event
from hypothesis import settings

import rankcore as rc
from executors.sim import Simulation, load_scenario
from rankcore import core, fastpaths
from rankcore.testing import PROFILES, CoreSubject, make_machine

ROOT = Path(__file__).resolve().parents[2]
TAKEN: Counter[str] = Counter()


class BothPaths(CoreSubject):
    """Steps each event through ``core.step``; where a fast path takes it,
    also through ``core.general_step``, and requires the same ``Step``."""

    def __init__(self, in_hypothesis: bool = True) -> None:
        self.in_hypothesis = in_hypothesis

    def step(self, state: rc.State, event: object) -> rc.Step:
        fast = fastpaths.FAST_PATHS.get(type(event))
        if fast is not None:
            done = core.fast_step(state, event)
            if done is not None:
                kind = type(event).__name__
                TAKEN[kind] += 1
                if self.in_hypothesis:
                    hyp_event(f"fast path took {kind}")
                general = core.general_step(state, event)
                assert done.commands == general.commands, f"{event!r}: commands differ"
                assert done.state.cluster == general.state.cluster, f"{event!r}: cluster differs"
                assert done.state == general.state, f"{event!r}: state differs"
                assert done == general, f"{event!r}: step differs"
                return done
        return core.step(state, event)


TestFastPathsUnmanaged = make_machine(BothPaths, managed=False).TestCase
TestFastPathsManaged = make_machine(BothPaths, managed=True, groups=False).TestCase
TestFastPathsGroups = make_machine(BothPaths, managed=True, groups=True).TestCase


def test_the_machines_took_both_fast_paths() -> None:
    """(runs after the machines above in this module) the comparison above
    was not vacuous: every fast path took events."""
    if not TAKEN:
        pytest.skip("run alone: the machines above did not run in this session")
    if settings().max_examples < PROFILES["rankcore-ci"]["max_examples"]:
        # (make mutate's profile: 30 examples a machine may not reach every path, by chance; the
        # question here is the suite's, not a mutant's)
        pytest.skip("a smaller hypothesis profile than ci's: the machines may not reach every fast path")
    assert set(TAKEN) == {t.__name__ for t in fastpaths.FAST_PATHS}, TAKEN


def _managed(timeout: float | None) -> tuple[rc.State, rc.PlaceReplica]:
    s = rc.State()
    s = rc.step(s, rc.NodeJoined(node_id="n1", resources={"GPU": 2})).state
    s = rc.step(s, rc.Tick(now=1.0)).state
    res = rc.step(s, rc.DeploymentApplied(name="llm", num_replicas=2, resources={"GPU": 1},
                                          start_timeout_s=timeout))
    place = next(c for c in res.commands if isinstance(c, rc.PlaceReplica))
    return res.state, place


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_placed_then_ready_take_the_fast_paths_and_agree(timeout: float | None) -> None:
    s, place = _managed(timeout)
    placed = rc.ReplicaPlaced(replica_id=place.replica_id, node_id=place.node_id, now=2.0)
    fast = core.fast_step(s, placed)
    assert fast is not None
    assert fast == core.general_step(s, placed)
    kinds = [type(c).__name__ for c in fast.commands]
    assert kinds == (["InitializeReplica", "ScheduleTick"] if timeout else ["InitializeReplica"])
    assert fast.state.cluster.now == 2.0
    assert (place.replica_id in fast.state.cluster.deadlines) == (timeout is not None)
    ready = rc.ReplicaReady(replica_id=place.replica_id)
    fast2 = core.fast_step(fast.state, ready)
    assert fast2 is not None
    assert fast2 == core.general_step(fast.state, ready)
    assert fast2.state.replica(place.replica_id).phase is rc.Phase.RUNNING
    assert place.replica_id not in fast2.state.cluster.deadlines


def test_a_crash_takes_the_fast_path_and_agrees() -> None:
    s, place = _managed(30.0)
    rid = place.replica_id
    s = rc.step(s, rc.ReplicaPlaced(replica_id=rid, node_id=place.node_id, now=2.0)).state
    s = rc.step(s, rc.ReplicaReady(replica_id=rid)).state
    crash = rc.ReplicaCrashed(replica_id=rid, now=3.0)
    fast = core.fast_step(s, crash)
    assert fast is not None
    assert fast == core.general_step(s, crash)
    start, place2, tick = fast.commands  # (and the replacement's placement deadline)
    assert tick == rc.ScheduleTick(at=3.0 + rc.options.PLACEMENT_TIMEOUT_S)
    assert fast.state.cluster.deadlines[start.replica_id] == tick.at
    assert isinstance(start, rc.StartReplica) and start.replaces == rid and start.global_rank == place.rank.rank
    assert isinstance(place2, rc.PlaceReplica) and place2.node_id == place.node_id and place2.rank == place.rank
    assert fast.state.cluster.held[start.replica_id] == s.cluster.held[rid]
    assert rid not in fast.state.index and fast.state.next_replica == s.next_replica + 1
    # a suspect crash, a gang or a waiting queue: the general path
    assert core.fast_step(s, rc.ReplicaCrashed(replica_id=rid, cause="exited", now=3.0)) is None
    # a failed start (its restart backoff): the general path
    starting = rc.step(s, crash).state
    new = fast.commands[0].replica_id
    starting = rc.step(starting, rc.ReplicaPlaced(replica_id=new, node_id=place.node_id, now=4.0)).state
    assert core.fast_step(starting, rc.ReplicaCrashed(replica_id=new, cause="error", now=5.0)) is None


def test_the_fast_paths_decline_what_they_do_not_cover() -> None:
    s, place = _managed(30.0)
    # the answer's clock passes a start deadline: a Tick's work first
    placed = rc.ReplicaPlaced(replica_id=place.replica_id, node_id=place.node_id, now=2.0)
    s2 = rc.step(s, placed).state
    other = next(r for r in s2.replicas() if r.phase is rc.Phase.PENDING)
    late = rc.ReplicaPlaced(replica_id=other.replica_id, node_id=other.node_id, now=100.0)
    assert core.fast_step(s2, late) is None
    # placed somewhere else than reserved; an unknown replica; a stale answer
    assert core.fast_step(s, rc.ReplicaPlaced(replica_id=place.replica_id, node_id="n9")) is None
    assert core.fast_step(s, rc.ReplicaPlaced(replica_id="llm#99", node_id="n1")) is None
    assert core.fast_step(s, rc.ReplicaReady(replica_id=place.replica_id)) is None  # still pending
    with pytest.raises(rc.InvalidEvent):
        rc.step(s, rc.ReplicaReady(replica_id=place.replica_id))  # the general path says why


def test_a_stop_of_an_asleep_replacement_of_an_evicted_replica_takes_the_general_path() -> None:
    """Found by the thorough profile: the replacement of an evicted replica keeps its no-evict
    mark while it runs and sleeps (not HOT then); its ReplicaStopped on the fast path kept the
    mark, the general path drops it (``books.release_devices``)."""
    g = 10**9
    s = rc.State()
    for e in (rc.NodeJoined(node_id="n0", resources={"GPU": 1, "CPU": 8}, devices=(80 * g,), cpu_cache_bytes=200 * g),
              rc.DeploymentApplied(name="a", num_replicas=1, resources={"GPU": 1}, model_bytes=50 * g,
                                   min_deployment_time_s=0.0),
              rc.ReplicaPlaced(replica_id="a#0", node_id="n0"), rc.ReplicaReady(replica_id="a#0"),
              rc.DeploymentApplied(name="b", num_replicas=1, resources={"GPU": 1}, model_bytes=60 * g,
                                   min_deployment_time_s=0.0, dedicated=True),  # evicts a#0; a#2 waits
              rc.ReplicaStopped(replica_id="a#0"), rc.DeploymentDeleted(deployment="b"),
              rc.ReplicaStopped(replica_id="b#1"),  # room: a#2 placed on the WARM copy
              rc.ReplicaPlaced(replica_id="a#2", node_id="n0"), rc.ReplicaReady(replica_id="a#2"),
              rc.ReplicaReconfigured(replica_id="a#2", version=0), rc.SleepRequested(deployment="a"),
              rc.TierMoved(replica_id="a#2", tier="warm"), rc.ScaleRequested(deployment="a", num_replicas=0)):
        s = rc.step(s, e).state
    assert "a#2" in s.cluster.no_evict and "a#2" not in s.cluster.hot
    stop = rc.ReplicaStopped(replica_id="a#2")
    assert core.fast_step(s, stop) is None
    assert "a#2" not in rc.step(s, stop).state.cluster.no_evict


@pytest.mark.parametrize("name", ["node-loss-3-nodes.yaml", "crash-storm.yaml", "gangs.yaml",
                                  "controller-crash.yaml", "capacity-plan-64.yaml"])
def test_fast_paths_agree_at_every_step_of_a_simulation(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step of a simulated run both ways (a week of the capacity plan
    crosses each fast path hundreds of times), then the run without fast paths
    gives every figure and the final state again."""
    sc = load_scenario(ROOT / "examples" / "scenarios" / name)
    both = BothPaths(in_hypothesis=False)
    taken = dict(TAKEN)
    monkeypatch.setattr(rc, "step", both.step)
    fast = Simulation(sc, seed=3).run()
    monkeypatch.setattr(rc, "step", core.step)
    if name == "capacity-plan-64.yaml":
        took = {k: TAKEN[k] - taken.get(k, 0) for k in TAKEN}
        assert all(took.get(k, 0) > 500 for k in ("ReplicaPlaced", "ReplicaReady", "ReplicaCrashed")), took
        assert took.get("ReplicaStopped", 0) > 100, took  # the nightly downscales
    monkeypatch.setattr(core, "FAST_PATHS", {})
    general = Simulation(sc, seed=3).run()
    assert fast.metrics == general.metrics
    assert fast.state == general.state
TestFastPathsTiers = make_machine(BothPaths, managed=True, groups=False, tiers=True).TestCase

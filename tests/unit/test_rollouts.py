"""Rolling updates (rankcore.control.rollouts): a heavyweight change replaces every replica, each by
one on its ranks, at most ``max_unavailable`` short of serving at once."""

from __future__ import annotations

import pytest

import rankcore as rc
from executors.sim import Simulation, parse_scenario
from rankcore.invariants import check_state, reports_from
from tests.helpers import Driver, of


def fleet(n: int, **options: object) -> Driver:
    """Deployment ``m`` of ``n`` replicas, every command answered (tests.helpers.Driver)."""
    d = Driver()
    d.run(rc.DeploymentApplied(name="m", num_replicas=n, **options))
    return d


def stops_held(d: Driver, event: object) -> list:
    """Step ``event`` and answer what follows but the StopReplicas, which are returned."""
    d.held = []
    d.run(event, hold=lambda c: isinstance(c, rc.StopReplica))
    return d.held


def ranks(d: Driver) -> dict[int, tuple[int, int, int]]:
    dep = d.dep("m")
    return {dep.ranks.global_rank(r): dep.ranks.rank_of(r).as_tuple() for r in dep.replicas}  # type: ignore[union-attr]


def test_a_new_version_replaces_every_replica_on_its_ranks_one_at_a_time_by_default() -> None:
    f = fleet(4)
    before, ids = ranks(f), set(f.dep("m").replicas)
    commands = f.run(rc.DeploymentApplied(name="m", num_replicas=4, version="v2"))
    d = f.dep("m")
    assert ranks(f) == before and not ids & set(d.replicas)  # every replica new, every rank kept
    assert {r.revision for r in d.replicas.values()} == {d.revision} and "v=v2" in d.revision
    assert d.healthy and not d.rolling and d.retiring == 0
    # max(1, int(0.2 x 4)) = 1: each stop waited for the previous successor to be ready
    stops = of(rc.StopReplica, commands)
    assert len(stops) == 4


def test_the_same_version_again_rolls_nothing_and_a_user_config_change_reconfigures_in_place() -> None:
    f = fleet(3, version="v1")
    assert rc.step(f.state, rc.DeploymentApplied(name="m", num_replicas=3, version="v1")).commands == ()
    cmds = rc.step(f.state, rc.DeploymentApplied(name="m", num_replicas=3, version="v1", user_config={"a": 1})).commands
    assert {type(c) for c in cmds} == {rc.ReconfigureReplica}


@pytest.mark.parametrize(("unavailable", "first_wave"), [(0.2, 2), (0.5, 5), (3, 3), (1, 1)])
def test_max_unavailable_bounds_how_many_serving_replicas_stop_at_once(unavailable: float, first_wave: int) -> None:
    f = fleet(10, max_unavailable=unavailable)
    held = stops_held(f, rc.DeploymentApplied(name="m", num_replicas=10, version="v2", max_unavailable=unavailable))
    assert len(held) == first_wave
    d = f.dep("m")
    assert d.retiring == first_wave and d.active == d.target == 10  # the retiring count towards the target
    assert d.count(rc.Phase.RUNNING) == 10 - first_wave


def test_a_retired_replica_that_dies_while_draining_is_succeeded_on_its_ranks() -> None:
    f = fleet(2)
    (stop,) = stops_held(f, rc.DeploymentApplied(name="m", num_replicas=2, version="v2"))
    rank = f.dep("m").ranks.rank_of(stop.replica_id)
    result = f.step(rc.ReplicaCrashed(replica_id=stop.replica_id, cause="error"))
    (start,) = [c for c in result.commands if isinstance(c, rc.StartReplica)]
    assert start.replaces == stop.replica_id and start.global_rank == rank.rank  # type: ignore[union-attr]
    assert f.dep("m").start_failures == 0  # a draining replica dying is no failed start


def test_a_rollout_goes_on_after_a_controller_restart_from_the_reports() -> None:
    f = fleet(4)
    held = stops_held(f, rc.DeploymentApplied(name="m", num_replicas=4, version="v2"))
    assert len(held) == 1
    recovered = rc.step(rc.State(), reports_from(f.state))
    check_state(recovered.state)
    assert recovered.commands == ()  # the draining one stays retiring: nothing else to do yet
    f.state = recovered.state
    f.run(rc.ReplicaStopped(replica_id=held[0].replica_id))  # type: ignore[attr-defined]
    d = f.dep("m")
    assert d.healthy and not d.rolling and {r.revision for r in d.replicas.values()} == {d.revision}


def test_max_unavailable_is_checked() -> None:
    for bad in (0, 1.0, -1, "20%", 0.0):
        with pytest.raises(rc.InvalidConfig, match="max_unavailable must be a count"):
            rc.DeploymentApplied(name="m", num_replicas=1, max_unavailable=bad)


ROLLOUT = """
name: rollout
seed: 3
duration: 9000
cluster: {nodes: 8, gpus_per_node: 8}
latency: {place: 0.5, start: {dist: uniform, low: 60, high: 120}, stop: 5}
deployments:
  llm: {replicas: 64}
timeline:
  - deploy: llm
  - wait_until_healthy: {deployment: llm, timeout: 600}
  - rollout: {deployment: llm, version: v2, max_unavailable: %s}
  - wait_until_healthy: {deployment: llm, timeout: 8000}
"""


def test_the_simulator_rolls_64_replicas_with_no_rank_moved_and_faster_with_a_larger_budget() -> None:
    took = {}
    for budget in (1, 8):
        result = Simulation(parse_scenario(ROLLOUT % budget, "rollout.yaml")).run()
        m = result.metrics["deployments"]["llm"] if "deployments" in result.metrics else result.metrics["llm"]
        assert m["rollout_replacements"] == 64 and m["rollouts_done"] == 1
        assert m["reassignments"]["any"] == 0 and m["crash_to_ready_p50"] is None
        took[budget] = m["rollout_s_max"]
    assert took[8] < took[1] / 4

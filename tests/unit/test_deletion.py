"""Deleting one deployment (rankcore/control/deletion.py): what persists and what a recovery makes of it."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.invariants import check_recovery_roundtrip, check_step, reports_from


def _step(state: rc.State, event: object) -> rc.Step:
    result = rc.step(state, event)
    check_step(state, event, result, full=True)
    return result


def _serving(names: dict[str, int]) -> rc.State:
    """Unmanaged deployments ``name -> replicas``, every replica running."""
    state = rc.State()
    for name, n in names.items():
        result = _step(state, rc.DeploymentApplied(name=name, num_replicas=n))
        state = result.state
        for c in result.commands:
            state = _step(state, rc.ReplicaPlaced(replica_id=c.replica_id, node_id="n0")).state
            state = _step(state, rc.ReplicaReady(replica_id=c.replica_id)).state
    return state


def test_deleting_is_persisted_and_a_recovery_rebuilds_it_being_deleted() -> None:
    state = _step(_serving({"llm": 2, "emb": 1}), rc.DeploymentDeleted(deployment="llm")).state
    assert rc.query.desired_deleted(state) == ("llm",)
    assert [(d.name, d.num_replicas) for d in rc.query.desired_specs(state)] == [("emb", 1), ("llm", 0)]
    check_recovery_roundtrip(state)  # (the same ranks, phases and targets; nothing stopped twice)
    recovered = _step(rc.State(), reports_from(state))
    llm = recovered.state.deployments["llm"]
    assert llm.deleting and llm.target == 0 and len(llm.replicas) == 2
    assert not recovered.recovery.destructive
    for rid in sorted(llm.replicas.keys()):  # its replicas stop after the restart: it goes with the last
        recovered = _step(recovered.state, rc.ReplicaStopped(replica_id=rid))
    assert "llm" not in recovered.state.deployments and "llm" in recovered.state.deleted


def test_a_recovery_stops_a_deleted_deployments_replicas_without_stop_unknown() -> None:
    before = _serving({"llm": 2, "emb": 1})
    found = reports_from(before)  # llm's replicas are still alive when the controller restarts...
    state = _step(before, rc.DeploymentDeleted(deployment="llm")).state
    for rid in ("llm#1", "llm#0"):
        state = _step(state, rc.ReplicaStopped(replica_id=rid)).state
    assert rc.query.desired_deleted(state) == ("llm",) and "llm" not in state.deployments
    # ...but the specs persisted name only emb, with llm among the deleted
    event = rc.ControllerRecovered(deployments=rc.query.desired_specs(state), reports=found.reports,
                                   next_replica_number=state.next_replica, deleted=rc.query.desired_deleted(state))
    result = _step(rc.State(), event)
    assert result.recovery.unknown_stopped == ("llm#0", "llm#1")
    assert [type(c).__name__ for c in result.commands] == ["StopReplica", "StopReplica"]
    assert _step(result.state, rc.ReplicaStopped(replica_id="llm#0")).stale
    # without ``deleted`` the same reports are refused: a forgotten spec never stops a fleet silently
    with pytest.raises(rc.InvalidEvent, match="'llm'"):
        rc.step(rc.State(), rc.ControllerRecovered(deployments=rc.query.desired_specs(state), reports=found.reports))


def test_a_deleted_deployment_persisted_with_replicas_is_refused() -> None:
    state = _serving({"llm": 1})
    event = rc.ControllerRecovered(deployments=rc.query.desired_specs(state), reports=reports_from(state).reports,
                                   deleted=("llm",))
    with pytest.raises(rc.InvalidEvent, match="'llm' is in deleted but its spec asks for 1 replicas"):
        rc.step(rc.State(), event)


def test_late_news_of_a_deleted_deployment_is_stale_and_a_new_one_of_its_name_is_not_deleted() -> None:
    state = _step(_serving({"llm": 1}), rc.DeploymentDeleted(deployment="llm")).state
    state = _step(state, rc.ReplicaStopped(replica_id="llm#0")).state
    assert "llm" in state.deleted
    for late in (rc.ReplicaCrashed(replica_id="llm#0"), rc.ReplicaReady(replica_id="llm#0")):
        result = _step(state, late)
        assert result.stale and result.commands == ()
    with pytest.raises(rc.InvalidEvent, match="never started"):  # (a made-up id of another name still is not)
        rc.step(state, rc.ReplicaReady(replica_id="ghost#0"))
    state = _step(state, rc.DeploymentApplied(name="llm", num_replicas=1)).state
    assert "llm" not in state.deleted and rc.query.desired_deleted(state) == ()
    assert _step(state, rc.ReplicaStopped(replica_id="llm#0")).stale  # (the old incarnation's id)


def test_requests_waiting_for_a_deleted_deployment_are_told_nothing_is_coming() -> None:
    state = _serving({"llm": 2})
    result = _step(state, rc.DeploymentDeleted(deployment="llm"))
    assert rc.PoolComing(deployment="llm", coming=False) in result.pool
    assert {(c.replica_id, c.membership) for c in result.pool if isinstance(c, rc.PoolChanged)} == {
        ("llm#0", "draining"), ("llm#1", "draining")}
    # the step that takes its last replica away removes it; the pool says that replica is gone
    state = _step(result.state, rc.ReplicaStopped(replica_id="llm#0")).state
    last = _step(state, rc.ReplicaStopped(replica_id="llm#1"))
    assert "llm" not in last.state.deployments
    assert last.pool == (rc.PoolChanged(deployment="llm", replica_id="llm#1", membership="gone"),)


def test_the_fast_path_declines_so_the_last_stop_removes_the_record() -> None:
    from rankcore.core import fast_step, general_step

    state = _step(_serving({"llm": 1}), rc.DeploymentDeleted(deployment="llm")).state
    event = rc.ReplicaStopped(replica_id="llm#0")
    assert fast_step(state, event) is None
    assert "llm" not in general_step(state, event).state.deployments

"""The invariant checks catch broken implementations (so a green suite means something)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

import rankcore as rc
from rankcore import invariants as inv
from rankcore.testing import CoreSubject, make_machine
from tests.helpers import Driver


def healthy(n=4, nodes=("n0", "n1")):
    d = Driver(nodes=nodes)
    d.run(rc.DeploymentApplied(name="app", num_replicas=n, user_config={}, has_reconfigure=True, reconfigure_takes_rank=True))
    return d


def test_crash_replacement_with_another_rank_is_caught():
    d = healthy()
    before = d.state
    victim = d.by_rank()[1]
    result = rc.step(before, rc.ReplicaCrashed(replica_id=victim))
    start = result.commands[0]
    forged = attrs.evolve(result, commands=(attrs.evolve(start, global_rank=3),))
    with pytest.raises(rc.InvariantViolation, match="replaces"):
        inv.check_crash_inherits_rank(before, None, forged)


def test_missing_rank_reconfigure_is_caught():
    d = healthy(3, nodes=("n0",))
    before = d.state
    result = rc.step(before, rc.ScaleRequested(deployment="app", num_replicas=2, victims=(d.by_rank()[0],)))
    d.state = result.state
    stop = [c for c in result.commands if isinstance(c, rc.StopReplica)][0]
    before = d.state
    result = rc.step(before, rc.ReplicaStopped(replica_id=stop.replica_id))
    assert any(isinstance(c, rc.ReconfigureReplica) for c in result.commands)
    inv.check_rank_changes_reconfigured(before, None, result)
    dropped = attrs.evolve(result, commands=tuple(c for c in result.commands if not isinstance(c, rc.ReconfigureReplica)))
    with pytest.raises(rc.InvariantViolation, match="rank reconfigures sent: 0"):
        inv.check_rank_changes_reconfigured(before, None, dropped)


def test_non_minimal_compaction_is_caught():
    d = healthy(4, nodes=("n0",))
    before = d.state
    d.run(rc.ScaleRequested(deployment="app", num_replicas=3, victims=(d.by_rank()[0],)),
          hold=lambda c: isinstance(c, rc.StopReplica))
    (stop,) = d.held
    before = d.state
    result = rc.step(before, rc.ReplicaStopped(replica_id=stop.replica_id))
    (comp,) = result.compactions
    inv.check_compaction_minimal(before, None, result)
    bigger = attrs.evolve(comp, lower_bound=attrs.evolve(comp.lower_bound, replicas=0, rank=0))
    with pytest.raises(rc.InvariantViolation, match="lower bound"):
        inv.check_compaction_minimal(before, None, attrs.evolve(result, compactions=(bigger,)))


def test_recovery_that_loses_a_rank_is_caught():
    d = healthy()

    def lossy_step(state, event):
        if isinstance(event, rc.ControllerRecovered):
            event = attrs.evolve(event, reports=event.reports[1:])
        return rc.step(state, event)

    inv.check_recovery_roundtrip(d.state)
    with pytest.raises(rc.InvariantViolation, match="recovery"):
        inv.check_recovery_roundtrip(d.state, lossy_step)


def test_snapshot_checks():
    ok = {"deployments": {"a": {"target": 2, "healthy": True, "replicas": {
        "a#0": {"phase": "running", "node": "n0", "rank": [0, 0, 0]},
        "a#1": {"phase": "running", "node": "n0", "rank": [1, 0, 1]}}}}}
    inv.check_snapshot(ok)
    dup = {"deployments": {"a": {"target": 2, "healthy": False, "replicas": {
        "a#0": {"phase": "running", "node": "n0", "rank": [0, 0, 0]},
        "a#1": {"phase": "running", "node": "n1", "rank": [0, 1, 0]}}}}}
    with pytest.raises(rc.InvariantViolation, match="global rank 0 held twice"):
        inv.check_snapshot(dup)
    gap = {"deployments": {"a": {"target": 2, "healthy": True, "replicas": {
        "a#0": {"phase": "running", "node": "n0", "rank": [0, 0, 0]},
        "a#1": {"phase": "running", "node": "n0", "rank": [2, 0, 1]}}}}}
    with pytest.raises(rc.InvariantViolation, match="healthy but global ranks"):
        inv.check_snapshot(gap)


class ForgetfulCore(CoreSubject):
    """A wrapper bug: crash replacements start on the lowest free rank instead."""

    def step(self, state, event):
        result = rc.step(state, event)
        cmds = tuple(attrs.evolve(c, global_rank=c.global_rank + 1) if isinstance(c, rc.StartReplica) and c.replaces else c
                     for c in result.commands)
        return attrs.evolve(result, commands=cmds)


def test_the_machine_finds_a_broken_wrapper():
    machine = make_machine(ForgetfulCore)
    with pytest.raises(rc.InvariantViolation):
        run_state_machine_as_test(machine, settings=settings(max_examples=300, deadline=None, database=None))

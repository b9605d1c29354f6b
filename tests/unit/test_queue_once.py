"""The waiting queue names each waiting replica once (rankcore/placement/scheduling.py, ``enqueue``)."""

from __future__ import annotations

import attrs

import rankcore as rc
from rankcore import invariants as inv


def test_a_replica_waiting_again_after_a_failed_placement_is_in_the_queue_once() -> None:
    """A pass that places a gang from one member's place leaves the other members' old entries
    in the queue (skipped later); a PlacementFailed then queues such a member again at the front:
    it must not be in the queue twice (found by the property machine with gangs)."""
    state = rc.State()
    for e in (rc.NodeJoined(node_id="n0", resources={"GPU": 4}),
              rc.DeploymentApplied(name="g", num_replicas=2, gang_size=2, resources={"GPU": 1})):
        state = rc.step(state, e).state
    assert state.deployments["g"].replicas["g#1"].node_id == "n0" and not state.cluster.queued
    stale = attrs.evolve(state, cluster=attrs.evolve(state.cluster, queue=("g#1",)))  # (its old entry)
    event = rc.PlacementFailed(replica_id="g#1", node_id="n0")
    result = rc.step(stale, event)
    inv.check_step(stale, event, result, full=True)
    after = result.state
    live = [rid for rid in after.cluster.queue if rid in after.cluster.queued]
    assert sorted(live) == sorted(set(live))

"""Ids that are str subclasses are refused at the core's boundary, naming the field.

The hostile-events campaign (tests/property/test_hostile_events.py) found refusals naming neither
the corrupted field nor an id of the event: its hostile ids include a ``str`` subclass equal to
every str (``OddStr``). In the core's maps (``immutables.Map``: keys meeting on a hash prefix are
told apart by ``==`` alone) such an id could find another replica's record, the refusal named that
record's id, and an event that was not refused acted on the other replica; whether it happened
depended on the process's string hashes. Ids must now be plain ``str`` (``rankcore.base.fields``:
``name``, ``names``), so the boundary refuses such an id naming the field, before any lookup.
``Alias`` finds its target in every process (it hashes as the target): each case below reached
another replica's record before.
"""

from __future__ import annotations

from typing import Any

import pytest

import rankcore as rc
from tests.hostile import forge, names_what


class Alias(str):
    """An id shown as its own text that equals every str and hashes as ``target``: it finds
    ``target``'s record in any map (``OddStr`` does so when its hash meets the target's)."""

    target: str

    def __new__(cls, text: str, target: str) -> Alias:
        alias = super().__new__(cls, text)
        alias.target = target
        return alias

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return hash(self.target)


def _run(*events: object, state: rc.State | None = None) -> rc.State:
    state = rc.State() if state is None else state
    for e in events:
        state = rc.step(state, e).state
    return state


def _pending() -> rc.State:
    """Unmanaged (no node joined): "llm#0" pending, on no node."""
    return _run(rc.DeploymentApplied(name="llm", num_replicas=1))


def _running() -> rc.State:
    """Unmanaged: "llm#0" placed on node-a and running."""
    return _run(rc.ReplicaPlaced(replica_id="llm#0", node_id="node-a"), rc.ReplicaReady(replica_id="llm#0"),
                state=_pending())


def _stopping() -> rc.State:
    """Unmanaged: "llm#1" of three stopping (named as the victim of a downscale)."""
    return _run(rc.DeploymentApplied(name="llm", num_replicas=3),
                rc.ScaleRequested(deployment="llm", num_replicas=2, victims=("llm#1",)))


def _backoff() -> tuple[rc.State, str]:
    """A replacement waiting out a restart backoff (two failed starts in a row): no StartReplica yet."""
    state = _run(rc.Tick(now=1.0), rc.DeploymentApplied(name="llm", num_replicas=1))
    for _ in range(2):
        (rid,) = state.deployment("llm").replicas
        state = _run(rc.ReplicaPlaced(replica_id=rid, node_id="node-a"),
                     rc.ReplicaCrashed(replica_id=rid, cause="error"), state=state)
    (waiting,) = state.cluster.delayed
    return state, waiting


def _case_victim_stopping() -> tuple[rc.State, Any]:
    state = _stopping()
    event = rc.ScaleRequested(deployment="llm", num_replicas=1)
    return state, forge(event, victims=(Alias("ghost#9", "llm#1"),))


def _case_placed_running() -> tuple[rc.State, Any]:
    return _running(), forge(rc.ReplicaPlaced(replica_id="llm#0", node_id="node-b"),
                             replica_id=Alias("ghost#9", "llm#0"))


def _case_placed_never_started() -> tuple[rc.State, Any]:
    state, waiting = _backoff()
    return state, forge(rc.ReplicaPlaced(replica_id=waiting, node_id="node-b"), replica_id=Alias("ghost#9", waiting))


def _case_ready_pending() -> tuple[rc.State, Any]:
    return _pending(), forge(rc.ReplicaReady(replica_id="llm#0"), replica_id=Alias("ghost#9", "llm#0"))


def _case_reconfigured_ahead() -> tuple[rc.State, Any]:
    return _pending(), forge(rc.ReplicaReconfigured(replica_id="llm#0", version=1),
                             replica_id=Alias("ghost#9", "llm#0"))


def _case_reconfigured_pending() -> tuple[rc.State, Any]:
    return _pending(), forge(rc.ReplicaReconfigured(replica_id="llm#0", version=0),
                             replica_id=Alias("ghost#9", "llm#0"))


def _case_stopped_running() -> tuple[rc.State, Any]:
    return _running(), forge(rc.ReplicaStopped(replica_id="llm#0"), replica_id=Alias("ghost#9", "llm#0"))


def _case_tier_moved_pending() -> tuple[rc.State, Any]:
    return _pending(), forge(rc.TierMoved(replica_id="llm#0", tier="warm", nbytes=7),
                             replica_id=Alias("ghost#9", "llm#0"))


#: (case, the corrupted field, what the other replica's record made the refusal say before ids had to be
#: plain str: rankcore/core.py's handlers and rankcore/tiers/residency.py's ``moved``)
CASES = [
    pytest.param(_case_victim_stopping, "victims", "is already stopping", id="ScaleRequested.victims-stopping"),
    pytest.param(_case_placed_running, "replica_id", "is running: 'placed' is not allowed",
                 id="ReplicaPlaced-running"),
    pytest.param(_case_placed_never_started, "replica_id", "was never started", id="ReplicaPlaced-never-started"),
    pytest.param(_case_ready_pending, "replica_id", "is pending: 'ready' is not allowed", id="ReplicaReady-pending"),
    pytest.param(_case_reconfigured_ahead, "replica_id", "acknowledges reconfigure 1",
                 id="ReplicaReconfigured-ahead"),
    pytest.param(_case_reconfigured_pending, "replica_id", "is pending: 'reconfigured' is not allowed",
                 id="ReplicaReconfigured-pending"),
    pytest.param(_case_stopped_running, "replica_id", "is running: 'stopped' is not allowed",
                 id="ReplicaStopped-running"),
    pytest.param(_case_tier_moved_pending, "replica_id", "is pending: its weights cannot be warm",
                 id="TierMoved-pending"),
]


@pytest.mark.parametrize("case, field, says", CASES)
def test_an_id_that_is_a_str_subclass_is_refused_naming_the_field(case: Any, field: str, says: str) -> None:
    """The event's ``field`` holds an id that would find another replica's record (and, there,
    be refused for what that replica is: ``says``): the boundary refuses it first, naming the
    field."""
    state, event = case()
    with pytest.raises(rc.InvalidConfig, match="a subclass of str") as caught:
        rc.step(state, event)
    message = str(caught.value)
    assert f"{type(event).__name__}.{field}" in message and names_what(message, event, (field,)), message
    assert says not in message, message  # (what the other replica's record would have said)


@pytest.mark.parametrize("value", [Alias("llm#0", "llm#0"), rc.Phase.RUNNING])
def test_the_constructors_refuse_an_id_that_is_a_str_subclass(value: Any) -> None:
    with pytest.raises(rc.InvalidConfig, match=r"ReplicaReady\.replica_id must be a non-empty str, got .*a subclass of str"):
        rc.ReplicaReady(replica_id=value)
    with pytest.raises(rc.InvalidConfig, match=r"ScaleRequested\.victims holds .*a subclass of str"):
        rc.ScaleRequested(deployment="llm", num_replicas=1, victims=(value,))
    assert rc.ReplicaReady(replica_id=str(value)).replica_id == str(value)  # (the plain str is taken)


class _Node(str):
    """A node id of the caller's own type (a str enum's value, a numpy string)."""


@pytest.mark.parametrize("build, says", [
    (lambda: rc.BundlesPlaced(deployment="app", bundle_nodes=("n0", _Node("n1"))),
     r"BundlesPlaced\('app'\)\.bundle_nodes must list a node id .*'n1' \(of type _Node: a subclass of str"),
    (lambda: rc.StaticPlacement.from_mapping("pg-1", ("n0", _Node("n1")), {0: [0], 1: [1]}),
     r"StaticPlacement\.bundle_nodes\[1\] must be a node id .*of type _Node"),
    (lambda: rc.StaticPlacement.from_mapping(_Node("pg-1"), ("n0", "n1"), {0: [0], 1: [1]}),
     r"StaticPlacement\.group must be a non-empty str .*of type _Node"),
    (lambda: rc.ControllerRecovered(deployments=(), reports=(), weights_versions={_Node("app"): 3}),
     r"ControllerRecovered\.weights_versions: .* \(deployment: 'app' \(of type _Node"),
    (lambda: rc.AutoscalingMetrics(deployment="app", now=1.0, ongoing=((_Node("app#0"), 1),)),
     r"AutoscalingMetrics\('app'\)\.ongoing holds .*\(replica id, int >= 0\) pair \(a plain str"),
], ids=["BundlesPlaced.bundle_nodes", "StaticPlacement.bundle_nodes", "StaticPlacement.group",
        "ControllerRecovered.weights_versions", "AutoscalingMetrics.ongoing"])
def test_every_id_field_refuses_a_str_subclass(build: Any, says: str) -> None:
    """Node ids in a bundle list (the core would place a replica there and refuse the executor's
    echo of its own PlaceReplica), a group id, deployments in a recovery's weights versions, and
    replicas in autoscaling metrics are plain str too."""
    with pytest.raises(rc.InvalidConfig, match=says):
        build()

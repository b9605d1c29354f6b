"""Records take what an embedder hands them without surprises (issue 8, point 11)."""

from __future__ import annotations

import pytest

import rankcore as rc
from rankcore.invariants import reports_from
from tests.helpers import Driver, of


def _healthy(n: int = 3) -> rc.State:
    d = Driver(nodes=["n0", "n1"])
    d.run(rc.DeploymentApplied(name="llm", num_replicas=n))
    return d.state


def test_generators_are_materialised_before_validation():
    """A generator given to a tuple field is read once and kept as a tuple:
    validating it must not leave the record holding an exhausted iterator."""
    state = _healthy()
    exact = reports_from(state)
    event = rc.ControllerRecovered(deployments=(d for d in exact.deployments), reports=(r for r in exact.reports),
                                   next_replica_number=exact.next_replica_number, next_lineage=exact.next_lineage)
    assert isinstance(event.deployments, tuple) and isinstance(event.reports, tuple)
    assert event == exact
    result = rc.step(rc.State(), event)
    assert result.commands == ()  # nothing restarted, nothing stopped
    assert result.state.ranks("llm") == state.ranks("llm")
    victims = rc.ScaleRequested(deployment="llm", num_replicas=1, victims=(v for v in ["llm#0", "llm#1"]))
    assert victims.victims == ("llm#0", "llm#1")


@pytest.mark.parametrize("value", ["llm#0", {"llm#0": 1}, 3])
def test_a_string_or_mapping_is_not_taken_for_a_list_of_ids(value):
    with pytest.raises(rc.InvalidConfig, match=r"ScaleRequested\.victims must be a tuple"):
        rc.ScaleRequested(deployment="llm", num_replicas=1, victims=value)


def test_recovery_fields_must_be_iterables():
    with pytest.raises(rc.InvalidConfig, match=r"ControllerRecovered\.reports must be an iterable"):
        rc.ControllerRecovered(deployments=(), reports=None)


def test_crash_reason_none_is_a_typed_error():
    with pytest.raises(rc.InvalidConfig, match=r"ReplicaCrashed.reason must be a str, got None"):
        rc.ReplicaCrashed(replica_id="llm#0", reason=None)


def test_a_bad_phase_lists_the_phases():
    with pytest.raises(rc.InvalidConfig) as err:
        rc.ReplicaReport(replica_id="llm#0", deployment="llm", rank=0, phase="runing")
    for name in ("'pending'", "'starting'", "'running'", "'reconfiguring'", "'stopping'", "'runing'"):
        assert name in str(err.value)


def test_reading_an_unknown_deployment_is_a_key_error_naming_the_known_ones():
    state = _healthy()
    with pytest.raises(rc.UnknownDeployment, match=r"unknown deployment 'x' \(known: 'llm'\)"):
        state.ranks("x")
    with pytest.raises(KeyError):
        state.deployment("x")
    with pytest.raises(rc.UnknownDeployment, match=r"known: none"):
        rc.State().ranks("x")
    # An *event* about an unknown deployment stays an InvalidEvent.
    with pytest.raises(rc.InvalidEvent, match="unknown deployment 'x'"):
        rc.step(state, rc.ScaleRequested(deployment="x", num_replicas=1))


def test_start_replica_names_its_int_rank_global_rank():
    d = Driver(nodes=["n0"])
    (start,) = of(rc.StartReplica, d.run(rc.DeploymentApplied(name="llm", num_replicas=1),
                                          hold=lambda c: isinstance(c, rc.InitializeReplica)))
    assert start.global_rank == 0 and not hasattr(start, "rank")

"""The bugs the hostile-input campaign found (issue 40, "Hostile input on every surface";
tests/property/test_hostile_events.py), one test each.

Before the fixes: an event built without its constructor (unpickled, ``records.maker``, forged)
reached the handlers as it was (``AttributeError``, ``TypeError``, or a NaN clock taken in
silence); a huge count overflowed the autoscaler's average; a 5,000-digit version or id made an
error message raise ``ValueError``; a device node's GPU count could be changed away from its
devices (the state could then not be told to a recovering controller); constructors raised
``TypeError`` / ``ValueError`` on some malformed values; the request plane's machines took
malformed events and options.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

import rankcore as rc
import rankcore.requests as rq
from rankcore import invariants as inv
from rankcore.base.fields import check_record, shown
from rankcore.base.options import DeploymentConfig, SchedulingOptions
from rankcore.base.records import maker
from tests.hostile import OddStr

GB = 10**9
VERY_HUGE = 10**5000  # (more digits than Python turns into a string)


def forge(record: Any, **changes: Any) -> Any:
    """``record`` with ``changes``, without its converters or validators (what pickle gives)."""
    new = object.__new__(type(record))
    for a in attrs.fields(type(record)):
        object.__setattr__(new, a.name, changes.get(a.name, getattr(record, a.name)))
    return new


def _run(*events: object, state: rc.State | None = None) -> rc.State:
    state = rc.State() if state is None else state
    for e in events:
        state = rc.step(state, e).state
    return state


def _deployed() -> rc.State:
    """A node, the clock, two replicas of "llm" placed and ready."""
    state = _run(rc.NodeJoined(node_id="n0", resources={"GPU": 4}), rc.Tick(now=1.0),
                 rc.DeploymentApplied(name="llm", num_replicas=2, resources={"GPU": 1}))
    for rid in ("llm#0", "llm#1"):
        state = _run(rc.ReplicaPlaced(replica_id=rid, node_id="n0"), rc.ReplicaReady(replica_id=rid), state=state)
    return state


# ------------------------------------------------------------------ step checks what it takes


@pytest.mark.parametrize("event, field", [
    (forge(rc.ReplicaReady(replica_id="llm#0"), replica_id=None), "ReplicaReady.replica_id"),  # (AttributeError)
    (forge(rc.ReplicaPlaced(replica_id="llm#0", node_id="n0"), replica_id=5), "ReplicaPlaced.replica_id"),
    (forge(rc.ReplicaCrashed(replica_id="llm#0"), cause="gone"), "ReplicaCrashed"),
    (forge(rc.ReplicaStopped(replica_id="llm#0"), now=math.inf), "ReplicaStopped.now"),
    (forge(rc.Tick(now=2.0), now=math.nan), "Tick.now"),  # (taken: the clock became NaN)
    (forge(rc.HealthChecked(replica_id="llm#0", healthy=True), healthy="yes"), "HealthChecked.healthy"),
    (forge(rc.ScaleRequested(deployment="llm", num_replicas=1), victims=["llm#0"]), "ScaleRequested.victims"),
    (forge(rc.AutoscalingMetrics(deployment="llm", now=2.0), ongoing=(("llm#0", -1),)), "ongoing"),
    (forge(rc.AutoscalingMetrics(deployment="llm", now=2.0), ongoing=(("llm#1", 1), ("llm#0", 1))), "ongoing"),
    (forge(rc.WeightsPushed(deployment="llm", version=1), version=-1), "WeightsPushed.version"),
    (forge(rc.ProxiesConfigured(), options="EveryNode"), "ProxiesConfigured.options"),  # (AttributeError)
    # (a list was kept as it was: the caller's own list, inside the immutable state)
    (forge(rc.ModelsReported(replica_id="llm#0", model_ids=()), model_ids=["m"]), "ModelsReported.model_ids"),
])
def test_step_refuses_an_event_its_constructor_would_have_refused(event: object, field: str) -> None:
    state = _deployed()
    with pytest.raises(rc.InvalidConfig) as err:
        rc.step(state, event)
    assert field in str(err.value)


def test_step_checks_nested_records_and_names_the_path() -> None:
    """A forged option group inside a DeploymentApplied, a forged report inside a recovery."""
    e = rc.DeploymentApplied(name="x", num_replicas=1)
    bad = forge(e, config=forge(e.config, scheduling=forge(e.config.scheduling, placement_timeout_s=-1.0)))
    with pytest.raises(rc.InvalidConfig, match=r"DeploymentApplied\.config: .*placement_timeout_s"):
        rc.step(rc.State(), bad)
    with pytest.raises(rc.InvalidConfig, match=r"DeploymentApplied\.config: .*DeploymentConfig\.scheduling"):
        rc.step(rc.State(), forge(e, config=forge(e.config, scheduling="x")))
    report = rc.ReplicaReport(replica_id="x#0", deployment="x", rank=0, node_id=None, phase="pending")
    recovered = rc.ControllerRecovered(deployments=(e,), reports=(report,))
    with pytest.raises(rc.InvalidConfig, match=r"ControllerRecovered\.reports: ReportedRank\.rank must be"):
        rc.step(rc.State(), forge(recovered, reports=(forge(report, rank=-1),)))


def test_a_record_with_a_field_never_set_is_named() -> None:
    half = object.__new__(rc.ReplicaReady)
    with pytest.raises(rc.InvalidConfig, match=r"ReplicaReady\.replica_id is missing"):
        rc.step(rc.State(), half)


def test_events_built_without_validators_from_valid_values_still_step() -> None:
    """The simulator builds its answers with ``records.maker`` (no validators): still taken."""
    state = _run(rc.NodeJoined(node_id="n0", resources={"GPU": 4}), rc.Tick(now=1.0),
                 rc.DeploymentApplied(name="llm", num_replicas=1, resources={"GPU": 1}))
    placed = maker(rc.ReplicaPlaced)(replica_id="llm#0", node_id="n0", now=2.0)
    state = rc.step(state, placed).state
    state = rc.step(state, maker(rc.ReplicaReady)(replica_id="llm#0")).state
    assert state.deployments["llm"].replicas["llm#0"].phase is rc.Phase.RUNNING
    check_record(rc.ControllerRecovered(deployments=(), reports=()))  # (a constructor's record passes)


def test_a_non_event_too_large_to_show_is_an_invalid_event() -> None:
    """``step got {event!r}`` raised ValueError for a 5,000-digit int."""
    with pytest.raises(rc.InvalidEvent, match="an int of about 5001 digits, which is not a rankcore event"):
        rc.step(rc.State(), VERY_HUGE)


def test_shown_survives_a_repr_that_raises() -> None:
    class Bad:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert shown(Bad()) == "a Bad that cannot be shown"


# ------------------------------------------------------------------ counts, versions, messages


def test_autoscaling_metrics_with_a_count_beyond_64_bits_is_refused() -> None:
    """A 400-digit count overflowed the autoscaler's float average (OverflowError in step)."""
    state = _run(rc.DeploymentApplied(name="a", num_replicas=0, autoscaling=True, min_replicas=0, max_replicas=4,
                                      upscale_delay_s=0.0))
    with pytest.raises(rc.InvalidConfig, match=r"AutoscalingMetrics\.queued must be at most 2\*\*63 - 1"):
        rc.AutoscalingMetrics(deployment="a", now=1.0, queued=10**400)
    with pytest.raises(rc.InvalidConfig, match=r"AutoscalingMetrics\('a'\)\.ongoing holds"):
        rc.AutoscalingMetrics(deployment="a", now=1.0, ongoing={"a#0": 10**400})
    with pytest.raises(rc.InvalidConfig, match="queued"):
        rc.step(state, forge(rc.AutoscalingMetrics(deployment="a", now=1.0), queued=10**400))
    big = rc.AutoscalingMetrics(deployment="a", now=1.0, queued=2**63 - 1, ongoing={"a#0": 2**63 - 1})
    state = rc.step(state, big).state  # (the largest count: no overflow)
    big = rc.AutoscalingMetrics(deployment="a", now=2.0, queued=2**63 - 1, ongoing={"a#0": 2**63 - 1})
    assert 1 <= rc.step(state, big).state.deployments["a"].target <= 4  # (bounded by max_replicas)


@pytest.mark.parametrize("make", [
    lambda v: rc.WeightsUpdated(replica_id="llm#0", version=v),
    lambda v: rc.WeightsPushed(deployment="llm", version=v),
    lambda v: rc.WakeRequested(deployment="llm", weights_version=v),
    lambda v: rc.ReplicaReconfigured(replica_id="llm#0", version=v),
    lambda v: rc.TierMoved(replica_id="llm#0", tier="hot", nbytes=v),
    lambda v: rc.ProxyHealthChecked(proxy_id="p", healthy=True, ongoing=v),
    lambda v: rc.ControllerRecovered(deployments=(), reports=(), next_replica_number=v),
    lambda v: rc.ReplicaReport(replica_id="x#0", deployment="x", rank=0, node_id="n0", version=v),
])
def test_versions_and_counts_that_reach_the_state_fit_64_bits(make: Any) -> None:
    """A 5,000-digit version was taken, and the core's own messages (and a trace's JSON) then
    raised ValueError on it (``WeightsUpdated``: "says it holds version {version}")."""
    assert make(2**63 - 1) is not None
    for bad in (2**63, VERY_HUGE):
        with pytest.raises(rc.InvalidConfig, match=r"must be at most 2\*\*63 - 1"):
            make(bad)
    state = _deployed()
    with pytest.raises(rc.InvalidConfig, match=r"WeightsUpdated\.version"):
        rc.step(state, forge(rc.WeightsUpdated(replica_id="llm#0", version=0), version=VERY_HUGE))


@pytest.mark.parametrize("make, says", [
    (lambda: rc.BundlesPlaced(deployment="x", bundle_nodes=VERY_HUGE), "BundlesPlaced('x').bundle_nodes"),
    (lambda: rc.ReplicaCrashed(replica_id="x#0", cause=VERY_HUGE),  # type: ignore[arg-type]
     "ReplicaCrashed('x#0').cause"),
    (lambda: rc.ReplicaReport(replica_id="x#0", deployment="x", rank=0, phase=VERY_HUGE), "ReplicaReport.phase"),
    (lambda: rc.DeploymentApplied(name="x", num_replicas=0, max_replicas=-VERY_HUGE), "max_replicas"),
    (lambda: rc.ControllerRecovered(deployments=VERY_HUGE, reports=()), "ControllerRecovered.deployments"),
    (lambda: rc.ControllerRecovered(deployments=(VERY_HUGE,), reports=()), "ControllerRecovered.deployments"),
    (lambda: rc.StaticPlacement(group=VERY_HUGE, bundle_nodes=("n",), mapping=((0,),)),  # type: ignore[arg-type]
     "StaticPlacement.group"),
    (lambda: rc.StaticPlacement(group="g", bundle_nodes=("n", VERY_HUGE), mapping=((0,),)), "bundle_nodes[1]"),
    (lambda: rc.StaticPlacement(group="g", bundle_nodes=("n",), mapping=((VERY_HUGE,),)), "mapping[0]"),
])
def test_messages_about_values_too_large_to_show_do_not_raise(make: Any, says: str) -> None:
    """The message itself raised ValueError (``{value!r}`` of a 5,000-digit int)."""
    with pytest.raises(rc.InvalidConfig) as err:
        make()
    assert says in str(err.value) and len(str(err.value)) < 400


# ------------------------------------------------------------------ records the constructors let through


def test_a_recovery_with_warm_copies_that_are_not_warm_copies_is_refused() -> None:
    """Taken by the constructor; step then raised AttributeError."""
    with pytest.raises(rc.InvalidConfig, match=r"ControllerRecovered\.warm_copies must be an iterable of WarmCopy"):
        rc.ControllerRecovered(deployments=(), reports=(), warm_copies=(1.5,))


def test_a_report_naming_devices_that_are_not_indices_is_refused() -> None:
    """``ReplicaReport.devices`` had no check: ``([],)`` made the recovery raise TypeError (unhashable)."""
    bad: Any
    for bad in (([],), ("a",), (-1,), 5):
        with pytest.raises(rc.InvalidConfig, match=r"ReplicaReport\('m#0'\)\.devices must be the indices"):
            rc.ReplicaReport(replica_id="m#0", deployment="m", rank=0, node_id="n0", devices=bad)
    ok = rc.ReplicaReport(replica_id="m#0", deployment="m", rank=0, node_id="n0", devices=[0, 1])
    assert ok.devices == (0, 1)


@pytest.mark.parametrize("make", [
    lambda: rc.NodeJoined(node_id="n", resources={"GPU": 1}, devices=5),  # (TypeError: not iterable)
    lambda: rc.NodeJoined(node_id="n", resources=("GPU",)),  # (ValueError: too many values to unpack)
    lambda: rc.NodeCapacityChanged(node_id="n", resources=((1, 2, 3),)),
    lambda: DeploymentConfig(scheduling="x"),  # type: ignore[arg-type]  # (taken: the step failed later)
    lambda: rq.SetBatchOptions(options="x"),  # type: ignore[arg-type]  # (TypeError from attrs' instance_of)
])
def test_constructors_refuse_malformed_values_with_invalid_config(make: Any) -> None:
    with pytest.raises(rc.InvalidConfig):
        make()
    assert DeploymentConfig(scheduling=SchedulingOptions()).scheduling == SchedulingOptions()


@pytest.mark.parametrize("make", [
    lambda: rc.PoolComing(deployment="llm", coming="yes"),  # type: ignore[arg-type]
    lambda: rc.PoolReset(deployment="llm", serving=(), draining=(), coming=1),  # type: ignore[arg-type]
    lambda: rc.ReplicaReport(replica_id="x#0", deployment="x", rank=0, node_id="n0",
                             revision=5),  # type: ignore[arg-type]
])
def test_flags_and_texts_of_input_records_refuse_with_invalid_config(make: Any) -> None:
    """attrs' ``instance_of`` raised TypeError (not a RankcoreError, and naming no record)."""
    with pytest.raises(rc.InvalidConfig):
        make()


def test_a_device_nodes_gpu_count_cannot_move_away_from_its_devices() -> None:
    """Taken before: the node then said GPU=3 with 2 devices, and ``reports_from`` (what a
    recovering controller is told) raised InvalidConfig on it."""
    state = _run(rc.NodeJoined(node_id="a", resources={"GPU": 2, "CPU": 8}, devices=(80 * GB,) * 2), rc.Tick(now=1.0))
    with pytest.raises(rc.InvalidEvent, match=r"NodeCapacityChanged\('a'\): resources say GPU=3 but the node "
                                              r"declared 2 devices"):
        rc.step(state, rc.NodeCapacityChanged(node_id="a", resources={"GPU": 3, "CPU": 8}))
    state = rc.step(state, rc.NodeCapacityChanged(node_id="a", resources={"GPU": 2, "CPU": 4})).state  # (CPUs may)
    inv.reports_from(state)
    inv.check_state(state)


# ------------------------------------------------------------------ the request plane


def _view(m: rq.RequestMachine) -> tuple:
    return m.counters(), m.pool("llm"), m.queued("llm"), m._now, tuple(m._deadlines)


@pytest.mark.parametrize("event, field", [
    (forge(rq.Submit(request_id="q1", deployment="llm"), deadline=math.nan), "Submit.deadline"),  # (NaN in the heap)
    (forge(rq.Submit(request_id="q1", deployment="llm"), request_id=None), "Submit.request_id"),
    (forge(rq.Tick(now=5.0), now=math.nan), "Tick.now"),  # (the clock became NaN)
    (forge(rc.Tick(now=5.0), now=-1.0), "Tick.now"),
    (forge(rq.Configure(deployment="llm"), max_ongoing_requests=0), "Configure.max_ongoing_requests"),
    (forge(rc.PoolReset(deployment="llm", serving=(), draining=(), coming=True), serving=None), "PoolReset.serving"),
    (forge(rq.ReplicaModels(deployment="llm", replica_id="r", model_ids=()), model_ids=[1]), "model_ids"),
])
def test_the_request_machine_refuses_malformed_events_and_changes_nothing(event: Any, field: str) -> None:
    m = rq.RequestMachine()
    m.handle(rq.Configure(deployment="llm"))
    m.handle(rc.PoolChanged(deployment="llm", replica_id="r", membership="serving"))
    m.handle(rq.Tick(now=1.0))
    before = _view(m)
    with pytest.raises(rc.InvalidEvent, match=field):  # (the machine's word for bad input)
        m.handle(event)
    assert _view(m) == before


def test_the_batcher_refuses_malformed_events_and_options() -> None:
    b = rq.Batcher(rq.BatchOptions(max_batch_size=2))
    for event, field in [(forge(rq.Enqueue(request_id="a", now=0.0), size=0), "Enqueue.size"),
                         (forge(rq.Enqueue(request_id="a", now=0.0), now=math.nan), "Enqueue.now"),
                         (forge(rq.BatchDone(batch_id=0, now=0.0), batch_id=[]), "BatchDone.batch_id"),
                         (forge(rq.SetBatchOptions(options=rq.BatchOptions()),
                                options=forge(rq.BatchOptions(), max_batch_size=None)), "max_batch_size")]:
        with pytest.raises(rc.InvalidEvent, match=field):  # (the batcher's word for bad input)
            b.handle(event)
    assert (b.waiting, b.running, b._now, b.options) == (0, 0, None, rq.BatchOptions(max_batch_size=2))
    with pytest.raises(rc.InvalidConfig, match="max_batch_size"):  # (was a TypeError at the first Enqueue)
        rq.Batcher(forge(rq.BatchOptions(), max_batch_size=None))
    with pytest.raises(rc.InvalidEvent, match="batch an int of about 5001 digits is not running"):  # (ValueError)
        b.handle(rq.BatchDone(batch_id=VERY_HUGE, now=0.0))


def test_the_model_cache_refuses_malformed_model_ids_and_options() -> None:
    with pytest.raises(rc.InvalidConfig, match="ModelCache options"):
        rq.ModelCache("x")  # type: ignore[arg-type]
    with pytest.raises(rc.InvalidConfig, match="max_num_models_per_replica"):
        rq.ModelCache(forge(rq.MultiplexOptions(), max_num_models_per_replica=0))
    c = rq.ModelCache()
    c.use("m")
    for call in (c.begin, c.loaded, c.failed, c.gave_up):
        with pytest.raises(rc.InvalidConfig, match="model_id"):  # (begin([]): TypeError, unhashable)
            call([])  # type: ignore[arg-type]
    assert c.resident() == ("m",) and c.loading is None


@pytest.mark.parametrize("candidates, last", [([(1, 2)], 0), ([5], 0), ([(0, 0, 0, False, 0)], "x")])
def test_route_model_names_malformed_candidates(candidates: list, last: Any) -> None:
    """Was ValueError / TypeError from unpacking or comparing them."""
    with pytest.raises(rc.InvalidConfig, match="route_model: its candidates"):
        rq.route_model(candidates, last)
    assert rq.route_model([(3, 0, 1, True, -1), (1, 0, 0, False, -1)], 0) == 3


@pytest.mark.parametrize("ready", [False, True], ids=["pending", "starting"])
def test_a_weights_move_to_warm_for_a_replica_not_yet_running_is_refused(ready: bool) -> None:
    """Taken before: the replica became WARM while pending (no OffloadReplica was ever sent to it),
    which ``check_state`` refuses ("is pending but warm")."""
    state = _run(rc.NodeJoined(node_id="n0", resources={"GPU": 4}), rc.Tick(now=1.0),
                 rc.DeploymentApplied(name="llm", num_replicas=1, resources={"GPU": 1}))
    phase = "pending"
    if ready:
        state, phase = _run(rc.ReplicaPlaced(replica_id="llm#0", node_id="n0"), state=state), "starting"
    with pytest.raises(rc.InvalidEvent, match=f"TierMoved: replica 'llm#0' is {phase}: its weights cannot be warm"):
        rc.step(state, rc.TierMoved(replica_id="llm#0", tier="warm"))
    assert rc.step(state, rc.TierMoved(replica_id="llm#0", tier="hot")).stale  # (where they are: the same again)


def test_a_resource_amount_a_float_cannot_count_in_is_refused() -> None:
    """1e300 GPUs were taken; a node's bookings then vanished in its free room (1e300 - 2 is 1e300),
    and the demand told to the cluster's autoscaler left them out."""
    for make in (lambda v: rc.NodeJoined(node_id="a", resources={"GPU": v}),
                 lambda v: rc.NodeCapacityChanged(node_id="a", resources={"GPU": v}),
                 lambda v: rc.DeploymentApplied(name="x", num_replicas=1, resources={"GPU": v})):
        with pytest.raises(rc.InvalidConfig, match=r"\['GPU'\] must be at most 2\*\*53"):
            make(1e300)
        assert make(2**53) is not None  # (the largest: 9 PB of memory in bytes)
    state = _run(rc.NodeJoined(node_id="a", resources={"GPU": 4}), rc.Tick(now=1.0))
    with pytest.raises(rc.InvalidConfig, match="resources"):
        rc.step(state, forge(rc.NodeCapacityChanged(node_id="a", resources={"GPU": 4}), resources=(("GPU", 1e300),)))


def test_a_recovery_of_an_autoscaled_deployment_outside_its_bounds_is_refused() -> None:
    """Taken before: the deployment came back at target 0 with min_replicas=1 (not being deleted),
    which ``check_state`` refuses ("autoscaled target 0 is not whole gangs of 1 within [1, 1]")."""
    spec = rc.DeploymentApplied(name="llm", num_replicas=0, autoscaling=True, min_replicas=1, max_replicas=1)
    with pytest.raises(rc.InvalidEvent, match=r"deployment 'llm' is autoscaled within \[1, 1\] but its spec asks "
                                              r"for 0 replicas"):
        rc.step(rc.State(), rc.ControllerRecovered(deployments=(spec,), reports=()))
    deleting = rc.step(rc.State(), rc.ControllerRecovered(deployments=(spec,), reports=(), deleted=("llm",))).state
    inv.check_state(deleting)  # (being deleted: at 0, as persisted)
    ok = rc.step(rc.State(), rc.ControllerRecovered(deployments=(spec.replace(num_replicas=1),), reports=())).state
    assert ok.deployments["llm"].target == 1
    inv.check_state(ok)


def test_a_recovery_repeated_after_its_deployments_have_gone_is_refused() -> None:
    """Taken before: once every deployment had been deleted and gone (no deployment, no node: the
    state looked fresh), the same ControllerRecovered delivered again brought back a replica that
    had stopped, and its late news was no longer stale."""
    spec = rc.DeploymentApplied(name="llm", num_replicas=0)
    report = rc.ReplicaReport(replica_id="llm#0", deployment="llm", rank=0, node_id="n0", phase="stopping")
    recovered = rc.ControllerRecovered(deployments=(spec,), reports=(report,), deleted=("llm",))
    state = _run(recovered, rc.ReplicaStopped(replica_id="llm#0"))
    assert not state.deployments and not state.cluster.nodes and "llm" in state.deleted
    with pytest.raises(rc.InvalidEvent, match=r"ControllerRecovered needs a fresh State\(\); this state has handed "
                                              r"out 1 replica ids and deleted 1 deployments"):
        rc.step(state, recovered)
    assert rc.step(state, rc.ReplicaReady(replica_id="llm#0")).stale


def test_a_recovery_report_whose_tier_is_a_str_equal_to_anything_is_refused() -> None:
    # (found by the campaign on 2026-11-26: the tier passed ``in ("hot", "warm")`` and the
    # recovery's ``Residency(...)`` then raised ValueError)
    report = rc.ReplicaReport(replica_id="a#0", deployment="a", rank=0, node_id="n0")
    event = forge(rc.ControllerRecovered(deployments=(rc.DeploymentApplied(name="a", num_replicas=1),), reports=()),
                  reports=(forge(report, tier=OddStr("llm#0")),))
    with pytest.raises(rc.InvalidConfig, match="tier must be 'hot' or 'warm'"):
        rc.step(rc.State(), event)
    with pytest.raises(rc.InvalidConfig, match="tier must be 'hot' or 'warm'"):
        rc.ReplicaReport(replica_id="a#0", deployment="a", rank=0, node_id="n0", tier=OddStr("x"))

"""The autoscaler in the core (rankcore.control.autoscaling, issue 23): Ray Serve's options and rule,
each rule on its own, through the same scale path as a person's ScaleRequested."""

from __future__ import annotations

import pickle

import attrs
import pytest

import rankcore as rc
from rankcore.base.options import AutoscalingOptions
from rankcore.control.autoscaling import DEFAULT_POLICY, factored
from rankcore.invariants import check_recovery_roundtrip, check_state, reports_from

NAME = "m"


def applied(**options: object) -> rc.DeploymentApplied:
    base: dict[str, object] = {"autoscaling": True, "max_replicas": 10}
    return rc.DeploymentApplied(name=NAME, num_replicas=options.pop("num_replicas", 1), **{**base, **options})


def deploy(**options: object) -> rc.State:
    return rc.step(rc.State(), applied(**options)).state


def serve_all(state: rc.State) -> rc.State:
    """Every pending or starting replica placed and ready (an executor answering at once)."""
    for rid, rep in sorted(state.deployment(NAME).replicas.items()):
        if rep.phase is rc.Phase.PENDING:
            state = rc.step(state, rc.ReplicaPlaced(replica_id=rid, node_id="n0")).state
            rep = state.deployment(NAME).replicas[rid]
        if rep.phase is rc.Phase.STARTING:
            state = rc.step(state, rc.ReplicaReady(replica_id=rid)).state
    return state


def metrics(state: rc.State, now: float, queued: int = 0, per_replica: int = 0) -> rc.Step:
    dep = state.deployment(NAME)
    ongoing = {rid: per_replica for rid, r in dep.replicas.items() if r.phase is rc.Phase.RUNNING}
    return rc.step(state, rc.AutoscalingMetrics(deployment=NAME, now=now, queued=queued, ongoing=ongoing))


def feed(state: rc.State, times: range | list[float], **load: int) -> tuple[rc.State, list[int]]:
    """Metrics at each time (replicas answering at once in between); the target after each."""
    targets = []
    for t in times:
        state = serve_all(metrics(state, float(t), **load).state)
        check_state(state)
        targets.append(state.deployment(NAME).target)
    return state, targets


# ------------------------------------------------------------------ options
def test_the_defaults_are_ray_serves() -> None:
    # ray/serve/config.py AutoscalingConfig (and constants.py DEFAULT_TARGET_ONGOING_REQUESTS = 2)
    auto = AutoscalingOptions()
    assert attrs.asdict(auto) == {
        "autoscaling": False, "min_replicas": 1, "initial_replicas": None, "target_ongoing_requests": 2,
        "upscale_delay_s": 30.0, "downscale_delay_s": 600.0, "downscale_to_zero_delay_s": None,
        "upscaling_factor": None, "downscaling_factor": None, "metrics_interval_s": 10.0,
        "look_back_period_s": 30.0, "aggregation_function": "mean", "burst": False, "policy": None}
    assert rc.DeploymentApplied(name=NAME, num_replicas=1).config.autoscaler == auto
    assert DEFAULT_POLICY == "replica_queue_length_autoscaling_policy"


@pytest.mark.parametrize("options, words", [
    ({"min_replicas": 5, "max_replicas": 4}, "min_replicas=5 is above max_replicas=4"),
    ({"initial_replicas": 1, "min_replicas": 2}, "initial_replicas=1 is below min_replicas=2"),
    ({"initial_replicas": 11}, "initial_replicas=11 is above max_replicas=10"),
    ({"upscale_delay_s": -1.0}, "upscale_delay_s must be a finite number of seconds >= 0"),
    ({"downscale_delay_s": -1.0}, "downscale_delay_s must be a finite number of seconds >= 0"),
    ({"downscale_to_zero_delay_s": -0.5}, "downscale_to_zero_delay_s must be a finite number of seconds >= 0"),
    ({"aggregation_function": "avg"}, "aggregation_function must be one of mean, max, min, got 'avg'"),
    ({"target_ongoing_requests": 0}, "target_ongoing_requests must be a finite number > 0"),
    ({"upscaling_factor": -2.0}, "upscaling_factor must be a finite number > 0"),
    ({"look_back_period_s": 0}, "look_back_period_s must be > 0 seconds"),
    ({"policy": ""}, "policy must be None"),
    ({"gang_size": 4, "min_replicas": 1, "max_replicas": 3, "num_replicas": 0},
     "no whole number of gangs of 4 lies between min_replicas=1 and max_replicas=3"),
    ({"gang_size": 2, "min_replicas": 0, "max_replicas": 1, "num_replicas": 0},
     "max_replicas=1 is below gang_size=2: the autoscaler scales by whole gangs, so this deployment could never "
     "run a replica"),
])
def test_a_bad_value_is_refused_naming_the_deployment_and_the_option(options: dict, words: str) -> None:
    with pytest.raises(rc.InvalidConfig) as exc:
        applied(**options)
    assert f"DeploymentApplied({NAME!r})" in str(exc.value) and words in str(exc.value)


def test_static_placement_is_never_autoscaled() -> None:
    static = rc.StaticPlacement.from_mapping("pg", ["n0", "n1"], {0: [0], 1: [1]})
    with pytest.raises(rc.InvalidConfig, match=r"DeploymentApplied\('m'\): static_placement and autoscaling do not mix"):
        applied(num_replicas=2, static_placement=static)


def test_an_unregistered_policy_is_refused_when_applied() -> None:
    with pytest.raises(rc.InvalidConfig, match=r"DeploymentApplied\('m'\)\.policy='nope' is not registered"):
        deploy(policy="nope")
    # (also when autoscaling is off: a typo would surface only when it is turned on)
    with pytest.raises(rc.InvalidConfig, match="'nope' is not registered"):
        deploy(autoscaling=False, policy="nope")


# ------------------------------------------------------------------ the target a DeploymentApplied leaves
def test_a_new_deployment_starts_at_initial_replicas_else_min_replicas_whatever_num_replicas_says() -> None:
    assert deploy(num_replicas=7, min_replicas=2).deployment(NAME).target == 2
    assert deploy(num_replicas=7, min_replicas=2, initial_replicas=4).deployment(NAME).target == 4
    assert deploy(num_replicas=7, min_replicas=0).deployment(NAME).target == 0


def test_applied_again_it_keeps_the_autoscalers_target_moved_into_the_new_bounds() -> None:
    state = serve_all(deploy(initial_replicas=4))
    step = rc.step(state, applied(num_replicas=1, initial_replicas=4))
    assert step.state.deployment(NAME).target == 4 and not step.commands  # (num_replicas is no target)
    step = rc.step(state, applied(num_replicas=1, max_replicas=3))
    assert step.state.deployment(NAME).target == 3
    assert rc.UpdateWorldSize(deployment=NAME, world_size=3) in step.commands
    off = rc.step(state, applied(num_replicas=6, autoscaling=False)).state.deployment(NAME)
    assert off.target == 6 and off.autoscaler is None


def test_a_person_cannot_scale_an_autoscaled_deployment() -> None:
    state = deploy()
    with pytest.raises(rc.InvalidEvent, match="deployment 'm' is autoscaled"):
        rc.step(state, rc.ScaleRequested(deployment=NAME, num_replicas=3))
    plain = rc.step(state, applied(autoscaling=False)).state
    assert rc.step(plain, rc.ScaleRequested(deployment=NAME, num_replicas=3)).state.deployment(NAME).target == 3


# ------------------------------------------------------------------ the metrics event
def test_metrics_of_an_unknown_or_not_autoscaled_deployment_are_invalid_naming_it() -> None:
    state = rc.step(rc.State(), rc.DeploymentApplied(name="plain", num_replicas=1)).state
    with pytest.raises(rc.InvalidEvent, match="deployment 'plain' is not autoscaled"):
        rc.step(state, rc.AutoscalingMetrics(deployment="plain", now=1.0, queued=1))
    with pytest.raises(rc.InvalidEvent, match="unknown deployment 'ghost'"):
        rc.step(state, rc.AutoscalingMetrics(deployment="ghost", now=1.0))


@pytest.mark.parametrize("fields, words", [
    ({"queued": -1}, "queued must be a non-negative int"),
    ({"ongoing": (("m#0", -1),)}, "holds ('m#0', -1), not a (replica id, int >= 0) pair"),
    ({"ongoing": (("m#0", 1), ("m#0", 2))}, "names 'm#0' twice"),
    ({"ongoing": "m#0"}, "must be (replica id, requests in flight) pairs"),
    ({"now": -1.0}, "now must be a finite number of seconds >= 0"),
])
def test_bad_metrics_are_refused_naming_the_field(fields: dict, words: str) -> None:
    with pytest.raises(rc.InvalidConfig) as exc:
        rc.AutoscalingMetrics(deployment=NAME, **{"now": 1.0, **fields})
    assert words in str(exc.value)


def test_ongoing_reads_from_a_mapping_sorted_and_total_counts_both() -> None:
    e = rc.AutoscalingMetrics(deployment=NAME, now=0.0, queued=2, ongoing={"m#1": 3, "m#0": 1})
    assert e.ongoing == (("m#0", 1), ("m#1", 3)) and e.total == 6


def test_an_older_sample_and_metrics_of_a_deployment_being_deleted_or_gone_are_stale() -> None:
    state = serve_all(deploy())
    state = metrics(state, 10.0, queued=1).state
    old = metrics(state, 5.0, queued=50)
    assert old.stale and old.state.deployment(NAME) == state.deployment(NAME)
    deleting = rc.step(state, rc.DeploymentDeleted(deployment=NAME)).state
    assert metrics(deleting, 20.0, queued=50).stale
    rid = next(iter(deleting.deployment(NAME).replicas))
    gone = rc.step(deleting, rc.ReplicaStopped(replica_id=rid)).state
    assert NAME not in gone.deployments
    assert rc.step(gone, rc.AutoscalingMetrics(deployment=NAME, now=30.0, queued=5)).stale


# ------------------------------------------------------------------ the rule
def test_an_upscale_is_made_once_wanted_without_a_break_for_upscale_delay_s() -> None:
    state = serve_all(deploy(upscale_delay_s=30.0))
    # 1 replica, 8 requests in flight: 8 / 2 = 4 wanted from t=0 on; made at t=30
    _, targets = feed(state, range(0, 41, 10), per_replica=8)
    assert targets == [1, 1, 1, 4, 4]


def test_a_sample_wanting_the_target_as_it_is_breaks_the_wait() -> None:
    state = serve_all(deploy(upscale_delay_s=30.0, look_back_period_s=1.0))
    state, _ = feed(state, [0.0, 10.0], per_replica=8)
    state, _ = feed(state, [20.0], per_replica=2)  # 2 / 2 = 1: as it is
    _, targets = feed(state, [30.0, 40.0, 50.0, 60.0], per_replica=8)
    assert targets == [1, 1, 1, 4]  # counted again from t=30


def test_a_downscale_waits_downscale_delay_s_and_goes_to_zero_only_from_one() -> None:
    state = serve_all(deploy(min_replicas=0, initial_replicas=3, downscale_delay_s=60.0,
                             downscale_to_zero_delay_s=20.0, look_back_period_s=5.0))
    _, targets = feed(state, range(0, 121, 10))
    # nothing wanted from t=0: to 1 at t=60 (not to 0), then 1 -> 0 after its own 20 s
    assert targets == [3, 3, 3, 3, 3, 3, 1, 1, 1, 0, 0, 0, 0]


def test_downscale_to_zero_delay_unset_is_downscale_delay() -> None:
    state = serve_all(deploy(min_replicas=0, initial_replicas=1, downscale_delay_s=30.0, look_back_period_s=5.0))
    _, targets = feed(state, range(0, 41, 10))
    assert targets == [1, 1, 1, 0, 0]


def test_from_zero_requests_waiting_scale_up_at_once_and_are_told_replicas_come() -> None:
    applied_step = rc.step(rc.State(), applied(min_replicas=0, upscale_delay_s=300.0))
    state = applied_step.state
    assert state.deployment(NAME).target == 0
    # at zero it is still "coming" (it may scale up): a request waits instead of failing
    assert rc.PoolComing(deployment=NAME, coming=True) in applied_step.pool
    step = metrics(state, 1.0, queued=1)
    assert step.state.deployment(NAME).target == 1
    assert [type(c) for c in step.commands] == [rc.UpdateWorldSize, rc.StartReplica]
    # deleting it says nothing is coming any more
    deleted = rc.step(step.state, rc.DeploymentDeleted(deployment=NAME))
    assert rc.PoolComing(deployment=NAME, coming=False) in deleted.pool


def test_from_zero_the_upscaling_factor_is_bounded_by_max_replicas() -> None:
    # ray#61731: Ray Serve's cold start took ceil(1 x upscaling_factor) past max_replicas
    assert metrics(deploy(min_replicas=0, upscaling_factor=3.0), 1.0, queued=1).state.deployment(NAME).target == 3
    state = deploy(min_replicas=0, upscaling_factor=3.0, max_replicas=2)
    assert metrics(state, 1.0, queued=1).state.deployment(NAME).target == 2


def test_zero_traffic_at_zero_replicas_stays_at_zero() -> None:
    state = deploy(min_replicas=0, upscaling_factor=4.0, upscale_delay_s=0.0)
    for t in range(0, 600, 10):
        step = metrics(state, float(t))
        state = step.state
        assert state.deployment(NAME).target == 0 and not step.commands


def test_the_first_request_counts_even_under_min_aggregation() -> None:
    state = deploy(min_replicas=0, aggregation_function="min")
    state = metrics(state, 0.0).state
    assert metrics(state, 10.0, queued=1).state.deployment(NAME).target == 1


def test_the_window_is_aggregated_by_its_function_over_look_back_period_s() -> None:
    def after(how: str) -> int:
        state = serve_all(deploy(initial_replicas=2, upscale_delay_s=0.0, downscale_delay_s=0.0,
                                 aggregation_function=how, look_back_period_s=25.0))
        state, _ = feed(state, [0.0], queued=100)  # (left the window by t=30)
        state, _ = feed(state, [10.0, 20.0, 30.0], queued=0)
        state = serve_all(metrics(state, 40.0, queued=0).state)
        state = serve_all(metrics(state, 50.0, queued=12).state)
        return state.deployment(NAME).target
    # window at t=50: totals 0 (t=30), 0 (t=40), 12 (t=50)
    assert after("max") == 6 and after("mean") == 2 and after("min") == 1


def test_the_factors_scale_the_step_and_a_stalled_downscale_still_removes_one() -> None:
    up = AutoscalingOptions(upscaling_factor=0.5, downscaling_factor=0.1)
    assert factored(10.0, 2, up) == 6  # 2 + 0.5 x 8
    assert factored(1.0, 4, up) == 3  # ceil(4 - 0.3) = 4: stalled, one removed
    assert factored(3.2, 2, AutoscalingOptions()) == 4


def test_a_gang_deployment_scales_by_whole_gangs() -> None:
    state = serve_all(deploy(num_replicas=0, gang_size=2, min_replicas=1, upscale_delay_s=0.0))
    assert state.deployment(NAME).target == 2  # min 1, rounded up to a gang
    _, targets = feed(state, [0.0], per_replica=3)  # 6 / 2 = 3 wanted: two gangs
    assert targets == [4]


def test_a_downscale_stops_not_yet_serving_replicas_first_then_the_highest_ranks() -> None:
    state = serve_all(deploy(initial_replicas=4, downscale_delay_s=0.0, look_back_period_s=1.0))
    state = rc.step(state, rc.ReplicaCrashed(replica_id="m#1")).state  # its replacement is not serving yet
    starting = [rid for rid, r in state.deployment(NAME).replicas.items() if r.phase is not rc.Phase.RUNNING]
    step = metrics(state, 1.0, per_replica=1)  # 3 running x 1 / 2: 2 wanted
    stopped = [c.replica_id for c in step.commands if isinstance(c, rc.StopReplica)]
    assert step.state.deployment(NAME).target == 2
    assert stopped == [*starting, "m#3"]


# ------------------------------------------------------------------ custom policies
def test_a_registered_policy_decides_and_the_delays_factors_and_bounds_apply_after_it() -> None:
    seen: list[rc.PolicyContext] = []

    def wants_seven(ctx: rc.PolicyContext) -> int:
        seen.append(ctx)
        return 7

    rc.register_policy("test-seven", wants_seven, replace=True)
    state = serve_all(deploy(policy="test-seven", max_replicas=5, upscale_delay_s=20.0, upscaling_factor=0.5))
    _, targets = feed(state, [0.0, 10.0, 20.0], queued=3)
    assert targets == [1, 1, 4]  # ceil(1 + 0.5 x 6) = 4 <= 5, once wanted for 20 s
    ctx = seen[0]
    assert (ctx.deployment, ctx.now, ctx.target, ctx.running, ctx.total_requests, ctx.queued) == (NAME, 0.0, 1, 1, 3.0, 3)
    assert (ctx.min_replicas, ctx.max_replicas, ctx.options.policy) == (1, 5, "test-seven")


def test_a_policy_name_is_not_taken_twice_and_a_bad_answer_is_refused_naming_it() -> None:
    def one(ctx: rc.PolicyContext) -> int:
        return 1

    rc.register_policy("test-one", one, replace=True)
    rc.register_policy("test-one", one)  # (the same function again: fine)
    with pytest.raises(rc.InvalidConfig, match="'test-one'\\): that name is taken"):
        rc.register_policy("test-one", lambda ctx: 2)
    with pytest.raises(rc.InvalidConfig, match="that name is taken"):
        rc.register_policy(DEFAULT_POLICY, one, replace=True)
    rc.register_policy("test-bad", lambda ctx: float("nan"), replace=True)
    state = serve_all(deploy(policy="test-bad"))
    with pytest.raises(rc.InvalidConfig, match="policy 'test-bad' of 'm' returned nan"):
        metrics(state, 0.0, queued=1)


# ------------------------------------------------------------------ burst mode
def test_burst_mode_scales_up_at_once_and_not_down_within_a_window() -> None:
    opts = {"upscale_delay_s": 300.0, "downscale_delay_s": 0.0, "look_back_period_s": 30.0, "burst": True}
    state = serve_all(deploy(**opts))
    state, _ = feed(state, [0.0], per_replica=2)  # at target: no burst
    state, targets = feed(state, [10.0], queued=10, per_replica=2)  # 12 / 2 = 6 >= 2 x 1 running
    # the burst window (the last 3 s) wants 6, more than the whole window's mean (2 and 12: 4)
    assert targets == [6] and state.deployment(NAME).autoscaler.burst_since == 10.0
    _, targets = feed(state, [20.0, 30.0, 39.0, 40.0], queued=0, per_replica=0)
    # no downscale until a window after the burst's last sample; then the window's mean (12, 0, 0, 0, 0) / 2
    assert targets == [6, 6, 6, 2]
    without = serve_all(deploy(**{**opts, "burst": False}))
    _, targets = feed(without, [0.0, 10.0], queued=10, per_replica=2)
    assert targets == [1, 1]  # (Ray Serve's rule: the upscale delay)


# ------------------------------------------------------------------ the autoscaler's state
def test_the_target_survives_a_controller_restart_and_the_window_starts_empty() -> None:
    state = serve_all(deploy(upscale_delay_s=0.0))
    state, targets = feed(state, [0.0], per_replica=6)
    assert targets == [3] and state.deployment(NAME).autoscaler.window
    spec = rc.query.desired_specs(state)[0]
    assert spec.num_replicas == 3 and spec.autoscaling
    check_recovery_roundtrip(state)
    recovered = rc.step(rc.State(), reports_from(state)).state.deployment(NAME)
    assert recovered.target == 3 and recovered.autoscaler is None


def test_the_state_pickles_and_a_step_is_deterministic() -> None:
    state = serve_all(deploy(upscale_delay_s=10.0))
    state, _ = feed(state, [0.0, 5.0], per_replica=5)
    again = pickle.loads(pickle.dumps(state))
    a, b = metrics(state, 10.0, per_replica=5), metrics(again, 10.0, per_replica=5)
    assert a.commands == b.commands and a.state.deployment(NAME).autoscaler == b.state.deployment(NAME).autoscaler


def test_without_factors_the_step_does_not_depend_on_how_many_run() -> None:
    # Ray Serve's ceil(running + 1 x (desired - running)) rounds 21 / 0.7 = 30.000000000000004 to 30
    # or 31 as running changes: a constant load would flap the target by one
    auto = AutoscalingOptions(target_ongoing_requests=0.7)
    assert {factored(21 / 0.7, running, auto) for running in range(300)} == {31}


def test_a_downscale_a_factor_stalls_removes_a_whole_gang() -> None:
    # found by tests/property/test_autoscaling.py: "removes one" was rounded back up to the gang
    state = serve_all(deploy(num_replicas=0, gang_size=2, min_replicas=0, initial_replicas=4, downscaling_factor=0.3,
                             downscale_delay_s=0.0, look_back_period_s=1.0))
    _, targets = feed(state, range(0, 50, 10))
    assert targets == [2, 0, 0, 0, 0]


def test_a_gang_deployment_at_its_rounded_want_stays() -> None:
    # found by tests/property/test_autoscaling.py: 5 requests / 2 = 2.5 -> 3 -> two gangs (4), then
    # with 4 running "3 < 4" read as a stalled downscale and took it back to 2, and up again
    state = serve_all(deploy(num_replicas=0, gang_size=2, min_replicas=0, initial_replicas=2, upscale_delay_s=0.0,
                             downscale_delay_s=0.0, look_back_period_s=1.0))
    _, targets = feed(state, [0.0, 10.0, 20.0, 30.0], queued=5)
    assert targets == [4, 4, 4, 4]



class _Stepper:
    """Steps the core from an empty state, checking every state it reaches."""

    def __init__(self) -> None:
        self.state = rc.State()

    def __call__(self, event: rc.Event) -> list:
        result = rc.step(self.state, event)
        check_state(result.state)
        self.state = result.state
        return list(result.commands)


def test_a_scale_up_loads_the_warm_copy_an_eviction_left_before_a_cold_start():
    """Tiers (issue 21) under the autoscaler: a replica evicted to the CPU cache leaves its model
    WARM; the autoscaler's downscale takes the replacement still waiting for room (not serving
    yet) first; once room comes back, its next scale-up places the new replica on the WARM copy
    (``source="warm"``), not on the freer node from disk."""
    g = 10**9
    step = _Stepper()

    step(rc.NodeJoined(node_id="n0", resources={"GPU": 1, "CPU": 8}, devices=(80 * g,), cpu_cache_bytes=200 * g,
                       order=1))
    step(rc.NodeJoined(node_id="n1", resources={"GPU": 1, "CPU": 8}, devices=(80 * g,), order=2))
    step(rc.DeploymentApplied(name="a", num_replicas=0, resources={"GPU": 1}, model_bytes=50 * g,
                              min_deployment_time_s=0.0, autoscaling=True, min_replicas=1, max_replicas=2,
                              initial_replicas=2, upscale_delay_s=0, downscale_delay_s=0, look_back_period_s=1))
    for rid in ("a#0", "a#1"):
        step(rc.ReplicaPlaced(replica_id=rid, node_id=step.state.deployment("a").replicas[rid].node_id))
        step(rc.ReplicaReady(replica_id=rid))
    evicted = step(rc.DeploymentApplied(name="b", num_replicas=1, resources={"GPU": 1}, model_bytes=60 * g,
                                        min_deployment_time_s=0.0, dedicated=True))
    (evict,) = [c for c in evicted if isinstance(c, rc.EvictReplica)]
    assert (evict.replica_id, evict.node_id, evict.to) == ("a#0", "n0", "warm")
    step(rc.ReplicaStopped(replica_id="a#0"))
    waiting = [rid for rid, r in step.state.deployment("a").replicas.items() if r.phase is rc.Phase.PENDING]
    assert waiting == ["a#3"]  # (the eviction's replacement, waiting for room)
    down = step(rc.AutoscalingMetrics(deployment="a", now=5.0, ongoing={"a#1": 1}))
    assert [c.replica_id for c in down if isinstance(c, rc.StopReplica)] == ["a#3"]  # not serving: first
    assert [e.replica_id for e in step.state.cluster.caches["n0"]] == ["a#0"]
    step(rc.DeploymentDeleted(deployment="b"))
    step(rc.ReplicaStopped(replica_id="b#2"))
    step(rc.NodeJoined(node_id="n2", resources={"GPU": 1, "CPU": 8}, devices=(80 * g,), order=0))  # empty, first
    up = step(rc.AutoscalingMetrics(deployment="a", now=10.0, queued=4, ongoing={"a#1": 3}))
    (place,) = [c for c in up if isinstance(c, rc.PlaceReplica)]
    assert (place.node_id, place.source) == ("n0", "warm")  # not n2: empty too, first in order, from disk
    assert step.state.cluster.caches["n0"] == ()


def test_applied_again_with_a_shorter_look_back_the_window_drops_the_older_samples():
    """Found by the shared property machine: the window kept samples older than the new
    look_back_period_s (a sample 20 s old aggregated into a 5 s window; check_state refused it)."""
    state = serve_all(deploy(look_back_period_s=30.0, min_replicas=1))
    for t in (0.0, 10.0, 20.0):
        state = metrics(state, t, per_replica=2).state
    state = rc.step(state, applied(look_back_period_s=5.0, min_replicas=1)).state
    check_state(state)
    assert [t for t, _, _ in state.deployment(NAME).autoscaler.window] == [20.0]


def test_a_downscale_victim_of_a_tiered_deployment_is_stopped_and_leaves_no_warm_copy():
    """The chosen rule (docs/autoscaling.md, docs/tiers.md "Scaled down, not evicted"): a replica the
    autoscaler takes away is stopped (``StopReplica``), never evicted to the CPU cache, even with room
    in the cache; its weights are dropped, and the scale from zero that follows loads from disk
    (``source="cold"``). NDIF caches a model pushed out by another's demand only, and Ray Serve
    keeps nothing of a downscaled replica."""
    g = 10**9
    step = _Stepper()

    step(rc.NodeJoined(node_id="n0", resources={"GPU": 2, "CPU": 8}, devices=(80 * g, 80 * g),
                       cpu_cache_bytes=200 * g, order=1))
    step(rc.DeploymentApplied(name="a", num_replicas=0, resources={"GPU": 1}, model_bytes=50 * g,
                              min_deployment_time_s=0.0, autoscaling=True, min_replicas=0, max_replicas=2,
                              initial_replicas=2, upscale_delay_s=0, downscale_delay_s=0,
                              downscale_to_zero_delay_s=0, look_back_period_s=1))
    for rid in ("a#0", "a#1"):
        step(rc.ReplicaPlaced(replica_id=rid, node_id="n0"))
        step(rc.ReplicaReady(replica_id=rid))
    stops: list[str] = []
    for now in (5.0, 6.0):  # idle: down to 1 (the highest rank goes), then to 0
        running = {rid: 0 for rid in step.state.deployment("a").replicas}
        down = step(rc.AutoscalingMetrics(deployment="a", now=now, ongoing=running))
        assert not [c for c in down if isinstance(c, (rc.EvictReplica, rc.DropWarmCopy))]  # not evicted to WARM
        for c in down:
            if isinstance(c, rc.StopReplica):
                stops.append(c.replica_id)
                step(rc.ReplicaStopped(replica_id=c.replica_id))
    assert stops == ["a#1", "a#0"]
    assert len(step.state.deployment("a").replicas) == 0
    assert step.state.cluster.caches.get("n0", ()) == ()  # no WARM copy kept in the node's cache
    up = step(rc.AutoscalingMetrics(deployment="a", now=10.0, queued=1, ongoing={}))
    (place,) = [c for c in up if isinstance(c, rc.PlaceReplica)]
    assert (place.node_id, place.source) == ("n0", "cold")  # from disk: nothing was cached

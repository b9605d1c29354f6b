"""Tests added for mutmut's survivors in rankcore/control/autoscaling.py (issue 36, `make mutate`;
docs/testing.md names each survivor and what killed it, or why it is equivalent).

Each test states a behaviour the module promises (its docstring, a caller's need), not a
mutant's text.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import rankcore as rc
from rankcore.base.options import AutoscalingOptions
from rankcore.control import autoscaling
from rankcore.control.autoscaling import DEFAULT_POLICY, factored

NAME = "m"


def _one(ctx: rc.PolicyContext) -> int:
    return 1


@pytest.fixture
def registry() -> Iterator[dict]:
    """The process's policy registry, left as it was found (the tests register names of their own)."""
    saved = dict(autoscaling._POLICIES)
    yield autoscaling._POLICIES
    autoscaling._POLICIES.clear()
    autoscaling._POLICIES.update(saved)


# ------------------------------------------------------------------ register_policy
@pytest.mark.parametrize("name, shown", [(7, "7"), ("", "''"), (None, "None"), (b"p", "b'p'")])
def test_a_policy_name_that_is_not_a_non_empty_str_is_refused_showing_it(registry: dict, name: object,
                                                                          shown: str) -> None:
    """Kills ``register_policy__mutmut_2`` (``and`` for ``or``: a non-str name was registered),
    ``_5`` (no message) and ``_6`` (the message showed None, not the name given)."""
    with pytest.raises(rc.InvalidConfig) as caught:
        rc.register_policy(name, _one)  # type: ignore[arg-type]
    assert str(caught.value) == f"register_policy: the name must be a non-empty str, got {shown}"
    assert name not in registry


def test_a_policy_that_is_not_callable_is_refused_naming_the_policy_and_showing_it(registry: dict) -> None:
    """Kills ``register_policy__mutmut_9`` (no message) and ``_10`` (None shown, not the value)."""
    with pytest.raises(rc.InvalidConfig) as caught:
        rc.register_policy("test-not-callable", 42)  # type: ignore[arg-type]
    assert str(caught.value) == "register_policy('test-not-callable'): the policy must be callable, got 42"
    assert "test-not-callable" not in registry


def test_a_name_never_registered_is_taken_without_replace(registry: dict) -> None:
    """The first registration of a name needs no ``replace`` (only another function under a
    taken name does). Kills ``register_policy__mutmut_15`` and ``_17`` (a name not yet in the
    registry read as taken by some other function)."""
    assert "test-fresh-name" not in registry
    rc.register_policy("test-fresh-name", _one)
    assert autoscaling.policy("test-fresh-name") is _one
    with pytest.raises(rc.InvalidConfig, match="that name is taken"):
        rc.register_policy(DEFAULT_POLICY, _one)


# ------------------------------------------------------------------ delayed
def _deploy(**options: object) -> rc.State:
    base: dict[str, object] = {"autoscaling": True, "max_replicas": 10, "look_back_period_s": 1.0}
    state = rc.step(rc.State(), rc.DeploymentApplied(name=NAME, num_replicas=1, **{**base, **options})).state
    for rid in sorted(state.deployment(NAME).replicas):
        state = rc.step(state, rc.ReplicaPlaced(replica_id=rid, node_id="n0")).state
        state = rc.step(state, rc.ReplicaReady(replica_id=rid)).state
    return state


def test_a_change_of_direction_starts_its_own_delay_from_the_sample_that_turned() -> None:
    """``delayed``: a change is made once it has been wanted *that way* without a break for its
    delay. Upscale wanted from t=0 (never long enough: its delay is 1,000 s), then downscale
    wanted from t=500: the downscale's 100 s count from t=500, not from the upscale's t=0 (it is
    not made at t=510, it is at t=600). Kills ``delayed__mutmut_19`` (``or`` for ``and``: the
    other direction's start kept)."""
    state = _deploy(initial_replicas=3, min_replicas=1, upscale_delay_s=1000.0, downscale_delay_s=100.0)
    dep = state.deployment(NAME)
    assert dep.target == 3

    def sample(state: rc.State, now: float, per_replica: int) -> rc.State:
        ongoing = {rid: per_replica for rid, r in state.deployment(NAME).replicas.items()
                   if r.phase is rc.Phase.RUNNING}
        return rc.step(state, rc.AutoscalingMetrics(deployment=NAME, now=now, queued=0, ongoing=ongoing)).state

    state = sample(state, 0.0, 8)  # 24 in flight / 2 a replica: 12 wanted (up)
    state = sample(state, 490.0, 8)
    assert state.deployment(NAME).target == 3
    state = sample(state, 500.0, 0)  # nothing in flight: down from here
    state = sample(state, 510.0, 0)
    assert state.deployment(NAME).target == 3, "a downscale made 10 s after it was first wanted"
    state = sample(state, 600.0, 0)
    assert state.deployment(NAME).target == 1


def _sample(state: rc.State, now: float, queued: int = 0, per_replica: int = 0) -> rc.State:
    ongoing = {rid: per_replica for rid, r in state.deployment(NAME).replicas.items() if r.phase is rc.Phase.RUNNING}
    return rc.step(state, rc.AutoscalingMetrics(deployment=NAME, now=now, queued=queued, ongoing=ongoing)).state


def test_the_burst_window_includes_the_sample_on_its_start() -> None:
    """``burst``: the burst window is the last ``BURST_WINDOW`` (0.1) of ``look_back_period_s``,
    its start included. With a 10 s look-back it is the last 1 s: at t=10 it holds the samples of
    t=9 (nothing in flight) and t=10 (5 queued): a mean of 2.5 requests, 1.25 replicas wanted,
    under twice the one running: no burst (alone, t=10's 5 would be one). Kills ``burst__mutmut_4``
    (``>`` for ``>=``: the sample on the start left out)."""
    state = _deploy(burst=True, upscale_delay_s=300.0, look_back_period_s=10.0)
    state = _sample(state, 9.0)
    state = _sample(state, 10.0, queued=5)
    dep = state.deployment(NAME)
    assert dep.autoscaler.burst_since is None and dep.target == 1
    # (the same load alone in the burst window is a burst: the test can tell the two apart)
    state = _sample(state, 11.5, queued=5)
    assert state.deployment(NAME).autoscaler.burst_since == 11.5 and state.deployment(NAME).target > 1


def test_burst_mode_is_entered_at_twice_the_running_replicas_and_left_a_window_after() -> None:
    """``burst``: load in the burst window wanting ``BURST_THRESHOLD`` (2) x the running replicas
    enters burst mode, at exactly 2x too; 1.5x of two running does not; a whole look-back after its
    last such sample the mode ends and the state says so (``burst_since`` None). Kills
    ``burst__mutmut_12`` (``>``: exactly 2x not a burst), ``burst__mutmut_13`` (2 / running: 1.5x of
    two running read as a burst) and ``burst__mutmut_36`` (the end not recorded)."""
    one = _deploy(burst=True, upscale_delay_s=300.0, downscale_delay_s=300.0, look_back_period_s=10.0)
    at_two = _sample(one, 0.0, queued=4)  # 4 / 2 = 2 replicas wanted, one running: exactly 2x
    assert at_two.deployment(NAME).autoscaler.burst_since == 0.0 and at_two.deployment(NAME).target == 2

    two = _deploy(burst=True, upscale_delay_s=300.0, downscale_delay_s=300.0, look_back_period_s=10.0,
                  initial_replicas=2, min_replicas=2)
    calm = _sample(two, 0.0, queued=6)  # 3 wanted, two running: 1.5x
    assert calm.deployment(NAME).autoscaler.burst_since is None and calm.deployment(NAME).target == 2

    later = _sample(at_two, 5.0)  # within a window of the burst's last sample: still in it
    assert later.deployment(NAME).autoscaler.burst_since == 0.0
    ended = _sample(later, 10.0)
    assert ended.deployment(NAME).autoscaler.burst_since is None


def test_a_burst_upscale_ends_the_wait_for_an_upscale_in_the_state() -> None:
    """The autoscaler's state says which way a change has been wanted without a break and since
    when (``Autoscaler.wanted``/``since``, 0/None: none). An upscale wanted, then made at once by a
    burst: nothing is wanted any more, both fields say so. Kills ``burst__mutmut_62`` (``wanted``
    left at 1 beside ``since`` None)."""
    state = _deploy(burst=True, upscale_delay_s=300.0, look_back_period_s=10.0, initial_replicas=2, min_replicas=1)
    state = _sample(state, 0.0, per_replica=3)  # 6 / 2 = 3 wanted of 2 running: an upscale to wait for
    auto = state.deployment(NAME).autoscaler
    assert (auto.wanted, auto.since, auto.burst_since) == (1, 0.0, None)
    state = _sample(state, 5.0, per_replica=4, queued=2)  # the last second: 10 / 2 = 5 >= 2 x 2: a burst
    dep = state.deployment(NAME)
    assert dep.target == 5 and (dep.autoscaler.wanted, dep.autoscaler.since, dep.autoscaler.burst_since) == (0, None, 5.0)


def test_an_unregistered_policy_is_refused_listing_those_registered(registry: dict) -> None:
    """The refusal names the policy and lists the registered ones, sorted, comma-separated.
    Kills ``policy__mutmut_9`` (the list's separator)."""
    registry.clear()
    registry.update({DEFAULT_POLICY: _one, "test-a": _one})
    with pytest.raises(rc.InvalidConfig) as caught:
        autoscaling.policy("test-none")
    assert str(caught.value) == ("policy='test-none' is not registered in this process (rankcore.register_policy; "
                                 f"registered: {DEFAULT_POLICY}, test-a)")


# ------------------------------------------------------------------ factored
def test_a_downscale_takes_the_downscaling_factor_and_an_upscale_the_upscaling_one() -> None:
    """``factored``: the step towards ``desired`` times the factor of its direction. Kills
    ``factored__mutmut_7`` (the upscaling factor for a downscale too) and ``factored__mutmut_9``
    (an upscale by less than one replica taking the downscaling factor)."""
    both = AutoscalingOptions(upscaling_factor=2.0, downscaling_factor=0.5)
    assert factored(1.0, 4, both) == 3  # ceil(4 - 0.5 x 3)
    assert factored(2.5, 2, AutoscalingOptions(upscaling_factor=3.0)) == 4  # ceil(2 + 3 x 0.5)


def test_a_factor_never_takes_it_to_zero_while_requests_are_there() -> None:
    """A downscaling factor over 1 can overshoot below zero; while any request is there
    (``desired`` > 0, even a fraction of a replica's) at least one replica stays; with none, zero.
    Kills ``factored__mutmut_37`` (always zero) and ``factored__mutmut_41`` (a fraction of one
    replica's load counted as none)."""
    steep = AutoscalingOptions(downscaling_factor=1.5)
    assert factored(0.1, 4, steep) == 1  # ceil(4 - 1.5 x 3.9) = -1
    assert factored(0.0, 4, steep) == 0


def test_replicas_being_reconfigured_count_as_running() -> None:
    """``running``: the replicas serving now, those being told a new config or rank included (Ray
    Serve's ``running``). Two replicas, one reconfiguring after a user_config change (one at a time:
    ``max_unavailable``): two running, as many as before the change. Kills ``running__mutmut_1``
    (reconfiguring ones subtracted)."""
    state = _deploy(initial_replicas=2, min_replicas=2, user_config={"a": 1})
    before = autoscaling.running(state.deployment(NAME))
    state = rc.step(state, rc.DeploymentApplied(name=NAME, num_replicas=1, autoscaling=True, max_replicas=10,
                                                min_replicas=2, initial_replicas=2, look_back_period_s=1.0,
                                                user_config={"a": 2})).state
    dep = state.deployment(NAME)
    assert dep.count(rc.Phase.RECONFIGURING) == 1
    assert before == autoscaling.running(dep) == 2


# ------------------------------------------------------------------ observe
def test_with_none_running_load_still_in_the_window_scales_up_at_once() -> None:
    """``cold_start`` (via ``observe``): with no replica running, the window's load (not only the
    newest sample's) decides whether requests wait. One replica had a call in flight, then
    crashed; the next sample sees nothing (none runs to hold a call) but the window still holds
    the load: scaled at once to ceil(upscaling_factor). Kills ``observe__mutmut_34`` (the
    window's total not passed: only the newest sample read)."""
    state = _deploy(min_replicas=1, upscaling_factor=3.0, upscale_delay_s=300.0, look_back_period_s=10.0)
    state = _sample(state, 0.0, per_replica=1)  # 1 in flight: 0.5 replicas wanted, target 1 kept
    assert state.deployment(NAME).target == 1
    (rid,) = state.deployment(NAME).replicas
    state = rc.step(state, rc.ReplicaCrashed(replica_id=rid, reason="test")).state
    assert autoscaling.running(state.deployment(NAME)) == 0
    state = _sample(state, 1.0)
    assert state.deployment(NAME).target == 3


def test_a_cold_start_sample_stays_in_the_window_and_each_sample_is_no_stale_step() -> None:
    """``observe`` keeps every sample in the autoscaler's window (a cold start's too: the next
    decisions aggregate it) and answers True (the step is not stale) for a sample it took; an
    older one is stale. Kills ``observe__mutmut_41`` (a cold start dropped the autoscaler's
    state) and ``observe__mutmut_120`` (every sample called stale)."""
    state = _deploy(min_replicas=0, initial_replicas=0, look_back_period_s=10.0)
    assert state.deployment(NAME).target == 0
    step = rc.step(state, rc.AutoscalingMetrics(deployment=NAME, now=5.0, queued=2, ongoing={}))
    dep = step.state.deployment(NAME)
    assert not step.stale and dep.target >= 1
    assert dep.autoscaler is not None and dep.autoscaler.window == ((5.0, 2, 0),)
    older = rc.step(step.state, rc.AutoscalingMetrics(deployment=NAME, now=4.0, queued=2, ongoing={}))
    assert older.stale


def test_a_policy_is_given_the_samples_calls_in_flight_per_replica(registry: dict) -> None:
    """``PolicyContext.ongoing``: the sample's calls in flight per replica, as sent (sorted
    pairs). Kills ``observe__mutmut_60`` (None given)."""
    seen: list = []

    def spy(ctx: rc.PolicyContext) -> int:
        seen.append(ctx.ongoing)
        return ctx.target

    rc.register_policy("test-spy", spy, replace=True)
    state = _deploy(policy="test-spy", initial_replicas=2, min_replicas=1)
    ids = sorted(state.deployment(NAME).replicas)
    rc.step(state, rc.AutoscalingMetrics(deployment=NAME, now=0.0, queued=0, ongoing={ids[1]: 3, ids[0]: 1}))
    assert seen == [((ids[0], 1), (ids[1], 3))]


# ------------------------------------------------------------------ observe
def test_a_sample_taken_at_the_newest_samples_time_is_taken_and_an_older_one_is_not() -> None:
    """``observe``: a sample older than the window's newest changes nothing; one at the same time
    (two handles reporting at one instant) is taken. Kills ``observe__mutmut_8`` (``<=``: the
    second sample of an instant dropped)."""
    state = _sample(_deploy(), 5.0)
    state = _sample(state, 5.0, queued=3)
    assert state.deployment(NAME).autoscaler.window[-2:] == ((5.0, 0, 0), (5.0, 3, 0))
    older = _sample(state, 4.0, queued=9)
    assert older.deployment(NAME).autoscaler == state.deployment(NAME).autoscaler


def test_a_cold_start_forgets_what_was_wanted_before_so_a_later_downscale_waits_its_whole_delay() -> None:
    """``observe``: with no replica running, requests scale up at once (the cold start), which is
    no decision of the policy's: what was wanted before, and since when, is forgotten. A downscale
    wanted at t=0 (delay 100 s) is broken by the cold start at t=10; wanted again from t=20, it is
    made at t=120, not at t=105. Kills ``observe__mutmut_45`` (the direction kept) and ``_46`` (its
    start kept)."""
    state = _deploy(initial_replicas=2, min_replicas=1, downscale_delay_s=100.0, upscale_delay_s=0.0)
    state = _sample(state, 0.0)  # nothing in flight: down wanted from t=0
    assert (state.deployment(NAME).autoscaler.wanted, state.deployment(NAME).autoscaler.since) == (-1, 0.0)
    for rid in sorted(state.deployment(NAME).replicas):
        state = rc.step(state, rc.ReplicaCrashed(replica_id=rid, cause="error", now=1.0)).state
    state = _sample(state, 10.0, queued=3)  # none running: the cold start
    auto = state.deployment(NAME).autoscaler
    assert (auto.wanted, auto.since) == (0, None) and state.deployment(NAME).target == 2
    for rid in sorted(state.deployment(NAME).replicas):
        state = rc.step(state, rc.ReplicaPlaced(replica_id=rid, node_id="n0", now=11.0)).state
        state = rc.step(state, rc.ReplicaReady(replica_id=rid)).state
    state = _sample(state, 20.0)
    state = _sample(state, 105.0)
    assert state.deployment(NAME).target == 2, "a downscale counted from before the cold start"
    state = _sample(state, 120.0)
    assert state.deployment(NAME).target == 1

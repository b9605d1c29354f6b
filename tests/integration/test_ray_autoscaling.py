"""Autoscaling on Ray (issue 23): the routers push their load, the controller feeds the core's
autoscaler one ``AutoscalingMetrics`` per ``metrics_interval_s``, and the target follows it.
``@deployment(autoscaling_config={...})`` as Ray Serve users write it."""

from __future__ import annotations

import time

import pytest

import rankcore as rc
from executors.ray_gpu import deployment, get_controller, run
from executors.ray_gpu.api.deployments import ask

pytestmark = pytest.mark.usefixtures("local_ray")
OPTS = {"num_cpus": 0.25}  # (a local Ray of 4 CPUs)
KNOBS = {"max_replicas": 4, "target_ongoing_requests": 1, "upscale_delay_s": 1, "downscale_delay_s": 3,
         "metrics_interval_s": 0.5, "look_back_period_s": 1.5}


@pytest.fixture(autouse=True)
def clean():
    yield
    ask(get_controller(), "reset")


class Slow:
    def __call__(self, seconds: float) -> str:
        time.sleep(seconds)
        return "ok"


def _status(name: str) -> dict:
    return ask(get_controller(), "deployment_status", name)


def _wait(name: str, pred, timeout: float) -> tuple[dict, float]:
    t0 = time.monotonic()
    while time.monotonic() < t0 + timeout:
        st = _status(name)
        if pred(st):
            return st, time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"{name}: not reached in {timeout} s: {_status(name)}")


def _serving(st: dict) -> int:
    return sum(1 for r in st["replicas"].values() if r["phase"] == rc.Phase.RUNNING.value)


def test_a_burst_scales_up_all_answered_and_idle_it_comes_back_to_min():
    d = deployment(Slow, name="auto", ray_actor_options=OPTS, max_ongoing_requests=2,
                   autoscaling_config={"min_replicas": 1, **KNOBS})
    h = run(d.bind(), timeout=120)
    assert _status("auto")["target"] == 1
    with pytest.raises(rc.InvalidEvent, match="autoscaled"):
        h.scale(3)
    # load kept at 8 calls of 1 s (4 x target at 1 replica, 2 at a time) until a second replica
    # serves (bounded): how soon it starts depends on the machine's load, not on the autoscaler
    calls: list = []
    t0, up = time.monotonic(), None
    while time.monotonic() < t0 + 45:
        calls += [h.remote(1.0) for _ in range(8 - sum(1 for c in calls if not c.future.done()))]
        st = _status("auto")
        if up is None and st["target"] > 1:
            up = time.monotonic() - t0
        if _serving(st) >= 2:
            break
        time.sleep(0.2)
    assert up is not None and up < 10, f"no scale-up within 10 s: {st}"
    assert _serving(st) >= 2, f"no second replica serving within 45 s: {st}"
    assert [c.result(timeout=60) for c in calls] == ["ok"] * len(calls)  # all answered, none failed
    st, _ = _wait("auto", lambda s: s["target"] == 1 and len(s["replicas"]) == 1, timeout=30)
    assert st["failed"] == [] and st["healthy"]
    assert ask(get_controller(), "state_errors") == []


def test_min_replicas_zero_scales_to_zero_and_a_new_call_waits_and_is_answered():
    d = deployment(Slow, name="zero", ray_actor_options=OPTS,
                   autoscaling_config={"min_replicas": 0, "initial_replicas": 1, **KNOBS})
    h = run(d.bind(), timeout=120)
    assert h.remote(0.1).result(timeout=30) == "ok"
    _wait("zero", lambda s: s["target"] == 0 and not s["replicas"], timeout=30)
    t0 = time.monotonic()
    assert h.remote(0.1).result(timeout=60) == "ok"  # waited in the queue while a replica started
    assert time.monotonic() - t0 < 60
    assert _status("zero")["target"] >= 1
    assert ask(get_controller(), "state_errors") == []


def test_autoscaling_config_unknown_key_and_count_beside_it_are_refused_at_the_decorator():
    with pytest.raises(rc.InvalidConfig, match="smoothing_factor"):
        deployment(autoscaling_config={"smoothing_factor": 1.0})
    with pytest.raises(rc.InvalidConfig, match="do not mix"):
        deployment(num_replicas=2, autoscaling_config={"max_replicas": 3})
    auto = deployment(num_replicas="auto")(Slow)
    assert auto.max_replicas == 100 and auto.core_options["autoscaling"] is True
    assert auto.core_options["target_ongoing_requests"] == 2.0 and auto.num_replicas == 1


def test_a_controller_restart_pauses_autoscaling_keeps_its_target_and_it_resumes():
    """The issue: while the controller is down autoscaling pauses and calls keep flowing; after
    recovery the autoscaled target is the one decided before (persisted), and it resumes from fresh
    metrics (idle, it comes back to min)."""
    import ray

    d = deployment(Slow, name="restart", ray_actor_options=OPTS, max_ongoing_requests=2,
                   autoscaling_config={"min_replicas": 1, **KNOBS, "downscale_delay_s": 8})
    h = run(d.bind(), timeout=120)
    calls: list = []
    t0 = time.monotonic()
    while time.monotonic() < t0 + 45:  # (load until a second replica serves, as above)
        calls += [h.remote(1.0) for _ in range(8 - sum(1 for c in calls if not c.future.done()))]
        st = _status("restart")
        if _serving(st) >= 2:
            break
        time.sleep(0.2)
    decided = st["target"]
    assert decided >= 2, f"no scale-up before the restart: {st}"
    from executors.ray_gpu.base.persist import load_specs

    assert load_specs()["restart"]["applied"].num_replicas == decided  # (what a restarted core rebuilds)
    ray.kill(get_controller(), no_restart=False)
    during = [h.remote(0.2) for _ in range(6)]  # routed by the handle while the controller is down
    assert [c.result(timeout=60) for c in during] == ["ok"] * 6
    assert ask(get_controller(), "wait_healthy", "restart", 60, timeout=90)
    assert _status("restart")["target"] >= min(decided, 2)  # (persisted: not back to initial 1 at once)
    assert [c.result(timeout=60) for c in calls] == ["ok"] * len(calls)
    st, _ = _wait("restart", lambda s: s["target"] == 1 and len(s["replicas"]) == 1, timeout=45)
    assert st["failed"] == []
    assert ask(get_controller(), "state_errors") == []

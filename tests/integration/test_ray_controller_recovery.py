"""A controller that crashes while replicas are starting adopts them on
recovery (same id, same rank, same process): their start is not begun again.
Each path of a start under way: waiting for its placement group, running the
user's ``__init__``; the actor created but not initialised is the scenario
test's (controller-crash-during-scale-up.yaml in test_ray_scenarios.py)."""

from __future__ import annotations

import json
import time

import pytest
import ray

from executors.checktrace import check_trace_lines
from executors.ray_gpu import deployment, get_controller, get_replica_context
from executors.ray_gpu.api.deployments import ask
from executors.ray_gpu.control.controller import NAMESPACE, actor_name
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.usefixtures("local_ray")


def apply(d) -> None:
    """Deploy without waiting until healthy (run() would)."""
    ask(get_controller(), "apply", d.name, d.num_replicas, d.user_config, d.cls, (), {}, d.ray_actor_options,
        d.max_ongoing_requests, d.placement)


def crash_controller() -> str:
    """Kill the controller the way the scenario runner does; the trace it had."""
    ctl = get_controller()
    text = ask(ctl, "halt")
    ray.kill(ctl, no_restart=False)
    time.sleep(0.5)
    return text


def starts(text: str) -> list[str]:
    return [json.loads(line)["replica"] for line in text.splitlines() if '"type":"StartReplica"' in line]


@deployment(name="big", num_replicas=3, ray_actor_options={"num_cpus": 0.05, "num_gpus": 2})
class Big:
    def __call__(self):
        return get_replica_context().rank.rank


def test_a_start_waiting_for_its_placement_group_is_resumed_not_restarted():
    """4 logical GPUs, 3 replicas of 2: the third waits for capacity when the
    controller dies. The new controller adopts it (pending, with its global
    rank) and resumes its start; freeing room places it, under its own id."""
    ctl = get_controller()
    ask(ctl, "reset")
    ask(ctl, "record", {"scenario": "resume a start"})
    apply(Big)
    assert wait_for(lambda: sorted(v[1] is None for v in ask(ctl, "ranks", "big").values()) == [False, False, True])
    before = ask(ctl, "ranks", "big")
    (waiting,) = [rid for rid, v in before.items() if v[1] is None]
    text = crash_controller()
    ctl = get_controller()
    assert ask(ctl, "ranks", "big") == before  # the same three, the third still waiting with rank 2
    running = sorted(rid for rid in before if rid != waiting)
    ask(ctl, "scale", "big", 2, (running[0],))  # frees 2 GPUs: the resumed start gets them
    assert ask(ctl, "wait_healthy", "big", 60)
    after = ask(ctl, "ranks", "big")
    assert set(after) == {running[1], waiting}  # no new replica: the waiting one was adopted
    text += ask(ctl, "drain_trace")
    assert starts(text) == sorted(before)  # each started once
    recovered = [json.loads(line) for line in text.splitlines() if '"controller_recovered"' in line]
    assert recovered and recovered[0]["resumed"] == [waiting] and recovered[0]["lost"] == []
    report = check_trace_lines(text.splitlines())
    assert report.ok, report.violations[:5]
    assert ask(ctl, "status")["rejected_events"] == 0
    ask(ctl, "reset")


@deployment(name="slowstart", num_replicas=1, user_config={"v": 1}, ray_actor_options={"num_cpus": 0.05})
class SlowStart:
    def __init__(self):
        time.sleep(3)  # a model load

    def reconfigure(self, user_config, rank):
        self.rank = rank.rank

    def __call__(self):
        return get_replica_context().replica_id, self.rank


def test_a_replica_whose_init_runs_during_the_crash_is_adopted_and_answered_ready():
    ctl = get_controller()
    ask(ctl, "reset")
    ask(ctl, "record", {"scenario": "adopt a starting replica"})
    apply(SlowStart)
    assert ask(ctl, "wait_healthy", "slowstart", 60)
    ask(ctl, "scale", "slowstart", 2, ())
    (new,) = [rid for rid in ask(ctl, "ranks", "slowstart") if rid != "slowstart#0"]
    actor = None

    def initialising() -> bool:
        nonlocal actor
        try:
            actor = ray.get_actor(actor_name("slowstart", new), namespace=NAMESPACE)
            return ray.get(actor.report.remote(), timeout=5)["phase"] == "starting"
        except Exception:
            return False

    assert wait_for(initialising, 30)
    text = crash_controller()  # while its __init__ sleeps
    ctl = get_controller()
    assert ask(ctl, "wait_healthy", "slowstart", 60)
    assert set(ask(ctl, "ranks", "slowstart")) == {"slowstart#0", new}
    # the very actor that was starting serves, with its rank
    assert ray.get(actor.handle_request.remote("__call__", (), {}), timeout=30) == (new, 1)
    text += ask(ctl, "drain_trace")
    assert starts(text) == ["slowstart#0", new]
    report = check_trace_lines(text.splitlines())
    assert report.ok, report.violations[:5]
    assert ask(ctl, "status")["rejected_events"] == 0
    ask(ctl, "reset")

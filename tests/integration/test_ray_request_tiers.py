"""Requests for a model that is not HOT (issue 22, "Tiers"): they wait while the core brings it back,
their status says ``loading``, and they are answered; an eviction drains, never cancels.

One local Ray for the module with ONE logical GPU (no CUDA needed), declared to the core as 1000
bytes of GPU memory (``book_memory``): two models of 600 "bytes" each fit one at a time, so
deploying the second evicts the first (to the node's WARM cache, or COLD to its file when the cache
is too small), as in test_ray_tiers.py. The sleeping deployment (WARM by ``api.sleep``) asks for
CPUs only.

Nothing in the core wakes a sleeping deployment, or brings an evicted one back, because requests
wait for it: a request waits (``loading``) until a caller wakes it (``api.wake``) or room frees up
(here: the other model scaled to 0).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray
import torch

import rankcore as rc
from executors.ray_gpu import deployment, get_controller, get_replica_context, run
from executors.ray_gpu.api.deployments import ask, book_memory, sleep, tiers_status, wait_serving, wake
from executors.ray_gpu.control.controller import NAMESPACE, actor_name
from tests.integration.waiting import wait_for

GPU_MEMORY = 1000
MODEL = 600  # the core's model_bytes: two do not fit on the one GPU
LOAD_S = 1.5  # how long a Sleeper takes to take its weights back (a wake that takes time)


pytestmark = pytest.mark.usefixtures("one_gpu_ray")


@pytest.fixture(autouse=True)
def clean():
    yield
    ask(get_controller(), "reset")


class Weighted:
    """Holds weights (the contract of replica_weights.py): a small torch module."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(16, 16)

    def state_dict(self):
        return self.model.state_dict()

    def load_state_dict(self, state_dict, assign=False):
        return self.model.load_state_dict(state_dict, assign=assign)

    def slow(self, seconds: float) -> str:
        time.sleep(seconds)
        assert all(p.device.type != "meta" for p in self.model.parameters()), "served without its weights"
        return get_replica_context().replica_id


class Sleeper(Weighted):
    """Takes ``LOAD_S`` to take real weights (its start, and each wake), none to let them go."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[float] = []  # when each real load finished (wall clock: same machine as the test)

    def load_state_dict(self, state_dict, assign=False):
        real = all(t.device.type != "meta" for t in state_dict.values())
        if real:
            time.sleep(LOAD_S)
        out = super().load_state_dict(state_dict, assign=assign)
        if real:
            self.loaded.append(time.time())
        return out

    def ordered(self, seconds: float) -> tuple[str, float, list[float]]:
        """``slow``, with when it began on the replica and when the replica's loads finished."""
        began = time.time()
        return self.slow(seconds), began, list(self.loaded)


def states(responses: list) -> list[str]:
    return [r.status().state for r in responses]


def outcome(response: Any) -> tuple[str, Any]:
    try:
        return "ok", response.result(timeout=60)
    except rc.RequestError as exc:  # (Unavailable, ReplicaDied, ...: counted as failures below)
        return type(exc).__name__, str(exc)


def test_requests_for_a_sleeping_model_wait_loading_while_it_wakes_and_are_all_answered():
    h = run(deployment(Sleeper, name="sleeper", num_replicas=2, max_ongoing_requests=2,
                       ray_actor_options={"num_cpus": 0.25}).bind(), timeout=120)
    assert {h.slow.remote(0.0).result(timeout=30) for _ in range(2)} <= set(h.ranks())  # HOT: answered
    sleep("sleeper", timeout=60)  # WARM: processes and ranks kept, weights in CPU memory
    h._router.refresh(force=True)  # (this process's router has the pool the sleep made: none serving)
    assert [v.membership for v in h._router.machine.pool("sleeper")] == ["draining", "draining"]
    calls = [h.ordered.remote(0.1) for _ in range(6)]
    assert states(calls) == ["loading"] * 6  # waiting for a replica that is coming, not failed
    assert [c.status().position for c in calls] == list(range(6))
    time.sleep(1.0)  # nothing wakes it on its own: they keep waiting, none ends
    assert states(calls) == ["loading"] * 6 and not any(c.future.done() for c in calls)
    woken = time.time()
    wake("sleeper", wait=False)
    time.sleep(LOAD_S / 2)
    assert states(calls) == ["loading"] * 6  # still loading its weights back (LOAD_S each)
    outcomes = [outcome(c) for c in calls]
    assert [o[0] for o in outcomes] == ["ok"] * 6, outcomes  # answered, none rejected nor failed
    assert {o[1][0] for o in outcomes} <= set(h.ranks())
    for _, (rid, began, loaded) in outcomes:  # the order: sent, wake, its load done, then it ran
        assert len(loaded) == 2, (rid, loaded)  # its start's load, then the wake's
        assert loaded[0] < woken < loaded[1] <= began, (rid, woken, loaded, began)
    assert states(calls) == ["done"] * 6
    c = h.counters()
    assert (c.failed, c.lost, c.cancelled, sum(c.rejected.values())) == (0, 0, 0, 0), c
    assert c.answered == 8
    wait_serving("sleeper", timeout=30)


def tiered(name: str, **opts: Any):
    return deployment(Weighted, name=name, num_replicas=1, ray_actor_options={"num_gpus": 1},
                      model_bytes=MODEL, min_deployment_time_s=0.0, **opts)


@pytest.mark.parametrize("tier,cpu_cache", [("warm", GPU_MEMORY), ("cold", MODEL - 1)])
def test_an_evicted_model_drains_what_it_holds_and_its_queued_requests_wait_until_it_is_back(tier, cpu_cache):
    """``a`` is evicted by ``b`` (memory booking) with 2 calls running and 3 queued: the running
    ones finish on the evicted replica (a drain, never a cancel); the queued ones, and one sent
    while ``a`` is away, wait (``loading``) and are answered by ``a``'s replacement once ``b``
    leaves room (its weights from the node's WARM cache, or from its COLD file)."""
    book_memory(gpu_memory=GPU_MEMORY, cpu_cache=cpu_cache)
    a, b = f"a-{tier}", f"b-{tier}"  # (a name per case: this process's router and counters are per name)
    ha = run(tiered(a, max_ongoing_requests=2).bind(), timeout=120)
    (a0,) = ha.ranks()
    running = [ha.slow.remote(4.0) for _ in range(2)]
    queued = [ha.slow.remote(0.1) for _ in range(3)]
    assert wait_for(lambda: states(running) == ["dispatched"] * 2, timeout=10)
    assert states(queued) == ["queued"] * 3
    hb = run(tiered(b).bind(), timeout=120)  # evicts a (after its drain), waits until b serves
    evicted = [e for e in tiers_status()["log"] if e["move"] == "evict"]
    assert [(e["replica"], e["to"], e["error"]) for e in evicted] == [(a0, tier, "")]
    assert [outcome(r) for r in running] == [("ok", a0)] * 2  # drained: finished where they ran
    later = ha.slow.remote(0.1)  # sent while a is away
    waiting = [*queued, later]
    ha._router.refresh(force=True)
    assert wait_for(lambda: states(waiting) == ["loading"] * 4, timeout=10), states(waiting)
    time.sleep(1.0)  # b holds the GPU: a's replacement waits for room, the requests with it
    assert states(waiting) == ["loading"] * 4 and not any(r.future.done() for r in waiting)
    hb.scale(0)  # room again: a's replacement is placed, its weights from the tier it was evicted to
    outcomes = [outcome(r) for r in waiting]
    (a1,) = ha.ranks()
    assert a1 != a0 and outcomes == [("ok", a1)] * 4, outcomes
    info = ray.get(ray.get_actor(actor_name(a, a1), namespace=NAMESPACE).weights_info.remote(), timeout=30)
    assert (info["source"], info["loaded_from"]) == (tier, tier)  # back from the tier it was evicted to
    c = ha.counters()
    assert (c.answered, c.failed, c.lost, c.cancelled, sum(c.rejected.values())) == (6, 0, 0, 0, 0), c
    assert ask(get_controller(), "status")["rejected_events"] == 0

"""Async user methods on the Ray executor, as Ray Serve runs them: ``async def``
``__call__``, ``reconfigure``, ``check_health`` and ``__init__`` are awaited;
several async requests of one replica overlap, up to ``max_ongoing_requests``;
plain methods run in threads and block neither requests nor health checks; the user's code runs
on one loop, the replica's ``user`` concurrency group's, which an async handler may block without
blocking the controller's calls. And the seed's two examples (the second declares ``async def reconfigure``),
with only their import lines changed (examples/ray/seed_example_*.py)."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
import ray

from executors.ray_gpu import deployment, get_controller, get_replica_context, run
from executors.ray_gpu.api.deployments import ask
from executors.ray_gpu.control.controller import NAMESPACE, actor_name

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}


def no_rejections() -> None:
    assert ask(get_controller(), "status")["rejected_events"] == 0


@deployment(name="overlap", num_replicas=1, max_ongoing_requests=4, user_config={"v": 1}, ray_actor_options=OPTS)
class Overlap:
    async def __init__(self):
        await asyncio.sleep(0.01)
        self.now = self.peak = 0
        self.v = None
        self.ranks = []

    async def reconfigure(self, user_config, rank):
        await asyncio.sleep(0.01)  # the body runs (it used to be called and never awaited)
        self.v = user_config["v"]
        self.ranks.append(rank.rank)

    async def __call__(self, s):
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(s)
        finally:
            self.now -= 1
        return get_replica_context().replica_id, self.v, self.ranks

    async def peak_seen(self):
        return self.peak

    async def check_health(self):
        await asyncio.sleep(0)
        if self.v == "sick":
            raise RuntimeError("unhealthy, asynchronously")


def test_async_requests_of_one_replica_overlap_up_to_max_ongoing_requests():
    h = run(Overlap.bind())
    rid, v, ranks = h.remote(0).result(timeout=30)  # an async __call__ returns its value, not a coroutine
    assert (v, ranks) == (1, [0])  # async __init__ and async reconfigure(user_config, rank) ran at start
    t0 = time.monotonic()
    out = [r.result(timeout=30) for r in [h.remote(0.5) for _ in range(4)]]
    elapsed = time.monotonic() - t0
    assert {o[0] for o in out} == {rid}
    assert elapsed < 1.5, f"4 requests of 0.5 s on one replica took {elapsed:.2f}s: they did not overlap"
    # max_ongoing_requests bounds it, in the replica itself: 8 calls sent straight to
    # the actor (no handle to hold them back) run 4 at a time
    actor = ray.get_actor(actor_name("overlap", rid), namespace=NAMESPACE)
    t0 = time.monotonic()
    ray.get([actor.handle_request.remote("__call__", (0.5,), {}) for _ in range(8)], timeout=30)
    elapsed = time.monotonic() - t0
    assert 0.95 <= elapsed < 1.9, elapsed
    assert ray.get(actor.handle_request.remote("peak_seen", (), {}), timeout=30) == 4
    # a config update awaits the async reconfigure before the replica counts as reconfigured
    h2 = run(Overlap.options(user_config={"v": 2}).bind())
    assert h2.remote(0).result(timeout=30)[1] == 2
    no_rejections()


def test_a_failing_async_check_health_replaces_the_replica():
    # (checks every 0.5 s, not Serve's default 10 s: three failures in ~1.5 s, not ~30)
    h = run(Overlap.options(name="sickly", user_config={"v": 1}, health_check_period_s=0.5).bind())
    (rid,) = h.ranks()
    run(Overlap.options(name="sickly", user_config={"v": "sick"}, health_check_period_s=0.5).bind())
    ctl = get_controller()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and rid in h.ranks():
        time.sleep(0.2)
    assert rid not in h.ranks()  # its async check_health raised: replaced on its rank
    ask(ctl, "shutdown_replicas")


@deployment(name="blocking", num_replicas=1, max_ongoing_requests=2, ray_actor_options=OPTS)
class Blocking:
    def __call__(self, s):
        time.sleep(s)  # a plain method: it runs in a thread of its own
        return threading.current_thread().name, os.getpid()

    def check_health(self):
        return None


def test_plain_methods_run_in_threads_and_block_neither_requests_nor_health_checks():
    h = run(Blocking.bind())
    (rid,) = h.ranks()
    actor = ray.get_actor(actor_name("blocking", rid), namespace=NAMESPACE)
    t0 = time.monotonic()
    slow = [h.remote(1.5) for _ in range(2)]
    time.sleep(0.2)
    assert ray.get(actor.ping.remote(), timeout=5) is True  # answers while both requests sleep
    assert time.monotonic() - t0 < 1.2
    names = {r.result(timeout=30)[0] for r in slow}
    assert time.monotonic() - t0 < 2.9  # the two ran side by side
    assert all(n.startswith("rankcore-request") for n in names)
    ask(get_controller(), "shutdown_replicas")


@deployment(name="hogger", num_replicas=1, max_ongoing_requests=2, user_config={"v": 1}, ray_actor_options=OPTS)
class Hogger:
    def __init__(self):
        self.threads = {"__init__": threading.get_ident()}

    async def reconfigure(self, user_config):
        self.threads["reconfigure"] = threading.get_ident()

    async def __call__(self, s):
        self.threads["__call__"] = threading.get_ident()
        time.sleep(s)  # blocks its event loop: the user loop, not the one the controller's calls use
        return "done"

    async def threads_seen(self):
        return self.threads


def test_user_code_runs_on_one_loop_and_an_async_handler_blocking_it_blocks_no_health_check():
    """The replica's requests run on the loop of its ``user`` concurrency group, where the user's
    constructor and async methods run too (no hop to another thread a call); the controller's calls
    (``ping``, ``report``) keep the actor's own loop, so a handler that blocks its loop holds up
    neither (no ``check_health`` here: the class's own would run on the blocked loop, as in Serve)."""
    h = run(Hogger.bind())
    (rid,) = h.ranks()
    assert h.remote(0).result(timeout=30) == "done"
    seen = h.threads_seen.remote().result(timeout=30)
    assert set(seen) == {"__init__", "reconfigure", "__call__"} and len(set(seen.values())) == 1, seen
    actor = ray.get_actor(actor_name("hogger", rid), namespace=NAMESPACE)
    t0 = time.monotonic()
    slow = h.remote(2.0)
    time.sleep(0.3)
    assert ray.get(actor.ping.remote(), timeout=5) is True
    assert ray.get(actor.report.remote(), timeout=5)["phase"] == "running"
    assert time.monotonic() - t0 < 1.5, "the controller's calls waited for the handler blocking the user loop"
    assert slow.result(timeout=30) == "done"
    ask(get_controller(), "shutdown_replicas")


def test_seed_example_1_as_written():
    from examples.ray import seed_example_1

    assert seed_example_1.main() == {0, 1, 2, 3}
    no_rejections()
    ask(get_controller(), "shutdown_replicas")


def test_seed_example_2_async_reconfigure_as_written():
    from examples.ray import seed_example_2

    assert seed_example_2.main() == {0, 1, 2, 3}  # every replica has model_v1: its async reconfigure ran
    no_rejections()
    ask(get_controller(), "shutdown_replicas")

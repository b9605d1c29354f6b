"""``@batch`` in real replicas (issue 39): concurrent calls through the handle and over HTTP arrive
in one replica as batches (sizes seen by the method), a lone call waits out the timeout, a
wrong-length answer fails each caller with the batch's error, a generator streams per caller,
each model's part of a batch sees its own multiplexed model id, and ``reconfigure`` changes the bound without a restart (the same replica, a new bound)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from executors.ray_gpu import batch, deployment, get_multiplexed_model_id, get_replica_context, run

pytestmark = pytest.mark.usefixtures("local_ray")

OPTS = {"num_cpus": 0.05}


@deployment(name="batched", num_replicas=1, max_ongoing_requests=16, ray_actor_options=OPTS,
            user_config={"max_batch_size": 4})
class Batched:
    def reconfigure(self, config: dict) -> None:
        self.__call__.set_max_batch_size(config["max_batch_size"])

    @batch(max_batch_size=4, batch_wait_timeout_s=0.2)
    async def __call__(self, xs: list) -> list:
        await asyncio.sleep(0.05)
        who = get_replica_context().replica_id
        return [{"x": x, "batch": len(xs), "replica": who} for x in xs]

    @batch(max_batch_size=4, batch_wait_timeout_s=0.05)
    async def wrong(self, xs: list) -> list:
        return xs + [None]

    @batch(max_batch_size=6, batch_wait_timeout_s=0.5)
    async def which_model(self, xs: list) -> list:
        model = get_multiplexed_model_id()
        return [f"{model}:{x}" for x in xs]

    @batch(max_batch_size=4, batch_wait_timeout_s=0.1)
    async def count(self, ns: list):
        for i in range(max(ns)):
            yield [i if i < n else StopIteration for n in ns]


@pytest.fixture(scope="module")
def handle():
    return run(Batched.bind(), route_prefix="/batched", port=0)


def _together(h, n: int) -> list:
    return [r.result(timeout=60) for r in [h.remote(i) for i in range(n)]]


def test_concurrent_calls_through_the_handle_arrive_as_batches_bounded_by_max_batch_size(handle):
    got = _together(handle, 8)
    assert [g["x"] for g in got] == list(range(8))
    sizes = [g["batch"] for g in got]
    assert max(sizes) == 4 and all(1 <= s <= 4 for s in sizes), sizes  # batched, never past the bound
    assert sum(1 for s in sizes if s > 1) >= 4, sizes


def test_a_lone_call_waits_out_the_batch_timeout(handle):
    t0 = time.perf_counter()
    got = handle.remote("alone").result(timeout=60)
    took = time.perf_counter() - t0
    assert got["batch"] == 1 and took >= 0.2, took


def test_a_wrong_length_answer_fails_every_caller_of_that_batch(handle):
    calls = [handle.wrong.remote(i) for i in range(3)]
    for c in calls:
        with pytest.raises(Exception, match="doesn't preserve batch size"):
            c.result(timeout=60)


def test_a_generator_streams_to_each_caller(handle):
    streaming = handle.options(stream=True)

    async def take(n: int) -> list:
        return [x async for x in streaming.count.remote(n)]

    async def both() -> list:
        return list(await asyncio.gather(take(2), take(3)))

    assert asyncio.run(both()) == [[0, 1], [0, 1, 2]]


def test_each_model_s_part_of_a_batch_runs_with_its_own_multiplexed_model_id(handle):
    models = [("model_a", "model_b")[i % 2] for i in range(6)]
    calls = [handle.options(multiplexed_model_id=m).which_model.remote(i) for i, m in enumerate(models)]
    assert [c.result(timeout=60) for c in calls] == [f"{m}:{i}" for i, m in enumerate(models)]


def test_calls_over_http_are_batched_too(handle):
    from executors.ray_gpu.ingress.http import ingress_address

    host, port = ingress_address()
    answers: list = []

    def post(i: int) -> None:
        r = httpx.post(f"http://{host}:{port}/batched", json=i, timeout=60)
        answers.append((r.status_code, r.json()))

    threads = [threading.Thread(target=post, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == 6 and all(s == 200 for s, _ in answers), answers
    assert max(a["batch"] for _, a in answers) > 1, answers
    assert sorted(a["x"] for _, a in answers) == list(range(6))


def test_reconfigure_changes_the_bound_without_a_restart(handle):
    before = _together(handle, 4)
    run(Batched.options(user_config={"max_batch_size": 2}).bind(), route_prefix="/batched", port=0)
    after = _together(handle, 8)
    assert {g["replica"] for g in after} == {g["replica"] for g in before}  # the same replica: no restart
    assert max(g["batch"] for g in after) == 2, [g["batch"] for g in after]
    assert json.dumps(after)  # (answers are plain data)


def test_the_replicas_metrics_count_batches_with_serves_names(handle):
    from executors.ray_gpu.ingress.http import ingress_address

    _together(handle, 4)
    host, port = ingress_address()
    text = httpx.get(f"http://{host}:{port}/metrics", timeout=60).text
    ran = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("ray_serve_batches_processed_total{") and 'function_name="__call__"' in line)
    sizes = [line for line in text.splitlines()
             if line.startswith("ray_serve_actual_batch_size_count{") and 'function_name="__call__"' in line]
    total = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("ray_serve_actual_batch_size_sum{") and 'function_name="__call__"' in line)
    assert ran >= 2 and sizes, [line for line in text.splitlines() if "batch" in line][:20]
    assert total >= 4 + ran - 1  # (every call counted in some batch; more than one per batch on average)
    assert "ray_serve_batch_wait_time_ms_bucket{" in text and "ray_serve_batch_queue_length{" in text

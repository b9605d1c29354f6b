"""Node loss on a real multi-node Ray cluster (head + 2 workers, fast health checks)."""

from __future__ import annotations

import time

import pytest
import ray
from ray.cluster_utils import Cluster

from executors.ray_gpu.api import ask
from tests.integration.conftest import ray_env
from executors.ray_gpu import deployment, get_controller, get_replica_context, run

FAST = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}


@pytest.fixture(scope="module")
def cluster():
    ray_env()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0, "_system_config": FAST,
                                                      "include_dashboard": False,
                                                      "object_store_memory": 128 * 1024**2})
    workers = [c.add_node(num_cpus=2, num_gpus=2, object_store_memory=128 * 1024**2) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield c, workers
    try:
        ask(get_controller(), "shutdown_replicas")
    finally:
        ray.shutdown()
        c.shutdown()


@deployment(name="spread", num_replicas=4,
            ray_actor_options={"num_cpus": 0.1, "num_gpus": 0.5})  # spread over nodes by default
class Spread:
    def __call__(self):
        ctx = get_replica_context()
        return ctx.replica_id, ctx.rank.as_tuple(), ray.get_runtime_context().get_node_id()


def test_lost_node_replicas_are_replaced_and_node_ranks_recompacted(cluster):
    c, workers = cluster
    h = run(Spread.bind())
    before = h.ranks()
    assert sorted(v[0] for v in before.values()) == [0, 1, 2, 3]
    assert sorted({v[1] for v in before.values()}) == [0, 1]  # spread over both workers
    victim = workers[0]
    lost = {rid for rid, _, node in (h.remote().result(timeout=30) for _ in range(12))
            if node == victim.node_id}
    assert lost
    t0 = time.monotonic()
    c.remove_node(victim)
    ctl = get_controller()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        now = h.ranks()
        if not (lost & set(now)) and len(now) == 4 and ask(ctl, "wait_healthy", "spread", 0.2):
            break
        time.sleep(0.2)
    now = h.ranks()
    assert not (lost & set(now)), "the lost node's replicas were not replaced"
    assert sorted(v[0] for v in now.values()) == [0, 1, 2, 3]  # the same global ranks, refilled
    assert {v[1] for v in now.values()} == {0}  # one node left: node rank 0
    assert sorted(v[2] for v in now.values()) == [0, 1, 2, 3]  # local ranks contiguous again
    for rid in set(before) - lost:
        assert now[rid][0] == before[rid][0]  # survivors keep their global rank
    assert time.monotonic() - t0 < 90
    assert ask(ctl, "state_errors") == []

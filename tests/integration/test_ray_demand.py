"""Replicas no node has room for reach Ray's autoscaler: the controller turns the core's
``RequestResources`` into ``ray.autoscaler.sdk.request_resources``, read back here from the
GCS (its internal KV with autoscaler v1, the default of a local Ray; its cluster resource
constraints with v2), and cleared once nothing waits (scaled down, deleted)."""

from __future__ import annotations

import json

import pytest
import ray

from executors.ray_gpu import delete, deployment, run
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.usefixtures("local_ray")  # 4 logical GPUs


def requested() -> list[dict[str, float]] | None:
    """The bundles the GCS holds as the autoscaler's request (None: never asked)."""
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    if is_autoscaler_v2():
        from ray._raylet import GcsClient
        from ray.autoscaler.v2.sdk import get_cluster_resource_state

        state = get_cluster_resource_state(GcsClient(address=ray.get_runtime_context().gcs_address))
        out: list[dict[str, float]] = []
        for constraint in state.cluster_resource_constraints:
            for req in constraint.resource_requests:
                out.extend([dict(req.request.resources_bundle)] * req.count)
        return out
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(ray_constants.AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return None if raw is None else json.loads(raw)


def gpus(bundles: list[dict[str, float]] | None) -> list[float] | None:
    return None if bundles is None else sorted(b.get("GPU", 0.0) for b in bundles)


@deployment(name="demand", num_replicas=1, ray_actor_options={"num_cpus": 0.05, "num_gpus": 1})
class Wants:
    def __call__(self) -> str:
        return "ok"


def test_waiting_replicas_reach_the_gcs_as_a_request_cleared_when_nothing_waits():
    h = run(Wants.bind(), timeout=60)
    assert gpus(requested()) in (None, [])  # everything fits: nothing asked
    with pytest.raises(TimeoutError):
        h.scale(6, timeout=3)  # 4 GPUs: 4 run, 2 wait in the core's queue
    # the whole need: the node's 4 booked GPUs as one bundle, and one bundle per waiting replica
    assert wait_for(lambda: gpus(requested()) == [1.0, 1.0, 4.0], timeout=30), requested()
    waiting = [b for b in requested() or [] if b.get("GPU") == 1.0]
    assert all(b.get("CPU") == pytest.approx(0.05) for b in waiting), waiting
    h.scale(3, timeout=60)  # the waiting ones are no longer wanted
    assert wait_for(lambda: requested() == [], timeout=30), requested()
    with pytest.raises(TimeoutError):
        h.scale(5, timeout=3)
    assert wait_for(lambda: gpus(requested()) == [1.0, 4.0], timeout=30), requested()
    delete("demand", timeout=60)  # deleted: its waiting replica goes, the request with it
    assert wait_for(lambda: requested() == [], timeout=30), requested()

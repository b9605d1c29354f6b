"""Ray for the integration tests: started once per module that asks for it."""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def ray_env() -> None:
    """No telemetry, no auth, and replicas can import test and example classes by name."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), *paths]))


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 4 logical GPUs (no GPU needed), replicas stopped at the end."""
    import ray

    from executors.ray_gpu import get_controller
    from executors.ray_gpu.api import ask

    ray_env()
    ray.init(address="local", num_cpus=4, num_gpus=4, include_dashboard=False,
             object_store_memory=256 * 1024**2, log_to_driver=False)
    yield
    try:
        ask(get_controller(), "shutdown_replicas")
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def one_gpu_ray():
    """A local Ray with one logical GPU (the GPU-memory tests: two models do not fit on it),
    everything the controller held forgotten at the end (its memory booking too)."""
    import ray

    from executors.ray_gpu import get_controller
    from executors.ray_gpu.api import ask

    ray_env()
    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False,
             object_store_memory=128 * 1024**2, log_to_driver=False)
    yield
    try:
        ask(get_controller(), "reset")
    finally:
        ray.shutdown()

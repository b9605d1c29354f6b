"""Ray for the integration tests: started once per module that asks for it."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def witness_dir():
    """The replicas' witnesses (``executors/ray_gpu/base/witness.py``) in a folder of this run's own,
    inherited by every Ray started here, removed at its end: a killed replica's stays otherwise,
    and another run's on this machine are not ours to sweep."""
    from executors.ray_gpu.base.witness import DIR_ENV

    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    d = tempfile.mkdtemp(prefix="rankcore-test-witness-", dir=base)
    before = os.environ.get(DIR_ENV)
    os.environ[DIR_ENV] = d
    yield pathlib.Path(d)
    if before is None:
        os.environ.pop(DIR_ENV, None)
    else:
        os.environ[DIR_ENV] = before
    shutil.rmtree(d, ignore_errors=True)


def ray_env() -> None:
    """No telemetry, no auth, and replicas can import test and example classes by name."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), *paths]))


def _local_ray(num_gpus: int, store_mib: int, end: str):
    """A local Ray (4 CPUs, ``num_gpus`` logical GPUs: no GPU needed) for one module; at its end the
    controller is asked ``end`` (``shutdown_replicas``, or ``reset``: forget everything), its COLD files
    are removed and Ray stops."""
    import ray

    from executors.ray_gpu import get_controller
    from executors.ray_gpu.api.deployments import ask

    ray_env()
    if ray.is_initialized():  # (a module before failed without letting its Ray go: one failure, not thirty)
        ray.shutdown()
    ray.init(address="local", num_cpus=4, num_gpus=num_gpus, include_dashboard=False,
             object_store_memory=store_mib * 1024**2, log_to_driver=False)
    yield
    try:
        ask(get_controller(), end)
        ask(get_controller(), "remove_cold_files")  # (what the module's evictions wrote)
    finally:
        ray.shutdown()


#: fast node health checks for the multi-node clusters (a lost node is seen within ~2 s)
FAST_NODE_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                    "health_check_initial_delay_ms": 0}


def multi_node_cluster(workers: int, gpus_per_worker: int, end: str = "shutdown_replicas",
                       zones: tuple[str, ...] = (), resources: tuple[dict, ...] = ()):
    """A ``ray.cluster_utils.Cluster`` for one module: a head with 2 CPUs and no GPU, ``workers``
    worker nodes of 2 CPUs and ``gpus_per_worker`` logical GPUs, fast node health checks; yields
    ``(cluster, worker nodes)``. At its end the controller is asked ``end`` and everything stops.
    ``zones`` and ``resources``: each node's availability zone and custom resources, the head's
    first (none where they stop short)."""
    import ray
    from ray.cluster_utils import Cluster

    from executors.ray_gpu import get_controller
    from executors.ray_gpu.api.deployments import ask
    from executors.ray_gpu.control.cluster import in_zone

    def zone(i: int) -> str:
        return zones[i] if i < len(zones) else ""

    def custom(i: int) -> dict:
        return resources[i] if i < len(resources) else {}

    ray_env()
    with in_zone(zone(0)):
        c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "num_gpus": 0, "_system_config": FAST_NODE_CHECKS, "include_dashboard": False,
            "object_store_memory": 128 * 1024**2, "resources": custom(0)})
    nodes = []
    for i in range(1, workers + 1):
        with in_zone(zone(i)):
            nodes.append(c.add_node(num_cpus=2, num_gpus=gpus_per_worker, object_store_memory=128 * 1024**2,
                                    resources=custom(i)))
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield c, nodes
    try:
        ask(get_controller(), end)
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 4 logical GPUs, replicas stopped at the end."""
    yield from _local_ray(4, 256, "shutdown_replicas")


@pytest.fixture(scope="module")
def one_gpu_ray():
    """A local Ray with one logical GPU (the GPU-memory tests: two models do not fit on it),
    everything the controller held forgotten at the end (its memory booking too)."""
    yield from _local_ray(1, 128, "reset")


@pytest.fixture
def temp_dirs_gone(monkeypatch):
    """Records the temp folders the test's run makes with ``tempfile.mkdtemp`` under rankcore's
    prefix (``start_failures``' counters; not Ray's); the function it returns, called with the
    scenario once its run has returned, checks they are gone (issue 36: 43 of them were left in
    /tmp) and that the run made some exactly when the scenario's start failures need them."""
    import tempfile

    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def recorded(*args, **kwargs):
        folder = mkdtemp(*args, **kwargs)
        if os.path.basename(folder).startswith("rankcore-"):
            made.append(folder)
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", recorded)

    def check(sc) -> None:
        assert [d for d in made if os.path.exists(d)] == []
        assert bool(made) == any(d.start_failures for d in sc.deployments.values())

    return check

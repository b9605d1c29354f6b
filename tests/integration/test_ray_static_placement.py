"""Static placement on a caller's placement group (Ray RFC #59857), on a real
multi-node Ray cluster (head + 2 workers of 2 logical GPUs, fast health
checks; one cluster for the module).

The test makes the group (4 bundles of one GPU, two pinned to each worker by a
node label) and rankcore only uses it: rank N's replica runs on the first
bundle of ``mapping[N]`` and starts its own workers on all of them.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import rankcore as rc
from executors.ray_gpu import (
    StaticPlacementConfig,
    bundle_locations,
    deployment,
    get_controller,
    get_deployment_handle,
    get_replica_context,
    run,
    sorted_bundle_mapping,
)
from executors.ray_gpu.api.deployments import ask
from executors.ray_gpu.control.controller import NAMESPACE, actor_name
from tests.integration.conftest import ray_env
from tests.integration.ports import free_port
from tests.integration.waiting import wait_for

FAST = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}
STORE = 128 * 1024**2
RACK = "rankcore-test/rack"


@pytest.fixture(scope="module")
def cluster():
    ray_env()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0, "_system_config": FAST,
                                                      "include_dashboard": False, "object_store_memory": STORE})
    nodes = {rack: c.add_node(num_cpus=2, num_gpus=2, object_store_memory=STORE, labels={RACK: rack})
             for rack in ("a", "b")}
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    yield c, nodes
    try:
        ask(get_controller(), "shutdown_replicas")
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def pg(cluster):
    """The caller's group: bundles 0, 1 on worker a, bundles 2, 3 on worker b."""
    group = placement_group([{"GPU": 1, "CPU": 0.25}] * 4, strategy="PACK",
                            bundle_label_selector=[{RACK: "a"}] * 2 + [{RACK: "b"}] * 2)
    ray.get(group.ready(), timeout=60)
    return group


@pytest.fixture(scope="module")
def locations(pg):
    return bundle_locations(pg)


@pytest.fixture(autouse=True)
def clean(cluster):
    yield
    ask(get_controller(), "reset")  # every replica (and so its own workers) gone; the caller's group stays


def rankcore_groups() -> list[str]:
    return [i["name"] for i in placement_group_table().values()
            if i["name"].startswith("rankcore:") and i["state"] != "REMOVED"]


def whoami() -> dict:
    ctx = ray.get_runtime_context()
    return {"node": ctx.get_node_id(), "gpus": ctx.get_accelerator_ids().get("GPU"),
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "pg": ctx.get_placement_group_id()}


# ---------------------------------------------------------------- the options
class Plain:
    def __call__(self):
        ctx = get_replica_context()
        return {"rid": ctx.replica_id, "rank": ctx.rank.rank, "world_size": ctx.world_size,
                "bundles": ctx.bundle_indices, **whoami()}


def test_static_options_are_checked_at_the_decorator(pg):
    ok = StaticPlacementConfig(pg, {0: [0, 1], 1: [2, 3]})
    d = deployment(Plain, name="opts", _placement_info=ok)  # the RFC's name for it
    assert d.num_replicas == 2 and d.static_placement is ok  # the mapping's length
    assert deployment(Plain, name="opts", static_placement=ok, num_replicas=2).num_replicas == 2
    bad = [
        ({0: [0], 2: [1]}, "contiguous"),  # a gap in the ranks
        ({0: [0], 1: []}, "is empty"),
        ({0: [0, 4]}, "bundle 4.*has 4 bundles"),
        ({0: [0, 1], 1: [1]}, "bundle 1 is given to rank 0 and to rank 1"),
        ({0: [-1]}, "non-negative"),
    ]
    for mapping, words in bad:
        with pytest.raises(rc.InvalidConfig, match=words):
            StaticPlacementConfig(pg, mapping)
    with pytest.raises(rc.InvalidConfig, match="PlacementGroup"):
        StaticPlacementConfig("not a group", {0: [0]})
    with pytest.raises(rc.InvalidConfig, match=r"'opts': num_replicas=3, but .* maps 2 ranks"):
        deployment(Plain, name="opts", static_placement=ok, num_replicas=3)
    with pytest.raises(rc.InvalidConfig, match="placement_group_bundles cannot be set with static_placement"):
        deployment(Plain, name="opts", static_placement=ok, placement_group_bundles=[{"CPU": 1}])
    with pytest.raises(rc.InvalidConfig, match="gang_size=2 do not mix"):
        deployment(Plain, name="opts", static_placement=ok, gang_size=2)
    with pytest.raises(rc.InvalidConfig, match=r"rank 0 runs in bundle 0 .* 1 GPU, but ray_actor_options asks for 2"):
        deployment(Plain, name="opts", static_placement=ok, ray_actor_options={"num_gpus": 2})
    with pytest.raises(rc.InvalidConfig, match="not both"):
        deployment(Plain, name="opts", static_placement=ok, _placement_info=ok)
    assert d.options(static_placement=StaticPlacementConfig(pg, {0: [3]})).num_replicas == 1


# ------------------------------------------------ replicas and their workers
@ray.remote
class Worker:
    """A tensor-parallel shard: one GPU of the replica's bundles."""

    def __init__(self, bundle: int) -> None:
        self.bundle = bundle

    def info(self) -> dict:
        return {"bundle": self.bundle, **whoami()}

    def setup(self, rank: int, world: int, port: int) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))

    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value])
        dist.all_reduce(t)
        return float(t.item())


class TPEngine:
    """Starts one worker on each of its rank's bundles; they form a gloo group."""

    def __init__(self) -> None:
        ctx = get_replica_context()
        self.workers = [Worker.options(num_cpus=0.1, num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=ctx.placement_group, placement_group_bundle_index=b)).remote(b)
            for b in ctx.bundle_indices]
        port = free_port()
        ray.get([w.setup.remote(i, len(self.workers), port) for i, w in enumerate(self.workers)], timeout=120)

    def __call__(self, x: float) -> dict:
        ctx = get_replica_context()
        sums = ray.get([w.all_reduce.remote(x * (i + 1)) for i, w in enumerate(self.workers)])
        return {"rank": ctx.rank.rank, "bundles": ctx.bundle_indices, "group": ctx.placement_group.id.hex(),
                "current": ray.util.get_current_placement_group().id.hex(), "sums": sums, "me": whoami(),
                "workers": ray.get([w.info.remote() for w in self.workers])}


def test_replicas_run_on_their_bundles_and_their_workers_all_reduce(pg, locations):
    mapping = {0: [0, 1], 1: [2, 3]}
    assert [loc[0] for loc in locations][0] == locations[1][0] != locations[2][0] == locations[3][0]
    h = run(deployment(TPEngine, name="tp", ray_actor_options={"num_cpus": 0.05},
                       static_placement=StaticPlacementConfig(pg, mapping)).bind(), timeout=180)
    out = h.broadcast(2.0)
    assert sorted(r["rank"] for r in out.values()) == [0, 1]
    for r in out.values():
        want = mapping[r["rank"]]
        assert r["sums"] == [6.0, 6.0]  # 2*1 + 2*2, all-reduced over the rank's two workers
        assert list(r["bundles"]) == want
        assert r["group"] == r["current"] == pg.id.hex() == r["me"]["pg"]  # the caller's group, no group of ours
        assert r["me"]["node"] == locations[want[0]][0]  # the replica on its first bundle's node
        assert [w["bundle"] for w in r["workers"]] == want
        for w in r["workers"]:
            node, gpu = locations[w["bundle"]]
            assert (w["node"], w["gpus"], w["cvd"], w["pg"]) == (node, [gpu], gpu, pg.id.hex())
        assert len({w["gpus"][0] for w in r["workers"]}) == 2  # one GPU each
    status = h.status()
    assert status["healthy"] and status["failed"] == []
    assert {rid: (v["phase"], list(v["bundles"])) for rid, v in status["replicas"].items()} == \
        {rid: ("running", mapping[r["rank"]]) for rid, r in out.items()}
    assert rankcore_groups() == []  # rankcore made no group of its own
    for n in (3, 1):  # (0 and the mapping's length, 2, are the core's allowed counts)
        with pytest.raises(rc.InvalidConfig, match=r"handle.scale\(\d\) of 'tp': .*static placement"):
            h.scale(n)
    assert ask(get_controller(), "state_errors") == []
    ask(get_controller(), "reset")
    assert placement_group_table(pg)["state"] == "CREATED"  # the caller's group is the caller's


# ------------------------------------------------------------- colocation
class Policy:
    """An inference replica sharing its GPU (half of it) with a trainer."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.model = torch.nn.Linear(8, 1)
        torch.nn.init.zeros_(self.model.weight)
        torch.nn.init.zeros_(self.model.bias)
        self.version = 1

    def load_weights(self, ref, version: int) -> dict:
        import torch

        arrays = ray.get(ref)  # numpy views of the object store (the same node: no copy)
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()})
        self.version = version
        return whoami()

    def __call__(self) -> dict:
        with self.torch.no_grad():
            y = self.model(self.torch.ones(1, 8)).item()
        return {"y": y, "version": self.version, "rank": get_replica_context().rank.rank, **whoami()}


@ray.remote
class Trainer:
    def train_and_push(self, deployment_name: str) -> dict:
        import torch

        model = torch.nn.Linear(8, 1)
        with torch.no_grad():  # "training": the new weights
            model.weight.fill_(1.0)
            model.bias.fill_(0.5)
        t0 = time.perf_counter()
        ref = ray.put({k: v.numpy() for k, v in model.state_dict().items()})
        replicas = get_deployment_handle(deployment_name).load_weights.broadcast(ref, 2)
        return {"push_s": time.perf_counter() - t0, "replicas": replicas, **whoami()}


def test_a_trainer_colocated_on_the_replicas_bundle_pushes_weights(pg, locations):
    """The RFC's case: the trainer runs on the same bundle (the same GPU) as an
    inference replica and pushes new weights; later requests use them."""
    mapping = {0: [0], 1: [2]}
    h = run(deployment(Policy, name="policy", ray_actor_options={"num_cpus": 0.05, "num_gpus": 0.5},
                       static_placement=StaticPlacementConfig(pg, mapping)).bind(), timeout=120)
    before = h.broadcast()
    assert {r["y"] for r in before.values()} == {0.0}
    trainer = Trainer.options(num_cpus=0.05, num_gpus=0.5, scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=0)).remote()
    pushed = ray.get(trainer.train_and_push.remote("policy"), timeout=60)
    by_rank = {r["rank"]: r for r in before.values()}
    assert (pushed["node"], pushed["gpus"]) == (by_rank[0]["node"], by_rank[0]["gpus"]) == \
        (locations[0][0], [locations[0][1]])  # colocated: the same node and logical GPU as rank 0
    assert set(pushed["replicas"]) == set(before)
    after = [h.remote().result(timeout=30) for _ in range(4)]
    assert {(r["y"], r["version"]) for r in after} == {(8.5, 2)}  # 8 * 1.0 + 0.5
    assert {r["rank"] for r in after} == {0, 1}
    ray.kill(trainer)


# --------------------------------------------------- a replica that dies
def test_a_killed_replica_comes_back_on_its_bundle_with_its_rank(pg, locations):
    mapping = {0: [1], 1: [3]}
    h = run(deployment(Plain, name="one", ray_actor_options={"num_cpus": 0.05, "num_gpus": 0.5},
                       static_placement=StaticPlacementConfig(pg, mapping)).bind(), timeout=120)
    before = {r["rank"]: r for r in h.broadcast().values()}
    victim = before[1]
    ray.kill(ray.get_actor(actor_name("one", victim["rid"]), namespace=NAMESPACE), no_restart=True)
    ctl = get_controller()
    assert wait_for(lambda: victim["rid"] not in h.ranks() and ask(ctl, "wait_healthy", "one", 0.2))
    after = {r["rank"]: r for r in h.broadcast().values()}
    new = after[1]
    assert new["rid"] != victim["rid"]
    assert (new["bundles"], new["node"], new["gpus"], new["world_size"]) == \
        ((3,), locations[3][0], [locations[3][1]], 2)  # the same bundle: its node and GPU
    assert after[0] == before[0]  # the other replica untouched
    assert h.ranks()[new["rid"]][0] == 1
    assert rankcore_groups() == [] and ask(ctl, "state_errors") == []

    ray.kill(ctl, no_restart=False)  # a restarted controller adopts both, on their bundles, restarting none
    time.sleep(0.5)
    status = h.status()
    assert {rid: (v["phase"], v["rank"][0], v["bundles"]) for rid, v in status["replicas"].items()} == \
        {after[0]["rid"]: ("running", 0, (1,)), new["rid"]: ("running", 1, (3,))}
    assert {r["rank"]: r for r in h.broadcast().values()} == after
    assert ask(get_controller(), "state_errors") == []


# --------------------------------------------------------- a node that dies
def test_a_lost_node_fails_its_replica_the_other_serves_and_a_new_node_brings_it_back(cluster, pg, locations):
    """Worker b (bundles 2, 3) dies: the replica there is FAILED (kept on its
    rank, not moved: the group is the caller's) while the other serves. Ray
    reschedules the group's bundles on a new node with room: the controller
    reports BundlesPlaced and the FAILED rank starts there."""
    c, nodes = cluster
    mapping = sorted_bundle_mapping(pg, 2)  # consecutive ranks on bundles sorted by (node, GPU)
    assert {frozenset(locations[b][0] for b in bs) for bs in mapping.values()} == \
        {frozenset([nodes["a"].node_id]), frozenset([nodes["b"].node_id])}  # a rank's bundles on one node
    assert mapping == rc.consecutive_mapping(locations, 2)
    ctl = get_controller()
    ask(ctl, "record", {"scenario": "static placement, node loss"})
    h = run(deployment(Plain, name="lossy", ray_actor_options={"num_cpus": 0.05},
                       static_placement=StaticPlacementConfig(pg, mapping)).bind(), timeout=120)
    ranks = {v[0]: rid for rid, v in h.ranks().items()}
    doomed = next(r for r, bs in mapping.items() if locations[bs[0]][0] == nodes["b"].node_id)
    survivor = 1 - doomed
    c.remove_node(nodes.pop("b"), allow_graceful=False)
    assert wait_for(lambda: h.status()["failed"] == [ranks[doomed]], 60), h.status()
    status = h.status()
    assert status["replicas"][ranks[survivor]]["phase"] == "running" and not status["healthy"]
    assert status["replicas"][ranks[doomed]]["rank"][0] == doomed  # FAILED keeps its rank
    assert {h.remote().result(timeout=30)["rid"] for _ in range(6)} == {ranks[survivor]}  # the other serves
    time.sleep(2.5)  # a health check later: still FAILED, not replaced or moved (no node has the bundles)
    assert h.status()["failed"] == [ranks[doomed]] and set(h.ranks()) == set(ranks.values())

    nodes["b"] = c.add_node(num_cpus=2, num_gpus=2, object_store_memory=STORE, labels={RACK: "b"})
    assert wait_for(lambda: ask(ctl, "wait_healthy", "lossy", 0.2), 90), h.status()
    back = {r["rank"]: r for r in h.broadcast().values()}
    assert back[doomed]["rid"] != ranks[doomed] and back[doomed]["node"] == nodes["b"].node_id
    assert back[doomed]["bundles"] == tuple(mapping[doomed]) and back[survivor]["rid"] == ranks[survivor]
    records = [json.loads(line) for line in ask(ctl, "drain_trace").splitlines()]
    seen = [r["type"] for r in records if r["kind"] == "event" and r["type"] in ("NodeLost", "BundlesPlaced")]
    assert seen[0] == "NodeLost" and "BundlesPlaced" in seen
    assert ask(ctl, "state_errors") == []

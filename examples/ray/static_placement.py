"""Static placement on your own placement group (Ray RFC #59857).

You make the placement group (here 4 bundles of one GPU each) and say which
bundles each rank gets; rankcore runs rank N's replica on the first bundle of
``mapping[N]`` and never creates, resizes or removes your group. Each replica
reads its bundles from ``get_replica_context().bundle_indices`` and starts its
tensor-parallel workers there (here: two workers that form a torch.distributed
gloo group and all-reduce a tensor).

``sorted_bundle_mapping(pg, 2)`` gives consecutive ranks to bundles sorted by
(node, GPU id), so a rank's two bundles share a node whenever a node holds an
even number of them.

    python -m examples.ray.static_placement

Without GPUs, the local Ray gets 4 logical GPUs (CUDA_VISIBLE_DEVICES is set
per worker all the same; the tensors stay on the CPU).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from executors.ray_gpu import (
    StaticPlacementConfig,
    bundle_locations,
    deployment,
    get_controller,
    get_replica_context,
    run,
    sorted_bundle_mapping,
)


@ray.remote
class ShardWorker:
    """One tensor-parallel shard, on one bundle (one GPU) of its replica."""

    def __init__(self, bundle: int) -> None:
        self.bundle = bundle

    def setup(self, rank: int, world: int, port: int) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))

    def all_reduce(self, value: float) -> dict:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value])
        dist.all_reduce(t)
        return {"bundle": self.bundle, "sum": float(t.item()), "gpu_ids": ray.get_gpu_ids(),
                "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}


class Engine:
    """A TP=2 inference engine: one worker per bundle of its rank."""

    def __init__(self, gpu_per_bundle: float) -> None:
        ctx = get_replica_context()
        self.workers = [
            ShardWorker.options(num_cpus=0.1, num_gpus=gpu_per_bundle, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=ctx.placement_group, placement_group_bundle_index=b)).remote(b)
            for b in ctx.bundle_indices]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ray.get([w.setup.remote(i, len(self.workers), port) for i, w in enumerate(self.workers)])

    def __call__(self, x: float) -> dict:
        ctx = get_replica_context()
        shards = ray.get([w.all_reduce.remote(x * (i + 1)) for i, w in enumerate(self.workers)])
        return {"rank": ctx.rank.rank, "bundle_indices": ctx.bundle_indices, "shards": shards}


def main() -> list[dict]:
    gpus = ray.cluster_resources().get("GPU", 0.0)
    per_bundle = min(1.0, gpus / 4)
    pg = placement_group([{"GPU": per_bundle, "CPU": 0.25}] * 4)
    ray.get(pg.ready())
    try:
        print("bundles (node, GPU id):", [(n[:8], g) for n, g in bundle_locations(pg)])
        mapping = sorted_bundle_mapping(pg, 2)
        print("replica_bundle_mapping:", mapping)
        app = deployment(Engine, name="engine", ray_actor_options={"num_cpus": 0.05},
                         static_placement=StaticPlacementConfig(pg, mapping))
        handle = run(app.bind(per_bundle))
        out = sorted(handle.broadcast(1.0).values(), key=lambda r: r["rank"])
        for r in out:
            print(r)
        print("status:", {rid: (v["phase"], v["bundles"]) for rid, v in handle.status()["replicas"].items()})
        ray.get(get_controller().reset.remote())  # rankcore lets go of the replicas; the group is yours
        return out
    finally:
        remove_placement_group(pg)


if __name__ == "__main__":
    from executors.ray_gpu.api.local import run_locally

    run_locally(main, logical_gpus=4)

"""Colocation: a trainer and inference replicas on the same GPUs (Ray RFC #59857's case).

RL post-training puts the trainer and the inference engines on the same GPUs,
time-sharing them, and syncs weights without a trip over the network. Here
the caller's placement group has one bundle (one GPU) per inference rank; each
bundle holds half a GPU for the replica and half for a trainer actor. After a
training step, the trainer on bundle 0 pushes its weights to every replica:
``ray.put`` once (into the node's shared-memory object store), then
``handle.load_weights.broadcast(ref, version)``; each replica reads the arrays
without a copy (``ray.get`` of numpy arrays maps the object store) and copies
them into its own parameters. Later requests answer with the new weights.

On a GPU, the weights would go by CUDA IPC handles instead (no copy through
host memory): benchmarks/gpu_cuda_ipc.py measures that; benchmarks/bench_colocation.py
measures this CPU path.

    python -m examples.ray.colocation
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from executors.ray_gpu import (
    StaticPlacementConfig,
    deployment,
    get_controller,
    get_deployment_handle,
    get_replica_context,
    run,
)


def build_model(hidden: int) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Policy:
    """An inference replica: answers with its current weights' output."""

    def __init__(self, hidden: int) -> None:
        self.model = build_model(hidden).to(device()).eval()
        self.version = 0

    def load_weights(self, ref: Any, version: int) -> dict:
        """New weights from the object store (``ref``: a dict of numpy arrays)."""
        import torch

        arrays = ref if isinstance(ref, dict) else ray.get(ref)  # (by value, or shared by reference)
        t0 = time.perf_counter()
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                value = arrays[name]
                p.copy_(value if isinstance(value, torch.Tensor) else torch.from_numpy(value))
        self.version = version
        return {"copy_s": time.perf_counter() - t0, "gpu_ids": ray.get_gpu_ids(),
                "node": ray.get_runtime_context().get_node_id()}

    def __call__(self, x: list[float]) -> dict:
        import torch

        with torch.no_grad():
            y = self.model(torch.tensor([x], device=device())).item()
        return {"rank": get_replica_context().rank.rank, "version": self.version, "y": y}


@ray.remote
class Trainer:
    """Trains on the same GPU as an inference replica, then pushes its weights."""

    def __init__(self, hidden: int) -> None:
        self.model = build_model(hidden).to(device())
        self.version = 0
        self.lr = 0.05 * min(1.0, 256 / hidden)  # (a wider model takes smaller steps)

    def train_step(self) -> float:
        import torch

        lr = self.lr
        x = torch.randn(64, 16, device=device())
        loss = ((self.model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()  # learn to sum the inputs
        loss.backward()
        with torch.no_grad():
            for p in self.model.parameters():
                p -= lr * p.grad
                p.grad = None
        self.version += 1
        return float(loss)

    def answer(self, x: list[float]) -> float:
        import torch

        with torch.no_grad():
            return self.model(torch.tensor([x], device=device())).item()

    def push(self, deployment_name: str, by_value: bool = False) -> dict:
        """Every replica of ``deployment_name`` gets these weights: by reference
        (``ray.put`` once, each replica maps them) or by value (sent in each call)."""
        t0 = time.perf_counter()
        arrays = {k: v.detach().cpu().numpy() for k, v in self.model.named_parameters()}
        payload = arrays if by_value else ray.put(arrays)
        t_put = time.perf_counter()
        replicas = get_deployment_handle(deployment_name).load_weights.broadcast(payload, self.version)
        t_end = time.perf_counter()
        return {"total_s": t_end - t0, "put_s": t_put - t0, "broadcast_s": t_end - t_put, "replicas": replicas,
                "gpu_ids": ray.get_gpu_ids(), "node": ray.get_runtime_context().get_node_id(),
                "bytes": sum(a.nbytes for a in arrays.values())}


def colocate(replicas: int, hidden: int, gpu_per_bundle: float) -> tuple[Any, Any, list]:
    """The caller's group (a GPU per rank), the policy on it, and a trainer on each bundle."""
    pg = placement_group([{"GPU": gpu_per_bundle, "CPU": 0.2}] * replicas)
    ray.get(pg.ready())
    app = deployment(Policy, name="policy", ray_actor_options={"num_cpus": 0.05, "num_gpus": gpu_per_bundle / 2},
                     static_placement=StaticPlacementConfig(pg, {r: [r] for r in range(replicas)}))
    handle = run(app.bind(hidden))
    trainers = [Trainer.options(num_cpus=0.05, num_gpus=gpu_per_bundle / 2, scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=b)).remote(hidden) for b in range(replicas)]
    return pg, handle, trainers


def main() -> dict:
    gpus = ray.cluster_resources().get("GPU", 0.0)
    pg, handle, trainers = colocate(2, 256, min(1.0, gpus / 2))
    try:
        x = [1.0] * 16
        print("before:", sorted((r["rank"], r["version"], round(r["y"], 3)) for r in handle.broadcast(x).values()))
        losses = [ray.get(trainers[0].train_step.remote()) for _ in range(20)]
        print(f"trainer 0: 20 steps, loss {losses[0]:.2f} -> {losses[-1]:.2f}")
        pushed = ray.get(trainers[0].push.remote("policy"))
        print(f"pushed {pushed['bytes'] / 1e6:.2f} MB in {pushed['total_s'] * 1e3:.1f} ms "
              f"(put {pushed['put_s'] * 1e3:.1f} ms, broadcast {pushed['broadcast_s'] * 1e3:.1f} ms); trainer on GPU "
              f"{pushed['gpu_ids']}, replicas on {sorted(tuple(r['gpu_ids']) for r in pushed['replicas'].values())}")
        after = [handle.remote(x).result() for _ in range(4)]
        want = ray.get(trainers[0].answer.remote(x))
        print("after:", sorted({(r["rank"], r["version"], round(r["y"], 3)) for r in after}), "trainer:", round(want, 3))
        assert all(abs(r["y"] - want) < 1e-4 and r["version"] == 20 for r in after)
        return pushed
    finally:
        ray.get(get_controller().reset.remote())
        for t in trainers:
            ray.kill(t)
        remove_placement_group(pg)


if __name__ == "__main__":
    from executors.ray_gpu.api.local import run_locally

    run_locally(main, logical_gpus=2)

"""The seed's rank-aware model, with a real torch model inside each replica.

Each replica builds a small torch network whose shard is chosen by its rank;
``reconfigure(user_config, rank)`` runs after ``__init__`` at startup (there is
a user_config) and again whenever the rank changes. Weights are saved as a
``state_dict`` and loaded with ``weights_only=True``; the device is CUDA when
available, else CPU.

    python examples/ray/rank_aware_model.py
"""

from __future__ import annotations

import os
import tempfile

import ray

from executors.ray_gpu import deployment, get_replica_context, run


def save_weights(path: str, seed: int = 0) -> None:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    torch.save(model.state_dict(), path)


@deployment(num_replicas=2, user_config={"model_name": "model_v1"}, ray_actor_options={"num_cpus": 0.1})
class RankAwareModel:
    def __init__(self, weights: str) -> None:
        import torch

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.weights = weights
        self.model_name = None
        self.model = None

    def reconfigure(self, user_config: dict, rank) -> None:
        torch = self.torch
        self.model_name = user_config["model_name"]
        model = torch.nn.Linear(4, 2)
        model.load_state_dict(torch.load(self.weights, weights_only=True))
        with torch.no_grad():  # this rank's shard: scale by (rank + 1)
            model.weight.mul_(rank.rank + 1)
        self.model = model.to(self.device).eval()

    def __call__(self, x: list[float]) -> dict:
        torch = self.torch
        with torch.no_grad():
            y = self.model(torch.tensor([x], device=self.device)).cpu().tolist()[0]
        ctx = get_replica_context()
        return {"model": self.model_name, "rank": ctx.rank.rank, "world_size": ctx.world_size,
                "device": self.device, "y": y}


def main(workdir: str) -> list[dict]:
    weights = os.path.join(workdir, "linear.pt")
    save_weights(weights)
    # Share the cluster's GPUs between the two replicas (each sees its GPU through
    # CUDA_VISIBLE_DEVICES); with no GPU they ask for none and run on the CPU.
    gpus = ray.cluster_resources().get("GPU", 0.0)
    app = RankAwareModel.options(ray_actor_options={"num_cpus": 0.1, "num_gpus": min(1.0, gpus / 2)})
    handle = run(app.bind(weights))
    out = [r.result() for r in [handle.remote([1.0, 2.0, 3.0, 4.0]) for _ in range(8)]]
    for r in sorted({r["rank"]: r for r in out}.values(), key=lambda r: r["rank"]):
        print(r)
    return out


if __name__ == "__main__":
    from executors.ray_gpu.api.local import run_locally

    with tempfile.TemporaryDirectory() as d:
        run_locally(lambda: main(d))

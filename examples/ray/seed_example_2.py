"""The seed's second example ("Handle rank changes with reconfigure",
../shared/seeds/ray-serve-replica-ranks.md), as written there, on the rankcore
Ray executor: its ``reconfigure`` is ``async def``, and is awaited (at start,
with the user_config and the rank).

Changed: the two import lines (``from ray import serve``, ``from
ray.serve.schema import ReplicaRank``) and ``def main():``, the test function
the seed's indented lines come from, where ``seen_ranks`` was defined by the
first example (with a ``return`` for the test that runs it:
tests/integration/test_ray_async_methods.py).

    python examples/ray/seed_example_2.py
"""

from typing import Any

import executors.ray_gpu as serve
from rankcore import ReplicaRank


@serve.deployment(num_replicas=4, user_config={"name": "model_v1"})
class RankAwareModel:
    def __init__(self):
        context = serve.get_replica_context()
        self.rank = context.rank.rank  # Extract integer rank value
        self.world_size = context.world_size
        self.model_name = None
        print(f"Replica rank: {self.rank}/{self.world_size}")

    async def reconfigure(self, user_config: Any, rank: ReplicaRank):
        """Called when user_config or rank changes."""
        self.rank = rank.rank  # Extract integer rank value from ReplicaRank object
        self.world_size = serve.get_replica_context().world_size
        self.model_name = user_config.get("name")
        print(f"Reconfigured: rank={self.rank}, model={self.model_name}")

    def __call__(self):
        return {"rank": self.rank, "model_name": self.model_name}


app2 = RankAwareModel.bind()


def main():
    seen_ranks = set()
    h = serve.run(app2)
    for _ in range(20):
        res = h.remote().result()
        assert res["rank"] in [0, 1, 2, 3]
        assert res["model_name"] == "model_v1"
        seen_ranks.add(res["rank"])
    return seen_ranks


if __name__ == "__main__":
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        print(sorted(main()))
    finally:
        ray.get(serve.get_controller().shutdown_replicas.remote())
        ray.shutdown()

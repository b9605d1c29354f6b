"""The seed's first example ("Access replica ranks", ../shared/seeds/ray-serve-replica-ranks.md),
as written there, on the rankcore Ray executor.

Changed: the import line (``from ray import serve``) and ``def main():``, the
test function the seed's indented lines come from (with a ``return`` for the
test that runs it: tests/integration/test_ray_async_methods.py).

    python examples/ray/seed_example_1.py
"""

import executors.ray_gpu as serve


@serve.deployment(num_replicas=4)
class ModelShard:
    def __call__(self):
        context = serve.get_replica_context()
        return {
            "rank": context.rank.rank,  # Access the integer rank value
            "world_size": context.world_size,
        }


app = ModelShard.bind()


def main():
    h = serve.run(app)
    # Test that we can get rank information from replicas
    seen_ranks = set()
    for _ in range(20):
        res = h.remote().result()
        print(f"Output from __call__: {res}")
        assert res["rank"] in [0, 1, 2, 3]
        assert res["world_size"] == 4
        seen_ranks.add(res["rank"])

    # Verify we hit all replicas
    print(f"Saw ranks: {sorted(seen_ranks)}")
    return seen_ranks


if __name__ == "__main__":
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        main()
    finally:
        ray.get(serve.get_controller().shutdown_replicas.remote())
        ray.shutdown()

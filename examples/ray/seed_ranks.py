"""The seed's first example on the Ray executor: 4 replicas report ranks {0,1,2,3}.

    python examples/ray/seed_ranks.py
"""

from __future__ import annotations

from executors.ray_gpu import deployment, get_replica_context, run


@deployment(num_replicas=4, ray_actor_options={"num_cpus": 0.1})
class ModelShard:
    def __call__(self) -> dict:
        ctx = get_replica_context()
        return {"replica": ctx.replica_id, "rank": ctx.rank.rank, "node_rank": ctx.rank.node_rank,
                "local_rank": ctx.rank.local_rank, "world_size": ctx.world_size}


def main() -> list[dict]:
    handle = run(ModelShard.bind())
    seen = {r["replica"]: r for r in (x.result() for x in [handle.remote() for _ in range(16)])}
    for r in sorted(seen.values(), key=lambda r: r["rank"]):
        print(r)
    return list(seen.values())


if __name__ == "__main__":
    from executors.ray_gpu.api.local import run_locally

    run_locally(main)

"""Routers on Ray (issue 68, docs/routing.md): Ray Serve's ``request_router_config`` chooses the core's
router; a shared system prompt stays on the replica that has it cached, a session stays on its replica.

    python -m examples.ray.routing
"""

from __future__ import annotations

import collections

from executors.ray_gpu import delete, deployment, get_replica_context, run

SYSTEM = "You are a support agent for ACME. Answer in one short paragraph and cite the manual. " * 4


class Chat:
    """A replica: says which replica answered (a model server would answer the prompt)."""

    def __call__(self, request: dict) -> str:
        return get_replica_context().replica_id


def main() -> dict:
    # Serve's PrefixCacheAffinityRouter, by its class path and keywords: the core's prefix_affinity
    llm = deployment(Chat, name="chat", num_replicas=3, ray_actor_options={"num_cpus": 0.1},
                     request_router_config={
                         "request_router_class": "ray.serve.llm.request_router:PrefixCacheAffinityRouter",
                         "request_router_kwargs": {"imbalanced_threshold": 4}})
    h = run(llm.bind())
    shared = collections.Counter(h.remote({"prompt": SYSTEM + f"Question {i}?"}).result() for i in range(6))
    # consistent hashing on a session key (ours: handle.options(routing_key=...))
    h = run(llm.options(request_router="consistent_hash").bind())
    sessions = {user: {h.options(routing_key=user).remote({"prompt": "hi"}).result() for _ in range(3)}
                for user in ("alice", "bob", "carol")}
    delete("chat")
    print("a shared prefix went to:", dict(shared))
    print("each session's replicas:", sessions)
    return {"shared": shared, "sessions": sessions}


if __name__ == "__main__":
    import ray

    ray.init()
    main()

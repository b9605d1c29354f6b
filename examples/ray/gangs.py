"""Gangs: replicas that start, fail and scale together, on consecutive ranks.

``gang_size=2`` makes gangs of two replicas (ranks 0-1, 2-3, ...), placed all
or nothing (``gang_placement="pack"``: one node when they fit). Each member
knows its gang from ``get_replica_context().gang``: ``gang_id``,
``rank_in_gang``, ``gang_size`` and ``members`` (replica ids in gang-rank
order), e.g. to form one collective group per gang. When a member dies,
``gang_failure="restart_gang"`` (the default) restarts the whole gang on the
same ranks (its collective group is broken anyway); ``"restart_replica"``
replaces only that member and tells the others the new member list. Scaling
adds or removes whole gangs (``handle.scale(3)`` raises).

    python -m examples.ray.gangs
"""

from __future__ import annotations

import time

import ray

from executors.ray_gpu import deployment, get_controller, get_replica_context, run
from executors.ray_gpu.control.controller import NAMESPACE, actor_name


@deployment(name="gangs", num_replicas=4, gang_size=2, ray_actor_options={"num_cpus": 0.05})
class Member:
    def __init__(self) -> None:
        g = get_replica_context().gang  # here one would join the gang's collective group
        self.group = (g.gang_id, g.rank_in_gang, g.members)

    def __call__(self) -> dict:
        ctx = get_replica_context()
        assert ctx.gang is not None
        return {"rid": ctx.replica_id, "rank": ctx.rank.rank, "gang": ctx.gang.gang_id,
                "rank_in_gang": ctx.gang.rank_in_gang, "members": ctx.gang.members}


def show(handle, title: str) -> dict[int, dict]:
    out = {r["rank"]: r for r in handle.broadcast().values()}
    print(title)
    for rank, r in sorted(out.items()):
        print(f"  rank {rank}: {r['rid']:<10} {r['gang']} rank_in_gang={r['rank_in_gang']} members={r['members']}")
    return out


def main() -> dict:
    handle = run(Member.bind())
    before = show(handle, "gangs of 2:")
    victim = before[1]["rid"]
    t0 = time.perf_counter()
    ray.kill(ray.get_actor(actor_name("gangs", victim), namespace=NAMESPACE), no_restart=True)
    old = {before[0]["rid"], before[1]["rid"]}
    ctl = get_controller()
    while old & set(handle.ranks()) or not ray.get(ctl.wait_healthy.remote("gangs", 0.1)):
        time.sleep(0.05)
    after = show(handle, f"{victim} killed: gang 0 restarted whole in {time.perf_counter() - t0:.2f} s:")
    try:
        handle.scale(3)
    except ValueError as exc:  # rankcore.InvalidConfig
        print("scale(3):", exc)
    handle.scale(2)
    show(handle, "scale(2): the top gang went whole:")
    return after


if __name__ == "__main__":
    from executors.ray_gpu.api.local import run_locally

    run_locally(main)

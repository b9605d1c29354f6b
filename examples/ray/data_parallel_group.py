"""A data-parallel deployment whose collective group re-forms in place (issue 67, docs/groups.md).

``collective_group=True``: the core keeps an epoch for the replicas' group and tells every member
each new one (after a crash's replacement is up, a downscale's compaction, an upscale). Each replica
runs a loop of its own, as a data-parallel engine does: ``pg.ensure()`` joins the newest epoch
(destroying the old ``torch.distributed`` group, rendezvous fenced by the epoch), then an
all-reduce. A member killed: its replacement joins on its rank, the survivors re-form in their own
processes, the all-reduce is right again.

    python -m examples.ray.data_parallel_group
"""

from __future__ import annotations

import os
import threading
import time

from executors.ray_gpu import get_replica_context
from executors.ray_gpu.replica.collective import GroupReforming, ProcessGroup


class DataParallel:
    """Each replica all-reduces its rank + 1 over the group, again and again (a data-parallel step);
    a call says what the last step gave and in which epoch."""

    def __init__(self) -> None:
        self.pg = ProcessGroup(backend="gloo", timeout_s=5.0)
        self.last: tuple[int, int, float] | None = None  # (epoch, world size, the sum)
        self.errors = 0
        self.stop = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        import torch
        import torch.distributed as dist

        while not self.stop.is_set():
            try:
                g = self.pg.ensure(wait_s=1.0)
                t = torch.tensor([float(g.rank + 1)])
                dist.all_reduce(t)
                self.last = (g.epoch, g.world_size, t.item())
            except Exception:  # a member gone mid-call, or no epoch yet: leave it, wait for the next one
                self.errors += 1
                self.last = None
                self.pg.failed(wait_s=1.0)
            self.stop.wait(0.05)

    def __call__(self) -> dict:
        ctx = get_replica_context()
        g = ctx.group
        import ray

        return {"rid": ctx.replica_id, "pid": os.getpid(), "last": self.last, "rank": ctx.rank.rank,
                "node": ray.get_runtime_context().get_node_id(), "address": self.pg.address,
                "group": (g.epoch, g.rank, g.world_size, g.in_place) if g is not None else None}

    def step_now(self) -> float:
        """A request that needs the group: refused clearly while it re-forms."""
        if self.last is None:
            raise GroupReforming("the group is re-forming")
        return self.last[2]

    def __del__(self) -> None:
        self.stop.set()


def main() -> dict:
    import ray

    from executors.ray_gpu import deployment, run
    from executors.ray_gpu.control.controller import NAMESPACE, actor_name

    handle = run(deployment(DataParallel, name="dp", num_replicas=4, collective_group=True,
                            ray_actor_options={"num_cpus": 0.05}).bind())

    def right(above: int) -> dict[int, dict]:
        while True:
            try:
                got = {r["rank"]: r for r in handle.broadcast(timeout=10).values()}
            except Exception:  # (a member dying under the call)
                time.sleep(0.05)
                continue
            lasts = {r["last"] for r in got.values()}
            if len(got) == 4 and len(lasts) == 1 and None not in lasts and next(iter(lasts))[0] > above:
                return got
            time.sleep(0.05)

    before = right(0)
    print("epoch", before[0]["last"][0], "sum", before[0]["last"][2], "pids", [before[k]["pid"] for k in range(4)])
    t0 = time.perf_counter()
    ray.kill(ray.get_actor(actor_name("dp", before[2]["rid"]), namespace=NAMESPACE), no_restart=True)
    after = right(before[0]["last"][0])
    print(f"rank 2 killed: re-formed at epoch {after[0]['last'][0]} in {time.perf_counter() - t0:.2f} s, "
          f"sum {after[0]['last'][2]}, pids {[after[k]['pid'] for k in range(4)]}")
    return after


if __name__ == "__main__":
    main()

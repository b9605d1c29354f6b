"""Colocation and gang figures on the Ray executor (prints numbers; not a test).

1. Weight push, CPU path (examples/ray/colocation.py): a static deployment of
   2 inference replicas on a caller's placement group of 2 bundles (one
   logical GPU each), a trainer actor colocated on bundle 0. The trainer
   pushes a state dict of S MiB (float32) to both replicas:

   * ``by reference``: ``ray.put`` once into the node's shared-memory object
     store, then ``handle.load_weights.broadcast(ref)``; each replica maps the
     arrays (``ray.get``, no copy) and copies them into its parameters;
   * ``by value``: the arrays go in each call (Ray serialises them per call).

   Timed in the trainer with ``time.perf_counter``, from its parameters to
   both replicas answering ``load_weights`` (``total``); ``put`` and
   ``broadcast`` split it; ``replica copy`` is the slower replica's own
   copy into its parameters. ``memcpy`` is one in-process ``torch`` copy of
   the same bytes (the floor for the replicas' copy). Median of
   ``--repeats`` pushes after one warm-up; all runs listed.

2. Restart: time from ``ray.kill`` of one replica until every rank it
   affects answers a request from a new replica and the deployment is
   healthy: a gang of 2 with ``restart_gang`` (both members restarted), a
   gang of 2 with ``restart_replica``, and 2 plain replicas (one restarted).
   Median of ``--repeats`` kills each (alternating), all runs listed.

    .venv/bin/python benchmarks/bench_colocation.py [--sizes 16,128,512] [--repeats 5]

Local Ray (4 CPUs, 2 logical GPUs for part 1, 4 for part 2), no real GPU
needed; on a GPU see benchmarks/gpu_cuda_ipc.py for the CUDA IPC path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import ROOT, use_this_tree

use_this_tree()
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))

import ray  # noqa: E402

from examples.ray.colocation import colocate  # noqa: E402
from executors.ray_gpu import deployment, get_controller, get_replica_context, run  # noqa: E402
from executors.ray_gpu.control.controller import NAMESPACE, actor_name  # noqa: E402


def hidden_for(mib: float) -> int:
    """The MLP width whose float32 parameters weigh ``mib`` MiB (18 h + 1 floats)."""
    return max(1, int(mib * 1024**2 / 4 / 18))


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:9.1f} ms  [{', '.join(f'{x * 1e3:.0f}' for x in xs)}]"


def memcpy_s(nbytes: int, repeats: int) -> float:
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_push(sizes: list[float], repeats: int) -> None:
    print("\n1. weight push, trainer colocated with replica 0 (CPU path; 2 replicas)")
    for mib in sizes:
        pg, handle, trainers = colocate(2, hidden_for(mib), 1.0)
        try:
            trainer = trainers[0]
            rows: dict[str, dict[str, list[float]]] = {}
            nbytes = 0
            for mode in ("by reference", "by value"):
                ray.get(trainer.push.remote("policy", mode == "by value"))  # warm-up
                got: dict[str, list[float]] = {"total": [], "put": [], "broadcast": [], "copy": []}
                for _ in range(repeats):
                    ray.get(trainer.train_step.remote())
                    r = ray.get(trainer.push.remote("policy", mode == "by value"))
                    nbytes = r["bytes"]
                    got["total"].append(r["total_s"])
                    got["put"].append(r["put_s"])
                    got["broadcast"].append(r["broadcast_s"])
                    got["copy"].append(max(x["copy_s"] for x in r["replicas"].values()))
                rows[mode] = got
            x = [1.0] * 16
            want = ray.get(trainer.answer.remote(x))
            answers = [handle.remote(x).result() for _ in range(4)]
            assert all(abs(a["y"] - want) < 1e-3 for a in answers), (answers, want)  # the last push is what serves
            print(f"\n  state dict {nbytes / 1024**2:.1f} MiB; memcpy of it in one process "
                  f"{memcpy_s(nbytes, 5) * 1e3:.1f} ms")
            for mode, got in rows.items():
                print(f"  {mode:<13} total     {fmt(got['total'])}")
                print(f"  {'':<13} put       {fmt(got['put'])}")
                print(f"  {'':<13} broadcast {fmt(got['broadcast'])}")
                print(f"  {'':<13} replica copy {fmt(got['copy'])}")
        finally:
            ray.get(get_controller().reset.remote())
            for t in trainers:
                ray.kill(t)
            ray.util.remove_placement_group(pg)


class Echo:
    def __call__(self) -> tuple:
        ctx = get_replica_context()
        return ctx.replica_id, ctx.rank.rank


def restart_time(handle, name: str, rank: int, affected: list[int]) -> float:
    ranks = {v[0]: rid for rid, v in handle.ranks().items()}
    old = {ranks[r] for r in affected}
    t0 = time.perf_counter()
    ray.kill(ray.get_actor(actor_name(name, ranks[rank]), namespace=NAMESPACE), no_restart=True)
    deadline = t0 + 120
    while time.perf_counter() < deadline:
        status = handle.status()
        if status["healthy"] and not old & set(status["replicas"]):
            answers = dict((r, rid) for rid, r in handle.broadcast().values())
            if all(answers.get(r) not in old and answers.get(r) is not None for r in affected):
                return time.perf_counter() - t0
        time.sleep(0.01)
    raise TimeoutError(f"{name}: not back within 120 s")


def bench_restart(repeats: int) -> None:
    print("\n2. kill one replica -> every affected rank served by a new replica, deployment healthy")
    opts = {"num_cpus": 0.05, "num_gpus": 0.5}
    cases = {
        "gang of 2, restart_gang (2 restarted)": (deployment(Echo, name="gang", num_replicas=2, gang_size=2,
                                                             ray_actor_options=opts), [0, 1]),
        "gang of 2, restart_replica (1 restarted)": (deployment(Echo, name="member", num_replicas=2, gang_size=2,
                                                                gang_failure="restart_replica",
                                                                ray_actor_options=opts), [1]),
        "2 plain replicas (1 restarted)": (deployment(Echo, name="single", num_replicas=2,
                                                      ray_actor_options=opts), [1]),
    }
    handles = {label: run(d.bind()) for label, (d, _) in cases.items()}
    times: dict[str, list[float]] = {label: [] for label in cases}
    for label, (d, affected) in cases.items():  # warm-up: workers started once
        restart_time(handles[label], d.name, 1, affected)
    for _ in range(repeats):
        for label, (d, affected) in cases.items():
            times[label].append(restart_time(handles[label], d.name, 1, affected))
    for label, xs in times.items():
        print(f"  {label:<42} {fmt(xs)}")
    ray.get(get_controller().reset.remote())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="16,128,512", help="state dict sizes in MiB, comma separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-push", action="store_true")
    ap.add_argument("--skip-restart", action="store_true")
    args = ap.parse_args()
    sizes = [float(s) for s in args.sizes.split(",") if s]
    store = int(max(sizes) * 1024**2 * 4 + 256 * 1024**2)
    ray.init(address="local", num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False,
             object_store_memory=store)
    print(f"ray {ray.__version__}, {os.cpu_count()} CPUs, median of {args.repeats} (ms) [each run]")
    try:
        if not args.skip_push:
            bench_push(sizes, args.repeats)
        if not args.skip_restart:
            bench_restart(args.repeats)
    finally:
        ray.get(get_controller().shutdown_replicas.remote())
        ray.shutdown()


if __name__ == "__main__":
    main()

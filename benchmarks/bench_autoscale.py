"""Benchmark rankcore's autoscaler on Ray against Ray Serve's, same bursty load, same knobs, one run.

What it measures
----------------
Both systems serve the same model (``async def __call__``: ``await asyncio.sleep(--work)``, then
its replica id and rank), autoscaled with the same Ray Serve keys: ``min_replicas`` 1,
``max_replicas`` (``--max``, 4), ``target_ongoing_requests`` 2, ``upscale_delay_s`` 1,
``downscale_delay_s`` 3, ``metrics_interval_s`` 0.5, ``look_back_period_s`` 2, default
``max_ongoing_requests`` (5). Each system in a child process of its own with a fresh local Ray
(``childrun.py``), one after the other. The load, handle calls from one asyncio loop (closed
loop, every call bounded by ``--request-timeout``): 1 client for ``--calm`` s, ``--clients``
clients for ``--burst`` s, then nothing for ``--idle`` s. A sampler reads the replica count every
0.2 s (ours: the controller's ``deployment_status``; Serve: ``serve.status()``).

Reported per system: *to enough*, seconds from the burst's start until min(max, ceil(clients /
target)) replicas run; *replica-seconds* (replicas alive, integrated over the whole run; one
0.2 s sample of 4 replicas is 0.8, about 1% of a run's), and per 1,000 calls answered;
requests failed; *queue wait p99* (a call's latency minus ``--work``: the time it waited for a
replica); *reassigned*, replicas seen answering with another rank than before; *rank
reconfigures*, ``reconfigure`` calls with a new rank that replicas reported. The last two are
what the answers show (a replica that stopped before answering again is not seen), so the load ends
with 1 client for ``--tail`` s: the replica that is left answers with the rank it holds then.

Layouts (``--layout``)
----------------------
``two-nodes`` (the default) is where the downscale's choice of victims shows: a local
``ray.cluster_utils.Cluster`` of a head node (the controllers; no replica fits there) and node
*a* with room for 1 replica (custom resource ``replica_slot``: 1), where the first replica
(rank 0) starts; just before the load node *b* joins with room for 3 (the cluster grew), and the
burst's replicas (ranks 1 to 3) start there. On the way back to 1, Ray Serve stops replicas on
the node with the fewest replicas first (its ``_get_replicas_to_stop``: free a node), which is
rank 0 on *a*, so a replica on *b* is given rank 0 (a reassignment and a rank ``reconfigure``);
rankcore stops the highest ranks (the replicas on *b*) and rank 0 stays. ``one-node``: one local
Ray with ``--num-cpus`` CPUs, both systems stop the newest replicas (the highest ranks).

How to run
----------
    .venv/bin/python benchmarks/bench_autoscale.py                 # both, ~2 x 60 s
    .venv/bin/python benchmarks/bench_autoscale.py --layout one-node
    .venv/bin/python benchmarks/bench_autoscale.py --only ours --json out.json

Needs the ``bench`` extra (Ray Serve). Timings on a shared machine are noisy: compare the ratios
within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import pathlib
import sys
import threading
import time
from typing import Any

from common import ROOT, OursReplica, ServeReplica, awaitable, use_this_tree

use_this_tree()

import childrun  # noqa: E402 - (benchmarks/childrun.py: each system in a child process)

DEP = "scaled"
ACTOR_OPTIONS = {"num_cpus": 0.1}
SLOT = "replica_slot"  # (two-nodes: a custom resource only the worker nodes have, one per replica)
LAYOUTS = ("two-nodes", "one-node")
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_autoscale {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def actor_options(args: argparse.Namespace) -> dict:
    return {**ACTOR_OPTIONS, "resources": {SLOT: 1.0}} if args.layout == "two-nodes" else dict(ACTOR_OPTIONS)


def knobs(args: argparse.Namespace) -> dict:
    return {"min_replicas": 1, "max_replicas": args.max, "target_ongoing_requests": 2.0, "upscale_delay_s": 1.0,
            "downscale_delay_s": 3.0, "metrics_interval_s": 0.5, "look_back_period_s": 2.0}


# --------------------------------------------------------------------- models
def _rank(ctx: Any) -> int | None:
    r = getattr(ctx, "rank", None)
    return getattr(r, "rank", r)


class _Counting:
    """Counts ``reconfigure`` calls that bring a new rank (both systems call it on a rank change)."""

    context: Any = None  # (the system's: OursReplica or ServeReplica, first among the bases)

    def __init__(self) -> None:
        self.last_rank: int | None = None
        self.rank_reconfigures = 0

    def reconfigure(self, config: Any, rank: Any = None) -> None:
        r = getattr(rank, "rank", rank)
        if r is not None and self.last_rank is not None and r != self.last_rank:
            self.rank_reconfigures += 1
        if r is not None:
            self.last_rank = r

    async def __call__(self, work: float) -> tuple:
        await asyncio.sleep(work)
        ctx = self.context()
        return str(ctx.replica_id), _rank(ctx), self.rank_reconfigures


class OursModel(OursReplica, _Counting):
    pass


class ServeModel(ServeReplica, _Counting):
    pass


# ------------------------------------------------------------------- systems
class Ours:
    name = "ours"

    def deploy(self, args: argparse.Namespace) -> Any:
        from executors.ray_gpu import deployment, run

        d = deployment(OursModel, name=DEP, ray_actor_options=actor_options(args), autoscaling_config=knobs(args),
                       user_config={})
        self.handle = run(d.bind(), timeout=120)
        from executors.ray_gpu import get_controller
        self.ctl = get_controller()
        return self.handle

    def replicas(self) -> tuple[int, int]:
        """(alive, running)"""
        from executors.ray_gpu.api.deployments import ask

        st = ask(self.ctl, "deployment_status", DEP, timeout=10)
        reps = st["replicas"].values()
        return len(reps), sum(1 for r in reps if r["phase"] == "running")

    def shutdown(self) -> None:
        childrun.ours_shutdown(log)


class Serve:
    name = "serve"

    def deploy(self, args: argparse.Namespace) -> Any:
        from ray import serve

        serve.start(proxy_location="Disabled")  # (handle calls only: no HTTP proxy on every node)
        d: Any = serve.deployment(ServeModel, name=DEP, ray_actor_options=actor_options(args),
                                  autoscaling_config=knobs(args), user_config={})
        return serve.run(d.bind(), name=DEP, route_prefix=None)

    def replicas(self) -> tuple[int, int]:
        from ray import serve

        states = serve.status().applications[DEP].deployments[DEP].replica_states
        named = {str(getattr(s, "value", s)): n for s, n in states.items()}  # (ReplicaState keys)
        return sum(n for s, n in named.items() if s != "STOPPING"), int(named.get("RUNNING", 0))

    def shutdown(self) -> None:
        childrun.serve_shutdown(log)


class Layout:
    """The Ray each system runs on (``--layout``): started here, grown just before the load, shut
    down after the system."""

    def __init__(self, args: argparse.Namespace) -> None:
        import ray

        self.cluster: Any = None
        if args.layout == "one-node":
            ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
                     object_store_memory=256 * 1024**2, log_to_driver=False)
            return
        from ray.cluster_utils import Cluster

        from executors.ray_gpu.control.cluster import FAST_HEALTH_CHECKS

        store = 96 * 1024**2
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": args.num_cpus, "include_dashboard": False, "object_store_memory": store,
            "_system_config": FAST_HEALTH_CHECKS})
        self.store = store
        self.max = args.max
        try:
            self.cluster.add_node(num_cpus=1, resources={SLOT: 1.0}, object_store_memory=store)  # node a
            self.cluster.wait_for_nodes()
            ray.init(address=self.cluster.address, log_to_driver=False)
        except BaseException:
            self.cluster.shutdown()  # (no Ray left behind by a failed start)
            raise

    def grow(self) -> None:
        """Node b, with room for the rest of ``--max``, joins (two-nodes)."""
        if self.cluster is not None:
            self.cluster.add_node(num_cpus=max(1, self.max - 1), resources={SLOT: float(self.max - 1)},
                                  object_store_memory=self.store)
            self.cluster.wait_for_nodes()
            log("node b joined")

    def shutdown(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()


# ----------------------------------------------------------------- measuring
async def drive(handle: Any, args: argparse.Namespace, answers: list, errors: list) -> float:
    """The load; returns the burst's start (perf_counter)."""
    loop = asyncio.get_running_loop()

    async def client(until: float) -> None:
        while loop.time() < until:
            t = time.perf_counter()
            try:
                rid, rank, reconf = await asyncio.wait_for(awaitable(handle.remote(args.work)), args.request_timeout)
                answers.append((time.perf_counter() - t, rid, rank, reconf))
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    await client(loop.time() + args.calm)
    burst = time.perf_counter()
    end = loop.time() + args.burst
    await asyncio.gather(*(client(end) for _ in range(args.clients)))
    await asyncio.sleep(args.idle)
    await client(loop.time() + args.tail)
    return burst


def run_child(system_name: str, args: argparse.Namespace) -> dict:
    import ray

    res: dict[str, Any] = {"system": system_name, "ray_version": ray.__version__, "errors": []}
    system: Any = Ours() if system_name == "ours" else Serve()
    cluster = Layout(args)
    samples: list[tuple[float, int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                alive, running = system.replicas()
                samples.append((time.perf_counter(), alive, running))
            except Exception as exc:  # (counted: a sampler gap)
                res.setdefault("sampler_errors", []).append(repr(exc)[:200])
            stop.wait(0.2)

    try:
        handle = system.deploy(args)
        log(f"{system_name}: deployed")
        cluster.grow()
        sampler = threading.Thread(target=sample, daemon=True)
        start = time.perf_counter()
        sampler.start()
        answers: list = []
        failed: list = []
        burst = childrun.run_async(drive(handle, args, answers, failed))
        stop.set()
        sampler.join(5)
        enough = min(args.max, math.ceil(args.clients / 2.0))
        reached = next((t - burst for t, _, running in samples if t >= burst and running >= enough), None)
        rs = sum((b[0] - a[0]) * a[1] for a, b in itertools.pairwise(samples))
        waits = sorted(max(0.0, lat - args.work) for lat, *_ in answers)
        ranks: dict[str, set] = {}
        reconf: dict[str, int] = {}
        for _, rid, rank, rc_ in answers:
            ranks.setdefault(rid, set()).add(rank)
            reconf[rid] = max(reconf.get(rid, 0), rc_)
        res.update({"answers": len(answers), "failed": len(failed), "first_failures": failed[:3],
                    "enough": enough, "to_enough_s": reached, "replica_s": rs, "run_s": time.perf_counter() - start,
                    "max_replicas_seen": max((a for _, a, _ in samples), default=0),
                    "end_replicas": samples[-1][1] if samples else None,
                    "queue_wait_p99_ms": 1000 * waits[min(len(waits) - 1, round(0.99 * len(waits)))] if waits else None,
                    "replica_s_per_1k": 1000 * rs / len(answers) if answers else None,
                    "reassigned": sum(1 for s in ranks.values() if len(s) > 1),
                    "rank_reconfigures": sum(reconf.values())})
        log(f"{system_name}: {res}")
    except Exception as exc:
        res["errors"].append(f"{type(exc).__name__}: {exc}"[:2000])
        log(f"{system_name}: ERROR {exc!r}")
    finally:
        stop.set()
        system.shutdown()
        cluster.shutdown()
    return res


# ----------------------------------------------------------------- reporting
ROWS = [("to enough (s)", "to_enough_s", True), ("replica-seconds", "replica_s", True),
        ("requests failed", "failed", True), ("queue wait p99 (ms)", "queue_wait_p99_ms", True),
        ("reassigned", "reassigned", True), ("rank reconfigures", "rank_reconfigures", True),
        ("answers", "answers", False), ("replica-s / 1k answers", "replica_s_per_1k", True), ("most replicas", "max_replicas_seen", False),
        ("replicas at the end", "end_replicas", False)]


def print_report(results: dict, args: argparse.Namespace) -> list[dict]:
    a, b = results.get("ours", {}), results.get("serve", {})
    version = next((r.get("ray_version") for r in results.values() if r.get("ray_version")), "?")
    print(f"\nautoscaling: rankcore vs Ray Serve, Ray {version}, layout {args.layout}, {args.clients} clients x "
          f"{args.burst:g} s burst (calm {args.calm:g} s, idle {args.idle:g} s, tail {args.tail:g} s), work "
          f"{args.work:g} s, knobs {knobs(args)}, {os.cpu_count()} CPUs")
    rows = childrun.ratio_table(ROWS, a, b)
    for name, res in results.items():
        for e in res.get("first_failures", []) + res.get("errors", []):
            print(f"{name}: ERROR: {e}")
    return rows


def spawn(system_name: str, args: argparse.Namespace) -> dict:
    argv = ["--clients", str(args.clients), "--burst", str(args.burst), "--calm", str(args.calm),
            "--idle", str(args.idle), "--tail", str(args.tail), "--layout", args.layout,
            "--work", str(args.work), "--max", str(args.max),
            "--request-timeout", str(args.request_timeout), "--num-cpus", str(args.num_cpus)]
    limit = args.calm + args.burst + args.idle + args.tail + args.request_timeout + 240
    return childrun.spawn(str(pathlib.Path(__file__).resolve()), system_name, argv, limit, log)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=16, help="clients in the burst; default 16")
    p.add_argument("--burst", type=float, default=12.0, help="burst seconds; default 12")
    p.add_argument("--calm", type=float, default=2.0, help="seconds of 1 client before it; default 2")
    p.add_argument("--idle", type=float, default=10.0, help="seconds of no load after it; default 10")
    p.add_argument("--tail", type=float, default=5.0, help="seconds of 1 client at the end; default 5")
    p.add_argument("--layout", choices=LAYOUTS, default=LAYOUTS[0],
                   help="two-nodes (default: a local cluster, see above) or one-node")
    p.add_argument("--work", type=float, default=0.2, help="seconds one call takes; default 0.2")
    p.add_argument("--max", type=int, default=4, help="max_replicas; default 4")
    p.add_argument("--request-timeout", type=float, default=60.0, help="limit of one call; default 60")
    p.add_argument("--num-cpus", type=int, default=4, help="num_cpus of the (head) node; default 4")
    childrun.add_child_arguments(p)
    args = p.parse_args(argv)
    if args.layout == "two-nodes" and args.max < 2:
        p.error("--layout two-nodes needs --max 2 or more (node a holds 1 replica, node b the rest)")
    childrun.ray_env(ROOT, ROOT / "benchmarks")
    return childrun.main_for(args, run_child, spawn, print_report, log)


if __name__ == "__main__":
    sys.exit(main())

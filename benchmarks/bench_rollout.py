"""Benchmark a rolling update under load, rankcore on Ray against Ray Serve, same app, one run.

What it measures
----------------
Both systems serve the same app: ``--replicas`` (8) replicas (``num_cpus`` 0.1 each), a
``user_config`` and a rank-aware ``reconfigure(user_config, rank)`` (so both call it at start and on
every rank change), ``async def __call__``: ``await asyncio.sleep(--work)``, then its code's tag
(``"v1"``), its replica id and the rank it holds. Each system in a child process of its own with a
fresh local Ray (``childrun.py``, ``--num-cpus`` logical CPUs), one after the other. Once the 8 v1
replicas serve, ``--clients`` closed-loop clients call it through a handle from one asyncio loop
(every call bounded by ``--request-timeout``); after ``--warm`` s the same deployment name is
applied again with a new class (``"v2"``: other code, nothing else changed) from a thread, while the
load goes on, until the rollout is over and ``--tail`` s more. Both at their default pace, one
replica at a time (rankcore's ``max_unavailable`` 0.2 and Ray Serve's ``rolling_update_percentage``
0.2 of 8: 1; no surge unless ``--surge-percent`` gives Serve's ``max_surge_percent`` and ours the same
``max_surge``, docs/rollouts.md, "Surge"); ours is given no ``version``: the class's
code fingerprint changed (docs/rollouts.md), Serve gives every redeploy a new version.

Every ``reconfigure`` call reports to a recorder actor: the replica's id, its code's tag and the
(rank, node_rank, local_rank) it was given. Reported per system:

- *to all-new*: seconds from the apply until the status shows exactly ``--replicas`` replicas, all
  running the new code (ours: ``deployment_status``, every replica ``running`` on the deployment's
  revision, HEALTHY; Serve: ``serve.status()``, only RUNNING replicas, the deployment HEALTHY), the
  v2 replicas hold the global ranks 0..N-1, one each, as their last ``reconfigure`` said (so a
  compaction after the update is part of it), and no v1 answer came later (sampled every 0.2 s);
  *apply returned*: when ``run()`` / ``serve.run()`` returned;
- *requests failed* (an exception or past the timeout; calls sent from the apply on) and
  *answered*, from the apply to all-new, per second too (``--clients`` / ``--work`` at most: the
  capacity kept during the update); *latency p99* of those answers;
- *rank moved*: replicas given another rank after they started (a ``reconfigure`` with a new rank
  triple). A successor that starts on the ranks its predecessor freed never moves; one started on
  a rank beyond the fleet's (while the replica it replaces still drains, Ray Serve gives the next
  free rank, 8) is moved back into 0..N-1 by Serve's compaction once the deployment is healthy again;
- *started off-range*: replicas started on a global rank outside 0..N-1 (the world briefly larger);
- *reconfigure calls* since the apply (one per v2 replica at start, plus rank changes) and *rank
  reconfigures*, those with a new rank.

The goal (issue): no request lost and 0 rank moves, where Serve's compaction moves ranks.

How to run
----------
    .venv/bin/python benchmarks/bench_rollout.py                      # both, ~2 x 60 s
    .venv/bin/python benchmarks/bench_rollout.py --replicas 4 --clients 2
    .venv/bin/python benchmarks/bench_rollout.py --only ours --json out.json

Needs the ``bench`` extra (Ray Serve). Timings on a shared machine are noisy: compare the ratios
within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
import threading
import time
from typing import Any

from common import ROOT, OursReplica, ServeReplica, awaitable, replica_id, use_this_tree

use_this_tree()

import childrun  # noqa: E402 - (benchmarks/childrun.py: each system in a child process)

DEP = "rolling"
ACTOR_OPTIONS = {"num_cpus": 0.1}
RECORDER, RECORDER_NS = "bench_rollout_recorder", "bench_rollout"
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_rollout {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------- models
class Recorder:
    """One actor per run (named, ``RECORDER_NS``): the ``reconfigure`` calls of every replica."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str, str, tuple]] = []

    def record(self, t: float, tag: str, replica_id: str, rank: tuple) -> None:
        self.calls.append((t, tag, replica_id, tuple(rank)))

    def settled(self, tag: str, n: int) -> bool:
        """The replicas of ``tag`` hold the global ranks 0..n-1, one each (their last calls)."""
        last = {rid: rank for _, t, rid, rank in sorted(self.calls) if t == tag}
        return sorted(r[0] for r in last.values()) == list(range(n))

    def all(self) -> list:
        return list(self.calls)


class _Model:
    """Answers its code's tag, its replica id and its rank; tells the recorder every
    ``reconfigure`` (both systems call it at start with the rank, and on each rank change)."""

    TAG = ""
    context: Any = None  # (the system's: OursReplica or ServeReplica, first among the bases)

    def __init__(self) -> None:
        self.rank: tuple | None = None
        self._recorder: Any = None

    def _rid(self) -> str:
        return replica_id(self.context())

    def reconfigure(self, user_config: Any, rank: Any) -> None:
        import ray

        self.rank = (rank.rank, rank.node_rank, rank.local_rank)
        if self._recorder is None:
            self._recorder = ray.get_actor(RECORDER, namespace=RECORDER_NS)
        self._recorder.record.remote(time.time(), self.TAG, self._rid(), self.rank)

    async def __call__(self, work: float) -> tuple:
        await asyncio.sleep(work)
        return self.TAG, self._rid(), self.rank


class OursV1(OursReplica, _Model):
    TAG = "v1"


class OursV2(OursReplica, _Model):
    TAG = "v2"


class ServeV1(ServeReplica, _Model):
    TAG = "v1"


class ServeV2(ServeReplica, _Model):
    TAG = "v2"


# ------------------------------------------------------------------- systems
class Ours:
    name = "ours"
    models = (OursV1, OursV2)

    def deploy(self, cls: type, args: argparse.Namespace) -> Any:
        from executors.ray_gpu import deployment, get_controller, run
        from executors.ray_gpu.api.config import max_surge_of_percent

        d = deployment(cls, name=DEP, num_replicas=args.replicas, ray_actor_options=dict(ACTOR_OPTIONS),
                       user_config={"n": 1}, max_surge=max_surge_of_percent(args.surge_percent))
        handle = run(d.bind(), timeout=args.max_rollout)
        self.ctl = get_controller()
        return handle

    def all_new(self, n: int) -> bool:
        """Exactly ``n`` replicas, all running the deployment's revision, HEALTHY."""
        from executors.ray_gpu.api.deployments import ask

        st = ask(self.ctl, "deployment_status", DEP, timeout=10)
        reps = list(st["replicas"].values())
        return (st["status"] == "HEALTHY" and len(reps) == n
                and all(r["phase"] == "running" and r["revision"] == st["revision"] for r in reps))

    def shutdown(self) -> None:
        childrun.ours_shutdown(log)


class Serve:
    name = "serve"
    models = (ServeV1, ServeV2)

    def deploy(self, cls: type, args: argparse.Namespace) -> Any:
        from ray import serve

        serve.start(proxy_location="Disabled")  # (handle calls only)
        d: Any = serve.deployment(cls, name=DEP, num_replicas=args.replicas,
                                  ray_actor_options=dict(ACTOR_OPTIONS), user_config={"n": 1})
        if args.surge_percent:
            d = d.options(max_surge_percent=args.surge_percent)
        return serve.run(d.bind(), name=DEP, route_prefix=None)

    def all_new(self, n: int) -> bool:
        """Only ``n`` RUNNING replicas (none starting, updating or stopping), HEALTHY."""
        from ray import serve

        dep = serve.status().applications[DEP].deployments[DEP]
        named = {str(getattr(s, "value", s)): c for s, c in dep.replica_states.items() if c}
        return str(getattr(dep.status, "value", dep.status)) == "HEALTHY" and named == {"RUNNING": n}

    def shutdown(self) -> None:
        childrun.serve_shutdown(log)


# ----------------------------------------------------------------- measuring
async def drive(system: Any, handle: Any, recorder: Any, args: argparse.Namespace, res: dict,
                answers: list, failed: list) -> None:
    """The load, the apply of v2 in a thread meanwhile, and the wait for all-new."""
    import ray

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                tag, rid, rank = await asyncio.wait_for(awaitable(handle.remote(args.work)), args.request_timeout)
                answers.append((t, time.perf_counter(), tag, rid, rank))
            except Exception as exc:
                failed.append((t, f"{type(exc).__name__}: {exc}"[:200]))

    clients = [asyncio.ensure_future(client()) for _ in range(args.clients)]
    await asyncio.sleep(args.warm)
    res["apply_wall"] = time.time()
    t_apply = res["t_apply"] = time.perf_counter()
    returned: dict[str, Any] = {}

    def apply() -> None:
        try:
            system.deploy(system.models[1], args)
            returned["s"] = time.perf_counter() - t_apply
        except Exception as exc:
            returned["error"] = f"apply: {type(exc).__name__}: {exc}"[:2000]

    applier = threading.Thread(target=apply, daemon=True)
    applier.start()

    def done() -> bool:
        return (ray.get(recorder.settled.remote("v2", args.replicas), timeout=10)
                and system.all_new(args.replicas))

    t_done = None
    while time.perf_counter() - t_apply < args.max_rollout:
        try:
            if await loop.run_in_executor(None, done):
                t_done = time.perf_counter()
                break
        except Exception as exc:  # (a sampler gap, counted)
            res.setdefault("sampler_errors", []).append(repr(exc)[:200])
        await asyncio.sleep(0.2)
    res["t_done"] = t_done
    if t_done is not None:
        await asyncio.sleep(args.tail)
    stop.set()
    await asyncio.gather(*clients)
    await loop.run_in_executor(None, applier.join, 60.0)
    res["apply_returned_s"] = returned.get("s")
    if "error" in returned:
        res["errors"].append(returned["error"])
    if t_done is None:
        res["errors"].append(f"not all-new within --max-rollout {args.max_rollout:g} s")


def rank_figures(calls: list, since: float, n: int) -> dict:
    """From the recorder's ``(time, tag, replica id, rank)`` calls: replicas whose rank moved after
    their start, replicas started off 0..n-1, reconfigure calls since the apply and those with a new
    rank, the v2 replicas' start ranks (in start order) and their moves."""
    last: dict[str, tuple] = {}
    moved: set[str] = set()
    off, reconf, rank_reconf, starts, moves = 0, 0, 0, [], []
    for t, tag, rid, rank in sorted(calls):
        if t >= since:
            reconf += 1
        if rid not in last:
            if rank[0] >= n:
                off += 1
            if tag == "v2":
                starts.append(rank[0])
        elif rank != last[rid]:
            moved.add(rid)
            rank_reconf += 1
            moves.append(f"{rid[:8]} {list(last[rid])}->{list(rank)}")
        last[rid] = rank
    return {"rank_moved": len(moved), "started_off_range": off, "reconfigures": reconf,
            "rank_reconfigures": rank_reconf, "v2_start_ranks": starts, "rank_moves": moves,
            "final_ranks": sorted(r[0] for rid, r in last.items()
                                  if any(c[1] == "v2" and c[2] == rid for c in calls))}


def run_child(system_name: str, args: argparse.Namespace) -> dict:
    import ray

    res: dict[str, Any] = {"system": system_name, "ray_version": ray.__version__, "errors": []}
    system: Any = Ours() if system_name == "ours" else Serve()
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
             object_store_memory=256 * 1024**2, log_to_driver=False)
    try:
        recorder = ray.remote(Recorder).options(name=RECORDER, namespace=RECORDER_NS, num_cpus=0).remote()
        t = time.perf_counter()
        handle = system.deploy(system.models[0], args)
        log(f"{system_name}: {args.replicas} v1 replicas serve after {time.perf_counter() - t:.1f}s")
        answers: list = []
        failed: list = []
        childrun.run_async(drive(system, handle, recorder, args, res, answers, failed))
        t_apply, t_done = res.pop("t_apply"), res.pop("t_done")
        v1_last = max((end for _, end, tag, *_ in answers if tag == "v1"), default=t_apply)
        all_new = max(t_done, v1_last) if t_done is not None else None
        window_end = all_new if all_new is not None else float("inf")
        during = [a for a in answers if t_apply <= a[1] <= window_end]
        lat = sorted(end - start for start, end, *_ in during)
        calls = ray.get(recorder.all.remote(), timeout=30)
        res.update({
            "to_all_new_s": all_new - t_apply if all_new is not None else None,
            "failed": sum(1 for t, _ in failed if t >= t_apply), "failed_total": len(failed),
            "first_failures": [m for _, m in failed[:3]],
            "answered": len(during), "answered_total": len(answers),
            "answered_per_s": len(during) / (all_new - t_apply) if all_new is not None and all_new > t_apply else None,
            "v1_answers_after_apply": sum(1 for a in during if a[2] == "v1"),
            "latency_p99_ms": 1000 * lat[min(len(lat) - 1, round(0.99 * len(lat)))] if lat else None,
            **rank_figures(calls, res.pop("apply_wall"), args.replicas)})
        log(f"{system_name}: {res}")
    except Exception as exc:
        res["errors"].append(f"{type(exc).__name__}: {exc}"[:2000])
        log(f"{system_name}: ERROR {exc!r}")
    finally:
        system.shutdown()
    return res


# ----------------------------------------------------------------- reporting
ROWS = [("to all-new (s)", "to_all_new_s", True), ("apply returned (s)", "apply_returned_s", True),
        ("requests failed", "failed", True), ("answered", "answered", False),
        ("answered / s", "answered_per_s", False),
        ("latency p99 (ms)", "latency_p99_ms", True), ("rank moved", "rank_moved", True),
        ("started off-range", "started_off_range", True), ("reconfigure calls", "reconfigures", True),
        ("rank reconfigures", "rank_reconfigures", True)]


def print_report(results: dict, args: argparse.Namespace) -> list[dict]:
    a, b = results.get("ours", {}), results.get("serve", {})
    version = next((r.get("ray_version") for r in results.values() if r.get("ray_version")), "?")
    print(f"\nrolling update v1 -> v2 under load: rankcore vs Ray Serve, Ray {version}, {args.replicas} replicas, "
          f"{args.clients} clients, work {args.work:g} s, warm {args.warm:g} s, tail {args.tail:g} s, "
          f"surge {args.surge_percent}% (ours: max_surge; Serve: max_surge_percent), "
          f"{os.cpu_count()} CPUs")
    rows = childrun.ratio_table(ROWS, a, b)
    for name, res in results.items():
        if "v2_start_ranks" in res:
            print(f"{name}: v2 replicas started on ranks {res['v2_start_ranks']}, end on {res.get('final_ranks')}; "
                  f"rank moves: {', '.join(res['rank_moves']) or 'none'}")
        for e in res.get("first_failures", []) + res.get("errors", []):
            print(f"{name}: ERROR: {e}")
    if a and b and not a.get("errors") and not b.get("errors"):
        met = a.get("failed") == 0 and a.get("rank_moved") == 0
        print(f"goal (issue): no request lost and 0 rank moves (ours): {'MET' if met else 'NOT MET'}")
    return rows


def spawn(system_name: str, args: argparse.Namespace) -> dict:
    argv = ["--replicas", str(args.replicas), "--clients", str(args.clients), "--work", str(args.work),
            "--warm", str(args.warm), "--tail", str(args.tail), "--max-rollout", str(args.max_rollout),
            "--request-timeout", str(args.request_timeout), "--num-cpus", str(args.num_cpus),
            "--surge-percent", str(args.surge_percent)]
    limit = 2 * args.max_rollout + args.warm + args.tail + args.request_timeout + 120
    return childrun.spawn(str(pathlib.Path(__file__).resolve()), system_name, argv, limit, log)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=8, help="replicas of the app; default 8")
    p.add_argument("--clients", type=int, default=4, help="closed-loop clients; default 4")
    p.add_argument("--work", type=float, default=0.1, help="seconds one call takes; default 0.1")
    p.add_argument("--warm", type=float, default=3.0, help="seconds of load before the apply; default 3")
    p.add_argument("--tail", type=float, default=3.0, help="seconds of load after all-new; default 3")
    p.add_argument("--max-rollout", type=float, default=180.0,
                   help="give up when not all-new after this many seconds; default 180")
    p.add_argument("--request-timeout", type=float, default=30.0, help="limit of one call; default 30")
    p.add_argument("--num-cpus", type=int, default=4, help="num_cpus of the local Ray; default 4")
    p.add_argument("--surge-percent", type=int, default=0,
                   help="replicas a rollout may run above the target, a percent of it (Ray Serve's "
                        "max_surge_percent; ours: max_surge, docs/rollouts.md); default 0")
    childrun.add_child_arguments(p)
    args = p.parse_args(argv)
    if args.replicas < 1 or args.clients < 1:
        p.error("--replicas and --clients must be 1 or more")
    if not 0 <= args.surge_percent <= 100:
        p.error(f"--surge-percent must be in [0, 100] (Ray Serve's range), got {args.surge_percent}")
    if args.replicas * ACTOR_OPTIONS["num_cpus"] > args.num_cpus:
        p.error(f"--num-cpus {args.num_cpus} has no room for {args.replicas} replicas of "
                f"num_cpus {ACTOR_OPTIONS['num_cpus']}")
    childrun.ray_env(ROOT, ROOT / "benchmarks")
    return childrun.main_for(args, run_child, spawn, print_report, log)


if __name__ == "__main__":
    sys.exit(main())

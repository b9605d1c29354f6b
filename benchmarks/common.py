"""What the benchmark scripts share, written once (issue 66, "Copies"): the ``sys.path`` prologue
each script repeated (``ROOT``, ``use_this_tree``), the replica context bench_chaos, bench_rollout
and bench_autoscale each looked up on both systems (``OursReplica``, ``ServeReplica``,
``replica_id``), and the closed-loop clients and level report that bench_batch, bench_multiplex and
bench_hops took from bench_http's private names (``load``, ``summarise``, ``judge``, ``fmt``, ...).

Standard library only: replicas that unpickle a model class based on one here import this module
by name (``childrun.ray_env`` puts benchmarks/ on their ``PYTHONPATH``). A script run as ``python
benchmarks/<script>.py`` finds it beside itself; ``tests/helpers.load_benchmark`` puts benchmarks/
on ``sys.path`` for the same."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import socket
import statistics
import sys
import time
from typing import Any

#: the checkout these scripts are in
ROOT = pathlib.Path(__file__).resolve().parents[1]


def use_this_tree() -> None:
    """This checkout first on ``sys.path``, each entry once: benchmarks/ (the scripts import each
    other by name), then ROOT (its rankcore, executors, tests and examples, before an installed
    rankcore: an environment may have another checkout installed, and a git worktree's benchmark
    would otherwise measure that one). Called by each script before it imports from the tree."""
    for path in (str(ROOT), str(ROOT / "benchmarks")):
        while path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)


# --------------------------------------------------------------------- models
class OursReplica:
    """A model class's base for rankcore: ``self.context()`` is its replica's context. (A model
    class served by both systems is written once, on top of this and of ``ServeReplica``.)"""

    @staticmethod
    def context() -> Any:
        from executors.ray_gpu import get_replica_context

        return get_replica_context()


class ServeReplica:
    """A model class's base for Ray Serve: ``self.context()`` is its replica's context."""

    @staticmethod
    def context() -> Any:
        from ray import serve

        return serve.get_replica_context()


def replica_id(ctx: Any) -> str:
    """A replica context's replica id as text (Serve's is a ``ReplicaID``: its ``unique_id``)."""
    rid = ctx.replica_id
    return str(getattr(rid, "unique_id", rid))


# ------------------------------------------------------------------- clients
def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server started next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def awaitable(response: Any) -> Any:
    """A handle's response as a coroutine (``asyncio.wait_for`` and ``run_async`` take one)."""
    return await response


def echo_body(client: int, seq: int) -> dict:
    """The body an echo is sent and answers: client ``client``'s request ``seq``."""
    return {"client": client, "seq": seq, "text": "hello"}


def summarise(latencies: list[float], answers: int, errors: int, window: float, clients: int,
              first_errors: list[str]) -> dict:
    """A level's figures: requests a second over ``window`` seconds, latency p50, p99, max and mean (ms)."""
    lat = sorted(latencies)

    def pct(q: float) -> float | None:
        if not lat:
            return None
        return 1000.0 * lat[min(len(lat) - 1, max(0, round(q * len(lat)) - 1))]

    return {"clients": clients, "answers": answers, "errors": errors, "seconds": window,
            "rps": answers / window if window > 0 else None, "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "max_ms": 1000.0 * lat[-1] if lat else None,
            "mean_ms": 1000.0 * statistics.fmean(lat) if lat else None, "first_errors": first_errors}


async def load(send: Any, clients: int, warmup: float, seconds: float, window: Any = None) -> dict:
    """``clients`` closed-loop clients; ``send(client_index, seq) -> bool`` (answer correct) raises on an error.
    Counts what ends inside the window [warm-up end, warm-up end + seconds]; ``window``
    (``hostcpu.Window``) is sampled at its two ends."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    w0, w1 = start + warmup, start + warmup + seconds
    if window is not None:
        loop.call_at(w0, window.sample)
        loop.call_at(w1, window.sample)
    latencies: list[float] = []
    counts = {"answers": 0, "errors": 0}
    first_errors: list[str] = []

    async def client(c: int) -> None:
        seq = 0
        while True:
            t0 = time.perf_counter()
            if loop.time() >= w1:
                return
            try:
                ok = await send(c, seq)
                err = None if ok else "wrong answer"
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"[:300]
            dt = time.perf_counter() - t0
            now = loop.time()
            if w0 <= now <= w1:
                if err is None:
                    counts["answers"] += 1
                    latencies.append(dt)
                else:
                    counts["errors"] += 1
                    if len(first_errors) < 3:
                        first_errors.append(err)
            seq += 1

    await asyncio.gather(*(client(c) for c in range(clients)))
    return summarise(latencies, counts["answers"], counts["errors"], seconds, clients, first_errors)


# ----------------------------------------------------------------- reporting
def fmt(v: Any, digits: int = 2) -> str:
    """A figure as the level reports print it: "-" for none, ``digits`` digits for a float below 100."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def judge(results: dict, args: argparse.Namespace) -> list[dict]:
    """Each level of ``args.paths`` x ``args.clients``: ours' and Serve's figures, their ratios and the
    goal's verdict (ours' req/s >= Serve's and p99 <= Serve's, no errors; n/a without both)."""
    ours, serve = results.get("ours", {}).get("levels", {}), results.get("serve", {}).get("levels", {})
    rows = []
    for path in args.paths:
        for clients in args.clients:
            key = f"{path}/{clients}"
            a, b = ours.get(key), serve.get(key)
            row: dict[str, Any] = {"path": path, "clients": clients, "ours": a, "serve": b,
                                   "rps_ratio": None, "p99_ratio": None, "verdict": "n/a"}
            if a and b and a["rps"] and b["rps"] and a["p99_ms"] and b["p99_ms"]:
                row["rps_ratio"] = a["rps"] / b["rps"]
                row["p99_ratio"] = a["p99_ms"] / b["p99_ms"]
                clean = not a["errors"] and not b["errors"]
                row["verdict"] = ("MET" if a["rps"] >= b["rps"] and a["p99_ms"] <= b["p99_ms"] and clean
                                  else "NOT MET")
            rows.append(row)
    return rows


def print_table(headers: list[str], table: list[list[str]]) -> None:
    """A plain text table, columns as wide as their widest cell."""
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)))


def print_errors(results: dict) -> None:
    """Each system's start-up time and errors (its levels' first ones, then its own)."""
    for name, res in results.items():
        if "deploy_s" in res:
            print(f"{name}: deployed and routed in {res['deploy_s']:.1f} s")
        for key, lv in res.get("levels", {}).items():
            for e in lv.get("first_errors", []):
                print(f"{name}: {key}: error: {e}")
        for e in res.get("errors", []):
            print(f"{name}: ERROR: {e}")


def print_errors_and_goal(results: dict, rows: list[dict], issue: str) -> None:
    """Each system's start-up time and errors, then the overall verdict of ``judge``'s rows."""
    print_errors(results)
    judged = [r for r in rows if r["verdict"] != "n/a"]
    if "ours" in results and "serve" in results:
        overall = "MET" if judged and len(judged) == len(rows) and all(r["verdict"] == "MET" for r in judged) \
            else "NOT MET"
        print(f"\ngoal ({issue}): throughput >= Ray Serve's and p99 <= Ray Serve's at each level: {overall}")


# ----------------------------------------------------------------- arguments
def merged_counts(counts: list[dict]) -> dict:
    """Counts by key, summed over ``counts`` (failures by kind over the trials of a run)."""
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def ints(text: str) -> list[int]:
    """An argparse type: a comma-separated list of ints >= 1 (``--clients``)."""
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need a comma-separated list of ints >= 1, got {text!r}")
    return values


def level_argv(args: argparse.Namespace) -> list[str]:
    """The child's arguments every Serve-vs-ours level benchmark shares (bench_http's, bench_batch's)."""
    return ["--replicas", str(args.replicas), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
            "--clients", ",".join(map(str, args.clients)), "--paths", ",".join(args.paths),
            "--budget", str(args.budget), "--request-timeout", str(args.request_timeout),
            "--num-cpus", str(args.num_cpus)]

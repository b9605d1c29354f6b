"""Benchmark rankcore's ``@batch`` against Ray Serve's ``@serve.batch``, same run, same handler (issue 39).

What it measures
----------------
Both systems serve the same model whose cost is mostly per batch: ``--replicas`` replicas
(default 1) of ``num_cpus=1``, ``max_ongoing_requests=64`` on both (large enough that batches
can fill), each with the two-level shape Serve's docs recommend: a plain ``async def
__call__(self, x)`` (over HTTP Serve passes a starlette ``Request``: it does ``await
request.json()``; ours' ingress passes the JSON body itself) that returns ``await
self.handle_batch(body)``, where ``handle_batch`` is the batched method: ``@batch`` (ours,
executors/ray_gpu/replica/batching.py) or ``@serve.batch``, both with ``max_batch_size =
--max-batch-size`` (default 16), ``batch_wait_timeout_s = --batch-wait-timeout-s`` (default
0.01) and one batch at a time (``max_concurrent_batches=1``).

The batched method (torch on CPU, ``torch.set_num_threads(1)``): stack the batch's inputs (each
request a vector of 64 floats) into a matrix, zero-pad it to ``max_batch_size`` rows, multiply by
a fixed random 64 x ``--hidden`` matrix and then ``--layers`` times by a fixed random
``--hidden`` x ``--hidden`` matrix (defaults 2048 and 2: a few ms a batch, whatever its size),
and answer each request its row's sum with the request's id, the batch's size, the batch's own
service time (``time.perf_counter`` around the whole method) and an id of the batch. The client
checks every answer: its id, and its value against the one computed on the client from the same
seeded matrices (``x . (A M^L 1)``, float64), so an answer mixed up with another request's fails.

Each system runs in its own child process with its own fresh local Ray (``ray.init(address=
"local", num_cpus=--num-cpus)``), one after the other, never both at once:

* ours: ``run(app, route_prefix="/bench", port=0)`` (the ``rankcore-http`` ingress on a free
  port, executors/ray_gpu/ingress/http.py) and the handle ``run`` returns;
* Ray Serve: ``serve.start(http_options={"host": "127.0.0.1", "port": <free>})`` and
  ``serve.run(app, route_prefix="/bench")`` (its HTTP proxy) and the handle it returns.

Then, per path (``http``, ``handle``) and per level of concurrent clients (``--clients``,
default 1,16,64): ``--warmup`` seconds (default 1) untimed, then ``--seconds`` (default 5) of
closed-loop clients (each sends its next request as soon as its last is answered; common.py's
``load``). Reported per level: answers per second, p50 / p99 latency, errors (non-200, exceptions
or a wrong answer), the mean size of the batches run in the window (distinct batches, each
counted once; the mean over answers, which weighs a batch by its size, is in the JSON too) and the
mean per-batch service time. Per system, over every batch of every level: the mean service time
by batch size and a least-squares fit ``fixed_s + per_item_s * batch_size``, printed as ``sim cost:
fixed_s=... per_item_s=...``: the handler's cost as the simulator takes it, to predict the
throughput of the same settings. Then issue 39's other goal, the simulator's prediction within
15% of the measured throughput: for each of ours' levels, the simulator runs the same deployment
(replicas, bound, timeout, ``max_ongoing_requests``; ``traffic.<d>.batch``) under the same closed
loop (``arrivals: {kind: closed, clients: N, think_s: T}``), a batch costing what that level's own
batches cost (the fit), T the time a request spends outside the replica (measured once, at one
client of the same path: p50 less the timeout and a lone batch's service); its answers a second
are printed beside the measured ones. Four ways: the batch cost alone; one client's CPU a request on
the host's cores; that level's own CPU a request; that level's CPU thread by thread (``thread_cpu``:
the callers' and the proxy's loops as shared threads, the replica's process, which runs its batches
too, as ``replica_s``; docs/benchmarks.md, "The simulator's prediction, thread by thread").

Where the host's CPU went in each level's window (printed for ours, and in the JSON: ``host_busy_s``
from ``/proc/stat``; ``caller_thread_s``, the load generator's own thread, which also runs the handle's
router; ``replica_thread_s``, the replica's thread its batches run on, read from ``/proc/<pid>/task``,
with ``batch_cpu_s`` its batches' own CPU (``time.thread_time``; ``batch_busy_s`` is their wall time);
``processes``: the proxy, replica, controller, raylet and GCS processes, each in all and its busiest
threads).

HTTP clients: each its own keep-alive connection (benchmarks/rawhttp.py's ``RawClient``, a
fraction of httpx's own CPU per request), ``POST <url>/bench`` with a JSON body ``{"id": [client,
seq], "x": [64 floats]}``. Handle: ``await handle.remote(body)``. The load generator shares the
machine with the server: its CPU time is part of what limits the high levels, equally for both.

Then the goal from issue 39 is judged per path and level: ours' throughput >= Serve's and ours'
p99 <= Serve's, no errors; MET only if all hold.

Method
------
* ``time.perf_counter`` around each request, from before the send to the parsed answer; in the
  replica, around the batched method's body.
* Bounded: every request has a ``--request-timeout`` (default 30 s); a child stops starting new
  levels past ``--budget`` seconds (default 300) and is killed 120 s after that. Ray is shut down
  (``serve.shutdown()`` first for Serve) in every case. ``RAY_USAGE_STATS_ENABLED=0
  RAY_AUTH_MODE=disabled``.
* Timings on a shared or small machine are noisy: compare the ratios within one run, and re-run
  on a quiet machine before drawing conclusions.

How to run
----------
    .venv/bin/python benchmarks/bench_batch.py                    # 1 replica, 1/16/64 clients, 5 s each
    .venv/bin/python benchmarks/bench_batch.py --seconds 2 --clients 1,16 --json out.json
    .venv/bin/python benchmarks/bench_batch.py --only ours --paths handle
    .venv/bin/python benchmarks/bench_batch.py --max-batch-size 32 --batch-wait-timeout-s 0.005

Needs the ``bench`` extra (Ray Serve), the ``http`` extra and torch. Progress goes to stderr; the
table (and ``--json`` file) is the result.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import pathlib
import sys
import threading
import time
from typing import Any

from common import (
    ROOT,
    awaitable,
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

DEP = "bench"  # deployment name (and Serve application name)
ROUTE = "/bench"
WIDTH = 64  # floats per request
SEED = 39
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_batch {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------- models
def weights(hidden: int) -> tuple[Any, Any]:
    """The fixed random matrices (numpy float32, the same in every replica and the client):
    ``A`` (WIDTH x hidden) and ``M`` (hidden x hidden), scaled to keep the values near 1."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    a = (rng.standard_normal((WIDTH, hidden), dtype=np.float32) / math.sqrt(WIDTH)).astype(np.float32)
    m = (rng.standard_normal((hidden, hidden), dtype=np.float32) / math.sqrt(hidden)).astype(np.float32)
    return a, m


class Model:
    """The per-batch work both systems run: zero-pad the batch to ``max_batch_size`` rows, then
    ``x @ A @ M ... @ M`` (``layers`` times M) and each row's sum (cost per batch, not per item)."""

    def __init__(self, max_batch_size: int, batch_wait_timeout_s: float, hidden: int, layers: int) -> None:
        import torch

        torch.set_num_threads(1)
        a, m = weights(hidden)
        self.a, self.m = torch.from_numpy(a), torch.from_numpy(m)
        self.rows, self.layers = max_batch_size, layers
        self.batches = 0
        self.pid = os.getpid()
        # (the decorators' defaults, set here from the options: the same on both systems)
        self.handle_batch.set_max_batch_size(max_batch_size)
        self.handle_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self.work([{"id": [0, 0], "x": [0.0] * WIDTH}])  # (torch's first call, before any request)

    def work(self, bodies: list) -> list:
        import torch

        t0, c0 = time.perf_counter(), time.thread_time()
        n = len(bodies)
        x = torch.zeros(max(self.rows, n), WIDTH)
        x[:n] = torch.tensor([b["x"] for b in bodies])
        h = x @ self.a
        for _ in range(self.layers):
            h = h @ self.m
        ys = h.sum(dim=1)[:n].tolist()
        self.batches += 1
        key = f"{self.pid}:{self.batches}"
        dt, cpu = time.perf_counter() - t0, time.thread_time() - c0
        where = [self.pid, threading.get_native_id()]  # (the thread the batches run on: its CPU is read from /proc)
        return [{"id": b["id"], "y": y, "n": n, "t": dt, "c": cpu, "b": key, "w": where} for b, y in zip(bodies, ys)]


def _batch(**options: Any) -> Any:
    """Ours' ``@batch``, imported where the class is defined (the driver and the replicas)."""
    from executors.ray_gpu import batch

    return batch(**options)


class OursBatched(Model):
    """The two-level shape on ours: ``__call__`` gets the JSON body (HTTP) or the value (handle)."""

    async def __call__(self, x: Any) -> Any:
        return await self.handle_batch(x)

    @_batch(max_batch_size=16, batch_wait_timeout_s=0.01, max_concurrent_batches=1)
    async def handle_batch(self, xs: list) -> list:
        return self.work(xs)


def _serve_batch(**options: Any) -> Any:
    """Serve's ``@serve.batch`` (where Ray Serve cannot be imported, the method is left as is: only
    Serve's child uses the class, and the parent says why it cannot run)."""
    try:
        from ray import serve
    except ImportError:
        return lambda fn: fn
    return serve.batch(**options)


class ServeBatched(Model):
    """Serve's docs' shape: ``__call__`` extracts the body from the starlette Request (HTTP), then
    the ``@serve.batch`` method."""

    async def __call__(self, x: Any) -> Any:
        from starlette.requests import Request

        body = await x.json() if isinstance(x, Request) else x
        return await self.handle_batch(body)

    @_serve_batch(max_batch_size=16, batch_wait_timeout_s=0.01, max_concurrent_batches=1)
    async def handle_batch(self, xs: list) -> list:
        return self.work(xs)


# ------------------------------------------------------------------- systems
def _options(args: argparse.Namespace) -> dict:
    return {"num_replicas": args.replicas, "max_ongoing_requests": args.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": 1}}


def _bind_args(args: argparse.Namespace) -> tuple:
    return (args.max_batch_size, args.batch_wait_timeout_s, args.hidden, args.layers)


class Ours:
    name = "ours"

    def deploy(self, args: argparse.Namespace, timeout: float) -> tuple[Any, str]:
        return childrun.deploy_ours(OursBatched, DEP, ROUTE, _options(args), _bind_args(args), timeout)

    def shutdown(self) -> None:
        childrun.ours_shutdown(log)


class Serve:
    name = "serve"

    def deploy(self, args: argparse.Namespace, timeout: float) -> tuple[Any, str]:
        from ray import serve

        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        d: Any = serve.deployment(ServeBatched, name=DEP, **_options(args))
        handle = serve.run(d.bind(*_bind_args(args)), name=DEP, route_prefix=ROUTE)
        return handle, f"http://127.0.0.1:{port}{ROUTE}"

    def shutdown(self) -> None:
        childrun.serve_shutdown(log)


# ----------------------------------------------------------------- measuring
PROCESSES = ("ray::HttpIngress", "ray::Controller", "ray::ReplicaActor", "raylet", "gcs_server")


def process_threads_cpu() -> dict:
    """``hostcpu.process_threads_cpu`` of ``PROCESSES``."""
    return hostcpu.process_threads_cpu(PROCESSES)


def _x(client: int, seq: int) -> list[float]:
    """A request's vector: multiples of 1/64 in [-0.78, 0.78] (exact in float32 and in JSON)."""
    return [((client * 131 + seq * 17 + k * 7) % 101 - 50) / 64 for k in range(WIDTH)]


class Checker:
    """Checks answers against ``x . v`` (``v = A M^layers 1``, float64 on the client) and keeps the
    batches seen inside the measured window (each once, by the replica's batch id)."""

    def __init__(self, hidden: int, layers: int, max_batch_size: int) -> None:
        import numpy as np

        a, m = weights(hidden)
        u = np.ones(hidden)
        for _ in range(layers):
            u = m.astype(np.float64) @ u
        self.v = [float(t) for t in a.astype(np.float64) @ u]
        self.vnorm = math.sqrt(sum(t * t for t in self.v))
        self.max_batch_size = max_batch_size
        self.window = (math.inf, -math.inf)
        self.batches: dict[str, tuple[int, float, float]] = {}  # batch id -> (size, wall s, its thread's CPU s)
        self.answer_sizes: list[int] = []
        #: at the window's start and end (``_sample``): CPU seconds of the host busy, of the replica's
        #: batch thread, of this (the callers') thread, and {process name: {thread id: CPU s}}
        self.samples: list[tuple[float | None, float | None, float, dict]] = []
        self.where: tuple[int, int] | None = None  # (pid, thread id) of the replica's batch thread (one replica)

    def start(self, warmup: float, seconds: float) -> None:
        """A level begins now: its window is [now + warmup, now + warmup + seconds] (load()'s)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.window = (now + warmup, now + warmup + seconds)
        self.batches, self.answer_sizes, self.samples = {}, [], []
        for at in self.window:
            loop.call_at(at, self._sample)

    def _sample(self) -> None:
        """At the window's start and end: the host's busy CPU, the replica's batch thread's CPU, this
        (the callers') thread's, and each thread's of the processes named in ``PROCESSES``."""
        self.samples.append((hostcpu.host_busy_s(), hostcpu.thread_cpu_s(*self.where) if self.where else None,
                             time.thread_time(),
                             process_threads_cpu()))

    def check(self, c: int, seq: int, x: list[float], ans: Any) -> bool:
        if not isinstance(ans, dict) or ans.get("id") != [c, seq]:
            return False
        n = ans.get("n")
        if not isinstance(n, int) or not 1 <= n <= self.max_batch_size:
            return False
        want = sum(a * b for a, b in zip(x, self.v))
        bound = math.sqrt(sum(t * t for t in x)) * self.vnorm  # (|x . v| <= |x| |v|)
        if not abs(float(ans["y"]) - want) <= 1e-3 * bound + 1e-6:
            return False
        if self.window[0] <= asyncio.get_running_loop().time() <= self.window[1]:
            self.answer_sizes.append(n)
            self.batches.setdefault(str(ans["b"]), (n, float(ans["t"]), float(ans.get("c", ans["t"]))))
        if self.where is None and isinstance(ans.get("w"), list):
            self.where = (int(ans["w"][0]), int(ans["w"][1]))
        return True

    def figures(self) -> dict:
        """The level's batches: mean size (per batch and per answer), mean service time, the service
        time by size ({size: [batches, wall seconds, CPU seconds]}) for the fit, and where the host's
        CPU went in the window."""
        by_size: dict[int, list] = {}
        for n, t, c in self.batches.values():
            entry = by_size.setdefault(n, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += t
            entry[2] += c
        count = len(self.batches)
        busy = thread = caller = None
        procs: dict = {}
        if len(self.samples) == 2:
            (b0, t0, c0, p0), (b1, t1, c1, p1) = self.samples
            busy = None if b0 is None or b1 is None else b1 - b0
            thread = None if t0 is None or t1 is None else t1 - t0
            caller = c1 - c0
            procs = hostcpu.deltas(p0, p1)
        return {"batches": count, "host_busy_s": busy, "batch_busy_s": sum(t for _, t, _ in self.batches.values()),
                "batch_cpu_s": sum(c for _, _, c in self.batches.values()), "replica_thread_s": thread,
                "caller_thread_s": caller, "processes": procs,
                "mean_batch": sum(n for n, _, _ in self.batches.values()) / count if count else None,
                "mean_batch_per_answer": (sum(self.answer_sizes) / len(self.answer_sizes)
                                          if self.answer_sizes else None),
                "mean_batch_s": sum(t for _, t, _ in self.batches.values()) / count if count else None,
                "by_size": {str(n): v for n, v in sorted(by_size.items())}}


def _body(c: int, seq: int) -> tuple[dict, list[float]]:
    x = _x(c, seq)
    return {"id": [c, seq], "x": x}, x


async def http_level(url: str, clients: int, warmup: float, seconds: float, timeout: float,
                     checker: Checker) -> dict:
    import json

    from rawhttp import RawClient

    pool = [RawClient(url, timeout) for _ in range(clients)]

    async def send(c: int, seq: int) -> bool:
        body, x = _body(c, seq)
        status, data = await pool[c].post(json.dumps(body).encode())
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
        return checker.check(c, seq, x, json.loads(data))

    checker.start(warmup, seconds)
    try:
        return await load(send, clients, warmup, seconds)
    finally:
        await asyncio.gather(*(p.close() for p in pool))


async def handle_level(handle: Any, clients: int, warmup: float, seconds: float, timeout: float,
                       checker: Checker) -> dict:
    async def send(c: int, seq: int) -> bool:
        body, x = _body(c, seq)
        return checker.check(c, seq, x, await asyncio.wait_for(awaitable(handle.remote(body)), timeout))

    checker.start(warmup, seconds)
    return await load(send, clients, warmup, seconds)


def run_child(system_name: str, args: argparse.Namespace) -> dict:
    system: Any = Ours() if system_name == "ours" else Serve()
    checker = Checker(args.hidden, args.layers, args.max_batch_size)

    def level(handle: Any, url: str, pi: int, path: str, li: int, clients: int) -> tuple[dict, str]:
        if path == "http":
            coro = http_level(url, clients, args.warmup, args.seconds, args.request_timeout, checker)
        else:
            coro = handle_level(handle, clients, args.warmup, args.seconds, args.request_timeout, checker)
        got = childrun.run_async(asyncio.wait_for(coro, args.warmup + args.seconds + args.request_timeout + 30))
        got.update(checker.figures())
        return got, (f"{path} {clients:>3} clients: {got['rps'] or 0:8.1f} req/s  p50 {fmt(got['p50_ms'])} ms  "
                     f"p99 {fmt(got['p99_ms'])} ms  errors {got['errors']}  "
                     f"batch {fmt(got['mean_batch'])} of {fmt(_ms(got['mean_batch_s']))} ms")

    return childrun.measure(system_name, args, system, f"{args.replicas} batched replicas with an HTTP route",
                            lambda: system.deploy(args, args.request_timeout * 4), level, log)


# ----------------------------------------------------------------- reporting
def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def cost_fit(levels: dict, cpu: bool = False) -> dict | None:
    """Least squares ``t = fixed_s + per_item_s * n`` over every distinct batch of ``levels`` (each
    batch weighs one), and the mean service time by size. With one size only: per_item_s 0.
    ``cpu``: the batches' CPU seconds on their thread instead of their wall time (a batch the host's
    other work delayed costs its CPU only, the wait being the simulator's to model)."""
    by_size: dict[int, list] = {}
    for lv in levels.values():
        for n, (count, wall, *own) in lv.get("by_size", {}).items():
            entry = by_size.setdefault(int(n), [0, 0.0])
            entry[0] += count
            entry[1] += own[0] if cpu and own else wall
    k = sum(c for c, _ in by_size.values())
    if not k:
        return None
    sn = sum(n * c for n, (c, _) in by_size.items())
    st = sum(t for _, t in by_size.values())
    snn = sum(n * n * c for n, (c, _) in by_size.items())
    snt = sum(n * t for n, (_, t) in by_size.items())
    var = k * snn - sn * sn
    per_item = (k * snt - sn * st) / var if var > 0 else 0.0
    fixed = (st - per_item * sn) / k
    return {"fixed_s": fixed, "per_item_s": per_item, "batches": k, "mean_batch_s": st / k,
            "by_size": {n: {"batches": c, "mean_s": t / c} for n, (c, t) in sorted(by_size.items())}}


def _batch_cost(fit: dict) -> tuple[float, float]:
    """(fixed, per item) seconds the simulator is given for ``fit``: a falling fit (more items
    costing less, the host's noise) is taken as flat at the mean batch's cost."""
    if fit["per_item_s"] >= 0:
        return fit["fixed_s"], fit["per_item_s"]
    return fit["mean_batch_s"], 0.0


def predict(args: argparse.Namespace, fit: dict, clients: int, think_s: float, cpu: dict | None = None
            ) -> float:
    """The simulator's requests a second for this benchmark's deployment (same replicas, bound,
    timeout, ``max_ongoing_requests``) under the same closed loop (``clients`` callers, each sending
    again ``think_s`` after its answer: the time a request spends outside the replica) when a
    batch costs ``fit``'s ``fixed_s + per_item_s x n``; ``cpu``: the simulator's ``batch.cores``
    and a request's CPU on them (``request_s``, and where measured ``threads`` and ``replica_s``)."""
    from executors.scenarios import parse_scenario
    from executors.sim import Simulation

    fixed, per_item = _batch_cost(fit)
    host = ""
    if cpu is not None:
        host = f", cores: {cpu['cores']}, request_s: {max(cpu['request_s'], 1e-6):.9f}"
        if cpu.get("threads"):
            host += ", threads: [" + ", ".join(f"{max(t, 1e-6):.9f}" for t in cpu["threads"]) + "]"
        if cpu.get("replica_s") is not None:
            host += f", replica_s: {max(cpu['replica_s'], 1e-6):.9f}"
    text = f"""
seed: 1
duration: 65
cluster: {{nodes: 1, gpus_per_node: {args.replicas}}}
latency: {{place: 0.0, start: 0.1, stop: 0.1}}
deployments:
  bench: {{replicas: {args.replicas}, max_ongoing_requests: {args.max_ongoing_requests}}}
timeline:
  - deploy: bench
traffic:
  bench:
    from: 5
    arrivals: {{kind: closed, clients: {clients}, think_s: {max(0.0, think_s):.9f}}}
    batch: {{max_batch_size: {args.max_batch_size}, batch_wait_timeout_s: {args.batch_wait_timeout_s},
             max_concurrent_batches: 1, fixed_s: {max(fixed, 1e-6):.9f}, per_item_s: {per_item:.9f}{host}}}
"""
    metrics = Simulation(parse_scenario(text, "<bench_batch prediction>")).run().metrics
    return float(metrics["deployments"]["bench"]["requests"]["throughput_rps"])


def _request_cpu(level: dict, args: argparse.Namespace) -> dict | None:
    """This host's cores and the CPU seconds a request cost at ``level`` outside its batch (the
    host's busy CPU in the window less its batches', per request answered), all of it on threads
    of its own (``request_s``); None where not measured."""
    if level.get("host_busy_s") is None or not level.get("rps"):
        return None
    per_request = max(0.0, level["host_busy_s"] - level["batch_busy_s"]) / (level["rps"] * args.seconds)
    level["request_cpu_s"] = per_request
    return {"cores": os.cpu_count() or 1, "request_s": per_request}


#: the process of the HTTP path's proxy, whose busiest thread (its event loop) every request passes
PROXY = "ray::HttpIngress"
#: the replica's process: its batch thread, its event loop and Ray's threads
REPLICA = "ray::ReplicaActor"


def thread_cpu(level: dict, args: argparse.Namespace, path: str) -> dict | None:
    """``level``'s CPU a request, thread by thread, as the simulator's ``batch.threads`` model takes
    it: the callers' thread and (HTTP) the proxy's busiest thread, each shared by every request
    (``threads``); the replica's process less its batches (``replica_s``: Ray's threads and the
    replica's event loop, which one interpreter runs one at a time, its batches included); the
    rest of the host's busy CPU (Ray's other processes, the proxy's other threads) on threads of
    its own (``request_s``). None where a figure is missing."""
    procs = level.get("processes") or {}
    n = (level.get("rps") or 0) * args.seconds
    if not n or any(level.get(k) is None for k in ("host_busy_s", "caller_thread_s", "batch_cpu_s")) or (
            REPLICA not in procs or (path == "http" and PROXY not in procs)):
        return None
    replica = procs[REPLICA]["total_s"]
    threads, used = [level["caller_thread_s"] / n], level["caller_thread_s"] + replica
    if path == "http":
        loop = procs[PROXY]["top_threads_s"][0]
        threads.append(loop / n)
        used += loop
    return {"cores": os.cpu_count() or 1, "request_s": max(0.0, level["host_busy_s"] - used) / n, "threads": threads,
            "replica_s": max(0.0, replica - level["batch_cpu_s"]) / n}


def _cpu_sum(cpu: dict) -> float:
    """A request's CPU seconds in all, thread by thread (``thread_cpu``)."""
    return cpu["request_s"] + sum(cpu["threads"]) + cpu["replica_s"]


def _cpu_text(cpu: dict | None) -> str:
    if cpu is None:
        return ""
    text = f", {cpu['cores']} cores, {1000 * cpu['request_s']:.2f} ms CPU a request"
    if cpu.get("threads"):
        text = (f", {cpu['cores']} cores; a request's CPU ms: {1000 * cpu['request_s']:.2f} its own, "
                f"{' + '.join(f'{1000 * t:.2f}' for t in cpu['threads'])} on shared threads, "
                f"{1000 * cpu['replica_s']:.2f} in the replica's process")
    return text


def print_predictions(results: dict, args: argparse.Namespace) -> None:
    """Issue 39's check of the simulator: each of ours' levels predicted by the simulator (the same
    deployment and closed loop; ``traffic.<d>.batch`` with the batch cost fitted on that level's own
    batches; ``arrivals: closed`` with the time a request spends outside the replica measured at one
    client of the same path: its p50 less the batch timeout and a lone batch's service time, less
    the CPU the model puts on the cores), against the measured requests a second. Four times: with
    the batch cost alone; with the host's CPU (``batch.cores``: this host's cores;
    ``batch.request_s``: each request's own CPU, the host's busy CPU seconds less its batches', per
    request) measured at one client; with the CPU a request cost at that level itself (the CPU a
    request costs falls with the load, so one client's does not carry over); and with that level's
    CPU thread by thread (``thread_cpu``: the shared threads a request passes, its replica's
    process, the batches fitted on their CPU time, all sharing the cores as the kernel shares
    them), where the callers wait between answer and request only what one client's time outside
    the replica leaves beside its own CPU thread by thread."""
    levels = results.get("ours", {}).get("levels", {})
    rows = []
    for path in args.paths:
        one = levels.get(f"{path}/1")
        lone = cost_fit({"one": one}) if one else None
        if not one or lone is None or not one.get("p50_ms"):
            print(f"simulator prediction, {path}: no one-client level to measure the time outside the replica")
            continue
        outside = one["p50_ms"] / 1000.0 - args.batch_wait_timeout_s - lone["mean_batch_s"]
        cpu = _request_cpu(one, args)
        # the thread model's time outside the replica that is not CPU (the loopback, the kernel): what
        # one client's outside time leaves beside its own CPU, measured together there (it does not grow
        # as a request's CPU falls with load)
        one_threads = thread_cpu(one, args, path)
        wait = None if one_threads is None else max(0.0, outside - _cpu_sum(one_threads))
        for clients in args.clients:
            lv = levels.get(f"{path}/{clients}")
            fit = cost_fit({"lv": lv}) if lv else None
            if fit is None or not lv.get("rps"):
                continue
            got = predict(args, fit, clients, outside)
            lv["sim_predicted_rps"] = got
            row = [("batch cost alone", got, None, fit)]
            if cpu is not None:
                lv["sim_predicted_rps_cpu"] = predict(args, fit, clients, max(0.0, outside - cpu["request_s"]), cpu)
                row.append(("one client's CPU a request", lv["sim_predicted_rps_cpu"], cpu, fit))
            mine = _request_cpu(lv, args)
            if mine is not None:
                lv["sim_predicted_rps_own_cpu"] = predict(args, fit, clients, max(0.0, outside - mine["request_s"]),
                                                          mine)
                row.append(("this level's CPU a request", lv["sim_predicted_rps_own_cpu"], mine, fit))
            threads = thread_cpu(lv, args, path)
            cpu_fit = cost_fit({"lv": lv}, cpu=True)
            if threads is not None and cpu_fit is not None and wait is not None:
                lv["sim_predicted_rps_threads"] = predict(args, cpu_fit, clients, wait, threads)
                lv["sim_wait_s"] = wait
                lv["sim_threads"] = threads
                row.append(("this level's CPU thread by thread", lv["sim_predicted_rps_threads"], threads, cpu_fit))
            rows.append((f"{path}/{clients}", lv["rps"], outside, row))
    if not rows:
        return
    print("simulator prediction (the same closed loop; batch cost fitted on each level's own batches; the "
          "time outside the replica measured at one client):")
    for key, measured, outside, row in rows:
        for label, value, used, fit in row:
            off = (value - measured) / measured
            verdict = ("calibration: measured here" if key.endswith("/1") else
                       "within 15%" if abs(off) <= 0.15 else "NOT within 15%")
            fixed, per_item = _batch_cost(fit)
            print(f"  {key} ({label}): measured {measured:.1f} req/s, simulator {value:.1f} req/s "
                  f"({100 * off:+.1f}%, {verdict}); batch {1000 * fixed:.2f} ms + "
                  f"{1000 * per_item:.3f} ms x n, outside {1000 * outside:.2f} ms{_cpu_text(used)}")


def print_cpu(results: dict, args: argparse.Namespace) -> None:
    """Where each of ours' levels spent the host's CPU in its window (issue 39's open question: what
    limits a loaded 2-core host when no one thread is busy all the time)."""
    levels = results.get("ours", {}).get("levels", {})
    rows = [(key, lv) for key, lv in levels.items() if lv.get("host_busy_s") is not None and lv.get("rps")]
    if not rows:
        return
    print(f"ours: CPU seconds in each level's {args.seconds:g} s window (/proc; {os.cpu_count()} cores: "
          f"{args.seconds * (os.cpu_count() or 1):g} CPU-s at most):")
    for key, lv in rows:
        procs = lv.get("processes", {})
        proc = {name: "-" if name not in procs else
                f"{procs[name]['total_s']:.2f} (busiest thread {max(procs[name]['top_threads_s'], default=0):.2f})"
                for name in ("ray::ReplicaActor", "ray::HttpIngress")}
        print(f"  {key}: host {lv['host_busy_s']:.2f}; callers' thread {fmt(lv.get('caller_thread_s'))}; replica's "
              f"batch thread {fmt(lv.get('replica_thread_s'))} (batches {lv.get('batch_cpu_s', 0):.2f}); replica "
              f"process {proc['ray::ReplicaActor']}; proxy {proc['ray::HttpIngress']}; controller, raylet, GCS "
              f"{sum(procs.get(n, {}).get('total_s', 0.0) for n in ('ray::Controller', 'raylet', 'gcs_server')):.2f}")


def print_report(results: dict, args: argparse.Namespace) -> list[dict]:
    rows = judge(results, args)
    version = next((r.get("ray_version") for r in results.values() if r.get("ray_version")), "?")
    print(f"\nrankcore @batch vs Ray Serve @serve.batch, {args.replicas} replica(s) of num_cpus 1, "
          f"max_batch_size {args.max_batch_size}, batch_wait_timeout_s {args.batch_wait_timeout_s:g}, "
          f"max_ongoing_requests {args.max_ongoing_requests}, matmul 64x{args.hidden} + {args.layers}x "
          f"{args.hidden}x{args.hidden} padded to {args.max_batch_size} rows, Ray {version}, "
          f"{args.seconds:g} s per level after {args.warmup:g} s warm-up, {os.cpu_count()} CPUs")
    headers = ["path", "clients", "ours req/s", "serve req/s", "ours/serve", "ours p50", "serve p50",
               "ours p99", "serve p99", "p99 ours/serve", "batch o/s", "batch ms o/s", "errors o/s", "goal"]
    table = []
    for r in rows:
        a, b = r["ours"] or {}, r["serve"] or {}
        table.append([r["path"], str(r["clients"]), fmt(a.get("rps"), 1), fmt(b.get("rps"), 1),
                      fmt(r["rps_ratio"]), fmt(a.get("p50_ms")), fmt(b.get("p50_ms")), fmt(a.get("p99_ms")),
                      fmt(b.get("p99_ms")), fmt(r["p99_ratio"]),
                      f"{fmt(a.get('mean_batch'), 1)}/{fmt(b.get('mean_batch'), 1)}",
                      f"{fmt(_ms(a.get('mean_batch_s')))}/{fmt(_ms(b.get('mean_batch_s')))}",
                      f"{a.get('errors', '-')}/{b.get('errors', '-')}", r["verdict"]])
    print_table(headers, table)
    print("(latencies in ms; batch: mean size of the distinct batches run in the window; batch ms: their mean "
          "service time in the replica; goal: ours req/s >= serve and ours p99 <= serve, no errors)")
    for name, res in results.items():
        fit = cost_fit(res.get("levels", {}))
        res["cost_fit"] = fit
        if fit:
            sizes = ", ".join(f"{n}: {fmt(_ms(v['mean_s']))} ms x{v['batches']}" for n, v in fit["by_size"].items())
            print(f"{name}: per-batch service time {fmt(_ms(fit['mean_batch_s']))} ms mean over {fit['batches']} "
                  f"batches; by size: {sizes}")
            print(f"sim cost: fixed_s={fit['fixed_s']:.6f} per_item_s={fit['per_item_s']:.7f}  "
                  f"(fit over the batches of {name}: fixed_s + per_item_s * batch_size)")
    print_predictions(results, args)
    print_cpu(results, args)
    print_errors_and_goal(results, rows, "issue 39")
    return rows


# ---------------------------------------------------------------------- main
def spawn(system_name: str, args: argparse.Namespace) -> dict:
    """Run one system in a child process (a fresh Ray instance) and read its result."""
    argv = [*level_argv(args), "--max-batch-size", str(args.max_batch_size),
            "--batch-wait-timeout-s", str(args.batch_wait_timeout_s),
            "--max-ongoing-requests", str(args.max_ongoing_requests), "--hidden", str(args.hidden),
            "--layers", str(args.layers)]
    limit = args.budget + 120  # the last level may start just before the budget; then start and stop
    return childrun.spawn(str(pathlib.Path(__file__).resolve()), system_name, argv, limit, log)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-batch-size", type=int, default=16, help="both decorators' max_batch_size; default 16")
    p.add_argument("--batch-wait-timeout-s", type=float, default=0.01,
                   help="both decorators' batch_wait_timeout_s; default 0.01")
    p.add_argument("--replicas", type=int, default=1, help="replicas of each system; default 1")
    p.add_argument("--max-ongoing-requests", type=int, default=64,
                   help="max_ongoing_requests of each replica, both systems; default 64")
    p.add_argument("--clients", type=ints, default=[1, 16, 64], help="concurrency levels; default 1,16,64")
    p.add_argument("--paths", type=childrun.paths_type("http", "handle"), default=["http", "handle"], help="http,handle (default)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per level; default 5")
    p.add_argument("--warmup", type=float, default=1.0, help="untimed seconds before each level; default 1")
    p.add_argument("--budget", type=float, default=300.0,
                   help="a child starts no new level past this many seconds; default 300")
    p.add_argument("--request-timeout", type=float, default=30.0, help="limit of one request, seconds; default 30")
    p.add_argument("--num-cpus", type=int, default=4, help="num_cpus of each local Ray instance; default 4")
    p.add_argument("--hidden", type=int, default=2048, help="the square matrix's side; default 2048")
    p.add_argument("--layers", type=int, default=2, help="multiplications by the square matrix; default 2")
    childrun.add_child_arguments(p)
    args = p.parse_args(argv)
    if (args.replicas < 1 or args.seconds <= 0 or args.warmup < 0 or args.max_batch_size < 1
            or args.batch_wait_timeout_s < 0 or args.max_ongoing_requests < 1 or args.hidden < 1 or args.layers < 0):
        p.error("need --replicas >= 1, --seconds > 0, --warmup >= 0, --max-batch-size >= 1, "
                "--batch-wait-timeout-s >= 0, --max-ongoing-requests >= 1, --hidden >= 1, --layers >= 0")
    if args.replicas > args.num_cpus:
        p.error(f"--replicas {args.replicas} of num_cpus 1 do not fit --num-cpus {args.num_cpus}")

    # replicas and the ingress import executors.ray_gpu (ours) and this module by name
    childrun.ray_env(ROOT, ROOT / "benchmarks")

    return childrun.main_for(args, run_child, spawn, print_report, log)


if __name__ == "__main__":
    sys.exit(main())

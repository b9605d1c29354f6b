"""Benchmark rankcore's ``@multiplexed`` against Ray Serve's ``@serve.multiplexed``, same run, same
handler, same Zipf load (issue 39).

What it measures
----------------
Both systems serve ``--models`` models (default 20, ``m0`` .. ``m19``) from ``--replicas``
replicas (default 4, ``num_cpus=0.05`` each, ``max_ongoing_requests = --max-ongoing-requests``,
default 5: Serve's default), each replica keeping at most ``--max-models`` of them (default 3:
Serve's default ``max_num_models_per_replica``). The loader, ``@multiplexed`` (ours,
executors/ray_gpu/replica/multiplex.py) or ``@serve.multiplexed``, sleeps ``--load-s`` (default 0.2 s:
a fixed load time) and returns the model; the handler (``async def __call__``) gets its model with
``await self.get_model(get_multiplexed_model_id())``, then sleeps ``--work-s`` (default 5 ms: the
handler's own cost) and answers the model's id, whether this very request ran the loader, and the
replica's process id. The client checks every answer (its request's id, the model it asked for).

The load: per level, one seeded sequence of model ids drawn from a Zipf law (``P(m_k) ~ 1 /
(k+1)^s``, ``s = --zipf-s``, default 1.0; ``m0`` the most asked), ``--warmup-requests`` (default
40, not counted) then ``--requests`` (default 400): the same sequence for both systems. ``N``
closed-loop clients (``--clients``, default 1,8) take the sequence's next id in turn, each sending
its next request when its last is answered.

Each system runs in its own child process with its own fresh local Ray (``ray.init(address=
"local", num_cpus=--num-cpus)``), one after the other, never both at once: ours with ``run(app,
route_prefix="/mux", port=0)``; Serve with ``serve.start`` on a free port and ``serve.run``. The
levels run in turn on the same deployment (a level starts with the models the last one left).

Through the handle (``handle.options(multiplexed_model_id=id).remote(i)``) by default; ``--paths
handle,http`` adds HTTP (``POST <url>/mux``, header ``serve_multiplexed_model_id: id``, JSON body,
one keep-alive connection a client: benchmarks/rawhttp.py's).

Figures, per path and level, counted over the measured requests only, the same way for both:

* loads: requests whose own ``get_model`` call ran the loader (the loader marks the asyncio task it
  runs in, which both systems' loaders run in: the request's). A request that finds its model
  loading by another request waits for it, but does not load: the load counts once, for the
  request that ran it. hits = answers - loads; hit rate = hits / answers.
* loads a minute (loads over the measured window), waits: requests that did not load but waited at
  least half a load time in ``get_model`` (behind another request's load of the same model);
* p50 / p99 latency (from the send to the checked answer), answers a second, errors.

The goal from issue 39, per path and level: ours' hit rate >= Serve's and ours' p99 <= Serve's,
no errors; MET only if all hold.

Method
------
* ``time.perf_counter`` around each request. Every request has a ``--request-timeout`` (default
  30 s); a child starts no new level past ``--budget`` seconds (default 150) and is killed 120 s
  after that. Ray is shut down (``serve.shutdown()`` first for Serve) in every case.
  ``RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled``.
* The classes are imported by the module's name (``bench_multiplex``, benchmarks/ on the
  ``PYTHONPATH``); the bound reaches the decorators through ``BENCH_MULTIPLEX_MAX_MODELS``.
* Timings on a shared or small machine are noisy: compare within one run. Loads and hit rates
  depend on routing, not on the machine's speed, much less so.

How to run
----------
    .venv/bin/python benchmarks/bench_multiplex.py                  # 4 replicas, 1 and 8 clients, 400 requests each
    .venv/bin/python benchmarks/bench_multiplex.py --quick          # 100 requests a level
    .venv/bin/python benchmarks/bench_multiplex.py --paths handle,http --json out.json
    .venv/bin/python benchmarks/bench_multiplex.py --only ours --zipf-s 1.2 --max-models 2 --load-s 0.5

Needs the ``bench`` extra (Ray Serve). Progress goes to stderr; the table (and ``--json`` file) is
the result.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import pathlib
import random
import sys
import time
from typing import Any

from common import ROOT, awaitable, fmt, free_port, ints, print_errors, print_table, summarise, use_this_tree

use_this_tree()

import childrun  # noqa: E402 - (benchmarks/childrun.py: each system in a child process)

DEP = "mux"  # deployment name (and Serve application name)
ROUTE = "/mux"
MAX_MODELS_ENV = "BENCH_MULTIPLEX_MAX_MODELS"
#: both decorators' max_num_models_per_replica (read where the classes are defined: the child and
#: the replicas, which import this module by name)
MAX_MODELS = int(os.environ.get(MAX_MODELS_ENV, "3"))
ACTOR_OPTIONS = {"num_cpus": 0.05}
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_multiplex {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- load
def zipf_sequence(models: int, s: float, n: int, seed: int) -> list[str]:
    """``n`` model ids ``m0`` .. ``m<models-1>``, each drawn with probability ``~ 1 / (k+1)^s``
    (``m0`` the most likely), from ``random.Random(seed)``: the same list on every machine."""
    rng = random.Random(seed)
    cum, total = [], 0.0
    for k in range(models):
        total += 1.0 / (k + 1) ** s
        cum.append(total)
    return [f"m{min(models - 1, bisect.bisect_right(cum, rng.random() * total))}" for _ in range(n)]


def level_seed(seed: int, path_index: int, level_index: int) -> int:
    """The seed of one level's sequence (the same for both systems)."""
    return seed * 1_000_003 + path_index * 1_009 + level_index


# --------------------------------------------------------------------- models
class Model:
    def __init__(self, model_id: str) -> None:
        self.model_id = model_id


class Base:
    """The replica both systems run: the loader sleeps ``load_s``, the handler ``work_s``."""

    def __init__(self, load_s: float, work_s: float) -> None:
        self.load_s, self.work_s = load_s, work_s
        self.pid = os.getpid()
        self.loads = 0
        self.loading_tasks: set = set()  # the requests' tasks that ran the loader, until they answer

    async def load(self, model_id: str) -> Model:
        self.loading_tasks.add(asyncio.current_task())
        self.loads += 1
        await asyncio.sleep(self.load_s)
        return Model(model_id)

    async def answer(self, x: Any, model_id: str) -> dict:
        task = asyncio.current_task()
        t0 = time.perf_counter()
        try:
            model = await self.get_model(model_id)  # type: ignore[attr-defined]
            got_s = time.perf_counter() - t0
            loaded = task in self.loading_tasks
        finally:
            self.loading_tasks.discard(task)
        await asyncio.sleep(self.work_s)
        return {"id": x, "model": model.model_id, "asked": model_id, "loaded": loaded, "get_s": got_s,
                "pid": self.pid, "replica_loads": self.loads}


def _multiplexed(**options: Any) -> Any:
    from executors.ray_gpu import multiplexed

    return multiplexed(**options)


class OursMux(Base):
    @_multiplexed(max_num_models_per_replica=MAX_MODELS)
    async def get_model(self, model_id: str) -> Model:
        return await self.load(model_id)

    async def __call__(self, x: Any = None) -> dict:
        from executors.ray_gpu import get_multiplexed_model_id

        return await self.answer(x, get_multiplexed_model_id())


def _serve_multiplexed(**options: Any) -> Any:
    """Serve's ``@serve.multiplexed`` (where Ray Serve cannot be imported, the method is left as
    is: only Serve's child uses the class, and the parent says why it cannot run)."""
    try:
        from ray import serve
    except ImportError:
        return lambda fn: fn
    return serve.multiplexed(**options)


class ServeMux(Base):
    @_serve_multiplexed(max_num_models_per_replica=MAX_MODELS)
    async def get_model(self, model_id: str) -> Model:
        return await self.load(model_id)

    async def __call__(self, x: Any = None) -> dict:
        from ray import serve
        from starlette.requests import Request

        body = await x.json() if isinstance(x, Request) else x
        return await self.answer(body, serve.get_multiplexed_model_id())


# ------------------------------------------------------------------- systems
def _options(args: argparse.Namespace) -> dict:
    return {"num_replicas": args.replicas, "max_ongoing_requests": args.max_ongoing_requests,
            "ray_actor_options": dict(ACTOR_OPTIONS)}


class Ours:
    name = "ours"

    def deploy(self, mod: Any, args: argparse.Namespace, timeout: float) -> tuple[Any, str]:
        return childrun.deploy_ours(mod.OursMux, DEP, ROUTE, _options(args), (args.load_s, args.work_s), timeout)

    def shutdown(self) -> None:
        childrun.ours_shutdown(log)


class Serve:
    name = "serve"

    def deploy(self, mod: Any, args: argparse.Namespace, timeout: float) -> tuple[Any, str]:
        from ray import serve

        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        d: Any = serve.deployment(mod.ServeMux, name=DEP, **_options(args))
        handle = serve.run(d.bind(args.load_s, args.work_s), name=DEP, route_prefix=ROUTE)
        return handle, f"http://127.0.0.1:{port}{ROUTE}"

    def shutdown(self) -> None:
        childrun.serve_shutdown(log)


# ----------------------------------------------------------------- measuring
def figures(records: list[dict], errors: int, first_errors: list[str], load_s: float, clients: int) -> dict:
    """A level's figures from its measured requests' records (``t0``, ``t1``: send and answer,
    ``loaded``, ``get_s``, ``pid``, ``model``): common.py's latency summary (bench_http's), then the loads."""
    answers = len(records)
    loads = sum(1 for r in records if r["loaded"])
    waits = sum(1 for r in records if not r["loaded"] and r["get_s"] >= 0.5 * load_s)
    window = (max(r["t1"] for r in records) - min(r["t0"] for r in records)) if records else 0.0
    copies: dict[str, set] = {}
    for r in records:
        if r["loaded"]:
            copies.setdefault(r["model"], set()).add(r["pid"])
    out = summarise([r["t1"] - r["t0"] for r in records], answers, errors, window, clients, first_errors)
    out.update({"loads": loads, "hits": answers - loads, "hit_rate": (answers - loads) / answers if answers else None,
                "waits": waits, "loads_per_min": 60.0 * loads / window if window > 0 else None,
                "replicas_answering": len({r["pid"] for r in records}),
                "models_loaded_on_2_or_more": sum(1 for v in copies.values() if len(v) > 1)})
    return out


async def run_level(send: Any, seq: list[str], warmup: int, clients: int, timeout: float, load_s: float) -> dict:
    """``clients`` closed-loop clients over ``seq`` (each takes the next id in turn);
    ``send(client, index, model_id)`` returns the checked answer or raises. The first ``warmup``
    requests are not counted."""
    state = {"next": 0, "errors": 0}
    records: list[dict] = []
    first_errors: list[str] = []

    async def client(c: int) -> None:
        while state["next"] < len(seq):
            i = state["next"]
            state["next"] += 1
            model_id = seq[i]
            t0 = time.perf_counter()
            try:
                ans = await asyncio.wait_for(send(c, i, model_id), timeout)
                if not (isinstance(ans, dict) and ans.get("id") == i and ans.get("model") == model_id
                        and ans.get("asked") == model_id):
                    raise RuntimeError(f"wrong answer for request {i} ({model_id}): {ans!r}"[:300])
            except Exception as exc:
                if i >= warmup:
                    state["errors"] += 1
                    if len(first_errors) < 3:
                        first_errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            if i >= warmup:
                records.append({"t0": t0, "t1": time.perf_counter(), "loaded": bool(ans["loaded"]),
                                "get_s": float(ans["get_s"]), "pid": ans["pid"], "model": model_id})

    await asyncio.gather(*(client(c) for c in range(clients)))
    return figures(records, state["errors"], first_errors, load_s, clients)


def handle_sender(handle: Any) -> Any:
    async def send(c: int, i: int, model_id: str) -> Any:
        return await awaitable(handle.options(multiplexed_model_id=model_id).remote(i))

    return send


def http_senders(url: str, clients: int, timeout: float) -> tuple[Any, list]:
    """One keep-alive connection a client (rawhttp's), the model in ``serve_multiplexed_model_id``."""
    from rawhttp import RawClient

    pool = [RawClient(url, timeout) for _ in range(clients)]
    path, host = pool[0].path, f"{pool[0].host}:{pool[0].port}"

    async def send(c: int, i: int, model_id: str) -> Any:
        client = pool[c]  # (one request at a time a client: its head can name this request's model)
        client._head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                        f"serve_multiplexed_model_id: {model_id}\r\nContent-Length: ").encode()
        status, data = await client.post(json.dumps(i).encode())
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
        return json.loads(data)

    return send, pool


async def level(path: str, handle: Any, url: str, seq: list[str], clients: int, args: argparse.Namespace) -> dict:
    if path == "handle":
        return await run_level(handle_sender(handle), seq, args.warmup_requests, clients, args.request_timeout,
                               args.load_s)
    send, pool = http_senders(url, clients, args.request_timeout)
    try:
        return await run_level(send, seq, args.warmup_requests, clients, args.request_timeout, args.load_s)
    finally:
        await asyncio.gather(*(p.close() for p in pool))


def run_child(system_name: str, args: argparse.Namespace) -> dict:
    import bench_multiplex as mod  # (by name: the replicas import the same module)

    system: Any = Ours() if system_name == "ours" else Serve()
    total = args.warmup_requests + args.requests

    def one(handle: Any, url: str, pi: int, path: str, li: int, clients: int) -> tuple[dict, str]:
        seq = zipf_sequence(args.models, args.zipf_s, total, level_seed(args.seed, pi, li))
        limit = total * (args.load_s + args.work_s + 1.0) + args.request_timeout + 30
        t1 = time.perf_counter()
        got = childrun.run_async(asyncio.wait_for(level(path, handle, url, seq, clients, args), limit))
        got["level_s"] = time.perf_counter() - t1
        return got, (f"{path} {clients:>3} clients: hit rate {fmt(_pc(got['hit_rate']), 1)}%  loads {got['loads']}  "
                     f"{fmt(got['rps'], 1)} req/s  p50 {fmt(got['p50_ms'])} ms  p99 {fmt(got['p99_ms'])} ms  "
                     f"errors {got['errors']}  ({got['level_s']:.1f}s)")

    return childrun.measure(system_name, args, system, f"{args.replicas} multiplexing replicas (bound {mod.MAX_MODELS})",
                            lambda: system.deploy(mod, args, args.request_timeout * 4), one, log)


# ----------------------------------------------------------------- reporting
def _pc(v: float | None) -> float | None:
    return None if v is None else 100.0 * v


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def judge(results: dict, args: argparse.Namespace) -> list[dict]:
    """Per path and level: both systems' figures, ours / Serve's (hit rate, p99) and whether ours'
    hit rate >= Serve's and ours' p99 <= Serve's (None where a figure is missing)."""
    ours, serve = results.get("ours", {}).get("levels", {}), results.get("serve", {}).get("levels", {})
    rows = []
    for path in args.paths:
        for clients in args.clients:
            key = f"{path}/{clients}"
            a, b = ours.get(key), serve.get(key)
            row: dict[str, Any] = {"path": path, "clients": clients, "ours": a, "serve": b, "hit_ratio": None,
                                   "p99_ratio": None, "hit_ok": None, "p99_ok": None, "verdict": "n/a"}
            if a and b and a.get("hit_rate") is not None and b.get("hit_rate") is not None \
                    and a.get("p99_ms") and b.get("p99_ms"):
                row["hit_ratio"] = _ratio(a["hit_rate"], b["hit_rate"])
                row["p99_ratio"] = a["p99_ms"] / b["p99_ms"]
                row["hit_ok"] = a["hit_rate"] >= b["hit_rate"]
                row["p99_ok"] = a["p99_ms"] <= b["p99_ms"]
                clean = not a["errors"] and not b["errors"]
                row["verdict"] = "MET" if row["hit_ok"] and row["p99_ok"] and clean else "NOT MET"
            rows.append(row)
    return rows


def _met(rows: list[dict], key: str) -> str:
    return "MET" if rows and all(r[key] is True for r in rows) else "NOT MET"


def print_report(results: dict, args: argparse.Namespace) -> list[dict]:
    rows = judge(results, args)
    version = next((r.get("ray_version") for r in results.values() if r.get("ray_version")), "?")
    print(f"\nrankcore @multiplexed vs Ray Serve @serve.multiplexed, {args.models} models by Zipf s={args.zipf_s:g} "
          f"over {args.replicas} replicas, max_num_models_per_replica {args.max_models}, load {args.load_s:g} s, "
          f"handler {1000 * args.work_s:g} ms, max_ongoing_requests {args.max_ongoing_requests}, "
          f"{args.requests} requests a level after {args.warmup_requests} (seed {args.seed}), Ray {version}, "
          f"{os.cpu_count()} CPUs")
    headers = ["path", "clients", "hit% ours", "hit% serve", "hit o/s", "loads o/s", "loads/min o/s",
               "waits o/s", "p50 ours", "p50 serve", "p99 ours", "p99 serve", "p99 o/s", "req/s o/s",
               "errors o/s", "goal"]
    table = []
    for r in rows:
        a, b = r["ours"] or {}, r["serve"] or {}
        table.append([r["path"], str(r["clients"]), fmt(_pc(a.get("hit_rate")), 1), fmt(_pc(b.get("hit_rate")), 1),
                      fmt(r["hit_ratio"]), f"{a.get('loads', '-')}/{b.get('loads', '-')}",
                      f"{fmt(a.get('loads_per_min'), 1)}/{fmt(b.get('loads_per_min'), 1)}",
                      f"{a.get('waits', '-')}/{b.get('waits', '-')}",
                      fmt(a.get("p50_ms")), fmt(b.get("p50_ms")), fmt(a.get("p99_ms")), fmt(b.get("p99_ms")),
                      fmt(r["p99_ratio"]), f"{fmt(a.get('rps'), 1)}/{fmt(b.get('rps'), 1)}",
                      f"{a.get('errors', '-')}/{b.get('errors', '-')}", r["verdict"]])
    print_table(headers, table)
    print("(latencies in ms; o/s: ours/serve; hit: requests that did not run the loader; loads: requests that "
          "did; waits: hits that waited >= half a load in get_model; goal: ours hit rate >= serve and ours p99 "
          "<= serve, no errors)")
    for name, res in results.items():
        for key, lv in res.get("levels", {}).items():
            print(f"{name}: {key}: {lv['answers']} answers, {lv['loads']} loads over {fmt(lv['seconds'], 1)} s, "
                  f"{lv['replicas_answering']} replicas answering, {lv['models_loaded_on_2_or_more']} models loaded "
                  f"on 2+ replicas")
    print_errors(results)
    if "ours" in results and "serve" in results:
        clean = all(not r["ours"]["errors"] and not r["serve"]["errors"] for r in rows if r["ours"] and r["serve"])
        clean = clean and not any(res.get("errors") for res in results.values())
        print(f"\ngoal (issue 39): hit rate >= Ray Serve's at each level: {_met(rows, 'hit_ok')}")
        print(f"goal (issue 39): p99 <= Ray Serve's at each level: {_met(rows, 'p99_ok')}")
        overall = "MET" if rows and all(r["verdict"] == "MET" for r in rows) and clean else "NOT MET"
        print(f"goal (issue 39): both at each level, and no errors: {overall}")
    return rows


# ---------------------------------------------------------------------- main
def child_argv(args: argparse.Namespace) -> list[str]:
    """What a child is given (everything it measures by)."""
    return ["--replicas", str(args.replicas), "--models", str(args.models), "--zipf-s", str(args.zipf_s),
            "--max-models", str(args.max_models), "--load-s", str(args.load_s), "--work-s", str(args.work_s),
            "--clients", ",".join(map(str, args.clients)), "--requests", str(args.requests),
            "--warmup-requests", str(args.warmup_requests), "--seed", str(args.seed),
            "--paths", ",".join(args.paths), "--max-ongoing-requests", str(args.max_ongoing_requests),
            "--budget", str(args.budget), "--request-timeout", str(args.request_timeout),
            "--num-cpus", str(args.num_cpus)]


def spawn(system_name: str, args: argparse.Namespace) -> dict:
    """Run one system in a child process (a fresh Ray instance) and read its result."""
    limit = args.budget + 120  # the last level may start just before the budget; then start and stop
    return childrun.spawn(str(pathlib.Path(__file__).resolve()), system_name, child_argv(args), limit, log)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=4, help="replicas of each system; default 4")
    p.add_argument("--models", type=int, default=20, help="models m0..m<N-1>; default 20")
    p.add_argument("--zipf-s", type=float, default=1.0, help="the Zipf exponent s (0: uniform); default 1.0")
    p.add_argument("--max-models", type=int, default=3,
                   help="max_num_models_per_replica of both decorators (-1: no bound); default 3 (Serve's)")
    p.add_argument("--load-s", type=float, default=0.2, help="the loader's fixed load time, seconds; default 0.2")
    p.add_argument("--work-s", type=float, default=0.005,
                   help="the handler's cost once it has its model, seconds; default 0.005")
    p.add_argument("--clients", type=ints, default=[1, 8], help="concurrency levels (closed loop); default 1,8")
    p.add_argument("--requests", type=int, default=400, help="measured requests a level; default 400")
    p.add_argument("--warmup-requests", type=int, default=40,
                   help="requests a level sends first, not counted; default 40")
    p.add_argument("--quick", action="store_true", help="100 requests a level after 10 (a smoke run)")
    p.add_argument("--seed", type=int, default=39, help="seed of the model sequences; default 39")
    p.add_argument("--paths", type=childrun.paths_type("handle", "http"), default=["handle"], help="handle (default) and/or http")
    p.add_argument("--max-ongoing-requests", type=int, default=5,
                   help="max_ongoing_requests of each replica, both systems; default 5 (Serve's)")
    p.add_argument("--budget", type=float, default=150.0,
                   help="a child starts no new level past this many seconds; default 150")
    p.add_argument("--request-timeout", type=float, default=30.0, help="limit of one request, seconds; default 30")
    p.add_argument("--num-cpus", type=int, default=4, help="num_cpus of each local Ray instance; default 4")
    childrun.add_child_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.warmup_requests = 100, 10
    if args.replicas < 1 or args.models < 1 or args.requests < 1 or args.warmup_requests < 0:
        p.error("need --replicas >= 1, --models >= 1, --requests >= 1, --warmup-requests >= 0")
    if args.zipf_s < 0 or args.load_s < 0 or args.work_s < 0:
        p.error("need --zipf-s >= 0, --load-s >= 0, --work-s >= 0")
    if args.max_models != -1 and args.max_models < 1:
        p.error(f"--max-models must be 1 or more, or -1 (no bound), got {args.max_models}")
    if args.max_ongoing_requests < 1 or args.request_timeout <= 0 or args.budget <= 0:
        p.error("need --max-ongoing-requests >= 1, --request-timeout > 0, --budget > 0")
    if args.replicas * ACTOR_OPTIONS["num_cpus"] > args.num_cpus:
        p.error(f"--num-cpus {args.num_cpus} has no room for {args.replicas} replicas of num_cpus "
                f"{ACTOR_OPTIONS['num_cpus']}")

    # replicas and the ingress import executors.ray_gpu (ours) and this module by name; the bound
    # reaches the decorators (in the children and the replicas) through the environment
    childrun.ray_env(ROOT, ROOT / "benchmarks")
    os.environ[MAX_MODELS_ENV] = str(args.max_models)

    return childrun.main_for(args, run_child, spawn, print_report, log)


if __name__ == "__main__":
    sys.exit(main())

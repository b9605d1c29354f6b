"""Benchmark rankcore's Ray executor against Ray Serve, on real Ray actors.

What it measures
----------------
Both systems run the same deployment (a tiny class whose ``__call__`` returns
the replica's id, rank and world_size, and whose ``reconfigure(user_config,
rank)`` logs every call), with ``--replicas`` N replicas of ``num_cpus=0.1``,
``max_ongoing_requests=5`` and a ``user_config`` (so Serve calls
``reconfigure`` on rank changes as well). Each system runs in its own child
process with its own fresh local Ray instance (same Ray version: the one in
this virtualenv) and goes through these steps, in this order:

1. deploy 0 -> N: seconds from the deploy call (ours: ``run()``, which starts
   the controller; Serve: ``serve.start(proxy_location="Disabled")`` +
   ``serve.run``, which starts Serve's controller) until every one of the N
   replicas has answered a request through the handle (answers are gathered
   in batches of 3 * N concurrent requests; a replica counts once it answered
   any of them).
2. crash -> same-rank replacement, ``--repeats`` times: kill one replica actor
   with ``ray.kill`` (ours: ``ModelActor:bench:<id>`` in namespace
   ``rankcore``; Serve: ``SERVE_REPLICA::bench#bench#<id>`` in namespace
   ``serve``, found with ``ray.util.list_named_actors``) and time until a
   replica with the same rank (``get_replica_context().rank.rank``) but a
   different replica id answers a request. Each repeat kills a different rank
   and starts from a settled deployment (all N ids answered after the previous
   kill, ranks 0..N-1; untimed). Median and all values are reported.
3. downscale N -> N // 2 in place: ours ``handle.scale(N // 2)`` (returns when
   healthy; then ``handle.ranks()`` must be 0..M-1), Serve ``serve.run`` of the
   same application with ``num_replicas=N // 2``. Serve >= 2.5x gives every
   imperative ``serve.run`` a random code version, which would replace every
   replica (a rolling update, not a downscale); the script pins the
   deployment's ``_version`` (what the removed ``version=`` option did, and
   what ``serve deploy`` of an unchanged config does) so that the redeploy is
   an in-place scale. Timed until one batch of requests is answered by exactly
   M distinct replicas whose ranks are exactly {0..M-1}. Also reported: how
   many replicas had their ``reconfigure`` called during the downscale, and how
   many of those calls changed the replica's (rank, node_rank, local_rank), in
   all and per level, counted from the replicas' own log (every replica,
   victims included, appends a line per call to a file; the window is from the
   scale call until 1 s after settling). Which replicas are stopped is each
   system's own choice (ours: the highest ranks; Serve: its scheduler's).
4. controller restart (``--no-controller`` skips it): kill the controller
   actor with ``ray.kill(no_restart=False)`` (Ray restarts it); time until it
   answers a trivial call again (ours ``state_errors``, Serve
   ``check_alive``), while a second thread keeps sending requests through the
   handle; count failed requests and the slowest request in that window
   (kill .. answer + 1 s). For ours the ranks must be unchanged afterwards.

Then the goals from the issue are judged: ours no slower than Ray Serve on
deploy, crash replacement (median) and downscale, and fewer (here: not more)
replicas reconfigured in the downscale.

Method
------
* ``time.perf_counter`` for every duration; ``time.time`` only to match the
  replicas' reconfigure log lines to the downscale window.
* Every wait has a timeout (``--timeout``, default 120 s); a step that times
  out is reported as an error and the remaining steps of that system are
  skipped. The child process is stopped (SIGTERM, then SIGKILL) if it runs far
  past its budget. Ray is shut down (``serve.shutdown()`` first for Serve) in
  every case.
* Ray is started as ``ray.init(address="local", num_cpus=8, num_gpus=4,
  include_dashboard=False, object_store_memory=256 MiB)`` with
  ``RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled``; Serve's HTTP proxy is
  disabled (both systems are driven through handles only, and a proxy would
  compete for port 8000 with other Ray users of the machine).
* No warm-up. Timings on a busy machine are noisy: re-run on a quiet one
  before drawing conclusions.

How to run
----------
    .venv/bin/python benchmarks/bench_ray.py                    # N=16, 5 repeats, both
    .venv/bin/python benchmarks/bench_ray.py --replicas 8 --repeats 2 --json out.json
    .venv/bin/python benchmarks/bench_ray.py --only ours

Progress goes to stderr; the table (and ``--json`` file) is the result.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from common import ROOT, use_this_tree

use_this_tree()

import childrun  # noqa: E402 - (benchmarks/childrun.py: each system in a child process)

DEP = "bench"  # deployment name (and Serve application name)
USER_CONFIG = {"model": "v1"}
ACTOR_OPTIONS = {"num_cpus": 0.1}
MAX_ONGOING = 5
T0 = time.perf_counter()

# The issue's Ray Serve 2.60 numbers on this machine (orientation only).
ISSUE_SERVE = {"deploy_s": "~16", "crash_median_s": "~7-11", "downscale_s": "~3"}


def log(msg: str) -> None:
    print(f"[bench_ray {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A step failed or timed out; the message says which and why."""


# --------------------------------------------------------------------- models
def _log_reconfigure(log_path: str, system: str, rid: str, old: Any, new: Any) -> None:
    """``old`` / ``new``: (rank, node_rank, local_rank) before and in this call
    (``old`` None on the first call, at startup)."""
    changed = [old is not None and old[i] != new[i] for i in range(3)]
    line = json.dumps({"t": time.time(), "sys": system, "rid": rid, "pid": os.getpid(), "old": old, "new": new,
                       "changed": any(changed), "rank_changed": changed[0], "node_rank_changed": changed[1],
                       "local_rank_changed": changed[2]})
    with open(log_path, "a") as f:  # one short O_APPEND write per call: atomic enough between processes
        f.write(line + "\n")


def _rank_int(rank: Any) -> Any:
    return getattr(rank, "rank", rank)


def _rank_tuple(rank: Any) -> list:
    return [getattr(rank, "rank", rank), getattr(rank, "node_rank", None), getattr(rank, "local_rank", None)]


class OursModel:
    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        self.last_rank = None

    def reconfigure(self, user_config: Any, rank: Any) -> None:
        from executors.ray_gpu import get_replica_context

        try:
            rid = get_replica_context().replica_id
        except Exception:
            rid = f"pid{os.getpid()}"
        new = _rank_tuple(rank)
        _log_reconfigure(self.log_path, "ours", rid, self.last_rank, new)
        self.last_rank = new

    def __call__(self) -> tuple:
        from executors.ray_gpu import get_replica_context

        ctx = get_replica_context()
        return ctx.replica_id, _rank_int(ctx.rank), ctx.world_size


class ServeModel:
    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        self.last_rank = None

    def reconfigure(self, user_config: Any, rank: Any) -> None:
        from ray import serve

        try:
            rid = serve.get_replica_context().replica_id.unique_id
        except Exception:
            rid = f"pid{os.getpid()}"
        new = _rank_tuple(rank)
        _log_reconfigure(self.log_path, "serve", rid, self.last_rank, new)
        self.last_rank = new

    def __call__(self) -> tuple:
        from ray import serve

        ctx = serve.get_replica_context()
        return ctx.replica_id.unique_id, _rank_int(ctx.rank), ctx.world_size


# ------------------------------------------------------------------- systems
def _init_ray(num_cpus: int) -> None:
    import ray

    ray.init(address="local", num_cpus=num_cpus, num_gpus=4, include_dashboard=False,
             object_store_memory=256 * 1024**2, log_to_driver=False)


class Ours:
    name = "ours"

    def __init__(self, log_path: str, timeout: float, spare_processes: int = 0) -> None:
        self.log_path, self.timeout, self.spare_processes = log_path, timeout, spare_processes
        self.handle: Any = None

    def deploy(self, n: int) -> None:
        from executors.ray_gpu import deployment, run

        d = deployment(OursModel, name=DEP, num_replicas=n, user_config=USER_CONFIG,
                       ray_actor_options=dict(ACTOR_OPTIONS), max_ongoing_requests=MAX_ONGOING,
                       spare_processes=self.spare_processes)
        self.handle = run(d.bind(self.log_path), timeout=self.timeout)

    def send(self) -> Any:
        return self.handle.remote()

    @staticmethod
    def result(resp: Any, timeout: float) -> Any:
        return resp.result(timeout=timeout)

    def kill_replica(self, rid: str) -> None:
        import ray

        ray.kill(ray.get_actor(f"ModelActor:{DEP}:{rid}", namespace="rankcore"), no_restart=True)

    def scale(self, m: int) -> None:
        self.handle.scale(m, timeout=self.timeout)
        deadline = time.perf_counter() + self.timeout
        while True:  # scale() returned healthy; the controller's ranks must be 0..m-1
            ranks = self.handle.ranks()
            if sorted(v[0] for v in ranks.values() if v is not None) == list(range(m)) and len(ranks) == m:
                return
            if time.perf_counter() > deadline:
                raise BenchError(f"ours: handle.ranks() not 0..{m - 1} {self.timeout:g}s after scale: {ranks}")
            time.sleep(0.02)

    def kill_controller(self) -> None:
        import ray

        from executors.ray_gpu import get_controller

        ray.kill(get_controller(), no_restart=False)

    def ping_controller(self, timeout: float) -> None:
        import ray

        from executors.ray_gpu import get_controller

        ray.get(get_controller().state_errors.remote(), timeout=timeout)

    def after_controller_restart(self) -> dict:
        import ray

        from executors.ray_gpu import get_controller

        return {"state_errors": ray.get(get_controller().state_errors.remote(), timeout=self.timeout),
                "ranks": self.handle.ranks()}

    def shutdown(self) -> None:
        childrun.ours_shutdown(log)


def _from_plain_code(handle: Any) -> Any:
    """Serve's ``handle``, callable from plain code: its router on a loop of its own, as in Serve's
    default mode (its fast mode, ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``, runs it on the caller's loop and
    refuses a call from outside one: "No event loop running"). One already set up is left as it is."""
    try:
        handle._init(_run_router_in_separate_loop=True)
    except RuntimeError:  # ("Handle has already been initialized")
        pass
    return handle


class Serve:
    name = "serve"

    def __init__(self, log_path: str, timeout: float) -> None:
        self.log_path, self.timeout = log_path, timeout
        self.handle: Any = None

    def _app(self, n: int) -> Any:
        from ray import serve

        d = serve.deployment(ServeModel, name=DEP, num_replicas=n, user_config=USER_CONFIG,
                             ray_actor_options=dict(ACTOR_OPTIONS), max_ongoing_requests=MAX_ONGOING)
        # Pin the code version: without it every serve.run gets a random one and
        # a changed num_replicas becomes a full rolling replacement.
        d._version = "bench-v1"
        return d.bind(self.log_path)

    def deploy(self, n: int) -> None:
        from ray import serve

        serve.start(proxy_location="Disabled")
        self.handle = _from_plain_code(serve.run(self._app(n), name=DEP, route_prefix=None))

    def send(self) -> Any:
        return self.handle.remote()

    @staticmethod
    def result(resp: Any, timeout: float) -> Any:
        return resp.result(timeout_s=timeout)

    def kill_replica(self, rid: str) -> None:
        try:
            childrun.kill_serve_replica(rid)
        except RuntimeError as exc:
            raise BenchError(str(exc)) from None

    def scale(self, m: int) -> None:
        from ray import serve

        self.handle = _from_plain_code(serve.run(self._app(m), name=DEP, route_prefix=None))

    def kill_controller(self) -> None:
        import ray

        ray.kill(ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve"), no_restart=False)

    def ping_controller(self, timeout: float) -> None:
        import ray

        ray.get(ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve").check_alive.remote(), timeout=timeout)

    def after_controller_restart(self) -> dict:
        return {}

    def shutdown(self) -> None:
        childrun.serve_shutdown(log)


# ----------------------------------------------------------------- measuring
def poll(system: Any, batch: int, timeout: float = 10.0) -> tuple[list[tuple], int]:
    """Send ``batch`` concurrent requests; the answers (replica id, rank,
    world_size) that came back and the number of failed requests."""
    responses, errors = [], 0
    for _ in range(batch):
        try:
            responses.append(system.send())
        except Exception:
            errors += 1
    out = []
    for r in responses:
        try:
            out.append(tuple(system.result(r, timeout)))
        except Exception:
            errors += 1
    return out, errors


def wait_until(what: str, timeout: float, check: Callable[[], Any]) -> Any:
    deadline = time.perf_counter() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.perf_counter() > deadline:
            raise BenchError(f"timed out after {timeout:g}s waiting for {what}")


def wait_all_serving(system: Any, n: int, timeout: float, exclude: frozenset = frozenset()) -> dict:
    """Poll until n distinct replica ids (none in ``exclude``) have answered,
    with ranks exactly 0..n-1; returns id -> rank."""
    seen: dict[str, int] = {}
    errors = 0

    def check() -> Any:
        nonlocal errors
        answers, errs = poll(system, 3 * n)
        errors += errs
        for rid, rank, _ in answers:
            if rid not in exclude:
                seen[rid] = rank
        if len(seen) >= n:
            if len(seen) == n and sorted(seen.values()) == list(range(n)):
                return dict(seen)
            # a replica answered with an old rank or a stopped one answered: start over
            seen.clear()
        return None

    try:
        return wait_until(f"{system.name}: all {n} replicas answering with ranks 0..{n - 1}", timeout, check)
    except BenchError as exc:
        raise BenchError(f"{exc} (last seen {seen}, {errors} failed requests)") from None


def read_log(path: str, since: float, until: float) -> list[dict]:
    try:
        with open(path) as f:
            lines = [json.loads(x) for x in f if x.strip()]
    except FileNotFoundError:
        return []
    return [x for x in lines if since <= x["t"] <= until]


def step_deploy(system: Any, n: int, timeout: float, res: dict) -> dict:
    log(f"{system.name}: deploy 0 -> {n}")
    t0 = time.perf_counter()
    system.deploy(n)
    t_call = time.perf_counter() - t0
    ranks = wait_all_serving(system, n, timeout)
    dt = time.perf_counter() - t0
    res["deploy_s"] = dt
    res["deploy_call_returned_s"] = t_call
    log(f"{system.name}: deploy call returned after {t_call:.2f}s, all {n} serving after {dt:.2f}s")
    return ranks


def step_crash(system: Any, n: int, repeats: int, timeout: float, ranks: dict, res: dict) -> dict:
    values, details = [], []
    for i in range(repeats):
        target = (n // 2 + 3 * i) % n  # a different rank each repeat, same for both systems
        victim = next(rid for rid, rk in ranks.items() if rk == target)
        log(f"{system.name}: crash {i + 1}/{repeats}: killing replica {victim} (rank {target})")
        known = frozenset(ranks)
        failed = 0

        def replaced(target: int = target, victim: str = victim) -> Any:
            nonlocal failed
            answers, errs = poll(system, 3 * n)
            failed += errs
            return next((rid for rid, rk, _ in answers if rk == target and rid != victim), None)

        t0 = time.perf_counter()
        system.kill_replica(victim)
        new = wait_until(f"{system.name}: a new replica with rank {target} answering", timeout, replaced)
        dt = time.perf_counter() - t0
        values.append(dt)
        details.append({"rank": target, "victim": victim, "replacement": new, "seconds": dt,
                        "failed_requests": failed, "replacement_is_new_id": new not in known})
        log(f"{system.name}: rank {target} served by {new} after {dt:.2f}s ({failed} failed requests)")
        ranks = wait_all_serving(system, n, timeout, exclude=frozenset({victim}))  # settle, untimed
    res["crash_s"] = values
    res["crash_median_s"] = statistics.median(values)
    res["crash_details"] = details
    return ranks


def step_downscale(system: Any, n: int, m: int, timeout: float, log_path: str, res: dict) -> None:
    log(f"{system.name}: downscale {n} -> {m}")
    settled: dict = {}
    failed = 0

    def check() -> Any:
        nonlocal failed
        answers, errs = poll(system, 3 * m)
        failed += errs
        by_id = {}
        for rid, rank, ws in answers:
            by_id.setdefault(rid, set()).add((rank, ws))
        ranks = sorted(r for v in by_id.values() for r, _ in v)
        if len(by_id) == m and ranks == list(range(m)):
            settled.update(by_id)
            return True
        return False

    w0 = time.time()
    t0 = time.perf_counter()
    system.scale(m)
    t_call = time.perf_counter() - t0
    wait_until(f"{system.name}: exactly {m} replicas answering with ranks 0..{m - 1}", timeout, check)
    dt = time.perf_counter() - t0
    time.sleep(1.0)  # late reconfigure calls still count
    calls = read_log(log_path, w0, time.time())
    res["downscale_s"] = dt
    res["downscale_call_returned_s"] = t_call
    res["downscale_replicas_reconfigured"] = len({c["rid"] for c in calls})
    res["downscale_rank_changes"] = sum(1 for c in calls if c["changed"])
    res["downscale_rank_changes_by_level"] = {
        level: sum(1 for c in calls if c[f"{level}_changed"]) for level in ("rank", "node_rank", "local_rank")}
    res["downscale_reconfigure_calls"] = calls
    res["downscale_failed_requests"] = failed
    res["downscale_world_sizes_seen"] = sorted({ws for v in settled.values() for _, ws in v})
    log(f"{system.name}: scale call returned after {t_call:.2f}s, settled after {dt:.2f}s; "
        f"{res['downscale_replicas_reconfigured']} replicas reconfigured, "
        f"{res['downscale_rank_changes']} rank changes {res['downscale_rank_changes_by_level']}, "
        f"world_size seen {res['downscale_world_sizes_seen']}")


def step_controller(system: Any, m: int, timeout: float, res: dict) -> None:
    log(f"{system.name}: controller restart")
    before = system.after_controller_restart()
    stop = threading.Event()
    stats = {"sent": 0, "failed": 0, "max_latency_s": 0.0, "errors": []}
    window: list[float] = []  # [kill time, answer time] in perf_counter

    def traffic() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                system.result(system.send(), 30.0)
                ok = True
            except Exception as exc:
                ok = False
                if len(stats["errors"]) < 5:
                    stats["errors"].append(repr(exc)[:200])
            end = time.perf_counter()
            if window and t >= window[0] and (len(window) < 2 or t <= window[1] + 1.0):
                stats["sent"] += 1
                stats["failed"] += 0 if ok else 1
                stats["max_latency_s"] = max(stats["max_latency_s"], end - t)
            time.sleep(0.02)

    th = threading.Thread(target=traffic, daemon=True)
    th.start()
    time.sleep(0.5)
    window.append(time.perf_counter())
    system.kill_controller()

    def answers() -> bool:
        try:
            system.ping_controller(1.0)
            return True
        except Exception:
            time.sleep(0.02)
            return False

    try:
        wait_until(f"{system.name}: the restarted controller answering", timeout, answers)
        window.append(time.perf_counter())
        dt = window[1] - window[0]
        time.sleep(1.0)
    finally:
        stop.set()
        th.join(timeout=40)
    after = system.after_controller_restart()
    res["controller_restart_s"] = dt
    res["controller_window_requests"] = stats["sent"]
    res["controller_failed_requests"] = stats["failed"]
    res["controller_max_request_latency_s"] = stats["max_latency_s"]
    res["controller_request_errors"] = stats["errors"]
    if before:
        res["controller_ranks_unchanged"] = before.get("ranks") == after.get("ranks")
        res["controller_state_errors"] = after.get("state_errors")
    log(f"{system.name}: controller answered after {dt:.2f}s; {stats['failed']}/{stats['sent']} requests failed, "
        f"slowest {stats['max_latency_s']:.2f}s")
    # the deployment must still serve all m replicas
    wait_all_serving(system, m, timeout)


def step_floor(repeats: int, timeout: float, res: dict) -> None:
    """The floor under any crash replacement on this Ray: a bare actor (the
    replicas' ``num_cpus``, in a one-bundle placement group like ours) created
    until its first method answers, on the same busy instance, ``repeats``
    times. Ray starts a fresh worker process for it (the idle pool is above its
    soft limit with N replicas running), as it does for every replacement."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0.1)
    class Bare:
        def ping(self) -> int:
            return 1

    values = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pg = placement_group([{"CPU": 0.1}])
        actor = Bare.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg)).remote()
        ray.get(actor.ping.remote(), timeout=timeout)
        values.append(time.perf_counter() - t0)
        ray.kill(actor)
        remove_placement_group(pg)
        time.sleep(0.5)
    res["floor_s"] = values
    res["floor_median_s"] = statistics.median(values)
    log("floor: a bare actor created and answering: " + ", ".join(f"{v:.2f}" for v in values) + " s")


def run_child(system_name: str, args: argparse.Namespace) -> dict:
    """One system, in this (child) process, with its own local Ray instance."""
    import ray

    n, m = args.replicas, args.replicas // 2
    res: dict = {"system": system_name, "ray_version": ray.__version__, "errors": []}
    log_dir = tempfile.mkdtemp(prefix="bench_ray_")
    log_path = os.path.join(log_dir, "reconfigure.log")
    system = Ours(log_path, args.timeout, args.spare_processes) if system_name == "ours" else Serve(log_path, args.timeout)
    res["spare_processes"] = args.spare_processes if system_name == "ours" else None
    log(f"{system_name}: starting a local Ray {ray.__version__} instance")
    _init_ray(args.num_cpus)
    try:
        ranks = step_deploy(system, n, args.timeout, res)
        step_crash(system, n, args.repeats, args.timeout, ranks, res)
        if system_name == "ours":
            from executors.ray_gpu import get_controller
            from executors.ray_gpu.api.deployments import ask

            res["spare_pool"] = ask(get_controller(), "status")["spare_processes"]
        step_floor(args.repeats, args.timeout, res)
        step_downscale(system, n, m, args.timeout, log_path, res)
        if not args.no_controller:
            step_controller(system, m, args.timeout, res)
    except Exception as exc:  # BenchError, or anything the system raised: report, skip the rest
        msg = f"{type(exc).__name__}: {exc}"
        res["errors"].append(msg)
        log(f"{system_name}: FAILED: {msg}")
    finally:
        log(f"{system_name}: shutting down")
        try:
            system.shutdown()
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)
    return res


# -------------------------------------------------------------------- report
def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def judge(ours: dict, serve: dict) -> list[dict]:
    rows = []

    def row(metric: str, key: str, goal: str, lower_is_better: bool | None, ref: str = "") -> None:
        a, b = ours.get(key), serve.get(key)
        ratio = (a / b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
        if lower_is_better is None or a is None or b is None:
            verdict = "info" if lower_is_better is None else "n/a"
        else:
            verdict = "MET" if a <= b else "NOT MET"
        rows.append({"metric": metric, "ours": a, "serve": b, "ratio": ratio, "goal": goal, "verdict": verdict,
                     "issue_serve": ref})

    row("deploy 0->N, all serving (s)", "deploy_s", "ours <= serve", True, ISSUE_SERVE["deploy_s"])
    row("crash -> same rank serving, median (s)", "crash_median_s", "ours <= serve", True,
        ISSUE_SERVE["crash_median_s"])
    row("floor: a bare actor created, answering (s)", "floor_median_s", "", None)
    row("downscale N->N/2 settled (s)", "downscale_s", "ours <= serve", True, ISSUE_SERVE["downscale_s"])
    row("downscale: replicas reconfigured", "downscale_replicas_reconfigured", "ours <= serve (fewer)", True)
    row("downscale: calls changing the rank tuple", "downscale_rank_changes", "", None)
    row("deploy call returned (s)", "deploy_call_returned_s", "", None)
    row("downscale call returned (s)", "downscale_call_returned_s", "", None)
    row("controller restart, answers (s)", "controller_restart_s", "", None)
    row("controller restart, failed requests", "controller_failed_requests", "", None)
    row("controller restart, slowest request (s)", "controller_max_request_latency_s", "", None)
    return rows


def print_report(results: dict, args: argparse.Namespace) -> list[dict]:
    ours, serve = results.get("ours", {}), results.get("serve", {})
    rows = judge(ours, serve)
    headers = ["metric", "ours", "serve", "ratio", "goal", "verdict", "issue: serve"]
    table = [[r["metric"], _fmt(r["ours"]), _fmt(r["serve"]), _fmt(r["ratio"]), r["goal"], r["verdict"],
              r["issue_serve"]] for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(headers)]
    print(f"\nrankcore Ray executor vs Ray Serve, N={args.replicas}, repeats={args.repeats}, "
          f"Ray {ours.get('ray_version') or serve.get('ray_version')}, ours: spare_processes={args.spare_processes}")
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)))
    for name, res in (("ours", ours), ("serve", serve)):
        if not res:
            continue
        if res.get("crash_s"):
            print(f"{name}: crash -> same-rank replacement, all runs (s): "
                  + ", ".join(f"{v:.2f}" for v in res["crash_s"]))
        for node, pool in sorted((res.get("spare_pool") or {}).items()):
            print(f"{name}: spare processes on node {node[:8]}: kept {pool['target']}, started {pool['started']}, "
                  f"taken by a replica {pool['taken']}" + (f", unavailable: {pool['unavailable']}"
                                                           if pool.get("unavailable") else ""))
        if "downscale_rank_changes_by_level" in res:
            print(f"{name}: downscale reconfigure calls changing each level: {res['downscale_rank_changes_by_level']}; "
                  "calls: " + "; ".join(f"{c['rid']} {c['old']}->{c['new']}"
                                        for c in res.get("downscale_reconfigure_calls", [])))
        if "downscale_world_sizes_seen" in res:
            print(f"{name}: world_size seen by the survivors after the downscale: {res['downscale_world_sizes_seen']}")
        if "controller_ranks_unchanged" in res:
            print(f"{name}: after the controller restart ranks unchanged: {res['controller_ranks_unchanged']}, "
                  f"state_errors: {res.get('controller_state_errors')}")
        for e in res.get("errors", []):
            print(f"{name}: ERROR: {e}")
    judged = [r for r in rows if r["verdict"] in ("MET", "NOT MET")]
    if "ours" in results and "serve" in results:
        overall = ("MET" if judged and len(judged) == 4 and all(r["verdict"] == "MET" for r in judged)
                   else "NOT MET")
        print(f"\ngoal (issue): no slower than Ray Serve on each, fewer reconfigures: {overall}")
    return rows


# ---------------------------------------------------------------------- main
def spawn(system_name: str, args: argparse.Namespace) -> dict:
    """Run one system in a child process (a fresh Ray instance) and read its result."""
    argv = ["--replicas", str(args.replicas), "--repeats", str(args.repeats), "--timeout", str(args.timeout),
            "--num-cpus", str(args.num_cpus), "--spare-processes", str(args.spare_processes)] + (
               ["--no-controller"] if args.no_controller else [])
    budget = args.timeout * (6 + 2 * args.repeats) + 120  # every wait could time out, plus start and stop
    return childrun.spawn(str(pathlib.Path(__file__).resolve()), system_name, argv, budget, log)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=16, help="N (downscale goes to N // 2); default 16")
    p.add_argument("--repeats", type=int, default=5, help="crash repeats; default 5")
    childrun.add_child_arguments(p, "write all results (raw values included) here")
    p.add_argument("--timeout", type=float, default=120.0, help="limit of every wait, seconds; default 120")
    p.add_argument("--num-cpus", type=int, default=8, help="num_cpus of each local Ray instance; default 8")
    p.add_argument("--no-controller", action="store_true", help="skip the controller-restart step")
    p.add_argument("--spare-processes", type=int, default=1,
                   help="ours: the deployment's spare_processes (idle worker processes kept on its node, so a "
                        "crash's replacement skips the process start); 0: none; default 1")
    args = p.parse_args(argv)
    if args.replicas < 2 or args.repeats < 1:
        p.error("need --replicas >= 2 and --repeats >= 1")

    # replicas import executors.ray_gpu (ours) by module name
    childrun.ray_env(ROOT)

    return childrun.main_for(args, run_child, spawn, print_report, log)


if __name__ == "__main__":
    sys.exit(main())

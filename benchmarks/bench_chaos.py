"""Chaos under load: rankcore on Ray against Ray Serve, the same app and faults, one run (issue 40).

What it measures
----------------
Both systems serve the same app on a local multi-node cluster (``ray.cluster_utils.Cluster``: a
head of 2 logical CPUs and no GPU, ``--workers`` worker nodes of 2 logical CPUs and 2 logical
GPUs each, fast node health checks): ``--replicas`` replicas (default 4) of ``num_cpus`` 0.1 and
``num_gpus`` 1 (so they run on the workers), ``max_ongoing_requests`` 5 (Serve's default),
health checks every 1 s with a 3 s timeout (both), a ``user_config`` and a rank-aware
``reconfigure(user_config, rank)``, and an ``async def __call__`` (and ``Say`` for gRPC) that records the request's id
as started (one line appended to a file of its replica), sleeps ``--work`` s (default 0.02) and
answers its replica id, rank, world_size, node, code tag and ``user_config`` generation. Served
over HTTP and gRPC by the head node's proxy (``HeadOnly`` on both: on one host the nodes share its
ports) and by the handle. Each system runs in a child process of its own with a fresh cluster,
``--repeats`` times (default 2), alternating (ours, Serve, ours, Serve).

Under ``--clients`` closed-loop HTTP clients (default 16; each its own keep-alive connection,
benchmarks/rawhttp.py's client with its one resend on a closed idle connection turned off: a
failure is the system's, not hidden by the client), ``--handle-clients`` closed-loop handle
callers (default 8) and ``--grpc-clients`` closed-loop gRPC callers (default 4; each its own
channel, unary ``Say`` of tests/integration/protos/echo.proto with the ``application`` metadata,
reconnecting within 0.1-1 s), every request bounded by ``--request-timeout`` (default 30 s), the faults
of ``--faults`` are injected one after another, each once the previous one settled
(``--gap`` s after, default 2), which replica or node a seeded draw (``--seed``):

* ``replica``: a replica's actor killed (``ray.kill``, no restart);
* ``controller``: the controller's actor killed (Ray restarts it);
* ``proxy``: the head node's HTTP proxy killed (no restart: the system must start it again);
* ``node``: a worker node holding a replica removed from the cluster, and another added;
* ``unresponsive``: a replica's ``check_health`` made to hang (its requests still answered);
* ``slow``: a replica made 10x slower for ``--slow-s`` s (default 5), nothing to replace;
* ``haproxy`` (only when named in ``--faults``, with HAProxy on both sides: ``--ours-mode fast`` or
  ``--data-plane direct``, and ``--serve-mode fast``): the head node's HAProxy process killed
  (``SIGKILL``), its proxy left alone (ours starts another at once, on the socket its proxy holds;
  Serve's proxy fails its health checks);
* ``frozen`` (only when named in ``--faults``): a replica's process stopped (``SIGSTOP``) for
  ``--frozen-s`` s (default 30), then continued: its row says how long after the freeze requests
  still went to it (``left_out_s``: the latest send, while it was stopped, of a request it answered
  or failed). With the default 3 s health-check timeout both controllers replace it within seconds;
  ``--health-timeout 30`` (Serve's default) leaves the routers alone to notice it;
* ``light``: the deployment applied again with a new ``user_config`` (a lightweight update:
  ``reconfigure``, no restart);
* ``heavy``: the deployment applied again with new code (a rolling update). Serve's code
  version is pinned for ``light`` (else ``serve.run`` gives every apply a new one).

Per system and fault (a request is the fault's that it ended after, before the next one):
sent, answered, failed by status or exception, **lost** (neither answered nor failed within the
request timeout: a hang), **avoidable** failures (failed, and the request never started on any
replica: it could have been sent to another one), p50 / p99 latency of the requests sent in the
3 s after the fault, **time back to target** (until ``--replicas`` replicas, none a victim of
the fault, answer with the ranks 0..N-1 and world_size N, for ``light`` / ``heavy`` all with the
new config / code; for ``controller`` also until the controller answers again; for ``proxy``
until an HTTP request sent after the fault is answered), and the ranks after it: what the
replicas themselves answered in the 1.5 s after it settled (reassigned: survivors whose rank
changed; holes in 0..N-1; duplicates; a world_size other than N) and, for ours, whether the
controller's ranks are the ones the replicas answer and its state checks are clean.

The goal (issue 40): ours loses 0, fails no request that had not started (``proxy`` aside: a
client whose proxy died has no server to re-send for it; not aside with ours' direct data plane,
whose HAProxy outlives the proxy, issue 65), and is back to target no slower than Serve (median over
the repeats, per fault).

How to run
----------
    .venv/bin/python benchmarks/bench_chaos.py                   # both, 2 repeats, every fault: ~12 min
    .venv/bin/python benchmarks/bench_chaos.py --only ours --repeats 1 --faults replica,node
    .venv/bin/python benchmarks/bench_chaos.py --clients 4 --handle-clients 2 --only ours --repeats 1 --json out.json

Needs the ``bench`` extra (Ray Serve) for Serve; ``--only ours`` does not. Progress goes to stderr;
the table (and ``--json`` file) is the result. Timings on this shared 2-core host are noisy:
compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import pathlib
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

from common import ROOT, OursReplica, ServeReplica, awaitable, free_port, merged_counts, replica_id, use_this_tree

use_this_tree()

import childrun  # noqa: E402 - (benchmarks/childrun.py: each system in a child process)

from executors.ray_gpu.ingress.haproxy import DATA_PLANES  # noqa: E402 - (declared once, there)

DEP = "chaos"  # deployment name (and Serve application name)
ROUTE = "/chaos"
#: the gRPC service both systems serve (the tests' own stubs: tests/integration/protos/echo.proto)
SERVICERS = ["tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"]
FAULTS = ("replica", "controller", "proxy", "node", "unresponsive", "slow", "light", "heavy")
#: the faults whose failures a system could have avoided by sending the request elsewhere
#: (``proxy``: the client's own connection died with it; with ours' direct data plane it does not, the
#: node's HAProxy outliving its proxy: ``judge``)
REDISPATCHABLE = frozenset(FAULTS) - {"proxy"}
ACTOR_OPTIONS = {"num_cpus": 0.1, "num_gpus": 1}
HEALTH: dict[str, Any] = {"health_check_period_s": 1.0, "health_check_timeout_s": 3.0}
#: faults run only when ``--faults`` names them (not in ``all``)
EXTRA_FAULTS = ("frozen", "haproxy")
MAX_ONGOING = 5
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_chaos {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A step of the run failed; the message says which and why."""


def _health(args: argparse.Namespace) -> dict[str, Any]:
    """Both systems' health-check settings: ``HEALTH`` with ``--health-timeout``."""
    return {**HEALTH, "health_check_timeout_s": args.health_timeout}


# --------------------------------------------------------------------- the app
class _App:
    """Records each request as started, sleeps ``work`` (x10 while its ``slow-<id>`` file exists),
    answers who it is; ``check_health`` hangs while its ``hang-<id>`` file exists."""

    TAG = "v1"
    context: Any = None  # (the system's: OursReplica or ServeReplica, first among the bases)

    def __init__(self, chaos_dir: str, work: float) -> None:
        self.dir, self.work = chaos_dir, work
        self.cfg: Any = None
        self._id: str | None = None

    def _rid(self) -> str:
        if self._id is None:
            self._id = replica_id(self.context())
        return self._id

    def reconfigure(self, user_config: Any, rank: Any = None) -> None:
        self.cfg = (user_config or {}).get("n")

    async def check_health(self) -> None:
        if os.path.exists(os.path.join(self.dir, f"hang-{self._rid()}")):
            await asyncio.sleep(3600)

    async def answer(self, body: Any) -> dict:
        rid = self._rid()
        with open(os.path.join(self.dir, f"started-{rid}"), "a") as f:
            f.write(f"{body.get('id')}\n")
        slow = os.path.exists(os.path.join(self.dir, f"slow-{rid}"))
        await asyncio.sleep(self.work * (10 if slow else 1))
        import ray

        ctx = self.context()
        return {"id": body.get("id"), "rid": rid, "rank": getattr(ctx.rank, "rank", ctx.rank),
                "ws": ctx.world_size, "tag": self.TAG, "cfg": self.cfg,
                "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


    async def Say(self, request: Any) -> Any:
        """The gRPC path (tests/integration/protos/echo.proto): the body and the answer as JSON text."""
        from tests.integration.protos import echo_pb2

        return echo_pb2.EchoReply(text=json.dumps(await self.answer(json.loads(request.text))))


class _Ours(OursReplica, _App):
    async def __call__(self, body: Any) -> dict:
        return await self.answer(body)


class _Serve(ServeReplica, _App):
    async def __call__(self, body: Any) -> dict:
        from starlette.requests import Request

        return await self.answer(await body.json() if isinstance(body, Request) else body)


class OursV1(_Ours):
    TAG = "v1"


class OursV2(_Ours):
    TAG = "v2"


class ServeV1(_Serve):
    TAG = "v1"


class ServeV2(_Serve):
    TAG = "v2"


# ------------------------------------------------------------------- systems
class Ours:
    name = "ours"

    def __init__(self, args: argparse.Namespace, chaos_dir: str) -> None:
        self.args, self.dir = args, chaos_dir
        self.handle: Any = None

    def _deploy(self, cls: type, n: int) -> Any:
        from executors.ray_gpu import deployment, run

        d = deployment(cls, name=DEP, num_replicas=self.args.replicas, user_config={"n": n},
                       ray_actor_options=dict(ACTOR_OPTIONS), max_ongoing_requests=MAX_ONGOING,
                       **_health(self.args))
        return run(d.bind(self.dir, self.args.work), route_prefix=ROUTE, timeout=self.args.settle_timeout)

    def deploy(self) -> str:
        from executors.ray_gpu.ingress.http import ingress_address, start_ingress

        self.grpc_target = f"127.0.0.1:{free_port()}"
        start_ingress(port=0, proxy_location="HeadOnly", grpc_port=int(self.grpc_target.rsplit(":", 1)[1]),
                      grpc_servicer_functions=SERVICERS, data_plane=self.args.data_plane)
        self.handle = self._deploy(OursV1, 1)
        address = ingress_address()
        if address is None:
            raise BenchError("ours: the ingress did not start")
        return f"http://{address[0]}:{address[1]}{ROUTE}"

    def apply(self, version: str, n: int) -> None:
        self._deploy(OursV2 if version == "v2" else OursV1, n)

    def kill_replica(self, rid: str) -> None:
        import ray

        ray.kill(ray.get_actor(f"ModelActor:{DEP}:{rid}", namespace="rankcore"), no_restart=True)

    def kill_controller(self) -> None:
        import ray

        from executors.ray_gpu import get_controller

        ray.kill(get_controller(), no_restart=False)

    def controller_answers(self) -> bool:
        import ray

        from executors.ray_gpu import get_controller

        try:
            ray.get(get_controller().state_errors.remote(), timeout=1.0)
            return True
        except Exception:
            return False

    def kill_proxy(self) -> None:
        import ray

        from executors.ray_gpu.ingress.http import INGRESS_NAME

        ray.kill(ray.get_actor(INGRESS_NAME, namespace="rankcore"), no_restart=True)

    def kill_haproxy(self) -> None:
        """The head proxy's HAProxy serving now, ``SIGKILL``: ``data_plane()``'s ``haproxy_pid``, or while
        a new proxy has not replaced the one it adopted from its predecessor, that one's."""
        import ray

        from executors.ray_gpu.ingress.http import INGRESS_NAME

        info = ray.get(ray.get_actor(INGRESS_NAME, namespace="rankcore").data_plane.remote(), timeout=30)
        pid = info.get("haproxy_pid") or info.get("adopted_pid")
        if not pid:
            raise BenchError(f"ours: no HAProxy to kill (data plane {info.get('data_plane')!r})")
        os.kill(pid, signal.SIGKILL)

    def controller_view(self) -> dict:
        """The controller's ranks (replica id -> global rank) of the replicas it has serve (not those it
        is stopping: an unhealthy one drains on a spare rank while its successor serves) and its state
        checks."""
        import ray

        from executors.ray_gpu import get_controller

        replicas = self.handle.status()["replicas"]
        ranks = {rid: r["rank"][0] for rid, r in replicas.items()
                 if r.get("rank") is not None and r.get("phase") != "stopping"}
        return {"ranks": ranks, "state_errors": ray.get(get_controller().state_errors.remote(), timeout=30)}

    def shutdown(self) -> None:
        childrun.ours_shutdown(log)


class Serve:
    name = "serve"

    def __init__(self, args: argparse.Namespace, chaos_dir: str) -> None:
        self.args, self.dir = args, chaos_dir
        self.handle: Any = None

    def _deploy(self, cls: type, n: int, version: str) -> Any:
        from ray import serve

        d: Any = serve.deployment(cls, name=DEP, num_replicas=self.args.replicas, user_config={"n": n},
                                  ray_actor_options=dict(ACTOR_OPTIONS), max_ongoing_requests=MAX_ONGOING,
                                  **_health(self.args))
        d._version = version  # (pinned: else every serve.run is a new code version, a rolling update)
        return serve.run(d.bind(self.dir, self.args.work), name=DEP, route_prefix=ROUTE)

    def deploy(self) -> str:
        from ray import serve

        port, grpc_port = free_port(), free_port()
        self.grpc_target = f"127.0.0.1:{grpc_port}"
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port},
                    grpc_options={"port": grpc_port, "grpc_servicer_functions": SERVICERS})
        self.handle = self._deploy(ServeV1, 1, "v1")
        return f"http://127.0.0.1:{port}{ROUTE}"

    def apply(self, version: str, n: int) -> None:
        self._deploy(ServeV2 if version == "v2" else ServeV1, n, version)

    def kill_replica(self, rid: str) -> None:
        try:
            childrun.kill_serve_replica(rid)
        except RuntimeError as exc:
            raise BenchError(str(exc)) from None

    def kill_controller(self) -> None:
        import ray

        ray.kill(ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve"), no_restart=False)

    def controller_answers(self) -> bool:
        import ray

        try:
            ray.get(ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve").check_alive.remote(), timeout=1.0)
            return True
        except Exception:
            return False

    def kill_proxy(self) -> None:
        import ray

        head = ray.get_runtime_context().get_node_id()
        ray.kill(ray.get_actor(f"SERVE_PROXY_ACTOR-{head}", namespace="serve"), no_restart=True)

    def kill_haproxy(self) -> None:
        """The head proxy's HAProxy serving now, ``SIGKILL``: in fast mode the proxy actor
        (``HAProxyManager``, its process titled so) runs it as its child; the newest such child (older
        ones drain a reload). Read from ``/proc``: every node is on this host, and Ray's state API
        needs the dashboard, which this cluster runs without."""
        children = []
        for pid in (int(n) for n in os.listdir("/proc") if n.isdigit()):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv0 = f.read().split(b"\0")[0]
                if not argv0.endswith(b"haproxy"):
                    continue
                with open(f"/proc/{stat[1]}/cmdline", "rb") as f:
                    parent = f.read()
            except OSError:
                continue
            if parent.startswith(b"ray::HAProxyManager"):
                children.append((int(stat[19]), pid))  # (its start time: the newest serves)
        if not children:
            raise BenchError("serve: no HAProxy to kill (RAY_SERVE_ENABLE_HA_PROXY=1 runs one)")
        os.kill(max(children)[1], signal.SIGKILL)

    def controller_view(self) -> dict | None:
        return None  # (Serve's controller has no rank table to compare)

    def shutdown(self) -> None:
        childrun.serve_shutdown(log)


# ------------------------------------------------------------------ the load
class Load:
    """The closed-loop clients (HTTP and handle) on one asyncio loop in a thread of the child, and
    every request's record: (sent, ended, path, id, outcome, who) — who: the answering replica's id when ok, else
    what the failure said."""

    def __init__(self, url: str, grpc_target: str, handle: Any, args: argparse.Namespace) -> None:
        self.url, self.grpc_target, self.handle, self.args = url, grpc_target, handle, args
        self.records: list[tuple] = []
        self.latest: dict[str, tuple] = {}  # replica id -> (when, answer): the last answer of each
        self.stop = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def now(self) -> float:
        return time.perf_counter()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        tasks = [self._http_client(c) for c in range(self.args.clients)]
        tasks += [self._handle_client(c) for c in range(self.args.handle_clients)]
        tasks += [self._grpc_client(c) for c in range(self.args.grpc_clients)]
        await asyncio.gather(*tasks)

    def _record(self, t0: float, path: str, rid: str, outcome: str, answer: Any) -> None:
        t1 = time.perf_counter()
        # (an answer's replica id for ``ok``; what failed says, else)
        self.records.append((t0, t1, path, rid, outcome, answer.get("rid") if outcome == "ok" and isinstance(
            answer, dict) else None if outcome == "ok" else answer))
        if outcome == "ok" and isinstance(answer, dict) and "rid" in answer:
            self.latest[answer["rid"]] = (t1, answer)

    async def _loop(self, path: str, prefix: str, send: Any) -> None:
        """One closed-loop client: ``send(request id)`` -> (outcome, answer, pause) each request
        (pause: it failed at once, so wait 50 ms: a refused connection is not a busy loop); the
        client's own timeout is a loss, any other exception a failure named by its type."""
        seq = 0
        while not self.stop.is_set():
            rid = f"{prefix}-{seq}"
            seq += 1
            t0 = time.perf_counter()
            try:
                outcome, answer, pause = await send(rid, t0)
            except asyncio.TimeoutError:
                outcome, answer, pause = "lost", None, False
            except Exception as exc:
                outcome, answer, pause = type(exc).__name__, str(exc)[:200], True
            self._record(t0, path, rid, outcome, answer)
            if pause:
                await asyncio.sleep(0.05)

    async def _http_client(self, c: int) -> None:
        from rawhttp import RawClient

        client = RawClient(self.url, self.args.request_timeout, resend_on_closed=False)

        async def send(rid: str, t0: float) -> tuple:
            status, data = await client.post(json.dumps({"id": rid}).encode())
            if status == 200:
                return "ok", json.loads(data), False
            return f"HTTP {status}", data[:200].decode(errors="replace"), False

        try:
            await self._loop("http", f"h{c}", send)
        finally:
            await client.close()

    async def _grpc_client(self, c: int) -> None:
        """Its own channel (reconnecting within 0.1-1 s after its proxy went), unary ``Say`` calls
        with the ``application`` metadata; a status code is the failure, a deadline a loss."""
        import grpc

        from tests.integration.protos import echo_pb2, echo_pb2_grpc

        channel = grpc.aio.insecure_channel(self.grpc_target, options=[
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000)])
        stub = echo_pb2_grpc.EchoStub(channel)

        async def send(rid: str, t0: float) -> tuple:
            try:
                reply = await stub.Say(echo_pb2.EchoRequest(text=json.dumps({"id": rid})),
                                       metadata=(("application", DEP),), timeout=self.args.request_timeout)
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED and \
                        time.perf_counter() - t0 >= self.args.request_timeout - 0.5:  # (its own deadline)
                    return "lost", None, False
                return f"gRPC {code.name}", (exc.details() or "")[:200], True
            return "ok", json.loads(reply.text), False

        try:
            await self._loop("grpc", f"g{c}", send)
        finally:
            await channel.close()

    async def _handle_client(self, c: int) -> None:
        async def send(rid: str, t0: float) -> tuple:
            answer = await asyncio.wait_for(awaitable(self.handle.remote({"id": rid})), self.args.request_timeout)
            return "ok", answer, False

        await self._loop("handle", f"d{c}", send)

    def end(self) -> None:
        """No new request; those under way end (answered, failed or timed out: lost)."""
        self.stop.set()
        self.thread.join(self.args.request_timeout + 30)
        if self.thread.is_alive():
            raise BenchError("the load's clients did not end within the request timeout")

    def live(self, since: float, window: float = 1.0) -> dict[str, dict]:
        """The replicas that answered in the last ``window`` s and after ``since``: id -> answer."""
        now = time.perf_counter()
        return {rid: a for rid, (t, a) in list(self.latest.items()) if t >= max(since, now - window)}


# ----------------------------------------------------------------- the faults
class Chaos:
    """Injects each fault, waits until the system is back to target, checks the ranks the replicas
    answer (and, for ours, the controller's), and keeps per-fault figures."""

    def __init__(self, system: Any, load: Load, cluster: Any, args: argparse.Namespace, chaos_dir: str,
                 rng: random.Random) -> None:
        self.system, self.load, self.cluster, self.args, self.dir, self.rng = (
            system, load, cluster, args, chaos_dir, rng)
        self.n = args.replicas
        self.cfg, self.tag = 1, "v1"
        self.windows: list[dict] = []

    def _snapshot(self, since: float = 0.0, window: float = 1.5) -> dict[str, dict]:
        """The replicas answering now (an answer in the last second, ended after ``since``): id ->
        answer (waits up to ``window`` s for all N)."""
        deadline = time.perf_counter() + window
        live = self.load.live(since)
        while len(live) < self.n and time.perf_counter() < deadline:
            time.sleep(0.1)
            live = self.load.live(since)
        return live

    def _on_target(self, since: float, victims: set[str]) -> bool:
        live = {rid: a for rid, a in self.load.live(since).items() if rid not in victims}
        return (len(live) == self.n and sorted(a["rank"] for a in live.values()) == list(range(self.n))
                and all(a["ws"] == self.n and a["cfg"] == self.cfg and a["tag"] == self.tag for a in live.values()))

    def inject(self, fault: str) -> dict:
        before = self._snapshot()
        if len(before) < self.n:
            raise BenchError(f"{self.system.name}: only {len(before)} of {self.n} replicas answering before {fault}")
        victims: set[str] = set()
        extra: dict[str, Any] = {}
        t0 = time.perf_counter()
        worker: threading.Thread | None = None
        if fault == "replica":
            victims = {self.rng.choice(sorted(before))}
            self.system.kill_replica(next(iter(victims)))
        elif fault == "controller":
            self.system.kill_controller()
        elif fault == "proxy":
            self.system.kill_proxy()
        elif fault == "haproxy":
            self.system.kill_haproxy()
        elif fault == "node":
            nodes = sorted({a["node"] for a in before.values()})
            node_id = self.rng.choice(nodes)
            node = next(n for n in self.cluster.worker_nodes if n.node_id == node_id)
            victims = {rid for rid, a in before.items() if a["node"] == node_id}
            self.cluster.remove_node(node)
            self.cluster.add_node(num_cpus=2, num_gpus=2, object_store_memory=128 * 1024**2)
            extra["node_victims"] = len(victims)
        elif fault == "unresponsive":
            victims = {self.rng.choice(sorted(before))}
            pathlib.Path(self.dir, f"hang-{next(iter(victims))}").touch()
        elif fault == "frozen":
            frozen = self.rng.choice(sorted(before))
            pid = int(before[frozen]["pid"])
            os.kill(pid, signal.SIGSTOP)
            threading.Timer(self.args.frozen_s, _resume, (pid,)).start()
            extra["frozen"], extra["frozen_s"] = frozen, self.args.frozen_s
        elif fault == "slow":
            slow = self.rng.choice(sorted(before))
            pathlib.Path(self.dir, f"slow-{slow}").touch()
            threading.Timer(self.args.slow_s, lambda: pathlib.Path(self.dir, f"slow-{slow}").unlink()).start()
        elif fault in ("light", "heavy"):
            if fault == "light":
                self.cfg += 1
            else:
                self.tag = "v2" if self.tag == "v1" else "v1"
                victims = set(before)
            cfg, tag = self.cfg, self.tag
            errors: list[str] = []

            def apply() -> None:
                try:
                    self.system.apply(tag, cfg)
                except Exception as exc:  # (kept: the run goes on, the fault's row says it)
                    errors.append(f"{type(exc).__name__}: {exc}"[:300])

            worker = threading.Thread(target=apply, daemon=True)
            worker.start()
            extra["apply_errors"] = errors
        else:
            raise BenchError(f"unknown fault {fault!r}")
        log(f"{self.system.name}: {fault} injected" + (f" (victims {sorted(victims)})" if victims else ""))

        back = self._wait_back(fault, t0, victims)
        if worker is not None:
            worker.join(self.args.settle_timeout)
            extra["apply_s"] = time.perf_counter() - t0
        if fault in ("slow", "frozen"):  # (the window lasts while the replica is slow or frozen)
            time.sleep(max(0.0, t0 + (self.args.slow_s if fault == "slow" else self.args.frozen_s)
                           - time.perf_counter()))
        settled = time.perf_counter()
        after = self._snapshot(since=settled)  # (a victim's last answers, from before it died, are not "after")
        row = {"fault": fault, "t0": t0, "settled": settled, "back_s": back, **extra,
               **rank_figures(before, after, victims, self.n)}
        view = self.system.controller_view()
        if view is not None:
            row["controller_agrees"] = view["ranks"] == {rid: a["rank"] for rid, a in after.items()}
            row["state_errors"] = view["state_errors"]
        log(f"{self.system.name}: {fault} back to target after {_fmt_s(back)}; ranks {row['ranks']}")
        self.windows.append(row)
        time.sleep(self.args.gap)
        return row

    def _wait_back(self, fault: str, t0: float, victims: set[str]) -> float | None:
        """Seconds from the fault until the system is back to target (None: not within
        ``--settle-timeout``; for ``slow`` and ``frozen``, None: no target to wait for)."""
        if fault in ("slow", "frozen"):
            return None
        deadline = t0 + self.args.settle_timeout
        controller_back = fault != "controller"
        while time.perf_counter() < deadline:
            since = t0 if fault in ("proxy", "haproxy", "controller") else 0.0
            if not controller_back:
                controller_back = self.system.controller_answers()
            if controller_back and self._on_target(since, victims) and (
                    fault not in ("proxy", "haproxy") or self._http_since(t0)):
                return time.perf_counter() - t0
            time.sleep(0.05)
        return None

    def _http_since(self, t0: float) -> bool:
        return any(r[2] == "http" and r[4] == "ok" and r[0] > t0 for r in reversed(self.load.records[-500:]))


def _resume(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:  # (its controller replaced it meanwhile)
        pass


def rank_figures(before: dict, after: dict, victims: set[str], n: int) -> dict:
    """What the replicas answered after the fault settled, against before it."""
    ranks = [a["rank"] for a in after.values()]
    survivors = set(before) & set(after)
    return {"ranks": sorted(ranks), "answering": len(after), "replaced": len(set(before) - set(after)),
            "reassigned": sum(1 for rid in survivors if before[rid]["rank"] != after[rid]["rank"]),
            "holes": len(set(range(n)) - set(ranks)),
            "duplicates": len(ranks) - len(set(ranks)),
            "bad_world_size": sum(1 for a in after.values() if a["ws"] != n),
            "victims_answering": len(victims & set(after))}


def started_ids(chaos_dir: str) -> set[str]:
    """Every request id some replica started (its ``started-<replica>`` files)."""
    out: set[str] = set()
    for p in pathlib.Path(chaos_dir).glob("started-*"):
        out.update(line.strip() for line in p.read_text().splitlines() if line.strip())
    return out


def fault_figures(rows: list[dict], records: list[tuple], started: set[str]) -> list[dict]:
    """Each fault's requests (those that ended from its injection until the next one's: a request
    under way when a fault hit it is that fault's): counts by outcome, lost, avoidable failures and
    the latency of those sent in its first 3 s."""
    for i, row in enumerate(rows):
        t1 = rows[i + 1]["t0"] if i + 1 < len(rows) else math.inf
        mine = [r for r in records if row["t0"] <= r[1] < t1]
        failed = [r for r in mine if r[4] not in ("ok", "lost")]
        if row.get("frozen"):  # (the latest request sent to the frozen replica while it was stopped)
            hit = [r[0] for r in records if row["t0"] <= r[0] < row["t0"] + row["frozen_s"] and (
                r[5] == row["frozen"] or (r[4] != "ok" and isinstance(r[5], str) and row["frozen"] in r[5]))]
            row["left_out_s"] = max(hit) - row["t0"] if hit else 0.0
        early = sorted(r[1] - r[0] for r in mine if r[4] == "ok" and r[0] < row["t0"] + 3.0)
        by: dict[str, int] = {}
        for r in failed:
            by[r[4]] = by.get(r[4], 0) + 1
        row.update({"sent": len(mine), "answered": sum(1 for r in mine if r[4] == "ok"),
                    "failed": len(failed), "failed_by": by, "lost": sum(1 for r in mine if r[4] == "lost"),
                    "avoidable": sum(1 for r in failed if r[3] not in started),
                    "avoidable_by": {path: sum(1 for r in failed if r[3] not in started and r[2] == path)
                                     for path in sorted({r[2] for r in failed if r[3] not in started})},
                    "first_failures": [f"{r[2]} {r[4]}: {r[5]}" for r in failed[:3]],
                    "p50_ms": 1000 * _pct(early, 0.50) if early else None,
                    "p99_ms": 1000 * _pct(early, 0.99) if early else None})
    return rows


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


# ------------------------------------------------------------------ a child
def run_child(system_name: str, args: argparse.Namespace) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    res: dict[str, Any] = {"system": system_name, "ray_version": ray.__version__, "faults": [], "errors": []}
    chaos_dir = tempfile.mkdtemp(prefix="bench_chaos_")
    # (ours' replicas keep their witnesses in a folder of the run's own, in the usual place, not there
    # itself: a killed replica's would stay after the run; the nodes' processes inherit the variable)
    from executors.ray_gpu.base.witness import DIR_ENV, witness_dir

    witnesses = tempfile.mkdtemp(prefix="bench_chaos_witness_", dir=witness_dir())
    os.environ[DIR_ENV] = witnesses
    rng = random.Random(args.seed)
    checks = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "num_gpus": 0, "_system_config": checks, "include_dashboard": bool(args.soak),
        "object_store_memory": 128 * 1024**2})
    system: Any = None
    load: Load | None = None
    try:
        for _ in range(args.workers):
            cluster.add_node(num_cpus=2, num_gpus=2, object_store_memory=128 * 1024**2)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        system = (Ours if system_name == "ours" else Serve)(args, chaos_dir)
        log(f"{system_name}: deploying {args.replicas} replicas on {args.workers} worker nodes")
        t = time.perf_counter()
        url = system.deploy()
        res["deploy_s"] = time.perf_counter() - t
        # (ours' handle callers ask for progress with --handle-progress: their start is told, so one that
        # never began on a replica that died is sent to another; Serve's router always waits for a replica
        # to accept a request before counting it sent)
        handle = system.handle.options(progress=True) if args.handle_progress and system_name == "ours" \
            else system.handle
        load = Load(url, system.grpc_target, handle, args)
        load.start()
        time.sleep(args.warmup)
        chaos = Chaos(system, load, cluster, args, chaos_dir, rng)
        deadline = time.perf_counter() + args.budget
        if args.soak:
            res["soak"] = soak(system_name, chaos, args)
        for fault in [] if args.soak else args.faults:
            if time.perf_counter() > deadline:
                res["errors"].append(f"budget of {args.budget:g}s spent: skipped {fault}")
                continue
            try:
                chaos.inject(fault)
            except BenchError as exc:
                res["errors"].append(str(exc))
                log(str(exc))
                break
        load.end()
        res["faults"] = fault_figures(chaos.windows, load.records, started_ids(chaos_dir))
        res["requests"] = len(load.records)
    except Exception as exc:
        res["errors"].append(f"{type(exc).__name__}: {exc}"[:500])
        log(f"{system_name}: {exc!r}")
        if load is not None:
            load.stop.set()
    finally:
        if system is not None:
            system.shutdown()
        else:
            ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(chaos_dir, ignore_errors=True)
        shutil.rmtree(witnesses, ignore_errors=True)
    for row in res["faults"]:
        row.pop("t0", None)
        row.pop("settled", None)
    return res


# ------------------------------------------------------------------ the soak
ROLES = {"ours": (("controller", "rankcore-controller"), ("proxy", "rankcore-http"), ("replica", "ModelActor:")),
         "serve": (("controller", "SERVE_CONTROLLER_ACTOR"), ("proxy", "SERVE_PROXY_ACTOR"),
                   ("replica", "SERVE_REPLICA::"))}


def rss_by_role(system_name: str) -> dict[str, dict]:
    """Per role (controller, proxy, replica): the live actors' count and summed RSS in MB
    (Ray's state API for their pids, ``/proc/<pid>/status``'s VmRSS: every node is on this host)."""
    import ray
    from ray.util.state import list_actors

    out = {role: {"count": 0, "rss_mb": 0.0} for role, _ in ROLES[system_name]}
    address = ray.get_runtime_context().gcs_address  # (this run's cluster, not another on the host)
    for a in list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=10_000, timeout=30):
        role = next((r for r, prefix in ROLES[system_name] if (a.name or "").startswith(prefix)), None)
        if role is None or not a.pid:
            continue
        try:
            with open(f"/proc/{a.pid}/status") as f:
                kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError):
            continue  # (it ended meanwhile)
        out[role]["count"] += 1
        out[role]["rss_mb"] += kb / 1024
    return out


def soak(system_name: str, chaos: Chaos, args: argparse.Namespace) -> dict:
    """``--soak`` s of the load with a fault every ``--soak-every`` s (``--faults`` in turn), the
    roles' RSS sampled every ``--sample-s`` s; growth: the mean of the last 2 minutes' samples over
    the mean of the 2 minutes after ``--soak-warmup`` s (replicas: per replica, they are replaced)."""
    t0 = time.perf_counter()
    samples: list[dict] = []
    stop = threading.Event()

    def sample() -> None:
        while True:
            try:
                samples.append({"t": time.perf_counter() - t0, **rss_by_role(system_name)})
            except Exception as exc:  # (one missed sample is not the run's end)
                log(f"{system_name}: RSS sample failed: {exc!r}")
            if stop.wait(args.sample_s):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    injected = 0
    try:
        while True:
            due = t0 + (injected + 1) * args.soak_every
            if due > t0 + args.soak:
                break
            time.sleep(max(0.0, due - time.perf_counter()))
            chaos.inject(args.faults[injected % len(args.faults)])
            injected += 1
        time.sleep(max(0.0, t0 + args.soak - time.perf_counter()))
    finally:
        stop.set()
        sampler.join(60)
    return {"seconds": time.perf_counter() - t0, "faults_injected": injected, "samples": samples,
            "growth": rss_growth(samples, args.soak_warmup)}


def _per(sample: dict, role: str) -> float | None:
    got = sample.get(role) or {}
    if not got.get("count"):
        return None
    return got["rss_mb"] / got["count"] if role == "replica" else got["rss_mb"]


def rss_growth(samples: list[dict], warmup: float, span: float = 120.0) -> dict:
    """Per role: the mean RSS (MB) of the ``span`` s after ``warmup`` and of the last ``span`` s,
    and their ratio (the goal: at most 1.10)."""
    if not samples:
        return {}
    end = samples[-1]["t"]
    out = {}
    for role in ("controller", "proxy", "replica"):
        first = [v for x in samples if warmup <= x["t"] < warmup + span and (v := _per(x, role)) is not None]
        last = [v for x in samples if x["t"] >= end - span and (v := _per(x, role)) is not None]
        if first and last:
            a, b = statistics.mean(first), statistics.mean(last)
            out[role] = {"after_warmup_mb": a, "last_mb": b, "ratio": b / a if a else None}
    return out


def print_soak(results: dict[str, list[dict]], args: argparse.Namespace) -> bool:
    """The soak's figures; True when the goal holds (lost 0, every role within +10%)."""
    ok = True
    for name, runs in results.items():
        for r in runs:
            sk = r.get("soak")
            if not sk:
                ok = False
                continue
            faults = r.get("faults", [])
            lost, failed = sum(f["lost"] for f in faults), sum(f["failed"] for f in faults)
            print(f"\n{name} soak: {sk['seconds'] / 60:.1f} min, {sk['faults_injected']} faults "
                  f"({','.join(args.faults)} in turn), {r.get('requests')} requests: lost {lost}, failed {failed}, "
                  f"avoidable {sum(f['avoidable'] for f in faults)}, not back to target "
                  f"{sum(1 for f in faults if f['back_s'] is None and f['fault'] != 'slow')}")
            print(f"{'minute':>6}  {'controller MB':>13}  {'proxy MB':>8}  {'replica MB (each)':>17}  replicas")
            shown = -1
            for x in sk["samples"]:
                if int(x["t"] // 60) > shown:
                    shown = int(x["t"] // 60)
                    print(f"{shown:>6}  {_f(_per(x, 'controller'), 1):>13}  {_f(_per(x, 'proxy'), 1):>8}  "
                          f"{_f(_per(x, 'replica'), 1):>17}  {x.get('replica', {}).get('count', 0)}")
            for role, g in sk["growth"].items():
                verdict = g["ratio"] is not None and g["ratio"] <= 1.10
                ok = ok and verdict
                print(f"  {role}: {g['after_warmup_mb']:.1f} MB after the {args.soak_warmup:g} s warm-up, "
                      f"{g['last_mb']:.1f} MB at the end: x{_f(g['ratio'])} ({'within' if verdict else 'NOT within'} 10%)")
            ok = ok and lost == 0 and len(sk["growth"]) == 3
            if args.plot:
                plot_soak(sk["samples"], args.plot, name)
    print(f"soak goal (lost 0, RSS of the controller, proxies and each replica within +10% after the warm-up): "
          f"{'MET' if ok else 'NOT MET'}")
    return ok


def plot_soak(samples: list[dict], path: str, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for role, label in (("controller", "controller"), ("proxy", "proxy"), ("replica", "each replica (mean)")):
        pts = [(x["t"] / 60, v) for x in samples if (v := _per(x, role)) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label)
    ax.set_xlabel("minutes under load, a fault every minute")
    ax.set_ylabel("RSS (MB)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{name}: memory over the soak")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"wrote {path}")


# ----------------------------------------------------------------- reporting
def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(results: dict[str, list[dict]], faults: list[str]) -> list[dict]:
    """Per fault and system, the repeats together: sums of the counts, medians of the times."""
    rows = []
    for fault in faults:
        row: dict[str, Any] = {"fault": fault}
        for name, runs in results.items():
            got = [f for r in runs for f in r.get("faults", []) if f["fault"] == fault]
            if not got:
                row[name] = None
                continue
            row[name] = {
                "runs": len(got), "sent": sum(f["sent"] for f in got), "answered": sum(f["answered"] for f in got),
                "failed": sum(f["failed"] for f in got), "lost": sum(f["lost"] for f in got),
                "avoidable": sum(f["avoidable"] for f in got),
                "back_s": _median([f["back_s"] for f in got]),
                "left_out_s": _median([f["left_out_s"] for f in got if "left_out_s" in f]),
                "back_all": [f["back_s"] for f in got],
                "p50_ms": _median([f["p50_ms"] for f in got]), "p99_ms": _median([f["p99_ms"] for f in got]),
                "reassigned": sum(f["reassigned"] for f in got), "holes": sum(f["holes"] for f in got),
                "duplicates": sum(f["duplicates"] for f in got),
                "bad_world_size": sum(f["bad_world_size"] for f in got),
                "controller_agrees": all(f.get("controller_agrees", True) for f in got),
                "state_errors": [e for f in got for e in f.get("state_errors", [])],
                "failed_by": merged_counts([f["failed_by"] for f in got]),
                "avoidable_by": merged_counts([f.get("avoidable_by", {}) for f in got]),
                "first_failures": [x for f in got for x in f["first_failures"]][:3]}
        rows.append(row)
    return rows




def judge(row: dict, direct: bool = False) -> str:
    """Issue 40's goal for one fault: ours loses 0, fails no request that had not started
    (``proxy`` aside, unless ours' data plane is ``direct``: its HAProxy outlives the proxy, issue 65),
    its ranks are whole, and it is back to target no slower than Serve."""
    ours, serve = row.get("ours"), row.get("serve")
    if not ours:
        return "n/a"
    redispatchable = row["fault"] in REDISPATCHABLE or (direct and row["fault"] == "proxy")
    ok = (ours["lost"] == 0 and (not redispatchable or ours["avoidable"] == 0)
          and ours["holes"] == ours["duplicates"] == ours["bad_world_size"] == 0 and ours["controller_agrees"]
          and not ours["state_errors"])
    if row["fault"] == "frozen":  # (left out no later than Serve leaves it out)
        theirs = serve.get("left_out_s") if serve else None
        ok = ok and ours["left_out_s"] is not None and (theirs is None or ours["left_out_s"] <= theirs)
    elif row["fault"] != "slow":
        ok = ok and ours["back_s"] is not None
        if serve and serve.get("back_s") is not None:
            ok = ok and ours["back_s"] <= serve["back_s"]
    return "MET" if ok else "NOT MET"


def _f(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def print_report(results: dict[str, list[dict]], args: argparse.Namespace) -> list[dict]:
    rows = summarise(results, args.faults)
    version = next((r.get("ray_version") for runs in results.values() for r in runs if r.get("ray_version")), "?")
    print(f"\nchaos under load: {args.replicas} replicas on {args.workers} worker nodes, {args.clients} HTTP + "
          f"{args.handle_clients} handle{' (ours: progress calls)' if args.handle_progress else ''} + "
          f"{args.grpc_clients} gRPC clients, handler {1000 * args.work:g} ms, {args.repeats} repeat(s) "
          f"alternating, seed {args.seed}, Ray {version}, {os.cpu_count()} CPUs, ours' data plane: {args.plane}")
    headers = ["fault", "sent o/s", "failed o/s", "lost o/s", "avoidable o/s", "back s o/s", "ratio",
               "p50 ms o/s", "p99 ms o/s", "ranks o (reassigned/holes/dups)", "ranks s", "goal"]
    table = []
    for row in rows:
        a, b = row.get("ours") or {}, row.get("serve") or {}
        ratio = (a["back_s"] / b["back_s"] if a.get("back_s") is not None and b.get("back_s") else None)
        table.append([row["fault"], f"{_f(a.get('sent'))}/{_f(b.get('sent'))}",
                      f"{_f(a.get('failed'))}/{_f(b.get('failed'))}", f"{_f(a.get('lost'))}/{_f(b.get('lost'))}",
                      f"{_f(a.get('avoidable'))}/{_f(b.get('avoidable'))}",
                      f"{_f(a.get('back_s'))}/{_f(b.get('back_s'))}", _f(ratio),
                      f"{_f(a.get('p50_ms'), 0)}/{_f(b.get('p50_ms'), 0)}",
                      f"{_f(a.get('p99_ms'), 0)}/{_f(b.get('p99_ms'), 0)}",
                      "/".join(_f(a.get(k)) for k in ("reassigned", "holes", "duplicates")) if a else "-",
                      "/".join(_f(b.get(k)) for k in ("reassigned", "holes", "duplicates")) if b else "-",
                      judge(row, direct=args.plane == "direct")])
        row["verdict"] = table[-1][-1]
    widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print("(o/s: ours/Serve, the repeats summed; back s: seconds from the fault until the target is served again, "
          "median of the repeats; p50, p99: requests sent in the 3 s after the fault; avoidable: failed requests that "
          "never started on a replica)")
    for row in rows:
        if row["fault"] == "frozen":
            print("  frozen: requests were still sent to the stopped replica until "
                  + ", ".join(f"{name} {_f((row.get(name) or {}).get('left_out_s'))} s" for name in ("ours", "serve")
                              if row.get(name)) + " after it stopped (median of the repeats)")
        for name in ("ours", "serve"):
            got = row.get(name)
            if got and (got["failed_by"] or got["state_errors"] or not got["controller_agrees"]):
                print(f"  {row['fault']} {name}: failed by {got['failed_by']}"
                      + (f", avoidable by path {got['avoidable_by']}" if got.get("avoidable_by") else "")
                      + f"; first: {got['first_failures']}"
                      + (f"; state errors {got['state_errors']}" if got["state_errors"] else "")
                      + ("" if got["controller_agrees"] else "; the controller's ranks differ from the replicas'"))
    for name, runs in results.items():
        for run in runs:
            for e in run.get("errors", []):
                print(f"  {name}: {e}")
    verdicts = [r["verdict"] for r in rows if r["verdict"] != "n/a"]
    met = bool(verdicts) and all(v == "MET" for v in verdicts) and not any(
        r.get("errors") for runs in results.values() for r in runs)
    print(f"issue 40 goal (ours loses 0, fails no request that had not started, ranks whole, back to target "
          f"no slower than Serve): {'MET' if met else 'NOT MET'}")
    return rows


# ---------------------------------------------------------------------- main
def spawn(system_name: str, args: argparse.Namespace) -> dict:
    argv = ["--replicas", str(args.replicas), "--workers", str(args.workers), "--clients", str(args.clients),
            "--handle-clients", str(args.handle_clients), "--grpc-clients", str(args.grpc_clients),
            "--work", str(args.work),
            "--faults", ",".join(args.faults), "--seed", str(args.seed), "--gap", str(args.gap),
            "--slow-s", str(args.slow_s), "--frozen-s", str(args.frozen_s),
            "--health-timeout", str(args.health_timeout), "--settle-timeout", str(args.settle_timeout),
            "--request-timeout", str(args.request_timeout), "--warmup", str(args.warmup),
            "--budget", str(args.budget), "--soak", str(args.soak), "--soak-every", str(args.soak_every),
            "--soak-warmup", str(args.soak_warmup), "--sample-s", str(args.sample_s),
            *(["--data-plane", args.data_plane] if args.data_plane else [])]
    if args.handle_progress:
        argv.append("--handle-progress")
    limit = args.budget + args.soak + args.settle_timeout + args.request_timeout + 180
    return childrun.spawn(str(pathlib.Path(__file__).resolve()), system_name, argv, limit, log)


def _faults(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    if values == ["all"]:
        return list(FAULTS)
    bad = [v for v in values if v not in FAULTS + EXTRA_FAULTS]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"faults are 'all' or some of {', '.join(FAULTS + EXTRA_FAULTS)}; "
                                         f"got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=4, help="replicas of the deployment; default 4")
    p.add_argument("--workers", type=int, default=3, help="worker nodes of 2 logical GPUs; default 3")
    p.add_argument("--clients", type=int, default=16, help="closed-loop HTTP clients; default 16")
    p.add_argument("--handle-clients", type=int, default=8, help="closed-loop handle callers; default 8")
    p.add_argument("--grpc-clients", type=int, default=4, help="closed-loop gRPC callers; default 4")
    p.add_argument("--handle-progress", action="store_true",
                   help="ours' handle callers ask for progress (handle.options(progress=True)): a call tells when "
                        "it began, so one that never began on a replica that died is sent to another")
    p.add_argument("--work", type=float, default=0.02, help="the handler's seconds a request; default 0.02")
    p.add_argument("--data-plane", choices=DATA_PLANES, default=None,
                   help="what carries ours' HTTP and gRPC requests: proxy or direct (HAProxy straight to the "
                        "replicas' own servers; docs/ray.md); default: as ours' environment says (--ours-mode "
                        "fast: direct)")
    p.add_argument("--faults", type=_faults, default=list(FAULTS), help=f"'all' (default) or some of {','.join(FAULTS)}")
    p.add_argument("--repeats", type=int, default=2, help="runs of each system, alternating; default 2")
    p.add_argument("--seed", type=int, default=40, help="which replicas and nodes the faults hit; default 40")
    p.add_argument("--gap", type=float, default=2.0, help="seconds between a fault settling and the next; default 2")
    p.add_argument("--slow-s", type=float, default=5.0, help="seconds the slow replica stays slow; default 5")
    p.add_argument("--frozen-s", type=float, default=30.0,
                   help="seconds the frozen replica stays stopped (the frozen fault); default 30")
    p.add_argument("--health-timeout", type=float, default=HEALTH["health_check_timeout_s"],
                   help="both systems' health_check_timeout_s; default %(default)s (Serve's own default: 30)")
    p.add_argument("--settle-timeout", type=float, default=90.0,
                   help="seconds a fault may take to settle before the run counts it not back; default 90")
    p.add_argument("--request-timeout", type=float, default=30.0,
                   help="a request neither answered nor failed by then is lost; default 30")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the first fault; default 3")
    p.add_argument("--budget", type=float, default=600.0,
                   help="a child injects no new fault past this many seconds; default 600")
    p.add_argument("--soak", type=float, default=0.0,
                   help="instead of one fault each: this many seconds of load with a fault every --soak-every s "
                        "(--faults in turn) and the RSS of the controller, proxies and replicas sampled")
    p.add_argument("--soak-every", type=float, default=60.0, help="seconds between the soak's faults; default 60")
    p.add_argument("--soak-warmup", type=float, default=300.0,
                   help="the soak's RSS growth is measured from this many seconds on; default 300")
    p.add_argument("--sample-s", type=float, default=10.0, help="seconds between the soak's RSS samples; default 10")
    p.add_argument("--plot", metavar="PNG", help="the soak's RSS curve, drawn here")
    childrun.add_child_arguments(p)
    args = p.parse_args(argv)
    if (args.replicas < 1 or args.workers < 2 or args.clients < 1 or args.handle_clients < 0 or args.grpc_clients < 0 or args.work < 0
            or args.repeats < 1 or args.slow_s <= 0 or args.settle_timeout <= 0 or args.request_timeout <= 0
            or args.frozen_s <= 0 or args.health_timeout <= 0):
        p.error("need --replicas >= 1, --workers >= 2, --clients >= 1, --handle-clients and --grpc-clients >= 0, --work >= 0, "
                "--repeats >= 1, and --slow-s, --frozen-s, --health-timeout, --settle-timeout, --request-timeout > 0")
    if args.replicas > 2 * (args.workers - 1):
        p.error(f"--replicas {args.replicas} do not fit {args.workers - 1} worker nodes of 2 GPUs (the node fault "
                f"removes one before it adds another)")
    #: ours' data plane as its child will have it (``--data-plane``, else its environment's default)
    args.plane = args.data_plane or ("direct" if args.ours_mode == "fast" else "proxy")
    if "haproxy" in args.faults and not args.child and (
            (args.only != "serve" and args.plane != "direct") or (args.only != "ours" and args.serve_mode != "fast")):
        p.error("the haproxy fault needs HAProxy on both sides: --ours-mode fast (or --data-plane direct) and "
                "--serve-mode fast (or --only ours)")
    childrun.ray_env(ROOT, ROOT / "benchmarks")
    if args.child:
        res = run_child(args.child, args)
        with open(args.child_out, "w") as f:
            json.dump(res, f, indent=1, default=repr)
        return 0
    systems = childrun.systems(args)
    missing = childrun.serve_missing(systems)
    if missing:
        print(f"{missing}: `make bench` installs it, or run --only ours", file=sys.stderr)
        return 2
    results: dict[str, list[dict]] = {name: [] for name in systems}
    for i in range(args.repeats):
        for name in systems:
            log(f"{name}: run {i + 1} of {args.repeats}")
            results[name].append(spawn(name, args))
    rows: dict[str, list[dict]] = {}
    if args.soak:  # (each system's own figures, once)
        print_soak(results, args)
    else:
        for title, view in childrun.serve_views(results):
            print(f"\n=== {childrun.ours_title()} against {title} ===")
            rows[title] = print_report(view, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if not k.startswith("child")},
                       "results": results, "rows": rows}, f, indent=1, default=repr)
        log(f"wrote {args.json}")
    errors = any(r.get("errors") for runs in results.values() for r in runs)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

"""A replica's gRPC server on the direct data plane, per call: gRPC over HTTP/1.1 against ``grpc.aio``,
behind the same HAProxy (no Ray).

Why it exists
-------------
A replica serves its gRPC calls with the httptools server of its HTTP path, gRPC over HTTP/1.1 that
HAProxy converts (executors/ray_gpu/base/grpc_h1.py), not with a ``grpc.aio`` server, because the first
costs far less CPU a call (grpc_h1's docstring and docs/benchmarks.md give this benchmark's figures on
this project's 2-core machine). This measures that claim again, whenever it is run, with nothing else in
the way.

What it measures
----------------
The same ``GrpcFront`` (the proxy's gRPC handlers, grpc_proxy.py) answering a stand-in replica whose
``run`` awaits its begin marker (the call's initial metadata) and answers ``Say`` with the text upper
cased (tests/integration/protos/echo.proto), served two ways (``--modes``):

* **h1**: as shipped, ``direct_grpc.start(...)``: its ``GrpcH1Server`` (HAProxy's server line plain
  HTTP/1.1);
* **aio**: the same front built as ``direct_grpc.start`` builds it, served by ``await front.start(host,
  0)``, a ``grpc.aio`` server (HAProxy's server line ``proto h2``).

Three processes, so that each one's CPU can be read: the server (its own uvloop loop), HAProxy
(``nbthread 1``, the settings of tests/unit/test_direct_grpc.py's balancer: HTTP/2 to the clients,
``GRPC_RETRY_ON``, ``http-no-delay``, ``redispatch``), and the load generator (a child per level:
``--clients`` closed-loop clients on one asyncio loop, each with its own ``grpc.aio`` channel to
HAProxy, unary ``Say`` calls with the ``application`` metadata, every answer checked). Per mode and
level: ``--warmup`` s untimed, then ``--seconds`` s measured: calls a second, p50 / p99 latency (ms),
and CPU microseconds a call (``/proc/<pid>/stat``'s utime + stime over the window, divided by the calls
answered in it) of the server, HAProxy and the load generator. On a small or shared machine the
figures are noisy: compare the two modes within one run.

How to run
----------
    .venv/bin/python benchmarks/bench_grpc_wire.py                       # both modes, 1/16/64 clients, 5 s each
    .venv/bin/python benchmarks/bench_grpc_wire.py --clients 1,16 --seconds 3 --json out.json
    .venv/bin/python benchmarks/bench_grpc_wire.py --modes h1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from common import ROOT, fmt, free_port, ints, load, print_table, use_this_tree
from hostcpu import cpu_s_of

use_this_tree()

MODES = ("h1", "aio")
#: the Echo service's stubs (tests/integration/protos/echo.proto): what the server serves
SERVICERS = ["tests.integration.protos.echo_pb2_grpc.add_EchoServicer_to_server"]
METADATA = (("application", "bench"),)
LIMITS = {"max_body_bytes": 1 << 20, "max_header_bytes": 16 << 10, "request_timeout_s": 30.0}
DEPLOYMENT = "bench"
START_TIMEOUT_S = 30.0  # a child's start (its imports included), HAProxy's listening
CALL_TIMEOUT_S = 10.0  # each call's deadline
SLACK_S = 30.0  # past warm-up + seconds, how long a level's load generator may still take
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[bench_grpc_wire {time.perf_counter() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------- CPU
def cpu_s(pid: int) -> float | None:
    """CPU seconds process ``pid`` has used, all its threads (None: it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return cpu_s_of(f.read())
    except (OSError, IndexError, ValueError):
        return None


# -------------------------------------------------------------- server child
class _Replica:
    """The replica's part, as fast as it can be: the begin marker, then the answer."""

    def __init__(self) -> None:
        from tests.integration.protos import echo_pb2

        self.reply = echo_pb2.EchoReply

    async def run(self, method: str, args: tuple, kwargs: dict, request: Any, on_begin: Any) -> Any:
        if on_begin is not None:
            await on_begin()
        (msg,) = args
        return self.reply(text=msg.text.upper())

    @staticmethod
    def stream(method: str, args: tuple, kwargs: dict, request: Any, on_begin: Any) -> Any:
        raise NotImplementedError("bench_grpc_wire serves unary calls only")


class _Metrics:
    def grpc_started(self) -> None:
        pass

    def grpc_ended(self) -> None:
        pass

    def grpc_request(self, **kw: Any) -> None:
        pass


async def serve(mode: str) -> None:
    """The server child: the front served as ``mode`` on a free port, which it prints (one JSON line);
    it stops on SIGTERM or the end of its stdin (its parent gone)."""
    from executors.ray_gpu.base.exposed import Reachable
    from executors.ray_gpu.base.grpc_proxy import GrpcFront
    from executors.ray_gpu.replica import direct_grpc

    reach = Reachable(http=frozenset(), grpc=frozenset({"Say"}))
    rep = _Replica()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if mode == "h1":
        front = await direct_grpc.start(DEPLOYMENT, reach, rep.run, rep.stream, _Metrics(), LIMITS,
                                        SERVICERS, "127.0.0.1")
    else:
        front = GrpcFront(direct_grpc.ReplicaIngress(DEPLOYMENT, reach, rep.run, rep.stream, _Metrics(),
                                                     LIMITS), SERVICERS, direct_grpc._cancel)
        await front.start("127.0.0.1", 0)
    try:
        print(json.dumps({"port": front.address[1]}), flush=True)

        def parent_gone() -> None:
            sys.stdin.read()
            with contextlib.suppress(RuntimeError):  # (the loop closed: stopped by SIGTERM already)
                loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=parent_gone, daemon=True).start()
        await stop.wait()
    finally:
        if front.h1 is not None:
            front.h1.close()
        await front.stop(0)


# ---------------------------------------------------------- load generator
class _Marks:
    """The window's two ends, told to the parent as they come (it reads every process's CPU then)."""

    def sample(self) -> None:
        print("mark", flush=True)


async def generate(port: int, clients: int, warmup: float, seconds: float) -> dict:
    """The load generator child: ``clients`` closed-loop clients, each its own channel to ``port``
    (common.load: the level's figures)."""
    import grpc

    from tests.integration.protos import echo_pb2, echo_pb2_grpc

    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(clients)]
    stubs = [echo_pb2_grpc.EchoStub(ch) for ch in channels]

    async def send(c: int, seq: int) -> bool:
        text = f"hello {c} {seq}"
        reply = await stubs[c].Say(echo_pb2.EchoRequest(text=text), metadata=METADATA, timeout=CALL_TIMEOUT_S)
        return bool(reply.text == text.upper())

    try:
        return await load(send, clients, warmup, seconds, _Marks())
    finally:
        for ch in channels:
            await ch.close()


# ------------------------------------------------------------------ parent
class _Child:
    """A child process whose stdout lines are read on a thread of the parent (``line``: the next one
    within a time limit, None past it or at its end)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def line(self, timeout: float) -> str | None:
        try:
            return self._lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def stop(self) -> None:
        """Its stdin closed and SIGTERM; SIGKILL if it is still there 5 s later."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()


def haproxy_config(mode: str, port: int, server_ports: list[int]) -> str:
    """HAProxy as the data plane runs it for gRPC (tests/unit/test_direct_grpc.py puts it in front of
    its servers too): HTTP/2 to the clients, the servers in turn, HTTP/1.1 to them (h1) or HTTP/2
    (aio), a call that got nothing back re-sent to another (``GRPC_RETRY_ON``)."""
    from rankcore.requests import dataplane

    proto = " proto h2" if mode == "aio" else ""
    return (f"global\n    nbthread 1\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n"
            f"    timeout server 30s\n    option http-no-delay\n    option abortonclose\n    option redispatch 1\n"
            f"    retry-on {dataplane.GRPC_RETRY_ON}\nfrontend g\n    bind 127.0.0.1:{port} proto h2\n"
            f"    default_backend b\nbackend b\n    balance roundrobin\n"
            + "".join(f"    server s{i} 127.0.0.1:{p}{proto}\n" for i, p in enumerate(server_ports)))


def start_haproxy(stack: contextlib.ExitStack, mode: str, server_ports: list[int], folder: str) -> tuple[Any, int]:
    """HAProxy in front of the servers (stopped by ``stack``): its process and port, once it listens."""
    import socket

    from executors.ray_gpu.ingress.haproxy import haproxy_binary

    port = free_port()
    cfg, errors = os.path.join(folder, f"{mode}.cfg"), os.path.join(folder, f"{mode}.log")
    with open(cfg, "w") as f:
        f.write(haproxy_config(mode, port, server_ports))
    with open(errors, "w") as err:
        proc = subprocess.Popen([haproxy_binary(), "-db", "-f", cfg], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)

    def stop() -> None:
        proc.kill()
        proc.wait()

    stack.callback(stop)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.01)
    with open(errors) as f:
        raise RuntimeError(f"HAProxy did not listen on {port} (exit {proc.poll()}): {f.read()[-2000:]}")


def measure(mode: str, clients: int, port: int, pids: dict[str, int], args: argparse.Namespace) -> dict:
    """One level: its load generator child, every process's CPU read at the window's two marks."""
    gen = _Child(["--load", str(port), "--clients", str(clients), "--seconds", str(args.seconds),
                  "--warmup", str(args.warmup)])
    try:
        procs = {**pids, "loadgen": gen.pid}
        deadline = time.monotonic() + START_TIMEOUT_S + args.warmup + args.seconds + SLACK_S
        samples: list[dict[str, float | None]] = []
        result: dict | None = None
        while result is None:
            line = gen.line(deadline - time.monotonic())
            if line is None:
                raise RuntimeError(f"the load generator ended or hung without its result (exit {gen.proc.poll()})")
            if line == "mark":
                samples.append({name: cpu_s(pid) for name, pid in procs.items()})
            elif line.startswith("{"):
                result = json.loads(line)
        gen.proc.wait(START_TIMEOUT_S)
    finally:
        gen.stop()
    if len(samples) != 2:
        raise RuntimeError(f"the load generator marked its window {len(samples)} times, not 2")
    used: dict[str, float | None] = {}
    for name in procs:
        before, after = samples[0][name], samples[1][name]
        used[name] = None if before is None or after is None else after - before
    answers = result["answers"]
    result["cpu_s"] = used
    result["cpu_us_per_call"] = {name: None if s is None or not answers else 1e6 * s / answers
                                 for name, s in used.items()}
    return result


def run_mode(mode: str, args: argparse.Namespace, folder: str) -> dict:
    """A mode's server and HAProxy, each level measured in turn: {"levels": {clients: figures}, "errors"}."""
    out: dict[str, Any] = {"levels": {}, "errors": []}
    with contextlib.ExitStack() as stack:
        try:
            log(f"{mode}: starting the server and HAProxy")
            server = _Child(["--serve", mode])
            stack.callback(server.stop)
            line = server.line(START_TIMEOUT_S)
            if line is None or not line.startswith("{"):
                raise RuntimeError(f"the {mode} server did not start (it said {line!r}, exit {server.proc.poll()})")
            server_port = json.loads(line)["port"]
            hap, port = start_haproxy(stack, mode, [server_port], folder)
            for clients in args.clients:
                log(f"{mode}: {clients} client(s): {args.warmup:g} s warm-up, {args.seconds:g} s measured")
                level = measure(mode, clients, port, {"server": server.pid, "haproxy": hap.pid}, args)
                out["levels"][str(clients)] = level
                for name, proc in (("server", server.proc), ("HAProxy", hap)):
                    if proc.poll() is not None:
                        raise RuntimeError(f"the {mode} {name} exited ({proc.poll()})")
        except Exception as exc:
            out["errors"].append(f"{type(exc).__name__}: {exc}"[:2000])
            log(f"{mode}: ERROR: {exc}")
    return out


# ------------------------------------------------------------------ report
def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def table(results: dict, args: argparse.Namespace) -> tuple[list[str], list[list[str]], list[dict]]:
    """The side-by-side table (headers, cells) and its rows as figures: per level, each mode's calls/s,
    p50, p99 and CPU us a call of the server, HAProxy and the load generator; h1/aio of calls/s and of
    the server's CPU a call."""
    def of(mode: str, clients: int) -> dict:
        return results.get(mode, {}).get("levels", {}).get(str(clients)) or {}

    headers = ["clients", "calls/s h1", "calls/s aio", "h1/aio", "p50 h1", "p50 aio", "p99 h1", "p99 aio",
               "server us h1", "server us aio", "h1/aio", "haproxy us h1", "haproxy us aio", "loadgen us h1",
               "loadgen us aio", "errors h1/aio"]
    cells, rows = [], []
    for clients in args.clients:
        h1, aio = of("h1", clients), of("aio", clients)
        cpu = {m: lv.get("cpu_us_per_call") or {} for m, lv in (("h1", h1), ("aio", aio))}
        row = {"clients": clients, "h1": h1, "aio": aio, "rps_ratio": _ratio(h1.get("rps"), aio.get("rps")),
               "server_cpu_ratio": _ratio(cpu["h1"].get("server"), cpu["aio"].get("server"))}
        rows.append(row)
        cells.append([str(clients), fmt(h1.get("rps"), 0), fmt(aio.get("rps"), 0), fmt(row["rps_ratio"]),
                      fmt(h1.get("p50_ms")), fmt(aio.get("p50_ms")), fmt(h1.get("p99_ms")), fmt(aio.get("p99_ms")),
                      fmt(cpu["h1"].get("server"), 0), fmt(cpu["aio"].get("server"), 0), fmt(row["server_cpu_ratio"]),
                      fmt(cpu["h1"].get("haproxy"), 0), fmt(cpu["aio"].get("haproxy"), 0),
                      fmt(cpu["h1"].get("loadgen"), 0), fmt(cpu["aio"].get("loadgen"), 0),
                      f"{fmt(h1.get('errors'))}/{fmt(aio.get('errors'))}"])
    return headers, cells, rows


def print_report(results: dict, args: argparse.Namespace) -> list[dict]:
    print(f"\na replica's gRPC server behind HAProxy, h1 (grpc_h1, HTTP/1.1) vs aio (grpc.aio, HTTP/2): "
          f"host with {os.cpu_count()} CPUs; {args.seconds:g} s a level after {args.warmup:g} s warm-up")
    print("(p50, p99: ms; us: CPU microseconds a call of that process over the window; '-': not measured)\n")
    headers, cells, rows = table(results, args)
    print_table(headers, cells)
    for mode, res in results.items():
        for clients, lv in res.get("levels", {}).items():
            for e in lv.get("first_errors", []):
                print(f"{mode}: {clients} client(s): error: {e}")
        for e in res.get("errors", []):
            print(f"{mode}: ERROR: {e}")
    return rows


# --------------------------------------------------------------- arguments
def modes(text: str) -> list[str]:
    """An argparse type: some of ``MODES``, comma-separated."""
    got = [m.strip() for m in text.split(",") if m.strip()]
    if not got or any(m not in MODES for m in got):
        raise argparse.ArgumentTypeError(f"need some of {','.join(MODES)} (comma-separated), got {text!r}")
    return list(dict.fromkeys(got))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=ints, default=[1, 16, 64],
                   help="concurrent clients, one level each (comma-separated); default 1,16,64")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds a level; default 5")
    p.add_argument("--warmup", type=float, default=1.0, help="untimed seconds before each level; default 1")
    p.add_argument("--modes", type=modes, default=list(MODES), help="h1, aio or both (comma-separated); default both")
    p.add_argument("--json", metavar="FILE", help="write the results here")
    p.add_argument("--serve", choices=MODES, help=argparse.SUPPRESS)  # (the server child)
    p.add_argument("--load", type=int, metavar="PORT", help=argparse.SUPPRESS)  # (a load generator child)
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.warmup < 0:
        p.error("need --seconds > 0 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.serve or args.load:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a child: Ctrl-C reaches its parent, which stops it)
    if args.serve:
        import uvloop

        uvloop.run(serve(args.serve))
        return 0
    if args.load:
        res = asyncio.run(generate(args.load, args.clients[0], args.warmup, args.seconds))
        print(json.dumps(res), flush=True)
        return 0
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_grpc_wire-") as folder:
        for mode in args.modes:
            results[mode] = run_mode(mode, args, folder)
    rows = print_report(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if k not in ("serve", "load")},
                       "host": {"cpus": os.cpu_count()}, "root": str(ROOT), "results": results, "rows": rows},
                      f, indent=1, default=repr)
        log(f"wrote {args.json}")
    failed = any(res["errors"] or any(lv["errors"] for lv in res["levels"].values()) for res in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    def _on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"terminated by signal {signum}")

    if "--serve" not in sys.argv and "--load" not in sys.argv:  # (the parent: its finally blocks stop the rest)
        signal.signal(signal.SIGTERM, _on_term)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted: everything it started is stopped")
        sys.exit(130)

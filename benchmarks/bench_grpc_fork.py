"""Children forked beside busy gRPC channels: how many never reach their ``exec``, per setting of
gRPC's fork handlers (issue 64).

``import executors.ray_gpu`` turns gRPC's fork handlers off (``GRPC_ENABLE_FORK_SUPPORT=false``
unless the environment sets it; docs/ray.md, by value): with them on, a child forked beside busy
channels can crash or hang before its ``exec``, as ``ray.init``'s GCS and raylet did. Here, for each
setting, a process with a gRPC server and 3 threads calling it spawns children as Ray spawns its
processes (``subprocess`` with a ``preexec_fn``: fork, Python in the child, then exec) for
``--seconds``, and counts the children lost: killed by a signal before their exec, or hung there
(a watchdog ends the run when no spawn has ended for 5 s, and counts one). Settings: ``off`` (what
``executors.ray_gpu`` sets), ``on`` (the user's ``true``, kept), ``grpc-default`` (no
``executors.ray_gpu``, the variable unset: grpcio's own default).

A loss is a race: how often it happens depends on the machine and its load (15 s a setting on a
loaded 2-core machine: off 0 of 1,760; on 1 of 12, a hang; grpc-default 280 of 845, then a hang;
yet a loaded CI run lost none in 30 s with them on). So it is measured here, not a test's pass or fail;
tests/unit/test_grpc_fork.py runs ``spawns`` with the handlers off (no child may be lost) and checks
the setting itself, which fails every run without it.

    .venv/bin/python benchmarks/bench_grpc_fork.py                          # 10 s a setting
    .venv/bin/python benchmarks/bench_grpc_fork.py --settings on --seconds 30 --until first
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT

VARIABLE = "GRPC_ENABLE_FORK_SUPPORT"  # (executors.ray_gpu.FORK_SUPPORT_VARIABLE; not imported here)

#: argv: seconds, "all" or "first" (stop at the first loss), the result file, "ours" or "bare"
#: (``import executors.ray_gpu`` first, or not); writes the variable's value, how many it spawned and
#: how many never reached their exec (a signal killed it, or it hung there, and with it its parent's
#: ``Popen``: the watchdog then counts it)
_SPAWNS = """
import sys
if sys.argv[4] == "ours":
    import executors.ray_gpu
import os, subprocess, threading, time
from concurrent import futures
import grpc

server = grpc.server(futures.ThreadPoolExecutor(4))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
    "t.T", {"C": grpc.unary_unary_rpc_method_handler(lambda r, c: r)}),))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
going = True
spawned, lost, last = 0, 0, time.monotonic()

def calls():
    while going:
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        ready = grpc.channel_ready_future(ch)
        ready.result(timeout=10)
        ready.cancel()
        for _ in range(5):
            ch.unary_unary("/t.T/C").future(b"x", timeout=10).result()
        ch.close()

def written(lost):
    with open(sys.argv[3], "w") as out:
        out.write(f"{os.environ.get('GRPC_ENABLE_FORK_SUPPORT')} {spawned} {lost}")
    os._exit(0)

def watchdog():  # (a child that hangs before its exec holds its parent in Popen)
    while time.monotonic() - last < 5:
        time.sleep(0.5)
    written(lost + 1)

for t in [threading.Thread(target=calls, daemon=True) for _ in range(3)] + [threading.Thread(target=watchdog, daemon=True)]:
    t.start()
until = time.monotonic() + float(sys.argv[1])
while time.monotonic() < until and not (lost and sys.argv[2] == "first"):
    child = subprocess.Popen(["true"], preexec_fn=lambda: None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lost += child.wait() < 0  # (killed by a signal before its exec)
    spawned, last = spawned + 1, time.monotonic()
going = False
written(lost)
"""

#: setting -> (import executors.ray_gpu first, the variable's value in the environment: None unset)
SETTINGS = {"off": (True, None), "on": (True, "true"), "grpc-default": (False, None)}


def spawns(seconds: float, until: str, result: Path, *, ours: bool = True, value: str | None = None
           ) -> tuple[str, int, int]:
    """Runs ``_SPAWNS`` in a session of its own (a child hung before its exec is killed with it):
    (the variable's value there, children spawned, children lost)."""
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if value is not None:
        env[VARIABLE] = value
    proc = subprocess.Popen([sys.executable, "-c", _SPAWNS, str(seconds), until, str(result), "ours" if ours else "bare"],
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        code = proc.wait(timeout=seconds + 120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0 and result.exists(), code
    shown, spawned, lost = result.read_text().split()
    return shown, int(spawned), int(lost)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="off,on,grpc-default",
                   help=f"comma-separated, of {', '.join(SETTINGS)}; default all")
    p.add_argument("--seconds", type=float, default=10.0, help="spawning seconds per setting; default 10")
    p.add_argument("--until", choices=("all", "first"), default="all",
                   help="first: a setting's run stops at its first lost child; default all")
    args = p.parse_args(argv)
    settings = args.settings.split(",")
    if unknown := [s for s in settings if s not in SETTINGS]:
        p.error(f"unknown setting(s) {', '.join(unknown)}; choose from {', '.join(SETTINGS)}")
    if args.seconds <= 0:
        p.error("--seconds must be > 0")
    print(f"{'setting':<14} {VARIABLE:<26} {'spawned':>8} {'lost':>6} {'seconds':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in settings:
            ours, value = SETTINGS[name]
            t = time.monotonic()
            shown, spawned, lost = spawns(args.seconds, args.until, Path(tmp) / name, ours=ours, value=value)
            print(f"{name:<14} {shown:<26} {spawned:>8} {lost:>6} {time.monotonic() - t:>8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

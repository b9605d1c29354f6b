"""A process with busy gRPC channels forks children that reach their ``exec``, as ``ray.init`` needs
its GCS and raylet to: ``executors.ray_gpu`` turns gRPC's fork handlers off (its ``__init__``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from executors.ray_gpu import FORK_SUPPORT_VARIABLE

ROOT = Path(__file__).resolve().parents[2]

#: a gRPC server and 3 threads calling it, while the main thread spawns children as Ray spawns its
#: processes (``subprocess`` with a ``preexec_fn``: fork, then Python in the child, then exec);
#: writes the variable's value, how many it spawned and how many never reached their exec (a signal
#: killed it, or it hung there, and with it its parent's ``Popen``: the watchdog then counts it)
_SPAWNS = """
import executors.ray_gpu
import os, subprocess, sys, threading, time
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


def _spawn(seconds: float, until: str, tmp_path: Path, **env: str) -> tuple[str, int, int]:
    """Runs ``_SPAWNS`` in a session of its own: a child hung before its exec is killed with it."""
    clean = {k: v for k, v in os.environ.items() if k != FORK_SUPPORT_VARIABLE}
    result = tmp_path / "result"
    proc = subprocess.Popen([sys.executable, "-c", _SPAWNS, str(seconds), until, str(result)], env={**clean, **env},
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        code = proc.wait(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0 and result.exists(), code
    value, spawned, lost = result.read_text().split()
    return value, int(spawned), int(lost)


def test_children_forked_beside_busy_grpc_channels_reach_their_exec(tmp_path: Path) -> None:
    value, spawned, lost = _spawn(3, "all", tmp_path)
    assert value == "false"
    assert spawned >= 50 and lost == 0, (spawned, lost)


def test_a_process_that_asks_for_grpcs_fork_handlers_keeps_them_and_its_children_are_lost(tmp_path: Path) -> None:
    """What the setting prevents (and that the test above could fail): the user's own value is kept,
    and with the handlers on, children forked beside busy channels die or hang before their exec."""
    value, spawned, lost = _spawn(30, "first", tmp_path, **{FORK_SUPPORT_VARIABLE: "true"})
    assert value == "true"
    assert lost >= 1, f"each of {spawned} children reached its exec with gRPC's fork handlers on: the setting " \
                      "may be unneeded now"

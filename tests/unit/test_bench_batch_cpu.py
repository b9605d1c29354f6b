"""benchmarks/bench_batch.py's CPU accounting (issue 39): a thread's CPU read from /proc, the batch cost
fitted on the batches' CPU or on their wall time, and the per-level report of where the CPU went."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import pytest

from tests.helpers import load_benchmark

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _bench():
    return load_benchmark("bench_batch")


def test_a_threads_cpu_grows_with_what_it_burns_and_a_gone_thread_reads_none():
    bench = load_benchmark("hostcpu")
    me = (os.getpid(), threading.get_native_id())
    before, own = bench.thread_cpu_s(*me), time.thread_time()
    while time.thread_time() - own < 0.3:  # (burn 0.3 CPU-s on this thread)
        pass
    after = bench.thread_cpu_s(*me)
    assert before is not None and after is not None
    assert 0.2 <= after - before <= 1.0  # (/proc counts clock ticks: 10 ms)
    assert bench.thread_cpu_s(os.getpid(), 2**22 + 7) is None


def test_the_cost_fit_takes_the_batches_cpu_when_asked_and_their_wall_time_else():
    bench = _bench()
    # by size: [batches, wall s, CPU s]: the wall time twice the CPU (a loaded host)
    level = {"by_size": {"1": [10, 0.2, 0.1], "4": [10, 0.5, 0.25]}}
    wall, cpu = bench.cost_fit({"lv": level}), bench.cost_fit({"lv": level}, cpu=True)
    assert wall["fixed_s"] == pytest.approx(0.01) and wall["per_item_s"] == pytest.approx(0.01)
    assert cpu["fixed_s"] == pytest.approx(0.005) and cpu["per_item_s"] == pytest.approx(0.005)
    old = {"lv": {"by_size": {"1": [10, 0.2], "4": [10, 0.5]}}}  # (a JSON written before the CPU column)
    assert bench.cost_fit(old, cpu=True)["fixed_s"] == pytest.approx(0.01)


def test_the_report_says_where_each_levels_cpu_went(capsys):
    bench = _bench()
    level = {"rps": 100.0, "host_busy_s": 8.4, "caller_thread_s": 1.67, "replica_thread_s": 3.05,
             "batch_cpu_s": 2.12, "processes": {"ray::ReplicaActor": {"total_s": 4.94, "top_threads_s": [3.05, 1.0]},
                                                "raylet": {"total_s": 0.1, "top_threads_s": [0.1]}}}
    bench.print_cpu({"ours": {"levels": {"handle/64": level, "http/1": {"rps": 0}}}}, argparse.Namespace(seconds=5.0))
    out = capsys.readouterr().out
    assert "handle/64: host 8.40; callers' thread 1.67; replica's batch thread 3.05 (batches 2.12)" in out
    assert "replica process 4.94 (busiest thread 3.05); proxy -; controller, raylet, GCS 0.10" in out
    assert "http/1" not in out  # (nothing answered: nothing to say)


def test_this_processes_threads_are_found_by_name(monkeypatch):
    bench = _bench()
    monkeypatch.setattr(bench, "PROCESSES", (os.path.basename(sys.executable),))
    found = bench.process_threads_cpu()
    mine = [tid for tid in found.get(os.path.basename(sys.executable), {}) if tid.startswith(f"{os.getpid()}/")]
    assert f"{os.getpid()}/{threading.get_native_id()}" in mine


def test_a_levels_figures_are_the_cpu_used_between_the_windows_two_samples():
    bench = _bench()
    checker = bench.Checker.__new__(bench.Checker)  # (no matrices: only the figures are asked)
    checker.batches, checker.answer_sizes = {"p:1": (2, 0.02, 0.01)}, [2, 2]
    checker.samples = [(1.0, 0.5, 0.1, {"raylet": {"1/1": 0.1}}), (3.0, 0.9, 0.4, {"raylet": {"1/1": 0.3, "1/2": 0.05}})]
    got = checker.figures()
    assert got["host_busy_s"] == pytest.approx(2.0) and got["replica_thread_s"] == pytest.approx(0.4)
    assert got["caller_thread_s"] == pytest.approx(0.3) and got["batch_cpu_s"] == pytest.approx(0.01)
    assert got["processes"]["raylet"]["total_s"] == pytest.approx(0.25)  # (a thread born in the window: all of it)
    checker.samples = [(None, None, 0.1, {}), (3.0, None, 0.4, {})]  # (a reading that failed: no figure)
    assert checker.figures()["host_busy_s"] is None and checker.figures()["replica_thread_s"] is None


def test_a_levels_cpu_is_split_thread_by_thread_and_every_second_lands_once():
    bench = _bench()
    args = argparse.Namespace(seconds=5.0)
    # 100 req/s over 5 s: 500 requests; the host busy 8 CPU-s
    level = {"rps": 100.0, "host_busy_s": 8.0, "caller_thread_s": 0.5, "replica_thread_s": 2.5,
             "batch_cpu_s": 2.0, "batches": 50,
             "processes": {bench.REPLICA: {"total_s": 3.5, "top_threads_s": [2.5, 0.8]},
                           bench.PROXY: {"total_s": 2.0, "top_threads_s": [1.5, 0.5]}}}
    http = bench.thread_cpu(level, args, "http")
    assert http["threads"] == pytest.approx([0.001, 0.003])  # the callers' thread, the proxy's loop
    assert http["replica_s"] == pytest.approx(0.003)  # the replica's process less its batches
    assert http["request_s"] == pytest.approx((8.0 - 0.5 - 3.5 - 1.5) / 500)  # the rest of the host
    # every CPU second of the host counted once: the requests' and the batches'
    per_request = http["request_s"] + sum(http["threads"]) + http["replica_s"]
    assert per_request * 500 + level["batch_cpu_s"] == pytest.approx(8.0)
    handle = bench.thread_cpu(level, args, "handle")  # (no proxy on the handle's path: its CPU is the rest's)
    assert handle["threads"] == pytest.approx([0.001])
    assert handle["request_s"] == pytest.approx((8.0 - 0.5 - 3.5) / 500)
    del level["processes"][bench.PROXY]
    assert bench.thread_cpu(level, args, "http") is None and bench.thread_cpu(level, args, "handle") is not None
    assert bench.thread_cpu(dict(level, rps=0.0), args, "handle") is None

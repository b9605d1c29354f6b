"""benchmarks/bench_grpc_wire.py: both of its servers answer calls through a real HAProxy, its figures
are written, everything it started is gone after it (no Ray); and its pure helpers."""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import pytest

from tests.helpers import load_benchmark


def _children() -> set[int]:
    """The processes this one started that are still there (zombies included)."""
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid():
            out.add(int(pid))
    return out


def test_both_modes_serve_calls_and_their_figures_are_written_and_nothing_is_left(monkeypatch, capsys):
    bench = load_benchmark("bench_grpc_wire")
    before = _children()
    with tempfile.TemporaryDirectory() as tmp:
        monkeypatch.setattr(tempfile, "tempdir", tmp)  # (the benchmark's own temporary folder goes here)
        out = os.path.join(tmp, "out.json")
        rc = bench.main(["--clients", "1", "--seconds", "0.5", "--warmup", "0.2", "--json", out])
        assert os.listdir(tmp) == ["out.json"]  # (its HAProxy configs' folder removed)
        with open(out) as f:
            data = json.load(f)
    assert _children() <= before  # (servers, HAProxy and load generators all stopped and reaped)
    assert rc == 0, data["results"]
    assert data["host"]["cpus"] == os.cpu_count() and data["config"]["clients"] == [1]
    for mode in ("h1", "aio"):
        res = data["results"][mode]
        assert res["errors"] == []
        level = res["levels"]["1"]
        assert level["answers"] > 0 and level["rps"] > 0 and level["errors"] == 0 and level["first_errors"] == []
        assert level["p50_ms"] is not None and level["p99_ms"] is not None
        assert set(level["cpu_s"]) == set(level["cpu_us_per_call"]) == {"server", "haproxy", "loadgen"}
    (row,) = data["rows"]
    assert row["clients"] == 1 and row["rps_ratio"] is not None and "server_cpu_ratio" in row
    printed = capsys.readouterr().out
    assert f"host with {os.cpu_count()} CPUs" in printed and "calls/s h1" in printed and "server us aio" in printed


def test_its_helpers_read_proc_stat_modes_and_lay_out_one_mode_beside_a_missing_one():
    bench = load_benchmark("bench_grpc_wire")
    tick = os.sysconf("SC_CLK_TCK")
    stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 3 0 1234 0 0"
    assert bench.cpu_s_of(stat) == pytest.approx(200 / tick)
    assert bench.cpu_s(os.getpid()) > 0 and bench.cpu_s(-1) is None

    assert bench.modes("aio,h1,aio") == ["aio", "h1"]
    with pytest.raises(argparse.ArgumentTypeError):
        bench.modes("h2")
    args = bench.parse([])
    assert args.clients == [1, 16, 64] and args.modes == ["h1", "aio"] and args.seconds == 5.0

    level = {"rps": 2000.0, "p50_ms": 0.5, "p99_ms": 1.25, "errors": 0,
             "cpu_us_per_call": {"server": 40.0, "haproxy": 60.0, "loadgen": 300.0}}
    headers, cells, rows = bench.table({"h1": {"levels": {"1": level}}}, argparse.Namespace(clients=[1, 16]))
    assert len(headers) == len(cells[0]) == len(cells[1])
    got = dict(zip(headers, cells[0]))
    assert (got["calls/s h1"], got["calls/s aio"], got["p99 h1"], got["server us h1"]) == ("2000", "-", "1.25", "40")
    assert got["errors h1/aio"] == "0/-"
    assert rows[0]["rps_ratio"] is None and rows[1]["h1"] == {}
    _, _, rows = bench.table({"h1": {"levels": {"1": level}}, "aio": {"levels": {"1": {
        **level, "rps": 1000.0, "cpu_us_per_call": {"server": 160.0}}}}}, argparse.Namespace(clients=[1]))
    assert rows[0]["rps_ratio"] == 2.0 and rows[0]["server_cpu_ratio"] == 0.25

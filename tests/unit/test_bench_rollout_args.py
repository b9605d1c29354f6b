"""benchmarks/bench_rollout.py: its options are checked before a Ray starts, the rank figures read
the recorder's calls as the docstring says, and the report gives each system's figures and ours /
serve."""

from __future__ import annotations

import argparse

import pytest

from tests.helpers import load_benchmark, refused_before_a_child_starts


def _bench():
    return load_benchmark("bench_rollout")


@pytest.mark.parametrize("argv, says", [
    (["--replicas", "0"], "--replicas and --clients must be 1 or more"),
    (["--clients", "0"], "--replicas and --clients must be 1 or more"),
    (["--replicas", "50", "--num-cpus", "4"], "--num-cpus 4 has no room for 50 replicas"),
    (["--only", "neither"], "invalid choice: 'neither'"),
    (["--surge-percent", "150"], "--surge-percent must be in [0, 100]"),
])
def test_bad_options_are_refused_before_anything_starts(argv, says, capsys, monkeypatch):
    assert says in refused_before_a_child_starts(_bench(), argv, monkeypatch, capsys)


def test_the_defaults_and_what_a_child_is_given(monkeypatch):
    bench = _bench()
    seen = {}

    def fake_spawn(script, name, argv, limit, log):
        seen[name] = (argv, limit)
        return {"system": name, "errors": []}

    monkeypatch.setattr(bench.childrun, "spawn", fake_spawn)
    monkeypatch.setattr(bench.childrun, "serve_missing", lambda names: None)
    monkeypatch.setattr(bench.childrun, "ray_env", lambda *paths: None)  # (leaves os.environ alone)
    assert bench.main(["--clients", "2"]) == 0
    argv, limit = seen["serve"]
    assert set(seen) == {"ours", "serve", "serve-fast"}  # (both of Serve's modes by default)
    assert seen["serve-fast"] == seen["serve"]
    opts = dict(zip(argv[::2], argv[1::2]))
    assert opts["--replicas"] == "8" and opts["--clients"] == "2" and opts["--work"] == "0.1"
    assert opts["--surge-percent"] == "0"  # (no surge unless asked: both systems' default)
    assert limit > 2 * 180.0  # (a rollout may take up to --max-rollout, the v1 deploy too)


def test_rank_figures_count_moves_off_range_starts_and_reconfigures_since_the_apply():
    bench = _bench()
    v1 = [(1.0, "v1", f"a{i}", (i, 0, i)) for i in range(3)]
    serve_like = v1 + [(10.0, "v2", "b0", (3, 0, 3)), (11.0, "v2", "b1", (0, 0, 0)),
                       (12.0, "v2", "b2", (1, 0, 1)), (13.0, "v2", "b0", (2, 0, 2))]
    f = bench.rank_figures(serve_like, since=5.0, n=3)
    assert (f["rank_moved"], f["started_off_range"], f["reconfigures"], f["rank_reconfigures"]) == (1, 1, 4, 1)
    assert f["v2_start_ranks"] == [3, 0, 1] and f["final_ranks"] == [0, 1, 2]
    assert f["rank_moves"] == ["b0 [3, 0, 3]->[2, 0, 2]"]
    ours_like = v1 + [(10.0 + i, "v2", f"b{i}", (i, 0, i)) for i in range(3)]
    f = bench.rank_figures(ours_like, since=5.0, n=3)
    assert (f["rank_moved"], f["started_off_range"], f["reconfigures"], f["rank_reconfigures"]) == (0, 0, 3, 0)
    assert f["rank_moves"] == []


def test_the_report_gives_ours_over_serve_a_dash_for_a_missing_figure_and_the_goal(capsys):
    bench = _bench()
    args = argparse.Namespace(replicas=8, clients=4, work=0.1, warm=3.0, tail=3.0, surge_percent=0)
    rows = bench.print_report({
        "ours": {"to_all_new_s": 5.0, "failed": 0, "rank_moved": 0, "errors": [], "ray_version": "x",
                 "v2_start_ranks": [0, 1], "final_ranks": [0, 1], "rank_moves": []},
        "serve": {"to_all_new_s": 10.0, "failed": 0, "rank_moved": 2, "errors": [],
                  "v2_start_ranks": [8, 0], "final_ranks": [0, 1], "rank_moves": ["x [8, 0, 8]->[1, 0, 1]"]}}, args)
    by = {r["figure"]: r for r in rows}
    assert by["to all-new (s)"]["ratio"] == 0.5
    assert by["rank moved"]["ours"] == 0 and by["rank moved"]["ratio"] == 0.0
    assert by["requests failed"]["ratio"] is None and by["latency p99 (ms)"]["ours"] is None
    out = capsys.readouterr().out
    assert "8 replicas" in out and "serve: v2 replicas started on ranks [8, 0]" in out
    assert "goal (issue): no request lost and 0 rank moves (ours): MET" in out


def test_without_ray_serve_the_comparison_stops_before_measuring(capsys, monkeypatch):
    bench = _bench()
    monkeypatch.setattr(bench.childrun, "serve_missing", lambda names: "Ray Serve cannot be imported here (ModuleNotFoundError: No module named 'pydantic')")
    monkeypatch.setattr(bench, "spawn", lambda *a: pytest.fail("a child was started"))
    monkeypatch.setattr(bench.childrun, "ray_env", lambda *paths: None)
    assert bench.main([]) == 2
    assert "Ray Serve cannot be imported" in capsys.readouterr().err

"""benchmarks/bench_multiplex.py: its options are checked before a Ray starts, both systems get the
same Zipf sequence, a level's figures count loads and hits as the docstring says, and the report
gives ours / serve and the goal (no Ray: fast)."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from tests.helpers import load_benchmark, refused_before_a_child_starts


def _bench():
    return load_benchmark("bench_multiplex")


@pytest.mark.parametrize("argv, says", [
    (["--replicas", "0"], "need --replicas >= 1"),
    (["--requests", "0"], "--requests >= 1"),
    (["--clients", "0"], "need a comma-separated list of ints >= 1"),
    (["--max-models", "0"], "--max-models must be 1 or more, or -1 (no bound), got 0"),
    (["--zipf-s", "-1"], "need --zipf-s >= 0"),
    (["--load-s", "-0.1"], "--load-s >= 0"),
    (["--paths", "grpc"], "paths are handle and/or http"),
    (["--replicas", "100", "--num-cpus", "4"], "--num-cpus 4 has no room for 100 replicas"),
    (["--only", "neither"], "invalid choice: 'neither'"),
])
def test_bad_options_are_refused_before_anything_starts(argv, says, capsys, monkeypatch):
    assert says in refused_before_a_child_starts(_bench(), argv, monkeypatch, capsys)


def test_help_works(capsys):
    with pytest.raises(SystemExit) as exc:
        _bench().main(["--help"])
    assert exc.value.code == 0
    assert "--load-s" in capsys.readouterr().out


def _fake_children(bench, monkeypatch) -> dict:
    seen: dict = {}

    def fake_spawn(script, name, argv, limit, log):
        seen[name] = (argv, limit)
        return {"system": name, "errors": []}

    monkeypatch.setattr(bench.childrun, "spawn", fake_spawn)
    monkeypatch.setattr(bench.childrun, "serve_missing", lambda names: None)
    monkeypatch.setattr(bench.childrun, "ray_env", lambda *paths: None)  # (leaves os.environ alone)
    monkeypatch.delenv(bench.MAX_MODELS_ENV, raising=False)  # (restored after the test)
    return seen


def test_the_defaults_and_what_a_child_is_given(monkeypatch, capsys):
    bench = _bench()
    seen = _fake_children(bench, monkeypatch)
    assert bench.main([]) == 0
    assert set(seen) == {"ours", "serve", "serve-fast"}  # (both of Serve's modes by default) and seen["ours"] == seen["serve"]
    argv, limit = seen["serve"]
    opts = dict(zip(argv[::2], argv[1::2]))
    assert opts["--replicas"] == "4" and opts["--models"] == "20" and opts["--zipf-s"] == "1.0"
    assert opts["--max-models"] == "3" and opts["--load-s"] == "0.2" and opts["--work-s"] == "0.005"
    assert opts["--clients"] == "1,8" and opts["--paths"] == "handle" and opts["--max-ongoing-requests"] == "5"
    assert opts["--requests"] == "400" and opts["--warmup-requests"] == "40"
    assert limit >= 150.0
    assert bench.os.environ[bench.MAX_MODELS_ENV] == "3"  # (the bound reaches the replicas' decorators)


def test_quick_is_100_requests_after_10_and_the_bound_goes_to_the_environment(monkeypatch, capsys):
    bench = _bench()
    seen = _fake_children(bench, monkeypatch)
    assert bench.main(["--quick", "--max-models", "-1", "--paths", "handle,http", "--clients", "2,4"]) == 0
    opts = dict(zip(seen["ours"][0][::2], seen["ours"][0][1::2]))
    assert opts["--requests"] == "100" and opts["--warmup-requests"] == "10"
    assert opts["--paths"] == "handle,http" and opts["--clients"] == "2,4" and opts["--max-models"] == "-1"
    assert bench.os.environ[bench.MAX_MODELS_ENV] == "-1"


def test_the_zipf_sequence_is_seeded_the_same_for_both_and_skewed_as_asked():
    bench = _bench()
    a = bench.zipf_sequence(20, 1.0, 5000, 7)
    assert a == bench.zipf_sequence(20, 1.0, 5000, 7)
    assert a != bench.zipf_sequence(20, 1.0, 5000, 8)
    counts = Counter(a)
    assert set(counts) <= {f"m{k}" for k in range(20)}
    # P(m0) = 1 / H(20) ~ 0.278; P(m1) half of it; m19 ~ 0.0139
    assert 0.25 < counts["m0"] / 5000 < 0.31
    assert 1.6 < counts["m0"] / counts["m1"] < 2.4
    assert counts["m0"] > counts["m4"] > counts["m19"]
    flat = Counter(bench.zipf_sequence(4, 0.0, 4000, 1))  # (s = 0: uniform)
    assert all(800 < n < 1200 for n in flat.values())
    assert bench.level_seed(39, 0, 1) != bench.level_seed(39, 1, 0) != bench.level_seed(39, 0, 0)


def test_a_levels_figures_count_loads_hits_waits_and_the_window():
    bench = _bench()
    recs = [
        {"t0": 0.0, "t1": 0.21, "loaded": True, "get_s": 0.2, "pid": 1, "model": "m0"},
        {"t0": 0.0, "t1": 0.20, "loaded": False, "get_s": 0.19, "pid": 1, "model": "m0"},  # waited on that load
        {"t0": 0.3, "t1": 0.31, "loaded": False, "get_s": 0.0, "pid": 1, "model": "m0"},
        {"t0": 0.4, "t1": 0.61, "loaded": True, "get_s": 0.2, "pid": 2, "model": "m0"},  # a second copy
    ]
    f = bench.figures(recs, errors=1, first_errors=["x"], load_s=0.2, clients=2)
    assert (f["answers"], f["loads"], f["hits"], f["waits"], f["errors"]) == (4, 2, 2, 1, 1)
    assert f["hit_rate"] == 0.5 and f["seconds"] == pytest.approx(0.61)
    assert f["loads_per_min"] == pytest.approx(120 / 0.61) and f["rps"] == pytest.approx(4 / 0.61)
    assert f["replicas_answering"] == 2 and f["models_loaded_on_2_or_more"] == 1
    assert f["p99_ms"] == pytest.approx(210.0) and f["p50_ms"] == pytest.approx(200.0)
    empty = bench.figures([], 0, [], 0.2, 1)
    assert empty["hit_rate"] is None and empty["p99_ms"] is None and empty["rps"] is None


def _level(hit_rate, p99, errors=0):
    return {"answers": 100, "loads": round(100 * (1 - hit_rate)), "hit_rate": hit_rate, "p50_ms": 9.0,
            "p99_ms": p99, "errors": errors, "first_errors": [], "waits": 0, "loads_per_min": 60.0, "rps": 20.0,
            "seconds": 5.0, "replicas_answering": 4, "models_loaded_on_2_or_more": 0}


def _args() -> argparse.Namespace:
    return argparse.Namespace(replicas=4, models=20, zipf_s=1.0, max_models=3, load_s=0.2, work_s=0.005,
                              clients=[1, 8], requests=400, warmup_requests=40, seed=39, paths=["handle"],
                              max_ongoing_requests=5)


def test_the_report_gives_ours_over_serve_the_goal_lines_and_a_missing_level(capsys):
    bench = _bench()
    args = _args()
    rows = bench.print_report({
        "ours": {"ray_version": "x", "errors": [], "levels": {"handle/1": _level(0.8, 200.0),
                                                             "handle/8": _level(0.7, 400.0)}},
        "serve": {"errors": [], "levels": {"handle/1": _level(0.75, 250.0), "handle/8": _level(0.75, 380.0)}}}, args)
    by = {r["clients"]: r for r in rows}
    assert by[1]["hit_ratio"] == pytest.approx(0.8 / 0.75) and by[1]["p99_ratio"] == pytest.approx(0.8)
    assert by[1]["verdict"] == "MET" and by[8]["verdict"] == "NOT MET"
    assert by[8]["hit_ok"] is False and by[8]["p99_ok"] is False
    out = capsys.readouterr().out
    assert "hit rate >= Ray Serve's at each level: NOT MET" in out
    assert "p99 <= Ray Serve's at each level: NOT MET" in out and "both at each level, and no errors: NOT MET" in out

    rows = bench.print_report({
        "ours": {"errors": [], "levels": {"handle/1": _level(0.8, 200.0)}},
        "serve": {"errors": [], "levels": {"handle/1": _level(0.8, 200.0), "handle/8": _level(0.7, 300.0)}}}, args)
    assert rows[0]["verdict"] == "MET" and rows[1]["verdict"] == "n/a" and rows[1]["hit_ratio"] is None
    out = capsys.readouterr().out
    assert "hit rate >= Ray Serve's at each level: NOT MET" in out  # (a level missing is not met)


def test_errors_spoil_the_goal(capsys):
    bench = _bench()
    args = _args()
    args.clients = [1]
    rows = bench.print_report({
        "ours": {"errors": [], "levels": {"handle/1": _level(0.9, 100.0, errors=2)}},
        "serve": {"errors": [], "levels": {"handle/1": _level(0.8, 200.0)}}}, args)
    assert rows[0]["hit_ok"] and rows[0]["p99_ok"] and rows[0]["verdict"] == "NOT MET"
    out = capsys.readouterr().out
    assert "hit rate >= Ray Serve's at each level: MET" in out and "both at each level, and no errors: NOT MET" in out


def test_a_child_reads_back_the_options_it_is_given(monkeypatch, tmp_path):
    bench = _bench()
    seen = _fake_children(bench, monkeypatch)
    assert bench.main(["--zipf-s", "1.3", "--clients", "3", "--load-s", "0.05", "--seed", "5"]) == 0
    argv = seen["ours"][0]
    got = {}
    monkeypatch.setattr(bench, "run_child", lambda name, args: got.setdefault("args", args) and {"system": name})
    out = tmp_path / "child.json"
    assert bench.main([*argv, "--child", "ours", "--child-out", str(out)]) == 0
    a = got["args"]
    assert (a.zipf_s, a.clients, a.load_s, a.seed, a.requests, a.max_models) == (1.3, [3], 0.05, 5, 400, 3)
    assert out.exists()

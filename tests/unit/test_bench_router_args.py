"""benchmarks/bench_router.py: its options are checked before a child starts, the router's decision
cost runs on the pure core and measures every router, and a contender's figures (TTFT percentiles,
hit share, imbalance) and the goal are computed as the docstring says (no Ray: fast)."""

from __future__ import annotations

import argparse

import pytest

from tests.helpers import load_benchmark, refused_before_a_child_starts


def _bench():
    return load_benchmark("bench_router")


@pytest.mark.parametrize("argv, says", [
    (["--requests", "0"], "need --requests >= 1"),
    (["--concurrency", "0"], "--concurrency >= 1"),
    (["--warmup", "-1"], "--warmup >= 0"),
    (["--decision-requests", "0"], "--decision-requests >= 1"),
    (["--replicas", "0"], "need --replicas >= 1"),
    (["--max-ongoing-requests", "0"], "--max-ongoing-requests >= 1"),
    (["--imbalanced-threshold", "-1"], "--imbalanced-threshold must be >= 0, got -1"),
    (["--imbalanced-threshold", "nan"], "--imbalanced-threshold must be >= 0, got nan"),
    (["--request-timeout", "0"], "need --request-timeout > 0"),
    (["--replicas", "50", "--num-cpus", "4"], "--num-cpus 4 has no room for 50 replicas"),
    (["--only", "ours-prefix,nobody"], "--only takes 'all' or some of ours-prefix"),
    (["--only", "ours-prefix,ours-prefix"], "each once"),
    (["--only", ""], "--only takes"),
    (["--requests", "many"], "invalid int value: 'many'"),
])
def test_bad_options_are_refused_before_anything_starts(argv, says, capsys, monkeypatch):
    assert says in refused_before_a_child_starts(_bench(), argv, monkeypatch, capsys)


def test_only_keeps_the_run_order_and_quick_sizes_yield_to_explicit_ones():
    bench = _bench()
    args = bench.parse(["--only", "serve-prefix,ours-prefix", "--quick", "--requests", "50"])
    assert args.only == ["ours-prefix", "serve-prefix"]
    assert (args.requests, args.concurrency, args.warmup) == (50, 8, 8)
    full = bench.parse([])
    assert full.only == list(bench.CONTENDERS) and (full.requests, full.concurrency) == (1000, 16)
    assert full.imbalanced_threshold == 4.0 and full.replicas == 4 and full.max_ongoing_requests == 8
    assert bench.parse(["--only", "all"]).only == list(bench.CONTENDERS)


def test_a_child_is_given_every_option_it_measures_by(monkeypatch):
    bench = _bench()
    args = bench.parse(["--requests", "77", "--concurrency", "5", "--imbalanced-threshold", "2.5", "--seed", "3"])
    seen = {}
    monkeypatch.setattr(bench.childrun, "spawn",
                        lambda script, name, argv, limit, log: seen.update(name=name, argv=argv, limit=limit) or {})
    bench.spawn("ours-hash", args)
    opts = dict(zip(seen["argv"][::2], seen["argv"][1::2]))
    assert seen["name"] == "ours-hash" and seen["limit"] > args.budget
    back = bench.parse([*seen["argv"], "--child", "ours-hash", "--child-out", "x.json"])
    assert (back.requests, back.concurrency, back.imbalanced_threshold, back.seed) == (77, 5, 2.5, 3)
    assert opts["--replicas"] == "4" and opts["--max-ongoing-requests"] == "8"


def test_the_decision_cost_runs_on_the_pure_core_and_measures_every_router():
    bench = _bench()
    wl = bench.workload(0)
    prompts, keys = bench.prompts_and_keys(wl, 8 * 2 + 60)
    cost = bench.decision_cost(prompts, keys, 4.0, replicas=8, per_replica=2, rounds=2)
    assert set(cost) == set(bench.DECISION_ROUTERS) and "" in cost and "prefix_affinity" in cost
    for router, c in cost.items():
        assert c["dispatches"] == 60, router
        assert 0 < c["us_per_dispatch"] < 100_000, (router, c)
        assert len(c["rounds_us"]) == 2 and c["us_per_dispatch"] in c["rounds_us"]
        assert 1 <= c["replicas_reached"] <= 8
    with pytest.raises(ValueError, match="need more than 16 prompts"):
        bench.decision_cost(prompts[:16], keys[:16], 4.0, replicas=8, per_replica=2)


def test_a_prompts_session_key_is_its_system_prompt():
    bench = _bench()
    wl = bench.workload(0)
    prompts, keys = bench.prompts_and_keys(wl, 50)
    systems = wl.systems()
    assert all(p.startswith(systems[int(k.split("-")[1])]) for p, k in zip(prompts, keys))
    assert len(set(keys)) > 5


def _rec(t0, first, t1, replica, cached, chars=100):
    return {"t0": t0, "first": first, "t1": t1, "replica": replica, "cached": cached, "chars": chars,
            "ttft_model_s": 0.01}


def test_figures_compute_percentiles_hit_share_imbalance_and_throughput():
    bench = _bench()
    # TTFT 10, 20, ..., 100 ms; replica a answers 6, b 3, c 1, d none (4 replicas: mean 2.5)
    reps = ["a"] * 6 + ["b"] * 3 + ["c"]
    recs = [_rec(1.0 + i, 1.0 + i + 0.01 * (i + 1), 1.5 + i, reps[i], cached=50 if i < 4 else 0) for i in range(10)]
    f = bench.figures(recs, replicas=4, errors=1, first_errors=["boom"])
    assert f["answers"] == 10 and f["errors"] == 1 and f["first_errors"] == ["boom"]
    assert f["ttft_p50_ms"] == pytest.approx(50.0) and f["ttft_p99_ms"] == pytest.approx(100.0)
    assert f["e2e_p50_ms"] == pytest.approx(500.0) and f["e2e_p99_ms"] == pytest.approx(500.0)
    assert f["hit_share"] == pytest.approx(200 / 1000)
    assert f["imbalance"] == pytest.approx(6 / 2.5)
    assert f["replicas_answering"] == 3 and f["per_replica"] == {"a": 6, "b": 3, "c": 1}
    assert f["seconds"] == pytest.approx(10.5 - 1.0) and f["rps"] == pytest.approx(10 / 9.5)
    assert f["ttft_model_mean_ms"] == pytest.approx(10.0)
    empty = bench.figures([], replicas=4)
    assert empty["hit_share"] is None and empty["imbalance"] is None and empty["ttft_p99_ms"] is None
    assert empty["rps"] is None and empty["answers"] == 0


def test_percentile_is_nearest_rank():
    bench = _bench()
    assert bench.percentile([], 0.5) is None
    assert bench.percentile([3.0], 0.99) == 3.0
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert bench.percentile(values, 0.50) == 50.0 and bench.percentile(values, 0.99) == 99.0
    assert bench.percentile(values, 1.0) == 100.0 and bench.percentile(values, 0.0) == 1.0
    assert bench.percentile([5.0, 1.0, 3.0], 0.5) == 3.0  # (sorted first)


def _res(hit, p99, errors=0):
    return {"errors": [], "figures": {"hit_share": hit, "ttft_p99_ms": p99, "ttft_p50_ms": p99 / 2,
                                      "e2e_p99_ms": p99 + 20, "rps": 50.0, "imbalance": 1.2, "errors": errors,
                                      "first_errors": [], "replicas_answering": 4, "answers": 400,
                                      "per_replica": {"a": 100}, "ttft_model_mean_ms": 10.0, "seconds": 8.0}}


def test_the_goal_is_ours_prefix_against_each_serve_prefix_contender(capsys):
    bench = _bench()
    args = argparse.Namespace(requests=400, seed=0, concurrency=16, replicas=4, max_ongoing_requests=8,
                              imbalanced_threshold=4.0)
    rows = bench.print_report({"ours-prefix": _res(0.6, 80.0), "ours-p2c": _res(0.3, 120.0),
                               "serve-prefix": _res(0.5, 100.0), "serve-prefix-fast": _res(0.65, 90.0)}, args)
    by = {r["against"]: r for r in rows}
    assert by["serve-prefix"]["hit_ratio"] == pytest.approx(1.2) and by["serve-prefix"]["ttft_p99_ratio"] == 0.8
    assert by["serve-prefix"]["verdict"] == "MET"
    assert by["serve-prefix-fast"]["hit_ok"] is False and by["serve-prefix-fast"]["p99_ok"] is True
    assert by["serve-prefix-fast"]["verdict"] == "NOT MET"
    out = capsys.readouterr().out
    assert "ours-p2c" in out and "60.0" in out  # (the table: ours-prefix's hit share in %)
    assert "against every Serve prefix contender measured: NOT MET" in out

    rows = bench.print_report({"ours-prefix": _res(0.6, 80.0, errors=2), "serve-prefix": _res(0.5, 100.0)}, args)
    assert rows[0]["hit_ok"] and rows[0]["p99_ok"] and rows[0]["verdict"] == "NOT MET"  # (errors spoil it)
    rows = bench.print_report({"ours-prefix": {"errors": ["child exit code 1"]}, "serve-prefix": _res(0.5, 100.0)},
                              args)
    assert rows[0]["verdict"] == "n/a"
    assert bench.print_report({"ours-prefix": _res(0.6, 80.0)}, args) == []  # (no Serve prefix contender)

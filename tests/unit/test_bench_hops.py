"""benchmarks/bench_hops.py: the hops it measures per system, the differences it derives, and
Serve's fast mode as the default to measure against (no Ray: the children are stood in for)."""

from __future__ import annotations

import argparse

from tests.helpers import load_benchmark


def _got(p50: float) -> dict:
    return {"p50_ms": p50, "p99_ms": 2 * p50, "rps": 1000 / p50}


def test_the_report_derives_the_proxy_leg_and_the_router_from_the_hops(capsys):
    bench = load_benchmark("bench_hops")
    results = {"ours": {"levels": {"proxy alone (a 404)/1": _got(0.2), "HTTP, whole/1": _got(1.3),
                                   "handle by value/1": _got(1.0), "gRPC to the replica/1": _got(0.85)}},
               "serve": {"levels": {"HAProxy alone (a 404)/1": _got(0.1), "HTTP, whole/1": _got(0.5)}}}
    rows = bench.print_report(results, argparse.Namespace(seconds=3.0, replicas=2))
    assert [(r["system"], r["hop"]) for r in rows][-1] == ("serve", "HTTP, whole") and len(rows) == 6
    out = capsys.readouterr().out
    assert "the proxy's HTTP leg (whole - handle by value): 0.30 ms p50" in out
    assert "the router (handle by value - gRPC to the replica): 0.15 ms p50" in out


def test_serves_fast_mode_is_what_it_measures_against_by_default(monkeypatch, capsys):
    bench = load_benchmark("bench_hops")
    started = []
    monkeypatch.setattr(bench.childrun, "serve_missing", lambda names: None)
    monkeypatch.setattr(bench.childrun, "ray_env", lambda *paths: None)
    monkeypatch.setattr(bench, "spawn", lambda name, args: started.append(name) or {"system": name, "levels": {}})
    assert bench.main(["--seconds", "1"]) == 0
    assert started == ["ours", "serve-fast"]
    started.clear()
    assert bench.main(["--serve-mode", "both", "--only", "serve"]) == 0
    assert started == ["serve", "serve-fast"]

"""benchmarks/bench_autoscale.py: its options are checked before a cluster starts, and the report
reads each system's figures (the ratio and a missing figure)."""

from __future__ import annotations

import argparse

import pytest

from tests.helpers import load_benchmark


def _bench():
    return load_benchmark("bench_autoscale")


def test_two_nodes_with_max_1_is_refused_naming_both_options(capsys):
    bench = _bench()
    with pytest.raises(SystemExit) as exc:
        bench.main(["--layout", "two-nodes", "--max", "1"])
    assert exc.value.code == 2
    assert "--layout two-nodes needs --max 2 or more" in capsys.readouterr().err


def test_the_actor_options_ask_for_a_slot_only_on_two_nodes():
    bench = _bench()
    two = bench.actor_options(argparse.Namespace(layout="two-nodes"))
    one = bench.actor_options(argparse.Namespace(layout="one-node"))
    assert two["resources"] == {bench.SLOT: 1.0} and "resources" not in one
    assert two["num_cpus"] == one["num_cpus"] == bench.ACTOR_OPTIONS["num_cpus"]


def test_the_report_gives_ours_over_serve_and_a_dash_for_a_missing_figure(capsys):
    bench = _bench()
    args = argparse.Namespace(
        clients=16, burst=12.0, calm=2.0, idle=10.0, tail=5.0, work=0.2, max=4, layout="two-nodes")
    rows = bench.print_report({"ours": {"replica_s": 75.0, "reassigned": 0, "ray_version": "x"},
                               "serve": {"replica_s": 50.0, "reassigned": 1}}, args)
    by = {r["figure"]: r for r in rows}
    assert by["replica-seconds"]["ratio"] == 1.5
    assert by["reassigned"]["ours"] == 0 and by["reassigned"]["serve"] == 1 and by["reassigned"]["ratio"] == 0.0
    assert by["to enough (s)"]["ratio"] is None
    out = capsys.readouterr().out
    assert "layout two-nodes" in out and "replica-seconds" in out  # (printed, not only returned)


def test_without_ray_serve_the_comparison_stops_before_measuring_and_says_how_to_install_it(capsys, monkeypatch):
    """(The three ours-against-Ray-Serve benchmarks share ``childrun.main_for``: a missing Ray Serve
    used to show only after ours had run, as the serve child's ModuleNotFoundError.)"""
    bench = _bench()
    monkeypatch.setattr(bench.childrun, "serve_missing", lambda names: (
        "Ray Serve cannot be imported here (ModuleNotFoundError: No module named 'pydantic')"
        if any(n.startswith("serve") for n in names) else None))
    monkeypatch.setattr(bench, "spawn", lambda *a: pytest.fail("a child was started"))
    assert bench.main(["--json", "unused.json"]) == 2
    err = capsys.readouterr().err
    assert "Ray Serve cannot be imported" in err and "pydantic" in err and "make bench" in err
    assert "--only ours" in err

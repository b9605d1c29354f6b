"""benchmarks/bench_chaos.py's verdict per fault and its haproxy fault's arguments (no Ray): a killed
proxy's never-started failures count against ours when its data plane is direct (its HAProxy outlives
the proxy, issue 65), not otherwise; the haproxy fault is refused where a side runs no HAProxy."""

from __future__ import annotations

import pytest

from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_chaos")


def _row(fault: str, avoidable: int) -> dict:
    ours = {"lost": 0, "avoidable": avoidable, "holes": 0, "duplicates": 0, "bad_world_size": 0,
            "controller_agrees": True, "state_errors": [], "back_s": 0.05}
    return {"fault": fault, "ours": ours, "serve": {"back_s": 30.0}}


@pytest.mark.parametrize(("fault", "avoidable", "direct", "verdict"), [
    ("proxy", 0, True, "MET"),
    ("proxy", 3, True, "NOT MET"),  # (the node's HAProxy serves on: a never-started failure is ours)
    ("proxy", 3, False, "MET"),  # (the proxy data plane: the port closes with the proxy)
    ("replica", 1, False, "NOT MET"),
    ("replica", 0, True, "MET"),
    ("haproxy", 5, True, "MET"),  # (HAProxy killed: the client's own connection died with it)
])
def test_a_killed_proxys_never_started_failures_count_on_the_direct_data_plane(bench, fault, avoidable, direct,
                                                                                verdict):
    assert bench.judge(_row(fault, avoidable), direct=direct) == verdict


@pytest.mark.parametrize("argv", [
    ["--faults", "haproxy", "--serve-mode", "both", "--ours-mode", "fast"],  # (Serve's default mode: no HAProxy)
    ["--faults", "haproxy", "--serve-mode", "fast"],  # (ours' proxy data plane: no HAProxy)
    ["--faults", "replica,haproxy", "--only", "ours", "--data-plane", "proxy"],
])
def test_the_haproxy_fault_is_refused_where_a_side_runs_no_haproxy(bench, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    assert "the haproxy fault needs HAProxy on both sides" in capsys.readouterr().err

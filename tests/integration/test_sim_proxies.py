"""The simulator's proxies (issue 38): it runs the proxies the core decides, spreads requests
over them, and a proxy that dies drops the connections it held. Every run checks the invariants
after every step (``check=True``) and that nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from executors.ray_gpu.scenario import UnsupportedOnRay, check_supported
from executors.scenarios import ScenarioError, parse_scenario
from executors.sim import Simulation, load_scenario
from executors.sweep import figure_value, run_one

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scenarios" / "proxies-every-node.yaml"

BASE = """
seed: 4
duration: DURATION
cluster:
  nodes:
    - {name: head, gpus: 0}
    - {name: n1, gpus: 2}
    - {name: n2, gpus: 2}
latency: {place: 0.1, start: 2, stop: 0.5}
proxies: PROXIES
deployments:
  llm: {replicas: 4}
timeline:
  - deploy: llm
TIMELINE
traffic:
  llm:
    arrivals: {kind: poisson, rate: 20}
    service: {dist: exponential, mean: 0.1}
"""


def _run(proxies: str, timeline: str = "", duration: float = 300, seed: int | None = None) -> dict:
    text = BASE.replace("DURATION", str(duration)).replace("PROXIES", proxies).replace("TIMELINE", timeline)
    result = Simulation(parse_scenario(text, "<proxies>"), check=True, seed=seed).run()
    assert result.passed, [e.detail for e in result.failures]
    return result.metrics


def _requests(metrics: dict) -> dict:
    q = metrics["deployments"]["llm"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    return q


def test_every_node_holding_a_replica_and_the_head_run_a_proxy_and_requests_spread_over_them() -> None:
    m = _run("{proxy_location: EveryNode, head: head}")
    p = m["proxies"]
    assert p["location"] == "EveryNode"
    assert p["started"] == 3 and p["peak"] == 3  # head, n1, n2: one each
    assert p["crashes"] == 0 and p["requests_dropped"] == 0
    q = _requests(m)
    assert q["answered"] > 5000
    assert q["failed_no_proxy"] == p["requests_without_proxy"] > 0  # (before the first proxy was ready)
    assert 2.9 < p["serving_mean"] <= 3.0


def test_head_only_runs_one_proxy_and_disabled_none_so_every_request_fails_at_its_caller() -> None:
    m = _run("{proxy_location: HeadOnly, head: head}")
    assert (m["proxies"]["started"], m["proxies"]["peak"]) == (1, 1)
    m = _run("{proxy_location: Disabled}")
    q = _requests(m)
    assert m["proxies"]["started"] == 0
    assert q["submitted"] == 0 and q["failed_no_proxy"] > 5000


def test_a_proxy_that_dies_drops_its_requests_which_are_cancelled_and_it_is_started_again() -> None:
    m = _run("{proxy_location: EveryNode, head: head, crash_rate_per_proxy_hour: 30}", duration=600)
    p, q = m["proxies"], _requests(m)
    assert p["crashes"] >= 5
    assert p["started"] == 3 + p["crashes"]  # each restarted by the core
    assert q["failed_proxy_died"] == p["requests_dropped"] > 0
    assert q["cancelled"] == p["requests_dropped"]  # the machine freed each one's slot


def test_nodes_left_without_replicas_drain_their_proxies_which_stop_with_nothing_in_flight() -> None:
    timeline = "  - at: 100\n    scale: {deployment: llm, replicas: 0}"
    m = _run("{proxy_location: EveryNode, head: head, min_draining_period_s: 10}", timeline=timeline)
    p, q = m["proxies"], _requests(m)
    assert p["drains"] == 2 and p["stops"] == {"drained": 2}  # n1 and n2; the head's stays
    assert q["failed_proxy_died"] == 0  # no request cut by a drain
    assert 0.9 < p["serving_mean"] < 3.0


def test_a_lost_node_takes_its_proxy() -> None:
    timeline = "  - at: 100\n    lose_node: n2"
    m = _run("{proxy_location: EveryNode, head: head}", timeline=timeline)
    p = m["proxies"]
    assert p["lost_with_node"] == 1 and p["stops"] == {"node_lost": 1}
    _requests(m)


def test_a_controller_crash_keeps_the_proxies_it_recovers() -> None:
    timeline = "  - at: 100\n    crash_controller: {recover_after: 20}"
    m = _run("{proxy_location: EveryNode, head: head, crash_rate_per_proxy_hour: 20}", timeline=timeline,
             duration=400)
    p = m["proxies"]
    assert p["peak"] <= 3  # one a node, across the recovery
    _requests(m)


def test_the_what_if_head_only_against_every_node() -> None:
    """The example's question: under this load and fault rate, HeadOnly fails more requests
    (its first 20 minutes, two seeds: the test's time; the docs' table is the whole hour)."""
    by = {}
    for where in ("HeadOnly", "EveryNode"):
        runs = [run_one(str(EXAMPLE), {"proxies.proxy_location": where, "duration": 1200}, seed) for seed in (1, 2)]
        by[where] = sum(figure_value(r.metrics["deployments"]["chat"], "requests_failed_no_proxy")
                        + figure_value(r.metrics["deployments"]["chat"], "requests_failed_proxy_died")
                        for r in runs)
    assert by["HeadOnly"] > by["EveryNode"] > 0, by


def test_the_example_runs_checked() -> None:
    result = Simulation(load_scenario(EXAMPLE), check=True).run()
    assert result.passed
    assert result.metrics["proxies"]["lost_with_node"] == 1


@pytest.mark.parametrize("proxies, says", [
    ("{proxy_location: everywhere}", "proxy_location must be one of HeadOnly, EveryNode, Disabled"),
    ("{head: nowhere}", "unknown node 'nowhere'"),
    ("{proxy_location: EveryNode, min_draining_period_s: -1}", "min_draining_period_s"),
    ("{placement: pack}", "placement"),
    ("EveryNode", "must be a mapping"),
])
def test_a_bad_proxies_section_is_refused_naming_the_field(proxies: str, says: str) -> None:
    text = BASE.replace("DURATION", "10").replace("PROXIES", proxies).replace("TIMELINE", "")
    with pytest.raises(ScenarioError, match=says):
        parse_scenario(text, "<proxies>")


def test_the_ray_executor_refuses_a_proxies_section_with_a_clear_error() -> None:
    with pytest.raises(UnsupportedOnRay, match="proxies"):
        check_supported(load_scenario(EXAMPLE))

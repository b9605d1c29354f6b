"""The simulator's host CPU for any deployment (``traffic.<d>.host``, issue 65): each request's
CPU on the host's cores before its service, its replica's one interpreter shared by its requests;
the direct data plane's costs fitted from ``bench_http.py`` are modelled this way. Throughput and
latency follow the CPU, nothing is lost when a replica dies with requests on its CPU, and bad keys
are refused naming the key. Every run checks the invariants after every step."""

from __future__ import annotations

import pytest

from executors.scenarios import ScenarioError, parse_scenario
from executors.sim import Simulation

BASE = """
seed: 5
duration: 40
cluster: {nodes: 1, gpus_per_node: 4}
latency: {place: 0.1, start: 1, stop: 0.5}
deployments:
  echo: {replicas: REPLICAS, max_ongoing_requests: 64}
timeline:
  - deploy: echo
TIMELINE
traffic:
  echo:
    from: 5
    arrivals: {kind: closed, clients: CLIENTS, think_s: 0}
    service: SERVICE
    host: HOST
"""


def _run(host: str, clients: int = 1, replicas: int = 1, service: str = "0.0", timeline: str = "") -> dict:
    text = (BASE.replace("HOST", host).replace("CLIENTS", str(clients)).replace("REPLICAS", str(replicas))
            .replace("SERVICE", service).replace("TIMELINE", timeline))
    result = Simulation(parse_scenario(text, "<host>"), check=True).run()
    assert result.passed, [e.detail for e in result.failures]
    q = result.metrics["deployments"]["echo"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    return q


def test_one_client_waits_for_each_stage_in_turn():
    # 0.5 ms on the callers' loop, 0.2 ms of its own, 1 ms in the replica, 1 ms of service (not CPU)
    q = _run("{cores: 2, request_s: 0.0002, threads: [0.0005], replica_s: 0.001}", service="0.001")
    assert q["latency_p50"] == pytest.approx(0.0027, rel=0.01)
    assert q["throughput_rps"] == pytest.approx(1 / 0.0027, rel=0.02)


def test_a_replica_s_interpreter_is_the_limit_when_it_is_the_busiest():
    # 64 callers, 1 replica: its one interpreter (2 ms a request) serves 500 a second, whatever the
    # cores; the callers' loop (0.1 ms) and the cores (2.1 ms on 4) would allow more
    q = _run("{cores: 4, threads: [0.0001], replica_s: 0.002}", clients=64)
    assert q["throughput_rps"] == pytest.approx(500, rel=0.02)


def test_the_cores_are_the_limit_when_every_thread_could_do_more():
    # 4 replicas (2 ms each: 2,000 a second together), the callers' loop 0.2 ms (5,000), but 2.2 ms of
    # CPU a request on 2 cores: 909 a second
    q = _run("{cores: 2, threads: [0.0002], replica_s: 0.002}", clients=64, replicas=4)
    assert q["throughput_rps"] == pytest.approx(2 / 0.0022, rel=0.03)


def test_without_a_host_the_service_time_alone_counts():
    # (without ``host``: 8 callers, 4 replicas of 64 slots, 10 ms each: only the time)
    text = (BASE.replace("    host: HOST\n", "").replace("CLIENTS", "8").replace("REPLICAS", "4")
            .replace("SERVICE", "0.01").replace("TIMELINE", ""))
    q = Simulation(parse_scenario(text, "<no host>"), check=True).run().metrics["deployments"]["echo"]["requests"]
    assert "throughput_rps" not in q and q["answered"] / 35 == pytest.approx(8 / 0.01, rel=0.02)


def test_a_replica_dying_with_requests_on_its_cpu_loses_nothing():
    q = _run("{cores: 2, threads: [0.0002], replica_s: 0.002}", clients=16, replicas=2,
             timeline="  - at: 20\n    crash: {deployment: echo, rank: 0}")
    assert q["failed"] + q["retried"] > 0  # (what it held: not idempotent, they fail)
    assert q["answered"] > 0.95 * q["submitted"]


@pytest.mark.parametrize("host, words", [
    ("{request_s: 0.001}", "traffic.echo.host: missing required field 'cores'"),
    ("{cores: 2}", "traffic.echo.host.cores: needs 'request_s', 'threads' or 'replica_s' beside it"),
    ("{cores: 0, replica_s: 0.001}", "traffic.echo.host.cores: must be at least 1"),
    ("{cores: 2, threads: 0.001}", "traffic.echo.host.threads: must be a non-empty list"),
    ("{cores: 2, replica_s: 0.001, gpus: 1}", "traffic.echo.host"),
])
def test_bad_host_keys_are_refused_naming_the_key(host, words):
    text = BASE.replace("HOST", host).replace("CLIENTS", "1").replace("REPLICAS", "1").replace(
        "SERVICE", "0.001").replace("TIMELINE", "")
    with pytest.raises(ScenarioError, match=words.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        parse_scenario(text, "<host>")


def test_the_host_is_given_once_for_a_batched_deployment():
    text = BASE.replace("    service: SERVICE\n", "").replace("CLIENTS", "1").replace("REPLICAS", "1").replace(
        "TIMELINE", "").replace("HOST", "{cores: 2, replica_s: 0.001}") + \
        "    batch: {fixed_s: 0.001, cores: 2, replica_s: 0.001}\n"
    with pytest.raises(ScenarioError, match=r"traffic\.echo\.host: the host's CPU is given under batch already"):
        parse_scenario(text, "<host>")
    # (under host alone, a batched deployment takes it as under batch)
    ok = text.replace("    batch: {fixed_s: 0.001, cores: 2, replica_s: 0.001}\n", "    batch: {fixed_s: 0.001}\n")
    spec = parse_scenario(ok, "<host>").traffic["echo"]
    assert spec.host is not None and spec.host.cores == 2 and spec.batch is not None

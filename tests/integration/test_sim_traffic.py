"""The simulator's request queue (issue 22): arrival processes, the request machine fed the core's
pool commands, what becomes of requests when replicas crash, drain or are evicted, and the figures.

Every run checks the invariants after every step (``check=True``) and that nothing is lost, both in
the machine's counters and in the simulator's own books (each Submit ends once or is still waiting).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from executors.scenarios import ScenarioError, parse_scenario
from executors.scenarios.format import ArrivalSpec
from executors.sim import Simulation, load_scenario
from executors.sim.traffic import arrival_times
from executors.sweep import figure_value, run_one

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "scenarios"

BASE = """
seed: 5
duration: DURATION
cluster: {nodes: 1, gpus_per_node: 4}
latency: {place: 0.1, start: 2, stop: 0.5}
deployments:
  llm: {replicas: REPLICAS OPTIONS}
timeline:
  - deploy: llm
TIMELINE
traffic:
  llm: TRAFFIC
"""


def _text(traffic: str, *, duration: float = 200, replicas: int = 2, timeline: str = "", options: str = "") -> str:
    return (BASE.replace("DURATION", str(duration)).replace("REPLICAS", str(replicas))
            .replace(" OPTIONS", options).replace("TIMELINE", timeline).replace("TRAFFIC", traffic))


def _run(text: str, file: str = "<traffic>", seed: int | None = None) -> dict:
    result = Simulation(parse_scenario(text, file), check=True, seed=seed).run()
    assert result.passed, [e.detail for e in result.failures]
    return result.metrics


def _requests(metrics: dict, name: str = "llm") -> dict:
    q = metrics["deployments"][name]["requests"]
    ended = q["answered"] + q["app_errors"] + q["failed"] + q["rejected_total"] + q["cancelled"]
    # nothing lost: the machine's identity, and the simulator's own books (what the callers were told)
    assert q["submitted"] == ended + q["in_queue"] + q["in_flight"], q
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    return q


# ------------------------------------------------------------------ arrival processes
def _count(spec: ArrivalSpec, start: float, until: float, seed: int = 1) -> list[float]:
    times = list(arrival_times(spec, random.Random(seed), start, until))
    assert times == sorted(times) and all(start <= t <= until for t in times)
    return times


def test_poisson_gives_rate_times_duration_within_four_sigma() -> None:
    times = _count(ArrivalSpec("poisson", rate=50.0), 0.0, 200.0)
    assert abs(len(times) - 10_000) < 4 * 100  # sd = sqrt(10,000)
    q = _requests(_run(_text("{arrivals: {kind: poisson, rate: 10}, service: 0.01}", duration=400)))
    assert abs(q["submitted"] - 4000) < 4 * 4000 ** 0.5
    assert q["answered"] == q["submitted"] - q["in_flight"]


def test_bursts_come_at_the_burst_rate_inside_bursts_and_the_base_rate_outside() -> None:
    spec = ArrivalSpec("bursts", base_rate=2.0, burst_rate=40.0, burst_s=10.0, period_s=50.0, offset_s=5.0)
    times = _count(spec, 0.0, 1000.0)
    inside = [t for t in times if t >= 5 and (t - 5) % 50 < 10]
    # 20 bursts of 10 s at 40/s = 8,000; 800 s outside at 2/s = 1,600
    assert abs(len(inside) - 8000) < 4 * 8000 ** 0.5
    assert abs(len(times) - len(inside) - 1600) < 4 * 1600 ** 0.5


def test_daily_follows_its_hourly_curve_scaled_to_day_s() -> None:
    rates = [0.0] * 6 + [10.0] * 12 + [2.0] * 6  # night, day, evening
    spec = ArrivalSpec("daily", rates=tuple(rates), day_s=240.0)  # a "day" of 240 s: 10 s an hour
    times = _count(spec, 0.0, 480.0)  # two days
    expected = sum(rates) * 10 * 2
    assert abs(len(times) - expected) < 4 * expected ** 0.5
    assert not [t for t in times if (t % 240) < 60], "arrivals in the hours at rate 0"
    day = [t for t in times if 60 <= t % 240 < 180]
    assert abs(len(day) - 2400) < 4 * 2400 ** 0.5


def test_file_arrivals_are_exact(tmp_path: Path) -> None:
    (tmp_path / "arrivals.txt").write_text("# arrival times, seconds\n3.5\n1\n\n2.25  # a comment\n150\n7e1\n300\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(_text("{arrivals: {kind: file, path: arrivals.txt}, service: 0.5, until: 200}"))
    sc = load_scenario(scenario)
    assert sc.traffic["llm"].arrivals.times == (1.0, 2.25, 3.5, 70.0, 150.0, 300.0)
    assert list(arrival_times(sc.traffic["llm"].arrivals, random.Random(0), 0.0, 200.0)) == [1.0, 2.25, 3.5, 70.0, 150.0]
    q = _requests(Simulation(sc, check=True).run().metrics)
    # the three before the replicas serve (t~2.1) wait for them; none is lost or refused
    assert (q["submitted"], q["answered"], q["rejected_total"]) == (5, 5, 0)


def test_a_bad_arrival_file_names_its_line(tmp_path: Path) -> None:
    (tmp_path / "arrivals.txt").write_text("1\n2\nsoon\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(_text("{arrivals: {kind: file, path: arrivals.txt}, service: 0.5}"))
    with pytest.raises(ScenarioError, match=r"traffic\.llm\.arrivals\.path: .*arrivals\.txt:3: not a number"):
        load_scenario(scenario)


@pytest.mark.parametrize("traffic, field, words", [
    ("{arrivals: {kind: poison, rate: 5}, service: 1}", "traffic.llm.arrivals.kind", "did you mean 'poisson'"),
    ("{arrivals: {kind: poisson, rate: -5}, service: 1}", "traffic.llm.arrivals.rate", "must be >= 0"),
    ("{arrivals: {kind: bursts, base_rate: -1, burst_rate: 5, burst_s: 1, period_s: 10}, service: 1}",
     "traffic.llm.arrivals.base_rate", "must be >= 0"),
    ("{arrivals: {kind: daily, rates: [1, 2]}, service: 1}", "traffic.llm.arrivals.rates", "24 rates"),
    ("{arrivals: {kind: poisson, rate: 5}}", "traffic.llm", "missing required field 'service'"),
    ("{arrivals: {kind: poisson, rate: 5}, service: {dist: weibull}}", "traffic.llm.service", "unknown dist"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, timeout_s: 0}", "traffic.llm.timeout_s", "> 0"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, max_ongoing_requests: 2}",
     "traffic.llm.max_ongoing_requests", "a deployment option (declared once: rankcore/options.py): set it as "
     "deployments.llm.max_ongoing_requests"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, idempotent: maybe}", "traffic.llm.idempotent", "true or false"),
])
def test_malformed_traffic_is_one_line_naming_the_field(traffic: str, field: str, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(_text(traffic), "s.yaml")
    assert str(err.value).startswith("s.yaml:") and f": {field}: " in str(err.value), str(err.value)
    assert words in str(err.value)


def test_traffic_for_an_unknown_deployment_or_without_a_duration_is_refused() -> None:
    text = _text("{arrivals: {kind: poisson, rate: 5}, service: 1}")
    with pytest.raises(ScenarioError, match=r"s\.yaml:\d+:\d+: traffic\.lm: unknown deployment 'lm' \(did you mean 'llm'"):
        parse_scenario(text.replace("  llm: {arrivals", "  lm: {arrivals"), "s.yaml")
    with pytest.raises(ScenarioError, match=r"traffic\.llm: traffic needs the scenario's 'duration'"):
        parse_scenario(text.replace("duration: 200\n", ""), "s.yaml")


# ------------------------------------------------------------------ crashes, drains, tiers
CRASH = "  - at: 100\n    crash: {deployment: llm, rank: 0}\n"


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_crash_under_load_loses_nothing(idempotent: bool) -> None:
    """4 req/s of 2 s requests on 2 replicas (8 of their 10 slots busy): the crash at t=100 finds
    requests on rank 0's replica. Not idempotent: they fail naming it; idempotent: run again."""
    traffic = f"{{arrivals: {{kind: poisson, rate: 4}}, service: 2, idempotent: {str(idempotent).lower()}}}"
    metrics = _run(_text(traffic, timeline=CRASH))
    q = _requests(metrics)
    crashed = "llm#0"  # rank 0's first replica
    if idempotent:
        assert q["retried"] > 0 and q["failed"] == 0, q
    else:
        assert q["failed"] > 0 and q["retried"] == 0, q
        assert q["failed_by_replica"] == {crashed: q["failed"]}
        assert all(f["reason"] == "replica_died" and f["replica"] == crashed and crashed in f["detail"]
                   and f["t"] == 100.0 for f in q["failures"])
    assert q["answered"] + q["failed"] + q["in_flight"] + q["in_queue"] == q["submitted"]  # no refusal


def test_requests_flow_while_the_controller_is_down_and_a_dead_replica_gets_none() -> None:
    """The controller is down 30 s; a replica crashes meanwhile (the core learns it only at the
    recovery). Requests keep being answered by the live replica; one sent to the dead replica is
    not delivered (NotDelivered) and goes elsewhere; idempotent ones it held are retried after the
    recovery's PoolReset says it is gone. Nothing lost, nothing failed."""
    timeline = ("  - at: 100\n    crash_controller: {recover_after: 30}\n"
                "  - at: 110\n    crash: {deployment: llm, rank: 0}\n")
    traffic = "{arrivals: {kind: poisson, rate: 4}, service: 0.5, idempotent: true, metrics_interval_s: 5}"
    metrics = _run(_text(traffic, timeline=timeline))
    q = _requests(metrics)
    assert q["failed"] == 0 and q["rejected_total"] == 0, q
    assert q["retried"] > 0, q  # what the dead replica held was run again
    down = [s for s in q["queue_series"] if 112 <= s[0] <= 128]
    assert down and all(in_flight > 0 for _, _, in_flight in down), down  # the live replica kept serving


DRAIN = "  - at: 100\n    scale: {deployment: llm, replicas: 2}\n"


def _drain_run(options: str) -> tuple[dict, list[int]]:
    """4 -> 2 at t=100 under 4 req/s of 3 s requests (not idempotent); the victims' held requests
    at the scale are recorded."""
    sim = Simulation(parse_scenario(_text("{arrivals: {kind: poisson, rate: 4}, service: 3}", replicas=4,
                                          timeline=DRAIN, options=options), "<drain>"), check=True)
    held: list[int] = []
    traffic = sim.traffic
    assert traffic is not None
    sim.schedule(100.0, lambda: held.extend(len(traffic._held.get(f"llm#{i}", {})) for i in range(4)), last=True)
    result = sim.run()
    assert result.passed, [e.detail for e in result.failures]
    return result.metrics, held


def test_a_scale_down_drains_no_request_of_a_victim_fails() -> None:
    metrics, held = _drain_run("")
    q = _requests(metrics)
    assert sum(held) >= 4, held  # the victims had requests in hand
    assert q["failed"] == 0 and q["rejected_total"] == 0, q
    # killed before they finish (graceful_shutdown_timeout_s 0.1 s < 3 s of service): those fail, naming them
    metrics, held = _drain_run(", graceful_shutdown_timeout_s: 0.1")
    q = _requests(metrics)
    assert q["failed"] > 0 and all(f["detail"].endswith("(not idempotent)") for f in q["failures"]), q


EVICT = """
seed: 2
duration: 300
cluster:
  nodes: [{name: n, gpus: 1, gpu_memory: 80GB, cpu_cache: 100GB}]
latency: {place: 0.5, start: 2, stop: 1}
deployments:
  a: {replicas: 1, model_bytes: 60GB, min_deployment_time_s: 0}
  b: {replicas: 1, model_bytes: 60GB, min_deployment_time_s: 0}
timeline:
  - deploy: a
  - at: 100
    deploy: b
  - at: 200
    scale: {deployment: b, replicas: 0}
traffic:
  a: {arrivals: {kind: poisson, rate: 2}, service: 0.2, metrics_interval_s: 5}
"""


def test_requests_for_an_evicted_model_wait_loading_and_are_answered_when_it_is_back() -> None:
    """One GPU: b evicts a at t=100; a's replacement waits for room until b goes (t=200) and
    reloads from its WARM copy. a's requests meanwhile wait ("loading"), none fails or is refused."""
    sim = Simulation(parse_scenario(EVICT, "<evict>"), check=True)
    traffic = sim.traffic
    assert traffic is not None
    seen: list[tuple[str, ...]] = []

    def probe() -> None:
        ids = traffic.machine.queued("a")
        seen.append(tuple(s.state for s in map(traffic.machine.status, ids) if s is not None))

    sim.schedule(150.0, probe)
    result = sim.run()
    assert result.passed
    m = result.metrics["deployments"]["a"]
    assert (m["evictions"], m["warm_loads"]) == (1, 1)
    q = _requests(result.metrics, "a")
    assert seen and len(seen[0]) > 50 and set(seen[0]) == {"loading"}, seen
    assert q["failed"] == 0 and q["rejected_total"] == 0 and q["in_queue"] == 0, q
    assert q["queue_wait_max"] > 90 and q["max_queued"] > 150, q  # waited out the eviction, then answered
    assert max(queued for _, queued, _ in q["queue_series"]) > 150


def test_requests_for_a_deployment_scaled_to_zero_are_refused_at_once() -> None:
    timeline = "  - at: 100\n    scale: {deployment: llm, replicas: 0}\n"
    q = _requests(_run(_text("{arrivals: {kind: poisson, rate: 5}, service: 0.1}", timeline=timeline)))
    assert q["rejected"]["unavailable"] > 300 and q["failed"] == 0, q  # ~500 after t=100


def test_deadlines_end_waiting_requests_with_a_timeout() -> None:
    """Replicas take 60 s to start; requests time out after 10 s: those before ~50 s are refused."""
    text = _text("{arrivals: {kind: poisson, rate: 2}, service: 0.1, timeout_s: 10}").replace("start: 2", "start: 60")
    q = _requests(_run(text))
    assert q["rejected"]["timeout"] > 60 and q["queue_wait_max"] <= 10, q


def test_overload_is_refused_at_once_past_max_queued_requests() -> None:
    q = _requests(_run(_text("{arrivals: {kind: poisson, rate: 40}, service: 1}",  # (the limits: deployment options)
                             options=", max_queued_requests: 20, max_ongoing_requests: 2")))
    # 2 replicas x 2 slots / 1 s = 4 req/s served of 40: the queue stays at 20, the rest is refused
    assert q["max_queued"] == 20 and q["rejected"]["overloaded"] > 5000, q


def test_application_errors_are_answers_counted_apart() -> None:
    q = _requests(_run(_text("{arrivals: {kind: poisson, rate: 10}, service: 0.05, error_rate: 0.25}")))
    assert 0.2 < q["app_errors"] / (q["answered"] + q["app_errors"]) < 0.3, q
    assert q["failed"] == 0


# ------------------------------------------------------------------ determinism, streams, what-if
def test_same_seed_same_figures_another_seed_others() -> None:
    path = EXAMPLES / "traffic-bursts.yaml"
    runs = [Simulation(load_scenario(path, overrides={"duration": 300}), seed=s).run().metrics for s in (7, 7, 8)]
    assert json.dumps(runs[0], sort_keys=True) == json.dumps(runs[1], sort_keys=True)
    assert runs[0]["deployments"]["chat"]["requests"] != runs[2]["deployments"]["chat"]["requests"]


def test_traffic_draws_from_its_own_streams() -> None:
    """Adding traffic changes no other draw: the random crashes and the replicas' start latencies
    are those of the run without it."""
    text = _text("{arrivals: {kind: poisson, rate: 3}, service: {dist: exponential, mean: 0.1}, error_rate: 0.1}",
                 duration=3600).replace(
        "latency: {place: 0.1, start: 2, stop: 0.5}",
        "latency: {place: 0.1, start: {dist: uniform, low: 2, high: 6}}\nfaults: {crash_rate_per_replica_hour: 3}")
    without = text[:text.index("traffic:")]
    with_traffic = Simulation(parse_scenario(text)).run().metrics["deployments"]["llm"]
    plain = Simulation(parse_scenario(without)).run().metrics["deployments"]["llm"]
    assert with_traffic.pop("requests")["submitted"] > 10_000
    assert plain["crashes"] > 5 and with_traffic == plain


def test_the_queue_series_is_sampled_every_metrics_interval() -> None:
    q = _requests(_run(_text("{arrivals: {kind: poisson, rate: 5}, service: 0.2, metrics_interval_s: 20}")))
    assert [s[0] for s in q["queue_series"]] == [20.0 * i for i in range(11)]
    assert all(queued >= 0 and 0 <= in_flight <= 10 for _, queued, in_flight in q["queue_series"])


def test_a_sweep_varies_the_traffic_rate() -> None:
    path = str(EXAMPLES / "traffic-bursts.yaml")
    low, high = (run_one(path, {"traffic.embed.arrivals.rate": r}, None) for r in (5, 30))
    sent = [figure_value(r.metrics["deployments"]["embed"], "requests_submitted") for r in (low, high)]
    assert sent[0] is not None and sent[1] is not None and 5 * sent[0] < sent[1] * 1.2
    assert figure_value(high.metrics["deployments"]["embed"], "requests_queue_wait_p99") is not None


def test_the_ray_runner_refuses_traffic_naming_the_key() -> None:
    from executors.ray_gpu.scenario import UnsupportedOnRay, check_supported

    sc = load_scenario(EXAMPLES / "traffic-bursts.yaml")
    with pytest.raises(UnsupportedOnRay, match=r"cannot run traffic \(chat, embed: the simulator's queue only\)"):
        check_supported(sc, multi_node=True)

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
     "traffic.llm.max_ongoing_requests", "a deployment option (declared once: rankcore/base/options.py): set it as "
     "deployments.llm.max_ongoing_requests"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, idempotent: maybe}", "traffic.llm.idempotent", "true or false"),
    # streams (``stream:``)
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, stream: 5}", "traffic.llm.stream", "must be a mapping"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, stream: {items: 10}}", "traffic.llm.stream",
     "missing required field 'item_interval_s'"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, stream: {items: 0, item_interval_s: 0.1}}",
     "traffic.llm.stream.items", "must be a whole number of items >= 1 or a distribution"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, stream: {items: 2.5, item_interval_s: 0.1}}",
     "traffic.llm.stream.items", "must be a whole number of items >= 1"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, stream: {items: {dist: zipf}, item_interval_s: 0.1}}",
     "traffic.llm.stream.items", "unknown dist 'zipf'"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, stream: {items: 10, item_interval_s: -1}}",
     "traffic.llm.stream.item_interval_s", "must be >= 0"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, stream: {items: 10, item_interval_s: 0.1, first_item_s: x}}",
     "traffic.llm.stream.first_item_s", "a latency must be"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, stream: {items: 10, item_interval_s: 0.1, fraction: 1.5}}",
     "traffic.llm.stream.fraction", "must be <= 1"),
    ("{arrivals: {kind: poisson, rate: 5}, service: 1, stream: {items: 10, item_intervals: 0.1}}",
     "traffic.llm.stream.item_intervals", "did you mean 'item_interval_s'"),
    ("{arrivals: {kind: poisson, rate: 5}, stream: {items: 10, item_interval_s: 0.1, fraction: 0.5}}",
     "traffic.llm", "missing required field 'service' (the plain requests' service time: stream.fraction is 0.5)"),
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


# ------------------------------------------------------------------ streams
STREAM = "{arrivals: ARRIVALS, stream: {items: 10, first_item_s: 0.5, item_interval_s: 0.1}, idempotent: true}"


def _streams(metrics: dict, name: str = "llm") -> dict:
    q = _requests(metrics, name)
    # every stream a replica took ended once (completed, an application error, failed) or is still running
    assert q["streams_started"] == (q["streams_completed"] + q["streams_app_errors"] + q["streams_failed"]
                                    + q["streams_in_flight"]), q
    assert q["retried"] == 0, q  # a stream is never retried, idempotent or not
    return q


def test_stream_figures_are_the_items_and_times_drawn_and_seeded() -> None:
    """Constant shapes: every stream gives 10 items, the first 0.5 s after its dispatch, then one every
    0.1 s: it holds its slot 1.4 s. From t=10 (the replicas serve) 2 streams/s on 10 slots never wait."""
    text = _text(STREAM.replace("ARRIVALS", "{kind: poisson, rate: 2}, from: 10"), duration=300)
    runs = [_streams(_run(text, seed=seed)) for seed in (3, 3, 4)]
    q = runs[0]
    assert q == runs[1] and q["streams_started"] != runs[2]["streams_started"]  # seeded
    assert abs(q["streams_started"] - 580) < 4 * 580 ** 0.5 and q["streams_started"] == q["dispatched"], q
    assert q["streams_failed"] == q["failed"] == 0 and q["streams_in_flight"] == q["in_flight"], q
    assert q["stream_items"] == 10 * q["streams_completed"] and q["answered"] == q["streams_completed"], q
    assert q["first_item_p50"] == q["first_item_p99"] == 0.5, q  # (submit -> first item: no queue wait)
    assert q["stream_duration_p50"] == q["stream_duration_p99"] == 1.4, q
    assert q["latency_p99"] == 1.4 and q["queue_wait_max"] == 0.0, q


def test_a_fraction_of_the_requests_stream_the_others_are_plain() -> None:
    traffic = ("{arrivals: {kind: poisson, rate: 5}, service: 0.2, "
               "stream: {fraction: 0.3, items: {dist: uniform, low: 5, high: 15}, item_interval_s: 0.05}}")
    q = _streams(_run(_text(traffic, duration=400)))
    assert abs(q["streams_started"] - 0.3 * q["dispatched"]) < 4 * (0.21 * q["dispatched"]) ** 0.5, q
    ended = q["streams_completed"]
    assert 5 * ended <= q["stream_items"] <= 15 * ended, q  # (uniform 5..15 items, rounded)
    assert q["answered"] > ended * 2, q  # the plain requests are answered too
    # every stream gives 5..15 items 50 ms apart, the first one interval after its dispatch
    assert 0.25 <= q["stream_duration_p50"] <= q["stream_duration_p99"] <= 0.75 + 1e-9, q
    plain = _requests(_run(_text("{arrivals: {kind: poisson, rate: 5}, service: 0.2}", duration=400)))
    assert "streams_started" not in plain  # (no stream figures without streams)


def _file(tmp_path: Path, times: str, traffic: str, *, replicas: int, timeline: str, options: str = "",
          duration: float = 200) -> Path:
    """A scenario whose requests arrive at ``times`` (one a line), exactly."""
    (tmp_path / "arrivals.txt").write_text(times)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(_text(traffic.replace("ARRIVALS", "{kind: file, path: arrivals.txt}"), replicas=replicas,
                              timeline=timeline, options=options, duration=duration))
    return scenario


def _run_file(path: Path) -> dict:
    result = Simulation(load_scenario(path), check=True).run()
    assert result.passed, [e.detail for e in result.failures]
    return result.metrics


@pytest.mark.parametrize("controller_down", [False, True])
def test_a_crash_mid_stream_fails_its_streams_after_the_items_given_and_loses_nothing(
        tmp_path: Path, controller_down: bool) -> None:
    """One replica; streams of 1000 items, one a second after 1 s, start at t=50 and t=60. The replica
    crashes at t=100: by then their callers had 50 and 40 items. Each fails (never retried, though
    idempotent) naming the replica, after those items: the items stop at the crash even when the
    controller is down (90-150), so the machine learns it only at the recovery."""
    timeline = "  - at: 100\n    crash: {deployment: llm, rank: 0}\n"
    if controller_down:
        timeline = "  - at: 90\n    crash_controller: {recover_after: 60}\n" + timeline
    traffic = "{arrivals: ARRIVALS, stream: {items: 1000, first_item_s: 1, item_interval_s: 1}, idempotent: true}"
    q = _streams(_run_file(_file(tmp_path, "50\n60\n", traffic, replicas=1, timeline=timeline)))
    assert (q["streams_started"], q["streams_failed"], q["failed"], q["lost"]) == (2, 2, 2, 0), q
    assert [f["items"] for f in q["failures"]] == [50, 40] and q["stream_items"] == 90, q
    assert all(f["reason"] == "replica_died" and f["replica"] == "llm#0" and "(a stream)" in f["detail"]
               for f in q["failures"]), q["failures"]
    assert {f["t"] for f in q["failures"]} == ({150.0} if controller_down else {100.0}), q["failures"]
    assert q["first_item_p50"] == 1.0 and q["stream_duration_p50"] is None, q


def test_a_hung_replica_stops_its_streams_where_it_hung(tmp_path: Path) -> None:
    """The replica hangs at t=100 holding a stream begun at t=50: its caller has 50 items, then the
    error once the health checks have it replaced."""
    timeline = "  - at: 100\n    hang: {deployment: llm, rank: 0}\n"
    traffic = "{arrivals: ARRIVALS, stream: {items: 1000, first_item_s: 1, item_interval_s: 1}}"
    q = _streams(_run_file(_file(tmp_path, "50\n", traffic, replicas=1, timeline=timeline, duration=400)))
    assert q["streams_failed"] == 1 and q["failures"][0]["t"] > 100 and q["failures"][0]["items"] == 50, q


def _stream_drain(tmp_path: Path, options: str) -> dict:
    """Streams of 100 items (0.5 s, then one every 0.1 s: 10.4 s) arrive at 95, 96, 97, 98 on 2
    replicas; at t=100 llm is scaled to 1: its victim holds 2 of them."""
    traffic = "{arrivals: ARRIVALS, stream: {items: 100, first_item_s: 0.5, item_interval_s: 0.1}}"
    path = _file(tmp_path, "95\n96\n97\n98\n", traffic, replicas=2, options=options, timeline=DRAIN.replace(
        "replicas: 2", "replicas: 1"))
    sim = Simulation(load_scenario(path), check=True)
    held: list[int] = []
    traffic_ = sim.traffic
    assert traffic_ is not None
    sim.schedule(100.0, lambda: held.extend(len(traffic_._held.get(f"llm#{i}", {})) for i in range(2)), last=True)
    result = sim.run()
    assert result.passed, [e.detail for e in result.failures]
    assert held == [2, 2], held
    return _streams(result.metrics)


def test_a_drain_lets_its_streams_finish_and_a_kill_at_the_timeout_fails_them(tmp_path: Path) -> None:
    q = _stream_drain(tmp_path, "")  # (graceful_shutdown_timeout_s: Ray Serve's 20 s > 10.4 s)
    assert (q["streams_completed"], q["streams_failed"], q["stream_items"], q["failed"]) == (4, 0, 400, 0), q
    q = _stream_drain(tmp_path, ", graceful_shutdown_timeout_s: 2")  # killed at t=102, mid-stream
    assert (q["streams_completed"], q["streams_failed"]) == (2, 2), q
    given = [f["items"] for f in q["failures"]]
    assert all(0 < n < 100 for n in given) and q["stream_items"] == 200 + sum(given), q
    assert {f["t"] for f in q["failures"]} == {102.0}, q["failures"]


def test_the_streams_example_fails_only_the_crashed_replicas_streams() -> None:
    """examples/scenarios/traffic-streams.yaml: the crash at t=200 fails the streams rank 1 held;
    the scale-down at t=400 drains, failing none; nothing lost; the summary has a streams table."""
    from executors.cli import _summary_tables

    result = Simulation(load_scenario(EXAMPLES / "traffic-streams.yaml"), check=True).run()
    assert result.passed, [e.detail for e in result.failures]
    q = _streams(result.metrics)
    assert q["streams_failed"] > 0 and q["failed"] == q["streams_failed"], q
    assert all(f["t"] == 200.0 and f["replica"] == "llm#1" and f["items"] > 0 for f in q["failures"]), q
    assert q["streams_completed"] > 1000 and q["stream_items"] > 100 * q["streams_completed"], q
    assert [t.title for t in _summary_tables(result)][-1] == "streams"
    assert "streams" not in [t.title for t in _summary_tables(
        Simulation(load_scenario(EXAMPLES / "traffic-bursts.yaml", overrides={"duration": 200})).run())]


def test_a_sweep_shows_stream_figures_only_for_runs_with_streams() -> None:
    from executors.sweep import traffic_figures

    streams = run_one(str(EXAMPLES / "traffic-streams.yaml"), {"traffic.llm.stream.item_interval_s": 0.01}, None)
    plain = run_one(str(EXAMPLES / "traffic-bursts.yaml"), {"duration": 200}, None)
    assert {f.group for f in traffic_figures([streams])} == {"requests", "queue", "streams"}
    assert {f.group for f in traffic_figures([plain])} == {"requests", "queue"}
    # 10 ms between items instead of 20: streams half as long
    duration = figure_value(streams.metrics["deployments"]["llm"], "requests_stream_duration_p50")
    assert duration is not None and duration < 3.0, duration


def test_the_ray_runner_refuses_streams_in_traffic() -> None:
    from executors.ray_gpu.scenario import UnsupportedOnRay, check_supported

    with pytest.raises(UnsupportedOnRay, match=r"cannot run traffic \(llm: the simulator's queue only\)"):
        check_supported(load_scenario(EXAMPLES / "traffic-streams.yaml"), multi_node=True)

"""Autoscaling in the simulator (issue 23): the simulator feeds the core's autoscaler from its request
queue every metrics_interval_s (executors/sim/autoscale.py) and measures it; the what-if sweep over
policy knobs; the scenario's autoscaling options checked by the core's own declaration.

Every run checks the invariants after every step (``check=True``) and that no request is lost.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

import rankcore as rc
from executors.cli import main
from executors.scenarios import ScenarioError, parse_scenario
from executors.sim import Simulation

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scenarios" / "autoscaling-bursts.yaml"

#: one autoscaled deployment; one burst of 20 req/s of 0.8 s from BURST for 60 s over 1 req/s
BASE = """
seed: 3
duration: DURATION
cluster: {nodes: 2, gpus_per_node: 8}
latency: {place: 0.1, start: 4, stop: 0.5}
deployments:
  chat:
    autoscaling: true
    min_replicas: MIN
    max_replicas: 12
    metrics_interval_s: 2
    look_back_period_s: 10
    upscale_delay_s: 10
    downscale_delay_s: 60
OPTIONS
timeline:
  - deploy: chat
TIMELINE
traffic:
  chat:
    arrivals: {kind: bursts, base_rate: BASE_RATE, burst_rate: 20, burst_s: 60, period_s: 100000, offset_s: BURST}
    service: {dist: lognormal, median: 0.8, sigma: 0.3}
    from: 10
"""
BURST = 100.0
INTERVAL, UP, DOWN, LOOK_BACK = 2.0, 10.0, 60.0, 10.0


def _text(*, minimum: int = 1, duration: float = 400, base_rate: float = 1, options: str = "",
          timeline: str = "") -> str:
    return (BASE.replace("DURATION", str(duration)).replace("MIN", str(minimum)).replace("BASE_RATE", str(base_rate))
            .replace("BURST", str(BURST)).replace("OPTIONS\n", options).replace("TIMELINE\n", timeline))


class _Watch:
    """A driver observer: every ``AutoscalingMetrics`` step (its time) and every target change."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.changes: list[tuple[float, int, int]] = []  # (t, old target, new target)

    def __call__(self, t: float, event: object, before: rc.State, result: rc.Step) -> None:
        if isinstance(event, rc.AutoscalingMetrics):
            self.samples.append(t)
            old, new = before.deployments.get("chat"), result.state.deployments.get("chat")
            if old is not None and new is not None and old.target != new.target:
                self.changes.append((t, old.target, new.target))


def _sim(text: str, seed: int | None = None) -> tuple[Simulation, _Watch]:
    sim = Simulation(parse_scenario(text, "<autoscaling>"), check=True, seed=seed)
    watch = _Watch()
    sim.driver.observers.append(watch)
    return sim, watch


def _requests(metrics: dict) -> dict:
    q = metrics["deployments"]["chat"]["requests"]
    assert (q["lost"], q["machine_lost"], q["double_ends"]) == (0, 0, 0), q
    return q


def test_a_burst_scales_up_within_the_delay_and_back_down_after_downscale_delay() -> None:
    sim, watch = _sim(_text())
    result = sim.run()
    assert result.passed, [e.detail for e in result.failures]
    ups = [c for c in watch.changes if c[2] > c[1]]
    downs = [c for c in watch.changes if c[2] < c[1]]
    assert ups and downs, watch.changes
    # nothing before the burst (1 req/s of 0.8 s: one replica is enough), then up once the burst has
    # been wanted for upscale_delay_s: the first sample in the burst already wants more (its queue)
    t_up = ups[0][0]
    assert BURST + UP <= t_up <= BURST + UP + 2 * INTERVAL, watch.changes
    assert ups[0][2] > 1
    # down only after downscale_delay_s of wanting it (never within the delay of the last upscale), and
    # back to min_replicas once the burst has been over for the delay (and the window)
    assert downs[0][0] >= ups[-1][0] + DOWN, watch.changes
    back = BURST + 60 + DOWN + LOOK_BACK + 2 * INTERVAL
    assert [c for c in watch.changes if c[0] <= back][-1][2] == 1, watch.changes
    assert result.state.deployment("chat").target == 1
    # samples every metrics_interval_s from the deploy on, stamped with the virtual time
    assert watch.samples[:3] == [2.0, 4.0, 6.0]
    assert all(math.isclose(b - a, INTERVAL) for a, b in zip(watch.samples, watch.samples[1:]))
    q = _requests(result.metrics)
    assert q["failed"] == q["rejected_total"] == 0 and q["answered"] > 1000, q
    auto = result.metrics["deployments"]["chat"]["autoscaling"]
    assert (auto["scale_ups"], auto["scale_downs"]) == (len(ups), len(downs))
    assert auto["metrics_fed"] == len(watch.samples) and auto["metrics_skipped"] == 0
    assert auto["max_target"] == max(c[2] for c in watch.changes) and auto["min_target"] == 1
    # time to enough: from the burst's first sample to enough replicas serving, the upscale delay and
    # a start (4 s) in it
    assert auto["to_enough_n"] >= 1 and UP <= auto["to_enough_max"] <= UP + 4 * INTERVAL + 4 + 1, auto
    # the downscale removes the highest ranks, replicas not yet serving first: no rank moves
    assert result.metrics["deployments"]["chat"]["reassignments"]["any"] == 0


def test_replica_seconds_and_gpu_hours_are_the_time_replicas_held_their_gpus() -> None:
    text = """
seed: 1
duration: 100
cluster: {nodes: 1, gpus_per_node: 8}
latency: {place: 0.5, start: 3, stop: 2}
deployments:
  a: {replicas: 3, gpus: 2}
timeline:
  - deploy: a
  - at: 40
    scale: {deployment: a, replicas: 1}
"""
    result = Simulation(parse_scenario(text, "<cost>"), check=True).run()
    m = result.metrics["deployments"]["a"]
    # 3 placed at 0.5; two stop at 40 + 2 s; one holds until the end
    want = 2 * (42 - 0.5) + (100 - 0.5)
    assert m["replica_seconds"] == pytest.approx(want)
    assert m["gpu_hours"] == pytest.approx(want * 2 / 3600, abs=1e-6)
    assert m["starts"] == 3
    assert "autoscaling" not in m  # (not autoscaled: no autoscaler figures)


def test_scale_to_zero_and_back_loses_no_request_the_first_one_waits_in_the_queue() -> None:
    options = "    initial_replicas: 1\n    downscale_to_zero_delay_s: 20\n"
    sim, watch = _sim(_text(minimum=0, base_rate=0, options=options))
    result = sim.run()
    assert result.passed, [e.detail for e in result.failures]
    q = _requests(result.metrics)
    # idle from the start: down to zero; the burst's first request waits in the queue, the cold
    # start brings a replica at once (no delay), every request is answered
    assert watch.changes and watch.changes[0][2] == 0, watch.changes
    assert q["rejected_total"] == 0 and q["failed"] == 0, q
    assert q["answered"] == q["submitted"] > 0, q
    assert q["queue_wait_max"] > 0  # (the first ones waited for the replica to start)
    zero_to_one = [c for c in watch.changes if c[1] == 0]
    assert zero_to_one and BURST <= zero_to_one[0][0] <= BURST + 1, watch.changes
    assert result.state.deployment("chat").target == 0  # and down to zero again after the burst


def test_no_metrics_while_the_controller_is_down_and_fresh_ones_after() -> None:
    down_at, back_at = BURST + 2, BURST + 42  # the controller goes down just as the burst starts
    timeline = f"  - at: {down_at}\n    crash_controller: {{recover_after: {back_at - down_at}}}\n"
    sim, watch = _sim(_text(timeline=timeline))
    answered: dict[float, int] = {}

    def count() -> None:
        answered[sim.now] = sim.traffic.machine.counters("chat").answered

    for t in (down_at + 1, back_at - 1):
        sim.schedule(t, count, last=True)
    result = sim.run()
    assert result.passed, [e.detail for e in result.failures]
    # none fed while it is down; fed again after the recovery, on the same clock
    assert not [t for t in watch.samples if down_at < t < back_at], watch.samples
    assert [t for t in watch.samples if t >= back_at][0] <= back_at + INTERVAL
    auto = result.metrics["deployments"]["chat"]["autoscaling"]
    assert auto["metrics_skipped"] == 20  # (40 s at one every 2 s)
    # the target does not move while it is down (the burst is on: it would have); after the recovery
    # the window starts afresh, so the upscale waits upscale_delay_s from the first fresh sample
    assert not [c for c in watch.changes if down_at <= c[0] < back_at], watch.changes
    ups = [c for c in watch.changes if c[2] > c[1]]
    assert ups and back_at + UP <= ups[0][0] <= back_at + UP + 2 * INTERVAL, watch.changes
    # requests kept flowing to the replica the queue knew
    assert answered[back_at - 1] > answered[down_at + 1] + 100, answered
    assert _requests(result.metrics)["failed"] == 0


def test_a_burst_during_an_outage_is_decided_on_the_recovered_target() -> None:
    """The autoscaled target is persisted with the specs: a crash after the upscale keeps it."""
    timeline = f"  - at: {BURST + 30}\n    crash_controller: {{recover_after: 5}}\n"
    sim, watch = _sim(_text(timeline=timeline))
    result = sim.run()
    assert result.passed, [e.detail for e in result.failures]
    before = [c for c in watch.changes if c[0] < BURST + 30]
    assert before and before[-1][2] > 1
    after = [c for c in watch.changes if c[0] > BURST + 35]
    assert not after or after[0][1] == before[-1][2], watch.changes  # recovered at the decided target


def test_same_seed_same_figures_and_the_trace_checks() -> None:
    a = Simulation(parse_scenario(_text(), "<a>")).run().metrics
    b = Simulation(parse_scenario(_text(), "<a>")).run().metrics
    assert a == b
    c = Simulation(parse_scenario(_text(), "<a>"), seed=4).run().metrics
    assert c["deployments"]["chat"]["requests"] != a["deployments"]["chat"]["requests"]


@pytest.mark.parametrize(("key", "value"), [
    ("target_ongoing_requests", "0"), ("aggregation_function", "median"), ("min_replicas", "-1"),
    ("upscale_delay_s", "soon"), ("metrics_interval_s", "0"), ("upscaling_factor", "-2"),
    ("burst", "maybe"),
])
def test_a_bad_autoscaling_option_is_refused_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(_text(options=f"    {key}: {value}\n"), "f.yaml")
    assert f"deployments.chat.{key}" in str(err.value), str(err.value)


def test_autoscaling_without_a_duration_and_min_above_max_are_refused() -> None:
    with pytest.raises(ScenarioError, match=r"deployments\.chat\.autoscaling: autoscaling needs the scenario's "
                                            r"'duration'"):
        parse_scenario(_text().replace("duration: 400\n", "").split("traffic:")[0], "f.yaml")
    with pytest.raises(ScenarioError, match=r"deployments\.chat.*min_replicas=13 is above max_replicas=12"):
        parse_scenario(_text().replace("min_replicas: 1", "min_replicas: 13"), "f.yaml")
    with pytest.raises(ScenarioError, match=r"deployments\.chat\.replicas: an autoscaled deployment has no fixed"):
        parse_scenario(_text(options="    replicas: 3\n"), "f.yaml")  # (it would be silently ignored)


def test_a_scale_of_an_autoscaled_deployment_is_a_failed_line_not_a_crash() -> None:
    timeline = "  - at: 50\n    scale: {deployment: chat, replicas: 3}\n"
    result = Simulation(parse_scenario(_text(timeline=timeline, duration=100), "<scale>")).run()
    (failure,) = result.failures
    assert failure.name == "scale chat" and "autoscaled" in failure.detail, failure


def test_the_sweep_prints_a_row_per_variant_with_the_autoscaling_figures(tmp_path: Path) -> None:
    args = ["simulate", str(EXAMPLE), "--jobs", "1", "--set", "deployments.chat.upscale_delay_s=0,30"]
    table = CliRunner(env={"COLUMNS": "220"}).invoke(main, args)
    assert table.exit_code == 1, table.output  # (the file's expectations are written for 10 s)
    assert "what-if: autoscaling bursts: autoscaling" in table.output
    for title in ("replica·s", "GPU-h", "cold", "starts", "scale", "queue wait", "failed", "reassigned"):
        assert title in table.output, title
    autoscaling = table.output.split("what-if: autoscaling bursts: autoscaling")[1]
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in autoscaling.splitlines() if "│" in line]
    assert [r[:2] for r in rows] == [["0", "chat"], ["30", "chat"]], rows  # a row per variant
    assert all(len(r) == 15 and "-" not in r for r in rows), rows  # (every figure there)
    out = tmp_path / "sweep.json"
    CliRunner().invoke(main, [*args, "--format", "json", "--output", str(out)])
    summary = json.loads(out.read_text())["summary"]
    assert [s["variant"] for s in summary] == [{"deployments.chat.upscale_delay_s": 0},
                                               {"deployments.chat.upscale_delay_s": 30}]
    figures = [{k: s["figures"][k]["mean"] for k in ("replica_seconds", "gpu_hours", "as_queue_wait_p99", "starts",
                                                   "as_reassigned", "as_failed", "autoscaling_scale_ups")}
               for s in summary]
    for f in figures:
        assert None not in f.values(), f
        assert f["gpu_hours"] == pytest.approx(f["replica_seconds"] / 3600, abs=1e-5)  # (1 GPU each)
    # a longer upscale delay: the callers wait longer in each burst
    assert figures[1]["as_queue_wait_p99"] > figures[0]["as_queue_wait_p99"]


def test_the_example_meets_its_expectations_and_plots_the_queue(tmp_path: Path) -> None:
    png = tmp_path / "run.png"
    result = CliRunner().invoke(main, ["simulate", str(EXAMPLE), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "autoscaling" in result.output and png.stat().st_size > 10_000

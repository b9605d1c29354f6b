"""Sleep, wake and weight pushes in the simulator (issue 21): the moves the core
sends (OffloadReplica, LoadReplica, UpdateWeights) carried out after
model_bytes / bandwidth of virtual time; a push reaches a replica that is
restarting; the timeline actions parse, refuse bad input, and are refused by
the Ray executor."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from executors.scenarios import ScenarioError, load_scenario, parse_scenario
from executors.sim.runner import Simulation

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scenarios" / "rl-sleep-wake.yaml"


def _run(text: str, **kw):
    buf = io.StringIO()
    sim = Simulation(parse_scenario(text, "<t>"), trace=buf, check=True, **kw)
    result = sim.run()
    return sim, result, [json.loads(line) for line in buf.getvalue().splitlines()]


def _failures(result) -> str:
    return "\n".join(f"{e.name}: {e.detail}" for e in result.failures)


def test_the_example_meets_its_expectations_and_counts_its_moves() -> None:
    result = Simulation(load_scenario(EXAMPLE), check=True).run()
    assert result.passed, _failures(result)
    evaluated = sorted(e.expectation.index for e in result.expectations if e.expectation is not None)
    assert evaluated == list(range(len(result.scenario.expect)))
    m = result.metrics["deployments"]["llm"]
    # 3 sleeps of 8, the replacement of rank 3 put to sleep once ready, 3 wakes of 8
    assert (m["offloads"], m["loads"]) == (25, 24)
    assert m["weight_updates"] >= 8 * 4 - 1  # (rank 5's v4 was lost with it: its replacement loaded v4)
    assert m["bytes_moved"] == 16 * 10**9 * (m["offloads"] + m["loads"] + m["weight_updates"])
    assert m["reassignments"]["any"] == 0 and result.state.deployments["llm"].world_size == 8


RESTART = """
cluster: {nodes: 1, gpus_per_node: 4}
latency: {place: 0.1, start: 5}
deployments:
  llm: {replicas: 2, model_bytes: 1e9}
timeline:
  - deploy: llm
  - wait_until_healthy: {deployment: llm, timeout: 30}
  - crash: {deployment: llm, rank: 1}
  - after: 1                     # its replacement is starting (5 s), initialised with v0
    push_weights: {deployment: llm, version: 2}
  - wait_until_serving: {deployment: llm, timeout: 30}
expect:
  - weights_version: {deployment: llm, equals: 2}
  - serving: llm
"""


def test_a_push_while_a_replica_restarts_reaches_it_once_it_is_ready() -> None:
    sim, result, recs = _run(RESTART)
    assert result.passed, _failures(result)
    dep = result.state.deployments["llm"]
    new = next(r for r in dep.replicas.values() if dep.ranks.global_rank(r.replica_id) == 1)
    assert new.replica_id == "llm#2" and new.weights_version == 2 and not new.weights_pending
    assert sim.backend.replicas["llm#2"].weights == 2  # the simulated replica holds them too
    # InitializeReplica carried v0 (the push came later); the UpdateWeights reached it while
    # starting, and it answered only after it was ready, one transfer (1e9 / 54.8e9 s) later
    init = next(r for r in recs if r["kind"] == "command" and r["type"] == "InitializeReplica"
                and r["replica"] == "llm#2")
    sent = next(r for r in recs if r["kind"] == "command" and r["type"] == "UpdateWeights" and r["replica"] == "llm#2")
    ready = next(r for r in recs if r["kind"] == "event" and r["type"] == "ReplicaReady" and r["replica"] == "llm#2")
    done = next(r for r in recs if r["kind"] == "event" and r["type"] == "WeightsUpdated" and r["replica"] == "llm#2")
    assert init["fields"]["weights_version"] == 0 and sent["phase"] == "starting"
    assert sent["t"] < ready["t"] and done["t"] == pytest.approx(ready["t"] + 1e9 / 54.8e9)
    assert done["fields"]["version"] == 2


MOVES = """
cluster: {nodes: 1, gpus_per_node: 1}
latency: {place: 0, start: 1}
bandwidth: {offload: 8, load: 4}
deployments:
  llm: {replicas: 1, model_bytes: 2e9, bandwidth: {update: 2}}
timeline:
  - deploy: llm
  - wait_until_healthy: llm
  - at: 10
    sleep: llm
  - at: 20
    push_weights: {deployment: llm, version: 1}
  - at: 30
    wake: llm
  - at: 40
    wake: {deployment: llm, weights_version: 2}
expect:
  - serving: llm
  - weights_version: {deployment: llm, equals: 2}
"""


def _answer_times(recs: list[dict]) -> list[tuple[str, float]]:
    return [(r["type"], r["t"]) for r in recs
            if r["kind"] == "event" and r["type"] in ("TierMoved", "WeightsUpdated")]


def test_each_move_takes_model_bytes_over_its_bandwidth_in_virtual_time() -> None:
    _, result, recs = _run(MOVES)
    assert result.passed, _failures(result)
    # offload 2e9 / 8e9 = 0.25 s; update (the deployment's own 2 GB/s) 1 s; load 2e9 / 4e9 = 0.5 s
    assert _answer_times(recs) == [("TierMoved", 10.25), ("WeightsUpdated", 21.0), ("TierMoved", 30.5),
                                   ("WeightsUpdated", 41.0)]
    # (the wake at 40 was awake already: only the update moved)
    m = result.metrics["deployments"]["llm"]
    assert (m["offloads"], m["loads"], m["weight_updates"], m["bytes_moved"]) == (1, 1, 2, 4 * 2 * 10**9)


def test_no_model_bytes_means_instant_moves_and_defaults_are_the_issues_figure() -> None:
    _, result, recs = _run(MOVES.replace("model_bytes: 2e9, ", ""))
    assert result.passed, _failures(result)
    assert _answer_times(recs) == [("TierMoved", 10.0), ("WeightsUpdated", 20.0), ("TierMoved", 30.0),
                                   ("WeightsUpdated", 40.0)]
    sc = parse_scenario(MOVES.replace("bandwidth: {offload: 8, load: 4}\n", ""), "<t>")
    assert sc.transfer_seconds("llm", "load") == pytest.approx(2e9 / 54.8e9)
    assert sc.transfer_seconds("llm", "offload") == pytest.approx(2e9 / 54.8e9)


def test_a_replica_crashed_with_a_move_in_flight_answers_nothing() -> None:
    text = MOVES.replace("  - at: 20\n", "  - at: 10.1\n    crash: {deployment: llm, rank: 0}\n  - at: 20\n")
    _, result, recs = _run(text)
    assert result.passed, _failures(result)
    moved = [(r["type"], r["replica"]) for r in recs if r["kind"] == "event" and r["type"] == "TierMoved"]
    assert ("TierMoved", "llm#0") not in moved  # its offload was on its way when it died
    # its replacement became ready while the deployment slept: put to sleep, then woken at 30
    assert moved == [("TierMoved", "llm#1"), ("TierMoved", "llm#1")]


def test_same_scenario_and_seed_give_a_byte_identical_trace() -> None:
    def trace() -> str:
        buf = io.StringIO()
        Simulation(load_scenario(EXAMPLE), trace=buf).run()
        return buf.getvalue()

    assert trace() == trace()


# ------------------------------------------------------------------ parsing
_HEAD = "cluster: {nodes: 1}\ndeployments: {llm: {}}\ntimeline:\n  - deploy: llm\n"


@pytest.mark.parametrize("entries, field, message", [
    (["sleep: nope"], "timeline[1].sleep", "unknown deployment 'nope'"),
    (["wake: {deployment: nope}"], "timeline[1].wake.deployment", "unknown deployment 'nope'"),
    (["push_weights: {deployment: nope, version: 1}"], "timeline[1].push_weights.deployment",
     "unknown deployment 'nope'"),
    (["push_weights: {deployment: llm, version: 2}", "push_weights: {deployment: llm, version: 1}"],
     "timeline[2].push_weights.version", "version 1 is not above the last one pushed to 'llm', 2"),
    (["push_weights: {deployment: llm, version: 0}"], "timeline[1].push_weights.version",
     "version 0 is not above the last one pushed to 'llm', 0"),
    (["wake: {deployment: llm, weights_version: 3}", "push_weights: {deployment: llm, version: 3}"],
     "timeline[2].push_weights.version", "version 3 is not above the last one pushed to 'llm', 3"),
    (["push_weights: {deployment: llm, version: 2}", "wake: {deployment: llm, weights_version: 1}"],
     "timeline[2].wake.weights_version", "weights_version 1 is older than the last one pushed to 'llm', 2"),
    (["push_weights: {deployment: llm, version: x}"], "timeline[1].push_weights.version",
     "must be a whole number, got 'x'"),
    (["push_weights: {deployment: llm, version: -1}"], "timeline[1].push_weights.version",
     "must not be negative, got -1"),
    (["push_weights: {deployment: llm}"], "timeline[1].push_weights", "missing required field 'version'"),
    (["wake: {deployment: llm, weights_version: true}"], "timeline[1].wake.weights_version",
     "must be a whole number, got True"),
    (["wake: {deployment: llm, version: 2}"], "timeline[1].wake.version", "unknown field"),
    (["sleep: 3"], "timeline[1].sleep", "must be a mapping, got 3"),
    (["wait_until_serving: {deployment: llm, timeout: soon}"], "timeline[1].wait_until_serving.timeout",
     "must be a number, got 'soon'"),
])
def test_bad_sleep_wake_and_push_entries_are_refused_naming_the_key(entries: list[str], field: str,
                                                                    message: str) -> None:
    text = _HEAD + "".join(f"  - {e}\n" for e in entries)
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "<s>")
    assert err.value.field == field and message in err.value.message, str(err.value)


@pytest.mark.parametrize("key, value, field, message", [
    ("model_bytes", "lots", "deployments.llm.model_bytes", "must be a number of bytes, got 'lots'"),
    ("model_bytes", -1, "deployments.llm.model_bytes", "must be >= 0, got -1"),
    ("bandwidth", "{load: 0}", "deployments.llm.bandwidth.load", "a bandwidth must be a number of GB/s > 0"),
    ("bandwidth", "{h2d: 5}", "deployments.llm.bandwidth.h2d", "unknown field"),
])
def test_bad_model_bytes_and_bandwidth_are_refused(key: str, value: object, field: str, message: str) -> None:
    text = f"cluster: {{nodes: 1}}\ndeployments: {{llm: {{{key}: {value}}}}}\ntimeline: []\n"
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, "<s>")
    assert err.value.field == field and message in err.value.message, str(err.value)
    with pytest.raises(ScenarioError, match=r"bandwidth\.update: a bandwidth must be a number of GB/s > 0, got 'x'"):
        parse_scenario("cluster: {nodes: 1}\nbandwidth: {update: x}\ndeployments: {llm: {}}\ntimeline: []\n", "<s>")


def test_a_request_for_a_deployment_never_deployed_is_a_failure_not_a_crash() -> None:
    text = "cluster: {nodes: 1}\ndeployments: {llm: {}, other: {}}\ntimeline:\n  - deploy: llm\n  - sleep: other\n"
    _, result, _ = _run(text)
    assert [(f.name, "refused by the core" in f.detail) for f in result.failures] == [
        ("SleepRequested other", True)]


def test_the_ray_executor_runs_the_actions_but_refuses_a_model_too_big_for_real_tensors() -> None:
    from executors.ray_gpu.scenario import UnsupportedOnRay, check_supported

    sc = load_scenario(EXAMPLE)  # 16 GB per replica: Ray replicas hold real tensors
    with pytest.raises(UnsupportedOnRay, match=r"deployments\.llm\.model_bytes 1\.6e\+10 \(each replica holds real "):
        check_supported(sc, multi_node=True)
    for entry in ("sleep: llm", "wake: llm", "push_weights: {deployment: llm, version: 1}"):
        check_supported(parse_scenario(_HEAD + f"  - {entry}\n", "<s>"))
    check_supported(parse_scenario("cluster: {nodes: 1}\ndeployments: {llm: {model_bytes: 1e6}}\ntimeline:\n"
                                   "  - deploy: llm\nexpect:\n  - weights_version: {deployment: llm, equals: 0}\n",
                                   "<s>"))

"""Deleting one deployment in the simulator (issue 22): the ``delete`` timeline action.

The core decides (``DeploymentDeleted``, rankcore/control/deletion.py); the simulator carries out the stops,
fails the requests still waiting (nothing is coming), lets the draining replicas finish what they hold,
and a controller restart in the middle of it recovers the deletion from what it persisted.
"""

from __future__ import annotations

import io

import pytest

from executors.checktrace import check_trace_lines
from executors.scenarios import ScenarioError, parse_scenario
from executors.sim import Simulation

TEXT = """
seed: 3
duration: 300
cluster: {nodes: 1, gpus_per_node: 4}
latency: {place: 0.1, start: 2, stop: 0.5}
deployments:
  llm: {replicas: 2}
  emb: {replicas: 1}
timeline:
  - deploy: llm
  - deploy: emb
  - at: 100
    delete: llm
CONTROLLER
  - at: 200
    deploy: llm
traffic:
  llm: {arrivals: {kind: poisson, rate: 2}, service: 4}
  emb: {arrivals: {kind: poisson, rate: 2}, service: 0.1}
"""
CRASH = "  - at: 101\n    crash_controller: {recover_after: 3}"


def _run(controller_down: bool) -> tuple[dict, dict, str]:
    buf = io.StringIO()
    sim = Simulation(parse_scenario(TEXT.replace("CONTROLLER", CRASH if controller_down else ""), "<delete>"),
                     check=True, trace=buf)
    seen: dict = {}
    for t in (99.0, 130.0, 260.0):
        sim.schedule(t, lambda t=t: seen.__setitem__(t, sim.driver.state), last=True)
    result = sim.run()
    assert result.passed, [e.detail for e in result.failures]
    return seen, result.metrics, buf.getvalue()


@pytest.mark.parametrize("controller_down", [False, True], ids=["controller-up", "controller-restarts-mid-deletion"])
def test_delete_removes_one_deployment_and_a_deploy_brings_it_back(controller_down: bool) -> None:
    seen, metrics, trace = _run(controller_down)
    assert sorted(seen[99.0].deployments.keys()) == ["emb", "llm"]
    # gone: its record, its replicas; its name kept as deleted; emb untouched
    assert sorted(seen[130.0].deployments.keys()) == ["emb"] and "llm" in seen[130.0].deleted
    assert sorted(seen[130.0].deployments["emb"].replicas.keys()) == sorted(seen[99.0].deployments["emb"].replicas)
    back = seen[260.0].deployments["llm"]
    assert back.target == 2 and back.status == "HEALTHY" and "llm" not in seen[260.0].deleted
    assert not set(back.replicas.keys()) & set(seen[99.0].deployments["llm"].replicas.keys())  # (new ids)
    q = metrics["deployments"]["llm"]["requests"]
    # requests that came while it was deleted were refused at once (nothing coming); those the draining
    # replicas held were answered; nothing lost, nothing failed
    assert 150 < q["rejected"]["unavailable"] < 250 and q["failed"] == 0 and q["lost"] == 0, q
    assert q["submitted"] == q["answered"] + q["rejected_total"] + q["in_queue"] + q["in_flight"] + q["cancelled"], q
    emb = metrics["deployments"]["emb"]["requests"]
    assert emb["rejected_total"] == 0 and emb["failed"] == 0 and emb["lost"] == 0, emb
    report = check_trace_lines(trace.splitlines())
    assert report.ok, report.violations[:3]
    assert '"type":"DeploymentDeleted"' in trace


def test_deleting_what_is_not_deployed_is_a_failed_line_and_the_run_goes_on() -> None:
    text = TEXT.replace("CONTROLLER", "  - at: 120\n    delete: llm")  # (gone since ~104)
    result = Simulation(parse_scenario(text, "<delete>"), check=True).run()
    assert not result.passed
    assert [f.detail for f in result.failures] == ["not deployed: nothing to delete"]
    assert result.metrics["deployments"]["llm"]["requests"]["answered"] > 100  # (deployed again at 200)


@pytest.mark.parametrize(("action", "message"), [
    ("delete: nope", "nope"),
    ("delete: {deployment: llm, replicas: 0}", "replicas"),
    ("delete: {}", "deployment"),
])
def test_a_bad_delete_is_refused_naming_the_key(action: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(TEXT.replace("CONTROLLER", f"  - {action}"), "<delete>")

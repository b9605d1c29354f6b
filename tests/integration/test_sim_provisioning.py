"""The simulator's node provider (``cluster.provisioning``): the core's demand launches
nodes that join after the delay, never beyond ``max_nodes``, and no request stands once
every replica is placed."""

from __future__ import annotations

import pathlib

import pytest

import rankcore as rc
from executors.scenarios import ScenarioError, load_scenario, parse_scenario
from executors.sim.runner import Simulation

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scenarios" / "provision-4-to-16.yaml"


def scenario(provisioning: str, replicas: int = 16, gpus: int = 1, extra: str = "") -> str:
    return f"""
name: provisioning
cluster:
  nodes: 1
  gpus_per_node: 4
  provisioning: {provisioning}
deployments:
  llm: {{replicas: 4, gpus: {gpus}}}
timeline:
  - deploy: llm
  - wait_until_healthy: llm
  - at: 30
    scale: {{deployment: llm, replicas: {replicas}}}
{extra}"""


class Watched(Simulation):
    """A simulation that keeps every RequestResources the core sent, with its time."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.asked: list[tuple[float, rc.RequestResources]] = []
        execute = self.backend.execute

        def spy(commands, t):
            self.asked += [(self.now, c) for c in commands if isinstance(c, rc.RequestResources)]
            execute(commands, t)

        self.backend.execute = spy  # type: ignore[method-assign]


@pytest.mark.parametrize("delay", [30.0, 90.0])
def test_16_replicas_from_4_once_the_nodes_join_after_the_delay(delay):
    sim = Watched(load_scenario(EXAMPLE, {"cluster.provisioning.delay_s": delay}))
    result = sim.run()
    assert result.passed, result.failures()
    dep = result.state.deployments["llm"]
    assert dep.target == 12 and len(dep.replicas) == 12  # (scaled down at the end)
    strength = result.metrics["deployments"]["llm"]["seconds_at_strength"]
    assert strength["16/16"] >= 120  # 16 served, for the two minutes before the scale down
    # from the scale at 30 to 16 serving: the delay, then one start (4-8 s)
    to_16 = sum(v for k, v in strength.items() if k.startswith("16/") and k != "16/16")
    assert delay < to_16 < delay + 10
    figures = result.metrics["provisioning"]
    assert figures["nodes_added"] == 3 and figures["nodes_launched"] == 3  # 3 x 4 GPUs for 12
    assert figures["first_join_s"] == pytest.approx(30 + delay, abs=1e-6)  # asked at the scale, joined after delay
    assert len(sim.backend.nodes) == 4  # node-0 and 3 added (never removed)
    # the request: made at the scale (12 waiting, node-0's 4 GPUs held), cleared once all were placed
    t0, first = sim.asked[0]
    assert t0 == pytest.approx(30.0) and first.waiting == (((("GPU", 1.0),), 12),) and first.held == ((("GPU", 4.0),),)
    t_last, last = sim.asked[-1]
    assert last == rc.RequestResources() and 30 + delay <= t_last < 30 + delay + 1  # placed: cleared, once
    # the joins shrank it node by node (8 waiting, then 4, then none), launching nothing more;
    # the scale down to 12 asked for nothing
    assert [t for t, _ in sim.asked] == [30.0] + [30.0 + delay] * (len(sim.asked) - 1)
    assert [r.waiting[0][1] if r.waiting else 0 for _, r in sim.asked] == [12, 8, 4, 0]
    assert len(result.state.cluster.queued) == 0


def test_no_node_beyond_max_nodes_and_the_rest_keeps_waiting():
    sim = Watched(parse_scenario(scenario("{delay_s: 10, max_nodes: 2, gpus: 4}", replicas=16)))
    result = sim.run()
    assert len(sim.backend.nodes) == 2  # node-0 and one added: max_nodes
    assert result.metrics["provisioning"]["nodes_added"] == 1
    running = sum(1 for r in result.state.deployments["llm"].replicas.values() if r.node_id is not None)
    assert running == 8
    _, last = sim.asked[-1]
    assert last.waiting == (((("GPU", 1.0),), 8),)  # still asked: the autoscaler may not honour it
    assert result.metrics["provisioning"]["unmet_bundles"] == 8


def test_no_request_and_no_node_when_everything_fits():
    sim = Watched(parse_scenario(scenario("{delay_s: 10, max_nodes: 8}", replicas=4)))
    result = sim.run()
    assert sim.asked == [] and result.metrics["provisioning"]["nodes_added"] == 0
    assert len(sim.backend.nodes) == 1


def test_a_bundle_bigger_than_a_new_node_launches_nothing():
    sim = Watched(parse_scenario(scenario("{delay_s: 10, max_nodes: 8, gpus: 2}", gpus=4)))
    # (llm needs 4 GPUs a replica; the cluster's one node holds one; new nodes have 2)
    result = sim.run()
    assert result.metrics["provisioning"]["nodes_added"] == 0
    waiting = len(result.state.cluster.queued)
    assert waiting == 3 and result.metrics["provisioning"]["unmet_bundles"] == waiting


def test_a_sweep_over_the_delay_runs_each_variant():
    for delay in (30, 300):
        result = Watched(load_scenario(EXAMPLE, {"cluster.provisioning.delay_s": delay})).run()
        assert result.metrics["provisioning"]["first_join_s"] == pytest.approx(30 + delay)


@pytest.mark.parametrize(("value", "message"), [
    ("{max_nodes: 4}", "delay_s"),
    ("{delay_s: 90}", "max_nodes"),
    ("{delay_s: 90, max_nodes: 0}", "fewer than the 1 nodes"),
    ("{delay_s: -1, max_nodes: 4}", "delay_s"),
    ("{delay_s: 90, max_nodes: 4, gpus: 0}", "must have GPUs"),
    ("{delay_s: 90, max_nodes: 4, node: {gpus: 8}}", "node"),
    ("90", "provisioning"),
])
def test_a_bad_provisioning_section_is_refused_with_the_key_named(value, message):
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(scenario(value))


def test_the_ray_scenario_runner_refuses_provisioning_naming_the_key():
    from executors.ray_gpu.scenario import UnsupportedOnRay, check_supported

    sc = load_scenario(EXAMPLE)
    with pytest.raises(UnsupportedOnRay, match=r"cluster\.provisioning .*request_resources.*use --executor sim"):
        check_supported(sc)
    without = load_scenario(EXAMPLE, {"cluster.provisioning": None})
    check_supported(without)  # (the rest of the example runs on Ray)

"""One tier scenario on both executors (issue 21): `rankcore run --executor ray` plays
examples/scenarios/tiers-evict-reload-ray.yaml on a local Ray shaped like it (one node, one
logical GPU declared as 10 MiB, 8 MiB of CPU cache; the command starts and stops that cluster),
with real tensors moving between the replicas, the node's WARM cache and its COLD file; the
simulator runs the same file. Every tier decision is the core's, so each replica's tier history
(``metrics.tier_history``: placed from cold or warm, evicted to warm or cold, its copy dropped)
must be the same on both."""

from __future__ import annotations

import io
import json
import pathlib

import pytest
from click.testing import CliRunner

from executors.cli import main
from executors.ray_gpu.scenario import _tier_option
from executors.scenarios import parse_scenario
from executors.scenarios.metrics import tier_history
from executors.sim import Simulation, load_scenario
from tests.integration.conftest import ray_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIERS = ROOT / "examples" / "scenarios" / "tiers-evict-reload-ray.yaml"


def test_the_tier_scenario_has_the_same_tier_history_per_replica_on_the_simulator_and_on_ray(tmp_path):
    ray_env()
    import ray

    assert not ray.is_initialized()  # the command starts its own cluster
    trace = tmp_path / "ray.jsonl"
    res = CliRunner().invoke(main, ["run", str(TIERS), "--executor", "ray", "--trace", str(trace)])
    assert res.exit_code == 0, res.output + str(res.exception)
    assert "FAIL" not in res.output
    assert not ray.is_initialized()

    buf = io.StringIO()
    assert Simulation(load_scenario(TIERS), trace=buf).run().passed
    sim = [json.loads(line) for line in buf.getvalue().splitlines()]
    got = [json.loads(line) for line in trace.read_text().splitlines()]
    want = tier_history(sim)
    assert tier_history(got) == want
    # it did move weights every way: cold and warm starts, evictions to warm, a copy dropped to cold
    steps = {s for h in want.values() for s in h}
    assert {"hot<-cold", "hot<-warm", "evicted->warm", "dropped->cold"} <= steps
    assert not [r for r in got if r.get("kind") == "rejected"]
    # (evictions need the node's declared GPU memory: a node that counts GPUs evicts nothing)
    # every WARM placement found its copy, on both
    assert not [r for r in got + sim if r.get("kind") == "fault" and r["type"] == "warm_copy_missing"]


def test_the_tier_scenario_on_the_simulator_has_the_history_its_comments_describe():
    """No replica is placed and evicted in one step, no copy still draining is dropped and no
    placement misses its WARM copy: the history the example's comments give, replica for replica."""
    buf = io.StringIO()
    assert Simulation(load_scenario(TIERS), trace=buf).run().passed
    recs = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert tier_history(recs) == {
        "a#0": ["hot<-cold", "evicted->warm"], "b#1": ["hot<-cold"],
        "a#2": ["hot<-warm", "evicted->warm", "dropped->cold"], "c#3": ["hot<-cold", "evicted->warm"],
        "b#5": ["hot<-cold"], "a#4": ["hot<-cold"]}
    assert not [r for r in recs if r.get("kind") == "fault" and r["type"] == "warm_copy_missing"]


@pytest.mark.parametrize("extra", ["gang: 2", "static_placement: {bundles: [n, n], mapping: {0: [0], 1: [1]}}"])
def test_the_ray_runner_gives_model_bytes_to_the_core_for_gangs_and_static_placement(extra):
    """As the simulator does (``DeploymentSpec.tier_option``): the core takes it there and it only
    sizes the sleep/wake moves."""
    text = ("cluster: {nodes: [{name: n, gpus: 2}]}\n"
            f"deployments: {{a: {{replicas: 2, model_bytes: 4MiB, {extra}}}}}\ntimeline: [deploy: a]\n")
    spec = parse_scenario(text, "<t>").deployments["a"]
    assert _tier_option(spec) == spec.tier_option() == {"model_bytes": 4 * 2**20}
    assert spec.applied().model_bytes == 4 * 2**20  # the core's DeploymentApplied takes it

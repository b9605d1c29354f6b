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

from click.testing import CliRunner

from executors.cli import main
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
    assert any(r.get("kind") == "fault" and r["type"] == "warm_copy_missing" for r in got) == \
        any(r.get("kind") == "fault" and r["type"] == "warm_copy_missing" for r in sim)

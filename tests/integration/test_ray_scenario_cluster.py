"""Node loss, both executors: `rankcore run --executor ray` plays the node-loss
example on a local multi-node Ray shaped like the scenario (it starts and stops
that cluster itself) and gets the simulator's rank history, placement and
expectations."""

from __future__ import annotations

import io
import json
import pathlib

from click.testing import CliRunner

from executors.checktrace import check_trace_file
from executors.cli import main
from executors.history import rank_history
from executors.sim import Simulation, load_scenario
from tests.integration.conftest import ray_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
NODE_LOSS = ROOT / "examples" / "scenarios" / "node-loss-3-nodes.yaml"


def placements(records: list[dict], which: int) -> list[list[int]]:
    """A healthy snapshot's global ranks grouped by node (``which``: 0 the first, -1 the last)."""
    snap = [r for r in records if r.get("kind") == "snapshot" and r["reason"] == "healthy"][which]
    by_node: dict[str, list[int]] = {}
    for r in snap["deployments"]["llm"]["replicas"].values():
        by_node.setdefault(r["node"], []).append(r["global_rank"])
    return sorted(sorted(v) for v in by_node.values())


def test_node_loss_example_on_a_scenario_shaped_ray_cluster(tmp_path):
    ray_env()
    import ray

    assert not ray.is_initialized()  # the command starts its own cluster
    trace = tmp_path / "ray.jsonl"
    res = CliRunner().invoke(main, ["run", str(NODE_LOSS), "--executor", "ray", "--trace", str(trace)])
    assert res.exit_code == 0, res.output + str(res.exception)
    assert "3-node local Ray cluster" in res.output and "FAIL" not in res.output
    assert not ray.is_initialized()  # and stops it

    buf = io.StringIO()
    assert Simulation(load_scenario(NODE_LOSS), trace=buf).run().passed
    sim = [json.loads(line) for line in buf.getvalue().splitlines()]
    got = [json.loads(line) for line in trace.read_text().splitlines()]
    recoveries = [r for r in got if r.get("type") == "ControllerRecovered"]
    assert rank_history(got) == rank_history(sim), f"controller recoveries: {len(recoveries)}"
    # every expectation held on Ray too, the node-level ones included: the
    # replicas spread over the real nodes exactly as over the simulated ones
    results = [r for r in got if r.get("kind") == "expectation"]
    assert len(results) == len(load_scenario(NODE_LOSS).expect) and all(r["passed"] for r in results), results
    # the first healthy snapshot: the 9 replicas spread 3/3/3 by the same rule,
    # rank for rank; the last one: the same shape (4 + 4 on the survivors, 1 on
    # the new node) ...
    assert placements(got, 0) == placements(sim, 0)
    assert sorted(map(len, placements(got, -1))) == sorted(map(len, placements(sim, -1))) == [1, 4, 4]
    # ... and when the three deaths were handled as one NodeLost (they normally
    # are: deaths on one node are batched), the replacements started in rank
    # order, away from the dying node, so the same rank waited for the new node
    lost = [r for r in got if r.get("kind") == "event" and r.get("type") in ("NodeLost", "ReplicaCrashed")]
    if [r["type"] for r in lost] == ["NodeLost"]:
        assert placements(got, -1) == placements(sim, -1)
    faults = [(r["type"], r["node"]) for r in got if r.get("kind") == "fault"]
    assert faults == [("node_lost", "node-1"), ("node_added", "node-3")]
    report = check_trace_file(trace)
    assert report.ok, report.violations[:5]


RANK_PACKED = ROOT / "examples" / "scenarios" / "rank-packed-downscale.yaml"


def _where(records: list[dict], which: int) -> dict[int, tuple[str, int, int]]:
    """A healthy snapshot's replicas of ``moe``: global rank -> (node, node rank, local rank)."""
    snap = [r for r in records if r.get("kind") == "snapshot" and r["reason"] == "healthy"][which]
    return {r["global_rank"]: (r["node"], r["rank"][1], r["rank"][2])
            for r in snap["deployments"]["moe"]["replicas"].values()}


def test_rank_packed_example_places_every_replica_as_the_simulator_does(tmp_path):
    """Issue 9's proof, for placement by rank: on a 3-node Ray cluster shaped like the
    scenario, every replica lands on the same node with the same node and local rank
    as in the simulator (both take it from rankcore.placement), and the downscale
    reassigns nothing there either."""
    ray_env()
    trace = tmp_path / "ray.jsonl"
    res = CliRunner().invoke(main, ["run", str(RANK_PACKED), "--executor", "ray", "--cluster", "scenario",
                                    "--trace", str(trace)])
    assert res.exit_code == 0, res.output + str(res.exception)
    assert "FAIL" not in res.output
    buf = io.StringIO()
    assert Simulation(load_scenario(RANK_PACKED), trace=buf).run().passed
    sim = [json.loads(line) for line in buf.getvalue().splitlines()]
    got = [json.loads(line) for line in trace.read_text().splitlines()]
    for which in (0, -1):  # after the scale-up, after the downscale
        want, have = _where(sim, which), _where(got, which)
        assert {g: w[1:] for g, w in have.items()} == {g: w[1:] for g, w in want.items()}
        assert all(w[1:] == (g // 4, g % 4) for g, w in have.items())
    # the same rank groups per node, node for node (Ray names nodes by id; the trace says which)
    first = _where(got, 0)
    groups = sorted(sorted(g for g, w in first.items() if w[0] == node) for node in {w[0] for w in first.values()})
    assert groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    results = [r for r in got if r.get("kind") == "expectation"]
    assert results and all(r["passed"] for r in results), results
    assert check_trace_file(trace).ok

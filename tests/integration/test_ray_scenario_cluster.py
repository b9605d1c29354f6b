"""Node loss, both executors: `rankcore run --executor ray` plays the node-loss
example on a local multi-node Ray shaped like the scenario (it starts and stops
that cluster itself) and gets the simulator's rank history, placement and
expectations. The core places replicas on both, so every replica lands on the
same node with the same node rank, local rank and lineage."""

from __future__ import annotations

import io
import json
import pathlib

from click.testing import CliRunner

from executors.checktrace import check_trace_file
from executors.cli import main
from executors.history import rank_history
from executors.ray_gpu.control.cluster import SCENARIO_NODE_LABEL
from executors.sim import Simulation, load_scenario
from executors.trace import states
from tests.integration.conftest import ray_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
NODE_LOSS = ROOT / "examples" / "scenarios" / "node-loss-3-nodes.yaml"


def node_names(records: list[dict]) -> dict[str, str]:
    """Ray node id -> scenario node name, from the trace's NodeJoined events
    (each Ray node carries its scenario name as a label). Simulator traces name
    nodes by their scenario names already: none needed."""
    names = {}
    for r in records:
        if r.get("kind") == "event" and r["type"] == "NodeJoined":
            labels = dict(r["fields"]["labels"])
            if SCENARIO_NODE_LABEL in labels:
                names[r["fields"]["node_id"]] = labels[SCENARIO_NODE_LABEL]
    return names


def layout(records: list[dict], deployment: str, which: int) -> dict[str, tuple]:
    """A healthy snapshot (``which``: 0 the first, -1 the last), replica for
    replica: id -> (scenario node, [global, node, local rank], lineage)."""
    names = node_names(records)
    snap = [r for r in states(records) if r["reason"] == "healthy"][which]
    return {rid: (names.get(r["node"], r["node"]), r["rank"], r["lineage"])
            for rid, r in snap["deployments"][deployment]["replicas"].items()}


def placements(records: list[dict], which: int) -> list[list[int]]:
    """A healthy snapshot's global ranks grouped by node."""
    by_node: dict[str, list[int]] = {}
    for node, rank, _ in layout(records, "llm", which).values():
        by_node.setdefault(node, []).append(rank[0])
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
    assert set(node_names(got).values()) == {"node-0", "node-1", "node-2", "node-3"}
    # The core placed every replica on both: at the first healthy snapshot (9
    # replicas spread 3/3/3) and at the last (4 + 4 on the survivors, the
    # replacement that waited on the new node), each replica is on the same
    # node with the same global, node and local rank and the same lineage.
    for which in (0, -1):
        assert layout(got, "llm", which) == layout(sim, "llm", which), which
    assert sorted(map(len, placements(got, -1))) == [1, 4, 4]
    # Ray declared node-1 dead before its actors' deaths reached the controller:
    # one NodeLost (the core replaced the three in rank order), no crash of its own
    lost = [r for r in got if r.get("kind") == "event" and r.get("type") in ("NodeLost", "ReplicaCrashed")]
    assert [r["type"] for r in lost] == ["NodeLost"], lost
    faults = [(r["type"], r["node"]) for r in got if r.get("kind") == "fault"]
    assert faults == [("node_lost", "node-1"), ("node_added", "node-3")]
    report = check_trace_file(trace)
    assert report.ok, report.violations[:5]


RANK_PACKED = ROOT / "examples" / "scenarios" / "rank-packed-downscale.yaml"


def test_rank_packed_example_places_every_replica_as_the_simulator_does(tmp_path):
    """Issue 9's proof, for placement by rank: on a 3-node Ray cluster shaped like the
    scenario, every replica lands on the same node with the same node and local rank
    as in the simulator (both take it from rankcore.placement.policies), and the downscale
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
    for which in (0, -1):  # after the scale-up, after the downscale: replica for replica
        have = layout(got, "moe", which)
        assert have == layout(sim, "moe", which), which
        assert all(rank[1:] == [rank[0] // 4, rank[0] % 4] for _, rank, _ in have.values())
    # blocks of consecutive ranks per node, in the nodes' order
    first = layout(got, "moe", 0)
    assert {rank[0]: node for node, rank, _ in first.values()} == {
        g: ("node-a", "node-b", "node-c")[g // 4] for g in range(12)}
    results = [r for r in got if r.get("kind") == "expectation"]
    assert results and all(r["passed"] for r in results), results
    assert check_trace_file(trace).ok

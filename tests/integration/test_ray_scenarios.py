"""Same scenario, both executors: the Ray run passes the scenario's expectations,
writes a trace that `check-trace` accepts, gives the simulator's rank history, and
leaves none of the temp folders it made. (The policy examples that need a cluster
shaped like their own run in test_ray_policies.py.)"""

from __future__ import annotations

import io
import json
import pathlib

import pytest

from executors.checktrace import check_trace_file
from executors.history import rank_history
from executors.ray_gpu import get_controller
from executors.ray_gpu.api.deployments import ask
from executors.ray_gpu.scenario import UnsupportedOnRay, check_supported, run_on_ray
from executors.scenarios.timeline import CrashController
from executors.sim import Simulation, load_scenario

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))


def _supported(path: pathlib.Path) -> bool:
    try:
        check_supported(load_scenario(path))
        return True
    except UnsupportedOnRay:
        return False


#: run on a cluster shaped like their own, with these same checks, in test_ray_policies.py (SHAPED)
SHAPED_THERE = {"controller-crash-orphan-unresponsive.yaml"}
ON_RAY = [p for p in EXAMPLES if _supported(p)]


pytestmark = pytest.mark.usefixtures("local_ray")


def test_the_supported_examples_are_the_ones_ray_can_run():
    names = {p.name for p in ON_RAY}
    assert {"seed-four-replicas.yaml", "downscale-8-to-4.yaml", "rank-aware-model.yaml",
            "controller-crash.yaml", "controller-crash-during-scale-up.yaml"} <= names
    assert "node-loss-3-nodes.yaml" not in names and "day-of-churn-1000.yaml" not in names


@pytest.mark.parametrize("path", [p for p in ON_RAY if p.name not in SHAPED_THERE], ids=lambda p: p.name)
def test_same_rank_history_as_the_simulator(path, tmp_path, temp_dirs_gone):
    sc = load_scenario(path)
    buf = io.StringIO()
    sim = Simulation(sc, trace=buf).run()
    assert sim.passed
    want = rank_history(json.loads(line) for line in buf.getvalue().splitlines())
    trace = tmp_path / "ray.jsonl"
    with open(trace, "w") as fp:
        result = run_on_ray(sc, trace_fp=fp)
    temp_dirs_gone(sc)
    # Node and local ranks follow placement, which differs (the simulator places on
    # the scenario's nodes, local Ray has one node), so expectations that count
    # node/local changes are the simulator's; the rest must hold on Ray too.
    # A config update held while the controller was down runs right after its
    # recovery: in the simulator before the replacements' placements land (0.1 s
    # later), on Ray possibly after (a group pins in milliseconds now that
    # ReplicaPlaced is sent once the group is placed), and a replacement already
    # initialised with the old config is reconfigured once ready. The rank history
    # below must still be the same.
    held_update = any(isinstance(a, CrashController) for a in sc.timeline)
    placement_bound = {f"expect[{e.index}]" for e in sc.expect
                       if (e.kind == "reassignments" and e.args["level"] != "rank")
                       or (e.kind == "reconfigures" and e.args["reason"] != "user_config")
                       or (e.kind == "reconfigures" and e.args["reason"] == "user_config" and held_update)}
    failed = [(n, d) for n, ok, d in result.expectations if not ok and n.split()[0] not in placement_bound]
    assert not failed, failed
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    got = rank_history(records)
    assert got == want
    # no replica was started twice (a controller crash during a scale-up adopts the
    # replicas already starting): as many starts as in the simulator
    sim_starts = buf.getvalue().count('"type":"StartReplica"')
    assert sum(r.get("type") == "StartReplica" for r in records) == sim_starts
    # every fault the timeline injected is in the trace, as in the simulator's
    sim_faults = [r["type"] for r in map(json.loads, buf.getvalue().splitlines()) if r["kind"] == "fault"]
    assert [r["type"] for r in records if r["kind"] == "fault"] == sim_faults
    report = check_trace_file(trace)
    assert report.ok, report.violations[:5]
    assert ask(get_controller(), "status")["rejected_events"] == 0
    ask(get_controller(), "shutdown_replicas")
    get_controller()  # (the deployments stay registered, at 0 replicas)


def test_cli_run_on_ray(tmp_path):
    from click.testing import CliRunner

    from executors.cli import main

    trace = tmp_path / "t.jsonl"
    res = CliRunner().invoke(main, ["run", str(ROOT / "examples/scenarios/seed-four-replicas.yaml"),
                                    "--executor", "ray", "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    assert "on Ray" in res.output and "FAIL" not in res.output
    assert check_trace_file(trace).ok
    node_loss = str(ROOT / "examples/scenarios/node-loss-3-nodes.yaml")
    res = CliRunner().invoke(main, ["run", node_loss, "--executor", "ray", "--cluster", "local"])
    assert res.exit_code == 2 and "cannot run timeline[2] lose_node" in res.stderr
    assert "--cluster scenario" in res.stderr  # the way to run it
    res = CliRunner().invoke(main, ["run", node_loss, "--executor", "ray", "--cluster", "scenario",
                                    "--address", "127.0.0.1:1"])
    assert res.exit_code == 2 and "does not take --address" in res.stderr
    res = CliRunner().invoke(main, ["run", node_loss, "--executor", "ray"])  # auto: needs its own cluster
    assert res.exit_code == 2 and "already connected" in res.stderr

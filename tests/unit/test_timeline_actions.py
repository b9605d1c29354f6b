"""The timeline's actions as typed records (executors/scenarios/timeline.py): one
class per action holds its key, parsing, meaning and whether it needs the
controller; ``ACTIONS`` is the one list the parser, ``plan``, the docs and both
executors read. A new action that the docs or the Ray executor forget fails here."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from executors.scenarios import ACTIONS, ScenarioError, parse_scenario
from executors.scenarios.timeline import (
    AS_DECLARED,
    Action,
    AddNode,
    Crash,
    CrashController,
    Delete,
    Deploy,
    Hang,
    LoseNode,
    Orphan,
    PlaceBundles,
    PushWeights,
    Rollout,
    Scale,
    Sleep,
    UpdateConfig,
    Wait,
    WaitUntilHealthy,
    WaitUntilServing,
    Wake,
    plan,
)

ROOT = Path(__file__).resolve().parents[2]

EVERY_ACTION = """
cluster: {nodes: 2, gpus_per_node: 4}
deployments:
  llm: {replicas: 2, max_replicas: 6}
  engine:
    static_placement: {bundles: [node-0, node-1], per_replica: 1}
timeline:
  - deploy: llm
  - deploy: {deployment: llm, replicas: 3, user_config: {model: small}}
  - scale: {deployment: llm, replicas: 2, victims: ["llm#0"]}
  - update_config: {deployment: llm, user_config: null}
  - rollout: {deployment: llm, version: v2, max_unavailable: 1}
  - crash: {replica: "llm#1"}
  - hang: {deployment: llm, rank: 1}
  - lose_node: node-1
  - add_node: {name: node-9}
  - crash_controller:
  - place_bundles: {deployment: engine, bundles: [node-0, null]}
  - orphan: old
  - wait_until_healthy: {deployment: llm, timeout: 60}
    after: 2
  - wait: 5
    at: 100
  - crash_controller: {recover_after: 3}
  - sleep: llm
  - push_weights: {deployment: llm, version: 2}
  - wake: {deployment: llm, weights_version: 3}
  - wake: llm
  - wait_until_serving: llm
  - delete: {deployment: llm}
  - delete: engine
"""


def test_every_action_parses_to_its_typed_record() -> None:
    sc = parse_scenario(EVERY_ACTION, "every.yaml")
    plain = [attrs.evolve(a, index=0, at=None, after=None, where="") for a in sc.timeline]
    assert plain == [
        Deploy(deployment="llm"),
        Deploy(deployment="llm", replicas=3, user_config={"model": "small"}),
        Scale(deployment="llm", replicas=2, victims=("llm#0",)),
        UpdateConfig(deployment="llm", user_config=None),
        Rollout(deployment="llm", version="v2", max_unavailable=1),
        Crash(replica="llm#1"),
        Hang(deployment="llm", rank=1),
        LoseNode(node="node-1"),
        AddNode(node="node-9", gpus=8.0),
        CrashController(recover_after=10.0),
        PlaceBundles(deployment="engine", bundles=("node-0", None)),
        Orphan(deployment="old", replica="old#0"),
        WaitUntilHealthy(deployment="llm", timeout=60.0),
        Wait(seconds=5.0),
        CrashController(recover_after=3.0),
        Sleep(deployment="llm"),
        PushWeights(deployment="llm", version=2),
        Wake(deployment="llm", weights_version=3),
        Wake(deployment="llm"),
        WaitUntilServing(deployment="llm"),
        Delete(deployment="llm"),
        Delete(deployment="engine"),
    ]
    assert {type(a) for a in sc.timeline} == set(ACTIONS.values())  # (the scenario above shows every action)
    assert [a.index for a in sc.timeline] == list(range(22))
    assert (sc.timeline[12].after, sc.timeline[13].at) == (2.0, 100.0)
    assert sc.timeline[0].where == "every.yaml:8" and sc.timeline[0].user_config is AS_DECLARED


def test_the_registry_keys_each_class_by_its_own_key_and_every_action_has_a_meaning() -> None:
    assert list(ACTIONS) == ["deploy", "scale", "delete", "update_config", "rollout", "crash", "hang", "lose_node", "add_node",
                             "crash_controller", "place_bundles", "orphan", "sleep", "wake", "push_weights",
                             "wait_until_healthy", "wait_until_serving", "wait"]
    for key, cls in ACTIONS.items():
        assert cls.key == key and issubclass(cls, Action)
        # a wait is the executor's; every other action says what it does
        assert (cls.perform is Action.perform) == cls.waits, key
    assert {k for k, c in ACTIONS.items() if c.waits} == {"wait", "wait_until_healthy", "wait_until_serving"}
    assert {k for k, c in ACTIONS.items() if not c.needs_controller} == {
        "crash", "hang", "lose_node", "add_node", "place_bundles", "orphan", "wait"}


def test_a_wait_is_not_performed() -> None:
    with pytest.raises(ValueError, match="wait is not performed"):
        Wait(seconds=1).perform(None, None)  # type: ignore[arg-type]


def test_a_crash_or_hang_names_a_replica_or_a_deployment_and_rank() -> None:
    assert Crash(replica="llm#3").as_dict() == {"replica": "llm#3"} and Crash(replica="llm#3").by_rank is None
    assert Hang(deployment="llm", rank=2).as_dict() == {"deployment": "llm", "rank": 2}
    assert Hang(deployment="llm", rank=2).by_rank == ("llm", 2)
    for bad in ({}, {"deployment": "llm"}, {"replica": "llm#1", "deployment": "llm", "rank": 0}):
        with pytest.raises(ValueError, match="a replica, or a deployment and a rank"):
            Crash(**bad)


_HEAD = "cluster: {nodes: 1}\ndeployments: {llm: {}}\ntimeline:\n  - deploy: llm\n"


@pytest.mark.parametrize("action", ["crash", "hang"])
def test_a_replica_and_a_rank_together_are_refused_by_crash_and_hang_alike(action: str) -> None:
    """hang used to take the replica and drop the rank without a word (crash refused it)."""
    with pytest.raises(ScenarioError, match=rf"<s>:5:\d+: timeline\[1\]\.{action}: name a 'replica', or a "
                                            rf"'deployment' and 'rank', not both"):
        parse_scenario(_HEAD + f"  - {action}: {{replica: 'llm#0', deployment: llm, rank: 0}}\n", "<s>")


@pytest.mark.parametrize("entry, field, message", [
    ("scale: {deployment: llm, replicas: 2, victims: llm#0}", "timeline[1].scale.victims",
     "must be a list of replica ids, got 'llm#0'"),
    ("place_bundles: {deployment: llm, bundles: [node-0]}", "timeline[1].place_bundles.deployment",
     "'llm' has no static_placement"),
    ("wait: -1", "timeline[1].wait", "must be >= 0, got -1"),
    ("crash_controller: {recover_afterr: 1}", "timeline[1].crash_controller.recover_afterr",
     "unknown field (did you mean 'recover_after'?)"),
    ("orphan: llm", "timeline[1].orphan.deployment", "'llm' is a declared deployment"),
    ("add_node: {name: node-1, gpus: x}", "timeline[1].add_node.gpus", "must be a number, got 'x'"),
    ("deploy: {deployment: llm, replicas: 200000}", "timeline[1].deploy.replicas",
     "200000 replicas is above max_replicas=100000"),
    ("crash: {deployment: llm}", "timeline[1].crash", "needs 'replica', or 'deployment' and 'rank'"),
])
def test_each_actions_errors_are_pinned_on_its_key(entry: str, field: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(_HEAD + f"  - {entry}\n", "<s>")
    assert err.value.field == field and message in err.value.message and err.value.line == 5


def test_plan_reads_waits_and_controller_needs_from_the_records() -> None:
    timeline = (Deploy(deployment="a"), CrashController(recover_after=10), Crash(replica="a#0", after=1),
                Wait(seconds=2), Scale(deployment="a", replicas=2), Wait(seconds=3), LoseNode(node="n", after=1))
    assert [(p.start, p.controller_down) for p in plan(timeline)] == [
        (0.0, False), (0.0, False), (1.0, True), (1.0, True), (10.0, False), (10.0, False), (14.0, False)]


# ------------------------------------------------------------------ the Ray executor and the docs
def test_ray_runs_lists_or_refuses_every_action_by_class() -> None:
    from executors.ray_gpu.scenario import NODE_ACTIONS, RAY_ACTIONS, REFUSED, UnsupportedOnRay, check_supported

    for cls in ACTIONS.values():
        assert [cls in RAY_ACTIONS, cls in NODE_ACTIONS, cls in REFUSED].count(True) == 1, cls.key
    sc = parse_scenario(EVERY_ACTION, "every.yaml")
    with pytest.raises(UnsupportedOnRay) as err:
        check_supported(sc, multi_node=True)
    assert str(err.value) == ("every.yaml: the Ray executor cannot run timeline[10] place_bundles (Ray cannot move "
                              "a placement group's bundles) (use --executor sim)")
    with pytest.raises(UnsupportedOnRay, match=r"timeline\[7\] lose_node, timeline\[8\] add_node, timeline\[10\] "):
        check_supported(sc)


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first table after ``heading``."""
    rest = text[text.index(heading):]
    rows = []
    for line in rest.splitlines()[1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # (the header and its rule)


def test_the_docs_table_of_actions_is_the_registry() -> None:
    from executors.ray_gpu.scenario import NODE_ACTIONS, RAY_ACTIONS, REFUSED

    rows = _table((ROOT / "docs" / "scenarios.md").read_text(), "### Actions")
    assert [r[0] for r in rows] == [f"`{k}`" for k in ACTIONS]
    for (name, down, ray), cls in zip(rows, ACTIONS.values()):
        assert down == ("no: held until it is back" if cls.needs_controller else "yes"), name
        if cls in RAY_ACTIONS:
            assert ray == "yes", name
        elif cls in NODE_ACTIONS:
            assert ray == "on a scenario-shaped cluster (`--cluster scenario`)", name
        else:
            assert ray == f"no: {REFUSED[cls]}", name


def test_the_docs_show_every_action_in_yaml_and_in_the_ray_table() -> None:
    scenarios = (ROOT / "docs" / "scenarios.md").read_text()
    example = scenarios[scenarios.index("### Actions"):]
    example = example[example.index("```yaml"):]
    example = example[:example.index("```\n", 7)]
    shown = set(re.findall(r"^  - (\w+):", example, re.M))
    assert shown == set(ACTIONS)
    ray = (ROOT / "docs" / "ray.md").read_text()
    named = {k for line in ray.splitlines() if line.startswith("| timeline ")
             for k in re.findall(r"`(\w+)`", line.split("|")[1])}
    assert set(ACTIONS) <= named


def test_the_scenarios_replica_classes_import_no_controller() -> None:
    """A scenario replica's process unpickles its class by module: that module must not
    pull in the controller (or the API, or the runner)."""
    code = ("import sys, executors.ray_gpu.scenario_models as m; "
            "print(sorted(k for k in sys.modules if k.startswith('executors.ray_gpu.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    # executors.ray_gpu.base is the floor's package, a docstring alone (its __init__ imports nothing)
    assert out.strip() == "['executors.ray_gpu.base', 'executors.ray_gpu.base.context', 'executors.ray_gpu.scenario_models']"
    init = ast.parse((ROOT / "executors" / "ray_gpu" / "base" / "__init__.py").read_text())
    assert not [n for n in ast.walk(init) if isinstance(n, (ast.Import, ast.ImportFrom))]

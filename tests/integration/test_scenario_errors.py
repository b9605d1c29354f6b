"""Malformed scenario files: ``rankcore simulate`` exits 2 with one ``error:``
line naming the file, the line and the field, and never a traceback.

Click >= 8.2 keeps stderr apart (``result.stderr``; ``result.output`` has both
streams) and has no ``mix_stderr``. Files are written to a temporary directory
that is also the working directory, so the messages carry short relative
names. ``COLUMNS=80`` pins the width rich assumes for a non-terminal, so the
results do not depend on the terminal running the tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from executors.cli import main
from executors.sim import ScenarioError, load_scenario

GOOD_TAIL = "deployments:\n  llm: {replicas: 2}\ntimeline:\n  - deploy: llm\n"

# name -> (file text or None for a missing file, line, field named in the message, words in the message)
CASES = {
    "bad_yaml": (
        "name: x\ncluster: {nodes: 1\n" + GOOD_TAIL,
        3, None, "bad YAML",
    ),
    "unknown_action": (
        "cluster: {nodes: 1}\n" + GOOD_TAIL + "  - explode: llm\n",
        6, "timeline[1].explode", "unknown action",
    ),
    "negative_replicas": (
        "cluster: {nodes: 1}\ndeployments:\n  llm: {replicas: -3}\ntimeline:\n  - deploy: llm\n",
        3, "deployments.llm.replicas", "must not be negative",
    ),
    "replicas_above_max": (
        "cluster: {nodes: 1}\ndeployments:\n  llm: {replicas: 10000000}\ntimeline:\n  - deploy: llm\n",
        3, "deployments.llm.replicas", "10000000 replicas is above max_replicas=100000",
    ),
    "scale_above_max": (
        "cluster: {nodes: 1}\ndeployments:\n  llm: {replicas: 2, max_replicas: 4}\ntimeline:\n  - deploy: llm\n"
        "  - scale: {deployment: llm, replicas: 5}\n",
        6, "timeline[1].scale.replicas", "5 replicas is above max_replicas=4",
    ),
    "unknown_deployment": (
        "cluster: {nodes: 1}\n" + GOOD_TAIL + "  - scale: {deployment: nope, replicas: 1}\n",
        6, "timeline[1].scale.deployment", "unknown deployment 'nope'",
    ),
    "unknown_top_level_key": (
        "cluster: {nodes: 1}\n" + GOOD_TAIL + "bogus: 1\n",
        6, "bogus", "unknown field",
    ),
    "unknown_latency_dist": (
        "cluster: {nodes: 1}\nlatency:\n  start: {dist: weibull, shape: 2}\n" + GOOD_TAIL,
        3, "latency.start", "unknown dist 'weibull'",
    ),
    "static_unknown_node": (
        "cluster: {nodes: 2}\ndeployments:\n  e:\n    static_placement:\n      bundles: [node-0, node-9]\n"
        "      mapping: {0: [0, 1]}\ntimeline:\n  - deploy: e\n",
        5, "deployments.e.static_placement.bundles[1]", "unknown node 'node-9'",
    ),
    "static_bundle_twice": (
        "cluster: {nodes: 2}\ndeployments:\n  e:\n    static_placement:\n      bundles: [node-0, node-1]\n"
        "      mapping: {0: [0, 1], 1: [1]}\ntimeline:\n  - deploy: e\n",
        6, "deployments.e.static_placement.mapping", "bundle 1 is given to rank 0 and to rank 1",
    ),
    "static_replicas_mismatch": (
        "cluster: {nodes: 2}\ndeployments:\n  e:\n    replicas: 3\n    static_placement:\n"
        "      bundles: [node-0, node-1]\n      per_replica: 1\ntimeline:\n  - deploy: e\n",
        4, "deployments.e.replicas", "fixes the replica count to its mapping's length (2)",
    ),
    "gang_not_a_multiple": (
        "cluster: {nodes: 2}\ndeployments:\n  e: {replicas: 3, gang: 2}\ntimeline:\n  - deploy: e\n",
        3, "deployments.e.replicas", "not a multiple of the gang size 2",
    ),
    "gang_bad_failure": (
        "cluster: {nodes: 2}\ndeployments:\n  e: {replicas: 2, gang: {size: 2, failure: ignore}}\n"
        "timeline:\n  - deploy: e\n",
        3, "deployments.e.gang.failure", "must be one of restart_gang, restart_replica",
    ),
    "lose_unknown_node": (
        "cluster: {nodes: 2}\n" + GOOD_TAIL + "  - lose_node: node-7\n",
        6, "timeline[1].lose_node", "unknown node 'node-7' (did you mean 'node-1'?) (the cluster has: node-0, node-1",
    ),
    "key_typo_suggests": (
        "cluster: {nodes: 1}\ndeployments:\n  llm: {replcas: 2}\ntimeline:\n  - deploy: llm\n",
        3, "deployments.llm.replcas", "unknown field (did you mean 'replicas'?)",
    ),
    "action_typo_suggests": (
        "cluster: {nodes: 1}\n" + GOOD_TAIL + "  - wait_until_heathy: llm\n",
        6, "timeline[1].wait_until_heathy", "unknown action (did you mean 'wait_until_healthy'?)",
    ),
    "missing_file": (None, None, None, "cannot read"),
}

def _expected_error(name: str) -> str:
    try:
        load_scenario(name)
    except ScenarioError as exc:
        return f"error: {exc}"
    raise AssertionError(f"{name} loaded without an error")


@pytest.fixture
def run_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)

    def run(case: str):
        text = CASES[case][0]
        name = f"{case}.yaml"
        if text is not None:
            Path(name).write_text(text)
        return name, CliRunner(env={"COLUMNS": "80"}).invoke(main, ["simulate", name])

    return run


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_file_exits_2_with_an_error_line(case: str, run_cli) -> None:
    _, line, field, words = CASES[case]
    name, result = run_cli(case)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == "", "nothing on stdout: no table, no progress"
    error_lines = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert len(error_lines) == 1, result.stderr
    first = error_lines[0]
    assert result.stderr.startswith(first)
    if line is None:
        assert first.startswith(f"error: {name}: ")
    else:
        assert re.match(rf"error: {re.escape(name)}:{line}:\d+: ", first), first
    if field is not None:
        assert f": {field}: " in first, first
    assert words in " ".join(result.stderr.split())


@pytest.mark.parametrize("case", list(CASES))
def test_the_error_is_exactly_one_line(case: str, run_cli) -> None:
    """Even past 80 columns: no wrapping when stderr is not a terminal."""
    name, result = run_cli(case)
    assert result.exit_code == 2
    assert result.stderr == _expected_error(name) + "\n"


# Text from the file that looks like rich markup must come out as it is.
def test_the_error_shows_the_file_text_verbatim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("m.yaml").write_text("cluster: {nodes: 1}\n" + GOOD_TAIL + "  - deploy: '[red]x'\n")
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["simulate", "m.yaml"])
    assert result.exit_code == 2
    assert "unknown deployment '[red]x'" in result.stderr, result.stderr


def test_a_bad_set_value_is_exit_2_naming_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("s.yaml").write_text("cluster: {nodes: 1}\n" + GOOD_TAIL)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        main, ["simulate", "s.yaml", "--set", "deployments.llm.replicas=-1"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    # the error names the command-line argument that wrote the value, not a file position
    assert result.stderr == "error: --set deployments.llm.replicas=-1: deployments.llm.replicas: must not be " \
                            "negative, got -1\n", result.stderr


def test_a_set_typo_names_the_argument_and_the_nearest_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("s.yaml").write_text("cluster: {nodes: 1}\n" + GOOD_TAIL)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["simulate", "s.yaml", "--set", "latency.strat=5"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --set latency.strat=5: latency.strat: unknown field "
                                    "(did you mean 'start'?)"), result.stderr


def _warnings_of(tmp_path: Path, text: str, *args: str) -> tuple[int, list[str]]:
    (tmp_path / "w.yaml").write_text(text)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["simulate", str(tmp_path / "w.yaml"), "--quiet", *args])
    return result.exit_code, [ln for ln in result.stderr.splitlines() if ln.startswith("warning: ")]


def test_a_start_latency_past_the_start_timeout_warns(tmp_path: Path) -> None:
    """240-360 s starts under the 300 s default: said before the run, not found later in the counts."""
    text = ("cluster: {nodes: 1}\nlatency: {start: {dist: uniform, low: 240, high: 360}}\n" + GOOD_TAIL)
    code, warnings = _warnings_of(tmp_path, text)
    assert code == 0
    assert len(warnings) == 1 and "deployments.llm: starts take up to ~358.8 s" in warnings[0]
    assert "faults.start_timeout=300 s" in warnings[0] and "timeouts" in warnings[0]
    assert _warnings_of(tmp_path, text, "--set", "faults.start_timeout=400")[1] == []
    # a sweep says it once
    assert len(_warnings_of(tmp_path, text, "--set", "seed=1,2")[1]) == 1


def test_a_cluster_too_small_for_the_target_warns(tmp_path: Path) -> None:
    text = "cluster: {nodes: 1, gpus_per_node: 2}\ndeployments:\n  llm: {replicas: 3}\ntimeline:\n  - deploy: llm\n"
    code, warnings = _warnings_of(tmp_path, text)
    assert code == 0 and warnings == ["warning: cluster: 2 GPUs (add_node included) for 3 asked by the deployments "
                                      "at full strength: some replicas will never be placed (add nodes, or lower "
                                      "replicas)"]
    assert _warnings_of(tmp_path, text + "  - add_node: {name: extra, gpus: 1}\n")[1] == []


def test_a_malformed_set_option_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["simulate", "whatever.yaml", "--set", "no-equals-sign"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "expected key=value" in result.output

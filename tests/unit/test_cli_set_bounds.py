"""``rankcore simulate --set KEY=VALUE``: each value is YAML read within the scenario files' own
bounds (``check_yaml_bounds``: ``MAX_YAML_BYTES``, ``MAX_YAML_DEPTH``, ``MAX_YAML_NODES``, one
definition), so a hostile value is exit 2 with one ``error:`` line naming the ``--set`` key and the
limit, never a traceback (10,000 ``[`` was a RecursionError, exit 1). Nothing is simulated: the
value is refused before the scenario is read."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from executors.cli import main
from executors.scenarios.format import MAX_YAML_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES

SCENARIO = str(Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "seed-four-replicas.yaml")


def _bomb(levels: int, width: int) -> str:
    """A block-style alias bomb (no comma: ``--set`` splits values there): ``width ** levels`` values."""
    lines = ["l0: &l0 x"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i}")
        lines += [f"- *l{i - 1}"] * width
    return "\n".join(lines)


def refused(value: str, key: str = "seed") -> str:
    """``simulate --set key=value`` exits 2 with one ``error:`` line on stderr naming ``--set key``;
    returns that line."""
    result = CliRunner().invoke(main, ["simulate", SCENARIO, "--set", f"{key}={value}"])
    assert result.exit_code == 2, (result.exit_code, result.output[-500:], result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert result.stderr.startswith(f"error: --set {key}: ") and result.stderr.count("\n") == 1, result.stderr[:500]
    assert len(result.stderr) < 600  # (the value is shown cut, not all 10,000 characters of it)
    return result.stderr


@pytest.mark.parametrize(("value", "limit"), [
    ("[" * 10_000, f"collections nested deeper than {MAX_YAML_DEPTH} (MAX_YAML_DEPTH)"),
    ("[" * 10_000 + "]" * 10_000, f"collections nested deeper than {MAX_YAML_DEPTH} (MAX_YAML_DEPTH)"),
    ("{a: " * 10_000, f"collections nested deeper than {MAX_YAML_DEPTH} (MAX_YAML_DEPTH)"),
    (_bomb(5, 10), f"more than {MAX_YAML_NODES:,} values with every alias expanded (MAX_YAML_NODES"),
    ("&a [*a]", "the alias *a is inside its own anchor"),
    ("x" * (MAX_YAML_BYTES + 1), f"the value is {MAX_YAML_BYTES + 1:,} bytes, above {MAX_YAML_BYTES:,} "
                                 f"(MAX_YAML_BYTES)"),
    ("1" * 5_000, "ValueError: Exceeds the limit (4300 digits)"),
], ids=["deep-unclosed", "deep-closed", "deep-mapping", "alias-bomb", "self-alias", "too-big", "huge-int"])
def test_a_hostile_set_value_is_exit_2_naming_the_key_and_the_limit(value: str, limit: str) -> None:
    assert limit in refused(value)


def test_every_value_of_a_sweep_and_a_dotted_key_are_checked() -> None:
    """The second value of a sweep too, and the key named as typed."""
    line = refused("1,2," + "[" * 500, key="faults.crash_rate_per_replica_hour")
    assert "(MAX_YAML_DEPTH)" in line


def test_the_depth_limit_is_the_files_own() -> None:
    """``MAX_YAML_DEPTH`` levels are read (the scenario's own check then answers, naming the
    argument); one more is refused by the bound."""
    at = "[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH
    result = CliRunner().invoke(main, ["simulate", SCENARIO, "--set", f"seed={at}"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "MAX_YAML_DEPTH" not in result.stderr and "seed: must be" in result.stderr, result.stderr[:500]
    assert "(MAX_YAML_DEPTH)" in refused("[" + at + "]")

"""The README's quick start runs as written."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_quick_start_runs(capsys):
    text = README.read_text()
    block = re.search(r"## Quick start\n\n```python\n(.*?)```", text, re.S).group(1)
    exec(compile(block, "README quick start", "exec"), {})
    out = capsys.readouterr().out
    assert "replaces='llm#0'" in out and "ReplicaRank(rank=1, node_rank=1, local_rank=0)" in out


def test_wrapper_example_runs_and_its_machine_passes():
    """The README's "run the property suite against your own wrapper" block."""
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    text = README.read_text()
    block = re.search(r"## Run the property suite against your own wrapper\n\n```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {"__name__": "readme_wrapper"}
    exec(compile(block, "README wrapper example", "exec"), namespace)
    assert namespace["TestMyScheduler"].settings.max_examples == 200
    from rankcore.testing import make_machine

    run_state_machine_as_test(make_machine(namespace["MyScheduler"]),
                              settings=settings(max_examples=5, deadline=None, database=None))

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

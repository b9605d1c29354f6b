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


def test_every_relative_link_in_the_readme_and_docs_resolves_in_a_clone():
    """A link into ``../shared/`` (the workplace beside the repository) broke in every clone (issue
    64): each relative link of README.md and docs/*.md names a file of this repository."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    broken = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists() or root not in path.parents:
                broken.append(f"{doc.relative_to(root)}: {target}")
    assert not broken, broken
